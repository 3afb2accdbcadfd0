#pragma once
// Merging split-KV partial results (flash-decoding) for one output row, shared by the GQA and MLA
// decode paths. Partials: o [num_splits, rows, dv] (unnormalised, relative to the split's running
// max), ml [num_splits, rows, 2] (running max, sum); an empty split has max = -inf.
//   out[row, d] = Σ_sp e^(m_sp - M) o_sp[d] / Σ_sp e^(m_sp - M) l_sp,   M = max_sp m_sp
// Launch: grid (rows, ceil(dv / blockDim.x)), one output dim per thread. The split weights are
// computed once per CTA into shared memory (256 at a time). The o sum runs in split order; the
// order depends only on the row's own splits (batch invariant).
// The GQA combine kernel for few rows (combine_split_row<T, kPreLoaded>) requests the o values of
// the first kPreLoaded splits into registers before anything else, with the (max, sum) loads, so
// that at batch 1 its loads are one round trip through L2 instead of one per 8 splits after two
// reductions: a 33-split Qwen3-30B-A3B row took 4.6-4.8 us after its wait, 2.8 with them (run
// 28's timeline, docs/cuda_backend.md). Many rows keep kPre = 0: with it every row, Qwen3-30B-A3B
// measured -0.4 % / -0.8 % at batch 32 / 256 (one sample each, run 28 calls 4-5).
#include <cfloat>

#include "backend/cuda/kernels/common.cuh"

namespace di::cuda {

// A partial written by an earlier kernel (plain load) or by another CTA of the running kernel
// (kL2: __ldcg, through L2, since this SM's L1 may hold a stale line of it).
template <bool kL2>
__device__ __forceinline__ float load_partial(const float* ptr) {
  if constexpr (kL2)
    return __ldcg(ptr);
  else
    return *ptr;
}

// ov[j] = the o value of split j at output dim d of `row`, for the splits below min(kN,
// num_splits) (0 beyond, and everywhere for an idle thread: d >= dv), requested together before
// any is used. One pointer step per split (the unrolled loads were ~13 instructions each with the
// offset j * rows * dv recomputed in 64 bits; code run for the first time costs ~0.2 us per KB).
template <int kN, bool kL2>
__device__ __forceinline__ void preload_partial_o(float (&ov)[kN], const float* partial_o,
                                                  int64_t rows, int num_splits, int dv, int64_t row,
                                                  int d) {
  const float* po = partial_o + row * dv + d;
  const int64_t step = rows * dv;
  const int nv = d < dv ? num_splits : 0;
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    ov[j] = j < nv ? load_partial<kL2>(po) : 0.0f;
    po += step;
  }
}

// Output dim d (< dv, or idle) of `row`, by every thread of the CTA (block-wide reductions: all
// threads call it, each with its own d). The arithmetic depends on blockDim.x: callers that want
// the same bits as combine_split_row use the same block size.
// kPre > 0: the o values of splits < kPre are loaded first (same terms, same order: same bits).
// kMark: DI_TRACE_MARK once the split weights' denominator is known (a kernel with a trace scope).
template <typename T, bool kL2 = false, int kPre = 0, bool kMark = false>
__device__ __forceinline__ void combine_split_row_dim(const float* __restrict__ partial_o,
                                                      const float* __restrict__ partial_ml,
                                                      int64_t rows, int num_splits, int dv,
                                                      int64_t row, int d, T* __restrict__ out) {
  constexpr int kChunk = 256;
  static_assert(kPre >= 0 && kPre <= kChunk, "the preloaded splits lie in the first chunk");
  __shared__ float w_s[kChunk];
  __shared__ float scratch[32];
  float ov[kPre > 0 ? kPre : 1];
  if constexpr (kPre > 0) preload_partial_o<kPre, kL2>(ov, partial_o, rows, num_splits, dv, row, d);
  float m = -INFINITY;
  // The split loops stay rolled (one pass for up to blockDim.x splits; unrolled copies are code
  // to fetch, not work).
#pragma unroll 1
  for (int sp = threadIdx.x; sp < num_splits; sp += blockDim.x)
    m = fmaxf(m, load_partial<kL2>(partial_ml + (sp * rows + row) * 2));
  m = block_max(m, scratch);
  float den = 0.0f;
#pragma unroll 1
  for (int sp = threadIdx.x; sp < num_splits; sp += blockDim.x) {
    const float ms = load_partial<kL2>(partial_ml + (sp * rows + row) * 2);
    if (ms != -INFINITY)
      den += expf(ms - m) * load_partial<kL2>(partial_ml + (sp * rows + row) * 2 + 1);
  }
  den = block_sum(den, scratch);
  if constexpr (kMark) DI_TRACE_MARK_AFTER(den);
  float o = 0.0f;
  for (int c0 = 0; c0 < num_splits; c0 += kChunk) {
    const int cn = min(kChunk, num_splits - c0);
    __syncthreads();  // w_s of the previous chunk (or row) is consumed
#pragma unroll 1
    for (int j = threadIdx.x; j < cn; j += blockDim.x) {
      const float ms = load_partial<kL2>(partial_ml + ((c0 + j) * rows + row) * 2);
      w_s[j] = ms == -INFINITY ? 0.0f : expf(ms - m);
    }
    __syncthreads();
    if (d < dv) {
      const float* po = partial_o + (c0 * rows + row) * dv + d;
      int j = 0;
      if constexpr (kPre > 0) {
        if (c0 == 0) {
#pragma unroll
          for (int i = 0; i < kPre; ++i)
            if (i < cn) o += w_s[i] * ov[i];
          j = min(kPre, cn);
        }
      }
#pragma unroll 8
      for (; j < cn; ++j) o += w_s[j] * load_partial<kL2>(po + j * rows * dv);
    }
  }
  if (d < dv) out[row * dv + d] = from_f32<T>(den > 0.0f ? o / den : 0.0f);
}

