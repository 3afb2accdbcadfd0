#include "parallel/ep_moe_plan.h"

#include "core/error.h"

namespace di::parallel {

ExpertPlacement contiguous_placement(int32_t num_experts, int32_t num_ranks) {
  DI_CHECK(num_experts > 0 && num_ranks > 0, "contiguous_placement: {} experts over {} ranks",
           num_experts, num_ranks);
  DI_CHECK(num_ranks <= num_experts, "contiguous_placement: {} ranks for only {} experts",
           num_ranks, num_experts);
  const int32_t spr = (num_experts + num_ranks - 1) / num_ranks;
  std::vector<int32_t> slot_expert(static_cast<size_t>(spr) * num_ranks, kEmptySlot);
  for (int32_t p = 0; p < num_experts; ++p) slot_expert[p] = p;
  // Trailing slots past E stay empty (allowed, as in round_robin).
  return ExpertPlacement(num_experts, num_ranks, spr, std::move(slot_expert));
}

std::vector<int32_t> expanded_row_experts(const ExpertPlacement& placement, int32_t rank_idx,
                                          std::span<const int32_t> slot_indptr) {
  const int32_t spr = placement.slots_per_rank();
  DI_CHECK(rank_idx >= 0 && rank_idx < placement.num_ranks(), "rank {} of {}", rank_idx,
           placement.num_ranks());
  DI_CHECK(slot_indptr.size() == static_cast<size_t>(spr) + 1 && slot_indptr[0] == 0,
           "expanded_row_experts: slot_indptr has {} entries, expected {}", slot_indptr.size(),
           spr + 1);
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(slot_indptr.back()));
  for (int32_t s = 0; s < spr; ++s) {
    const int32_t count = slot_indptr[s + 1] - slot_indptr[s];
    DI_CHECK(count >= 0, "expanded_row_experts: slot {} has {} rows", s, count);
    if (count == 0) continue;
    const int32_t e = placement.expert_at(rank_idx * spr + s);
    DI_CHECK(e != kEmptySlot, "rank {} has {} rows for its empty slot {}", rank_idx, count, s);
    out.insert(out.end(), static_cast<size_t>(count), e);
  }
  return out;
}

std::vector<int32_t> requests_of_rank(int32_t num_requests, int32_t rank_idx, int32_t num_ranks) {
  DI_CHECK(num_ranks > 0 && rank_idx >= 0 && rank_idx < num_ranks, "rank {} of {}", rank_idx,
           num_ranks);
  std::vector<int32_t> out;
  for (int32_t i = rank_idx; i < num_requests; i += num_ranks) out.push_back(i);
  return out;
}

}  // namespace di::parallel
