#pragma once
// Scheduler: owns the queues, drives the KvCacheManager, and turns schedule() results into engine
// inputs. The engine loop (one thread) calls, per step:
//
//   StepPlan plan = scheduler.step();          // schedule() + apply: preempt, admit, allocate
//   engine: perform plan.block_copies, run the forward on plan.input_ids / positions / paged,
//           sample plan-requested tokens
//   events = scheduler.update(plan, sampled);  // KV computed, tokens appended, forks, stop/length
//
// add() / abort() / finish() may be called between steps. Stop strings are matched by the caller
// on detokenized text (StopChecker), which then calls finish(seq, kStop).
// TODO(#async): update() must run before the next step(); the overlapped loop needs placeholders.
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "kv/kv_cache_manager.h"
#include "scheduler/schedule.h"

namespace di {

struct SchedulerConfig {
  Limits limits;
  int32_t max_model_len = 0;  // prompt + output tokens per sequence; 0 = the whole KV pool
};

// Everything the engine needs for one step, decodes first, then prefill chunks.
struct StepPlan {
  ScheduleResult schedule;
  std::vector<BlockCopy> block_copies;  // perform before the forward
  std::vector<TokenId> input_ids;       // [num_batched_tokens]
  std::vector<int32_t> positions;       // [num_batched_tokens]
  PagedBatchView paged;                 // CSR block tables + slots of the new tokens
};

// The engine's sampling result for one scheduled sequence with num_samples > 0.
struct SampledTokens {
  SeqId seq_id;
  std::vector<TokenId> tokens;  // exactly num_samples; token k goes to sample k of the group
};

// One new token of one sequence; on finish it carries the usage numbers.
struct SeqEvent {
  RequestId request_id;
  SeqId seq_id;
  int32_t sample_idx = 0;
  TokenId token = 0;
  FinishReason finish_reason = FinishReason::kNone;
  int32_t num_prompt_tokens = 0;
  int32_t num_cached_tokens = 0;  // prompt tokens served by the prefix cache at first admission
  int32_t num_output_tokens = 0;
};

class Scheduler {
 public:
  Scheduler(KvCacheManager& kv, SchedulerConfig config);

  // Rejects (kInvalidArgument) an empty prompt, a prompt that leaves no room for one output token
  // under max_model_len, n < 1, max_tokens < 1, or a request id that is already live.
  Status add(RequestId id, std::vector<TokenId> prompt, RequestParams params);
  // Removes every sequence of the request from whichever queue holds it and frees its blocks.
  // Returns how many sequences were aborted (0 when the id is unknown or already finished).
  int32_t abort(RequestId id);
  // Finishes a running or waiting sequence from outside (a stop string matched).
  void finish(SeqId seq, FinishReason reason);

  StepPlan step();
  std::vector<SeqEvent> update(const StepPlan& plan, std::span<const SampledTokens> sampled);

  const Queues& queues() const { return queues_; }
  const KvCacheManager& kv() const { return *kv_; }
  const SchedulerConfig& config() const { return config_; }
  bool has_unfinished() const { return !queues_.seqs.empty(); }
  int32_t num_preemptions() const { return num_preemptions_; }

  void check_integrity() const;

 private:
  void preempt(SeqId id);
  void admit(SeqId id, int32_t expected_cached);
  // Removes a sequence from its queue and the KV manager; returns its final event.
  SeqEvent retire(SeqId id, FinishReason reason);
  void fill_inputs(StepPlan& plan) const;

  KvCacheManager* kv_;
  SchedulerConfig config_;
  Queues queues_;
  std::unordered_map<RequestId, int32_t> num_live_seqs_;  // unfinished sequences per request
  uint64_t next_arrival_ = 0;
  uint64_t next_seq_ = 0;
  int32_t num_preemptions_ = 0;
};

}  // namespace di
