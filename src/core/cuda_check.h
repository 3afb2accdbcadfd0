#pragma once
// CUDA_CHECK / CUDA_CHECK_LAUNCH: throw di::Error naming the failed call, the error and the place.
// Host code of CUDA builds only; library-specific checks (cuBLAS, NCCL) extend this beside their
// users (backend/cuda/cuda_check.h, parallel/cuda/cuda_check.h).
#include <cuda_runtime.h>

#include "core/error.h"

#define CUDA_CHECK(call)                                                                   \
  do {                                                                                     \
    const cudaError_t di_cuda_err_ = (call);                                               \
    DI_CHECK(di_cuda_err_ == cudaSuccess, "{} failed: {} ({})", #call,                     \
             cudaGetErrorName(di_cuda_err_), cudaGetErrorString(di_cuda_err_));            \
  } while (0)

// After a kernel launch: catches bad launch configurations right away (not asynchronous faults).
#define CUDA_CHECK_LAUNCH(what)                                                            \
  do {                                                                                     \
    const cudaError_t di_cuda_err_ = cudaGetLastError();                                   \
    DI_CHECK(di_cuda_err_ == cudaSuccess, "launch of {} failed: {} ({})", what,            \
             cudaGetErrorName(di_cuda_err_), cudaGetErrorString(di_cuda_err_));            \
  } while (0)
