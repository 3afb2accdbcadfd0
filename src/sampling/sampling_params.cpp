#include "sampling/sampling_params.h"

#include <cmath>

namespace di::sampling {

Status SamplingParams::validate() const {
  auto bad = [](const char* field, double value, const char* rule) {
    return make_status(StatusCode::kInvalidArgument, "{} must be {}, got {}", field, rule, value);
  };
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return bad("temperature", temperature, "a finite number >= 0 (0 = greedy)");
  }
  if (top_k < -1) return bad("top_k", top_k, "-1 or 0 (disabled) or >= 1");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return bad("top_p", top_p, "in (0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return bad("min_p", min_p, "in [0, 1]");
  if (!std::isfinite(repetition_penalty) || !(repetition_penalty > 0.0f)) {
    return bad("repetition_penalty", repetition_penalty, "a finite number > 0 (1 = off)");
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return bad("frequency_penalty", frequency_penalty, "in [-2, 2]");
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return bad("presence_penalty", presence_penalty, "in [-2, 2]");
  }
  if (top_logprobs < 0 || top_logprobs > kMaxTopLogprobs) {
    return bad("top_logprobs", top_logprobs, "in [0, 20]");
  }
  return Status::ok();
}

}  // namespace di::sampling
