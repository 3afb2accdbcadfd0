// Fused decode kernels (see decode_fused.h).
//
// Napkin math, Llama-3.1-8B decode, batch 1: the attention prologue moves 48 head rows x 256 B in
// and out per layer, nothing; what it costs is launches. Unfused it is 3 copies + 2 ropes + 2 KV
// stores (+ 2 norms on Qwen3) = 7-9 launches per layer; fused it is one.
// DeepSeek-V2-Lite decode, batch 1: the MLA prologue moves 16 x 192 q values + 576 kv values
// (~7.4 KB in bf16) per layer; unfused it was 4 copies + 2 ropes + 1 norm + 2 KV stores + 2
// write_columns (11 launches); fused it is one (3 CTAs per token: the entry + 2 x 8 q heads).
#include <atomic>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/decode_fused.h"
#include "backend/cuda/kernels/head_linear.cuh"
#include "backend/cuda/kernels/qkv_rope_rows.cuh"

namespace di::cuda {
namespace {

constexpr int kFusedThreads = kQkvRowThreads;
constexpr int kMlaThreads = 256;

// Head row h of token t of the qkv GEMM's output (d = head_dim): where it goes (q_out, or K / V
// in the pool entry of the token's slot; store false when the slot is outside the pool), its
// norm weights and whether it is rotated. Read before griddepcontrol.wait (the rope/store kernels
// are PDL dependents, launch_decode): only what no kernel of the step writes — the batch metadata
// (copied before the step's first kernel, as the GQA decode kernel reads it) — so that after the
// wait only the qkv row is a round trip through L2 (run 28's timeline: ~3.7 us after the wait,
// three round trips).
template <typename T>
struct QkvHeadRow {
  const T* src;
  T* dst;
  const T* norm_w;
  int32_t pos;
  bool rotate;
  bool store;
  int d;
  // L1 prefetches (128-byte lines) by thread i of the group that runs the row: what the row's
  // math reads besides the row (the norm weights and the rope table row), issued before the wait.
  __device__ __forceinline__ void prefetch(const QkvRopeStoreKernelParams& p, unsigned i) const {
    if (!store) return;
    if (norm_w != nullptr) prefetch_l1_lines(norm_w, int64_t{d} * sizeof(T), i);
    if (rotate) prefetch_rope_row_l1(p.cos_sin, p.cos_sin_f32, pos, p.max_pos, d, i);
  }
};
template <typename T>
__device__ __forceinline__ QkvHeadRow<T> qkv_head_row(const QkvRopeStoreKernelParams& p, int64_t t,
                                                      int h, int d) {
  const int heads = p.num_q_heads + 2 * p.num_kv_heads;
  QkvHeadRow<T> r{static_cast<const T*>(p.qkv) + (t * heads + h) * d,
                  nullptr,
                  nullptr,
                  p.positions[t],
                  false,
                  true,
                  d};
  const int32_t slot = h < p.num_q_heads ? 0 : p.slot_mapping[t];
  if (h < p.num_q_heads) {
    r.dst = static_cast<T*>(p.q_out) + (t * p.num_q_heads + h) * d;
    r.norm_w = static_cast<const T*>(p.q_norm);
    r.rotate = true;
  } else {
    const int64_t block = slot / p.block_size, off = slot % p.block_size;
    r.store = slot >= 0 && block < p.num_blocks;
    const bool is_k = h < p.num_q_heads + p.num_kv_heads;
    const int g = is_k ? h - p.num_q_heads : h - p.num_q_heads - p.num_kv_heads;
    if (r.store)
      r.dst = static_cast<T*>(p.pool) + block * p.block_stride + p.layer_offset +
              off * p.entry_size + (is_k ? 0 : int64_t{p.num_kv_heads} * d) + int64_t{g} * d;
    r.norm_w = is_k ? static_cast<const T*>(p.k_norm) : nullptr;
    r.rotate = is_k;
  }
  return r;
}

template <typename T>
__global__ void __launch_bounds__(kFusedThreads) qkv_rope_store_kernel(QkvRopeStoreKernelParams p) {
  DI_TRACE_SCOPE(kTraceQkvRopeStore, 0);
  pdl_trigger();  // the next (PDL-launched) kernel may start loading its weights
  __shared__ float row_s[kMaxFusedHeadDim];
  __shared__ float scratch[32];
  const int heads = p.num_q_heads + 2 * p.num_kv_heads;
  // Every branch of the row's description depends only on blockIdx, so the whole CTA takes it
  // together (qkv_rope_rows needs every thread).
  const QkvHeadRow<T> r =
      qkv_head_row<T>(p, blockIdx.x / heads, static_cast<int>(blockIdx.x % heads), p.head_dim);
  r.prefetch(p, threadIdx.x);
  pdl_wait();
  DI_TRACE_WAITED();
  if (!r.store) return;
  qkv_rope_rows<T, 1>(r.src, r.dst, p.head_dim, r.norm_w, p.eps, r.rotate, r.pos,
                      RopeCosSin{p.cos_sin, p.cos_sin_f32, p.max_pos}, row_s, scratch);
}

// qkv_rope_store_kernel with one warp per head row (4 rows per CTA) and no barrier: the same
// metadata, prefetches and arithmetic (qkv_rope_row_warp). The default for bf16 since run 39;
// DEEPINFER_ROPE_STORE_WARP=0 (set_qkv_rope_store_warp(0)) takes the CTA per row.
template <typename T, int E>
__global__ void __launch_bounds__(kFusedThreads)
    qkv_rope_store_warp_kernel(QkvRopeStoreKernelParams p) {
  DI_TRACE_SCOPE(kTraceQkvRopeStore, 1);
  pdl_trigger();
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int heads = p.num_q_heads + 2 * p.num_kv_heads;
  const int64_t row = int64_t{blockIdx.x} * (kFusedThreads / 32) + warp;
  if (row >= p.tokens * heads) return;  // warp-uniform; reads nothing
  const QkvHeadRow<T> r = qkv_head_row<T>(p, row / heads, static_cast<int>(row % heads), 32 * E);
  r.prefetch(p, static_cast<unsigned>(lane));
  pdl_wait();
  DI_TRACE_WAITED();
  if (!r.store) return;
  qkv_rope_row_warp<T, E>(r.src, r.dst, r.norm_w, p.eps, r.rotate, r.pos,
                          RopeCosSin{p.cos_sin, p.cos_sin_f32, p.max_pos});
}

EnvSetting g_rope_store_warp{"DEEPINFER_ROPE_STORE_WARP", 1};
std::atomic<int64_t> g_rope_store_warp_launches{0};

struct RopeTable {
  const void* cos_sin;
  bool f32;
  int32_t max_pos;
  bool interleaved;
};

// Rotates the rope_dim values src[0..) by position pos into dst[0..) (may alias), pairs j =
// first, first + stride, ...; out-of-table positions copy. Rounds like elementwise.cu's rope.
template <typename T>
__device__ __forceinline__ void rope_row(const T* src, T* dst, int rope_dim, int32_t pos,
                                         RopeTable r, int first, int stride) {
  const int half = rope_dim / 2;
  const bool rotate = pos >= 0 && pos < r.max_pos;
  for (int j = first; j < half; j += stride) {
    const int a = r.interleaved ? 2 * j : j, b = r.interleaved ? 2 * j + 1 : j + half;
    if (!rotate) {
      dst[a] = src[a];
      dst[b] = src[b];
      continue;
    }
    float c, s;
    rope_cos_sin(r.cos_sin, r.f32, pos, rope_dim, j, c, s);
    const float x0 = to_f32(src[a]), x1 = to_f32(src[b]);
    dst[a] = from_f32<T>(x0 * c - x1 * s);
    dst[b] = from_f32<T>(x1 * c + x0 * s);
  }
}

// L1 prefetches (128-byte lines, thread i takes line i) of what token t's part y reads besides
// the rows the previous kernel writes: the rope table row and (y = 0) the latent norm weights.
// Neither is written by a kernel, so mla_rope_store_uk_kernel issues them before its wait.
__device__ __forceinline__ void mla_prefetch_part(const MlaRopeStoreKernelParams& p, int32_t pos,
                                                  int y) {
  prefetch_rope_row_l1(p.cos_sin, p.cos_sin_f32, pos, p.max_pos, p.rope_dim);
  // kv_a_norm is bf16: the one-launch W_UK kernel, the only caller, takes bf16 calls only.
  if (y == 0) prefetch_l1_lines(p.kv_a_norm, int64_t{p.latent_dim} * sizeof(bf16));
}

// Token t's part y of the MLA prologue (y = 0: the cache entry, y >= 1: q heads) by the CTA's
// kMlaThreads threads; pos = positions[t], slot = slot_mapping[t] (read by the caller). Every
// branch depends only on (t, y): the CTA takes it together. Loops that copy or scale issue a
// batch of loads before their stores (a store between two loads would keep the second behind it:
// one round trip per element otherwise).
template <typename T>
__device__ void mla_rope_store_part(const MlaRopeStoreKernelParams& p, int64_t t, int y,
                                    int32_t pos, int32_t slot) {
  constexpr int kBatch = 4;  // elements per thread in flight at once
  __shared__ float scratch[32];
  const int tid = static_cast<int>(threadIdx.x);
  const int dn = p.nope_dim, dr = p.rope_dim, dqk = dn + dr;
  const RopeTable rt{p.cos_sin, p.cos_sin_f32, p.max_pos, p.interleaved};
  if (y == 0) {
    // The cache entry.
    if (slot < 0) return;
    const int64_t block = slot / p.block_size, off = slot % p.block_size;
    if (block >= p.num_blocks) return;
    const T* src = static_cast<const T*>(p.kv_a) + t * p.kv_ld + p.kv_col;
    T* dst = static_cast<T*>(p.pool) + block * p.block_stride + p.layer_offset + off * p.entry_size;
    const T* w = static_cast<const T*>(p.kv_a_norm);
    const int lat = p.latent_dim;
    // k_pe (rotated below) into L1 while the latent is reduced.
    prefetch_l1_lines(src + lat, int64_t{dr} * sizeof(T));
    // rms_norm_kernel's two passes (the second from L1), its rounding of y.
    float ss = 0.0f;
    for (int i = tid; i < lat; i += kMlaThreads) {
      const float v = to_f32(src[i]);
      ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / static_cast<float>(lat) + p.eps);
    for (int i0 = tid; i0 < lat; i0 += kBatch * kMlaThreads) {
      float x[kBatch], wv[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int i = i0 + k * kMlaThreads;
        x[k] = i < lat ? to_f32(src[i]) : 0.0f;
        wv[k] = i < lat ? to_f32(w[i]) : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int i = i0 + k * kMlaThreads;
        if (i < lat) dst[i] = from_f32<T>(x[k] * inv * wv[k]);
      }
    }
    rope_row(src + lat, dst + lat, dr, pos, rt, tid, kMlaThreads);
    return;
  }
  // q heads [h0, h1): the nope part copied, the rope part rotated.
  const int h0 = (y - 1) * kMlaHeadsPerCta;
  const int nh = min(kMlaHeadsPerCta, p.num_heads - h0);
  const T* q = static_cast<const T*>(p.q) + t * p.q_ld + p.q_col + int64_t{h0} * dqk;
  T* q_nope = static_cast<T*>(p.q_nope) + (t * p.num_heads + h0) * dn;
  T* q_pe = static_cast<T*>(p.q_pe) + (t * p.num_heads + h0) * dr;
  const int half = dr / 2;
  // The rope parts' lines into L1 while the nope parts are copied (rope_row reads them by pair).
  const int lines = (dr * static_cast<int>(sizeof(T)) + 127) / 128;  // per head
  for (int i = tid; i < nh * lines; i += kMlaThreads) {
    asm volatile("prefetch.global.L1 [%0];" ::"l"(
        reinterpret_cast<const char*>(q + (i / lines) * dqk + dn) + (i % lines) * 128));
  }
  for (int i0 = tid; i0 < nh * dn; i0 += kBatch * kMlaThreads) {
    T v[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = i0 + k * kMlaThreads;
      if (i < nh * dn) v[k] = q[(i / dn) * dqk + i % dn];
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = i0 + k * kMlaThreads;
      if (i < nh * dn) q_nope[i] = v[k];
    }
  }
  for (int i = tid; i < nh * half; i += kMlaThreads) {
    const int h = i / half;
    rope_row(q + h * dqk + dn, q_pe + h * dr, dr, pos, rt, i % half, half);  // one pair
  }
}

template <typename T>
__global__ void __launch_bounds__(kMlaThreads) mla_rope_store_kernel(MlaRopeStoreKernelParams p) {
  pdl_trigger();  // the next (PDL-launched) kernel may start loading its weights
  pdl_wait();     // launched as a PDL dependent (launch_decode): nothing read before this
  const int y = static_cast<int>(blockIdx.y);
  mla_rope_store_part<T>(p, blockIdx.x, y, p.positions[blockIdx.x],
                         y == 0 ? p.slot_mapping[blockIdx.x] : -1);
}

// The prologue and the absorbed query in one launch (launch_mla_rope_store_uk): CTAs
// [0, rope_ctas) are mla_rope_store_kernel's (token, part) pairs, the rest each run two
// head_linear column groups (warps 0-3 and 4-7) over the q rows in place.
__global__ void __launch_bounds__(kMlaThreads)
    mla_rope_store_uk_kernel(MlaRopeStoreKernelParams p, HeadLinearParams uk, int32_t parts,
                             int32_t col_ctas) {
  DI_TRACE_SCOPE(kTraceMlaRopeStore, 0);
  pdl_trigger();
  const int b = static_cast<int>(blockIdx.x);
  const int rope_ctas = static_cast<int>(p.tokens) * parts;
  if (b < rope_ctas) {  // CTA-uniform
    // Before the wait: the token's position and slot (the batch metadata is copied before the
    // step's first kernel, as the GQA decode kernel assumes) and the L1 prefetches of the rope
    // row and the norm weights (run 28's timeline: CTA 0, the cache entry, ended last in 23 of 27
    // V2-Lite layers, 3.3 us after its wait, against ~2 for the W_UK CTAs).
    const int64_t t = b / parts;
    const int y = b % parts;
    const int32_t pos = p.positions[t];
    const int32_t slot = y == 0 ? p.slot_mapping[t] : -1;
    mla_prefetch_part(p, pos, y);
    pdl_wait();
    DI_TRACE_WAITED();
    mla_rope_store_part<bf16>(p, t, y, pos, slot);
    return;
  }
  extern __shared__ __align__(16) unsigned char smem[];
  const int j = b - rope_ctas, h = j / col_ctas, group = static_cast<int>(threadIdx.x) >> 7;
  const int col0 = (2 * (j % col_ctas) + group) * kHeadLinearCols;
  head_linear_cols(uk, col0, h, smem + group * head_linear_smem_bytes(uk.t, uk.k));
}

__global__ void moe_combine_f32_out_kernel(MoeCombineF32OutParams p) {
  const int64_t t = blockIdx.x;
  for (int c = threadIdx.x; c < p.hidden; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < p.top_k; ++j) {
      const int64_t row = p.slot_row[t * p.top_k + j];
      if (row < 0) continue;  // a skipped entry
      acc = fmaf(p.topk_weights[t * p.top_k + j], p.y[row * p.hidden + c], acc);
    }
    p.out[t * p.hidden + c] = acc;
  }
}

}  // namespace

