#pragma once
// ExpertPlacement: which logical expert each physical expert slot of one MoE layer holds.
//
// The EP group has num_ranks ranks with slots_per_rank weight slots each. Physical slot p
// (0 <= p < num_ranks * slots_per_rank) lives on rank p / slots_per_rank at local index
// p % slots_per_rank and holds logical expert slot_expert[p], or kEmptySlot. An expert with more
// than one slot has redundant replicas; the dispatch spreads its tokens over them (ep_layout.h).
//
// Invariants (check_integrity):
//   - every logical expert has at least one replica (a token routed to it has somewhere to go);
//   - no rank holds two replicas of one expert (a second copy on the same rank adds no capacity);
//   - replica_indptr/replica_slots list, per expert, exactly the slots that hold it, ascending.
// Immutable after construction: a new placement is a new object (the controller swaps whole
// tables).
#include <cstdint>
#include <span>
#include <vector>

namespace di::parallel {

inline constexpr int32_t kEmptySlot = -1;

class ExpertPlacement {
 public:
  ExpertPlacement() = default;
  // slot_expert: [num_ranks * slots_per_rank] logical expert id or kEmptySlot. Throws on a
  // placement that breaks an invariant above, naming the expert or rank.
  ExpertPlacement(int32_t num_experts, int32_t num_ranks, int32_t slots_per_rank,
                  std::vector<int32_t> slot_expert);

  // Static EP without redundancy: expert e on rank e % num_ranks, local slot e / num_ranks.
  // slots_per_rank = ceil(num_experts / num_ranks); left-over slots are empty.
  static ExpertPlacement round_robin(int32_t num_experts, int32_t num_ranks);

  int32_t num_experts() const { return num_experts_; }
  int32_t num_ranks() const { return num_ranks_; }
  int32_t slots_per_rank() const { return slots_per_rank_; }
  int32_t num_slots() const { return num_ranks_ * slots_per_rank_; }

  int32_t expert_at(int32_t slot_idx) const { return slot_expert_[slot_idx]; }
  int32_t rank_of_slot(int32_t slot_idx) const { return slot_idx / slots_per_rank_; }
  int32_t local_slot(int32_t slot_idx) const { return slot_idx % slots_per_rank_; }
  // [num_slots] logical expert per physical slot: the table a kernel reads.
  std::span<const int32_t> slot_experts() const { return slot_expert_; }

  int32_t num_replicas(int32_t expert_idx) const {
    return replica_indptr_[expert_idx + 1] - replica_indptr_[expert_idx];
  }
  // Physical slots holding `expert_idx`, ascending (so also by rank).
  std::span<const int32_t> replicas(int32_t expert_idx) const;
  // The slot of `expert_idx` on `rank_idx`, or kEmptySlot if that rank does not hold it.
  int32_t slot_on_rank(int32_t expert_idx, int32_t rank_idx) const;

  bool operator==(const ExpertPlacement& other) const;

  // Recomputes the replica index from slot_expert and checks every invariant.
  void check_integrity() const;

 private:
  void build_index();

  int32_t num_experts_ = 0;
  int32_t num_ranks_ = 0;
  int32_t slots_per_rank_ = 0;
  std::vector<int32_t> slot_expert_;     // [num_slots]
  std::vector<int32_t> replica_indptr_;  // [num_experts + 1] into replica_slots_
  std::vector<int32_t> replica_slots_;   // [occupied slots] grouped by expert, ascending
};

// Tokens each rank computes when every expert's load is split evenly over its replicas:
// rank_load[r] = sum over slots s on r of load[expert(s)] / num_replicas(expert(s)).
std::vector<double> expected_rank_loads(const ExpertPlacement& placement,
                                        std::span<const int64_t> expert_load);

// moe_lb = max rank load / mean rank load (1.0 = perfectly balanced; 1.0 for an all-zero load).
// The slowest rank sets the MoE layer's step time, so moe_lb is the slowdown over a perfect split.
double moe_lb(std::span<const double> rank_loads);
double moe_lb(std::span<const int64_t> rank_loads);

}  // namespace di::parallel
