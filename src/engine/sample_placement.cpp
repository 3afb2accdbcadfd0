#include "engine/sample_placement.h"

#include <cstdlib>
#include <string_view>

#include "core/env.h"

namespace di {

const char* host_sampling_name(HostSampling reason) {
  switch (reason) {
    case HostSampling::kNone:
      return "none";
    case HostSampling::kDisabled:
      return "disabled";
    case HostSampling::kBackend:
      return "backend";
    case HostSampling::kNoRows:
      return "no_rows";
    case HostSampling::kPenalties:
      return "penalties";
    case HostSampling::kLogprobs:
      return "logprobs";
  }
  return "unknown";
}

// A field added to SamplingParams is a sampling feature the device sampler may lack: decide in
// row_needs_host whether it needs the host, then update this size.
static_assert(sizeof(sampling::SamplingParams) == 48,
              "SamplingParams changed: check row_needs_host and the device sampler");

HostSampling row_needs_host(const sampling::SamplingParams& params, bool wants_logprobs) {
  // Everything sampling::sample() does beyond DeviceSampleRow's fields is listed here: a new
  // SamplingParams feature the device sampler lacks must add its reason.
  if (params.has_penalties()) return HostSampling::kPenalties;
  if (wants_logprobs || params.top_logprobs > 0) return HostSampling::kLogprobs;
  return HostSampling::kNone;
}

DeviceSampleRow device_sample_row(const sampling::SamplingParams& params, int64_t position) {
  return DeviceSampleRow{.temperature = params.temperature,
                         .top_k = params.top_k,
                         .top_p = params.top_p,
                         .min_p = params.min_p,
                         .seed = params.seed,
                         .position = position};
}

bool device_sampling_allowed_by_env() {
  return !di::env::is("DEEPINFER_GPU_SAMPLING", "0");
}

}  // namespace di
