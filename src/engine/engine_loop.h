#pragma once
// EngineLoop: the Engine (engine.h) as one thread that owns the model runner, the KV cache manager
// and the scheduler. Other threads only post typed messages to its inbox; it answers through each
// request's TokenSink. docs/engine.md has the diagram.
//
//   submit/abort/finish ──► inbox (mutex + cv) ──► loop: drain inbox ─► step ─► publish stats
//                                                          │ scheduler.step() → ModelRunner
//                                                          │ → sample_batch → scheduler.update()
//   sinks ◄── TokenEvents (called on the engine thread, after the loop lock is released) ◄──┘
//
// Lock order: state_mu_ (everything the loop mutates) → inbox_mu_ → stats_mu_. Sinks run with no
// lock held, so a sink may call abort(), finish(), stats() or check_integrity().
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "backend/backend.h"
#include "engine/engine.h"
#include "engine/eplb_runtime.h"
#include "engine/model_runner.h"
#include "kv/kv_cache_manager.h"
#include "model/model.h"
#include "scheduler/scheduler.h"

namespace di {

// The seed of sample `sample_idx` of a request seeded with `seed`: sample 0 keeps the request's
// seed (so n = 1 and sample 0 of n > 1 draw the same tokens); the others get independent seeds.
uint64_t sample_seed(uint64_t seed, int32_t sample_idx);

class EngineLoop final : public Engine {
 public:
  // Takes a loaded model; sizes the pool and starts the engine thread. `num_blocks` > 0.
  EngineLoop(const EngineConfig& config, std::unique_ptr<Backend> backend,
             std::unique_ptr<Model> model, int32_t num_blocks, int32_t max_model_len);
  ~EngineLoop() override;
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  int64_t vocab_size() const override { return model_->config().vocab_size; }
  int32_t max_model_len() const override { return max_model_len_; }
  const std::string& model_dir() const override { return config_.model_dir; }

  Status submit(EngineRequest request, TokenSink sink) override;
  void abort(RequestId id) override;
  void finish(RequestId id) override;

  EngineStats stats() const override;
  void check_integrity() const override;

 private:
  struct SubmitMsg {
    EngineRequest request;
    TokenSink sink;
  };
  struct AbortMsg {
    RequestId id;
  };
  struct FinishMsg {
    RequestId id;
  };
  using Message = std::variant<SubmitMsg, AbortMsg, FinishMsg>;

  // A request the scheduler knows about, until every sample has had its final event.
  struct RequestState {
    EngineRequest request;
    std::shared_ptr<const TokenSink> sink;
    std::vector<SamplingParams> sample_params;  // per sample_idx (derived seeds)
    std::vector<uint8_t> sample_done;           // per sample_idx: final event emitted
    int32_t num_open = 0;                       // samples without a final event
    bool counted_prompt = false;                // prompt / cached tokens added to the stats
    EngineFinish worst = EngineFinish::kNone;   // kError > kAbort > others, for the stats
  };

  // Events produced under the loop lock, delivered after it is released.
  struct Delivery {
    std::shared_ptr<const TokenSink> sink;
    TokenEvent event;
  };
  using Outbox = std::vector<Delivery>;

  Status validate(const EngineRequest& r) const;
  void run();
  void handle(Message& msg, Outbox& out);
  void handle_submit(SubmitMsg& msg, Outbox& out);
  // Ends every open sample of `id` with `reason` and removes the request from the scheduler.
  void end_request(RequestId id, EngineFinish reason, const std::string& error, Outbox& out);
  void end_all(EngineFinish reason, const std::string& error, Outbox& out);
  void run_step(Outbox& out);
  // Records a sample's final event; closes the request when it was the last open sample.
  void close_sample(RequestState& r, int32_t sample_idx, EngineFinish reason);
  void publish_stats();
  static void deliver(Outbox& out);

  const EngineConfig config_;
  const int32_t max_model_len_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;

  // Owned by the engine thread; check_integrity() reads them under state_mu_.
  mutable std::mutex state_mu_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<EplbRuntime> eplb_;  // null unless config.eplb.enabled (MoE models only)
  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unordered_map<RequestId, RequestState> requests_;
  std::vector<RequestId> closed_;  // requests whose last sample ended in this iteration
  EngineStats counters_;           // cumulative counters, engine thread only

  // Shared with submitting threads.
  mutable std::mutex inbox_mu_;
  std::condition_variable inbox_cv_;
  std::vector<Message> inbox_;
  std::unordered_set<RequestId> live_ids_;  // accepted and not yet finished: duplicate check
  bool stop_ = false;

  mutable std::mutex stats_mu_;
  EngineStats stats_;  // the last published snapshot

  std::thread thread_;  // last: starts after every member above is constructed
};

}  // namespace di
