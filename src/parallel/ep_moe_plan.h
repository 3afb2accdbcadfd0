#pragma once
// Host-side planning of expert parallelism in the model (issue #8; parallel/cuda/ep_moe_hook.h):
// the static contiguous placement, the logical expert of every expanded row a rank computes,
// and which requests of a fixed list each rank serves. Pure host code (tested on the CPU).
#include <cstdint>
#include <span>
#include <vector>

#include "parallel/expert_placement.h"

namespace di::parallel {

// Static EP without redundancy, contiguous ranges: slots_per_rank = ceil(E / N) and physical slot
// p = r * slots_per_rank + s holds expert p (so rank r owns [r * spr, min(E, (r + 1) * spr)));
// slots past E are empty. For E divisible by N this is [r * E / N, (r + 1) * E / N).
ExpertPlacement contiguous_placement(int32_t num_experts, int32_t num_ranks);

// The logical expert of each of the M expanded rows rank `rank_idx` computes, where
// slot_indptr [slots_per_rank + 1] delimits the rows of each local slot (ReceivePlan::slot_indptr).
// Throws if a non-empty block belongs to an empty slot.
std::vector<int32_t> expanded_row_experts(const ExpertPlacement& placement, int32_t rank_idx,
                                          std::span<const int32_t> slot_indptr);

// Indices of the requests rank r serves out of num_requests: r, r + N, r + 2N, ...
std::vector<int32_t> requests_of_rank(int32_t num_requests, int32_t rank_idx, int32_t num_ranks);

}  // namespace di::parallel
