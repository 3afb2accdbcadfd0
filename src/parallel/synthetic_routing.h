#pragma once
// Synthetic MoE routing with skewed expert popularity, for EPLB tests and `deepinfer eplb-sim`.
//
// Expert popularity follows a Zipf law: the expert of popularity rank i (1-based) has weight
// 1 / i^s. Which expert has which rank is a seeded random permutation, so each layer of a model
// can have different hot experts. A token's top-k experts are k distinct draws, each with
// probability proportional to weight among the experts not drawn yet (as a router's top-k would
// pick its k highest scores). Platform-independent: own RNG conversion and shuffle.
#include <cstdint>
#include <span>
#include <vector>

#include "parallel/expert_placement.h"

namespace di::parallel {

class ZipfRouting {
 public:
  // permutation_seed fixes which experts are hot.
  ZipfRouting(int32_t num_experts, int32_t top_k, double zipf_s, uint64_t permutation_seed);

  int32_t num_experts() const { return static_cast<int32_t>(weight_.size()); }
  int32_t top_k() const { return top_k_; }
  // Normalised popularity of each expert (sums to 1).
  std::span<const double> popularity() const { return weight_; }

  // [num_tokens * top_k] logical expert ids; the same seed gives the same tokens.
  std::vector<int32_t> route(int32_t num_tokens, uint64_t seed) const;

 private:
  int32_t top_k_;
  std::vector<double> weight_;  // [num_experts]
  std::vector<double> cdf_;     // [num_experts] inclusive prefix sums of weight_
};

// Tokens each expert receives: [num_experts].
std::vector<int64_t> count_expert_load(std::span<const int32_t> topk_ids, int32_t num_experts);

// Tokens each rank's experts compute when the batch's tokens are split evenly, in order, over the
// placement's ranks (DP attention) and each rank dispatches its share with plan_dispatch:
// [num_ranks]. This is what the GPUs would see, replica choice included.
std::vector<int64_t> dispatched_rank_loads(const ExpertPlacement& placement,
                                           std::span<const int32_t> topk_ids, int32_t top_k);

}  // namespace di::parallel
