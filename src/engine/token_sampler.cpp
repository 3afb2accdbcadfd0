#include "engine/token_sampler.h"

#include "core/error.h"

namespace di {

int32_t sample_next_token(const float* logits, int64_t vocab, const GenerateRequest& r,
                          int64_t /*position*/, const std::vector<int32_t>& /*tokens*/,
                          const std::vector<int32_t>& /*output*/) {
  // TODO(#2): route through sampling/ once it lands; greedy (lowest index on ties) until then.
  DI_CHECK(r.temperature == 0.0f, "sampling with temperature > 0 is not available in this build");
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

}  // namespace di
