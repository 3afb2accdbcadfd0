#pragma once
// GQA decode attention from the QKV GEMM output with the prologue fused in
// (Backend::qkv_rope_attention, opt-in DEEPINFER_ATTN_FUSED_MMA=1; run 29: slower on the H200).
// The CUDA-core fused kernel of issue #5 (run 10: slower too) was removed in run 46; the last
// commit with it is afcdc3e.
//
// Precondition beyond those of qkv_rope_store + paged_attention: slot_mapping[t] is the pool
// slot of cache position positions[t] in its sequence's block table (the engine's invariant),
// so the only CTA that reads a new token's K/V is the one that wrote it.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels/attention.h"
#include "backend/cuda/kernels/decode_fused.h"

namespace di::cuda {

// The tensor-core decode kernel with the attention prologue fused (gqa_decode_mma.cu), for the
// calls it takes (gqa_decode_mma_for the group, the layouts asked for: a bf16 store whose head dims
// and pool layout equal the attention's, K at 0, V at num_kv_heads * head_dim): CTA (x, kv head g,
// sequence s) computes its token's G q rows of g ([q_norm] + rope, rounded as qkv_rope_store writes
// q) into shared memory instead of reading q, and the CTA whose splits hold a new token's position
// writes that token's K/V of g to the pool (qkv_rope_rows.cuh, the store kernel's arithmetic) and
// reads them back after a fence and a barrier. q (store.q_out) is not written. Then the split
// combine as after launch_gqa_decode_mma. Output, new K/V and pool bit-equal to qkv_rope_store +
// launch_paged_attention on the tensor-core kernel. Launched as a PDL dependent of the qkv GEMM
// (kPdlGqaDecodeMma): it copies earlier steps' K/V and prefetches the norm weights and the rope row
// before its wait. p.q is unused.
bool qkv_rope_gqa_decode_mma_supported(const PagedAttentionKernelParams& p,
                                       const QkvRopeStoreKernelParams& st);
// False (nothing launched) when unsupported.
bool launch_qkv_rope_gqa_decode_mma(const PagedAttentionKernelParams& p,
                                    const QkvRopeStoreKernelParams& st, cudaStream_t stream);

}  // namespace di::cuda
