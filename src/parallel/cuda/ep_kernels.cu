#include "parallel/cuda/ep_kernels.h"

#include <cuda_bf16.h>

#include <algorithm>

namespace di::parallel::cuda {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill an H200 (132 SMs) several times over; kernels stride beyond it.
constexpr int kMaxBlocks = 132 * 16;

// One block per destination row (grid-strided); threads copy the row in units of Unit bytes.
template <typename Unit>
__global__ void gather_rows_kernel(GatherRowsParams p) {
  const int64_t units_per_row = p.row_bytes / static_cast<int64_t>(sizeof(Unit));
  for (int64_t r = blockIdx.x; r < p.num_rows; r += gridDim.x) {
    const Unit* src =
        reinterpret_cast<const Unit*>(static_cast<const char*>(p.src) + p.src_row[r] * p.row_bytes);
    Unit* dst = reinterpret_cast<Unit*>(static_cast<char*>(p.dst) + r * p.row_bytes);
    for (int64_t u = threadIdx.x; u < units_per_row; u += blockDim.x) dst[u] = src[u];
  }
}

__device__ __forceinline__ float load_as_float(const float* p, int64_t i) {
  return p[i];
}
__device__ __forceinline__ float load_as_float(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void store_from_float(float* p, int64_t i, float v) {
  p[i] = v;
}
__device__ __forceinline__ void store_from_float(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

// One block per token (grid-strided), threads over hidden. __fmul_rn/__fadd_rn keep nvcc from
// fusing into an FMA, which would round once instead of twice and break bit equality with the
// host reference.
template <typename T>
__global__ void combine_kernel(CombineParams p) {
  const T* buf = static_cast<const T*>(p.combine_buf);
  T* out = static_cast<T*>(p.out);
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    const int32_t* idx = p.entry_return_idx + t * p.top_k;
    const float* w = p.topk_weights + t * p.top_k;
    for (int64_t h = threadIdx.x; h < p.hidden; h += blockDim.x) {
      float acc = 0.0f;
      for (int32_t j = 0; j < p.top_k; ++j) {
        const int32_t row = idx[j];
        if (row < 0) continue;
        acc = __fadd_rn(acc, __fmul_rn(w[j], load_as_float(buf, row * int64_t{p.hidden} + h)));
      }
      store_from_float(out, t * p.hidden + h, acc);
    }
  }
}

template <typename T>
__global__ void affine_expert_kernel(AffineExpertParams p) {
  const T* in = static_cast<const T*>(p.in);
  T* out = static_cast<T*>(p.out);
  const int64_t n = int64_t{p.num_rows} * p.hidden;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    store_from_float(out, i, __fadd_rn(__fmul_rn(load_as_float(in, i), p.scale), p.shift));
  }
}

int blocks_for(int64_t work_items) {
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(work_items, 1), kMaxBlocks));
}

}  // namespace

cudaError_t launch_gather_rows(const GatherRowsParams& params, cudaStream_t stream) {
  if (params.num_rows == 0) return cudaSuccess;
  const int blocks = blocks_for(params.num_rows);
  // The widest unit that divides the row and both base addresses (cudaMalloc gives 256 bytes).
  const auto aligned = [&](int64_t unit) {
    return params.row_bytes % unit == 0 && reinterpret_cast<uintptr_t>(params.dst) % unit == 0 &&
           reinterpret_cast<uintptr_t>(params.src) % unit == 0;
  };
  if (aligned(16)) {
    gather_rows_kernel<uint4><<<blocks, kThreads, 0, stream>>>(params);
  } else if (aligned(8)) {
    gather_rows_kernel<uint2><<<blocks, kThreads, 0, stream>>>(params);
  } else if (aligned(4)) {
    gather_rows_kernel<uint32_t><<<blocks, kThreads, 0, stream>>>(params);
  } else if (aligned(2)) {
    gather_rows_kernel<uint16_t><<<blocks, kThreads, 0, stream>>>(params);
  } else {
    gather_rows_kernel<uint8_t><<<blocks, kThreads, 0, stream>>>(params);
  }
  return cudaGetLastError();
}

cudaError_t launch_combine(const CombineParams& params, cudaStream_t stream) {
  if (params.num_tokens == 0) return cudaSuccess;
  const int blocks = blocks_for(params.num_tokens);
  if (params.dtype == RowDtype::kFloat32) {
    combine_kernel<float><<<blocks, kThreads, 0, stream>>>(params);
  } else {
    combine_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(params);
  }
  return cudaGetLastError();
}

cudaError_t launch_affine_expert(const AffineExpertParams& params, cudaStream_t stream) {
  const int64_t n = int64_t{params.num_rows} * params.hidden;
  if (n == 0) return cudaSuccess;
  const int blocks = blocks_for((n + kThreads - 1) / kThreads);
  if (params.dtype == RowDtype::kFloat32) {
    affine_expert_kernel<float><<<blocks, kThreads, 0, stream>>>(params);
  } else {
    affine_expert_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(params);
  }
  return cudaGetLastError();
}

}  // namespace di::parallel::cuda
