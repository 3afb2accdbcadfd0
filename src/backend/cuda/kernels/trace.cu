// The host side of the kernel timeline (trace.h).
#include <mutex>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/trace.h"

namespace di::cuda {
namespace {

struct Registry {
  std::mutex mu;
  std::vector<void (*)(const TraceTarget&)> setters;
  TraceTarget target;
};
Registry& registry() {
  static Registry r;
  return r;
}

void set_all(Registry& r, const TraceTarget& t) {
  for (auto* set : r.setters) set(t);
}

}  // namespace

void trace_register_setter(void (*setter)(const TraceTarget&)) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.setters.push_back(setter);
}

bool trace_enable(uint32_t capacity) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.setters.empty() || capacity == 0) return false;
  if (r.target.events == nullptr || r.target.capacity < capacity) {
    if (r.target.events != nullptr) {
      cudaFree(r.target.events);
      cudaFree(r.target.count);
      r.target = {};
    }
    if (cudaMalloc(&r.target.events, sizeof(TraceEvent) * capacity) != cudaSuccess ||
        cudaMalloc(&r.target.count, sizeof(uint32_t)) != cudaSuccess) {
      cudaFree(r.target.events);  // either may be null (cudaFree(nullptr) is a no-op)
      cudaFree(r.target.count);
      r.target = {};
      return false;
    }
    r.target.capacity = capacity;
  }
  if (cudaMemset(r.target.count, 0, sizeof(uint32_t)) != cudaSuccess) return false;
  set_all(r, r.target);
  return cudaDeviceSynchronize() == cudaSuccess;
}

std::vector<TraceEvent> trace_read() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<TraceEvent> out;
  if (r.target.events == nullptr) return out;
  cudaDeviceSynchronize();
  set_all(r, TraceTarget{});  // recording off
  uint32_t n = 0;
  if (cudaMemcpy(&n, r.target.count, sizeof n, cudaMemcpyDeviceToHost) != cudaSuccess) return out;
  n = n < r.target.capacity ? n : r.target.capacity;
  out.resize(n);
  if (n > 0 && cudaMemcpy(out.data(), r.target.events, sizeof(TraceEvent) * n,
                          cudaMemcpyDeviceToHost) != cudaSuccess)
    out.clear();
  return out;
}

}  // namespace di::cuda
