#pragma once
// The per-row math of the GQA attention prologue of qkv_rope_store_kernel and its warp-per-row
// form (decode_fused.cu; until run 46 also of the fused attention kernels, hence its own header):
// [RMSNorm with a per-dim weight, rounded to the element type] -> rope over the whole head
// (pairs (j, j + d/2)), rounded to the element type; or a plain copy (v rows).
//
// The reduction of the norm depends on the thread count: thread t sums elements t, t + 128, ...
// of a row, then block_sum's tree, on kQkvRowThreads threads.
#include "backend/cuda/kernels/common.cuh"

namespace di::cuda {

inline constexpr int kQkvRowThreads = 128;  // blockDim.x of every caller

// block_sum (common.cuh) of R values at once: the same tree for each, two barriers in all.
// scratch holds >= 32 * R floats.
template <int R>
__device__ __forceinline__ void block_sum_rows(float (&v)[R], float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int r = 0; r < R; ++r) v[r] = warp_sum(v[r]);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) scratch[r * 32 + warp] = v[r];
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < R; ++r) v[r] = warp_sum(lane < nwarps ? scratch[r * 32 + lane] : 0.0f);
}

// The rotated pair (x0, x1) by (c, s), rounded to T, into *lo and *hi. Explicit fmaf: the
// contraction must not depend on the caller's code generation (every row form here calls this).
template <typename T>
__device__ __forceinline__ void store_rope_pair(T* lo, T* hi, float x0, float x1, float c,
                                                float s) {
  *lo = from_f32<T>(fmaf(x0, c, -(x1 * s)));
  *hi = from_f32<T>(fmaf(x1, c, x0 * s));
}

struct RopeCosSin {
  const void* table;  // [max_pos, head_dim]: cos of head_dim/2 freqs, then sin
  bool f32;           // else bf16
  int32_t max_pos;
};

// One head row (qkv_rope_rows with R = 1, after its first barrier): run 28's code, kept as it was
// for qkv_rope_store_kernel (the batched form below measured 0.8 % slower on Qwen3-30B-A3B batch
// 1 as the store kernel's, run 29); the same arithmetic, so the same bits. Its loops stay rolled:
// at head dims up to 128 a thread runs each once, the compiler's unrolled copies were dead code
// (the store kernel 1,408 -> 680 instructions), and code run for the first time costs ~0.2 us
// per KB (run 31: the store kernel 3.30 -> 2.75 us after its wait).
template <typename T>
__device__ __forceinline__ void qkv_rope_row(const T* src, T* dst, int d, const T* norm_w,
                                             float eps, bool rotate, int32_t pos, RopeCosSin cs,
                                             float* row_s, float* scratch) {
  float ss = 0.0f;
#pragma unroll 1
  for (int i = threadIdx.x; i < d; i += kQkvRowThreads) {
    const float v = to_f32(src[i]);
    row_s[i] = v;
    ss = fmaf(v, v, ss);
  }
  if (norm_w != nullptr) {
    float one[1] = {ss};
    block_sum_rows<1>(one, scratch);
    const float inv = rsqrtf(one[0] / static_cast<float>(d) + eps);
#pragma unroll 1
    for (int i = threadIdx.x; i < d; i += kQkvRowThreads)
      row_s[i] = to_f32(from_f32<T>(row_s[i] * inv * to_f32(norm_w[i])));
  }
  __syncthreads();  // rope reads elements loaded by other threads
  if (!rotate) {
#pragma unroll 1
    for (int i = threadIdx.x; i < d; i += kQkvRowThreads) dst[i] = from_f32<T>(row_s[i]);
    return;
  }
  const int half = d / 2;
#pragma unroll 1
  for (int j = threadIdx.x; j < half; j += kQkvRowThreads) {
    float c, s;
    rope_cos_sin(cs.table, cs.f32, pos, d, j, c, s);
    store_rope_pair(dst + j, dst + j + half, row_s[j], row_s[j + half], c, s);
  }
}

