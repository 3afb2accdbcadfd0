#pragma once
// The router softmax's denominator in the order every backend sums it (backend.h,
// moe_softmax_denominator): header-only and __host__ __device__ under nvcc, so the CPU op and the
// CUDA serial router run this one definition (the warp router does the same sums with shuffles).
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define DI_SOFTMAX_HD __host__ __device__ __forceinline__
#else
#define DI_SOFTMAX_HD inline
#endif

namespace di {

// Σ_i exp(l_i - mx) over e logits in double: "lane" j < 32 sums exp(l_{j + 32 s} - mx) for s
// ascending, then five butterfly rounds v_j = v_j + v_{j xor o}, o = 16 ... 1; the result is v_0.
DI_SOFTMAX_HD double softmax_denominator_lanes(const float* l, int64_t e, float mx) {
  double v[32];
  for (int j = 0; j < 32; ++j) {
    v[j] = 0.0;
    for (int64_t i = j; i < e; i += 32) v[j] += exp(static_cast<double>(l[i] - mx));
  }
  for (int o = 16; o >= 1; o /= 2) {
    double next[32];
    for (int j = 0; j < 32; ++j) next[j] = v[j] + v[j ^ o];
    for (int j = 0; j < 32; ++j) v[j] = next[j];
  }
  return v[0];
}

}  // namespace di
