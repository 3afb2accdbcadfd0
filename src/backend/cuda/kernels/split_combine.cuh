#pragma once
// Merging split-KV partial results (flash-decoding) for one output row, shared by the GQA and MLA
// decode paths. Partials: o [num_splits, rows, dv] (unnormalised, relative to the split's running
// max), ml [num_splits, rows, 2] (running max, sum); an empty split has max = -inf.
//   out[row, d] = Σ_sp e^(m_sp - M) o_sp[d] / Σ_sp e^(m_sp - M) l_sp,   M = max_sp m_sp
// Launch: grid (rows, ceil(dv / blockDim.x)), one output dim per thread. The split weights are
// computed once per CTA into shared memory (256 at a time) and the o loads of 8 splits are in
// flight together. The o sum runs in split order; the order depends only on the row's own splits
// (batch invariant).
#include <cfloat>

#include "backend/cuda/kernels/common.cuh"

namespace di::cuda {

template <typename T>
__device__ __forceinline__ void combine_split_row(const float* __restrict__ partial_o,
                                                  const float* __restrict__ partial_ml,
                                                  int64_t rows, int num_splits, int dv,
                                                  int64_t row, T* __restrict__ out) {
  constexpr int kChunk = 256;
  __shared__ float w_s[kChunk];
  __shared__ float scratch[32];
  pdl_trigger();  // the next (PDL-launched) GEMV may start loading its weights
  const int d = blockIdx.y * blockDim.x + threadIdx.x;
  float m = -INFINITY;
  for (int sp = threadIdx.x; sp < num_splits; sp += blockDim.x)
    m = fmaxf(m, partial_ml[(sp * rows + row) * 2]);
  m = block_max(m, scratch);
  float den = 0.0f;
  for (int sp = threadIdx.x; sp < num_splits; sp += blockDim.x) {
    const float ms = partial_ml[(sp * rows + row) * 2];
    if (ms != -INFINITY) den += expf(ms - m) * partial_ml[(sp * rows + row) * 2 + 1];
  }
  den = block_sum(den, scratch);
  float o = 0.0f;
  for (int c0 = 0; c0 < num_splits; c0 += kChunk) {
    const int cn = min(kChunk, num_splits - c0);
    __syncthreads();  // w_s of the previous chunk is consumed
    for (int j = threadIdx.x; j < cn; j += blockDim.x) {
      const float ms = partial_ml[((c0 + j) * rows + row) * 2];
      w_s[j] = ms == -INFINITY ? 0.0f : expf(ms - m);
    }
    __syncthreads();
    if (d < dv) {
      const float* po = partial_o + (c0 * rows + row) * dv + d;
#pragma unroll 8
      for (int j = 0; j < cn; ++j) o += w_s[j] * po[j * rows * dv];
    }
  }
  if (d < dv) out[row * dv + d] = from_f32<T>(den > 0.0f ? o / den : 0.0f);
}

}  // namespace di::cuda
