#pragma once
// Token sampling on the GPU with the CPU sampler's semantics (sampling/sampler.h): greedy argmax
// (lowest id on ties) or temperature / top-k / top-p / min-p over the canonical order (probability
// descending, id ascending), one uniform u = sampling_uniform(seed, position) (sampling/philox.h)
// through the inverse CDF. Penalties are applied before (not here).
//
// Run: (1) logits -> keys (NaN -> -inf) and ids, (2) a stable segmented radix sort descending
// (CUB) gives the canonical order per row, (3) one CTA per row computes the weights in double
// in parallel and walks the kept prefix on one thread with the CPU's exact arithmetic.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace di::cuda {

struct SampleRowParams {
  float temperature;  // 0 = greedy
  int32_t top_k;      // <= 0: off
  float top_p;        // 1 = off
  float min_p;        // 0 = off
  uint64_t seed;
  int64_t position;  // index of the token being sampled in its sequence
};

struct SampleParams {
  const float* logits;            // [rows, vocab] f32
  const SampleRowParams* params;  // [rows] device
  int32_t* tokens;                // [rows] out: sampled token, -1 when every logit is -inf/NaN
  int32_t rows;
  int32_t vocab;
  // workspace (sample_workspace_bytes)
  void* workspace;
  size_t workspace_bytes;
};

size_t sample_workspace_bytes(int32_t rows, int32_t vocab);
// Greedy rows only (every temperature 0): tokens[r] = the first index of the largest logit of
// row r (NaN never wins, ±0 tie, -1 when every logit is -inf or NaN), the CPU's argmax; one CTA
// per row, one read of the logits, no sort and no workspace.
void launch_argmax_rows(const float* logits, int32_t rows, int32_t vocab, int32_t* tokens,
                        cudaStream_t stream);
// Enqueues the sort and the sampling kernels; no host synchronisation.
void launch_sample(const SampleParams& p, cudaStream_t stream);

}  // namespace di::cuda
