#include "engine/token_sampler.h"

#include <span>

#include "core/error.h"
#include "sampling/sampler.h"

namespace di {

int32_t sample_next_token(const float* logits, int64_t vocab, const GenerateRequest& r,
                          int64_t position, const std::vector<int32_t>& tokens,
                          const std::vector<int32_t>& output) {
  sampling::SamplingParams p;
  p.temperature = r.temperature;
  p.top_k = r.top_k;
  p.top_p = r.top_p;
  p.min_p = r.min_p;
  p.repetition_penalty = r.repetition_penalty;
  p.frequency_penalty = r.frequency_penalty;
  p.presence_penalty = r.presence_penalty;
  p.seed = r.seed;
  Status valid = p.validate();
  DI_CHECK(valid.is_ok(), "sampling settings: {}", valid.message());
  DI_CHECK(output.size() <= tokens.size(), "{} output tokens but {} tokens in all", output.size(),
           tokens.size());
  std::span<const int32_t> all(tokens);
  return sampling::sample_token(std::span<const float>(logits, static_cast<size_t>(vocab)), p,
                                position, all.first(tokens.size() - output.size()), output);
}

}  // namespace di