void set_qkv_rope_store_warp(int on) {
  g_rope_store_warp.store(on);
}
int qkv_rope_store_warp() {
  return g_rope_store_warp.load();
}
int64_t qkv_rope_store_warp_launches() {
  return g_rope_store_warp_launches.load(std::memory_order_relaxed);
}

void launch_qkv_rope_store(const QkvRopeStoreKernelParams& p, cudaStream_t stream) {
  const int64_t rows = p.tokens * (p.num_q_heads + 2 * p.num_kv_heads);
  if (rows == 0) return;
  if (!p.f32 && g_rope_store_warp.load() != 0 &&
      (p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256)) {
    const auto wgrid = static_cast<unsigned>(ceil_div(rows, int64_t{kFusedThreads / 32}));
    auto kernel = p.head_dim == 64    ? qkv_rope_store_warp_kernel<bf16, 2>
                  : p.head_dim == 128 ? qkv_rope_store_warp_kernel<bf16, 4>
                                      : qkv_rope_store_warp_kernel<bf16, 8>;
    g_rope_store_warp_launches.fetch_add(1, std::memory_order_relaxed);
    (void)launch_decode(kPdlRopeStore, kernel, wgrid, kFusedThreads, 0, stream, p);
    return;
  }
  const auto grid = static_cast<unsigned>(rows);
  (void)(p.f32 ? launch_decode(kPdlRopeStore, qkv_rope_store_kernel<float>, grid, kFusedThreads, 0,
                               stream, p)
               : launch_decode(kPdlRopeStore, qkv_rope_store_kernel<bf16>, grid, kFusedThreads, 0,
                               stream, p));
}