// The same output with no barrier (the launcher's default for few rows since run 39, which
// measured it on the H200; DEEPINFER_COMBINE_WARP=0 takes the block merge): at most 64 splits,
// at least 64 threads per CTA (so block_sum's threads hold one split each and its warps 2.. hold
// none), every o value preloaded (kPreLoaded). Each warp computes the max and the denominator
// itself: lane l holds splits l and 32 + l, warp_sum of each half is block_sum's warp 0 and warp 1
// partial (the same butterfly over the same lanes), and block_sum's last step, the butterfly over
// [W0, W1, 0, ...], is W0 + W1 exactly (adding zeros). The split weights reach every thread by
// shuffles instead of shared memory, and the o sum keeps the split order and the expression
// o += w · o_j: the same bits as combine_split_row_dim<T, false, kPreLoaded> with no
// __syncthreads (that one has five).
template <typename T, bool kMark = false>
__device__ __forceinline__ void combine_split_row_warp(const float* __restrict__ partial_o,
                                                       const float* __restrict__ partial_ml,
                                                       int64_t rows, int num_splits, int dv,
                                                       int64_t row, int d, T* __restrict__ out) {
  constexpr int kMax = 64;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  float ov[kMax];
  preload_partial_o<kMax, false>(ov, partial_o, rows, num_splits, dv, row, d);
  const int sa = lane, sb = 32 + lane;  // this lane's splits
  const float ma = sa < num_splits ? partial_ml[(sa * rows + row) * 2] : -INFINITY;
  const float mb = sb < num_splits ? partial_ml[(sb * rows + row) * 2] : -INFINITY;
  const float m = warp_max(fmaxf(fmaxf(-INFINITY, ma), mb));
  float wa = 0.0f, wb = 0.0f, da = 0.0f, db = 0.0f;
  if (sa < num_splits && ma != -INFINITY) {
    wa = expf(ma - m);
    da += wa * partial_ml[(sa * rows + row) * 2 + 1];
  }
  if (sb < num_splits && mb != -INFINITY) {
    wb = expf(mb - m);
    db += wb * partial_ml[(sb * rows + row) * 2 + 1];
  }
  const float den = warp_sum(da) + warp_sum(db);
  if constexpr (kMark) DI_TRACE_MARK_AFTER(den);
  float o = 0.0f;
#pragma unroll
  for (int j = 0; j < kMax; ++j) {
    const float w = __shfl_sync(0xffffffffu, j < 32 ? wa : wb, j & 31);
    if (j < num_splits) o += w * ov[j];
  }
  if (d < dv) out[row * dv + d] = from_f32<T>(den > 0.0f ? o / den : 0.0f);
}

// The combine kernel's body: grid (rows, ceil(dv / blockDim.x)), one output dim per thread.
constexpr int kPreLoaded = 64;
constexpr unsigned kCombinePreloadMaxRows = 256;  // batch 8 of a 32-head model
// kWarp: combine_split_row_warp (the launcher checks its limits).
template <typename T, int kPre = 0, bool kWarp = false>
__device__ __forceinline__ void combine_split_row(const float* __restrict__ partial_o,
                                                  const float* __restrict__ partial_ml,
                                                  int64_t rows, int num_splits, int dv, int64_t row,
                                                  T* __restrict__ out) {
  pdl_trigger();  // the next (PDL-launched) kernel may start loading its weights
  pdl_wait();     // launched as a PDL dependent (launch_decode): nothing read before this
  DI_TRACE_WAITED();  // every kernel that calls this has a DI_TRACE_SCOPE
  const int d = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x);
  if constexpr (kWarp) {
    combine_split_row_warp<T, true>(partial_o, partial_ml, rows, num_splits, dv, row, d, out);
  } else {
    combine_split_row_dim<T, false, kPre, true>(partial_o, partial_ml, rows, num_splits, dv, row, d,
                                                out);
  }
}

}  // namespace di::cuda
