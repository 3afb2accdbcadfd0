// CUDA build check and device discovery. The CUDA op backend lands with issue #5; until then this
// target proves the toolchain builds sm_90a code in every configuration, and reports devices.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "backend/cuda/device_info.h"

namespace di::cuda {

namespace {
__global__ void probe_kernel(int* out) { *out = 90; }
}  // namespace

std::string describe_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return "no CUDA devices";
  std::string s;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, i);
    char line[256];
    std::snprintf(line, sizeof(line), "%d: %s (sm_%d%d, %d SMs, %.1f GiB)\n", i, prop.name,
                  prop.major, prop.minor, prop.multiProcessorCount,
                  static_cast<double>(prop.totalGlobalMem) / (1u << 30));
    s += line;
  }
  return s;
}

bool run_probe_kernel() {
  int* d = nullptr;
  if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) return false;
  probe_kernel<<<1, 1>>>(d);
  int h = 0;
  bool ok = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess && h == 90;
  cudaFree(d);
  return ok;
}

}  // namespace di::cuda
