#include "parallel/eplb_planner.h"

#include <algorithm>
#include <queue>

#include "core/error.h"

namespace di::parallel {
namespace {

// a/ra > b/rb without rounding (a, b >= 0; ra, rb >= 1): whole parts first, then the remainders,
// whose cross products stay below 2^62.
bool heavier_per_replica(int64_t a, int32_t ra, int64_t b, int32_t rb) {
  const int64_t qa = a / ra, qb = b / rb;
  if (qa != qb) return qa > qb;
  return (a % ra) * rb > (b % rb) * ra;
}

// Working state of steps 2 and 3: which experts each rank holds and its summed load.
class Packing {
 public:
  Packing(int32_t num_experts, int32_t num_ranks, int32_t slots_per_rank,
          std::vector<double> weight)
      : num_ranks_(num_ranks),
        slots_per_rank_(slots_per_rank),
        weight_(std::move(weight)),
        load_(num_ranks, 0.0),
        items_(num_ranks),
        holds_(static_cast<size_t>(num_ranks) * num_experts, false),
        num_experts_(num_experts) {}

  bool holds(int32_t rank, int32_t expert) const {
    return holds_[static_cast<size_t>(rank) * num_experts_ + expert];
  }
  bool has_room(int32_t rank) const {
    return static_cast<int32_t>(items_[rank].size()) < slots_per_rank_;
  }

  // Step 2 for one replica.
  void place(int32_t expert) {
    int32_t best = -1;
    for (int32_t q = 0; q < num_ranks_; ++q) {
      if (!has_room(q) || holds(q, expert)) continue;
      if (best < 0 || load_[q] < load_[best] ||
          (load_[q] == load_[best] && items_[q].size() < items_[best].size())) {
        best = q;
      }
    }
    if (best < 0) best = make_room(expert);
    add(best, expert);
  }

  // Step 3. Returns the number of moves applied.
  int32_t refine(int32_t max_steps) {
    int32_t steps = 0;
    for (; steps < max_steps; ++steps) {
      const int32_t a =
          static_cast<int32_t>(std::max_element(load_.begin(), load_.end()) - load_.begin());
      const double limit = load_[a] * (1.0 - 1e-12);  // strict improvement, immune to rounding
      double best_score = limit;
      int32_t best_b = -1, best_x = -1, best_y = -1;  // y < 0: move x from a to b
      for (int32_t b = 0; b < num_ranks_; ++b) {
        if (b == a) continue;
        for (int32_t x : items_[a]) {
          if (holds(b, x)) continue;
          if (has_room(b)) {
            const double score = std::max(load_[a] - weight_[x], load_[b] + weight_[x]);
            if (score < best_score) {
              best_score = score, best_b = b, best_x = x, best_y = -1;
            }
          }
          for (int32_t y : items_[b]) {
            if (weight_[y] >= weight_[x] || holds(a, y)) continue;
            const double d = weight_[x] - weight_[y];
            const double score = std::max(load_[a] - d, load_[b] + d);
            if (score < best_score) {
              best_score = score, best_b = b, best_x = x, best_y = y;
            }
          }
        }
      }
      if (best_b < 0) break;
      remove(a, best_x);
      add(best_b, best_x);
      if (best_y >= 0) {
        remove(best_b, best_y);
        add(a, best_y);
      }
    }
    return steps;
  }

  std::vector<int32_t> slot_table() const {
    std::vector<int32_t> table(static_cast<size_t>(num_ranks_) * slots_per_rank_, kEmptySlot);
    for (int32_t q = 0; q < num_ranks_; ++q) {
      std::vector<int32_t> experts = items_[q];
      std::sort(experts.begin(), experts.end());
      std::copy(experts.begin(), experts.end(),
                table.begin() + static_cast<int64_t>(q) * slots_per_rank_);
    }
    return table;
  }

 private:
  void add(int32_t rank, int32_t expert) {
    items_[rank].push_back(expert);
    holds_[static_cast<size_t>(rank) * num_experts_ + expert] = true;
    load_[rank] += weight_[expert];
  }
  void remove(int32_t rank, int32_t expert) {
    auto& v = items_[rank];
    v.erase(std::find(v.begin(), v.end(), expert));
    holds_[static_cast<size_t>(rank) * num_experts_ + expert] = false;
    load_[rank] -= weight_[expert];
  }

  // Every rank with a free slot already holds `expert`. Pick such a rank q, a full rank p without
  // `expert`, and a replica f on p that q lacks; move f to q, freeing p's slot for `expert`.
  // Such (q, p, f) exists: `expert` has at most num_ranks replicas and is not fully placed, so some
  // rank p lacks it, and p is full (else it had been eligible). If q held all of p's
  // slots_per_rank experts it would hold slots_per_rank + 1 (with `expert`), more than fit.
  int32_t make_room(int32_t expert) {
    double best_score = 0.0;
    int32_t best_q = -1, best_p = -1, best_f = -1;
    for (int32_t q = 0; q < num_ranks_; ++q) {
      if (!has_room(q)) continue;
      for (int32_t p = 0; p < num_ranks_; ++p) {
        if (p == q || has_room(p) || holds(p, expert)) continue;
        for (int32_t f : items_[p]) {
          if (holds(q, f)) continue;
          const double score =
              std::max(load_[p] - weight_[f] + weight_[expert], load_[q] + weight_[f]);
          if (best_q < 0 || score < best_score) {
            best_score = score, best_q = q, best_p = p, best_f = f;
          }
        }
      }
    }
    DI_CHECK(best_q >= 0, "no rank can take a replica of expert {} (placement invariant broken)",
             expert);
    remove(best_p, best_f);
    add(best_q, best_f);
    return best_p;
  }

