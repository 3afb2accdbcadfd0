#pragma once
// SamplePlacement: where one engine step draws its tokens. On the backend's device
// (Backend::sample_on_device: the logits never leave the GPU; greedy and temperature / top-k /
// top-p / min-p only) when every row of the step allows it, else on the host
// (sampling::sample_batch over downloaded logits: every feature). One row that needs the host
// sends the whole step there: its logits are downloaded then anyway, and one sampler per step
// keeps a step's tokens from one code path.
//
//   SamplePlacement place(enabled, backend.can_sample_on_device());
//   for (row : step) place.add_row(row.params, row.wants_logprobs);
//   place.on_device() ? device path : host path;   place.reason() says why not
//
// Both samplers give the same token for the same logits, params and position
// (tests/ops/test_backend_ops.cpp, gpu_sampling_vs_cpu), so the choice never changes the output.
#include <cstdint>

#include "backend/backend.h"
#include "sampling/sampling_params.h"

namespace di {

// Why a step samples on the host; kNone: on the device. In the order they are checked.
enum class HostSampling : uint8_t {
  kNone,
  kDisabled,   // EngineConfig::device_sampling false, or DEEPINFER_GPU_SAMPLING=0
  kBackend,    // the backend has no device sampler (the CPU backend)
  kNoRows,     // nothing to sample this step (prefill chunks only)
  kPenalties,  // repetition / frequency / presence penalty: needs the token history
  kLogprobs,   // logprobs or top_logprobs asked for: computed by the host sampler
};

const char* host_sampling_name(HostSampling reason);

// Why this row needs the host sampler, or kNone. `wants_logprobs`: the request asked for
// logprobs (EngineRequest::logprobs) — top_logprobs > 0 in `params` implies it.
HostSampling row_needs_host(const sampling::SamplingParams& params, bool wants_logprobs);

// The row as the device sampler takes it.
DeviceSampleRow device_sample_row(const sampling::SamplingParams& params, int64_t position);

// DEEPINFER_GPU_SAMPLING: false only when set to "0" (the A/B switch to the host sampler).
bool device_sampling_allowed_by_env();

class SamplePlacement {
 public:
  // `enabled`: config and environment allow device sampling; `backend_can`:
  // Backend::can_sample_on_device().
  SamplePlacement(bool enabled, bool backend_can)
      : reason_(!enabled       ? HostSampling::kDisabled
                : !backend_can ? HostSampling::kBackend
                               : HostSampling::kNone) {}

  void add_row(const sampling::SamplingParams& params, bool wants_logprobs) {
    ++num_rows_;
    if (reason_ == HostSampling::kNone) reason_ = row_needs_host(params, wants_logprobs);
  }

  // The first reason found: the switch, the backend, then the rows in the order added; kNoRows
  // when no row was added (and nothing else stood in the way).
  HostSampling reason() const {
    return reason_ == HostSampling::kNone && num_rows_ == 0 ? HostSampling::kNoRows : reason_;
  }
  bool on_device() const { return reason() == HostSampling::kNone; }
  int32_t num_rows() const { return num_rows_; }

 private:
  HostSampling reason_;
  int32_t num_rows_ = 0;
};

}  // namespace di
