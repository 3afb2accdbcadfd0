#pragma once
// Token sampling on the GPU for a batch of logits rows (kernels/sampling.h), with the CPU
// sampler's semantics: the same (logits, params, position) gives the same token. Penalties and
// log-probabilities stay on the CPU for now (TODO(#5)): rows with penalties are rejected.
#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "sampling/sampling_params.h"

namespace di::cuda {

// logits [rows, vocab] f32 on the device; params and positions per row. Returns the tokens
// (-1 for a row whose logits are all -inf/NaN).
std::vector<int32_t> sample_on_gpu(CudaBackend& be, const Tensor& logits,
                                   const std::vector<sampling::SamplingParams>& params,
                                   const std::vector<int64_t>& positions);

}  // namespace di::cuda
