#pragma once
// Absorbed multi-head latent attention (DeepSeek V2/V3) for decode-like batches, on tensor cores:
// the "tile kernel" (tile prefix + attention + split combine). CudaBackend runs it only with
// DEEPINFER_MLA_KERNEL=tile; the default is the one-launch cluster kernel (mla_decode_cluster.h).
//
// The MLA cache holds one shared "kv head" per token: entry = [latent (dv) | rope key], K = the
// whole entry (dqk = dv + rope), V = the latent (the first dv elements of the same entry). Every
// q head of a sequence attends to the same entries, so one CTA takes a tile of `rows` query rows
// (pairs (new token, q head), token-major: all heads of a token share each latent load) and one
// KV split, stages 32 cache entries at a time in shared memory and runs
//   S = Q·Kᵀ   (mma.sync m16n8k16 bf16: rows = M, tokens = N, dqk = K; 8 warps: 4 token groups x
//               2 halves of the K range, the halves summed in shared memory)
//   online softmax in fp32 (one warp per row), P rounded to bf16
//   O += P·V   (mma.sync: rows = M, latent dims = N split over the 8 warps, tokens = K)
// with O in registers. Several splits (fixed split size, batch invariant) write unnormalised
// partial results (o, running max, sum) and a combine kernel merges them in split order.
//
// Head groups: with few sequences the grid (tiles x splits) leaves most SMs idle (V2-Lite, batch
// 1, ctx 2048: 33 working CTAs on 132 SMs), so a sequence's heads may be split into `head_groups`
// groups, each its own tiles (rows = (new token, head of the group), token-major) over the same
// latent tiles. A row's arithmetic does not depend on which rows share its tile (mma rows,
// softmax rows and the P·V rows are independent; extra all-masked tiles add exact zeros), so the
// results are bit-identical for every head_groups: the choice may depend on the batch size.
//
// Limits (checked by mla_decode_supported): one kv head, K and V both at entry offset 0,
// dv < dqk, dqk % 8 == 0 and <= 576, dv % 8 == 0 and <= 512, entry_size % 8 == 0, 16-byte aligned
// q (and q_rope) / pool. dqk is zero-padded to a multiple of 16 in shared memory (e.g. 32 + 8
// golden shapes).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace di::cuda {

// What an MLA decode launch reads and writes, shared by the tile kernel (MlaDecodeParams) and
// the cluster kernel (MlaClusterDecodeParams, mla_decode_cluster.h).
struct MlaDecodeCall {
  const __nv_bfloat16* q;  // [num_tokens, num_heads, dq]: the first dq query dims
  // [num_tokens, num_heads, dqk - dq]: the last query dims (MLA's roped q_pe), or null: q holds
  // all dqk dims (dq unused). The query of a row is [q row | q_rope row].
  const __nv_bfloat16* q_rope;
  int32_t dq;                 // % 8 == 0 when q_rope is set, as is dqk - dq (16-byte chunks)
  __nv_bfloat16* out;         // [num_tokens, num_heads, dv]
  const __nv_bfloat16* pool;  // [num_blocks][num_layers][block_size][entry_size]
  int64_t block_stride;       // elements per pool block (all layers)
  int64_t layer_offset;       // elements from a block's start to this layer's entries
  int32_t block_size;
  int32_t entry_size;        // % 8 == 0
  int32_t num_heads;         // q heads (all share the one latent head)
  int32_t dqk;               // latent + rope, % 8 == 0, <= 576
  int32_t dv;                // latent, % 8 == 0, <= 512, < dqk
  float scale;               // softmax scale on q·k
  const int32_t* positions;  // [num_tokens]: token sees cache positions [0, pos]
  const int32_t* qo_indptr;  // [num_seqs + 1]
  const int32_t* kv_indptr;  // [num_seqs + 1]
  const int32_t* kv_indices;
  const int32_t* kv_last_len;  // [num_seqs]
  int32_t num_seqs;
  int32_t num_tokens;
};

struct MlaDecodeParams : MlaDecodeCall {
  // plan
  int32_t rows_per_tile;  // 16 or 32 (kernel instantiation)
  int32_t head_groups;    // >= 1, divides num_heads: CTAs per (sequence, split, row tile)
  int32_t max_tiles;      // grid.x: ceil(num_tokens * num_heads / rows) + num_seqs * head_groups
  int32_t* tile_indptr;   // [num_seqs + 1] workspace
  int32_t split_size;     // kv tokens per split (any positive value)
  int32_t num_splits;
  float* partial_o;   // [num_splits, num_tokens * num_heads, dv]   (num_splits > 1)
  float* partial_ml;  // [num_splits, num_tokens * num_heads, 2]
};

struct MlaDecodePlan {
  int32_t rows_per_tile = 16;
  int32_t head_groups = 1;
  int32_t max_tiles = 0;
  int32_t split_size = 0;
  int32_t num_splits = 1;
  size_t partial_bytes = 0;  // partial_o + partial_ml (0 with one split)
};

// Shapes the kernel handles (host-side check; pointers are checked by the caller).
bool mla_decode_supported(int32_t num_kv_heads, int32_t k_offset, int32_t v_offset, int32_t dqk,
                          int32_t dv, int32_t entry_size);
// Fixed split size 64 (DEEPINFER_MLA_SPLIT overrides, >= 16), doubled only while the partial
// workspace would exceed 512 MB; one split when the context fits in one.
// Head groups (mla_head_split_setting()): 0 = auto: doubled (up to 4, while it divides the heads)
// while the working CTAs (row tiles x splits x groups) stay <= num_sms; n >= 1: the largest
// power of two <= n dividing the heads, at any batch size (1 = one group: the old layout).
MlaDecodePlan plan_mla_decode(int32_t num_seqs, int32_t num_tokens, int32_t max_kv_len,
                              int32_t num_heads, int32_t dv, int32_t num_sms);
// DEEPINFER_MLA_HEAD_SPLIT=0|1|2|4|8 (read once; default 0 = auto). DEEPINFER_BATCH_INVARIANT=1
// turns auto into 1 (the groups are bit-identical by construction, see above; this keeps the
// pre-head-split layout where invariance is promised, until the GPU test has confirmed it).
// The override (tests; >= 0, -1 = back to the env; not thread-safe, outside captures) wins.
int32_t mla_head_split_setting();
void set_mla_head_split_override(int32_t head_split);
size_t mla_decode_smem_bytes(int32_t rows_per_tile, int32_t dqk);
void launch_mla_decode(const MlaDecodeParams& p, cudaStream_t stream);

}  // namespace di::cuda
