#pragma once
// Paged attention over the block-major KV pool (backend.h KvLayout), GQA and MLA through offsets.
//
// Work decomposition (planned on the host, see plan_paged_attention): the query rows of sequence s
// for kv head g are the pairs (new token i, q head h of g's group), token-major. A CTA takes a tile
// of `rows_per_tile` such rows (so the q heads of one kv head share every K/V load) and one KV
// split; grid = (max_tiles, num_kv_heads, num_splits). A one-CTA prologue kernel writes the tile
// prefix over sequences (tile_indptr) from qo_indptr on the device; CTAs find their sequence by
// binary search and CTAs beyond the last tile exit, so the grid needs only the host-side bound
// max_tiles = ceil(num_tokens * group / rows_per_tile) + num_seqs (CUDA-graph friendly: nothing
// is read back). With more than one split, partial results (unnormalised o, running max, sum) go
// to a workspace and a combine kernel merges them in split order (fixed split size).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace di::cuda {

struct PagedAttentionKernelParams {
  const __nv_bfloat16* q;     // [num_tokens, num_q_heads, head_dim_qk]
  __nv_bfloat16* out;         // [num_tokens, num_q_heads, head_dim_v]
  const __nv_bfloat16* pool;  // [num_blocks][num_layers][block_size][entry_size]
  int64_t block_stride;       // elements per pool block (all layers)
  int64_t layer_offset;       // elements from a block's start to this layer's entries
  int32_t block_size;         // tokens per block
  int32_t entry_size;         // elements per token and layer
  int32_t k_offset;           // elements from an entry's start to K of kv head 0 (even)
  int32_t v_offset;           // elements from an entry's start to V of kv head 0 (even)
  int32_t kv_head_stride;     // elements between kv heads (even; 0 for MLA)
  int32_t num_q_heads;
  int32_t num_kv_heads;        // divides num_q_heads
  int32_t head_dim_qk;         // even, <= 576
  int32_t head_dim_v;          // even, <= 512
  float scale;                 // softmax scale on q·k
  const int32_t* positions;    // [num_tokens] causal limit: token sees cache positions [0, pos]
  const int32_t* qo_indptr;    // [num_seqs + 1]
  const int32_t* kv_indptr;    // [num_seqs + 1]
  const int32_t* kv_indices;   // block ids per sequence
  const int32_t* kv_last_len;  // [num_seqs] tokens in each sequence's last block
  int32_t num_seqs;
  int32_t num_tokens;
  // plan
  int32_t rows_per_tile;  // 16 or 64 (a kernel instantiation)
  int32_t max_tiles;      // ceil(num_tokens * group / rows_per_tile) + num_seqs (grid.x)
  int32_t* tile_indptr;   // [num_seqs + 1] workspace: first tile of each sequence
  int32_t split_size;     // kv tokens per split (multiple of 32); >= max kv len when 1 split
  int32_t num_splits;     // >= ceil(max kv len / split_size)
  float* partial_o;       // [num_splits, num_tokens * num_q_heads, head_dim_v] (splits > 1)
  float* partial_ml;      // [num_splits, num_tokens * num_q_heads, 2]: running max, sum
  // The device's multiprocessor count (CudaBackend's): the GQA decode kernel doubles its warps
  // on grids of at most one CTA per SM (gqa_decode_head_split). 0: never.
  int32_t num_sms;
  // fp32 verification mode (make_backend("cuda-fp32")): when pool_f32 is set, q/out/pool above
  // are unused and these f32 tensors (same shapes) are read and written instead.
  const float* q_f32;
  float* out_f32;
  const float* pool_f32;
  // The tensor-core GQA decode kernel lets its PDL dependent (the split combine, which launches
  // o_proj) start after its own wait when set, else at its start (run 42; set by its launcher:
  // on unless DEEPINFER_ATTN_LATE_TRIGGER=0).
  int32_t late_trigger = 0;
};

// Host-side plan (pure, unit-testable): tile rows, split size, number of splits, workspace bytes.
struct AttentionPlan {
  int32_t rows_per_tile = 16;
  int32_t max_tiles = 0;
  int32_t split_size = 0;
  int32_t num_splits = 1;
  size_t partial_bytes = 0;  // partial_o + partial_ml, 0 when num_splits == 1
};
AttentionPlan plan_paged_attention(int32_t num_seqs, int32_t num_tokens, int32_t max_kv_len,
                                   int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim_qk,
                                   int32_t head_dim_v);

// Shared memory the kernel needs for these dims (bytes); the launcher checks it against the
// device limit and names the dims when it does not fit.
// elem_size: 2 (bf16) or 4 (f32 pool, the fp32 verification mode).
size_t paged_attention_smem_bytes(int32_t rows_per_tile, int32_t head_dim_qk, int32_t head_dim_v,
                                  bool v_in_k, int32_t elem_size = 2);

