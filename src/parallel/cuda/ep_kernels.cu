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

// One block per packed row; the x part is copied as raw bytes (dtype-agnostic), 2 bytes at a
// time (hidden x 2 or 4 bytes is always even).
__global__ void latency_pack_kernel(LatencyPackParams p) {
  const int64_t x_bytes = int64_t{p.hidden} * (p.dtype == RowDtype::kFloat32 ? 4 : 2);
  for (int64_t r = blockIdx.x; r < p.rows_per_rank; r += gridDim.x) {
    char* row = static_cast<char*>(p.rows) + r * p.row_bytes;
    const bool real = r < p.num_tokens;
    auto* dst = reinterpret_cast<uint16_t*>(row);
    const auto* src = reinterpret_cast<const uint16_t*>(static_cast<const char*>(p.x) + r * x_bytes);
    for (int64_t i = threadIdx.x; i < x_bytes / 2; i += blockDim.x) dst[i] = real ? src[i] : 0;
    auto* ids = reinterpret_cast<int32_t*>(row + x_bytes);
    auto* wts = reinterpret_cast<float*>(row + x_bytes + int64_t{p.top_k} * 4);
    for (int j = threadIdx.x; j < p.top_k; j += blockDim.x) {
      ids[j] = real ? p.topk_ids[r * p.top_k + j] : -1;
      wts[j] = real ? p.topk_weights[r * p.top_k + j] : 0.0f;
    }
  }
}

__global__ void latency_unpack_kernel(LatencyUnpackParams p) {
  const int64_t x_bytes = int64_t{p.hidden} * (p.dtype == RowDtype::kFloat32 ? 4 : 2);
  for (int64_t r = blockIdx.x; r < p.num_rows; r += gridDim.x) {
    const char* row = static_cast<const char*>(p.rows) + r * p.row_bytes;
    const auto* src = reinterpret_cast<const uint16_t*>(row);
    auto* dst = reinterpret_cast<uint16_t*>(static_cast<char*>(p.x_all) + r * x_bytes);
    for (int64_t i = threadIdx.x; i < x_bytes / 2; i += blockDim.x) dst[i] = src[i];
    const auto* ids = reinterpret_cast<const int32_t*>(row + x_bytes);
    const auto* wts = reinterpret_cast<const float*>(row + x_bytes + int64_t{p.top_k} * 4);
    for (int j = threadIdx.x; j < p.top_k; j += blockDim.x) {
      const int32_t e = ids[j];
      p.owned_ids[r * p.top_k + j] = e >= p.expert_begin && e < p.expert_end ? e : -1;
      p.weights_all[r * p.top_k + j] = wts[j];
    }
  }
}

template <typename T>
__global__ void rank_sum_kernel(RankSumParams p) {
  const T* in = static_cast<const T*>(p.partials);
  T* out = static_cast<T*>(p.out);
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    for (int64_t h = threadIdx.x; h < p.hidden; h += blockDim.x) {
      float acc = load_as_float(in, t * p.hidden + h);  // rank 0: one rank is an exact copy
      for (int32_t r = 1; r < p.num_ranks; ++r) {
        acc = __fadd_rn(acc, load_as_float(in, (int64_t{r} * p.rows_per_rank + t) * p.hidden + h));
      }
      store_from_float(out, t * p.hidden + h, acc);
    }
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

cudaError_t launch_latency_pack(const LatencyPackParams& params, cudaStream_t stream) {
  if (params.rows_per_rank == 0) return cudaSuccess;
  latency_pack_kernel<<<blocks_for(params.rows_per_rank), kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

cudaError_t launch_latency_unpack(const LatencyUnpackParams& params, cudaStream_t stream) {
  if (params.num_rows == 0) return cudaSuccess;
  latency_unpack_kernel<<<blocks_for(params.num_rows), kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

cudaError_t launch_rank_sum(const RankSumParams& params, cudaStream_t stream) {
  if (params.num_tokens == 0) return cudaSuccess;
  const int blocks = blocks_for(params.num_tokens);
  if (params.dtype == RowDtype::kFloat32) {
    rank_sum_kernel<float><<<blocks, kThreads, 0, stream>>>(params);
  } else {
    rank_sum_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(params);
  }
  return cudaGetLastError();
}

}  // namespace di::parallel::cuda
