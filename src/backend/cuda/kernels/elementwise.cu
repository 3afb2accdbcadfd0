// Memory-bound kernels: norms, residual adds, SwiGLU, RoPE, copies, KV stores, gathers.
//
// Napkin math (Llama-3.1-8B decode, batch 1): every kernel here moves a few KB per token
// (4096 x 2 B = 8 KB per hidden row), so at small batch they are launch-bound (~2-4 us each,
// ~10 per layer -> ~1 ms of 3.7 ms per step without CUDA graphs); CUDA graphs remove most of it.
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/elementwise.h"

namespace di::cuda {
namespace {

// One block per row. Two passes over the row (the second from L1/L2): sum of squares, then scale.
// Each thread writes only the elements it read, so x and y may alias.
template <typename T>
__global__ void rms_norm_kernel(RmsNormParams p) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + row * p.d;
  T* y = static_cast<T*>(p.y) + row * p.d;
  T* res = p.residual ? static_cast<T*>(p.residual) + row * p.d : nullptr;
  const T* w = static_cast<const T*>(p.w);
  float ss = 0.0f;
  for (int i = threadIdx.x; i < p.d; i += blockDim.x) {
    float v = to_f32(x[i]);
    if (res) {
      const T r = from_f32<T>(to_f32(res[i]) + v);
      res[i] = r;
      v = to_f32(r);
    }
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(p.d) + p.eps);
  for (int i = threadIdx.x; i < p.d; i += blockDim.x) {
    const float v = res ? to_f32(res[i]) : to_f32(x[i]);
    y[i] = from_f32<T>(v * inv * to_f32(w[i]));
  }
}

template <typename T>
__global__ void add_kernel(AddParams p) {
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  T* out = static_cast<T*>(p.out);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < p.n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}

template <typename T>
__global__ void silu_mul_kernel(SiluMulParams p) {
  const T* gu = static_cast<const T*>(p.gate_up);
  T* out = static_cast<T*>(p.out);
  const int64_t n = p.rows * p.inter;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / p.inter, c = i % p.inter;
    const float g = to_f32(gu[r * 2 * p.inter + c]);
    const float u = to_f32(gu[r * 2 * p.inter + p.inter + c]);
    out[i] = from_f32<T>(g / (1.0f + expf(-g)) * u);
  }
}

// One thread per (token, head, frequency) pair.
template <typename T>
__global__ void rope_kernel(RopeParams p) {
  const int half = p.rot_dim / 2;
  const int64_t n = p.tokens * p.heads * half;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int j = static_cast<int>(i % half);
    const int64_t th = i / half, t = th / p.heads;
    const int32_t pos = p.positions[t];
    if (pos < 0 || pos >= p.max_pos) continue;
    float c, s;
    rope_cos_sin(p.cos_sin, p.cos_sin_f32, pos, p.rot_dim, j, c, s);
    T* v = static_cast<T*>(p.x) + th * p.row + p.rot_begin;
    const int a = p.interleaved ? 2 * j : j, b = p.interleaved ? 2 * j + 1 : j + half;
    const float x0 = to_f32(v[a]), x1 = to_f32(v[b]);
    v[a] = from_f32<T>(x0 * c - x1 * s);
    v[b] = from_f32<T>(x1 * c + x0 * s);
  }
}

template <typename T>
__global__ void copy_2d_kernel(Copy2dParams p) {
  const T* src = static_cast<const T*>(p.src);
  T* dst = static_cast<T*>(p.dst);
  const int64_t n = p.rows * p.width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / p.width, c = i % p.width;
    dst[r * p.dst_ld + p.dst_off + c] = src[r * p.src_ld + p.src_off + c];
  }
}

template <typename T>
__global__ void gather_rows_kernel(GatherRowsParams p) {
  const T* table = static_cast<const T*>(p.table);
  T* out = static_cast<T*>(p.out);
  const int64_t t = blockIdx.x;
  const int32_t id = p.ids[t];
  const bool valid = id >= 0 && id < p.num_rows;
  for (int64_t c = threadIdx.x; c < p.width; c += blockDim.x)
    out[t * p.width + c] = valid ? table[int64_t{id} * p.width + c] : T{};
}

template <typename T>
__global__ void store_kv_kernel(StoreKvParams p) {
  const int64_t t = blockIdx.x;
  const int32_t slot = p.slot_mapping[t];
  if (slot < 0) return;
  const int64_t block = slot / p.block_size, off = slot % p.block_size;
  if (block >= p.num_blocks) return;
  T* dst = static_cast<T*>(p.pool) + block * p.block_stride + p.layer_offset + off * p.entry_size +
           p.entry_offset;
  const T* src = static_cast<const T*>(p.src) + t * p.width;
  for (int c = threadIdx.x; c < p.width; c += blockDim.x) dst[c] = src[c];
}

