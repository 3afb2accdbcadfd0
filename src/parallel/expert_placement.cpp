#include "parallel/expert_placement.h"

#include <algorithm>

#include "core/error.h"

namespace di::parallel {

ExpertPlacement::ExpertPlacement(int32_t num_experts, int32_t num_ranks, int32_t slots_per_rank,
                                 std::vector<int32_t> slot_expert)
    : num_experts_(num_experts),
      num_ranks_(num_ranks),
      slots_per_rank_(slots_per_rank),
      slot_expert_(std::move(slot_expert)) {
  DI_CHECK(num_experts > 0 && num_ranks > 0 && slots_per_rank > 0,
           "placement needs positive sizes, got {} experts, {} ranks, {} slots per rank",
           num_experts, num_ranks, slots_per_rank);
  DI_CHECK(
      static_cast<int64_t>(slot_expert_.size()) == static_cast<int64_t>(num_ranks) * slots_per_rank,
      "slot table has {} entries, expected {} ranks x {} slots", slot_expert_.size(), num_ranks,
      slots_per_rank);
  build_index();
  check_integrity();
}

ExpertPlacement ExpertPlacement::round_robin(int32_t num_experts, int32_t num_ranks) {
  DI_CHECK(num_experts > 0 && num_ranks > 0, "round_robin({}, {})", num_experts, num_ranks);
  const int32_t slots_per_rank = (num_experts + num_ranks - 1) / num_ranks;
  std::vector<int32_t> table(static_cast<size_t>(num_ranks) * slots_per_rank, kEmptySlot);
  for (int32_t e = 0; e < num_experts; ++e) {
    table[static_cast<size_t>(e % num_ranks) * slots_per_rank + e / num_ranks] = e;
  }
  return ExpertPlacement(num_experts, num_ranks, slots_per_rank, std::move(table));
}

void ExpertPlacement::build_index() {
  replica_indptr_.assign(num_experts_ + 1, 0);
  for (size_t s = 0; s < slot_expert_.size(); ++s) {
    const int32_t e = slot_expert_[s];
    DI_CHECK(e == kEmptySlot || (e >= 0 && e < num_experts_),
             "slot {} holds expert {}, outside [0, {})", s, e, num_experts_);
    if (e != kEmptySlot) ++replica_indptr_[e + 1];
  }
  for (int32_t e = 0; e < num_experts_; ++e) replica_indptr_[e + 1] += replica_indptr_[e];
  replica_slots_.assign(replica_indptr_.back(), 0);
  std::vector<int32_t> cursor(replica_indptr_.begin(), replica_indptr_.end() - 1);
  for (size_t s = 0; s < slot_expert_.size(); ++s) {
    const int32_t e = slot_expert_[s];
    if (e != kEmptySlot) replica_slots_[cursor[e]++] = static_cast<int32_t>(s);
  }
}

std::span<const int32_t> ExpertPlacement::replicas(int32_t expert_idx) const {
  DI_CHECK(expert_idx >= 0 && expert_idx < num_experts_, "expert {} outside [0, {})", expert_idx,
           num_experts_);
  return std::span<const int32_t>(replica_slots_)
      .subspan(replica_indptr_[expert_idx], num_replicas(expert_idx));
}

int32_t ExpertPlacement::slot_on_rank(int32_t expert_idx, int32_t rank_idx) const {
  for (int32_t s : replicas(expert_idx)) {
    if (rank_of_slot(s) == rank_idx) return s;
  }
  return kEmptySlot;
}

bool ExpertPlacement::operator==(const ExpertPlacement& other) const {
  return num_experts_ == other.num_experts_ && num_ranks_ == other.num_ranks_ &&
         slots_per_rank_ == other.slots_per_rank_ && slot_expert_ == other.slot_expert_;
}

void ExpertPlacement::check_integrity() const {
  DI_CHECK(static_cast<int32_t>(slot_expert_.size()) == num_slots(), "slot table size {} != {}",
           slot_expert_.size(), num_slots());
  std::vector<int32_t> count(num_experts_, 0);
  std::vector<int32_t> last_rank(num_experts_, -1);
  for (int32_t s = 0; s < num_slots(); ++s) {
    const int32_t e = slot_expert_[s];
    if (e == kEmptySlot) continue;
    DI_CHECK(e >= 0 && e < num_experts_, "slot {} holds expert {}, outside [0, {})", s, e,
             num_experts_);
    // Slots are visited rank by rank, so a repeat on one rank shows as last_rank == this rank.
    DI_CHECK(last_rank[e] != rank_of_slot(s), "rank {} holds two replicas of expert {}",
             rank_of_slot(s), e);
    last_rank[e] = rank_of_slot(s);
    ++count[e];
  }
  for (int32_t e = 0; e < num_experts_; ++e) {
    DI_CHECK(count[e] > 0, "expert {} has no slot: tokens routed to it could not be served", e);
    DI_CHECK(num_replicas(e) == count[e], "replica index of expert {} lists {} slots, table has {}",
             e, num_replicas(e), count[e]);
    const auto reps =
        std::span<const int32_t>(replica_slots_).subspan(replica_indptr_[e], count[e]);
    for (size_t i = 0; i < reps.size(); ++i) {
      DI_CHECK(slot_expert_[reps[i]] == e,
               "replica index of expert {} points at slot {} holding {}", e, reps[i],
               slot_expert_[reps[i]]);
      DI_CHECK(i == 0 || reps[i - 1] < reps[i], "replicas of expert {} not ascending", e);
    }
  }
}

std::vector<double> expected_rank_loads(const ExpertPlacement& placement,
                                        std::span<const int64_t> expert_load) {
  DI_CHECK(static_cast<int32_t>(expert_load.size()) == placement.num_experts(),
           "load has {} experts, placement {}", expert_load.size(), placement.num_experts());
  std::vector<double> loads(placement.num_ranks(), 0.0);
  for (int32_t s = 0; s < placement.num_slots(); ++s) {
    const int32_t e = placement.expert_at(s);
    if (e == kEmptySlot) continue;
    loads[placement.rank_of_slot(s)] +=
        static_cast<double>(expert_load[e]) / placement.num_replicas(e);
  }
  return loads;
}

double moe_lb(std::span<const double> rank_loads) {
  DI_CHECK(!rank_loads.empty(), "moe_lb of zero ranks");
  double sum = 0.0;
  double max = 0.0;
  for (double x : rank_loads) {
    sum += x;
    max = std::max(max, x);
  }
  if (sum <= 0.0) return 1.0;
  return max / (sum / static_cast<double>(rank_loads.size()));
}

double moe_lb(std::span<const int64_t> rank_loads) {
  std::vector<double> d(rank_loads.begin(), rank_loads.end());
  return moe_lb(std::span<const double>(d));
}

}  // namespace di::parallel
