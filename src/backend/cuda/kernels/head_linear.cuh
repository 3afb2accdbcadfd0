#pragma once
// The per-head linear of few tokens as a device function (head_linear.h): one group of 4 warps
// computes y[:, h, col0 .. col0 + 16). head_linear_small_kernel runs one group per CTA; the MLA
// prologue with the absorbed query (decode_fused.cu) runs two per CTA next to its rope/store CTAs.
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/head_linear.h"

namespace di::cuda {

inline constexpr int kHeadLinearCols = 16;  // output columns per group: two n8 tiles
inline constexpr int kHeadLinearWarps = 4;  // a group's warps, split over k
inline constexpr int kHeadLinearThreads = kHeadLinearWarps * 32;
inline constexpr int kHeadLinearMaxK = 1024;

// Shared memory of one group: the weight rows [kCols][ld], the token rows [tpad][ld]
// (ld = kpad + 8), the warps' partial sums [kWarps][tpad][kCols] f32.
__host__ __device__ inline int head_linear_smem_bytes(int t, int k) {
  const int ld = pad16(k) + 8, tpad = pad16(t);
  return (kHeadLinearCols + tpad) * ld * 2 + kHeadLinearWarps * tpad * kHeadLinearCols * 4;
}

// The group's shared memory: weight rows [kCols][ld], token rows [tpad][ld], partial sums.
struct HeadLinearSmem {
  bf16* w_s;
  bf16* x_s;
  float* part_s;
  int ld, tpad;
};
__device__ inline HeadLinearSmem head_linear_smem(const HeadLinearParams& p, unsigned char* smem) {
  HeadLinearSmem m;
  m.ld = pad16(p.k) + 8;
  m.tpad = pad16(p.t);
  m.w_s = reinterpret_cast<bf16*>(smem);
  m.x_s = m.w_s + kHeadLinearCols * m.ld;
  m.part_s = reinterpret_cast<float*>(m.x_s + m.tpad * m.ld);
  return m;
}

// This warp's k steps [s0, s1) of the group's 4 warps: its slices of the weight and token rows
// are its own (copied, waited for and read by this warp alone until the partial sums).
__device__ inline void head_linear_warp_steps(const HeadLinearParams& p, int warp, int& s0,
                                              int& s1) {
  const int nsteps = pad16(p.k) / 16;
  s0 = warp * nsteps / kHeadLinearWarps;
  s1 = (warp + 1) * nsteps / kHeadLinearWarps;
}

// The weights of columns [col0, col0 + 16) of head h: cp.async of the warp's slices of the 16
// weight rows (no commit; the token rows' group commits them).
// (m: the group's layout, head_linear_smem or one of the caller's.)
__device__ inline void head_linear_load_w(const HeadLinearParams& p, int col0, int h,
                                          const HeadLinearSmem& m) {
  const int tid = static_cast<int>(threadIdx.x) % kHeadLinearThreads, lane = tid & 31,
            warp = tid >> 5;
  const int k = p.k;
  const bf16* w = static_cast<const bf16*>(p.w) + (int64_t{h} * p.n + col0) * k;
  int s0, s1;
  head_linear_warp_steps(p, warp, s0, s1);
  const int cpr = 2 * (s1 - s0);  // 16-byte chunks per row of the slice
  for (int i = lane; i < kHeadLinearCols * cpr; i += 32) {
    const int r = i / cpr, c = 2 * s0 + i % cpr;
    const bool valid = col0 + r < p.n && c * 8 < k;
    cp_async16(m.w_s + r * m.ld + c * 8, valid ? w + int64_t{r} * k + c * 8 : p.w, valid ? 16 : 0);
  }
}

__device__ inline void head_linear_load_w(const HeadLinearParams& p, int col0, int h,
                                          unsigned char* smem) {
  head_linear_load_w(p, col0, h, head_linear_smem(p, smem));
}

// acc[mt][0..1] (m16 tiles mt < mtiles of the token rows x_s, two n8 tiles of the 16 weight rows
// w_s; row stride ld) = the products over k steps [s0, s1), summed from zero in k order.
template <int kMaxMt>
__device__ __forceinline__ void head_linear_mma(float (&acc)[kMaxMt][2][4], const bf16* w_s,
                                                const bf16* x_s, int ld, int s0, int s1, int mtiles,
                                                int lane) {
#pragma unroll
  for (int mt = 0; mt < kMaxMt; ++mt)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
  const int frag_row = (lane & 7) + 8 * ((lane >> 3) & 1), frag_col = 8 * (lane >> 4);
  // Weight rows are the n index: lane L gives row (L & 7) + 8 (L >> 4), column 8 ((L >> 3) & 1):
  // b0, b1 of n-tiles 0 and 1 for one k step.
  const bf16* wb = w_s + ((lane & 7) + 8 * (lane >> 4)) * ld + 8 * ((lane >> 3) & 1);
  for (int ks = s0; ks < s1; ++ks) {
    uint32_t b[4];
    ldsm_x4(b, wb + ks * 16);
#pragma unroll
    for (int mt = 0; mt < kMaxMt; ++mt) {
      if (mt < mtiles) {
        uint32_t a[4];
        ldsm_x4(a, x_s + (mt * 16 + frag_row) * ld + frag_col + ks * 16);
        mma_bf16_16816(acc[mt][0], a, b[0], b[1]);
        mma_bf16_16816(acc[mt][1], a, b[2], b[3]);
      }
    }
  }
}

// After head_linear_load_w: griddepcontrol.wait, the token rows (x + r·x_ld + h·x_hs) unless
// `x_ready` (the CTA wrote them into x_s and passed a barrier), then y[:, h, col0 .. + 16).
// Contains one __syncthreads: every thread of the CTA must call it (each group with its own
// columns and weight rows and partial sums; groups may share x_s when x_ready).
__device__ inline void head_linear_finish(const HeadLinearParams& p, int col0, int h,
                                          const HeadLinearSmem& m, bool x_ready) {
  constexpr int kMaxMt = kHeadLinearMaxTokens / 16;
  const int tid = static_cast<int>(threadIdx.x) % kHeadLinearThreads, lane = tid & 31,
            warp = tid >> 5;
  const int k = p.k, ld = m.ld, tpad = m.tpad, mtiles = tpad / 16;
  bf16* w_s = m.w_s;
  bf16* x_s = m.x_s;
  float* part_s = m.part_s;
  int s0, s1;
  head_linear_warp_steps(p, warp, s0, s1);
  pdl_wait();
  if (!x_ready) {
    const bf16* x = static_cast<const bf16*>(p.x) + int64_t{h} * p.x_hs;
    const int64_t ldx = p.x_ld;
    const int cpr = 2 * (s1 - s0);
    for (int i = lane; i < tpad * cpr; i += 32) {
      const int r = i / cpr, c = 2 * s0 + i % cpr;
      const bool valid = r < p.t && c * 8 < k;
      cp_async16(x_s + r * ld + c * 8, valid ? x + r * ldx + c * 8 : p.x, valid ? 16 : 0);
    }
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncwarp();

  float acc[kMaxMt][2][4];
  head_linear_mma(acc, w_s, x_s, ld, s0, s1, mtiles, lane);
  const int g = lane >> 2, t4 = lane & 3;
  float* mine = part_s + warp * tpad * kHeadLinearCols;
#pragma unroll
  for (int mt = 0; mt < kMaxMt; ++mt) {
    if (mt >= mtiles) break;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int r = mt * 16 + g, c = nt * 8 + 2 * t4;
      *reinterpret_cast<float2*>(mine + r * kHeadLinearCols + c) =
          make_float2(acc[mt][nt][0], acc[mt][nt][1]);
      *reinterpret_cast<float2*>(mine + (r + 8) * kHeadLinearCols + c) =
          make_float2(acc[mt][nt][2], acc[mt][nt][3]);
    }
  }
  __syncthreads();
  // The warps' partial sums in warp order, rounded once to bf16 (as the cuBLAS path).
  bf16* y = static_cast<bf16*>(p.y);
  const int64_t ldy = int64_t{p.heads} * p.n;
  for (int i = tid; i < p.t * (kHeadLinearCols / 2); i += kHeadLinearThreads) {
    const int r = i / (kHeadLinearCols / 2), c = 2 * (i % (kHeadLinearCols / 2));
    if (col0 + c >= p.n) continue;
    float v0 = 0.0f, v1 = 0.0f;
#pragma unroll
    for (int wi = 0; wi < kHeadLinearWarps; ++wi) {
      const float2 v =
          *reinterpret_cast<const float2*>(part_s + (wi * tpad + r) * kHeadLinearCols + c);
      v0 += v.x;
      v1 += v.y;
    }
    *reinterpret_cast<__nv_bfloat162*>(y + r * ldy + int64_t{h} * p.n + col0 + c) =
        __floats2bfloat162_rn(v0, v1);
  }
}

__device__ inline void head_linear_finish(const HeadLinearParams& p, int col0, int h,
                                          unsigned char* smem, bool x_ready) {
  head_linear_finish(p, col0, h, head_linear_smem(p, smem), x_ready);
}

// Columns [col0, col0 + 16) of head h by the group of threads threadIdx.x / 128 (its own `smem`,
// head_linear_smem_bytes): the group's weight rows are copied before griddepcontrol.wait, the
// token rows (x + r·x_ld + h·x_hs) after it. Contains one __syncthreads: every thread of the CTA
// must call it (each group with its own columns and smem).
__device__ inline void head_linear_cols(const HeadLinearParams& p, int col0, int h,
                                        unsigned char* smem) {
  head_linear_load_w(p, col0, h, smem);
  head_linear_finish(p, col0, h, smem, false);
}

}  // namespace di::cuda
