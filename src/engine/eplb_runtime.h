#pragma once
// EplbRuntime: expert-parallel load balancing (EPLB, issue #8) inside the engine that serves
// requests, on one device. docs/expert_parallelism.md "EPLB in the engine" has the diagram.
//
//   attach:   every routed MoE block gets num_slots = ep_ranks * (ceil(E / ep_ranks) + R) physical
//             weight slots (the logical weights are copied in per the initial placement and then
//             released), a logical -> physical replica table and two device i32 [E] count buffers
//             (prefill steps, decode steps).
//   per step: begin_step(phase) points the blocks at that phase's count buffer; the forward counts
//             the logical routing on the device and maps (token t, expert e) to replica t % n_e;
//             end_step() closes the step of that phase. At the phase's bucket boundaries the counts
//             are read back (never per step on the GPU's default bucket of 10 decode steps) into
//             the phase's ExpertLoadWindow; every period the planner re-places the experts from
//             that window and the new placement is applied before the next step: moved weights are
//             gathered into a staging buffer, scattered into their new slots, the table is
//             overwritten in place (device pointers never change, so CUDA graphs stay valid).
//
// Replicas hold bit-identical weights, so the model's output does not depend on the placement (up
// to the summation order of moe_experts over experts). Only the engine thread calls it.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/eplb_options.h"
#include "model/layers.h"
#include "model/model.h"
#include "parallel/eplb_controller.h"

namespace di {

enum class EplbPhase : uint8_t { kPrefill = 0, kDecode = 1 };

struct EplbStats {
  uint64_t rebalances = 0;     // placements applied
  uint64_t experts_moved = 0;  // weight-slot copies over all rebalances
  double moe_lb_before = 1.0;  // last rebalance: mean over MoE layers, on the planning window
  double moe_lb_after = 1.0;
  double moe_lb = 1.0;  // current placement on the latest window (mean over layers)
};

class EplbRuntime {
 public:
  // Attaches to every MoE block of `model` (which must have some). Allocates the physical slots and
  // releases the logical expert weights.
  EplbRuntime(Model& model, Backend& backend, const EplbOptions& options);
  ~EplbRuntime();
  EplbRuntime(const EplbRuntime&) = delete;
  EplbRuntime& operator=(const EplbRuntime&) = delete;

  int32_t num_layers() const { return static_cast<int32_t>(layers_.size()); }
  int32_t num_experts() const { return num_experts_; }
  int32_t num_slots() const { return num_slots_; }
  const EplbOptions& options() const { return options_; }

  // Before the step's forward: routing is counted into `phase`'s statistics.
  void begin_step(EplbPhase phase);
  // After the step's forward: closes the step; may rebalance (between steps, on this thread).
  // Returns true when a new placement was applied.
  bool end_step();

  // Plans from `phase`'s window now and applies the result (tests, operators). min_gain applies.
  bool rebalance_now(EplbPhase phase);

  const EplbStats& stats() const { return stats_; }
  const std::vector<parallel::ExpertPlacement>& placements() const;
  const parallel::EplbController& controller(EplbPhase phase) const {
    return *controllers_[static_cast<size_t>(phase)];
  }
  // Per-layer logical counts recorded so far (all completed buckets since the start, not only
  // the window): [num_layers][num_experts]. Pending (not yet read back) counts are flushed first.
  std::vector<std::vector<int64_t>> total_counts(EplbPhase phase);
  // The physical weights of one MoE layer (tests).
  const ExpertWeights& physical(int32_t layer) const { return layers_[layer].state.physical; }
  // Debug/test (CPU backend): append every routed logical id of every layer to traces[layer].
  void set_trace(std::vector<std::vector<int32_t>>* traces);

  // Every placement passes its own invariants; the device tables equal the host placement; every
  // logical expert has >= 1 replica and every used slot maps back to its expert; all replicas of
  // an expert hold identical weight bytes (with compare_weights: downloads every slot, tests only).
  void check_integrity(bool compare_weights = true);

 private:
  struct Layer {
    MoeBlock* block = nullptr;
    MoeEplbState state;
    Tensor counts[2];  // [E] i32 per phase
  };

  void read_back(EplbPhase phase);
  void apply(const parallel::Rebalance& plan, EplbPhase phase);
  void upload_tables(int32_t layer, const parallel::ExpertPlacement& placement);
  double current_moe_lb(EplbPhase phase) const;

  Backend& backend_;
  EplbOptions options_;
  std::vector<Layer> layers_;
  int32_t num_experts_ = 0;
  int32_t slots_per_rank_ = 0;
  int32_t num_slots_ = 0;
  std::unique_ptr<parallel::EplbController> controllers_[2];
  std::vector<std::vector<int64_t>> totals_[2];
  int32_t steps_since_read_[2] = {0, 0};
  Tensor zero_counts_;  // [E] i32 zeros, copied over a phase's counts after each read-back
  EplbPhase phase_ = EplbPhase::kDecode;
  bool in_step_ = false;
  EplbStats stats_;
};

}  // namespace di
