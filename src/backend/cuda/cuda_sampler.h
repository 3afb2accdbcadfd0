#pragma once
// Token sampling on the GPU for a batch of logits rows (kernels/sampling.h), with the CPU
// sampler's semantics: the same (logits, params, position) gives the same token. Penalties and
// log-probabilities stay on the CPU for now (TODO(#5)). CudaBackend::sample_on_device runs a
// CudaSampler; the serving engine calls that (docs/sampling.md "Where sampling runs").
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/env.h"
#include "sampling/sampling_params.h"

namespace di::cuda {

// One backend's sampler. Its device buffers (row params, tokens, the sort's workspace) are kept
// between calls and grow to the largest (rows, vocab) seen: 32 rows of a 129,280 vocabulary need
// 4 x 16.5 MB (keys, ids, in and out) + 33 MB (double weights) + CUB's temp, about 100 MB.
class CudaSampler {
 public:
  explicit CudaSampler(CudaBackend& be) : be_(be) {}
  CudaSampler(const CudaSampler&) = delete;
  CudaSampler& operator=(const CudaSampler&) = delete;

  // logits [rows.size(), vocab] f32 on the device. Enqueues on the backend's stream after
  // whatever is there (the forward that wrote the logits) and waits for the tokens; -1 for a row
  // whose logits are all -inf/NaN.
  std::vector<int32_t> sample(const Tensor& logits, std::span<const DeviceSampleRow> rows);

 private:
  std::vector<int32_t> download_tokens(int32_t num_rows);  // tokens_ -> host, waits

  CudaBackend& be_;
  // All-greedy batches take launch_argmax_rows instead of the sort; DEEPINFER_GPU_ARGMAX=0 sends
  // them through the sort too (A/B).
  bool greedy_fast_path_ = !di::env::is("DEEPINFER_GPU_ARGMAX", "0");
  Tensor params_host_;  // [capacity x sizeof(SampleRowParams)] u8, host staging
  Tensor params_;       // the same on the device
  Tensor tokens_;       // [capacity] i32
  Tensor workspace_;    // u8, sample_workspace_bytes of the largest call
  std::vector<int32_t> tokens_host_;
};

// Tests: sampling::SamplingParams rows (penalties are rejected: they need the token history)
// through CudaBackend::sample_on_device.
std::vector<int32_t> sample_on_gpu(CudaBackend& be, const Tensor& logits,
                                   const std::vector<sampling::SamplingParams>& params,
                                   const std::vector<int64_t>& positions);

}  // namespace di::cuda
