#pragma once
// ShmEpGroup: expert parallelism between the rank threads of one process, through shared memory
// (issue #8; the CPU transport of engine/dp_engine_group.h). The algorithm is the one of
// run_ep_moe_reference (ep_exchange_ref.h) and of the NCCL path (cuda/ep_moe_hook.h), with the
// same plans, only the all-to-alls are replaced by reads of the other ranks' slots:
//
//   rank r (its engine thread)                 slots_[N] (shared)                  rank q
//   plan_dispatch(topk_ids) -> pack_send_rows -> slot[r].plan, .send_rows
//   ══════════════════════════════ rendezvous 1 ══════════════════════════════
//                                  rows for q from every slot[r], in rank order -> plan_receive
//                                  -> expand_rows -> ONE Backend::moe_experts over all of them
//                                  (top-1, weight 1, the row's expert) -> slot[q].returns
//   ══════════════════════════════ rendezvous 2 ══════════════════════════════
//   combine_rows: out[t] = sum_j w[t, j] * y[t, j], j ascending, from every slot[q].returns
//
// Placement: contiguous_placement(E, N) (ep_moe_plan.h): rank r computes only experts
// [r * spr, (r + 1) * spr), spr = ceil(E / N). Every rank keeps the full ExpertWeights.
//
// Buffers: send fields are written before rendezvous 1 and read between 1 and 2; return fields
// are written between 1 and 2 and read after 2. A rank writes its send fields for the next layer
// only after reading the returns of this one, and nobody writes returns of the next layer before
// every rank passed rendezvous 1 of it, so two rendezvous per layer suffice.
//
// Lockstep: every rank calls every MoE layer once per group step (0 tokens is valid). A rank
// whose step throws never comes to the layer the others wait in: abort() releases them (they
// throw too), and reset(), called when every rank is between steps, makes the group usable again.
// Host memory and f32 activations only (the CPU backend).
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/layers.h"
#include "parallel/ep_layout.h"
#include "parallel/expert_placement.h"

namespace di::parallel {

// Totals of one rank since construction.
struct ShmEpTotals {
  int64_t calls = 0;
  int64_t tokens = 0;         // routed tokens of this rank
  int64_t rows_sent = 0;      // dispatch rows (one per token and destination rank)
  int64_t rows_computed = 0;  // expert rows this rank computed for the group
};

class ShmEpGroup {
 public:
  ShmEpGroup(int32_t num_ranks, int32_t num_experts, int32_t top_k, int32_t hidden);
  ~ShmEpGroup();
  ShmEpGroup(const ShmEpGroup&) = delete;
  ShmEpGroup& operator=(const ShmEpGroup&) = delete;

  int32_t num_ranks() const { return num_ranks_; }
  const ExpertPlacement& placement() const { return placement_; }
  // The hook rank r's thread passes to its MoE blocks (MoeBlock::expert_hook).
  MoeExpertHook& hook(int32_t rank_idx);
  ShmEpTotals totals(int32_t rank_idx) const;

  // Releases every rank waiting in a rendezvous with an exception naming `reason`; every later
  // call throws until reset().
  void abort(const std::string& reason);
  // Clears an abort. Only while no rank is inside a call (between group steps).
  void reset();

 private:
  class RankHook;
  struct Slot {
    DispatchPlan plan;                   // written by its rank before rendezvous 1
    std::vector<float> send_rows;        // [plan.num_send_rows(), hidden]
    std::vector<int32_t> return_indptr;  // [N + 1], written between rendezvous 1 and 2
    std::vector<float> returns;          // [entries served, hidden] in (received row, j) order
  };

  void run(int32_t rank_idx, Backend& be, const Tensor& x, const Tensor& topk_ids,
           const Tensor& topk_weights, const ExpertWeights& experts, Tensor& out);
  // Waits until every rank arrived (generation barrier); throws when aborted.
  void rendezvous();

  const int32_t num_ranks_;
  const int32_t num_experts_;
  const int32_t top_k_;
  const int32_t hidden_;
  const ExpertPlacement placement_;
  std::vector<Slot> slots_;
  std::vector<std::unique_ptr<RankHook>> hooks_;
  std::vector<ShmEpTotals> totals_;  // each entry written by its rank's thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int32_t arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string abort_reason_;
};

}  // namespace di::parallel
