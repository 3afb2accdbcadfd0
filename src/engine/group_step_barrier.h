#pragma once
// GroupStepBarrier: the StepSync (step_sync.h) of a DP engine group. One round per group step:
//
//   rank 0 ──arrive(work?, stop?)──┐
//   rank 1 ──arrive(work?, stop?)──┼─► last arrival decides for all: step = any work, stop = any
//   rank N-1 ─arrive(...)──────────┘   stop or request_stop(); after a failed step, transport
//                                       reset() (every rank is here, none inside an exchange)
//   then, inside the step, agree_decode(rows, blocks, prefill): a second round that gives every
//   rank the same decode shape (max rows, max blocks; rows -1 unless every rank runs a plain
//   decode or padding step), so all ranks pick the same exchange and the same step-graph key,
//   and the same EPLB phase (prefill if any rank has a prompt token)
//
// The first arrival of a round that follows an idle round wakes every rank (EngineLoop::wake), so
// ranks idling on their inboxes come to the barrier: a rank that gets a request starts a round and
// the others join it with padding steps. Nobody spins: idle ranks sleep on their inbox, arrived
// ranks on the barrier's condition variable.
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "engine/dp_expert_transport.h"
#include "engine/group_load_sum.h"
#include "engine/step_sync.h"

namespace di {

class GroupStepBarrier final : public StepSync {
 public:
  // wake_rank(r) wakes rank r's engine thread; transport and loads (EPLB's load all-reduce, may
  // be null): reset after a failed step, at the next round (every rank is between steps).
  GroupStepBarrier(int32_t num_ranks, std::function<void(int32_t)> wake_rank,
                   DpExpertTransport* transport, GroupLoadSum* loads = nullptr);

  GroupDecision arrive(int32_t rank_idx, bool has_work, bool stopping) override;
  DecodeShape agree_decode(int32_t rank_idx, DecodeShape mine) override;
  void step_failed(int32_t rank_idx, const std::string& what) override;

  // The next round decides stop; wakes every rank so that the round happens.
  void request_stop();
  // The group could not be built (some ranks never started): every arrive() returns stop at
  // once instead of waiting for ranks that do not exist.
  void abandon();
  uint64_t rounds() const;       // completed rounds
  uint64_t step_rounds() const;  // rounds that decided to step

 private:
  const int32_t num_ranks_;
  const std::function<void(int32_t)> wake_rank_;
  DpExpertTransport* const transport_;
  GroupLoadSum* const loads_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int32_t arrived_ = 0;
  bool any_work_ = false;
  bool any_stop_ = false;
  bool stop_requested_ = false;
  bool abandoned_ = false;
  bool failed_ = false;  // a step failed since the last round: reset the transport
  uint64_t generation_ = 0;
  uint64_t step_rounds_ = 0;
  GroupDecision decision_;
  // agree_decode: its own round inside a step round.
  int32_t agree_arrived_ = 0;
  uint64_t agree_generation_ = 0;
  DecodeShape agree_acc_;
  DecodeShape agreed_;
  bool agree_failed_ = false;  // a step failed: agree_decode answers rows -1 until the next round
};

}  // namespace di
