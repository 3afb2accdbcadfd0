#include "parallel/eplb_sim.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "parallel/eplb_planner.h"
#include "parallel/expert_placement.h"
#include "parallel/synthetic_routing.h"

namespace di::parallel {

std::vector<EplbSimLayer> simulate_eplb(const EplbSimOptions& o) {
  DI_CHECK(o.num_layers > 0 && o.num_tokens > 0, "{} layers, {} tokens", o.num_layers,
           o.num_tokens);
  DI_CHECK(o.redundant_per_rank >= 0, "redundant_per_rank {}", o.redundant_per_rank);
  const ExpertPlacement static_ep = ExpertPlacement::round_robin(o.num_experts, o.num_ranks);
  const PlannerOptions planner{o.num_ranks, static_ep.slots_per_rank() + o.redundant_per_rank};
  std::vector<EplbSimLayer> out;
  for (int32_t l = 0; l < o.num_layers; ++l) {
    const uint64_t layer_seed = o.seed * 1000003ull + static_cast<uint64_t>(l) * 3ull;
    const ZipfRouting routing(o.num_experts, o.top_k, o.zipf_s, layer_seed);
    const std::vector<int32_t> window = routing.route(o.num_tokens, layer_seed + 1);
    const std::vector<int32_t> eval = routing.route(o.num_tokens, layer_seed + 2);
    const std::vector<int64_t> window_load = count_expert_load(window, o.num_experts);

    EplbSimLayer r;
    const std::vector<int64_t> eval_load = count_expert_load(eval, o.num_experts);
    r.hottest_share = static_cast<double>(*std::max_element(eval_load.begin(), eval_load.end())) /
                      static_cast<double>(eval.size());
    r.moe_lb_before = moe_lb(dispatched_rank_loads(static_ep, eval, o.top_k));

    const auto t0 = std::chrono::steady_clock::now();
    const ExpertPlacement planned = plan_placement(window_load, planner);
    r.plan_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    r.moe_lb_window = moe_lb(expected_rank_loads(planned, window_load));
    r.moe_lb_after = moe_lb(dispatched_rank_loads(planned, eval, o.top_k));
    for (int32_t e = 0; e < o.num_experts; ++e) {
      r.max_replicas = std::max(r.max_replicas, planned.num_replicas(e));
    }
    out.push_back(r);
  }
  return out;
}

}  // namespace di::parallel
