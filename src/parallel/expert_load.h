#pragma once
// ExpertLoadWindow: tokens routed to each logical expert of each MoE layer over the last
// window_steps engine steps: the input of the EPLB planner.
//
// Counts are kept per bucket of steps_per_bucket steps in a ring of window_steps / steps_per_bucket
// buckets, plus a running sum over the ring, so memory grows with the number of buckets, not of
// steps: decode's 1000-step window in 10-step buckets is 100 x layers x experts x 8 B (58 MoE
// layers x 256 experts: 11.9 MB). loads() covers exactly the last num_buckets *completed* buckets;
// the bucket being filled counts only once complete, so a rebalance at a bucket boundary sees
// exactly the last window_steps steps.
//
// One window per rank records that rank's routing; the EP group all-reduces loads() before
// planning so every rank plans from the same numbers (the planner is deterministic).
#include <cstdint>
#include <span>
#include <vector>

namespace di::parallel {

class ExpertLoadWindow {
 public:
  ExpertLoadWindow(int32_t num_layers, int32_t num_experts, int32_t window_steps,
                   int32_t steps_per_bucket = 1);

  int32_t num_layers() const { return num_layers_; }
  int32_t num_experts() const { return num_experts_; }
  int32_t window_steps() const { return num_buckets_ * steps_per_bucket_; }
  int32_t steps_per_bucket() const { return steps_per_bucket_; }
  // Completed steps currently covered by loads(): min(steps so far rounded down to a bucket,
  // window).
  int32_t steps_in_window() const { return filled_buckets_ * steps_per_bucket_; }
  int64_t steps_recorded() const { return steps_; }

  // Adds one token per entry of topk_ids ([num_tokens, top_k] logical ids; negative ids, i.e.
  // padding, are skipped) to `layer_idx`'s counts of the current step.
  void record(int32_t layer_idx, std::span<const int32_t> topk_ids);
  // Adds per-expert counts [num_experts] to `layer_idx` (e.g. counts already reduced on the GPU).
  void add(int32_t layer_idx, std::span<const int64_t> counts);
  // Closes the current step; every steps_per_bucket steps the filled bucket enters the window and
  // the oldest leaves it.
  void end_step();

  // Sum over the window for one layer: [num_experts].
  std::span<const int64_t> loads(int32_t layer_idx) const;
  // All layers: [num_layers][num_experts].
  std::vector<std::vector<int64_t>> all_loads() const;

  // Forgets everything (e.g. after the model or EP size changes).
  void reset();

  // The running sum equals the sum of the completed buckets; counts are non-negative.
  void check_integrity() const;

 private:
  size_t offset(int32_t bucket_idx) const {
    return static_cast<size_t>(bucket_idx) * num_layers_ * num_experts_;
  }

  int32_t num_layers_;
  int32_t num_experts_;
  int32_t steps_per_bucket_;
  int32_t num_buckets_;
  std::vector<int64_t> ring_;     // [num_buckets][num_layers][num_experts] completed buckets
  std::vector<int64_t> pending_;  // [num_layers][num_experts] the bucket being filled
  std::vector<int64_t> sum_;      // [num_layers][num_experts] sum of the ring
  int32_t next_bucket_ = 0;       // ring index the next completed bucket overwrites
  int32_t filled_buckets_ = 0;    // completed buckets in the ring (<= num_buckets_)
  int32_t steps_in_pending_ = 0;
  int64_t steps_ = 0;
};

}  // namespace di::parallel
