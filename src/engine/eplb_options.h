#pragma once
// Engine options of EPLB (expert-parallel load balancing, issue #8): engine/eplb_runtime.h runs it.
// Pure host code, no backend: included by engine.h.
#include <cstdint>
#include <string>

#include "parallel/eplb_controller.h"

namespace di {

struct EplbOptions {
  bool enabled = false;
  // EP ranks of the planner's placement; the device holds every rank's slots. One engine: simulated
  // ranks. A DP group (engine/dp_engine_group.h) sets it to the group's size.
  // With 1 rank the planner gives no expert a second replica (a second copy on one rank adds no
  // capacity), so redundant slots only get used with ep_ranks > 1.
  int32_t ep_ranks = 1;
  // Window, period, bucket and min_gain per phase (a step with any prefill token is a prefill
  // step). The device holds one placement with max(prefill, decode).redundant_per_rank redundant
  // slots per simulated rank; whichever phase's period comes due re-plans it from its own window.
  parallel::EplbConfig prefill = parallel::EplbConfig::prefill();
  parallel::EplbConfig decode = parallel::EplbConfig::decode();
  bool log = true;  // one info line per rebalance

  // Physical weight slots per rank for a layer of `num_experts` routed experts:
  // ceil(num_experts / ep_ranks) + max(prefill, decode).redundant_per_rank.
  int32_t slots_per_rank(int32_t num_experts) const;
  void validate() const;
  std::string describe() const;
};

}  // namespace di
