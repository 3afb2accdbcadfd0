#include "engine/group_load_sum.h"

#include <algorithm>

#include "core/error.h"

namespace di {

GroupLoadSum::GroupLoadSum(int32_t num_ranks)
    : num_ranks_(num_ranks), deposits_(static_cast<size_t>(std::max(num_ranks, 0))) {
  DI_CHECK(num_ranks >= 1, "GroupLoadSum: {} ranks", num_ranks);
}

void GroupLoadSum::all_reduce(int32_t rank_idx, std::span<int64_t> values) {
  DI_CHECK(rank_idx >= 0 && rank_idx < num_ranks_, "GroupLoadSum: rank {} of {}", rank_idx,
           num_ranks_);
  std::unique_lock lock(mu_);
  DI_CHECK(!aborted_, "EPLB load all-reduce aborted: {}", abort_reason_);
  deposits_[static_cast<size_t>(rank_idx)].assign(values.begin(), values.end());
  const uint64_t gen = generation_;
  if (++arrived_ < num_ranks_) {
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    DI_CHECK(generation_ != gen, "EPLB load all-reduce aborted: {}", abort_reason_);
  } else {
    for (const std::vector<int64_t>& d : deposits_) {
      if (d.size() != values.size()) {
        aborted_ = true;
        abort_reason_ = "the ranks deposited loads of different sizes";
        arrived_ = 0;  // the round is over: every rank of it throws
        cv_.notify_all();
        DI_FAIL("EPLB load all-reduce: rank {} brought {} values, another {}", rank_idx,
                values.size(), d.size());
      }
    }
    sum_.assign(values.size(), 0);
    for (const std::vector<int64_t>& d : deposits_) {  // rank order
      for (size_t i = 0; i < d.size(); ++i) sum_[i] += d[i];
    }
    arrived_ = 0;
    ++generation_;
    ++rounds_;
    cv_.notify_all();
  }
  // sum_ stays until the next round completes, which needs this rank's next deposit.
  DI_CHECK(sum_.size() == values.size(), "GroupLoadSum: sum of {} values for {}", sum_.size(),
           values.size());
  std::copy(sum_.begin(), sum_.end(), values.begin());
}

void GroupLoadSum::abort(const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    if (aborted_) return;
    aborted_ = true;
    abort_reason_ = reason;
  }
  cv_.notify_all();
}

void GroupLoadSum::reset() {
  std::lock_guard lock(mu_);
  aborted_ = false;
  abort_reason_.clear();
  arrived_ = 0;  // ranks that arrived before the abort have left with an exception
  ++generation_;
}

void GroupLoadSum::check_integrity() const {
  std::lock_guard lock(mu_);
  DI_CHECK(arrived_ >= 0 && arrived_ < num_ranks_, "GroupLoadSum: {} ranks waiting of {}", arrived_,
           num_ranks_);
  DI_CHECK(deposits_.size() == static_cast<size_t>(num_ranks_),
           "GroupLoadSum: {} deposit slots for {} ranks", deposits_.size(), num_ranks_);
  DI_CHECK(aborted_ == !abort_reason_.empty(), "GroupLoadSum: aborted {} with reason '{}'",
           aborted_, abort_reason_);
  DI_CHECK(rounds_ <= generation_, "GroupLoadSum: {} rounds in {} generations", rounds_,
           generation_);
}

uint64_t GroupLoadSum::rounds() const {
  std::lock_guard lock(mu_);
  return rounds_;
}

}  // namespace di