// R > 1 rows (qkv_rope_rows after its first barrier).
template <typename T, int R>
__device__ __forceinline__ void qkv_rope_rows_batched(const T* src, T* dst, int d, const T* norm_w,
                                                      float eps, bool rotate, int32_t pos,
                                                      RopeCosSin cs, float* row_s, float* scratch) {
  // The R rows' loads are issued together (one round trip; stored to row_s only after all of them:
  // a store between two loads would keep the second behind it). Each row sums its own elements in
  // ascending order, as one row at a time would.
  float ss[R];
#pragma unroll
  for (int r = 0; r < R; ++r) ss[r] = 0.0f;
  for (int i = threadIdx.x; i < d; i += kQkvRowThreads) {
    float v[R];
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = to_f32(src[r * d + i]);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      row_s[r * d + i] = v[r];
      ss[r] = fmaf(v[r], v[r], ss[r]);
    }
  }
  if (norm_w != nullptr) {
    block_sum_rows<R>(ss, scratch);
    float inv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) inv[r] = rsqrtf(ss[r] / static_cast<float>(d) + eps);
    // Same thread, same elements as the load loop: no barrier needed before this.
    for (int i = threadIdx.x; i < d; i += kQkvRowThreads) {
      const float w = to_f32(norm_w[i]);
#pragma unroll
      for (int r = 0; r < R; ++r)
        row_s[r * d + i] = to_f32(from_f32<T>(row_s[r * d + i] * inv[r] * w));
    }
  }
  __syncthreads();  // rope reads elements loaded by other threads
  if (!rotate) {
    for (int i = threadIdx.x; i < R * d; i += kQkvRowThreads) dst[i] = from_f32<T>(row_s[i]);
    return;
  }
  const int half = d / 2;
  auto rotate_pair = [&](int r, int j, float c, float s) {
    store_rope_pair(dst + r * d + j, dst + r * d + j + half, row_s[r * d + j],
                    row_s[r * d + j + half], c, s);
  };
  if (kQkvRowThreads % half == 0) {  // one column j per thread: its (cos, sin) loaded once
    const int j = static_cast<int>(threadIdx.x) % half;
    float c, s;
    rope_cos_sin(cs.table, cs.f32, pos, d, j, c, s);
    for (int r = static_cast<int>(threadIdx.x) / half; r < R; r += kQkvRowThreads / half)
      rotate_pair(r, j, c, s);
    return;
  }
  for (int idx = threadIdx.x; idx < R * half; idx += kQkvRowThreads) {
    float c, s;
    rope_cos_sin(cs.table, cs.f32, pos, d, idx % half, c, s);
    rotate_pair(idx / half, idx % half, c, s);
  }
}

