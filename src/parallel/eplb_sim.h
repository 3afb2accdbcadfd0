#pragma once
// EPLB on a synthetic skewed routing trace (synthetic_routing.h): moe_lb of static round-robin EP
// vs the EPLB plan, per layer, as `deepinfer eplb-sim` prints and the tests assert.
//
// Per layer: popularity is Zipf(s) over a layer-specific permutation of the experts. The planner
// sees the loads of one trace (the window) and is judged on a second, independent trace of the same
// distribution (the next period), dispatched exactly as the GPUs would (tokens split evenly over
// the ranks, plan_dispatch's replica choice), so sampling noise and replica rounding are included.
#include <cstdint>
#include <vector>

namespace di::parallel {

struct EplbSimOptions {
  int32_t num_experts = 256;
  int32_t num_ranks = 8;
  int32_t redundant_per_rank = 1;
  int32_t top_k = 8;
  int32_t num_tokens = 8192;  // tokens per trace (per layer), over all ranks
  int32_t num_layers = 4;
  double zipf_s = 1.2;
  uint64_t seed = 0;
};

struct EplbSimLayer {
  double hottest_share = 0.0;  // fraction of all entries routed to the hottest expert
  double moe_lb_before = 0.0;  // round-robin placement, no replicas, on the evaluation trace
  double moe_lb_window = 0.0;  // EPLB plan on the trace it was planned from (expected split)
  double moe_lb_after = 0.0;   // EPLB plan on the evaluation trace, dispatched
  int32_t max_replicas = 0;    // most replicas of one expert
  double plan_ms = 0.0;        // plan_placement wall time
};

std::vector<EplbSimLayer> simulate_eplb(const EplbSimOptions& options);

}  // namespace di::parallel
