#pragma once
// DpEngineGroup: DP attention + expert parallelism inside the serving engine (issue #8). The
// Engine (engine.h) the HTTP server sees, made of N ranks; each rank is an EngineLoop with its
// own backend (device), model weights, KV pool, scheduler and prefix cache, so a request's
// attention and KV live on exactly one rank. The routed experts of a MoE model are spread over
// the ranks (rank r computes experts [r * ceil(E/N), (r + 1) * ceil(E/N))) and every MoE layer
// exchanges rows between the ranks (dp_expert_transport.h: shared memory on the CPU, NCCL on
// CUDA), so the ranks step in lockstep (group_step_barrier.h):
//
//   submit ──► least-loaded rank ──► EngineLoop r ─┐ every step:  barrier(has work?) ─► forward
//   abort/finish ──► the rank holding the id       │ (a rank without work runs one padding
//   stats = sum over ranks                         │  token so its MoE layers join the exchange)
//                                                  └─► sink (wrapped: releases the id, then the
//                                                      caller's sink)
//
// Placement: the rank with the fewest open samples of requests placed on it (running + waiting
// sequences, counting requests still in its inbox), then the fewest KV blocks in use (its last
// stats snapshot), then the lowest rank; or the rank the request names (EngineRequest::dp_rank).
//
// Dense models have no collective: the ranks run independently (plain DP, no barrier, no hook).
// EPLB (--eplb): one EplbRuntime per rank over the group's N ranks; every rank holds all N·S
// weight slots and computes its own [r·S, (r+1)·S) (the hook owns physical slots); window loads
// are summed over the group (group_load_sum.h) and all ranks re-place at the same step with the
// same plan (docs/expert_parallelism.md "EPLB in a DP group"). Decode steps: the ranks agree on one
// decode shape per step (StepSync::agree_decode); when every rank decodes (or pads), all take the
// latency exchange (parallel/cuda/ep_moe_latency.h, no host sync) and replay CUDA step graphs of
// one key; other steps take the throughput exchange eagerly. DEEPINFER_EP_LATENCY=0: throughput
// everywhere.
//
// Invariants (check_integrity): every rank's own invariants; every id live on a rank is placed on
// that rank in the group's table, and on no other rank; per-rank open-sample counts equal the
// table's; EPLB: the ranks' rebalance histories agree (same step, phase and placement).
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/dp_expert_transport.h"
#include "engine/engine.h"
#include "engine/engine_loop.h"
#include "engine/group_load_sum.h"
#include "engine/group_step_barrier.h"

namespace di {

class DpEngineGroup final : public Engine {
 public:
  // config.dp_size ranks (>= 1); config.dp_devices: CUDA device per rank (default 0..N-1).
  static Result<std::unique_ptr<Engine>> start(const EngineConfig& config);
  ~DpEngineGroup() override;
  DpEngineGroup(const DpEngineGroup&) = delete;
  DpEngineGroup& operator=(const DpEngineGroup&) = delete;

  int64_t vocab_size() const override { return ranks_.front()->vocab_size(); }
  int32_t max_model_len() const override { return ranks_.front()->max_model_len(); }
  const std::string& model_dir() const override { return config_.model_dir; }

  Status submit(EngineRequest request, TokenSink sink) override;
  void abort(RequestId id) override;
  void finish(RequestId id) override;

  EngineStats stats() const override;
  void check_integrity() const override;
  std::string fatal_error() const override {
    return transport_ ? transport_->fatal_error() : std::string();
  }

  int32_t num_ranks() const { return static_cast<int32_t>(ranks_.size()); }
  bool expert_parallel() const { return transport_ != nullptr; }
  EngineStats rank_stats(int32_t rank_idx) const { return ranks_.at(rank_idx)->stats(); }
  // Tests: a rank's engine (its model, to check which experts it uses).
  EngineLoop& rank(int32_t rank_idx) { return *ranks_.at(rank_idx); }
  // The rank holding a live request, or -1.
  int32_t rank_of(RequestId id) const;
  // Barrier rounds that ran a group step (0 for independent ranks).
  uint64_t group_steps() const { return barrier_ ? barrier_->step_rounds() : 0; }

 private:
  explicit DpEngineGroup(const EngineConfig& config);
  // Picks the rank for a new request (mu_ held).
  int32_t pick_rank() const;
  // A final event of one sample of `id` was produced: drop the id when it was the last one.
  void release_sample(RequestId id);

  struct Placement {
    int32_t rank_idx = 0;
    int32_t open_samples = 0;
  };

  const EngineConfig config_;
  std::function<void(int32_t)> bind_;  // binds the calling thread to rank r's device
  // Declaration order = reverse destruction order: the ranks (threads) go first, then the
  // barrier and the transport they use.
  std::unique_ptr<DpExpertTransport> transport_;              // null for a dense model
  std::unique_ptr<GroupLoadSum> loads_;                       // EPLB's load all-reduce, or null
  std::unique_ptr<GroupStepBarrier> barrier_;                 // null for a dense model
  std::unique_ptr<std::atomic<EngineLoop*>[]> wake_targets_;  // for the barrier's wake()
  std::vector<std::unique_ptr<EngineLoop>> ranks_;

  mutable std::mutex mu_;  // lock order: mu_ -> a rank's inbox lock
  bool stopping_ = false;
  std::unordered_map<RequestId, Placement> placement_;
  std::vector<int32_t> open_samples_;  // per rank: sum of open_samples placed there
};

}  // namespace di
