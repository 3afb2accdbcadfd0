#include "engine/group_step_barrier.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/logging.h"

namespace di {

GroupStepBarrier::GroupStepBarrier(int32_t num_ranks, std::function<void(int32_t)> wake_rank,
                                   DpExpertTransport* transport, GroupLoadSum* loads)
    : num_ranks_(num_ranks),
      wake_rank_(std::move(wake_rank)),
      transport_(transport),
      loads_(loads) {
  DI_CHECK(num_ranks >= 1, "GroupStepBarrier: {} ranks", num_ranks);
}

GroupDecision GroupStepBarrier::arrive(int32_t rank_idx, bool has_work, bool stopping) {
  DI_CHECK(rank_idx >= 0 && rank_idx < num_ranks_, "GroupStepBarrier: rank {} of {}", rank_idx,
           num_ranks_);
  std::unique_lock lock(mu_);
  if (abandoned_) return GroupDecision{.step = false, .stop = true};
  if (arrived_ == 0 && num_ranks_ > 1 && !decision_.step) {
    // First of a round after an idle one: the others may be asleep on their inboxes (after a
    // step round every rank comes back without waiting). wake() takes only their inbox locks,
    // never this one, so calling it here cannot deadlock.
    for (int32_t r = 0; r < num_ranks_; ++r) {
      if (r != rank_idx) wake_rank_(r);
    }
  }
  any_work_ = any_work_ || has_work;
  any_stop_ = any_stop_ || stopping;
  const uint64_t gen = generation_;
  if (++arrived_ < num_ranks_) {
    cv_.wait(lock, [&] { return generation_ != gen || abandoned_; });
    if (generation_ == gen) return GroupDecision{.step = false, .stop = true};
    return decision_;  // not overwritten before this rank arrives at the next round
  }
  decision_.stop = any_stop_ || stop_requested_;
  decision_.step = any_work_ && !decision_.stop;
  if (failed_ && transport_ != nullptr) transport_->reset();
  if (failed_ && loads_ != nullptr) loads_->reset();
  failed_ = false;
  agree_failed_ = false;  // every rank is here: none is inside agree_decode
  arrived_ = 0;
  any_work_ = any_stop_ = false;
  if (decision_.step) ++step_rounds_;
  ++generation_;
  cv_.notify_all();
  return decision_;
}

DecodeShape GroupStepBarrier::agree_decode(int32_t rank_idx, DecodeShape mine) {
  DI_CHECK(rank_idx >= 0 && rank_idx < num_ranks_, "GroupStepBarrier: rank {} of {}", rank_idx,
           num_ranks_);
  std::unique_lock lock(mu_);
  const DecodeShape failed{.failed = true};
  if (abandoned_ || agree_failed_) return failed;
  if (agree_arrived_ == 0) {
    agree_acc_ = mine;
  } else {
    agree_acc_.rows =
        agree_acc_.rows < 0 || mine.rows < 0 ? -1 : std::max(agree_acc_.rows, mine.rows);
    agree_acc_.max_blocks = std::max(agree_acc_.max_blocks, mine.max_blocks);
    agree_acc_.prefill = agree_acc_.prefill || mine.prefill;
    if (agree_acc_.eplb_steps != mine.eplb_steps) {
      agree_acc_.eplb_steps = DecodeShape::kEplbStepsDiffer;
    }
  }
  const uint64_t gen = agree_generation_;
  if (++agree_arrived_ < num_ranks_) {
    cv_.wait(lock, [&] { return agree_generation_ != gen || abandoned_ || agree_failed_; });
    if (agree_generation_ == gen) return failed;
    return agreed_;  // not overwritten before this rank arrives at the next agreement
  }
  agreed_ = agree_acc_;
  agreed_.failed = false;
  if (agreed_.rows < 0) {
    agreed_ = DecodeShape{.prefill = agreed_.prefill, .eplb_steps = agreed_.eplb_steps};
  }
  agree_arrived_ = 0;
  ++agree_generation_;
  cv_.notify_all();
  return agreed_;
}

void GroupStepBarrier::step_failed(int32_t rank_idx, const std::string& what) {
  {
    std::lock_guard lock(mu_);
    failed_ = true;
    // Ranks waiting in agree_decode for this one are released with rows -1 (their step then
    // fails in the aborted exchange); later arrivals of this round get -1 at once.
    agree_failed_ = true;
    agree_arrived_ = 0;
  }
  cv_.notify_all();
  if (transport_ != nullptr) {
    transport_->abort(fmt::format("rank {} failed its step: {}", rank_idx, what));
  }
}

void GroupStepBarrier::request_stop() {
  {
    std::lock_guard lock(mu_);
    stop_requested_ = true;
  }
  for (int32_t r = 0; r < num_ranks_; ++r) wake_rank_(r);
}

void GroupStepBarrier::abandon() {
  {
    std::lock_guard lock(mu_);
    abandoned_ = true;
    stop_requested_ = true;
  }
  cv_.notify_all();
}

uint64_t GroupStepBarrier::rounds() const {
  std::lock_guard lock(mu_);
  return generation_;
}

uint64_t GroupStepBarrier::step_rounds() const {
  std::lock_guard lock(mu_);
  return step_rounds_;
}

}  // namespace di