void launch_mla_rope_store(const MlaRopeStoreKernelParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  const dim3 grid(static_cast<unsigned>(p.tokens), 1u + ceil_div(p.num_heads, kMlaHeadsPerCta));
  (void)(p.f32 ? launch_decode(kPdlRopeStore, mla_rope_store_kernel<float>, grid, kMlaThreads, 0,
                               stream, p)
               : launch_decode(kPdlRopeStore, mla_rope_store_kernel<bf16>, grid, kMlaThreads, 0,
                               stream, p));
}

bool mla_rope_store_uk_supported(const MlaRopeStoreKernelParams& p, int64_t lat) {
  const int64_t dqk = int64_t{p.nope_dim} + p.rope_dim;
  return !p.f32 && head_linear_small_supported(p.tokens, p.num_heads, p.nope_dim, lat) &&
         p.q_ld % 8 == 0 && p.q_col % 8 == 0 && dqk % 8 == 0 &&
         reinterpret_cast<uintptr_t>(p.q) % 16 == 0 &&
         2 * head_linear_smem_bytes(static_cast<int>(p.tokens), p.nope_dim) <= 160 * 1024;
}

cudaError_t launch_mla_rope_store_uk(const MlaRopeStoreKernelParams& p, const void* w_uk_t,
                                     void* q_lat, int32_t lat, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  const int32_t dqk = p.nope_dim + p.rope_dim;
  const HeadLinearParams uk{static_cast<const bf16*>(p.q) + p.q_col,
                            w_uk_t,
                            q_lat,
                            static_cast<int32_t>(p.tokens),
                            p.num_heads,
                            p.nope_dim,
                            lat,
                            p.q_ld,
                            dqk};
  const int32_t parts = 1 + ceil_div(p.num_heads, kMlaHeadsPerCta);
  const int32_t col_ctas = ceil_div(lat, 2 * kHeadLinearCols);
  const auto grid = static_cast<unsigned>(p.tokens * parts + int64_t{p.num_heads} * col_ctas);
  const int smem = 2 * head_linear_smem_bytes(uk.t, uk.k);
  const cudaError_t err =
      open_dynamic_smem(reinterpret_cast<const void*>(&mla_rope_store_uk_kernel), smem);
  if (err != cudaSuccess) return err;
  return launch_decode(kPdlRopeStore, mla_rope_store_uk_kernel, grid, kMlaThreads,
                       static_cast<size_t>(smem), stream, p, uk, parts, col_ctas);
}

void launch_moe_combine_f32_out(const MoeCombineF32OutParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  moe_combine_f32_out_kernel<<<static_cast<unsigned>(p.tokens), 256, 0, stream>>>(p);
}

}  // namespace di::cuda
