#pragma once
// PeerExchange kernels (the group that owns the buffers: peer_exchange_group.h): the decode
// (latency) exchange of ep_moe_latency.h without NCCL, for EP groups whose ranks are threads of ONE
// process on GPUs with peer access (the serving engine's DP group). Each rank's kernels store
// straight into the other ranks' memory over NVLink and signal with system-scope counters that live
// on the receiving GPU:
//
//   dispatch kernel (rank r):  pack its B rows into slot r of EVERY rank's gather buffer
//                              -> +1 on each rank's arrival counter [r] (per block)
//                              -> wait until its own counters say every rank's rows are in
//                              -> unpack all N x B rows locally (owned ids, else -1)
//   (caller: moe_experts over the N x B rows -> partial [N*B, H])
//   combine kernel (rank r):   partial rows [q*B, (q+1)*B) into slot r of rank q's return
//                              buffer -> signal -> wait -> sum the N slots in rank order
//
// Two kernels per MoE layer instead of pack, all-gather, unpack, all-to-all and rank sum; the
// results are bit-identical to that path (same row format, same rank-order fp32 sum). Nothing
// waits on the host and every address is fixed, so a step stays capturable in a CUDA graph.
//
// Ordering: every rank calls the exchanges in the same order (lockstep, as with NCCL). Each
// kernel reads the rank's call count and launched-block count from device memory (its last block
// advances them), so replays of a graph continue the counts. Buffers alternate by the parity of the
// count: a rank can be at most one exchange ahead of another (it cannot finish exchange c + 1
// before every rank has pushed into it, which each does only after finishing exchange c), so parity
// c + 1 never overwrites rows still being read for c. Counters are compared modulo 2^32.
//
// Deadlock freedom: every block pushes before it waits, and a kernel has few blocks
// (at most kPeerMaxBlocks), all resident at once on an H200, so no block waits on an
// unscheduled block.
// PeerExchangeGroup::abort() (peer_exchange_group.h) sets a host-mapped flag that every waiting
// block polls: blocked kernels return (with garbage), so a failed rank cannot hang the others.
#include <cuda_runtime.h>

#include <cstdint>

#include "parallel/cuda/ep_kernels.h"

namespace di::parallel::cuda {

inline constexpr int kPeerMaxRanks = 8;
// Blocks per exchange kernel: one per 4 rows a rank unpacks (N x B), 16 to 64. Every rank
// launches the same grid for the same B, and all blocks fit on an H200 at once.
inline constexpr int kPeerMinBlocks = 16;
inline constexpr int kPeerMaxBlocks = 64;
int peer_exchange_blocks(int32_t rows_per_rank, int32_t num_ranks);

// One rank's view of the group: its own buffers and the peers' addresses (device pointers valid
// on this rank's device through peer access).
struct PeerRank {
  int32_t rank = 0;
  int32_t num_ranks = 1;
  int32_t max_rows = 0;       // per rank
  int64_t row_bytes = 0;      // packed dispatch row (latency_row_bytes)
  int64_t ret_row_bytes = 0;  // hidden x dtype
  // [2 parity][num_ranks src][max_rows][row_bytes] on each rank, indexed by rank.
  void* gather[kPeerMaxRanks] = {};
  // [2 parity][num_ranks src][max_rows][ret_row_bytes] on each rank.
  void* ret[kPeerMaxRanks] = {};
  // Arrival counters on each rank: [2 phases][num_ranks src] u32 (phase 0 dispatch, 1 combine).
  uint32_t* arrive[kPeerMaxRanks] = {};
  // This rank's call counts [2 phases] and last-block tickets [2 phases] (device).
  uint32_t* calls = nullptr;  // [4]: calls per phase, then blocks launched per phase
  uint32_t* tickets = nullptr;
  const volatile int32_t* abort_flag = nullptr;  // host-mapped; non-zero: give up waiting
};

struct PeerDispatchParams {
  PeerRank peer;
  const void* x;              // [num_tokens, hidden] dtype
  const int32_t* topk_ids;    // [num_tokens, top_k]
  const float* topk_weights;  // [num_tokens, top_k]
  int32_t num_tokens;
  int32_t rows_per_rank;  // B, the same on every rank
  int32_t hidden;
  int32_t top_k;
  RowDtype dtype;
  int32_t expert_begin;  // this rank's experts
  int32_t expert_end;
  void* x_all;         // [N*B, hidden] dtype
  int32_t* owned_ids;  // [N*B, top_k]
  float* weights_all;  // [N*B, top_k]
};
cudaError_t launch_peer_dispatch(const PeerDispatchParams& params, cudaStream_t stream);

struct PeerCombineParams {
  PeerRank peer;
  const void* partial;  // [N*B, hidden] dtype: rows [q*B, (q+1)*B) belong to rank q's tokens
  void* out;            // [num_tokens, hidden] dtype
  int32_t num_tokens;
  int32_t rows_per_rank;
  int32_t hidden;
  RowDtype dtype;
};
cudaError_t launch_peer_combine(const PeerCombineParams& params, cudaStream_t stream);

}  // namespace di::parallel::cuda
