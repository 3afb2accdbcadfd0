#pragma once
// CUDA_CHECK / CUBLAS_CHECK: throw di::Error naming the call, the error and the place.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/error.h"

#define CUDA_CHECK(call)                                                                   \
  do {                                                                                     \
    const cudaError_t di_cuda_err_ = (call);                                               \
    DI_CHECK(di_cuda_err_ == cudaSuccess, "{} failed: {} ({})", #call,                     \
             cudaGetErrorName(di_cuda_err_), cudaGetErrorString(di_cuda_err_));            \
  } while (0)

#define CUBLAS_CHECK(call)                                                                 \
  do {                                                                                     \
    const cublasStatus_t di_cublas_st_ = (call);                                           \
    DI_CHECK(di_cublas_st_ == CUBLAS_STATUS_SUCCESS, "{} failed: {} ({})", #call,          \
             cublasGetStatusName(di_cublas_st_), cublasGetStatusString(di_cublas_st_));    \
  } while (0)

// After a kernel launch: catches bad launch configurations right away (not asynchronous faults).
#define CUDA_CHECK_LAUNCH(what)                                                            \
  do {                                                                                     \
    const cudaError_t di_cuda_err_ = cudaGetLastError();                                   \
    DI_CHECK(di_cuda_err_ == cudaSuccess, "launch of {} failed: {} ({})", what,            \
             cudaGetErrorName(di_cuda_err_), cudaGetErrorString(di_cuda_err_));            \
  } while (0)
