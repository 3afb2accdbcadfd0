#pragma once
// EPLB kernels (issue #8): per-expert routing counts and the logical -> physical expert map of
// redundant expert replicas. The CPU backend (cpu_backend.cpp) is the reference for both.
#include <cuda_runtime.h>

#include <cstdint>

namespace di::cuda {

// counts[e] += number of entries of ids equal to e; ids outside [0, num_experts) are skipped
// (negative ids are padding; the router never produces ids >= num_experts).
struct MoeCountParams {
  const int32_t* ids;  // [entries]
  int32_t* counts;     // [num_experts]
  int64_t entries;
  int32_t num_experts;
};
void launch_moe_count_experts(const MoeCountParams& p, cudaStream_t stream);

// phys[t * top_k + j] = replica_slots[indptr[e] + t % n], e = ids[t * top_k + j],
// n = indptr[e + 1] - indptr[e]. An id outside [0, num_experts), an expert without replicas or
// a replica range outside [0, num_slots) writes -1 (moe_experts then rejects it).
struct MoeMapReplicasParams {
  const int32_t* ids;             // [tokens * top_k]
  const int32_t* replica_indptr;  // [num_experts + 1]
  const int32_t* replica_slots;   // [num_slots]
  int32_t* phys;                  // [tokens * top_k]
  int64_t tokens;
  int32_t top_k;
  int32_t num_experts;
  int32_t num_slots;
};
void launch_moe_map_replicas(const MoeMapReplicasParams& p, cudaStream_t stream);

}  // namespace di::cuda
