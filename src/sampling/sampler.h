#pragma once
// Token sampling on the CPU: the reference every other sampler (CUDA) must reproduce.
//
//   logits ─► penalties ─► greedy? argmax ─► temperature ─► top-k ─► top-p ─► min-p ─► draw
//             (repetition over prompt+output, frequency/presence over output)
//
// The draw is one uniform u = sampling_uniform(seed, position) (philox.h) mapped through the
// inverse CDF of the kept tokens in *canonical order*: probability descending, token id ascending
// on ties. So the token depends only on (logits, params, position, history) — never on the batch,
// the row order or the thread count. Greedy takes the argmax, lowest token id on ties. -inf logits
// (masked tokens) are never sampled; NaN logits are treated as -inf.
#include <cstdint>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "sampling/sampling_params.h"

namespace di::sampling {

struct TokenLogprob {
  int32_t token;
  float logprob;
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;                    // of `token`, in params.logprob_mode
  std::vector<TokenLogprob> top_logprobs;  // params.top_logprobs entries, canonical order
};

// One row of a batch. `position` is the index of the token being sampled in its sequence
// (prompt length + tokens generated so far); spans must outlive the call.
struct SamplingRow {
  const SamplingParams* params = nullptr;
  int64_t position = 0;
  std::span<const int32_t> prompt_ids;
  std::span<const int32_t> output_ids;
};

// A token and its probability in a filtered, renormalised distribution.
struct TokenProb {
  int32_t token;
  double prob;
};

// Applies the penalties to `logits` in place. Token ids must be in [0, logits.size()).
void apply_penalties(std::span<float> logits, const SamplingParams& params,
                     std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids);

// The distribution a non-greedy draw samples from, given already-penalised logits: temperature,
// top-k, top-p, min-p applied; the kept tokens in canonical order with probabilities summing to 1.
std::vector<TokenProb> filtered_distribution(std::span<const float> logits,
                                             const SamplingParams& params);

// Samples one token. Throws di::Error when every logit is -inf/NaN or a history id is out of range;
// params are assumed valid (SamplingParams::validate() at the request boundary).
SampleResult sample(std::span<const float> logits, const SamplingParams& params, int64_t position,
                    std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids);

inline int32_t sample_token(std::span<const float> logits, const SamplingParams& params,
                            int64_t position, std::span<const int32_t> prompt_ids,
                            std::span<const int32_t> output_ids) {
  return sample(logits, params, position, prompt_ids, output_ids).token;
}

// Samples every row of `logits` ([rows.size(), vocab_size], row-major) on `pool` (default: the
// global thread pool). Row r's result equals sample(row r, *rows[r].params, ...) whatever the
// other rows are.
std::vector<SampleResult> sample_batch(std::span<const float> logits, int64_t vocab_size,
                                       std::span<const SamplingRow> rows,
                                       ThreadPool* pool = nullptr);

}  // namespace di::sampling
