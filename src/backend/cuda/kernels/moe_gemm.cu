// MoE decode path (see moe_grouped.h): per touched expert, GEMV-style kernels that stream each
// weight row once with 16-byte loads and apply it to all rows routed to the expert, MT at a time;
// then the deterministic weighted combine.
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/moe_grouped.h"

namespace di::cuda {
namespace {

constexpr int kDecodeThreads = 256;  // 8 warps, one weight row (pair) each
constexpr int kDecodeWarps = kDecodeThreads / 32;

// 8 bf16 packed in a uint4 -> 8 f32 (exact: bf16 is the top half of an f32).
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ float dot8(const float (&a)[8], const float (&b)[8], float acc) {
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(a[i], b[i], acc);
  return acc;
}

// Block (blockIdx.x, a): intermediate columns j = blockIdx.x * 8 + warp of the a-th touched
// expert; act[r, j] = silu(gate_j · x[token(r)]) * (up_j · x[token(r)]) for its rows r.
template <int MT>
__global__ void __launch_bounds__(kDecodeThreads) moe_gate_up_kernel(MoeDecodeParams p) {
  const int a = static_cast<int>(blockIdx.y);
  if (a >= *p.num_active) return;
  const int e = p.active[a];
  const int row0 = p.offsets[e], cnt = p.offsets[e + 1] - row0;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int j = static_cast<int>(blockIdx.x) * kDecodeWarps + warp;
  if (j >= p.inter) return;  // warp-uniform
  const int64_t h = p.hidden;
  const uint4* wg = reinterpret_cast<const uint4*>(p.gate_up + (int64_t{e} * 2 * p.inter + j) * h);
  const uint4* wu = reinterpret_cast<const uint4*>(p.gate_up + (int64_t{e} * 2 * p.inter + p.inter + j) * h);
  const int chunks = p.hidden / 8;
  for (int m0 = 0; m0 < cnt; m0 += MT) {
    const int mc = min(MT, cnt - m0);
    const uint4* xr[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const int r = row0 + m0 + min(m, mc - 1);  // clamped: always a valid row
      xr[m] = reinterpret_cast<const uint4*>(p.x + int64_t{p.row_token[r]} * h);
    }
    float ag[MT], au[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) ag[m] = au[m] = 0.0f;
#pragma unroll 2
    for (int c = lane; c < chunks; c += 32) {
      float g[8], u[8];
      unpack8(__ldg(wg + c), g);
      unpack8(__ldg(wu + c), u);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m < mc) {  // warp-uniform
          float xv[8];
          unpack8(__ldg(xr[m] + c), xv);
          ag[m] = dot8(g, xv, ag[m]);
          au[m] = dot8(u, xv, au[m]);
        }
      }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      if (m < mc) {
        const float gs = warp_sum(ag[m]), us = warp_sum(au[m]);
        if (lane == 0) {
          const float silu = gs / (1.0f + expf(-gs));
          p.act[int64_t{row0 + m0 + m} * p.inter + j] = silu * us;
        }
      }
    }
  }
}

// Block (blockIdx.x, a): output columns n = blockIdx.x * 8 + warp of the a-th touched expert;
// y[r, n] = down_n · act[r] for its rows r.
template <int MT>
__global__ void __launch_bounds__(kDecodeThreads) moe_down_kernel(MoeDecodeParams p) {
  const int a = static_cast<int>(blockIdx.y);
  if (a >= *p.num_active) return;
  const int e = p.active[a];
  const int row0 = p.offsets[e], cnt = p.offsets[e + 1] - row0;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int n = static_cast<int>(blockIdx.x) * kDecodeWarps + warp;
  if (n >= p.hidden) return;  // warp-uniform
  const int64_t inter = p.inter;
  const uint4* wd = reinterpret_cast<const uint4*>(p.down + (int64_t{e} * p.hidden + n) * inter);
  const int chunks = p.inter / 8;
  for (int m0 = 0; m0 < cnt; m0 += MT) {
    const int mc = min(MT, cnt - m0);
    const float4* ar[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m)
      ar[m] = reinterpret_cast<const float4*>(p.act + int64_t{row0 + m0 + min(m, mc - 1)} * inter);
    float acc[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[m] = 0.0f;
#pragma unroll 2
    for (int c = lane; c < chunks; c += 32) {
      float w[8];
      unpack8(__ldg(wd + c), w);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m < mc) {
          const float4 lo = ar[m][2 * c], hi = ar[m][2 * c + 1];  // written by the previous kernel
          const float av[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
          acc[m] = dot8(w, av, acc[m]);
        }
      }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      if (m < mc) {
        const float s = warp_sum(acc[m]);
        if (lane == 0) p.y[int64_t{row0 + m0 + m} * p.hidden + n] = s;
      }
    }
  }
}

__global__ void moe_combine_f32_kernel(MoeCombineF32Params p) {
  const int64_t t = blockIdx.x;
  const int32_t* rows = p.slot_row + t * p.top_k;
  const float* wts = p.topk_weights + t * p.top_k;
  for (int c = static_cast<int>(threadIdx.x); c < p.hidden; c += static_cast<int>(blockDim.x)) {
    float acc = 0.0f;
    for (int j = 0; j < p.top_k; ++j) {
      const int32_t r = rows[j];
      if (r >= 0) acc = fmaf(wts[j], p.y[int64_t{r} * p.hidden + c], acc);
    }
    p.out[t * p.hidden + c] = __float2bfloat16_rn(acc);
  }
}

template <int MT>
void launch_decode_mt(const MoeDecodeParams& p, cudaStream_t stream) {
  const dim3 block(kDecodeThreads);
  moe_gate_up_kernel<MT><<<dim3(ceil_div(p.inter, kDecodeWarps), static_cast<unsigned>(p.max_active)),
                           block, 0, stream>>>(p);
  moe_down_kernel<MT><<<dim3(ceil_div(p.hidden, kDecodeWarps), static_cast<unsigned>(p.max_active)),
                        block, 0, stream>>>(p);
}

}  // namespace

void launch_moe_decode(const MoeDecodeParams& p, cudaStream_t stream) {
  if (p.max_active <= 0 || p.hidden <= 0 || p.inter <= 0) return;
  if (p.rows_hint <= 1)
    launch_decode_mt<1>(p, stream);
  else if (p.rows_hint <= 2)
    launch_decode_mt<2>(p, stream);
  else if (p.rows_hint <= 4)
    launch_decode_mt<4>(p, stream);
  else
    launch_decode_mt<8>(p, stream);
}

void launch_moe_combine_f32(const MoeCombineF32Params& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  moe_combine_f32_kernel<<<static_cast<unsigned>(p.tokens), 256, 0, stream>>>(p);
}

}  // namespace di::cuda
