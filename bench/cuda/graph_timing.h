#pragma once
// Timing for the benchmarks that launch kernels directly (bench_cuda_gemv, bench_cuda_launch): a
// CUDA error check that stops the benchmark, and the median replay time of a captured graph.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

namespace di::bench {

inline void cuda_check(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s:%d %s: %s\n", file, line, what, cudaGetErrorString(e));
  std::exit(1);
}

}  // namespace di::bench

#define DI_BENCH_CK(x) ::di::bench::cuda_check((x), #x, __FILE__, __LINE__)

namespace di::bench {

// Median per-replay time (ms) over `reps` replays of a graph of whatever `enqueue` issues on `s`
// (after three untimed replays).
inline double graph_replay_ms(cudaStream_t s, int reps, const std::function<void()>& enqueue) {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  DI_BENCH_CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  enqueue();
  DI_BENCH_CK(cudaStreamEndCapture(s, &g));
  DI_BENCH_CK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 3; ++i) DI_BENCH_CK(cudaGraphLaunch(ge, s));
  DI_BENCH_CK(cudaStreamSynchronize(s));
  cudaEvent_t a, b;
  DI_BENCH_CK(cudaEventCreate(&a));
  DI_BENCH_CK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    DI_BENCH_CK(cudaEventRecord(a, s));
    DI_BENCH_CK(cudaGraphLaunch(ge, s));
    DI_BENCH_CK(cudaEventRecord(b, s));
    DI_BENCH_CK(cudaEventSynchronize(b));
    float t = 0;
    DI_BENCH_CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  DI_BENCH_CK(cudaEventDestroy(a));
  DI_BENCH_CK(cudaEventDestroy(b));
  DI_BENCH_CK(cudaGraphExecDestroy(ge));
  DI_BENCH_CK(cudaGraphDestroy(g));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace di::bench
