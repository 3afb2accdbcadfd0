#pragma once
// GQA decode attention from the QKV GEMM output in one kernel (Backend::qkv_rope_attention,
// issue #5): the attention prologue of qkv_rope_store_kernel (decode_fused.h), the decode
// attention of gqa_decode_kernel (attention.h) and the split combine (split_combine.cuh) fused.
//
// grid (num_splits, num_kv_heads, num_seqs), 128 threads; per CTA (split, kv head g, sequence s):
//   1. the new K/V of every new token of s whose position falls into this split (the last split
//      takes positions beyond the grid, the first negative ones): [k_norm] + rope of k, copy of
//      v, into the pool at slot_mapping (skipped for slots < 0 or blocks >= num_blocks), then a
//      barrier: the split's own attention below reads them back from the pool.
//   2. per new token: its G q rows of head group g, [q_norm] + rope, rounded to bf16 in shared
//      memory (never written to global memory), then the decode attention over the split.
//   3. several splits: the partials (o, m, l) as the decode kernel writes them; __threadfence,
//      atomicAdd on counters[s * num_kv_heads + g]; the CTA that arrives last merges every split
//      in split order (combine_split_row's math, partials read through L2) and sets the counter
//      back to 0. One split: the output directly.
// Same bits as qkv_rope_store + paged_attention on the decode kernel (both kernels share
// qkv_rope_rows.cuh, gqa_decode.cuh and split_combine.cuh and run on 128 threads).
//
// Precondition beyond those of the two ops: slot_mapping[t] is the pool slot of cache position
// positions[t] in its sequence's block table (the engine's invariant), so the only CTA that reads
// a new token's K/V is the one that wrote it.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels/attention.h"
#include "backend/cuda/kernels/decode_fused.h"

namespace di::cuda {

struct QkvRopeAttentionKernelParams {
  QkvRopeStoreKernelParams store;   // bf16 (f32 false); q_out unused: q stays on chip
  PagedAttentionKernelParams attn;  // bf16, a call gqa_decode_supported() takes; q and
                                    // tile_indptr unused; pool is store.pool
  uint32_t* counters;  // [num_seqs * num_kv_heads] arrival counts; 0 before and after a launch
};

// Whether the fused kernel takes these params (gqa_decode_supported, bf16 store, head dims and
// pool layout of the store equal to the attention's: K at 0, V at num_kv_heads * head_dim).
bool qkv_rope_attention_supported(const QkvRopeAttentionKernelParams& p);

// Launched with the programmatic-dependent-launch attribute (unless DEEPINFER_PDL=0): the kernel
// waits (griddepcontrol.wait) before it reads anything, so it may follow the qkv GEMV early.
cudaError_t launch_qkv_rope_attention(const QkvRopeAttentionKernelParams& p, cudaStream_t stream);

// The tensor-core decode kernel with the attention prologue fused (gqa_decode_mma.cu), for the
// calls it takes (gqa_decode_mma_for the group, the layouts qkv_rope_attention_supported asks
// for): CTA (x, kv head g, sequence s) computes its token's G q rows of g ([q_norm] + rope,
// rounded as qkv_rope_store writes q) into shared memory instead of reading q, and the CTA whose
// splits hold a new token's position writes that token's K/V of g to the pool (qkv_rope_rows.cuh,
// the store kernel's arithmetic) and reads them back after a fence and a barrier. q (store.q_out)
// is not written. Then the split combine as after launch_gqa_decode_mma. Output, new K/V and pool
// bit-equal to qkv_rope_store + launch_paged_attention on the tensor-core kernel. Launched as a
// PDL dependent of the qkv GEMM (kPdlGqaDecodeMma): it copies earlier steps' K/V and prefetches
// the norm weights and the rope row before its wait. p.q is unused.
bool qkv_rope_gqa_decode_mma_supported(const PagedAttentionKernelParams& p,
                                       const QkvRopeStoreKernelParams& st);
// False (nothing launched) when unsupported.
bool launch_qkv_rope_gqa_decode_mma(const PagedAttentionKernelParams& p,
                                    const QkvRopeStoreKernelParams& st, cudaStream_t stream);

}  // namespace di::cuda
