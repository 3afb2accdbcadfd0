// The split combine folded into the output projection: attn_o_proj.h has the design.
#include "backend/cuda/kernels/attn_o_proj.h"

#include <algorithm>

#include "backend/cuda/kernels/common.cuh"

namespace di::cuda {
namespace {

constexpr int kD = kAttnOProjDim;
constexpr int kGroupThreads = 128;  // combine_splits_kernel's block size: its reduction tree
constexpr int kSplitChunk = 256;    // split weights per pass (combine_split_row_dim's)
constexpr int kMaxRows = 128;       // R at most (y_s)
// H heads per CTA (a 128-thread group each): H · 128 W_o columns, H · 16 16-byte chunks per row.
template <int H>
constexpr int kThreadsOf = H* kGroupThreads;
template <int H>
constexpr int kChunksOf = H* kD / 8;
// The o values of the first kPre splits are loaded with the (max, sum) pairs, so that the
// merge's loads are one round trip through L2 up to kPre splits (33 at ctx 2048, split 64).
constexpr int kPre = 36;

// Reductions over one 128-thread group (named barrier 1 + g), in block_sum / block_max's tree
// for a block of 128 threads, so the merge has combine_splits_kernel's bits.
__device__ __forceinline__ void group_bar(int g) {
  asm volatile("bar.sync %0, %1;" ::"r"(1 + g), "n"(kGroupThreads) : "memory");
}
__device__ __forceinline__ float group_sum(float v, float* scratch, int g) {
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
  v = warp_sum(v);
  group_bar(g);  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  group_bar(g);
  v = lane < 4 ? scratch[lane] : 0.0f;
  return warp_sum(v);
}
__device__ __forceinline__ float group_max(float v, float* scratch, int g) {
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
  v = warp_max(v);
  group_bar(g);
  if (lane == 0) scratch[warp] = v;
  group_bar(g);
  v = lane < 4 ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

// The CTA's o values as floats in two planes, as the one-row GEMV stages x: chunk k's values
// 0-3 at lo[4k], 4-7 at hi[4k] (lane L's 16-byte reads of chunk L + 32 i are consecutive).
template <int kChunks>
struct OPlanes {
  float lo[kChunks * 4];
  float hi[kChunks * 4];
};

// Registers: a CTA must fit beside the GQA decode kernel's (H = 4: 512 threads at <= 64
// registers; H = 2: 256 threads at <= 80, two CTAs per SM beside it).
template <int H>
__global__ void __launch_bounds__(kThreadsOf<H>, H == 4 ? 2 : 3)
    attn_o_proj_kernel(AttnOProjParams p) {
  constexpr int kH = H, kThreads = kThreadsOf<H>, kChunks = kChunksOf<H>, kCols = H * kD;
  constexpr int kPerLane = kChunks / 32;  // 16-byte chunks of a W_o row per lane
  static_assert(kChunks % 32 == 0, "a warp reads a W_o row in 512-byte pieces");
  DI_TRACE_SCOPE(kTraceAttnOProj, static_cast<uint32_t>(p.hidden));
  extern __shared__ __align__(16) uint4 w_s[];  // [R][kChunks]
  __shared__ __align__(16) OPlanes<kChunks> o_s;
  __shared__ float y_s[kMaxRows];  // [R] this CTA's partial rows
  __shared__ float split_w[kH][kSplitChunk];
  __shared__ float scratch[kH][2][4];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = tid / kGroupThreads, d = tid % kGroupThreads;
  const int rank = static_cast<int>(blockIdx.x), ranks = static_cast<int>(gridDim.x);
  const int R = p.rows_per_cta, row0 = static_cast<int>(blockIdx.y) * R;
  const int64_t k = int64_t{p.num_q_heads} * kD;

  // Before the wait: this CTA's W_o block (weights: no kernel writes them).
  {
    const bf16* src = p.w + int64_t{row0} * k + int64_t{rank} * kCols;
    for (int i = tid; i < R * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i - r * kChunks;
      cp_async16(w_s + i, src + r * k + c * 8, 16);
    }
    cp_async_commit();
  }
  pdl_wait();  // the partials are the GQA decode kernel's
  DI_TRACE_WAITED();
  pdl_trigger();  // the router may start loading its weights

  // Head h = rank·H + g, output dim d: combine_split_row_dim's arithmetic at 128 threads.
  {
    const int rows = p.num_q_heads, ns = p.num_splits;
    const int64_t row = int64_t{rank} * kH + g;
    const float* po = p.partial_o + row * kD + d;
    const int64_t step = int64_t{rows} * kD;
    float ov[kPre];
#pragma unroll
    for (int j = 0; j < kPre; ++j) ov[j] = j < ns ? po[j * step] : 0.0f;
    const float* ml = p.partial_ml;
    float m = -INFINITY;
#pragma unroll 1
    for (int sp = d; sp < ns; sp += kGroupThreads) m = fmaxf(m, ml[(sp * rows + row) * 2]);
    m = group_max(m, scratch[g][0], g);
    float den = 0.0f;
#pragma unroll 1
    for (int sp = d; sp < ns; sp += kGroupThreads) {
      const float ms = ml[(sp * rows + row) * 2];
      if (ms != -INFINITY) den += expf(ms - m) * ml[(sp * rows + row) * 2 + 1];
    }
    den = group_sum(den, scratch[g][1], g);
    float o = 0.0f;
    for (int c0 = 0; c0 < ns; c0 += kSplitChunk) {
      const int cn = min(kSplitChunk, ns - c0);
      group_bar(g);  // split_w of the previous chunk is consumed
#pragma unroll 1
      for (int j = d; j < cn; j += kGroupThreads) {
        const float ms = ml[((c0 + j) * rows + row) * 2];
        split_w[g][j] = ms == -INFINITY ? 0.0f : expf(ms - m);
      }
      group_bar(g);
      int j = 0;
      if (c0 == 0) {
#pragma unroll
        for (int i = 0; i < kPre; ++i)
          if (i < cn) o += split_w[g][i] * ov[i];
        j = min(kPre, cn);
      }
      const float* pc = po + c0 * step;
#pragma unroll 8
      for (; j < cn; ++j) o += split_w[g][j] * pc[j * step];
    }
    // The attention value as combine_splits_kernel writes it (bf16), as the GEMV reads it.
    const float a = round_bf16(den > 0.0f ? o / den : 0.0f);
    const int c = g * kD + d, chunk = c / 8, e = c % 8;
    (e < 4 ? o_s.lo : o_s.hi)[chunk * 4 + (e & 3)] = a;
  }
  cp_async_wait<0>();
  __syncthreads();  // o and this thread's W_o copies -> every warp
  DI_TRACE_MARK();  // merged, W_o landed

  // y[r] = Σ_c W[r, c] · o[c] for the block's rows: warp w takes rows w, w + W, ...; lane L
  // chunks L, L + 32, ... (the GEMV's lane order), then warp_sum.
  {
    float ov[kPerLane][8];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const float4 a = reinterpret_cast<const float4*>(o_s.lo)[lane + 32 * i];
      const float4 b = reinterpret_cast<const float4*>(o_s.hi)[lane + 32 * i];
      ov[i][0] = a.x, ov[i][1] = a.y, ov[i][2] = a.z, ov[i][3] = a.w;
      ov[i][4] = b.x, ov[i][5] = b.y, ov[i][6] = b.z, ov[i][7] = b.w;
    }
#pragma unroll 1
    for (int r = warp; r < R; r += kThreads / 32) {
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        float w[8];
        unpack8(w_s[r * kChunks + lane + 32 * i], w);
        acc = dot8(w, ov[i], acc);
      }
      acc = warp_sum(acc);
      if (lane == 0) y_s[r] = acc;
    }
  }
  // This CTA's partial rows to L2, then arrival at the row block's counter; the last of its
  // ranks to arrive sums the ranks' partials in rank order (head order), rounds as the GEMV's
  // store (store_out: bf16(acc), then bf16(res + y)) and adds the residual.
  __syncthreads();
  float* part = p.partials + int64_t{blockIdx.y} * ranks * R;
  for (int r = tid; r < R; r += kThreads) part[rank * R + r] = y_s[r];
  __shared__ bool is_last;
  __syncthreads();
  if (tid == 0)
    is_last =
        atomic_add_acq_rel_gpu(p.counters + blockIdx.y, 1u) == static_cast<unsigned>(ranks - 1);
  __syncthreads();
  if (!is_last) return;
  for (int r = tid; r < R; r += kThreads) {
    float acc = 0.0f;
    for (int q = 0; q < ranks; ++q) acc += __ldcg(part + q * R + r);
    p.x[row0 + r] = from_f32<bf16>(to_f32(p.x[row0 + r]) + round_bf16(acc));
  }
  if (tid == 0) p.counters[blockIdx.y] = 0;  // for the next launch (stream order)
}

}  // namespace

