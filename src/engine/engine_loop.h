#pragma once
// EngineLoop: the Engine (engine.h) as one thread that owns the model runner, the KV cache manager
// and the scheduler. Other threads only post typed messages to its inbox; it answers through each
// request's TokenSink. docs/engine.md has the diagram.
//
//   submit/abort/finish ──► inbox (mutex + cv) ──► loop: drain inbox ─► step ─► publish stats
//                                                          │ scheduler.step() → ModelRunner
//                                                          │ → sample (device or host, see
//                                                          │   sample_placement.h)
//                                                          │ → scheduler.update()
//   sinks ◄── TokenEvents (called on the engine thread, after the loop lock is released) ◄──┘
//
// Lock order: state_mu_ (everything the loop mutates) → inbox_mu_ → stats_mu_. Sinks run with no
// lock held, so a sink may call abort(), finish(), stats() or check_integrity().
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/eplb_runtime.h"
#include "engine/group_load_sum.h"
#include "engine/model_runner.h"
#include "engine/step_sync.h"
#include "kv/kv_cache_manager.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "scheduler/scheduler.h"

namespace di {

// The seed of sample `sample_idx` of a request seeded with `seed`: sample 0 keeps the request's
// seed (so n = 1 and sample 0 of n > 1 draw the same tokens); the others get independent seeds.
uint64_t sample_seed(uint64_t seed, int32_t sample_idx);

// What Engine::start builds before it starts an engine thread: the backend, the model and the
// pool size (also one rank of a DpEngineGroup, which calls it once per rank).
struct EngineParts {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  int32_t num_blocks = 0;
  int32_t max_model_len = 0;
};
// Validates the config, loads the model on a new backend and sizes the KV pool.
Result<EngineParts> load_engine_parts(const EngineConfig& config);

// Optional: the engine is rank `rank_idx` of a DP group (dp_engine_group.h).
struct EngineLoopHooks {
  StepSync* sync = nullptr;  // not owned; null = no barrier, no padding steps
  int32_t rank_idx = 0;
  // Runs first on the engine thread (a CUDA rank binds its device: cudaSetDevice is per thread).
  std::function<void(int32_t rank_idx)> bind_thread;
  // Group ranks: called before every forward with the rows per rank of the step's expert
  // exchange (> 0: the latency exchange at that decode bucket; 0: the throughput exchange).
  std::function<void(int32_t rank_idx, int32_t rows_per_rank)> set_exchange_rows;
  // > 0: sample on a private pool of this many threads. The ranks of a DP group sample at the
  // same moment, and the shared global pool serves one caller at a time (the others sample
  // serially): on 2 H200s that made a rank's sampling 4x slower than one engine's.
  int32_t sample_threads = 0;
  // Group ranks with EPLB: the group's load all-reduce (not owned); rank rank_idx of it.
  GroupLoadSum* eplb_loads = nullptr;
};

class EngineLoop final : public Engine {
 public:
  // Takes a loaded model; sizes the pool and starts the engine thread. `num_blocks` > 0.
  EngineLoop(const EngineConfig& config, std::unique_ptr<Backend> backend,
             std::unique_ptr<Model> model, int32_t num_blocks, int32_t max_model_len,
             EngineLoopHooks hooks = {});
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

  // Group ranks only: wakes the engine thread if it idles on its inbox, so that it comes to the
  // group's barrier (another rank has work). Safe from any thread.
  void wake();
  // Ids accepted and not yet released (the duplicate-id set), for the group's invariants.
  std::vector<RequestId> live_request_ids() const;
  Model& model() { return *model_; }
  // Tests: runs fn on this engine's EPLB runtime (null when EPLB is off) under the state lock, so
  // never during a step.
  void with_eplb(const std::function<void(EplbRuntime*)>& fn);
  Backend& backend() { return *backend_; }

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
  // The step's tokens from Backend::sample_on_device (logits on the device, one row per entry of
  // `rows`, every row allowed there by SamplePlacement); no log-probabilities.
  std::vector<sampling::SampleResult> sample_on_device(const Tensor& logits,
                                                       std::span<const sampling::SamplingRow> rows);
  // A group rank without work while others step: one padding token through every layer.
  void run_padding_step();
  // The step's agreement (StepSync::agree_decode for group ranks): returns the group's decode
  // shape, the exchange set on this rank's expert hook accordingly ({} for a standalone engine);
  // begins the EPLB step in the group's phase. Throws when another rank failed the step.
  GroupDecode agree_step(DecodeShape mine);
  // After a step threw: closes its EPLB step if it was begun (keeps the group's EPLB lockstep).
  void end_failed_eplb_step();
  // Records a sample's final event; closes the request when it was the last open sample.
  void close_sample(RequestState& r, int32_t sample_idx, EngineFinish reason);
  void publish_stats();
  static void deliver(Outbox& out);

  const EngineConfig config_;
  const int32_t max_model_len_;
  const EngineLoopHooks hooks_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  // config.device_sampling and not DEEPINFER_GPU_SAMPLING=0; each step still asks the backend and
  // its rows (sample_placement.h).
  const bool device_sampling_;

  // Owned by the engine thread; check_integrity() reads them under state_mu_.
  mutable std::mutex state_mu_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<ThreadPool> sample_pool_;  // hooks_.sample_threads > 0; else the global pool
  std::unique_ptr<EplbRuntime> eplb_;        // null unless config.eplb.enabled (MoE models only)
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
  bool wake_ = false;  // set by wake(): come to the group barrier once even without mail

  mutable std::mutex stats_mu_;
  EngineStats stats_;  // the last published snapshot

  std::thread thread_;  // last: starts after every member above is constructed
};

}  // namespace di
