// GPU sampling (see sampling.h). Correctness first: the radix sort and the sequential walk cost
// a few hundred microseconds at a 128 K vocabulary; a top-k-first path (radix select) is the
// faster follow-up, TODO(#5). All-greedy batches skip the sort (launch_argmax_rows).
#include <cub/device/device_segmented_radix_sort.cuh>

#include <cfloat>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/sampling.h"
#include "sampling/philox.h"

namespace di::cuda {
namespace {

struct Workspace {
  float* keys_in;
  float* keys_out;
  int32_t* ids_in;
  int32_t* ids_out;
  int32_t* offsets;  // [rows + 1]
  double* weights;   // [rows, vocab]
  void* cub_temp;
  size_t cub_bytes;
};

size_t align_up(size_t x) {
  return (x + 255) & ~size_t{255};
}

size_t cub_temp_bytes(int32_t rows, int32_t vocab) {
  size_t bytes = 0;
  const int64_t n = int64_t{rows} * vocab;
  cub::DeviceSegmentedRadixSort::SortPairsDescending(
      nullptr, bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n, rows,
      static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(nullptr));
  return bytes;
}

Workspace carve(void* base, int32_t rows, int32_t vocab) {
  const size_t n = static_cast<size_t>(rows) * vocab;
  char* p = static_cast<char*>(base);
  Workspace w;
  w.keys_in = reinterpret_cast<float*>(p);
  p += align_up(n * 4);
  w.keys_out = reinterpret_cast<float*>(p);
  p += align_up(n * 4);
  w.ids_in = reinterpret_cast<int32_t*>(p);
  p += align_up(n * 4);
  w.ids_out = reinterpret_cast<int32_t*>(p);
  p += align_up(n * 4);
  w.offsets = reinterpret_cast<int32_t*>(p);
  p += align_up((static_cast<size_t>(rows) + 1) * 4);
  w.weights = reinterpret_cast<double*>(p);
  p += align_up(n * 8);
  w.cub_temp = p;
  w.cub_bytes = cub_temp_bytes(rows, vocab);
  return w;
}

__global__ void prepare_keys_kernel(const float* logits, int32_t rows, int32_t vocab, float* keys,
                                    int32_t* ids, int32_t* offsets) {
  const int64_t n = int64_t{rows} * vocab;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = logits[i];
    keys[i] = isnan(v) ? -INFINITY : (v == 0.0f ? 0.0f : v);  // -0 ties with +0, as on the CPU
    ids[i] = static_cast<int32_t>(i % vocab);
    if (i % vocab == 0) offsets[i / vocab] = static_cast<int32_t>(i);
    if (i == 0) offsets[rows] = static_cast<int32_t>(n);
  }
}

// One CTA per row over the canonically sorted (vals, ids).
__global__ void sample_sorted_kernel(SampleParams p, const float* vals_all, const int32_t* ids_all,
                                     double* weights_all) {
  const int row = blockIdx.x;
  const SampleRowParams sp = p.params[row];
  const float* vals = vals_all + int64_t{row} * p.vocab;
  const int32_t* ids = ids_all + int64_t{row} * p.vocab;
  double* w = weights_all + int64_t{row} * p.vocab;
  __shared__ int n_usable_s;
  if (threadIdx.x == 0) {
    // -inf keys sort last: binary search for the first one.
    int lo = 0, hi = p.vocab;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (vals[mid] == -INFINITY)
        hi = mid;
      else
        lo = mid + 1;
    }
    n_usable_s = lo;
  }
  __syncthreads();
  const int n_usable = n_usable_s;
  if (n_usable == 0) {
    if (threadIdx.x == 0) p.tokens[row] = -1;
    return;
  }
  if (sp.temperature == 0.0f) {
    if (threadIdx.x == 0) p.tokens[row] = ids[0];
    return;
  }
  const double max_logit = static_cast<double>(vals[0]);
  const double inv_t = 1.0 / static_cast<double>(sp.temperature);
  for (int i = threadIdx.x; i < n_usable; i += blockDim.x)
    w[i] = exp((static_cast<double>(vals[i]) - max_logit) * inv_t);
  __syncthreads();
  if (threadIdx.x != 0) return;
  // From here the CPU's filtered_distribution + sample, operation for operation.
  int keep = n_usable;
  if (sp.top_p >= 1.0f && sp.min_p > 0.0f) {
    const double floor = static_cast<double>(sp.min_p);
    int n = 0;
    while (n < keep && w[n] >= floor) ++n;
    keep = n;
  }
  if (sp.top_k > 0 && sp.top_k < keep) keep = sp.top_k;
  if (sp.top_p < 1.0f) {
    double total = 0.0;
    for (int i = 0; i < keep; ++i) total += w[i];
    const double target = static_cast<double>(sp.top_p) * total;
    double cum = 0.0;
    int n = 0;
    while (n < keep) {
      cum += w[n++];
      if (cum >= target) break;
    }
    keep = n;
  }
  if (sp.min_p > 0.0f) {
    const double floor = static_cast<double>(sp.min_p);
    int n = 1;
    while (n < keep && w[n] >= floor) ++n;
    keep = n;
  }
  double total = 0.0;
  for (int i = 0; i < keep; ++i) total += w[i];
  const double u = static_cast<double>(di::sampling::sampling_uniform(sp.seed, sp.position));
  int chosen = keep - 1;
  double cum = 0.0;
  for (int i = 0; i < keep; ++i) {
    cum += w[i] / total;
    if (u < cum) {
      chosen = i;
      break;
    }
  }
  p.tokens[row] = ids[chosen];
}

