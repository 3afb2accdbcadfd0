#pragma once
// CUDA_CHECK (core/cuda_check.h) plus NCCL_CHECK: throw di::Error naming the failed call, the error string and the
// location (core/error.h). For C++20 host code; kernels (.cu, C++17) return cudaError_t instead.
#include <nccl.h>

#include "core/cuda_check.h"

#define NCCL_CHECK(call)                                                           \
  do {                                                                             \
    const ncclResult_t di_nccl_res_ = (call);                                      \
    if (di_nccl_res_ != ncclSuccess) [[unlikely]]                                  \
      DI_FAIL("{} failed: {} (ncclResult_t {}); NCCL_DEBUG=WARN says more", #call, \
              ncclGetErrorString(di_nccl_res_), static_cast<int>(di_nccl_res_));   \
  } while (0)
