#pragma once
// EplbController: when to rebalance experts, and how weights move so serving never stops.
//
// Every step the engine records each MoE layer's routing (record); every period_steps steps
// end_step() plans new placements from the load window and returns them with a migration plan.
// The engine then migrates weights in the background and commit()s the plan at a step boundary.
//
// Double-buffered swap (docs/expert_parallelism.md has the full protocol):
//   1. All ranks all-reduce their windows' loads and plan locally: the planner is deterministic, so
//      they agree without exchanging placements.
//   2. Each rank owns slots_per_rank active weight buffers per layer plus staging buffers. Weights
//   of
//      every ExpertMove are copied from src_slot's rank into a staging buffer on dst_slot's rank
//      while the old placement keeps serving (copy stream, NCCL send/recv or P2P).
//   3. When every rank has its weights (an all-reduce of a done flag between two steps), all ranks
//      flip at the same step boundary: the slot -> buffer map and the slot -> expert table switch
//      to the new placement; replaced buffers become the next staging buffers.
// Experts that stay on a rank keep their local slot (align_to), so only weights that really change
// rank move.
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "parallel/eplb_planner.h"
#include "parallel/expert_load.h"
#include "parallel/expert_placement.h"

namespace di::parallel {

struct EplbConfig {
  int32_t redundant_per_rank = 1;  // slots per rank = ceil(num_experts / num_ranks) + this
  int32_t window_steps = 1000;     // loads over this many recent steps
  int32_t period_steps = 10000;    // plan every this many steps
  int32_t steps_per_bucket = 10;   // load window granularity (window_steps % this == 0)
  // A layer is re-placed only if the plan lowers its moe_lb on the window by at least this much
  // (absolute): moving weights for a 1% gain is not worth the copy traffic.
  double min_gain = 0.02;

  // Prefill: large batches, throughput-bound; more replicas, react within 1000 steps.
  static EplbConfig prefill() { return {4, 100, 1000, 1, 0.02}; }
  // Decode: small per-step batches, latency-bound; one replica per rank, a long stable window.
  static EplbConfig decode() { return {1, 1000, 10000, 10, 0.02}; }

  void validate() const;
};

// Copy expert `expert_idx`'s weights of layer `layer_idx` from physical slot src_slot (in the
// current placement; rank src_slot / slots_per_rank) into dst_slot (in the new placement).
struct ExpertMove {
  int32_t layer_idx = 0;
  int32_t expert_idx = 0;
  int32_t src_slot = 0;
  int32_t dst_slot = 0;
};

struct MigrationPlan {
  std::vector<ExpertMove> moves;  // by layer, then dst_slot
  // Staging buffers one rank needs for one layer: the most moves into a single rank of a layer.
  int32_t max_incoming_per_rank = 0;
};

// Reorders the slots of each rank of `next` so that an expert the rank already holds in `current`
// keeps its local slot; the set of experts per rank is unchanged. Placements must match in size.
ExpertPlacement align_to(const ExpertPlacement& current, const ExpertPlacement& next);

// Weights to move to turn `current` into `next` (already aligned), per layer. Each move's source
// is the current replica of the expert with the fewest outgoing moves so far (spreads send load).
MigrationPlan plan_migration(const std::vector<ExpertPlacement>& current,
                             const std::vector<ExpertPlacement>& next);

struct Rebalance {
  int64_t step = 0;                         // planned at the end of this step
  std::vector<ExpertPlacement> placements;  // [num_layers], aligned to the current placements
  std::vector<bool> changed;                // [num_layers] layers that got a new placement
  MigrationPlan migration;
  std::vector<double> moe_lb_current;  // [num_layers] expected on the window, current placement
  std::vector<double> moe_lb_planned;  // [num_layers] expected on the window, returned placement
};

class EplbController {
 public:
  // Starts from a balanced static placement (the plan for uniform loads).
  EplbController(const EplbConfig& config, int32_t num_layers, int32_t num_experts,
                 int32_t num_ranks);
  // Starts from given placements (e.g. planned offline from a recorded trace).
  EplbController(const EplbConfig& config, std::vector<ExpertPlacement> initial);

  int32_t slots_per_rank() const { return slots_per_rank_; }
  int64_t step() const { return window_.steps_recorded(); }
  const EplbConfig& config() const { return config_; }
  const std::vector<ExpertPlacement>& placements() const { return placements_; }
  const ExpertLoadWindow& window() const { return window_; }
  bool has_pending() const { return pending_; }

  // Routing of one layer in the current step: [num_tokens, top_k] logical ids.
  void record(int32_t layer_idx, std::span<const int32_t> topk_ids) {
    window_.record(layer_idx, topk_ids);
  }
  void add_loads(int32_t layer_idx, std::span<const int64_t> counts) {
    window_.add(layer_idx, counts);
  }

  // Closes a step. At every period boundary, if no plan is pending and some layer gains at least
  // min_gain, returns a plan; the controller then waits for commit() before planning again.
  std::optional<Rebalance> end_step();

  // Plans now from the window, regardless of the period (also used by end_step). Returns nullopt
  // when the window is empty or no layer gains min_gain.
  std::optional<Rebalance> plan_now() const;

  // The engine has flipped to `plan` (step 3 above).
  void commit(const Rebalance& plan);
  // The engine gave up on a migration (e.g. a rank failed); planning resumes next period.
  void abandon();

 private:
  EplbConfig config_;
  int32_t slots_per_rank_ = 0;
  std::vector<ExpertPlacement> placements_;
  ExpertLoadWindow window_;
  bool pending_ = false;
};

}  // namespace di::parallel
