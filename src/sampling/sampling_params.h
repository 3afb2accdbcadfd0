#pragma once
// Per-request sampling parameters (OpenAI / vLLM semantics) and their validation.
#include <cstdint>

#include "core/status.h"

namespace di::sampling {

// Which distribution the reported log-probabilities describe.
enum class LogprobMode : uint8_t {
  kRaw,        // log_softmax of the model's logits, before penalties and filters (OpenAI, vLLM)
  kProcessed,  // log of the distribution actually sampled from (-inf for filtered tokens)
};

inline constexpr int32_t kMaxTopLogprobs = 20;  // OpenAI's `top_logprobs` limit

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy (argmax); otherwise logits are divided by it
  int32_t top_k = -1;               // keep the k most likely tokens; -1 or 0 = off
  float top_p = 1.0f;               // nucleus: smallest prefix with mass >= top_p; in (0, 1]
  float min_p = 0.0f;               // drop tokens with p < min_p * p_max; in [0, 1]
  float repetition_penalty = 1.0f;  // HF/vLLM: over prompt + output tokens; > 0, 1 = off
  float frequency_penalty = 0.0f;   // OpenAI: -= f * count over output tokens; in [-2, 2]
  float presence_penalty = 0.0f;    // OpenAI: -= p if the token occurs in the output; in [-2, 2]
  uint64_t seed = 0;                // keys the counter RNG together with the token position
  int32_t top_logprobs = 0;         // how many most-likely alternatives to report; [0, 20]
  LogprobMode logprob_mode = LogprobMode::kRaw;

  bool is_greedy() const { return temperature == 0.0f; }
  bool has_penalties() const {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f;
  }

  // kInvalidArgument naming the field, its value and the allowed range.
  Status validate() const;
};

}  // namespace di::sampling
