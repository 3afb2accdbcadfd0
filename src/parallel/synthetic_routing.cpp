#include "parallel/synthetic_routing.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/error.h"
#include "parallel/ep_layout.h"

namespace di::parallel {
namespace {

// Uniform in [0, 1) from the top 53 bits (std::uniform_real_distribution differs between
// libraries).
double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// Uniform integer in [0, n) by rejection (no modulo bias, same on every platform).
uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x = rng();
  while (x >= limit) x = rng();
  return x % n;
}

}  // namespace

ZipfRouting::ZipfRouting(int32_t num_experts, int32_t top_k, double zipf_s,
                         uint64_t permutation_seed)
    : top_k_(top_k) {
  DI_CHECK(num_experts > 0 && top_k > 0 && top_k <= num_experts,
           "Zipf routing of top-{} over {} experts", top_k, num_experts);
  DI_CHECK(zipf_s >= 0.0 && std::isfinite(zipf_s), "Zipf exponent {} must be finite and >= 0",
           zipf_s);
  std::vector<int32_t> expert_of_rank(num_experts);
  for (int32_t i = 0; i < num_experts; ++i) expert_of_rank[i] = i;
  std::mt19937_64 rng(permutation_seed);
  for (int32_t i = num_experts - 1; i > 0; --i) {
    std::swap(expert_of_rank[i], expert_of_rank[uniform_below(rng, static_cast<uint64_t>(i) + 1)]);
  }
  weight_.assign(num_experts, 0.0);
  double total = 0.0;
  for (int32_t i = 0; i < num_experts; ++i) {
    const double w = 1.0 / std::pow(static_cast<double>(i + 1), zipf_s);
    weight_[expert_of_rank[i]] = w;
    total += w;
  }
  cdf_.assign(num_experts, 0.0);
  double acc = 0.0;
  for (int32_t e = 0; e < num_experts; ++e) {
    weight_[e] /= total;
    acc += weight_[e];
    cdf_[e] = acc;
  }
}

std::vector<int32_t> ZipfRouting::route(int32_t num_tokens, uint64_t seed) const {
  DI_CHECK(num_tokens >= 0, "num_tokens {}", num_tokens);
  const int32_t n = num_experts();
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(num_tokens) * top_k_);
  std::vector<bool> taken(n, false);
  for (int32_t t = 0; t < num_tokens; ++t) {
    int32_t* row = ids.data() + static_cast<size_t>(t) * top_k_;
    double taken_mass = 0.0;
    for (int32_t j = 0; j < top_k_; ++j) {
      // Draw from the full distribution and reject experts already taken; when most of the mass is
      // taken (steep skew), draw from the remaining experts directly instead.
      int32_t e = -1;
      if (taken_mass < 0.5) {
        do {
          const double u = uniform01(rng) * cdf_.back();
          e = static_cast<int32_t>(std::upper_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
          e = std::min(e, n - 1);
        } while (taken[e]);
      } else {
        double u = uniform01(rng) * (cdf_.back() - taken_mass);
        for (e = 0; e < n - 1; ++e) {
          if (taken[e]) continue;
          if (u < weight_[e]) break;
          u -= weight_[e];
        }
        while (taken[e]) --e;  // rounding ran past the last free expert
      }
      taken[e] = true;
      taken_mass += weight_[e];
      row[j] = e;
    }
    for (int32_t j = 0; j < top_k_; ++j) taken[row[j]] = false;
  }
  return ids;
}

std::vector<int64_t> count_expert_load(std::span<const int32_t> topk_ids, int32_t num_experts) {
  std::vector<int64_t> load(num_experts, 0);
  for (int32_t e : topk_ids) {
    if (e < 0) continue;
    DI_CHECK(e < num_experts, "expert id {} outside [0, {})", e, num_experts);
    ++load[e];
  }
  return load;
}

std::vector<int64_t> dispatched_rank_loads(const ExpertPlacement& placement,
                                           std::span<const int32_t> topk_ids, int32_t top_k) {
  DI_CHECK(top_k > 0 && topk_ids.size() % top_k == 0, "{} ids, top_k {}", topk_ids.size(), top_k);
  const int64_t num_tokens = static_cast<int64_t>(topk_ids.size()) / top_k;
  const int32_t n = placement.num_ranks();
  std::vector<int64_t> slot_load(placement.num_slots(), 0);
  for (int32_t r = 0; r < n; ++r) {
    const int64_t begin = num_tokens * r / n;
    const int64_t end = num_tokens * (r + 1) / n;
    const DispatchPlan plan =
        plan_dispatch(placement, r, topk_ids.subspan(begin * top_k, (end - begin) * top_k), top_k);
    add_slot_load(plan, slot_load);
  }
  std::vector<int64_t> rank_load(n, 0);
  for (int32_t s = 0; s < placement.num_slots(); ++s) {
    rank_load[placement.rank_of_slot(s)] += slot_load[s];
  }
  return rank_load;
}

}  // namespace di::parallel
