#pragma once
// Engine: the serving engine's public face. One engine thread owns the model, the KV pool, the
// scheduler and the sampler; HTTP workers talk to it only through typed messages:
//
//   worker ──submit(EngineRequest, sink)──► [inbox] ──► engine loop: schedule → forward → sample
//   worker ◄──── sink(TokenEvent) ◄──────────────────────────┘   (called on the engine thread)
//
// The engine sees token ids and sampling settings only: no JSON, no text, no chat templates
// (those stay in protocol/ and server/). Stop strings are matched by the caller on detokenized
// text, which then calls finish().
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/ids.h"
#include "core/status.h"
#include "engine/eplb_options.h"
#include "sampling/sampling_params.h"

namespace di {

using sampling::SamplingParams;

enum class EngineFinish : uint8_t { kNone, kStop, kLength, kAbort, kError };

struct EngineRequest {
  RequestId id;
  std::vector<int32_t> prompt;
  SamplingParams sampling;  // temperature, top-k/p, min-p, penalties, seed, logprobs
  int32_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  int32_t n = 1;           // parallel samples sharing the prompt's KV blocks
  int32_t priority = 0;    // lower = more urgent
  std::string cache_salt;  // isolates prefix-cache entries (mixed into block 0's hash)
  bool logprobs = false;   // report each token's logprob (also implied by sampling.top_logprobs)
  int32_t dp_rank = -1;    // DP group: the rank that runs it (-1: the least-loaded rank)
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // top_logprobs alternatives
};

// One event per new token of one sample; the last event of a sample has finish != kNone and
// carries the usage numbers. An error event (finish == kError) carries a message.
struct TokenEvent {
  RequestId id;
  int32_t sample_idx = 0;
  int32_t token = -1;    // -1 when the event only finishes (abort, error)
  TokenLogprob logprob;  // filled when sampling.top_logprobs or logprobs were asked for
  EngineFinish finish = EngineFinish::kNone;
  int32_t num_prompt_tokens = 0;
  int32_t num_cached_tokens = 0;  // prompt tokens served from the prefix cache
  int32_t num_output_tokens = 0;
  std::string error;
};

using TokenSink = std::function<void(const TokenEvent&)>;  // must not block: queue and return

struct EngineConfig {
  std::string model_dir;
  std::string backend = "cpu";
  int32_t block_size = 64;
  int32_t num_blocks = 0;  // 0 = from kv_cache_bytes
  int64_t kv_cache_bytes = 256 << 20;
  int32_t max_model_len = 0;          // 0 = min(model max positions, pool capacity)
  int32_t max_batched_tokens = 8192;  // per-step token budget (chunked prefill)
  int32_t max_running = 256;
  bool enable_prefix_caching = true;
  EplbOptions eplb;  // expert load balancing of MoE models (off by default; issue #8)
  // Decode-only steps replay captured step graphs (CUDA graphs) where the backend has them;
  // false = every step eager (`serve --eager`).
  bool decode_graphs = true;
  // Sample on the backend's device (Backend::sample_on_device) in steps whose every row allows it
  // (engine/sample_placement.h); false, or DEEPINFER_GPU_SAMPLING=0, samples every step on the
  // host. The tokens are the same either way.
  bool device_sampling = true;
  // Benchmarks: build the model from model_dir/config.json with random weights (filled on the
  // device where the backend can, see Backend::fill_uniform) instead of reading safetensors.
  bool random_weights = false;
  uint64_t random_seed = 1;
  // DP attention + EP (issue #8, dp_engine_group.h; `serve --dp-size`). 0: one engine
  // (EngineLoop). N >= 1: a DpEngineGroup of N ranks, each its own backend, model, KV pool
  // (num_blocks / kv_cache_bytes apply per rank), scheduler and prefix cache; a MoE model runs its
  // routed experts across the ranks (rank r computes experts [r * ceil(E/N), ...)) in lockstep.
  int32_t dp_size = 0;
  // CUDA backends: the device of each rank (default 0 .. dp_size - 1).
  std::vector<int32_t> dp_devices;
};

// Counters and gauges for /metrics; a consistent snapshot.
struct EngineStats {
  uint64_t requests_finished = 0;
  uint64_t requests_aborted = 0;
  uint64_t requests_failed = 0;  // ended by an internal error (kError events)
  uint64_t prompt_tokens = 0;
  uint64_t cached_prompt_tokens = 0;  // prefix-cache hit tokens
  uint64_t generated_tokens = 0;
  uint64_t preemptions = 0;
  uint64_t steps = 0;
  uint64_t graph_steps = 0;  // decode steps served by a captured step graph (CUDA graphs)
  // DP group rank without work while another rank stepped: one padding token through the model
  // so that its MoE layers still join the expert-parallel exchange.
  uint64_t padding_steps = 0;
  // Steps whose tokens were drawn by the backend's device sampler (the others sampled on the
  // host; engine/sample_placement.h says which).
  uint64_t device_sample_steps = 0;
  // Engine-thread wall time, microseconds: in the model forward (runner execute, up to the logits
  // ready on the host, or on the device when the step samples there: it includes the GPU work),
  // in sampling (sample_batch on the host, or Backend::sample_on_device), and waiting at a DP
  // group's barriers.
  uint64_t forward_us = 0;
  uint64_t graph_forward_us = 0;  // the part of forward_us spent in steps replayed from graphs
  uint64_t sample_us = 0;
  uint64_t group_wait_us = 0;
  int32_t dp_size = 0;  // ranks summed into this snapshot (0: a standalone engine)
  struct RankLoad {
    int32_t num_running = 0;
    int32_t num_waiting = 0;
    int32_t kv_blocks_used = 0;
  };
  std::vector<RankLoad> dp_ranks;  // per rank of a DP group (empty for a standalone engine)
  int32_t num_waiting = 0;
  int32_t num_running = 0;
  int32_t kv_blocks_total = 0;
  int32_t kv_blocks_used = 0;
  int32_t kv_blocks_cached = 0;
  // EPLB (only when enabled on a MoE model).
  bool eplb_enabled = false;
  uint64_t eplb_rebalances = 0;
  double moe_lb = 1.0;  // expected max/mean rank load of the current placement, mean over layers
};

class Engine {
 public:
  // Loads the model and starts the engine thread.
  static Result<std::unique_ptr<Engine>> start(const EngineConfig& config);
  virtual ~Engine() = default;  // stops the thread; unfinished requests get kAbort events

  virtual int64_t vocab_size() const = 0;
  virtual int32_t max_model_len() const = 0;
  virtual const std::string& model_dir() const = 0;

  // Validates (empty prompt, ids outside the vocabulary, prompt + max_tokens over max_model_len,
  // bad sampling settings, duplicate id) and queues. Errors are returned, never thrown; the sink is
  // then never called.
  virtual Status submit(EngineRequest request, TokenSink sink) = 0;
  // Ends a request early: abort (client gone) frees its blocks; finish (stop string) ends it as
  // kStop. Both are no-ops for unknown or finished ids.
  virtual void abort(RequestId id) = 0;
  virtual void finish(RequestId id) = 0;

  virtual EngineStats stats() const = 0;
  // Recomputes every scheduler / KV invariant from scratch (tests and debug builds).
  virtual void check_integrity() const = 0;
  // Non-empty once the engine can no longer serve any request and only a restart helps (a DP
  // group whose NCCL communicators were aborted after a GPU or rank failure). `serve` then exits
  // with status 75 so that a supervisor restarts it on the GPUs still healthy.
  virtual std::string fatal_error() const { return {}; }
};

}  // namespace di