// One head row of d = 32 · E elements by one warp, with qkv_rope_rows<T, 1>'s bits and no barrier
// (prepared in run 37, not yet run on a GPU). Lane l holds elements l + 32 k. The norm replays the
// 128-thread tree: thread t = 32 w + l sums elements t, t + 128, ... (fmaf in that order), so warp
// w's sum is warp_sum of this lane's elements l + 32 (w + 4 m); block_sum's last butterfly over
// [W0, W1, W2, W3, 0, ...] is (W0 + W2) + (W1 + W3). Rope pairs (j, j + d/2) are elements k and k
// + E/2 of the same lane. E even (d = 64 / 128 / 256).
template <typename T, int E>
__device__ __forceinline__ void qkv_rope_row_warp(const T* src, T* dst, const T* norm_w, float eps,
                                                  bool rotate, int32_t pos, RopeCosSin cs) {
  static_assert(E % 2 == 0 && E <= 8, "head dims 64, 128, 256");
  constexpr int d = 32 * E, half = d / 2;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  if (pos < 0 || pos >= cs.max_pos) rotate = false;
  if (!rotate && norm_w == nullptr) {
#pragma unroll
    for (int k = 0; k < E; ++k) dst[lane + 32 * k] = src[lane + 32 * k];
    return;
  }
  float x[E];
#pragma unroll
  for (int k = 0; k < E; ++k) x[k] = to_f32(src[lane + 32 * k]);
  if (norm_w != nullptr) {
    float w_sum[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      float ss = 0.0f;
#pragma unroll
      for (int k = w; k < E; k += 4) ss = fmaf(x[k], x[k], ss);
      w_sum[w] = warp_sum(ss);
    }
    const float total = (w_sum[0] + w_sum[2]) + (w_sum[1] + w_sum[3]);
    const float inv = rsqrtf(total / static_cast<float>(d) + eps);
#pragma unroll
    for (int k = 0; k < E; ++k)
      x[k] = to_f32(from_f32<T>(x[k] * inv * to_f32(norm_w[lane + 32 * k])));
  }
  if (!rotate) {
#pragma unroll
    for (int k = 0; k < E; ++k) dst[lane + 32 * k] = from_f32<T>(x[k]);
    return;
  }
#pragma unroll
  for (int k = 0; k < E / 2; ++k) {
    const int j = lane + 32 * k;
    float c, s;
    rope_cos_sin(cs.table, cs.f32, pos, d, j, c, s);
    store_rope_pair(dst + j, dst + j + half, x[k], x[k + E / 2], c, s);
  }
}

// R consecutive head rows of d elements (src[r * d + i] -> dst[r * d + i]; dst may be global or
// shared memory): x = src; [x = round(x / rms(x) * norm_w) when norm_w]; [x = rope(x, pos) when
// rotate and 0 <= pos < max_pos]; dst = round(x). Neither: a bitwise copy. Every thread of the
// CTA (kQkvRowThreads) calls it with the same arguments. row_s: R * d floats of shared memory;
// scratch: 32 * R floats. dst is complete for the CTA only after a barrier (rope writes each
// element from another thread than the one that loaded it).
template <typename T, int R>
__device__ __forceinline__ void qkv_rope_rows(const T* src, T* dst, int d, const T* norm_w,
                                              float eps, bool rotate, int32_t pos, RopeCosSin cs,
                                              float* row_s, float* scratch) {
  if (pos < 0 || pos >= cs.max_pos) rotate = false;
  if (!rotate && norm_w == nullptr) {
    for (int i = threadIdx.x; i < R * d; i += kQkvRowThreads) dst[i] = src[i];
    return;
  }
  __syncthreads();       // row_s may still be read by a previous call
  if constexpr (R == 1)  // the store kernel's one row: the code its timings were taken with
    qkv_rope_row(src, dst, d, norm_w, eps, rotate, pos, cs, row_s, scratch);
  else
    qkv_rope_rows_batched<T, R>(src, dst, d, norm_w, eps, rotate, pos, cs, row_s, scratch);
}

// Token row `row` of the qkv GEMM's output ((num_q + 2 num_kv) head rows of d) -> kv head g's K
// ([k_norm] + rope) and V (copied) in a pool entry laid out as qkv_rope_store_kernel writes it (K
// of every kv head, then V): the store kernel's two rows of g, as the fused attention kernels
// write them. The CTA calls it together (qkv_rope_rows).
template <typename T>
__device__ __forceinline__ void qkv_store_kv_head(const T* row, T* entry, int num_q, int num_kv,
                                                  int g, int d, const T* k_norm, float eps,
                                                  int32_t pos, RopeCosSin cs, float* row_s,
                                                  float* scratch) {
  qkv_rope_rows<T, 1>(row + int64_t{num_q + g} * d, entry + int64_t{g} * d, d, k_norm, eps, true,
                      pos, cs, row_s, scratch);
  qkv_rope_rows<T, 1>(row + int64_t{num_q + num_kv + g} * d, entry + int64_t{num_kv + g} * d, d,
                      nullptr, eps, false, pos, cs, row_s, scratch);
}

}  // namespace di::cuda
