#pragma once
// GroupLoadSum: the all-reduce of EPLB's expert loads between the rank threads of one DP engine
// group (dp_engine_group.h, issue #8). Every rank counts only the routing of its own tokens; at a
// bucket boundary of the load window each rank's EplbRuntime (eplb_runtime.h) deposits its bucket
// and gets back the sum over the group, so every rank feeds the same loads to its planner, and the
// deterministic planner gives every rank the same placement at the same step.
//
//   rank r: all_reduce(r, counts [L·E]) ─► deposit ─┐  last arrival: sum in rank order
//   ...                                              ├─► every rank reads the same sum
//   rank N-1: all_reduce(...) ───────────────────────┘
//
// One generation-counted round per call; a rank calls it only between steps, from its engine
// thread, at the same bucket boundaries as every other rank (the group's EPLB steps are in
// lockstep: engine_loop.cpp). A rank that cannot come (its end of step threw before depositing)
// calls abort(): the ranks waiting (and later callers) throw until reset(), which the group's
// step barrier calls when every rank is between steps (group_step_barrier.h).
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace di {

class GroupLoadSum {
 public:
  explicit GroupLoadSum(int32_t num_ranks);

  int32_t num_ranks() const { return num_ranks_; }
  // Deposits rank r's values, blocks until every rank deposited as many values, and overwrites
  // `values` with the element-wise sum over the ranks. Throws when aborted, or when the ranks
  // disagree on the size (then every rank of the round throws).
  void all_reduce(int32_t rank_idx, std::span<int64_t> values);
  void abort(const std::string& reason);
  // Clears an abort. Only while no rank is inside all_reduce (between group steps).
  void reset();
  uint64_t rounds() const;  // completed all_reduce rounds
  // Throws unless: fewer than N ranks wait in the current round, one deposit slot per rank, and
  // an abort reason exactly while aborted. Safe to call from any thread at any time.
  void check_integrity() const;

 private:
  const int32_t num_ranks_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<int64_t>> deposits_;  // [N] this round's values per rank
  std::vector<int64_t> sum_;                    // the last round's result
  int32_t arrived_ = 0;
  uint64_t generation_ = 0;
  uint64_t rounds_ = 0;
  bool aborted_ = false;
  std::string abort_reason_;
};

}  // namespace di
