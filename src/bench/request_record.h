#pragma once
// What the client observed for one request. Times are seconds on the benchmark's steady clock,
// measured from the start of the measured phase (warmup excluded).
#include <cstdint>
#include <string>
#include <vector>

namespace di::bench {

struct RequestRecord {
  int64_t request_idx = -1;  // position in the dataset
  int32_t session_idx = 0;   // multiturn / agent session; = request_idx for single-turn sets
  int32_t turn_idx = 0;

  double start_s = 0;               // just before the request bytes were written
  double end_s = 0;                 // last byte of the response read (stream end or [DONE])
  std::vector<double> chunk_times;  // arrival of each stream chunk that carried output text

  bool success = false;
  std::string error_type;  // "" when success; else e.g. "connect", "http_503", "timeout", ...
  std::string error_message;

  int32_t dataset_prompt_tokens = 0;  // prompt length by the benchmark's tokenizer
  int32_t max_tokens = 0;             // what was asked for
  // Server-reported usage; -1 where the server did not report it.
  int32_t usage_prompt_tokens = -1;
  int32_t usage_completion_tokens = -1;
  int32_t usage_cached_tokens = -1;  // usage.prompt_tokens_details.cached_tokens
  std::string finish_reason;

  std::string output_text;
  // Output length used by the metrics: usage.completion_tokens when reported, else the generated
  // text re-tokenized with the benchmark's tokenizer (set by the runner after the response).
  int32_t output_tokens = 0;
  bool output_tokens_from_usage = false;

  // Input length used by the metrics: the server's count when reported (it includes a chat
  // template's tokens), else the dataset's.
  int32_t input_tokens() const {
    return usage_prompt_tokens >= 0 ? usage_prompt_tokens : dataset_prompt_tokens;
  }
  bool has_first_token() const { return !chunk_times.empty(); }
  double ttft_s() const { return chunk_times.front() - start_s; }
  double e2e_s() const { return end_s - start_s; }
};

}  // namespace di::bench