int attn_o_proj_rows_per_cta(int hidden, int num_q_heads, int num_sms, int heads_per_cta) {
  const int h = heads_per_cta;
  // Bit-for-bit batch invariance (design.md "Determinism") keeps the GEMV's summation order.
  if (batch_invariant_env() || (h != 2 && h != 4) || num_q_heads % h != 0) return 0;
  const int ranks = num_q_heads / h, cols = h * kD;
  const int per_sm = h == 4 ? 1 : 2;  // CTAs of the grid per SM (H = 2: 64 KB each)
  for (int r = std::min(kMaxRows, kAttnOProjMaxSmemW / per_sm / (cols * 2)); r >= 16; r -= 16) {
    if (hidden % r != 0) continue;
    return int64_t{hidden / r} * ranks <= int64_t{num_sms} * per_sm ? r : 0;
  }
  return 0;
}

namespace {
template <int H>
cudaError_t launch_heads(const AttnOProjParams& p, cudaStream_t stream) {
  const int ranks = p.num_q_heads / H;
  const int smem = p.rows_per_cta * H * kD * 2;
  cudaError_t err = open_dynamic_smem(reinterpret_cast<const void*>(&attn_o_proj_kernel<H>), smem);
  if (err != cudaSuccess) return err;
  // The largest shared-memory carveout (as measured in run 34), set on every launch: function
  // attributes are per device, and this path is opt-in.
  err = cudaFuncSetAttribute(attn_o_proj_kernel<H>, cudaFuncAttributePreferredSharedMemoryCarveout,
                             100);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(ranks), static_cast<unsigned>(p.hidden / p.rows_per_cta));
  return launch_pdl(attn_o_proj_kernel<H>, grid, dim3(kThreadsOf<H>), static_cast<size_t>(smem),
                    stream, p);
}
}  // namespace

cudaError_t launch_attn_o_proj(const AttnOProjParams& p, cudaStream_t stream) {
  return p.heads_per_cta == 2 ? launch_heads<2>(p, stream) : launch_heads<4>(p, stream);
}

}  // namespace di::cuda
