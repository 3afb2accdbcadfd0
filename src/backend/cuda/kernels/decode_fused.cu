// Fused decode kernels (see decode_fused.h).
//
// Napkin math, Llama-3.1-8B decode, batch 1: the attention prologue moves 48 head rows x 256 B in
// and out per layer, nothing; what it costs is launches. Unfused it is 3 copies + 2 ropes + 2 KV
// stores (+ 2 norms on Qwen3) = 7-9 launches per layer; fused it is one.
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/decode_fused.h"

namespace di::cuda {
namespace {

constexpr int kFusedThreads = 128;

template <typename T>
__global__ void __launch_bounds__(kFusedThreads) qkv_rope_store_kernel(QkvRopeStoreKernelParams p) {
  __shared__ float row_s[kMaxFusedHeadDim];
  __shared__ float scratch[32];
  const int heads = p.num_q_heads + 2 * p.num_kv_heads;
  const int64_t t = blockIdx.x / heads;
  const int h = static_cast<int>(blockIdx.x % heads);
  const int d = p.head_dim;
  const T* src = static_cast<const T*>(p.qkv) + (t * heads + h) * d;
  // Destination, norm and rope of this head row. Every branch below depends only on blockIdx, so
  // the whole CTA takes it together (block_sum needs every thread).
  T* dst = nullptr;
  const T* norm_w = nullptr;
  bool rotate = false;
  if (h < p.num_q_heads) {
    dst = static_cast<T*>(p.q_out) + (t * p.num_q_heads + h) * d;
    norm_w = static_cast<const T*>(p.q_norm);
    rotate = true;
  } else {
    const int32_t slot = p.slot_mapping[t];
    if (slot < 0) return;
    const int64_t block = slot / p.block_size, off = slot % p.block_size;
    if (block >= p.num_blocks) return;
    const bool is_k = h < p.num_q_heads + p.num_kv_heads;
    const int g = is_k ? h - p.num_q_heads : h - p.num_q_heads - p.num_kv_heads;
    dst = static_cast<T*>(p.pool) + block * p.block_stride + p.layer_offset + off * p.entry_size +
          (is_k ? 0 : int64_t{p.num_kv_heads} * d) + int64_t{g} * d;
    norm_w = is_k ? static_cast<const T*>(p.k_norm) : nullptr;
    rotate = is_k;
  }
  const int32_t pos = p.positions[t];
  if (pos < 0 || pos >= p.max_pos) rotate = false;
  if (!rotate && norm_w == nullptr) {
    for (int i = threadIdx.x; i < d; i += kFusedThreads) dst[i] = src[i];
    return;
  }
  float ss = 0.0f;
  for (int i = threadIdx.x; i < d; i += kFusedThreads) {
    const float v = to_f32(src[i]);
    row_s[i] = v;
    ss += v * v;
  }
  if (norm_w != nullptr) {
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / static_cast<float>(d) + p.eps);
    // Same thread, same elements as the load loop: no barrier needed before this.
    for (int i = threadIdx.x; i < d; i += kFusedThreads)
      row_s[i] = to_f32(from_f32<T>(row_s[i] * inv * to_f32(norm_w[i])));  // rms_norm's rounding
  }
  __syncthreads();  // rope reads elements loaded by other threads
  if (!rotate) {
    for (int i = threadIdx.x; i < d; i += kFusedThreads) dst[i] = from_f32<T>(row_s[i]);
    return;
  }
  const int half = d / 2;
  for (int j = threadIdx.x; j < half; j += kFusedThreads) {
    float c, s;
    if (p.cos_sin_f32) {
      const float* cs = static_cast<const float*>(p.cos_sin) + int64_t{pos} * d;
      c = cs[j];
      s = cs[half + j];
    } else {
      const bf16* cs = static_cast<const bf16*>(p.cos_sin) + int64_t{pos} * d;
      c = to_f32(cs[j]);
      s = to_f32(cs[half + j]);
    }
    const float x0 = row_s[j], x1 = row_s[j + half];
    dst[j] = from_f32<T>(x0 * c - x1 * s);
    dst[j + half] = from_f32<T>(x1 * c + x0 * s);
  }
}

__global__ void moe_combine_f32_out_kernel(MoeCombineF32OutParams p) {
  const int64_t t = blockIdx.x;
  for (int c = threadIdx.x; c < p.hidden; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < p.top_k; ++j) {
      const int64_t row = p.slot_row[t * p.top_k + j];
      acc = fmaf(p.topk_weights[t * p.top_k + j], p.y[row * p.hidden + c], acc);
    }
    p.out[t * p.hidden + c] = acc;
  }
}

}  // namespace

void launch_qkv_rope_store(const QkvRopeStoreKernelParams& p, cudaStream_t stream) {
  const int64_t rows = p.tokens * (p.num_q_heads + 2 * p.num_kv_heads);
  if (rows == 0) return;
  const auto grid = static_cast<unsigned>(rows);
  if (p.f32)
    qkv_rope_store_kernel<float><<<grid, kFusedThreads, 0, stream>>>(p);
  else
    qkv_rope_store_kernel<bf16><<<grid, kFusedThreads, 0, stream>>>(p);
}

void launch_moe_combine_f32_out(const MoeCombineF32OutParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  moe_combine_f32_out_kernel<<<static_cast<unsigned>(p.tokens), 256, 0, stream>>>(p);
}

}  // namespace di::cuda
