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
//
// In a DP group (engine/dp_engine_group.h, `group` set): one runtime per rank, ep_ranks = the
// group's size, every rank's device holds all N·S slots and computes only its own [r·S, (r+1)·S)
// (the EP hook owns physical slots). Each rank counts its own tokens; at each bucket boundary the
// bucket is summed over the group (GroupLoadSum) before it enters the window, so every rank plans
// from the same loads at the same step and applies the same placement locally. The caller keeps
// the EPLB steps of all ranks in lockstep: the same steps (padding steps included), the same
// phase per step, and a begun step is always ended (end_step, or end_failed_step after a throw).
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

class GroupLoadSum;  // engine/group_load_sum.h

// One applied placement: at the end of step `step` of `phase`'s controller. Every rank of a DP
// group has the same list (group check_integrity compares them).
struct EplbRebalanceRecord {
  EplbPhase phase = EplbPhase::kDecode;
  int64_t step = 0;
  uint64_t placement_digest = 0;  // placement_digest() right after the flip

  bool operator==(const EplbRebalanceRecord&) const = default;
};

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
  // releases the logical expert weights. `group` (not owned): rank `rank_idx` of a DP group whose
  // window loads are summed over the group; null for one engine.
  EplbRuntime(Model& model, Backend& backend, const EplbOptions& options,
              GroupLoadSum* group = nullptr, int32_t rank_idx = 0);
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
  // The step's forward (or its end_step before the bucket was read back) threw on this rank: closes
  // it like end_step if it is still open (its partial counts included), so that this rank's EPLB
  // steps stay in lockstep with the rest of its group. No-op when the step was closed.
  bool end_failed_step();
  bool in_step() const { return in_step_; }
  // Steps closed so far, both phases (equal on every rank of a DP group: engine_loop.cpp checks).
  int64_t num_steps() const { return controllers_[0]->step() + controllers_[1]->step(); }

  // Plans from `phase`'s window now and applies the result (tests, operators). min_gain applies.
  // One engine only (in a group it would re-place one rank).
  bool rebalance_now(EplbPhase phase);

  const EplbStats& stats() const { return stats_; }
  const std::vector<parallel::ExpertPlacement>& placements() const;
  const parallel::EplbController& controller(EplbPhase phase) const {
    return *controllers_[static_cast<size_t>(phase)];
  }
  // Per-layer logical counts of THIS rank's tokens recorded so far (since the start, not only the
  // window): [num_layers][num_experts]. Device counts not yet read back are flushed first (they
  // enter the window at the next bucket boundary). In a group the window holds the group's sum.
  std::vector<std::vector<int64_t>> total_counts(EplbPhase phase);
  // Every placement applied, in order.
  const std::vector<EplbRebalanceRecord>& history() const { return history_; }
  // FNV-1a over every layer's slot -> expert table of the current placement.
  uint64_t placement_digest() const;
  // The physical weights of one MoE layer (tests).
  const ExpertWeights& physical(int32_t layer) const { return layers_[layer].state.physical; }
  // Debug/test (CPU backend): append every routed logical id of every layer to traces[layer].
  void set_trace(std::vector<std::vector<int32_t>>* traces);

  // Every placement passes its own invariants; the device tables equal the host placement; every
  // logical expert has >= 1 replica and every used slot maps back to its expert; all replicas of
  // an expert hold identical weight bytes (with compare_weights: downloads every slot, tests only);
  // the current placement is the last one in history().
  void check_integrity(bool compare_weights = true);

 private:
  struct Layer {
    MoeBlock* block = nullptr;
    MoeEplbState state;
    Tensor counts[2];  // [E] i32 per phase
  };

  // Device counts of `phase` -> totals_ and pending_ (this rank's); zeroes the device counts.
  void flush_counts(EplbPhase phase);
  // Bucket boundary: pending_ (summed over the group) -> the phase's window.
  void close_bucket(EplbPhase phase);
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
  std::vector<int64_t> pending_[2];  // [num_layers * num_experts] counts of the open bucket
  GroupLoadSum* group_ = nullptr;
  int32_t rank_idx_ = 0;
  std::vector<EplbRebalanceRecord> history_;
  Tensor zero_counts_;  // [E] i32 zeros, copied over a phase's counts after each read-back
  EplbPhase phase_ = EplbPhase::kDecode;
  bool in_step_ = false;
  EplbStats stats_;
};

}  // namespace di
