#pragma once
// Index math of the tensor-core prefill attention kernel (attention_prefill_mma.cu), pure C++ so a
// CPU test (tests/ops/test_cuda_attn_prefill.cpp) can emulate a warp with it: the fragment layouts
// of mma.sync.m16n8k16 (bf16 in, f32 accumulate), the ldmatrix lane -> row address mapping the
// kernel uses, and the host-side dispatch rule.
//
// PTX fragment layouts (g = lane >> 2 "groupID", t = lane & 3 "thread in group"; each .b32 register
// of A/B holds two bf16, the lower column / lower k index in the low 16 bits):
//   A 16x16 (row-major, rows = M, cols = K), 4 regs:
//     a0: (g,     2t + e)   a1: (g + 8, 2t + e)   a2: (g,     2t + 8 + e)   a3: (g + 8, 2t + 8 + e)
//   B 16x8 (K x N, "col"), 2 regs:
//     b0: (k = 2t + e,      n = g)                 b1: (k = 2t + 8 + e, n = g)
//   C/D 16x8 f32, 4 regs:
//     c0: (g, 2t)  c1: (g, 2t + 1)  c2: (g + 8, 2t)  c3: (g + 8, 2t + 1)
// ldmatrix.m8n8.x4.b16: lane L gives the 16-byte row address of row (L & 7) of matrix (L >> 3);
// register i of every lane receives matrix i. Without .trans lane L gets (row L >> 2, cols
// 2(L & 3) + e); with .trans it gets (rows 2(L & 3) + e, col L >> 2) of the stored matrix.
//
// So: Q (rows x d) row-major in smem -> A fragments with ldmatrix; K (keys x d) row-major -> B
// fragments of Kᵀ with plain ldmatrix (B(k = d, n = key) = K[key][d]); V (keys x d) row-major ->
// B fragments of V with ldmatrix.trans; and the C fragments of two adjacent 8-key n-tiles of S are
// exactly the A fragment of P for that 16-key chunk (no shuffles).
#include <cstdint>

#if defined(__CUDACC__)
#define DI_MMA_HD __host__ __device__ __forceinline__
#else
#define DI_MMA_HD inline
#endif

namespace di::cuda::mma_frag {

// ---- mma.m16n8k16 fragment owners (what the hardware expects; see the table above) ----
DI_MMA_HD int a_row(int lane, int reg) {
  return (lane >> 2) + ((reg & 1) ? 8 : 0);
}
DI_MMA_HD int a_col(int lane, int reg, int e) {
  return ((lane & 3) << 1) + ((reg & 2) ? 8 : 0) + e;
}
DI_MMA_HD int b_k(int lane, int reg, int e) {
  return ((lane & 3) << 1) + (reg ? 8 : 0) + e;
}
DI_MMA_HD int b_n(int lane) {
  return lane >> 2;
}
DI_MMA_HD int c_row(int lane, int i) {
  return (lane >> 2) + (i >= 2 ? 8 : 0);
}
DI_MMA_HD int c_col(int lane, int i) {
  return ((lane & 3) << 1) + (i & 1);
}

// ---- the kernel's ldmatrix.x4 row addresses (lane -> (row, col) of the first element) ----
// Q A-fragment of a 16x16 chunk: matrix i = rows (i & 1) * 8, cols (i >> 1) * 8 -> a0..a3.
DI_MMA_HD int ldsm_q_row(int lane) {
  return ((lane >> 3) & 1) * 8 + (lane & 7);
}
DI_MMA_HD int ldsm_q_col(int lane) {
  return (lane >> 4) * 8;
}
// K: B fragments of two 8-key n-tiles for one 16-dim k-chunk: matrix i = keys (i >> 1) * 8,
// dims (i & 1) * 8 -> regs {b0, b1} of n-tile 0, then {b0, b1} of n-tile 1.
DI_MMA_HD int ldsm_k_key(int lane) {
  return (lane >> 4) * 8 + (lane & 7);
}
DI_MMA_HD int ldsm_k_col(int lane) {
  return ((lane >> 3) & 1) * 8;
}
// V (.trans): B fragments for one 16-key k-chunk and two 8-dim n-tiles: matrix i = keys
// (i & 1) * 8, dims (i >> 1) * 8 -> regs {b0, b1} of dim-tile 0, then of dim-tile 1.
DI_MMA_HD int ldsm_v_key(int lane) {
  return ((lane >> 3) & 1) * 8 + (lane & 7);
}
DI_MMA_HD int ldsm_v_col(int lane) {
  return (lane >> 4) * 8;
}

// What ldmatrix hands lane `lane` from an 8x8 matrix, element e of its register.
DI_MMA_HD int ldsm_elem_row(int lane, int e, bool trans) {
  return trans ? ((lane & 3) << 1) + e : lane >> 2;
}
DI_MMA_HD int ldsm_elem_col(int lane, int e, bool trans) {
  return trans ? lane >> 2 : ((lane & 3) << 1) + e;
}

}  // namespace di::cuda::mma_frag

namespace di::cuda {

// Dispatch rule (host): the tensor-core kernel serves prefill-heavy batches with equal q/v head
// dims of 64 or 128 and 16-byte aligned rows: some sequence has several new tokens
// (num_tokens > num_seqs) and the split-KV planner chose one split (it splits decode-like
// batches: num_tokens <= 8 * num_seqs with a context > the split size); decode and such
// decode-like batches stay on the CUDA-core split-KV kernel.
inline bool prefill_mma_supported(int32_t head_dim_qk, int32_t head_dim_v, int32_t k_offset,
                                  int32_t v_offset, int32_t kv_head_stride, int32_t entry_size) {
  return head_dim_qk == head_dim_v && (head_dim_qk == 64 || head_dim_qk == 128) &&
         k_offset % 8 == 0 && v_offset % 8 == 0 && kv_head_stride % 8 == 0 && entry_size % 8 == 0;
}
inline bool prefill_mma_wanted(int32_t num_seqs, int32_t num_tokens, int32_t num_splits) {
  return num_tokens > num_seqs && num_splits == 1;
}
// Kernel variants (warps per CTA x 16-row m-tiles per warp): 4x1 (default), 8x1, 4x2 (FA2's
// 128-row tile; m_tiles 2 implies 4 warps). Rows (token, q head of the group) per CTA:
inline int32_t prefill_mma_rows(int32_t warps, int32_t m_tiles) {
  return m_tiles == 2 ? 4 * 16 * 2 : (warps == 8 ? 8 : 4) * 16;
}
// The Hopper kernel (attention_prefill_wgmma.cu, warpgroup MMA): head dim 128 only, otherwise
// the mma.sync kernel's rule; 128 rows (token, q head) per CTA.
inline bool prefill_wgmma_supported(int32_t head_dim_qk, int32_t head_dim_v, int32_t k_offset,
                                    int32_t v_offset, int32_t kv_head_stride, int32_t entry_size) {
  return head_dim_qk == 128 &&
         prefill_mma_supported(head_dim_qk, head_dim_v, k_offset, v_offset, kv_head_stride,
                               entry_size);
}
constexpr int32_t kPrefillWgmmaRows = 128;
// Grid bound on CTAs per kv head (tiles never straddle sequences).
inline int64_t prefill_mma_max_tiles(int32_t num_seqs, int32_t num_tokens, int32_t group,
                                     int32_t rows) {
  return (int64_t{num_tokens} * group + rows - 1) / rows + num_seqs;
}

}  // namespace di::cuda