  int32_t num_ranks_;
  int32_t slots_per_rank_;
  std::vector<double> weight_;               // [num_experts] load per replica
  std::vector<double> load_;                 // [num_ranks]
  std::vector<std::vector<int32_t>> items_;  // [num_ranks] experts held
  std::vector<bool> holds_;                  // [num_ranks][num_experts]
  int32_t num_experts_;
};

}  // namespace

std::vector<int32_t> plan_replica_counts(std::span<const int64_t> expert_load, int32_t num_slots,
                                         int32_t max_replicas) {
  const int32_t num_experts = static_cast<int32_t>(expert_load.size());
  DI_CHECK(num_experts > 0 && max_replicas > 0, "{} experts, at most {} replicas", num_experts,
           max_replicas);
  DI_CHECK(num_slots >= num_experts, "{} slots cannot hold {} experts once each", num_slots,
           num_experts);
  for (int32_t e = 0; e < num_experts; ++e) {
    DI_CHECK(expert_load[e] >= 0, "expert {} has negative load {}", e, expert_load[e]);
  }
  std::vector<int32_t> replicas(num_experts, 1);
  // Max-heap on load per replica; ties go to the lower expert id.
  auto lighter = [&](int32_t a, int32_t b) {
    if (heavier_per_replica(expert_load[b], replicas[b], expert_load[a], replicas[a])) return true;
    if (heavier_per_replica(expert_load[a], replicas[a], expert_load[b], replicas[b])) return false;
    return a > b;
  };
  std::priority_queue<int32_t, std::vector<int32_t>, decltype(lighter)> heap(lighter);
  for (int32_t e = 0; e < num_experts; ++e) {
    if (replicas[e] < max_replicas) heap.push(e);
  }
  for (int32_t spare = num_slots - num_experts; spare > 0 && !heap.empty(); --spare) {
    const int32_t e = heap.top();
    heap.pop();
    ++replicas[e];
    if (replicas[e] < max_replicas) heap.push(e);
  }
  return replicas;
}

ExpertPlacement plan_placement(std::span<const int64_t> expert_load,
                               const PlannerOptions& options) {
  const int32_t num_experts = static_cast<int32_t>(expert_load.size());
  const int32_t num_ranks = options.num_ranks;
  const int32_t slots_per_rank = options.slots_per_rank;
  DI_CHECK(num_ranks > 0 && slots_per_rank > 0, "planner needs ranks and slots, got {} x {}",
           num_ranks, slots_per_rank);
  DI_CHECK(static_cast<int64_t>(num_ranks) * slots_per_rank >= num_experts,
           "{} ranks x {} slots cannot hold {} experts", num_ranks, slots_per_rank, num_experts);
  return pack_replicas(expert_load,
                       plan_replica_counts(expert_load, num_ranks * slots_per_rank, num_ranks),
                       options);
}

ExpertPlacement pack_replicas(std::span<const int64_t> expert_load,
                              std::span<const int32_t> replicas, const PlannerOptions& options) {
  const int32_t num_experts = static_cast<int32_t>(expert_load.size());
  const int32_t num_ranks = options.num_ranks;
  const int32_t slots_per_rank = options.slots_per_rank;
  DI_CHECK(replicas.size() == expert_load.size(), "{} replica counts for {} experts",
           replicas.size(), expert_load.size());
  int64_t total = 0;
  for (int32_t e = 0; e < num_experts; ++e) {
    DI_CHECK(replicas[e] >= 1 && replicas[e] <= num_ranks,
             "expert {} has {} replicas, allowed 1..{}", e, replicas[e], num_ranks);
    DI_CHECK(expert_load[e] >= 0, "expert {} has negative load {}", e, expert_load[e]);
    total += replicas[e];
  }
  DI_CHECK(total <= static_cast<int64_t>(num_ranks) * slots_per_rank,
           "{} replicas do not fit {} ranks x {} slots", total, num_ranks, slots_per_rank);

  std::vector<double> weight(num_experts);
  std::vector<int32_t> order;  // one entry per replica
  for (int32_t e = 0; e < num_experts; ++e) {
    weight[e] = static_cast<double>(expert_load[e]) / replicas[e];
    order.insert(order.end(), replicas[e], e);
  }
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (a == b) return false;
    if (heavier_per_replica(expert_load[a], replicas[a], expert_load[b], replicas[b])) return true;
    if (heavier_per_replica(expert_load[b], replicas[b], expert_load[a], replicas[a])) return false;
    return a < b;
  });

  Packing packing(num_experts, num_ranks, slots_per_rank, std::move(weight));
  for (int32_t e : order) packing.place(e);
  packing.refine(options.max_refine_steps);
  return ExpertPlacement(num_experts, num_ranks, slots_per_rank, packing.slot_table());
}

std::vector<ExpertPlacement> plan_placements(const std::vector<std::vector<int64_t>>& loads,
                                             const PlannerOptions& options) {
  std::vector<ExpertPlacement> out;
  out.reserve(loads.size());
  for (const auto& layer : loads) out.push_back(plan_placement(layer, options));
  return out;
}

}  // namespace di::parallel