template <typename T, typename B>
__global__ void bias_add_kernel(BiasAddParams p) {
  T* y = static_cast<T*>(p.y);
  const B* bias = static_cast<const B*>(p.bias);
  const int64_t n = p.m * p.n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = from_f32<T>(to_f32(y[i]) + to_f32(bias[i % p.n]));
}

__device__ __forceinline__ uint32_t hash_u32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

__global__ void fill_random_kernel(FillRandomParams p) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < p.n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float u = static_cast<float>(hash_u32(p.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i)) >> 8) *
                    (1.0f / 16777216.0f);
    p.out[i] = __float2bfloat16_rn((2.0f * u - 1.0f) * p.scale);
  }
}

// Grid-stride launches: enough blocks to fill 132 SMs several times over, no more.
unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 132 * 16 ? (blocks > 0 ? blocks : 1) : 132 * 16);
}

}  // namespace

void launch_rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  const int threads = rms_norm_threads(p.d);
  if (p.f32)
    rms_norm_kernel<float><<<static_cast<unsigned>(p.rows), threads, 0, stream>>>(p);
  else
    rms_norm_kernel<bf16><<<static_cast<unsigned>(p.rows), threads, 0, stream>>>(p);
}

void launch_add(const AddParams& p, cudaStream_t stream) {
  if (p.n == 0) return;
  if (p.f32)
    add_kernel<float><<<grid_for(p.n, 256), 256, 0, stream>>>(p);
  else
    add_kernel<bf16><<<grid_for(p.n, 256), 256, 0, stream>>>(p);
}

void launch_silu_mul(const SiluMulParams& p, cudaStream_t stream) {
  const int64_t n = p.rows * p.inter;
  if (n == 0) return;
  if (p.f32)
    silu_mul_kernel<float><<<grid_for(n, 256), 256, 0, stream>>>(p);
  else
    silu_mul_kernel<bf16><<<grid_for(n, 256), 256, 0, stream>>>(p);
}

void launch_rope(const RopeParams& p, cudaStream_t stream) {
  const int64_t n = p.tokens * p.heads * (p.rot_dim / 2);
  if (n == 0) return;
  if (p.f32)
    rope_kernel<float><<<grid_for(n, 256), 256, 0, stream>>>(p);
  else
    rope_kernel<bf16><<<grid_for(n, 256), 256, 0, stream>>>(p);
}

void launch_copy_2d(const Copy2dParams& p, cudaStream_t stream) {
  const int64_t n = p.rows * p.width;
  if (n == 0) return;
  if (p.elem_size == 2)
    copy_2d_kernel<uint16_t><<<grid_for(n, 256), 256, 0, stream>>>(p);
  else
    copy_2d_kernel<uint32_t><<<grid_for(n, 256), 256, 0, stream>>>(p);
}

void launch_gather_rows(const GatherRowsParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  const int threads = p.width >= 1024 ? 256 : 128;
  if (p.elem_size == 2)
    gather_rows_kernel<uint16_t><<<static_cast<unsigned>(p.tokens), threads, 0, stream>>>(p);
  else
    gather_rows_kernel<uint32_t><<<static_cast<unsigned>(p.tokens), threads, 0, stream>>>(p);
}

void launch_store_kv(const StoreKvParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  if (p.f32)
    store_kv_kernel<float><<<static_cast<unsigned>(p.tokens), 128, 0, stream>>>(p);
  else
    store_kv_kernel<bf16><<<static_cast<unsigned>(p.tokens), 128, 0, stream>>>(p);
}

void launch_bias_add(const BiasAddParams& p, cudaStream_t stream) {
  const int64_t n = p.m * p.n;
  if (n == 0) return;
  const unsigned g = grid_for(n, 256);
  if (p.y_f32 && p.bias_f32)
    bias_add_kernel<float, float><<<g, 256, 0, stream>>>(p);
  else if (p.y_f32)
    bias_add_kernel<float, bf16><<<g, 256, 0, stream>>>(p);
  else if (p.bias_f32)
    bias_add_kernel<bf16, float><<<g, 256, 0, stream>>>(p);
  else
    bias_add_kernel<bf16, bf16><<<g, 256, 0, stream>>>(p);
}

void launch_fill_random(const FillRandomParams& p, cudaStream_t stream) {
  if (p.n == 0) return;
  fill_random_kernel<<<grid_for(p.n, 256), 256, 0, stream>>>(p);
}

}  // namespace di::cuda
