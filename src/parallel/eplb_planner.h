#pragma once
// EPLB planner: from one MoE layer's per-expert loads, choose how many replicas each logical expert
// gets and which rank holds each replica, so that the busiest rank's load is close to the mean.
//
//   1. Replicas. Every expert starts with one. Each of the num_ranks * slots_per_rank - num_experts
//      spare slots goes to the expert with the highest load per replica (ties: lower expert id),
//      never more than num_ranks replicas per expert.
//   2. Placement, longest processing time first. Replicas sorted by load per replica (descending,
//      ties by expert id) go one by one to the least-loaded rank that has a free slot and does not
//      hold that expert yet (ties: fewer used slots, then lower rank). If every rank with a free
//      slot already holds the expert, a replica of another expert moves off a full rank onto such a
//      rank to make room (always possible: see the .cpp).
//   3. Refinement. While a single move or swap of replicas between the busiest rank and another
//   rank
//      lowers the busier of the two below the current maximum, apply the best one.
// Load per replica assumes the dispatch splits an expert's tokens evenly over its replicas, which
// plan_dispatch does to within one token per sender.
//
// Deterministic: the same loads give the same placement on every rank and every run (all ranks plan
// locally from all-reduced loads and must agree without exchanging the result).
//
// TODO(#8): hierarchical placement (replicate and pack per node first, then per GPU inside a node)
// so most dispatch traffic stays on NVLink when the EP group spans nodes.
#include <cstdint>
#include <span>
#include <vector>

#include "parallel/expert_placement.h"

namespace di::parallel {

struct PlannerOptions {
  int32_t num_ranks = 1;
  int32_t slots_per_rank = 1;        // >= ceil(num_experts / num_ranks)
  int32_t max_refine_steps = 10000;  // cap on step-3 moves (each strictly lowers a rank's load)
};

// Step 1 alone: replicas per expert, [num_experts], summing to min(num_slots, num_experts *
// num_ranks).
std::vector<int32_t> plan_replica_counts(std::span<const int64_t> expert_load, int32_t num_slots,
                                         int32_t max_replicas);

// Steps 2 and 3 for given replica counts ([num_experts], each 1..num_ranks, summing to at most
// num_ranks * slots_per_rank), e.g. counts fixed by an operator.
ExpertPlacement pack_replicas(std::span<const int64_t> expert_load,
                              std::span<const int32_t> replicas, const PlannerOptions& options);

// The whole plan for one layer: plan_replica_counts, then pack_replicas. Loads are tokens
// (non-negative).
ExpertPlacement plan_placement(std::span<const int64_t> expert_load, const PlannerOptions& options);

// One placement per layer: loads [num_layers][num_experts].
std::vector<ExpertPlacement> plan_placements(const std::vector<std::vector<int64_t>>& loads,
                                             const PlannerOptions& options);

}  // namespace di::parallel
