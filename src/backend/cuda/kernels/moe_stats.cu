// EPLB kernels: routing counts per expert (accumulated on the device, read back by the host only
// at bucket boundaries) and the logical -> physical replica map. Both are tiny and memory-bound:
// one thread per entry, no shared memory, no ordering concerns (integer atomics commute).
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/moe_stats.h"

namespace di::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void moe_count_experts_kernel(MoeCountParams p) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= p.entries) return;
  const int32_t e = p.ids[i];
  if (e >= 0 && e < p.num_experts) atomicAdd(p.counts + e, 1);
}

__global__ void moe_map_replicas_kernel(MoeMapReplicasParams p) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= p.tokens * p.top_k) return;
  const int64_t t = i / p.top_k;
  const int32_t e = p.ids[i];
  int32_t out = -1;
  if (e >= 0 && e < p.num_experts) {
    const int32_t begin = p.replica_indptr[e];
    const int32_t n = p.replica_indptr[e + 1] - begin;
    if (n > 0 && begin >= 0 && begin + n <= p.num_slots) {
      out = p.replica_slots[begin + static_cast<int32_t>(t % n)];
    }
  }
  p.phys[i] = out;
}

}  // namespace

void launch_moe_count_experts(const MoeCountParams& p, cudaStream_t stream) {
  if (p.entries <= 0) return;
  moe_count_experts_kernel<<<ceil_div(p.entries, kThreads), kThreads, 0, stream>>>(p);
}

void launch_moe_map_replicas(const MoeMapReplicasParams& p, cudaStream_t stream) {
  const int64_t entries = p.tokens * p.top_k;
  if (entries <= 0) return;
  moe_map_replicas_kernel<<<ceil_div(entries, kThreads), kThreads, 0, stream>>>(p);
}

}  // namespace di::cuda
