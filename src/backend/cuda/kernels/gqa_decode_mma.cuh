#pragma once
// The tensor-core GQA decode arithmetic of one warp and one 16-key sub-tile (gqa_decode_mma.cu:
// a CTA per KV split, partials merged by combine_splits_kernel; until run 48 also the opt-in
// cluster kernel, which merged the splits of a kv head over distributed shared memory and was
// removed after measuring within noise at batch 1 and slower elsewhere). The q heads of one kv
// head are the rows of an m16 tile (rows >= G are zero). Device code only.
#include <cstdint>

#include "backend/cuda/kernels/attention.h"
#include "backend/cuda/kernels/attention_prefill_mma_math.h"
#include "backend/cuda/kernels/common.cuh"

namespace di::cuda::gqa_mma {

constexpr int kSub = 16;  // keys per warp sub-tile
constexpr float kLn2 = 0.6931471805599453f;

// Row halves of the m16 tile that hold real heads: rows g (and g + 8 when G > 8).
template <int G>
constexpr int halves() {
  return G > 8 ? 2 : 1;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// K and V rows [base, base + 16) of one kv head (layer_base: the layer's entries of that head in
// the pool) into the warp's buffers k_s / v_s (rows of D + 8 elements): the rows below t1 whose
// position is in [lo, hi), and with zero_tail the rows past t1 as zeros; nothing when base >= t1.
// b0: the sequence's first block-table index. The caller commits.
template <int D>
__device__ __forceinline__ void copy_subtile(const PagedAttentionKernelParams& p, int b0,
                                             const bf16* layer_base, bf16* k_s, bf16* v_s, int base,
                                             int t1, int lo, int hi, bool zero_tail, int lane) {
  constexpr int kLd = D + 8;
  constexpr int kChunks = D / 8;  // 16-byte chunks per K / V row
  if (base >= t1) return;
  // Nothing to copy or zero in this sub-tile (warp-uniform): skip the rounds below. After the
  // wait most CTAs hold no new entry, and these rounds' code would be fetched cold for nothing
  // (docs/batch1_decode.md, "Cold code").
  if (max(base, lo) >= min(min(base + kSub, t1), hi) && !(zero_tail && base + kSub > t1)) return;
  // Lane r < 16 looks up row r's entry (one block-id load per lane, all in flight together;
  // -1 for a zero row, -2 for a row left alone); the copies take it by shuffle. (A block-id
  // load per copy serialised four rounds of dependent loads per sub-tile.)
  const int tr = base + (lane & 15);
  int64_t my_ent = -2;
  if (tr < t1) {
    if (tr >= lo && tr < hi)
      my_ent = int64_t{p.kv_indices[b0 + tr / p.block_size]} * p.block_stride +
               int64_t{tr % p.block_size} * p.entry_size;
  } else if (zero_tail) {
    my_ent = -1;
  }
  static_assert(kSub * kChunks % 32 == 0, "whole copy rounds per warp");
#pragma unroll
  for (int it = 0; it < kSub * kChunks / 32; ++it) {
    const int idx = lane + 32 * it, j = idx / kChunks, c = idx % kChunks;
    const int64_t e = __shfl_sync(0xffffffffu, my_ent, j);
    if (e == -2) continue;
    const bool ok = e >= 0;
    const bf16* ent = ok ? layer_base + e + c * 8 : p.pool;
    cp_async16(k_s + j * kLd + c * 8, ok ? ent + p.k_offset : ent, ok ? 16 : 0);
    cp_async16(v_s + j * kLd + c * 8, ok ? ent + p.v_offset : ent, ok ? 16 : 0);
  }
}

// Q's A fragments of G rows of D (row h at q0 + h * D): per k step kc and row half r (row
// g + 8r), qa[kc][2r] holds columns kc·16 + 2·t4 (+1) and qa[kc][2r + 1] those 8 further; zero
// for rows past the group (rows g + 8 are not held at all for groups of at most 8).
template <int D, int G>
__device__ __forceinline__ void load_q_frags(const bf16* q0, int lane,
                                             uint32_t (&qa)[D / 16][2 * halves<G>()]) {
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    const int col = kc * 16 + 2 * t4;
#pragma unroll
    for (int r = 0; r < halves<G>(); ++r) {
      const int h = g + 8 * r;
      qa[kc][2 * r] = h < G ? ld_u32(q0 + h * D + col) : 0u;
      qa[kc][2 * r + 1] = h < G ? ld_u32(q0 + h * D + col + 8) : 0u;
    }
  }
}

// One sub-tile of keys [base, base + 16) (only those < t1 count) against the q fragments: S =
// Q·Kᵀ on two n-tiles, scores scaled into base 2 (c2 = scale · log2 e), the online softmax per
// row over the sub-tile (row max over the 4 lanes of a row), P rounded to bf16 (the C fragments
// of S are P's A fragments), O += P·V (V by ldmatrix.trans). m, l: the running max (base 2) and
// the lane's partial sum of rows g, g + 8. `mark`: the trace mark after the first scores.
template <int D, int G>
__device__ __forceinline__ void attend_subtile(const uint32_t (&qa)[D / 16][2 * halves<G>()],
                                               const bf16* k_s, const bf16* v_s, int base, int t1,
                                               float c2, int lane, float (&o)[D / 8][4],
                                               float (&m)[2], float (&l)[2], bool mark) {
  constexpr int kHalves = halves<G>();
  constexpr int kLd = D + 8;
  const int t4 = lane & 3;
  auto a_frag = [&](int kc, uint32_t(&a)[4]) {
    a[0] = qa[kc][0];
    a[2] = qa[kc][1];
    if constexpr (kHalves == 2) {
      a[1] = qa[kc][2];
      a[3] = qa[kc][3];
    } else {
      a[1] = a[3] = 0u;
    }
  };
  // S = Q·Kᵀ: n-tile 0 = keys base .. base + 7, n-tile 1 = base + 8 .. base + 15.
  float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    uint32_t a[4], b[4];
    a_frag(kc, a);
    ldsm_x4(b, k_s + mma_frag::ldsm_k_key(lane) * kLd + kc * 16 + mma_frag::ldsm_k_col(lane));
    mma_bf16_16816(sc[0], a, b[0], b[1]);
    mma_bf16_16816(sc[1], a, b[2], b[3]);
  }
  if (mark) DI_TRACE_MARK_AFTER(sc[0][0] + sc[1][3]);  // q and the first keys arrived
  // Online softmax per row half r (c0, c1: row g; c2, c3: row g + 8).
  uint32_t pa[4];
#pragma unroll
  for (int r = 0; r < kHalves; ++r) {
    float sv[2][2];
    float mx = m[r];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = base + nt * 8 + 2 * t4 + e;
        sv[nt][e] = key < t1 ? sc[nt][2 * r + e] * c2 : -INFINITY;
        mx = fmaxf(mx, sv[nt][e]);
      }
    }
    mx = quad_max(mx);                        // finite: key `base` (< t1) is in every row
    const float corr = fast_exp2(m[r] - mx);  // 0 on the first sub-tile (m = -inf)
    m[r] = mx;
    float ps = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        sv[nt][e] = fast_exp2(sv[nt][e] - mx);
        ps += sv[nt][e];
      }
    }
    l[r] = l[r] * corr + ps;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      o[dt][2 * r] *= corr;
      o[dt][2 * r + 1] *= corr;
    }
    pa[r] = pack_bf16(sv[0][0], sv[0][1]);
    pa[2 + r] = pack_bf16(sv[1][0], sv[1][1]);
  }
  if constexpr (kHalves == 1) pa[1] = pa[3] = 0u;
    // O += P·V: V's B fragments for two 8-dim n-tiles per ldmatrix.trans.
#pragma unroll
  for (int dp = 0; dp < D / 16; ++dp) {
    uint32_t b[4];
    ldsm_x4_trans(b, v_s + mma_frag::ldsm_v_key(lane) * kLd + dp * 16 + mma_frag::ldsm_v_col(lane));
    mma_bf16_16816(o[2 * dp], pa, b[0], b[1]);
    mma_bf16_16816(o[2 * dp + 1], pa, b[2], b[3]);
  }
  __syncwarp();  // every lane's ldmatrix is done before the buffer is refilled
}

}  // namespace di::cuda::gqa_mma
