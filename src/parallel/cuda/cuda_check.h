#pragma once
// CUDA_CHECK / NCCL_CHECK: throw di::Error naming the failed call, the error string and the
// location (core/error.h). For C++20 host code; kernels (.cu, C++17) return cudaError_t instead.
#include <cuda_runtime.h>
#include <nccl.h>

#include "core/error.h"

#define CUDA_CHECK(call)                                                     \
  do {                                                                       \
    const cudaError_t di_cuda_err_ = (call);                                 \
    if (di_cuda_err_ != cudaSuccess) [[unlikely]]                            \
      DI_FAIL("{} failed: {} ({})", #call, cudaGetErrorString(di_cuda_err_), \
              cudaGetErrorName(di_cuda_err_));                               \
  } while (0)

#define NCCL_CHECK(call)                                                           \
  do {                                                                             \
    const ncclResult_t di_nccl_res_ = (call);                                      \
    if (di_nccl_res_ != ncclSuccess) [[unlikely]]                                  \
      DI_FAIL("{} failed: {} (ncclResult_t {}); NCCL_DEBUG=WARN says more", #call, \
              ncclGetErrorString(di_nccl_res_), static_cast<int>(di_nccl_res_));   \
  } while (0)
