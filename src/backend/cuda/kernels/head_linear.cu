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
#include "backend/cuda/kernels/head_linear.cuh"

namespace di::cuda {
namespace {

__global__ void __launch_bounds__(kHeadLinearThreads) head_linear_small_kernel(HeadLinearParams p) {
  pdl_trigger();
  extern __shared__ __align__(16) unsigned char smem[];
  head_linear_cols(p, static_cast<int>(blockIdx.x) * kHeadLinearCols, static_cast<int>(blockIdx.y),
                   smem);
}

}  // namespace

bool head_linear_small_supported(int64_t t, int64_t heads, int64_t k, int64_t n) {
  return t >= 1 && t <= kHeadLinearMaxTokens && heads >= 1 && heads <= 65535 && k % 8 == 0 &&
         k > 0 && k <= kHeadLinearMaxK && n % 8 == 0 && n > 0;
}

int32_t head_linear_small_smem(int32_t t, int32_t k) {
  return head_linear_smem_bytes(t, k);
}

cudaError_t launch_head_linear_small(const HeadLinearParams& p, cudaStream_t stream) {
  const int smem = head_linear_small_smem(p.t, p.k);
  cudaError_t err =
      open_dynamic_smem(reinterpret_cast<const void*>(&head_linear_small_kernel), smem);
  if (err != cudaSuccess) return err;
  return launch_pdl(&head_linear_small_kernel,
                    dim3(static_cast<unsigned>((p.n + kHeadLinearCols - 1) / kHeadLinearCols),
                         static_cast<unsigned>(p.heads)),
                    dim3(kHeadLinearThreads), static_cast<size_t>(smem), stream, p);
}

}  // namespace di::cuda
