// One warp per (row, 128-column block): each lane owns 4 consecutive values, the warp reduces the
// block's amax with shuffles, lane 0 writes the scale, every lane writes its 4 e4m3 bytes as one
// 32-bit store. Memory-bound; no shared memory.
#include <cuda_fp8.h>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/fp8_quant.h"

namespace di::cuda {
namespace {

constexpr int kGroup = 128;
constexpr float kE4m3Max = 448.0f;
constexpr int kWarpsPerBlock = 8;

__device__ __forceinline__ uint32_t to_e4m3(float v) {
  return static_cast<uint32_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

__global__ void fp8_quant_1x128_kernel(Fp8QuantParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t groups = p.k / kGroup;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (warp >= p.m_pad * groups) return;  // whole warps exit together
  const int64_t row = warp / groups, g = warp % groups;
  const int64_t col = g * kGroup + lane * 4;
  uint32_t packed = 0;
  float scale = 1.0f;
  if (row < p.m) {
    const bf16* src = p.x + row * p.k + col;
    float v[4];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[i] = __bfloat162float(src[i]);
      amax = fmaxf(amax, fabsf(v[i]));
    }
    amax = warp_max(amax);
    // An all-zero group gets a tiny positive scale (its q stay 0); NaN propagates into q.
    amax = fmaxf(amax, 1e-10f);
    scale = amax / kE4m3Max;
    const float inv = kE4m3Max / amax;
#pragma unroll
    for (int i = 0; i < 4; ++i) packed |= to_e4m3(v[i] * inv) << (8 * i);
  }
  *reinterpret_cast<uint32_t*>(p.q + row * p.k + col) = packed;
  if (lane == 0) p.scales[g * p.m_pad + row] = scale;
}

}  // namespace

void launch_fp8_quant_1x128(const Fp8QuantParams& p, cudaStream_t stream) {
  const int64_t warps = p.m_pad * (p.k / kGroup);
  if (warps == 0) return;
  const int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  fp8_quant_1x128_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(p);
}

}  // namespace di::cuda
