#pragma once
// Bridges a GenerateRequest's sampling settings to the sampler (sampling/sampler.h): the same
// token for the same (logits, settings, position, history) as the serving engine.
#include <cstdint>
#include <vector>

#include "engine/generator.h"

namespace di {

int32_t sample_next_token(const float* logits, int64_t vocab, const GenerateRequest& r,
                          int64_t position, const std::vector<int32_t>& tokens,
                          const std::vector<int32_t>& output);

}  // namespace di
