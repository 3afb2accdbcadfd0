#pragma once
// CUDA_CHECK (core/cuda_check.h) plus CUBLAS_CHECK: throw di::Error naming the call and the error.
#include <cublas_v2.h>

#include "core/cuda_check.h"

#define CUBLAS_CHECK(call)                                                                 \
  do {                                                                                     \
    const cublasStatus_t di_cublas_st_ = (call);                                           \
    DI_CHECK(di_cublas_st_ == CUBLAS_STATUS_SUCCESS, "{} failed: {} ({})", #call,          \
             cublasGetStatusName(di_cublas_st_), cublasGetStatusString(di_cublas_st_));    \
  } while (0)
