#include "parallel/expert_load.h"

#include <algorithm>

#include "core/error.h"

namespace di::parallel {

ExpertLoadWindow::ExpertLoadWindow(int32_t num_layers, int32_t num_experts, int32_t window_steps,
                                   int32_t steps_per_bucket)
    : num_layers_(num_layers), num_experts_(num_experts), steps_per_bucket_(steps_per_bucket) {
  DI_CHECK(num_layers > 0 && num_experts > 0, "load window for {} layers x {} experts", num_layers,
           num_experts);
  DI_CHECK(steps_per_bucket > 0 && window_steps > 0 && window_steps % steps_per_bucket == 0,
           "window of {} steps is not a positive multiple of the {}-step bucket", window_steps,
           steps_per_bucket);
  num_buckets_ = window_steps / steps_per_bucket;
  const size_t per_bucket = static_cast<size_t>(num_layers) * num_experts;
  ring_.assign(per_bucket * num_buckets_, 0);
  pending_.assign(per_bucket, 0);
  sum_.assign(per_bucket, 0);
}

void ExpertLoadWindow::record(int32_t layer_idx, std::span<const int32_t> topk_ids) {
  DI_CHECK(layer_idx >= 0 && layer_idx < num_layers_, "layer {} outside [0, {})", layer_idx,
           num_layers_);
  for (int32_t e : topk_ids) {
    DI_CHECK(e < num_experts_, "layer {} routes to expert {} of {}", layer_idx, e, num_experts_);
  }
  int64_t* counts = pending_.data() + static_cast<size_t>(layer_idx) * num_experts_;
  for (int32_t e : topk_ids) {
    if (e >= 0) ++counts[e];
  }
}

void ExpertLoadWindow::add(int32_t layer_idx, std::span<const int64_t> counts) {
  DI_CHECK(layer_idx >= 0 && layer_idx < num_layers_, "layer {} outside [0, {})", layer_idx,
           num_layers_);
  DI_CHECK(static_cast<int32_t>(counts.size()) == num_experts_, "{} counts for {} experts",
           counts.size(), num_experts_);
  for (int32_t e = 0; e < num_experts_; ++e) {
    DI_CHECK(counts[e] >= 0, "layer {} expert {} count {} is negative", layer_idx, e, counts[e]);
  }
  int64_t* dst = pending_.data() + static_cast<size_t>(layer_idx) * num_experts_;
  for (int32_t e = 0; e < num_experts_; ++e) dst[e] += counts[e];
}

void ExpertLoadWindow::end_step() {
  ++steps_;
  if (++steps_in_pending_ < steps_per_bucket_) return;
  int64_t* oldest = ring_.data() + offset(next_bucket_);
  for (size_t i = 0; i < pending_.size(); ++i) {
    sum_[i] += pending_[i] - oldest[i];
    oldest[i] = pending_[i];
  }
  std::fill(pending_.begin(), pending_.end(), 0);
  steps_in_pending_ = 0;
  next_bucket_ = (next_bucket_ + 1) % num_buckets_;
  filled_buckets_ = std::min(filled_buckets_ + 1, num_buckets_);
}

std::span<const int64_t> ExpertLoadWindow::loads(int32_t layer_idx) const {
  DI_CHECK(layer_idx >= 0 && layer_idx < num_layers_, "layer {} outside [0, {})", layer_idx,
           num_layers_);
  return std::span<const int64_t>(sum_).subspan(static_cast<size_t>(layer_idx) * num_experts_,
                                                num_experts_);
}

std::vector<std::vector<int64_t>> ExpertLoadWindow::all_loads() const {
  std::vector<std::vector<int64_t>> out;
  out.reserve(num_layers_);
  for (int32_t l = 0; l < num_layers_; ++l) {
    const auto layer = loads(l);
    out.emplace_back(layer.begin(), layer.end());
  }
  return out;
}

void ExpertLoadWindow::reset() {
  std::fill(ring_.begin(), ring_.end(), 0);
  std::fill(pending_.begin(), pending_.end(), 0);
  std::fill(sum_.begin(), sum_.end(), 0);
  next_bucket_ = 0;
  filled_buckets_ = 0;
  steps_in_pending_ = 0;
  steps_ = 0;
}

void ExpertLoadWindow::check_integrity() const {
  DI_CHECK(filled_buckets_ >= 0 && filled_buckets_ <= num_buckets_, "filled buckets {} of {}",
           filled_buckets_, num_buckets_);
  DI_CHECK(steps_in_pending_ >= 0 && steps_in_pending_ < steps_per_bucket_,
           "pending bucket holds {} steps of {}", steps_in_pending_, steps_per_bucket_);
  // Buckets never filled are zero, so summing the whole ring is the sum of the completed ones.
  for (size_t i = 0; i < sum_.size(); ++i) {
    int64_t total = 0;
    for (int32_t b = 0; b < num_buckets_; ++b) {
      const int64_t c = ring_[offset(b) + i];
      DI_CHECK(c >= 0, "bucket {} entry {} is negative: {}", b, i, c);
      total += c;
    }
    DI_CHECK(total == sum_[i], "running sum of entry {} is {}, buckets add up to {}", i, sum_[i],
             total);
    DI_CHECK(pending_[i] >= 0, "pending entry {} is negative", i);
  }
  if (filled_buckets_ < num_buckets_) {
    for (int32_t b = filled_buckets_; b < num_buckets_; ++b) {
      for (size_t i = 0; i < sum_.size(); ++i) {
        DI_CHECK(ring_[offset(b) + i] == 0, "unfilled bucket {} holds counts", b);
      }
    }
  }
}

}  // namespace di::parallel