// (value, index) of the larger logit, the lower index on equal values (== also ties -0 and +0);
// NaN and -inf never win (the start is (-inf, INT32_MAX)).
__device__ __forceinline__ void argmax_merge(float& best, int32_t& idx, float v, int32_t i) {
  if (v > best || (v == best && i < idx)) {
    best = v;
    idx = i;
  }
}

constexpr int kArgmaxThreads = 1024;

__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_rows_kernel(const float* logits, int32_t vocab, int32_t* tokens) {
  DI_TRACE_SCOPE(kTraceArgmax, 0);
  const float* x = logits + int64_t{blockIdx.x} * vocab;
  float best = -INFINITY;
  int32_t idx = INT32_MAX;
  // Ascending indices per thread: a strict > keeps the first of equal values.
  for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = x[i];
    if (v > best) {
      best = v;
      idx = i;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, off);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, idx, off);
    argmax_merge(best, idx, ov, oi);
  }
  __shared__ float best_s[kArgmaxThreads / 32];
  __shared__ int32_t idx_s[kArgmaxThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    best_s[warp] = best;
    idx_s[warp] = idx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x) / 32; ++w) {
      argmax_merge(best, idx, best_s[w], idx_s[w]);
    }
    tokens[blockIdx.x] = best == -INFINITY ? -1 : idx;
  }
}

}  // namespace

void launch_argmax_rows(const float* logits, int32_t rows, int32_t vocab, int32_t* tokens,
                        cudaStream_t stream) {
  if (rows == 0) return;
  argmax_rows_kernel<<<static_cast<unsigned>(rows), kArgmaxThreads, 0, stream>>>(logits, vocab,
                                                                                 tokens);
}

size_t sample_workspace_bytes(int32_t rows, int32_t vocab) {
  const size_t n = static_cast<size_t>(rows) * vocab;
  return 4 * align_up(n * 4) + align_up((static_cast<size_t>(rows) + 1) * 4) + align_up(n * 8) +
         cub_temp_bytes(rows, vocab) + 256;
}

void launch_sample(const SampleParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  Workspace w = carve(p.workspace, p.rows, p.vocab);
  const int64_t n = int64_t{p.rows} * p.vocab;
  prepare_keys_kernel<<<ceil_div(n, 256) < 4096 ? ceil_div(n, 256) : 4096, 256, 0, stream>>>(
      p.logits, p.rows, p.vocab, w.keys_in, w.ids_in, w.offsets);
  size_t bytes = w.cub_bytes;
  cub::DeviceSegmentedRadixSort::SortPairsDescending(w.cub_temp, bytes, w.keys_in, w.keys_out,
                                                     w.ids_in, w.ids_out, n, p.rows, w.offsets,
                                                     w.offsets + 1, 0, 32, stream);
  sample_sorted_kernel<<<static_cast<unsigned>(p.rows), 256, 0, stream>>>(p, w.keys_out, w.ids_out,
                                                                          w.weights);
}

}  // namespace di::cuda
