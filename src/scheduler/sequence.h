#pragma once
// Sequence: the scheduler's unit of work. A request with n > 1 is a group of n sequences that
// share request_id, params, prompt and arrival; they differ in sample_idx. No JSON, no HTTP.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/ids.h"
#include "kv/block_hash.h"
#include "kv/kv_cache_manager.h"

namespace di {

enum class SeqStatus : uint8_t {
  kWaiting,    // never admitted
  kRunning,    // holds KV blocks
  kPreempted,  // waiting again after its blocks were freed; resumes by recomputing prompt + output
  kFinished,
};

enum class FinishReason : uint8_t { kNone, kStop, kLength, kAbort };

const char* seq_status_name(SeqStatus status);
const char* finish_reason_name(FinishReason reason);

// What the scheduler needs to know about a request. Sampling parameters (temperature, seed, ...)
// stay with the engine, which finds them by request id.
struct RequestParams {
  int32_t max_tokens = 16;              // generated tokens per sequence, >= 1
  std::vector<TokenId> stop_token_ids;  // sampling one finishes with kStop; it stays in `output`
  int32_t n = 1;                        // sequences sampled from the prompt
  int32_t priority = 0;                 // lower = more urgent (vLLM's convention)
  std::string cache_salt;               // isolates this request's prefix-cache entries
};

struct Sequence {
  SeqId seq_id;
  RequestId request_id;
  int32_t sample_idx = 0;  // 0..n-1 within the request
  uint64_t arrival = 0;    // order of Scheduler::add; FCFS key after priority
  std::shared_ptr<const RequestParams> params;
  std::shared_ptr<const std::vector<TokenId>> prompt;
  std::vector<TokenId> output;
  SeqStatus status = SeqStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  // n while this is a group's only sequence and its prompt is not computed yet; the step that
  // completes the prompt samples n tokens and forks n - 1 siblings. Then 1.
  int32_t num_samples = 1;
  int32_t num_cached_tokens = 0;  // prompt tokens served by the prefix cache at first admission
  bool was_admitted = false;
  int32_t num_preemptions = 0;
  // While waiting: hash chain of the full blocks of prompt ++ output (admission lookups reuse it).
  std::vector<BlockHash> block_hashes;

  int32_t num_prompt_tokens() const { return static_cast<int32_t>(prompt->size()); }
  int32_t num_output_tokens() const { return static_cast<int32_t>(output.size()); }
  int32_t num_tokens() const { return num_prompt_tokens() + num_output_tokens(); }
  std::vector<TokenId> tokens() const;  // prompt ++ output
};

// Scheduling order: priority, then arrival, then sample index (smaller = more urgent).
inline bool more_urgent(const Sequence& a, const Sequence& b) {
  if (a.params->priority != b.params->priority) return a.params->priority < b.params->priority;
  if (a.arrival != b.arrival) return a.arrival < b.arrival;
  return a.sample_idx < b.sample_idx;
}

}  // namespace di
