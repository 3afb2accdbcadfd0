// Per-head linear of few tokens; see head_linear.h.
//
// Napkin math (V2-Lite, 16 heads): W_UKᵀ [16, 512, 128] and W_UV [16, 128, 512] are 2 MB each,
// 0.5 us at 4.3 TB/s; 512 / 128 CTAs read 4 / 16 KB of weights each. At 32 tokens the mma work
// is 32 x 16 x 512 x 128 x 2 = 67 MFLOP, noise on the tensor cores.
//
// mma.sync.m16n8k16 fragments as in mla_decode_wide.cu: ldmatrix x4 with lane L giving row
// (L & 7) + 8 ((L >> 3) & 1), column 8 (L >> 4) of the row-major token tile is the A fragment;
// over the weight rows (the n index), lane L giving row (L & 7) + 8 (L >> 4), column
// 8 ((L >> 3) & 1) yields b0, b1 of two n-tiles for one k step. Shared rows are padded by 8 bf16
// (a row stride of 4 mod 32 words).
#include "backend/cuda/kernels/head_linear.h"

#include "backend/cuda/kernels/common.cuh"

namespace di::cuda {
namespace {

constexpr int kCols = 16;  // output columns per CTA: two n8 tiles
constexpr int kWarps = 4;  // split over k
constexpr int kThreads = kWarps * 32;
constexpr int kMaxK = 1024;
constexpr int kMaxMt = kHeadLinearMaxTokens / 16;

// Shared memory: the weight rows [kCols][ld], the token rows [tpad][ld] (ld = kpad + 8), the
// warps' partial sums [kWarps][tpad][kCols] f32.
__host__ __device__ inline int smem_bytes(int t, int k) {
  const int ld = pad16(k) + 8, tpad = pad16(t);
  return (kCols + tpad) * ld * 2 + kWarps * tpad * kCols * 4;
}

__global__ void __launch_bounds__(kThreads) head_linear_small_kernel(HeadLinearParams p) {
  pdl_trigger();
  extern __shared__ __align__(16) unsigned char smem[];
  const int col0 = blockIdx.x * kCols, h = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int k = p.k, kpad = pad16(k), ld = kpad + 8;
  const int tpad = pad16(p.t), mtiles = tpad / 16;
  bf16* w_s = reinterpret_cast<bf16*>(smem);                  // [kCols][ld]
  bf16* x_s = w_s + kCols * ld;                               // [tpad][ld]
  float* part_s = reinterpret_cast<float*>(x_s + tpad * ld);  // [kWarps][tpad][kCols]
  const bf16* w = static_cast<const bf16*>(p.w) + (int64_t{h} * p.n + col0) * k;
  const bf16* x = static_cast<const bf16*>(p.x) + int64_t{h} * k;
  const int64_t ldx = int64_t{p.heads} * k;

  // This warp's k steps [s0, s1): its slices of the weight and token rows are its own (copied,
  // waited for and read by this warp alone until the partial sums).
  const int nsteps = kpad / 16, s0 = warp * nsteps / kWarps, s1 = (warp + 1) * nsteps / kWarps;
  const int cpr = 2 * (s1 - s0);                  // 16-byte chunks per row of the slice
  for (int i = lane; i < kCols * cpr; i += 32) {  // the weights: before pdl_wait
    const int r = i / cpr, c = 2 * s0 + i % cpr;
    const bool valid = col0 + r < p.n && c * 8 < k;
    cp_async16(w_s + r * ld + c * 8, valid ? w + int64_t{r} * k + c * 8 : p.w, valid ? 16 : 0);
  }
  pdl_wait();
  for (int i = lane; i < tpad * cpr; i += 32) {
    const int r = i / cpr, c = 2 * s0 + i % cpr;
    const bool valid = r < p.t && c * 8 < k;
    cp_async16(x_s + r * ld + c * 8, valid ? x + r * ldx + c * 8 : p.x, valid ? 16 : 0);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncwarp();

  float acc[kMaxMt][2][4];
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
  const int g = lane >> 2, t4 = lane & 3;
  float* mine = part_s + warp * tpad * kCols;
#pragma unroll
  for (int mt = 0; mt < kMaxMt; ++mt) {
    if (mt >= mtiles) break;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int r = mt * 16 + g, c = nt * 8 + 2 * t4;
      *reinterpret_cast<float2*>(mine + r * kCols + c) =
          make_float2(acc[mt][nt][0], acc[mt][nt][1]);
      *reinterpret_cast<float2*>(mine + (r + 8) * kCols + c) =
          make_float2(acc[mt][nt][2], acc[mt][nt][3]);
    }
  }
  __syncthreads();
  // The warps' partial sums in warp order, rounded once to bf16 (as the cuBLAS path).
  bf16* y = static_cast<bf16*>(p.y);
  const int64_t ldy = int64_t{p.heads} * p.n;
  for (int i = tid; i < p.t * (kCols / 2); i += kThreads) {
    const int r = i / (kCols / 2), c = 2 * (i % (kCols / 2));
    if (col0 + c >= p.n) continue;
    float v0 = 0.0f, v1 = 0.0f;
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) {
      const float2 v = *reinterpret_cast<const float2*>(part_s + (wi * tpad + r) * kCols + c);
      v0 += v.x;
      v1 += v.y;
    }
    *reinterpret_cast<__nv_bfloat162*>(y + r * ldy + int64_t{h} * p.n + col0 + c) =
        __floats2bfloat162_rn(v0, v1);
  }
}

}  // namespace

bool head_linear_small_supported(int64_t t, int64_t heads, int64_t k, int64_t n) {
  return t >= 1 && t <= kHeadLinearMaxTokens && heads >= 1 && heads <= 65535 && k % 8 == 0 &&
         k > 0 && k <= kMaxK && n % 8 == 0 && n > 0;
}

int32_t head_linear_small_smem(int32_t t, int32_t k) {
  return smem_bytes(t, k);
}

cudaError_t launch_head_linear_small(const HeadLinearParams& p, cudaStream_t stream) {
  const int smem = head_linear_small_smem(p.t, p.k);
  cudaError_t err =
      open_dynamic_smem(reinterpret_cast<const void*>(&head_linear_small_kernel), smem);
  if (err != cudaSuccess) return err;
  return launch_pdl(
      &head_linear_small_kernel,
      dim3(static_cast<unsigned>((p.n + kCols - 1) / kCols), static_cast<unsigned>(p.heads)),
      dim3(kThreads), static_cast<size_t>(smem), stream, p);
}

}  // namespace di::cuda