// The decode kernel (gqa_decode_kernel, attention.cu) is on unless DEEPINFER_ATTN_DECODE=generic
// (the A/B switch; read once per process).
bool gqa_decode_enabled();
// Warps per head group of the decode kernel (HS): 1, or 2 (each with half of the group's q
// heads); and token warps (TW): 4, or 8 (warp w + 4 continues warp w's online softmax over the
// next chunk: head dims 64 / 128, splits of at most 64 tokens). 0 (default; the environment's
// DEEPINFER_GQA_HEAD_SPLIT / DEEPINFER_GQA_TOKEN_WARPS) picks by the grid and the group
// (launch_decode_e in attention.cu). The bits are the same for every choice.
int gqa_decode_head_split();
void set_gqa_decode_head_split(int hs);
int gqa_decode_token_warps();
void set_gqa_decode_token_warps(int tw);

// A decode call either GQA decode kernel may take: bf16, at most one new token per sequence,
// grid.z (sequences) within limits, kv heads dividing q heads, separate K and V of equal dims.
bool gqa_decode_shape_ok(const PagedAttentionKernelParams& p);
// Whether the decode kernel takes this call: bf16, separate K and V (GQA), head dims equal and
// 64 / 128 / 256, group 1 / 2 / 4 / 8, 32-bit aligned per-lane vectors, at most one new token
// per sequence on average (decode batches), grid.z (sequences) within limits.
bool gqa_decode_supported(const PagedAttentionKernelParams& p);

// The tensor-core decode kernel (gqa_decode_mma.cu): the q heads of a kv head as the rows of an
// m16 tile, so 16 heads x 8 keys per mma instead of a warp sum per (head, key). Mode -1 (default;
// DEEPINFER_GQA_DECODE_MMA unset): used for 4, 8 or 16 q heads per kv head (measured faster at
// every batch for 4 and 8), the CUDA-core kernel below; 1: for every group it supports (1, 2, 4,
// 8, 16); 0: never. Head dims 64 / 128. The choice depends on the model's shape only (not the
// batch), so batch invariance holds; its bits differ from the CUDA-core kernel's (P in bf16).
int gqa_decode_mma_mode();
void set_gqa_decode_mma_mode(int mode);
bool gqa_decode_mma_for(int group, int head_dim);
// KV splits per CTA of the tensor-core decode kernel (the next split's K/V copied while one is
// computed): 0 (default) picks 1, 2 or 4 by the grid; 1..8 forces it. Same bits for every value.
int gqa_decode_mma_splits_per_cta();
void set_gqa_decode_mma_splits_per_cta(int spc);
// The tensor-core decode kernel's merge of its 4 warps with one __syncthreads instead of three
// (merge_direct in gqa_decode_mma.cu; bitwise the block merge by construction, checked on the H200
// in run 40). -1 = where a CTA merges several splits (the default: Qwen3-30B-A3B batch 32 +1.0 %;
// at batch 1, one split per CTA, it lost 0.9 %), 0 = never, 1 = always
// (DEEPINFER_GQA_MMA_MERGE_WARP).
// gqa_decode_mma_merge_warp_launches() counts the launches that took it (tests).
void set_gqa_decode_mma_merge_warp(int mode);
int gqa_decode_mma_merge_warp();
int64_t gqa_decode_mma_merge_warp_launches();
// The split combine for few rows and at most 64 splits without barriers (split_combine.cuh,
// combine_split_row_warp; bitwise the block merge by construction, checked on the H200 in run
// 39). 1 = on (the default), 0 = the block merge (DEEPINFER_COMBINE_WARP).
// split_combine_warp_launches() counts the launches that took it (tests).
void set_split_combine_warp(int on);
int split_combine_warp();
int64_t split_combine_warp_launches();
// Launches it for a decode call when gqa_decode_mma_for and the layout allow; false otherwise.
bool launch_gqa_decode_mma(const PagedAttentionKernelParams& p, cudaStream_t stream);
// Whether launch_gqa_decode_mma would take p (it launches nothing when not).
bool gqa_decode_mma_takes(const PagedAttentionKernelParams& p);

// The bf16 split combine after a decode kernel (combine_splits_kernel, a PDL dependent): merges
// the num_splits partials of every row into out in split order; nothing for one split.
void launch_split_combine(const PagedAttentionKernelParams& p, cudaStream_t stream);

void launch_paged_attention(const PagedAttentionKernelParams& p, cudaStream_t stream);

}  // namespace di::cuda
