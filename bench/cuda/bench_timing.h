#pragma once
// Timing shared by the CUDA benchmarks (bench_cuda_llama, bench_cuda_model).
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "backend/cuda/cuda_backend.h"

namespace di::bench {

// Median of `reps` timings (ms) of fn, after `warmup` untimed calls, with CUDA events on the
// backend's stream.
inline double median_event_ms(cuda::CudaBackend& be, int warmup, int reps,
                              const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  be.synchronize();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, be.stream());
    fn();
    cudaEventRecord(b, be.stream());
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace di::bench
