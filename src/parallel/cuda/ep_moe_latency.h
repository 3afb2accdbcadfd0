#pragma once
// EpMoeLatency: the decode (latency) exchange of expert parallelism (issue #8). Every size is
// fixed by `rows_per_rank` (the group's decode bucket, the same on every rank), nothing waits on
// the host, and the buffers never move after construction, so a whole MoE layer — and the whole
// decode step around it — can be captured in a CUDA graph and replayed.
//
//   rank r, T <= B tokens:  pack x | ids | weights into B rows (rows >= T: padding, ids -1)
//   all-gather (one NCCL collective)          -> N x B rows on every rank
//   unpack: x_all [N*B, H]; owned_ids = id if this rank owns the expert, else -1; weights
//   caller: Backend::moe_experts(x_all, owned_ids, weights) -> partial [N*B, H]
//           (the weighted sum over this rank's experts only; entries of -1 are skipped)
//   all-to-all of fixed size: partial rows [q*B, (q+1)*B) -> rank q
//   rank sum: out[t] = sum over ranks, rank order, fp32                         (t < T)
//
// Against the throughput path (ep_moe_cuda.h: host-built plans, exact per-entry returns summed
// in j order, 3 host syncs per layer) it sends every token to every rank and returns one partial
// sum per (rank, token): more bytes at large batches, but no host round trip, which is what
// decode at small batches needs. Output: with one rank the partial IS the output (a copy), so
// it equals plain moe_experts bit for bit; with N ranks the weighted sum is grouped per owning
// rank (and rounded to the row dtype per rank in bf16), so it equals it within rounding.
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>

#include "parallel/cuda/ep_moe_cuda.h"
#include "parallel/cuda/peer_exchange.h"

namespace di::parallel::cuda {

class EpMoeLatency {
 public:
  // Experts [expert_begin, expert_end) are this rank's. Buffers for up to max_rows_per_rank
  // tokens per rank are allocated here, once (graphs captured later keep their addresses).
  // peer (optional): this rank of a PeerExchangeGroup (peer_exchange.h) sized for at least
  // max_rows_per_rank rows: the exchanges then run as two peer-to-peer kernels instead of the
  // transport's collectives (same results, bit for bit).
  EpMoeLatency(EpTransport& transport, int32_t hidden, int32_t top_k, RowDtype dtype,
               int32_t expert_begin, int32_t expert_end, int32_t max_rows_per_rank,
               cudaStream_t stream, const PeerRank* peer = nullptr);
  bool peer_to_peer() const { return peer_.has_value(); }

  int32_t max_rows_per_rank() const { return max_rows_; }
  int32_t num_rows() const { return transport_.num_ranks() * rows_; }  // N * B of the last dispatch

  // Enqueues pack, all-gather and unpack for num_tokens <= rows_per_rank <= max_rows_per_rank
  // tokens (device pointers; x [num_tokens, hidden] dtype, ids/weights [num_tokens, top_k]).
  void dispatch(const void* x, const int32_t* topk_ids, const float* topk_weights,
                int32_t num_tokens, int32_t rows_per_rank);
  // After dispatch: the gathered inputs [num_rows(), ...] and the buffer the caller's experts
  // write their partial sums to [num_rows(), hidden].
  void* x_all() const { return x_all_.data(); }
  int32_t* owned_ids() const { return owned_ids_.as<int32_t>(); }
  float* weights_all() const { return weights_all_.as<float>(); }
  void* partial() const { return partial_.data(); }
  // Enqueues the return all-to-all and the rank sum into out [num_tokens, hidden].
  void combine(void* out, int32_t num_tokens);

  int64_t dispatch_bytes() const;  // sent by this rank per dispatch / combine at the last B
  int64_t combine_bytes() const;

 private:
  EpTransport& transport_;
  int32_t hidden_;
  int32_t top_k_;
  RowDtype dtype_;
  int32_t expert_begin_;
  int32_t expert_end_;
  int32_t max_rows_;
  cudaStream_t stream_;
  int64_t row_bytes_;  // packed row
  int32_t rows_ = 0;   // B of the last dispatch
  std::optional<PeerRank> peer_;
  DeviceBuffer packed_, packed_all_, x_all_, owned_ids_, weights_all_, partial_, returned_;
};

}  // namespace di::parallel::cuda
