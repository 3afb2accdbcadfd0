// MoE decode path (see moe_grouped.h): per touched expert, GEMV-style kernels that stream each
// weight row once with 16-byte loads and apply it to all rows routed to the expert, MT at a time;
// then the deterministic weighted combine.
#include <algorithm>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/moe_grouped.h"
#include "core/env.h"

namespace di::cuda {
namespace {

constexpr int kDecodeThreads = 256;  // 8 warps, one weight row (pair) each
constexpr int kDecodeWarps = kDecodeThreads / 32;

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

// ---- v2 decode kernels (default; DEEPINFER_MOE_DECODE=v1 selects the kernels above) ----
// Same math, per lane the same chunks in the same order, so the results equal v1's bit for bit;
// only the schedule differs: each warp owns R weight rows (gate_up: R gate rows + the R matching
// up rows) and issues the 16-byte loads of U chunk-iterations of all its rows before any FMA
// (R * U, resp. 2 * R * U, loads in flight per lane), streamed past L1 (no allocate) so the x /
// act rows stay cached; each x / act load is reused for R rows.

template <int MT, int R, int U>
__global__ void __launch_bounds__(kDecodeThreads) moe_gate_up_v2_kernel(MoeDecodeParams p) {
  const int a = static_cast<int>(blockIdx.y);
  if (a >= *p.num_active) return;
  const int e = p.active[a];
  const int row0 = p.offsets[e], cnt = p.offsets[e + 1] - row0;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int j0 = (static_cast<int>(blockIdx.x) * kDecodeWarps + warp) * R;
  if (j0 >= p.inter) return;  // warp-uniform
  const int64_t h = p.hidden;
  const uint4* wrow[2 * R];  // [r]: gate row j0 + r, [R + r]: up row j0 + r (clamped, not stored)
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t j = min(j0 + r, p.inter - 1);
    wrow[r] = reinterpret_cast<const uint4*>(p.gate_up + (int64_t{e} * 2 * p.inter + j) * h);
    wrow[R + r] = reinterpret_cast<const uint4*>(p.gate_up + (int64_t{e} * 2 * p.inter + p.inter + j) * h);
  }
  const int chunks = p.hidden / 8;
  for (int m0 = 0; m0 < cnt; m0 += MT) {
    const int mc = min(MT, cnt - m0);
    const uint4* xr[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const int r = row0 + m0 + min(m, mc - 1);  // clamped: always a valid row
      xr[m] = reinterpret_cast<const uint4*>(p.x + int64_t{p.row_token[r]} * h);
    }
    float acc[2 * R][MT];
#pragma unroll
    for (int r = 0; r < 2 * R; ++r)
#pragma unroll
      for (int m = 0; m < MT; ++m) acc[r][m] = 0.0f;
    for (int c0 = lane; c0 < chunks; c0 += 32 * U) {
      uint4 wv[2 * R][U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + 32 * u;
#pragma unroll
        for (int r = 0; r < 2 * R; ++r) wv[r][u] = c < chunks ? ld_stream(wrow[r] + c) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + 32 * u;
        if (c < chunks) {
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            if (m < mc) {  // warp-uniform
              float xv[8];
              unpack8(__ldg(xr[m] + c), xv);
#pragma unroll
              for (int r = 0; r < 2 * R; ++r) {
                float wf[8];
                unpack8(wv[r][u], wf);
                acc[r][m] = dot8(wf, xv, acc[r][m]);
              }
            }
          }
        }
      }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      if (m < mc) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float gs = warp_sum(acc[r][m]), us = warp_sum(acc[R + r][m]);
          if (lane == 0 && j0 + r < p.inter) {
            const float silu = gs / (1.0f + expf(-gs));
            p.act[int64_t{row0 + m0 + m} * p.inter + j0 + r] = silu * us;
          }
        }
      }
    }
  }
}

template <int MT, int R, int U>
__global__ void __launch_bounds__(kDecodeThreads) moe_down_v2_kernel(MoeDecodeParams p) {
  const int a = static_cast<int>(blockIdx.y);
  if (a >= *p.num_active) return;
  const int e = p.active[a];
  const int row0 = p.offsets[e], cnt = p.offsets[e + 1] - row0;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int n0 = (static_cast<int>(blockIdx.x) * kDecodeWarps + warp) * R;
  if (n0 >= p.hidden) return;  // warp-uniform
  const int64_t inter = p.inter;
  const uint4* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t n = min(n0 + r, p.hidden - 1);  // clamped, not stored
    wrow[r] = reinterpret_cast<const uint4*>(p.down + (int64_t{e} * p.hidden + n) * inter);
  }
  const int chunks = p.inter / 8;
  for (int m0 = 0; m0 < cnt; m0 += MT) {
    const int mc = min(MT, cnt - m0);
    const float4* ar[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m)
      ar[m] = reinterpret_cast<const float4*>(p.act + int64_t{row0 + m0 + min(m, mc - 1)} * inter);
    float acc[R][MT];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < MT; ++m) acc[r][m] = 0.0f;
    for (int c0 = lane; c0 < chunks; c0 += 32 * U) {
      uint4 wv[R][U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + 32 * u;
#pragma unroll
        for (int r = 0; r < R; ++r) wv[r][u] = c < chunks ? ld_stream(wrow[r] + c) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + 32 * u;
        if (c < chunks) {
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            if (m < mc) {
              const float4 lo = ar[m][2 * c], hi = ar[m][2 * c + 1];  // written by the previous kernel
              const float av[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
              for (int r = 0; r < R; ++r) {
                float wf[8];
                unpack8(wv[r][u], wf);
                acc[r][m] = dot8(wf, av, acc[r][m]);
              }
            }
          }
        }
      }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      if (m < mc) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float s = warp_sum(acc[r][m]);
          if (lane == 0 && n0 + r < p.hidden) p.y[int64_t{row0 + m0 + m} * p.hidden + n0 + r] = s;
        }
      }
    }
  }
}

// ---- one token (T = 1, v2 only): no alignment and no combine kernel ----
// gate_up: block (x, j) = intermediate columns of slot j's expert, act[j] as v2 / MT = 1 computes
// act[row of slot j]. down: warp n sums, j ascending, fmaf(w_j, down_e(j),n · act[j]) over the
// valid slots and writes out[n] (bf16): the decode kernels' y row and the combine's sum bit for bit.

// U: chunk-iterations of loads in flight per lane; MinBlocks: resident CTAs per SM asked of the
// compiler (registers <= 65536 / (256 · MinBlocks)). The sums do not depend on either (per lane
// chunks c = lane + 32 i in i order, then warp_sum). Qwen3-30B-A3B has 8 slots x 768 columns =
// 6,144 warps of work: at U = 4 (60 registers, 4 CTAs = 32 warps per SM: 4,224 resident on 132
// SMs) that is 1.45 waves; at U = 2 with 6 CTAs per SM (40 registers: 6,336 warps) it is one.
// H200, run 17, batch 1 (graphs): Qwen3 272.5 -> 285.5 tok/s, V2-Lite 364.6 -> 370.2 (2x6 vs
// 4x4); 2x8 (32 registers, a 24-byte spill) 276.1 / 354.9.
// x = rms_norm(norm_x) · norm_w into shared memory by the CTA's 256 threads, bitwise
// rms_norm_kernel's h (elementwise.cu) at its R = rms_norm_threads(d) threads: virtual thread v
// < R sums x[v + R·m]² in m order, warp sums, then warp 0 sums the R/32 warp sums (block_sum's
// tree); y = bf16(x · inv · w). The shared slots' copy of the router's h (moe.cu, norm_rows).
__device__ void t1_norm_x(const MoeDecodeT1Params& p, __nv_bfloat16* hs, float* red) {
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31;
  const int d = p.hidden, R = rms_norm_threads(d);
  for (int v = tid; v < R; v += kDecodeThreads) {  // R/32 warps of the R-thread kernel
    float ss = 0.0f;
    for (int i = v; i < d; i += R) {
      const float f = __bfloat162float(__ldcg(p.norm_x + i));
      ss += f * f;
    }
    ss = warp_sum(ss);
    if (lane == 0) red[v >> 5] = ss;
  }
  __syncthreads();
  if (tid < 32) {
    float w = lane < R / 32 ? red[lane] : 0.0f;
    w = warp_sum(w);
    if (lane == 0) red[32] = w;
  }
  __syncthreads();
  const float inv = rsqrtf(red[32] / static_cast<float>(d) + p.eps);
  for (int i = tid; i < d; i += kDecodeThreads)
    hs[i] = __float2bfloat16_rn(__bfloat162float(__ldcg(p.norm_x + i)) * inv *
                                __bfloat162float(__ldg(p.norm_w + i)));
  __syncthreads();
}

// act[slot, j] = silu(gate · x) · (up · x) from a warp's per-lane partial dots (warp_sum, lane 0
// stores): the one-token gate_up's end, in both one-token forms.
__device__ __forceinline__ void t1_store_act(const MoeDecodeT1Params& p, int slot, int j, float ag,
                                             float au, int lane) {
  const float gs = warp_sum(ag), us = warp_sum(au);
  if (lane == 0) {
    const float silu = gs / (1.0f + expf(-gs));
    p.act[int64_t{slot} * p.inter + j] = silu * us;
  }
}

template <int U, int MinBlocks>
__global__ void __launch_bounds__(kDecodeThreads, MinBlocks)
    moe_gate_up_t1_kernel(MoeDecodeT1Params p) {
  DI_TRACE_SCOPE(kTraceMoeGateUpT1, 0);
  // shared_early: the shared slots' CTAs first (scheduled first under PDL), routed slots after.
  const int y = static_cast<int>(blockIdx.y);
  const int slot = !p.shared_early ? y : (y < p.shared_slots ? p.top_k + y : y - p.shared_slots);
  const bool routed = slot < p.top_k;
  const bool own_x = p.shared_early && !routed;  // CTA-uniform
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int j = static_cast<int>(blockIdx.x) * kDecodeWarps + warp;
  const int64_t h = p.hidden;
  // 128-byte alignment: every extern __shared__ array of a translation unit is one symbol with
  // the largest alignment declared; until run 46 the persistent one-token kernel here declared
  // 128, which put this array (and act_s below) at offset 0x100 after `red`, the layout every
  // measurement used. Kept so that the code is byte-identical to the measured one.
  extern __shared__ __align__(128) __nv_bfloat16 x_own[];  // [hidden] when own_x
  __shared__ float red[33];
  const __nv_bfloat16* gate_row;
  const __nv_bfloat16* up_row;
  if (routed) {
    pdl_wait();  // the ids are the router's
    DI_TRACE_WAITED();
    const int e = p.topk_ids[slot];
    if (e < 0 || e >= p.num_experts) return;  // skipped slot (the combine skips it too)
    gate_row = p.gate_up + (int64_t{e} * 2 * p.inter + j) * h;
    up_row = p.gate_up + (int64_t{e} * 2 * p.inter + p.inter + j) * h;
  } else {  // shared expert columns: weights known before the router ends
    const int64_t q = slot - p.top_k, cols = int64_t{p.shared_slots} * p.inter;
    gate_row = p.shared_gate_up + (q * p.inter + j) * h;
    up_row = p.shared_gate_up + (cols + q * p.inter + j) * h;
  }
  pdl_trigger();
  // own_x never waits: norm_x (written before the router ran) is read through L2; the router
  // writes nothing this CTA reads.
  if (own_x) t1_norm_x(p, x_own, red);
  if (j >= p.inter) return;  // warp-uniform
  const uint4* wg = reinterpret_cast<const uint4*>(gate_row);
  const uint4* wu = reinterpret_cast<const uint4*>(up_row);
  const uint4* xr = reinterpret_cast<const uint4*>(own_x ? x_own : p.x);
  const int chunks = p.hidden / 8;
  float ag = 0.0f, au = 0.0f;
  bool waited = routed || own_x;
  for (int c0 = lane; c0 < chunks; c0 += 32 * U) {
    uint4 g[U], u[U];
#pragma unroll
    for (int i = 0; i < U; ++i) {
      const int c = c0 + 32 * i;
      g[i] = c < chunks ? ld_stream(wg + c) : make_uint4(0, 0, 0, 0);
      u[i] = c < chunks ? ld_stream(wu + c) : make_uint4(0, 0, 0, 0);
    }
    if (!waited) {  // x is the router's output
      pdl_wait();
      DI_TRACE_WAITED();
      waited = true;
    }
#pragma unroll
    for (int i = 0; i < U; ++i) {
      const int c = c0 + 32 * i;
      if (c < chunks) {
        float xv[8], gf[8], uf[8];
        unpack8(own_x ? xr[c] : __ldg(xr + c), xv);
        unpack8(g[i], gf);
        unpack8(u[i], uf);
        ag = dot8(gf, xv, ag);
        au = dot8(uf, xv, au);
      }
    }
  }
  t1_store_act(p, slot, j, ag, au, lane);
}

// Slot s of the down kernels: its down row n (null when skipped) and weight. Routed slots s <
// top_k: expert topk_ids[s] (ids outside [0, E) skipped); shared slots after them: weight 1 (the
// add of the shared MLP's output: fmaf(1, y, out) = y + out); slots past both: skipped.
struct T1DownRow {
  const uint4* row;
  float weight;
};
// The routed slots' ids and weights, lane j holding slot j (j < 32; later slots are loaded when
// used): one round of L2 loads (__ldcg) at the start of the down kernels instead of one before
// each slot pair's weight loads. Through L2 because with early_rows they are read before
// griddepcontrol.wait, when this SM's L1 may still hold an earlier layer's router output at the
// same address.
struct T1Slots {
  int e = -1;
  float w = 0.0f;
};
__device__ __forceinline__ T1Slots t1_load_slots(const MoeDecodeT1Params& p, int lane) {
  T1Slots s;
  if (lane < p.top_k) {
    s.e = __ldcg(p.topk_ids + lane);
    s.w = __ldcg(p.topk_weights + lane);
  }
  return s;
}
// Every lane calls it with the same slot (the shuffles).
__device__ __forceinline__ T1DownRow t1_down_row(const MoeDecodeT1Params& p, const T1Slots& sl,
                                                 int slot, int n) {
  if (slot < p.top_k) {
    const bool held = slot < 32;  // warp-uniform
    const int e = held ? __shfl_sync(0xffffffffu, sl.e, slot) : __ldcg(p.topk_ids + slot);
    const float w = held ? __shfl_sync(0xffffffffu, sl.w, slot) : __ldcg(p.topk_weights + slot);
    if (e < 0 || e >= p.num_experts) return {nullptr, 0.0f};
    return {reinterpret_cast<const uint4*>(p.down + (int64_t{e} * p.hidden + n) * p.inter), w};
  }
  const int q = slot - p.top_k;
  if (q >= p.shared_slots) return {nullptr, 0.0f};
  const int64_t cols = int64_t{p.shared_slots} * p.inter;
  return {reinterpret_cast<const uint4*>(p.shared_down + n * cols + int64_t{q} * p.inter), 1.0f};
}

// The residual element of column n (0 without one), loaded right after the wait by the lane that
// stores n: read in t1_store it was one more round trip at the kernel's very end.
__device__ __forceinline__ float t1_residual(const MoeDecodeT1Params& p, int n) {
  return p.residual ? __bfloat162float(p.residual[n]) : 0.0f;
}
// The down kernels' store: the combine sum in bf16, or added to the residual (the add kernel);
// res = t1_residual(p, n).
__device__ __forceinline__ void t1_store(const MoeDecodeT1Params& p, int n, float sum, float res) {
  const __nv_bfloat16 y = __float2bfloat16_rn(sum);
  p.out[n] = p.residual ? __float2bfloat16_rn(res + __bfloat162float(y)) : y;
}

// down: 4 warps per CTA (more, smaller CTAs spread evenly at grid ⌈H/4⌉), two slots per pass
// with kT1DownU chunk-iterations of both rows' loads issued ahead; their sums are folded into the
// combine sum in slot order. Between two pairs the loads drain (sum, then the next pair's loads):
// moe_down_t1_pipe_kernel below keeps them in flight; this one stays for inter > 32·kT1DownU and
// as DEEPINFER_MOE_T1_DOWN=v1.
constexpr int kT1DownWarps = 4;
constexpr int kT1DownU = 8;

__global__ void __launch_bounds__(kT1DownWarps * 32) moe_down_t1_kernel(MoeDecodeT1Params p) {
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int n = static_cast<int>(blockIdx.x) * kT1DownWarps + warp;
  if (p.early_trigger) pdl_trigger();
  pdl_wait();  // (early_rows is the pipelined kernel's: this one runs as a plain launch)
  if (n >= p.hidden) return;  // warp-uniform
  const T1Slots sl = t1_load_slots(p, lane);
  const float res = lane == 0 ? t1_residual(p, n) : 0.0f;
  const int chunks = p.inter / 8;
  const int slots = p.top_k + p.shared_slots;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  float out = 0.0f;  // the combine sum (every lane holds it; lane 0 stores)
  for (int s0 = 0; s0 < slots; s0 += 2) {
    T1DownRow r[2];
    const float4* ar[2];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      r[q] = t1_down_row(p, sl, s0 + q, n);  // warp-uniform
      ar[q] = reinterpret_cast<const float4*>(p.act + int64_t{min(s0 + q, slots - 1)} * p.inter);
    }
    float acc[2] = {0.0f, 0.0f};
    for (int c0 = lane; c0 < chunks; c0 += 32 * kT1DownU) {
      uint4 wv[2][kT1DownU];
#pragma unroll
      for (int i = 0; i < kT1DownU; ++i) {
        const int c = c0 + 32 * i;
#pragma unroll
        for (int q = 0; q < 2; ++q)
          wv[q][i] = r[q].row && c < chunks ? ld_stream(r[q].row + c) : zero;
      }
#pragma unroll
      for (int i = 0; i < kT1DownU; ++i) {
        const int c = c0 + 32 * i;
        if (c < chunks) {
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            if (r[q].row) {
              float w[8];
              unpack8(wv[q][i], w);
              const float4 lo = ar[q][2 * c], hi = ar[q][2 * c + 1];  // written by the previous kernel
              const float av[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
              acc[q] = dot8(w, av, acc[q]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const float y = warp_sum(acc[q]);
      if (r[q].row) out = fmaf(r[q].weight, y, out);
    }
  }
  if (lane == 0) t1_store(p, n, out, res);
}

// Pipelined down for rows that one load batch covers (chunks = inter / 8 <= 32·U): two register
// buffers of slot pairs, so pair k + 1's weight loads are in flight while pair k is summed:
//   load(P0)  [load(P1) sum(P0)]  [load(P2) sum(P1)] ...
// Per slot the lane's chunks c = lane + 32 i, i ascending, from acc = 0, then warp_sum, then
// out = fmaf(w_slot, y, out) in slot order: the pair kernel's sums, bit for bit.
// V2-Lite: 6 slots x 2048 x 1408 x 2 B = 34.6 MB per layer: 8.0 us at 4.3 TB/s (was 16.1 us).
template <int U>
struct T1DownPair {
  uint4 w[2][U];   // chunk lane + 32 i of the down rows of slots s0, s0 + 1 (zeros when not loaded)
  T1DownRow r[2];  // warp-uniform
};

template <int U>
__device__ __forceinline__ void t1_down_load(const MoeDecodeT1Params& p, const T1Slots& sl, int s0,
                                             int n, int lane, T1DownPair<U>& b) {
  const int chunks = p.inter / 8;
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    b.r[q] = t1_down_row(p, sl, s0 + q, n);
#pragma unroll
    for (int i = 0; i < U; ++i) {
      const int c = lane + 32 * i;
      b.w[q][i] = b.r[q].row && c < chunks ? ld_stream(b.r[q].row + c) : make_uint4(0, 0, 0, 0);
    }
  }
}

template <int U>
__device__ __forceinline__ void t1_down_sum(const MoeDecodeT1Params& p, int s0, int lane,
                                            const T1DownPair<U>& b, float& out) {
  const int chunks = p.inter / 8;
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    float acc = 0.0f;
    if (b.r[q].row) {  // warp-uniform
      const float4* ar = reinterpret_cast<const float4*>(p.act + int64_t{s0 + q} * p.inter);
#pragma unroll
      for (int i = 0; i < U; ++i) {
        const int c = lane + 32 * i;
        if (c < chunks) {
          float w[8];
          unpack8(b.w[q][i], w);
          const float4 lo = ar[2 * c], hi = ar[2 * c + 1];  // written by the previous kernel
          const float av[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
          acc = dot8(w, av, acc);
        }
      }
    }
    const float y = warp_sum(acc);
    if (b.r[q].row) out = fmaf(b.r[q].weight, y, out);
  }
}

// Registers (ptxas, sm_90a, no spills): U = 2/3/4/6/8: 62/80/96/132/173. At U = 6 (V2-Lite) 3
// CTAs fit per SM, so its 512 CTAs are 396 + a tail of 116 on 132 SMs (the pair kernel, 100
// registers: 4 per SM, one wave); capping at 128 (__launch_bounds__(128, 4)) spills 20 bytes.
template <int U>
__global__ void __launch_bounds__(kT1DownWarps * 32) moe_down_t1_pipe_kernel(MoeDecodeT1Params p) {
  DI_TRACE_SCOPE(kTraceMoeDownT1, 0);
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int n = static_cast<int>(blockIdx.x) * kT1DownWarps + warp;
  if (p.early_trigger) pdl_trigger();
  // early_rows: the ids and the first pair's weight loads before the wait (the router that wrote
  // the ids has completed: launch_moe_decode_t1); act, gate_up's output, only after it.
  const bool live = n < p.hidden;  // warp-uniform
  T1Slots sl;
  T1DownPair<U> b0, b1;
  if (!p.early_rows) pdl_wait();
  if (live) {
    sl = t1_load_slots(p, lane);
    t1_down_load(p, sl, 0, n, lane, b0);
  }
  if (p.early_rows) pdl_wait();
  DI_TRACE_WAITED();
  if (!live) return;
  const float res = lane == 0 ? t1_residual(p, n) : 0.0f;
  const int slots = p.top_k + p.shared_slots;
  float out = 0.0f;  // the combine sum (every lane holds it; lane 0 stores)
  for (int s0 = 0; s0 < slots; s0 += 4) {
    t1_down_load(p, sl, s0 + 2, n, lane, b1);  // slots past the last load nothing
    t1_down_sum(p, s0, lane, b0, out);
    if (s0 == 0) DI_TRACE_MARK_AFTER(out);  // the first pair summed (act has arrived)
    t1_down_load(p, sl, s0 + 4, n, lane, b0);
    t1_down_sum(p, s0 + 2, lane, b1, out);
  }
  if (lane == 0) t1_store(p, n, out, res);
}

// Down with the slots split over a CTA's warps (run 41; DEEPINFER_MOE_T1_DOWN=slot). The kernels
// above give a warp one output column and every slot's row of it in sequence (8 rows of 1.5-2.8
// KB from 8 experts per warp, 2,048 warps); here a CTA has one warp per slot and C output columns
// n0 .. n0 + C - 1: warp s loads its slot's C rows (C consecutive rows of one expert, C x inter x
// 2 contiguous bytes) at once, before the wait with early_rows, and reads act[s] once per chunk
// for all C rows; lane 0 puts y[s][c] = warp_sum into shared memory; after one barrier thread c
// sums column n0 + c's slots in slot order (fmaf(w_s, y_s, out), skipped slots skipped) and stores
// (t1_store). Per row the pipelined kernel's arithmetic (lane chunks c = lane + 32 i ascending
// from 0, dot8, warp_sum), then the same slot-order fold: the same bits. Pure reads of the down
// rows one slot per warp ran 3.36 / 3.83 TB/s (Qwen3-30B-A3B / V2-Lite) against 3.15 / 3.20 one
// column per warp (bench_cuda_rowread, run 41 call 2).
constexpr int kT1SlotMaxWarps = 16;

// MinBlocks: CTAs of the largest size (16 warps) per SM asked of the compiler, i.e. registers
// <= 128 / MinBlocks (the 8-warp CTAs of 8 slots then fit 2 x MinBlocks per SM).
template <int U, int C, int MinBlocks = 1>
__global__ void __launch_bounds__(kT1SlotMaxWarps * 32, MinBlocks)
    moe_down_t1_slot_kernel(MoeDecodeT1Params p) {
  DI_TRACE_SCOPE(kTraceMoeDownT1, 2);
  __shared__ float ys[kT1SlotMaxWarps][C];
  __shared__ float wsum[kT1SlotMaxWarps];  // slot s's weight, read only where live[s]
  __shared__ bool live[kT1SlotMaxWarps];   // slot s not skipped
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, s = tid >> 5;
  const int slots = p.top_k + p.shared_slots;  // = blockDim.x / 32
  const int n0 = static_cast<int>(blockIdx.x) * C;
  const int chunks = p.inter / 8;
  if (p.early_trigger) pdl_trigger();
  if (!p.early_rows) pdl_wait();
  const T1Slots sl = t1_load_slots(p, lane);
  T1DownRow row[C];  // warp-uniform; null past hidden or for a skipped slot
  uint4 buf[C][U];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    row[c] = n0 + c < p.hidden ? t1_down_row(p, sl, s, n0 + c) : T1DownRow{nullptr, 0.0f};
#pragma unroll
    for (int i = 0; i < U; ++i) {
      const int ch = lane + 32 * i;
      buf[c][i] = row[c].row && ch < chunks ? ld_stream(row[c].row + ch) : make_uint4(0, 0, 0, 0);
    }
  }
  if (p.early_rows) pdl_wait();
  DI_TRACE_WAITED();
  const float res = tid < C && n0 + tid < p.hidden ? t1_residual(p, n0 + tid) : 0.0f;
  float acc[C];
#pragma unroll
  for (int c = 0; c < C; ++c) acc[c] = 0.0f;
  const float4* ar = reinterpret_cast<const float4*>(p.act + int64_t{s} * p.inter);
#pragma unroll
  for (int i = 0; i < U; ++i) {
    const int ch = lane + 32 * i;
    if (ch < chunks) {
      const float4 lo = ar[2 * ch], hi = ar[2 * ch + 1];  // written by the previous kernel
      const float av[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int c = 0; c < C; ++c) {
        if (row[c].row) {
          float w[8];
          unpack8(buf[c][i], w);
          acc[c] = dot8(w, av, acc[c]);
        }
      }
    }
  }
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const float y = warp_sum(acc[c]);
    if (lane == 0) ys[s][c] = y;
  }
  if (lane == 0) {
    live[s] = row[0].row != nullptr;  // column n0 < hidden always: row[0] null = slot skipped
    wsum[s] = row[0].weight;
  }
  __syncthreads();
  if (tid < C && n0 + tid < p.hidden) {
    float out = 0.0f;
    for (int q = 0; q < slots; ++q)
      if (live[q]) out = fmaf(wsum[q], ys[q][tid], out);
    t1_store(p, n0 + tid, out, res);
  }
}

// Columns per CTA of the slot-split down kernel at more than 6 chunk-iterations (8 iterations x
// 4 rows spill): the launcher caps its choice with it, so the instance it gets has the columns
// its grid is sized for.
constexpr int kT1SlotMaxColsAt8 = 2;

// The slot-split down kernel for `iters` (<= 8) chunk-iterations per row and C columns per CTA
// (C <= kT1SlotMaxColsAt8 past 6 iterations). MinBlocks 2 (64 registers) where it was measured
// to pay, 3 iterations of 4 columns (Qwen3-30B-A3B: one wave of 512 CTAs; MinBlocks 1 there,
// DEEPINFER_MOE_T1_SLOT_OCC=1 until run 48, measured -2.6 % in run 42). The other register caps
// measured in run 41 (3 iterations at 2 columns and 40 registers, 6 at 2 columns and 64, 6 at 1
// column and 40) lost 0.3-2.6 % and are not built.
template <int C>
void (*t1_slot_kernel_for(int iters))(MoeDecodeT1Params) {
  constexpr int kMinBlocks3 = C == 4 ? 2 : 1;
  return iters <= 2   ? moe_down_t1_slot_kernel<2, C>
         : iters <= 3 ? moe_down_t1_slot_kernel<3, C, kMinBlocks3>
         : iters <= 4 ? moe_down_t1_slot_kernel<4, C>
         : iters <= 6 ? moe_down_t1_slot_kernel<6, C>
                      : moe_down_t1_slot_kernel<8, std::min(C, kT1SlotMaxColsAt8)>;
}

// Down with act in shared memory (run 21). The pair and pipelined kernels read act (slots x
// inter f32, 45 KB at V2-Lite) from global memory for every row they sum: 2 x 16 bytes of act per
// 16 bytes of weights, all warps of an SM missing the same lines at once (ncu, run 20: V2-Lite's
// pair kernel ~2.2 TB/s against gate_up's 3.6). Here a CTA of W warps copies act into
// shared memory once (cp.async, after the weight loads of its first rows are in flight), then
// each warp streams the down rows of its output columns, every slot of a column in slot order,
// through a ring of R row buffers in registers: row k + R - 1's loads are issued before row k is
// summed, across slots and columns (no drain between slot pairs). The grid is at most one CTA
// per SM; a warp takes columns n0, n0 + grid·W, ... Per row and per column the arithmetic is the
// pair kernel's (lane chunks c = lane + 32 i ascending from 0, warp_sum, fmaf(w_s, y_s, out) in
// slot order, skipped slots skipped, t1_store): the same bits.
// act is staged split in halves: slot s's row holds the first 4 values of every 8-value chunk,
// then the last 4 (lo[c] = act[8c .. 8c + 4), hi[c] = act[8c + 4 .. 8c + 8)), so that lane L's
// 16-byte reads of chunk L + 32 i are consecutive across the warp (no bank conflicts; the
// unsplit row, 32 bytes per lane, was two wavefronts per read: ncu, run 21 call 2).
// W warps per CTA: 16 (run 22's 12 warps with deeper rings, DEEPINFER_MOE_T1_SMEM=deep, measured
// -10 % at batch 1 and was removed in run 47).

// act (slots x inter f32, gate_up's output) -> shared memory through L2 by the CTA's `threads`
// threads, split in halves per slot (see above), then a __syncthreads(): every thread of the CTA
// calls it.
__device__ __forceinline__ void t1_stage_act(const MoeDecodeT1Params& p, float* act_s, int slots,
                                             int tid, int threads) {
  const int per_slot = p.inter / 4;  // 16-byte pieces of a slot's row
  for (int i = tid; i < slots * per_slot; i += threads) {
    const int s = i / per_slot, j = i - s * per_slot;
    cp_async16(act_s + s * p.inter + (j & 1) * (p.inter / 2) + (j >> 1) * 4, p.act + 4 * i, 16);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
}

// A warp's position in its rows: column index (of the warp's columns) and slot.
struct T1RowPos {
  int col = 0, slot = 0;
  __device__ __forceinline__ void next(int slots) {
    if (++slot == slots) {
      slot = 0;
      ++col;
    }
  }
};

// Ring depth R (row buffers per warp) for W warps and U chunk-iterations per row: as deep as the
// registers allow without spills (ptxas, sm_90a: 16 warps <= 128 registers).
template <int U>
constexpr int kT1SmemRing = U <= 3   ? 5
                            : U <= 4 ? 4
                            : U <= 6 ? 3
                                     : 2;

template <int W, int U, int R = kT1SmemRing<U>>
__global__ void __launch_bounds__(W * 32, 1) moe_down_t1_smem_kernel(MoeDecodeT1Params p) {
  DI_TRACE_SCOPE(kTraceMoeDownT1, 1);
  extern __shared__ __align__(16) float act_s[];  // [slots][lo halves | hi halves]
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  if (p.early_trigger) pdl_trigger();
  const int slots = p.top_k + p.shared_slots, chunks = p.inter / 8;
  const int n0 = static_cast<int>(blockIdx.x) * W + warp;
  const int nstride = static_cast<int>(gridDim.x) * W;
  const int ncols = n0 < p.hidden ? (p.hidden - 1 - n0) / nstride + 1 : 0;
  // early_rows: the ids and the first rows' weight loads before the wait (see the pipelined
  // kernel); act only after it.
  if (!p.early_rows) pdl_wait();
  const T1Slots sl = t1_load_slots(p, lane);
  uint4 buf[R][U];
  T1DownRow row[R];  // warp-uniform
  T1RowPos ld;       // the next row to load
  // The next row's loads into buffer b (nothing past the warp's rows). U >= ceil(chunks / 32)
  // (the instances round 1 / 5 / 7 iterations up to 2 / 6 / 8), so any chunk-iteration may run
  // past the row: each tests c < chunks.
  auto load = [&](uint4(&b)[U], T1DownRow& r) {
    r = {nullptr, 0.0f};
    if (ld.col < ncols) r = t1_down_row(p, sl, ld.slot, n0 + ld.col * nstride);
    ld.next(slots);
    if (r.row) {  // warp-uniform
#pragma unroll
      for (int i = 0; i < U; ++i) {
        const int c = lane + 32 * i;
        b[i] = c < chunks ? ld_stream(r.row + c) : make_uint4(0, 0, 0, 0);
      }
    }
  };
#pragma unroll
  for (int j = 0; j < R - 1; ++j) load(buf[j], row[j]);
  if (p.early_rows) pdl_wait();
  DI_TRACE_WAITED();
  const float res0 = lane == 0 && ncols > 0 ? t1_residual(p, n0) : 0.0f;  // the first column's
  t1_stage_act(p, act_s, slots, tid, W * 32);
  const int total = ncols * slots;
  float out = 0.0f;  // the current column's combine sum (every lane holds it; lane 0 stores)
  T1RowPos at;       // the row being summed
  for (int k0 = 0; k0 < total; k0 += R) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (k0 + j >= total) break;  // warp-uniform
      load(buf[(j + R - 1) % R], row[(j + R - 1) % R]);
      float acc = 0.0f;
      if (row[j].row) {  // warp-uniform
        const float4* lo = reinterpret_cast<const float4*>(act_s + at.slot * p.inter);
        const float4* hi = lo + p.inter / 8;
#pragma unroll
        for (int i = 0; i < U; ++i) {
          const int c = lane + 32 * i;
          if (c < chunks) {
            float w[8];
            unpack8(buf[j][i], w);
            const float4 a = lo[c], b = hi[c];
            const float av[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            acc = dot8(w, av, acc);
          }
        }
      }
      const float y = warp_sum(acc);
      if (at.slot == 0) out = 0.0f;
      if (row[j].row) out = fmaf(row[j].weight, y, out);
      if (at.slot == slots - 1 && lane == 0) {
        const int n = n0 + at.col * nstride;
        t1_store(p, n, out, at.col == 0 ? res0 : t1_residual(p, n));
      }
      at.next(slots);
    }
  }
}

// The smem down kernel of W warps for `iters` (<= 8) chunk-iterations per row.
template <int W>
void (*t1_smem_kernel_for(int iters))(MoeDecodeT1Params) {
  return iters <= 2   ? moe_down_t1_smem_kernel<W, 2>
         : iters <= 3 ? moe_down_t1_smem_kernel<W, 3>
         : iters <= 4 ? moe_down_t1_smem_kernel<W, 4>
         : iters <= 6 ? moe_down_t1_smem_kernel<W, 6>
                      : moe_down_t1_smem_kernel<W, 8>;
}

// Block (t, c): token t, output columns 4·(c·blockDim + thread) .. + 3 (float4 loads of the
// slots' y rows, all in flight together; hidden % 4 == 0), or one column per thread otherwise.
// Per column the sum is fmaf(w_j, y_j, acc) over j ascending in both forms (the one-token down
// kernel reproduces it bit for bit). One CTA per token and a loop over the columns was 28 us per
// Qwen3-30B-A3B layer at 32 tokens (32 CTAs on 132 SMs).
constexpr int kCombineThreads = 128;
__global__ void __launch_bounds__(kCombineThreads) moe_combine_f32_kernel(MoeCombineF32Params p) {
  const int64_t t = blockIdx.x;
  const int32_t* rows = p.slot_row + t * p.top_k;
  const float* wts = p.topk_weights + t * p.top_k;
  const int c = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x);
  if (p.hidden % 4 != 0) {
    if (c >= p.hidden) return;
    float acc = 0.0f;
    for (int j = 0; j < p.top_k; ++j) {
      const int32_t r = rows[j];
      if (r >= 0) acc = fmaf(wts[j], p.y[int64_t{r} * p.hidden + c], acc);
    }
    p.out[t * p.hidden + c] = __float2bfloat16_rn(acc);
    return;
  }
  const int c4 = 4 * c;
  if (c4 >= p.hidden) return;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  int j = 0;
  for (; j + 4 <= p.top_k; j += 4) {  // four slots' loads in flight, summed in slot order
    float4 v[4];
    float w[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int32_t r = rows[j + q];
      w[q] = r >= 0 ? wts[j + q] : 0.0f;
      v[q] = r >= 0 ? *reinterpret_cast<const float4*>(p.y + int64_t{r} * p.hidden + c4)
                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (rows[j + q] < 0) continue;  // skipped slot: no term (as the scalar sum)
      acc.x = fmaf(w[q], v[q].x, acc.x);
      acc.y = fmaf(w[q], v[q].y, acc.y);
      acc.z = fmaf(w[q], v[q].z, acc.z);
      acc.w = fmaf(w[q], v[q].w, acc.w);
    }
  }
  for (; j < p.top_k; ++j) {
    const int32_t r = rows[j];
    if (r < 0) continue;
    const float4 v = *reinterpret_cast<const float4*>(p.y + int64_t{r} * p.hidden + c4);
    acc.x = fmaf(wts[j], v.x, acc.x);
    acc.y = fmaf(wts[j], v.y, acc.y);
    acc.z = fmaf(wts[j], v.z, acc.z);
    acc.w = fmaf(wts[j], v.w, acc.w);
  }
  bf16* o = p.out + t * p.hidden + c4;
  o[0] = __float2bfloat16_rn(acc.x);
  o[1] = __float2bfloat16_rn(acc.y);
  o[2] = __float2bfloat16_rn(acc.z);
  o[3] = __float2bfloat16_rn(acc.w);
}

template <int MT>
void launch_decode_mt(const MoeDecodeParams& p, cudaStream_t stream) {
  const dim3 block(kDecodeThreads);
  moe_gate_up_kernel<MT><<<dim3(ceil_div(p.inter, kDecodeWarps), static_cast<unsigned>(p.max_active)),
                           block, 0, stream>>>(p);
  moe_down_kernel<MT><<<dim3(ceil_div(p.hidden, kDecodeWarps), static_cast<unsigned>(p.max_active)),
                        block, 0, stream>>>(p);
}

// v2: R = 1 at 1-2 rows per expert (as many warps as v1: one wave at T = 1 for the V2-Lite
// shape), R = 2 from 3 rows on (the grid is large then; each x / act load feeds 2 rows).
template <int MT, int R, int UG, int UD>
void launch_decode_v2(const MoeDecodeParams& p, cudaStream_t stream) {
  const dim3 block(kDecodeThreads);
  moe_gate_up_v2_kernel<MT, R, UG>
      <<<dim3(ceil_div(p.inter, kDecodeWarps * R), static_cast<unsigned>(p.max_active)), block, 0, stream>>>(p);
  moe_down_v2_kernel<MT, R, UD>
      <<<dim3(ceil_div(p.hidden, kDecodeWarps * R), static_cast<unsigned>(p.max_active)), block, 0, stream>>>(p);
}

}  // namespace

namespace {
MoeDecodeImpl g_decode_override = MoeDecodeImpl::kAuto;
}  // namespace

void set_moe_decode_impl_override(MoeDecodeImpl impl) { g_decode_override = impl; }

int moe_decode_grouped_min_rows() {
  static const int rows = di::env::get_int("DEEPINFER_MOE_DECODE_GROUPED_MIN_ROWS", 0);  // 0..
  return rows;
}

MoeDecodeImpl moe_decode_impl_from_env() {
  if (g_decode_override != MoeDecodeImpl::kAuto) return g_decode_override;
  static const MoeDecodeImpl impl = [] {
    constexpr const char* kName = "DEEPINFER_MOE_DECODE";
    if (di::env::is(kName, "v1")) return MoeDecodeImpl::kV1;
    if (di::env::is(kName, "v2")) return MoeDecodeImpl::kV2;
    if (di::env::is(kName, "tc")) return MoeDecodeImpl::kTc;
    // Default: the cp.async-ring tensor-core kernels at every row count (run 15, H200:
    // bench_cuda_moe 2 / 4 / 8 / 16 rows per expert 70-76 / 57 / 56 / 54 % -> 84 / 82-83 / 79-81
    // / 74-76 % of the copy bandwidth; Qwen3-30B-A3B batch 32 1,202 -> 1,540 tok/s).
    return MoeDecodeImpl::kTc;
  }();
  return impl;
}

void launch_moe_decode(const MoeDecodeParams& p, cudaStream_t stream, MoeDecodeImpl impl) {
  if (p.max_active <= 0 || p.hidden <= 0 || p.inter <= 0) return;
  if (impl == MoeDecodeImpl::kAuto) impl = moe_decode_impl_from_env();
  // Typical rows per touched expert (T·k / touched for balanced routing), not the worst case.
  const int rows = p.avg_rows > 0 ? min(p.avg_rows, p.rows_hint) : p.rows_hint;
  if (impl == MoeDecodeImpl::kTc) {
    launch_moe_decode_tc(p, stream);
    return;
  }
  if (impl == MoeDecodeImpl::kV2) {
    if (rows <= 1)
      launch_decode_v2<1, 1, 4, 4>(p, stream);
    else if (rows <= 2)
      launch_decode_v2<2, 1, 4, 4>(p, stream);
    else if (rows <= 4)
      launch_decode_v2<4, 2, 2, 4>(p, stream);
    else
      launch_decode_v2<8, 2, 2, 4>(p, stream);
    return;
  }
  if (p.rows_hint <= 1)
    launch_decode_mt<1>(p, stream);
  else if (p.rows_hint <= 2)
    launch_decode_mt<2>(p, stream);
  else if (p.rows_hint <= 4)
    launch_decode_mt<4>(p, stream);
  else
    launch_decode_mt<8>(p, stream);
}

namespace {
MoeT1DownImpl g_t1_down_override = MoeT1DownImpl::kAuto;
int g_t1_path_override = -1;
int g_shared_early_override = -1;
}  // namespace

void set_moe_shared_early_override(int on) {
  g_shared_early_override = on;
}

void set_moe_t1_path_override(int on) {
  g_t1_path_override = on;
}

bool moe_t1_path_enabled() {
  if (g_t1_path_override >= 0) return g_t1_path_override != 0;
  static const bool on =
      !di::env::is("DEEPINFER_MOE_T1", "0") && !di::env::is("DEEPINFER_MOE_T1", "off");
  return on;
}

void set_moe_t1_down_impl_override(MoeT1DownImpl impl) {
  g_t1_down_override = impl;
}

MoeT1DownImpl moe_t1_down_impl() {
  if (g_t1_down_override != MoeT1DownImpl::kAuto) return g_t1_down_override;
  static const MoeT1DownImpl impl = [] {
    constexpr const char* kName = "DEEPINFER_MOE_T1_DOWN";
    if (di::env::is(kName, "v1")) return MoeT1DownImpl::kPairs;
    if (di::env::is(kName, "pipe")) return MoeT1DownImpl::kPipelined;
    if (di::env::is(kName, "smem")) return MoeT1DownImpl::kSmem;
    if (di::env::is(kName, "slot")) return MoeT1DownImpl::kSlot;
    return MoeT1DownImpl::kAuto;
  }();
  return impl;
}

// act of the smem down kernel: at most 96 KB (V2-Lite 45 KB, Qwen3-30B-A3B 24.6, V3 73.7).
constexpr int kT1SmemMaxAct = 96 * 1024;

// launch_pdl without shared slots or with the smem down kernel, else a plain launch (the
// shared-early gate_up has its own PDL launch); DEEPINFER_MOE_T1_PDL=1 / 0 forces PDL / plain
// (read once). By measurement (H200, batch 1, ctx 2048, the same binary): without shared experts
// PDL wins — Qwen3-30B-A3B 307.5 -> 311.8 tok/s (run 18 call 7; flat in run 17 before the down
// trigger and the PDL mask); with them the pair kernel loses as a dependent — V2-Lite 417 -> 407
// (run 18), 380.2 -> 370.2 (run 17), 452.9 -> 449.0 (run 23) — and the smem kernel, which then
// loads its first rows before the wait, wins: 452.9 -> 466.4 (run 23 call 2, three pairs).
bool t1_pdl(const MoeDecodeT1Params& p, bool smem_down) {
  static const int forced = di::env::get_int("DEEPINFER_MOE_T1_PDL", -1);
  return forced >= 0 ? forced != 0 : p.shared_slots == 0 || smem_down;
}
cudaError_t launch_t1(bool pdl, void (*kernel)(MoeDecodeT1Params), dim3 grid, dim3 block,
                      cudaStream_t stream, const MoeDecodeT1Params& p) {
  return launch_dependent_if(pdl, kernel, grid, block, 0, stream, p);
}

static int g_t1_slot_cols = 0;
void set_moe_t1_slot_cols(int cols) {
  g_t1_slot_cols = cols;
}

cudaError_t launch_moe_decode_t1(const MoeDecodeT1Params& params, int num_sms,
                                 cudaStream_t stream) {
  if (params.top_k + params.shared_slots <= 0 || params.hidden <= 0 || params.inter <= 0)
    return cudaSuccess;
  // On by measurement (H200, run 18, batch 1): Qwen3-30B-A3B 295.7 -> 298.7 tok/s, V2-Lite
  // 411.6 -> 416.6 (call 2; call 1 on other defaults: +1.7 / +0.8 %). DEEPINFER_MOE_T1_TRIGGER=0.
  static const bool early_trigger = di::env::get_int("DEEPINFER_MOE_T1_TRIGGER", 1) != 0;
  static const bool shared_early_env = di::env::get_int("DEEPINFER_MOE_SHARED_EARLY", 1) != 0;
  const bool shared_early_on =
      g_shared_early_override >= 0 ? g_shared_early_override != 0 : shared_early_env;
  MoeDecodeT1Params p = params;
  p.early_trigger = early_trigger;
  p.shared_early = p.shared_early && shared_early_on && p.shared_slots > 0 && p.norm_x != nullptr &&
                   p.norm_w != nullptr && pdl_enabled();
  // gate_up waits (griddepcontrol.wait) before reading the router's outputs and down before
  // reading act, so both are correct under either launch (launch_t1); gate_up's shared-expert
  // CTAs issue their first weight loads before the wait, and so does down with early_rows.
  const dim3 gu_grid(ceil_div(p.inter, kDecodeWarps),
                     static_cast<unsigned>(p.top_k + p.shared_slots));
  // DEEPINFER_MOE_T1_GU=4x4 | 2x6 | 2x8 (U x CTAs per SM) forces a variant (-1: the policy).
  // Policy (run 37): 2x6 when its resident warps hold the whole grid in one wave (Qwen3-30B-A3B:
  // 8 slots x 768 columns = 6,144 warps against 6,336; 4x4 there -4 %), else 4x4, whose 4 loads
  // in flight per lane serve a grid that takes several waves either way (V2-Lite: 8 slots x 1,408
  // columns = 11,264 warps; 512.5 -> 514.5 tok/s, +0.4 %, run 37 call 11). Same sums either way.
  static const int gu_forced = [] {
    constexpr const char* kName = "DEEPINFER_MOE_T1_GU";
    if (di::env::is(kName, "4x4")) return 0;
    if (di::env::is(kName, "2x6")) return 1;
    if (di::env::is(kName, "2x8")) return 2;
    return -1;
  }();
  const int64_t gu_warps = int64_t{gu_grid.x} * gu_grid.y * kDecodeWarps;
  const int gu_variant =
      gu_forced >= 0 ? gu_forced : (gu_warps <= int64_t{6} * kDecodeWarps * num_sms ? 1 : 0);
  void (*gate_up)(MoeDecodeT1Params) = gu_variant == 0   ? moe_gate_up_t1_kernel<4, 1>
                                       : gu_variant == 1 ? moe_gate_up_t1_kernel<2, 6>
                                                         : moe_gate_up_t1_kernel<2, 8>;
  cudaError_t err;
  if (p.shared_early) {  // a PDL dependent of the router: the shared slots run during it
    const int smem = p.hidden * 2;
    if ((err = open_dynamic_smem(reinterpret_cast<const void*>(gate_up), smem)) != cudaSuccess)
      return err;
    err = launch_pdl(gate_up, gu_grid, dim3(kDecodeThreads), static_cast<size_t>(smem), stream, p);
  } else {
    err = launch_t1(t1_pdl(p, false), gate_up, gu_grid, dim3(kDecodeThreads), stream, p);
  }
  if (err != cudaSuccess) return err;
  // The pipelined down kernel as a PDL dependent loads the router's ids and its first slot pair's
  // weight rows before griddepcontrol.wait (DEEPINFER_MOE_T1_DOWN_EARLY=0: after it). Safe: down
  // can start only once every gate_up CTA has triggered or exited, and gate_up's routed CTAs
  // (top_k >= 1 of its slots) trigger only after their own wait, i.e. once the kernel that
  // wrote topk_ids / topk_weights has completed. H200 run 19 call 1 (Qwen3-30B-A3B batch 1):
  // 309.7 -> 314.6 tok/s.
  static const bool down_early_env = di::env::get_int("DEEPINFER_MOE_T1_DOWN_EARLY", 1) != 0;
  const dim3 grid(ceil_div(p.hidden, kT1DownWarps));
  const dim3 down_threads(kT1DownWarps * 32);
  // Chunk-iterations per lane for a whole row; the buffers are sized to it (registers: 2 pairs x
  // 2 rows x U x 4). Qwen3-30B-A3B (inter 768): 3, V2-Lite (1408): 6, inter 2048: 8.
  const int iters = ceil_div(p.inter / 8, 32);
  // Without the slot kernel (above): pipelined up to 4 iterations (Qwen3-30B-A3B, 3: 240.3 -> 242.2
  // tok/s at batch 1; the smem kernel there: 340.4 -> 332.9, run 23 call 3); above that (V2-Lite's
  // 6: the pipelined kernel's 132 registers cost a resident CTA per SM, 328.3 -> 314.2, 29 Nov) the
  // smem kernel as a PDL dependent: V2-Lite 452.9 -> 466.4 against the pair kernel (run 23 call 2).
  // DEEPINFER_MOE_T1_DOWN=pipe forces the pipelined kernel up to 8, =v1 the pair kernel, =smem
  // the smem kernel.
  const MoeT1DownImpl impl = moe_t1_down_impl();
  const int slots = p.top_k + p.shared_slots;
  const int act_bytes = slots * p.inter * 4;
  if ((impl == MoeT1DownImpl::kSlot || impl == MoeT1DownImpl::kAuto) && slots <= kT1SlotMaxWarps &&
      iters <= 8) {
    // The default by measurement (H200, batch 1, ctx 2048, against the kernels below in one
    // binary; run 41 calls 2-3): Qwen3-30B-A3B (3 chunk-iterations) 394.6 / 393.4 (pipelined) ->
    // 406.7 / 406.0 tok/s at 4 columns per CTA with 64 registers (MinBlocks 2: one wave of 512
    // CTAs; 28 bytes spilled), 402.7 / 402.4 at 2 columns, 388.9 / 390.5 at 1; V2-Lite (6)
    // 513.5 / 513.5 (smem) -> 529.7 / 530.3 at 4 columns (124 registers), 2: 511.4 / 511.5, 1:
    // 533.0 / 530.8 (call 2, where the 4 columns gave 534.2 / 533.5). C columns per CTA: the
    // override, else DEEPINFER_MOE_T1_SLOT_C (1, 2 or 4; read once), else 4 (2 at 4 and 8
    // chunk-iterations: unmeasured, the registers of 4 x 4 / 4 x 8 rows); MinBlocks 2 for 4
    // columns of 3 iterations, else 1.
    static const int env_c = di::env::get_int("DEEPINFER_MOE_T1_SLOT_C", 0);
    const int want = g_t1_slot_cols > 0        ? g_t1_slot_cols
                     : env_c > 0               ? env_c
                     : iters == 4 || iters > 6 ? 2
                                               : 4;
    // Past 6 iterations at most kT1SlotMaxColsAt8: the grid is sized by the instance's columns
    // (run 43: a forced 4 at inter 2048 once ran a 2-column instance on a 4-column grid).
    const int cap = iters > 6 ? kT1SlotMaxColsAt8 : 4;
    const int cols = std::min(want >= 4 ? 4 : want >= 2 ? 2 : 1, cap);
    void (*kernel)(MoeDecodeT1Params) = cols == 4   ? t1_slot_kernel_for<4>(iters)
                                        : cols == 2 ? t1_slot_kernel_for<2>(iters)
                                                    : t1_slot_kernel_for<1>(iters);
    const bool pdl = t1_pdl(p, true);
    p.early_rows = down_early_env && pdl && pdl_enabled();
    return launch_dependent_if(pdl, kernel, dim3(ceil_div(p.hidden, cols)), dim3(slots * 32), 0,
                               stream, p);
  }
  const bool smem_down =
      (impl == MoeT1DownImpl::kSmem || (impl == MoeT1DownImpl::kAuto && iters > 4)) && iters <= 8 &&
      act_bytes <= kT1SmemMaxAct;
  const bool pdl = t1_pdl(p, smem_down);
  p.early_rows = down_early_env && pdl && pdl_enabled();
  if (smem_down) {
    constexpr int warps = 16;
    const dim3 sgrid(std::min<unsigned>(ceil_div(p.hidden, warps), static_cast<unsigned>(num_sms)));
    void (*kernel)(MoeDecodeT1Params) = t1_smem_kernel_for<warps>(iters);
    if ((err = open_dynamic_smem(reinterpret_cast<const void*>(kernel), act_bytes)) != cudaSuccess)
      return err;
    return launch_dependent_if(pdl, kernel, sgrid, dim3(warps * 32), static_cast<size_t>(act_bytes),
                               stream, p);
  }
  const bool pipelined = impl == MoeT1DownImpl::kPipelined ? iters <= kT1DownU
                                                           : impl == MoeT1DownImpl::kAuto && iters <= 4;
  auto down = [&](void (*kernel)(MoeDecodeT1Params)) {
    return launch_t1(pdl, kernel, grid, down_threads, stream, p);
  };
  if (!pipelined) return down(moe_down_t1_kernel);
  if (iters <= 2) return down(moe_down_t1_pipe_kernel<2>);
  if (iters <= 3) return down(moe_down_t1_pipe_kernel<3>);
  if (iters <= 4) return down(moe_down_t1_pipe_kernel<4>);
  if (iters <= 6) return down(moe_down_t1_pipe_kernel<6>);
  return down(moe_down_t1_pipe_kernel<kT1DownU>);
}

void launch_moe_combine_f32(const MoeCombineF32Params& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  const int per_thread = p.hidden % 4 == 0 ? 4 : 1;
  const dim3 grid(static_cast<unsigned>(p.tokens), ceil_div(p.hidden, kCombineThreads * per_thread));
  moe_combine_f32_kernel<<<grid, kCombineThreads, 0, stream>>>(p);
}

}  // namespace di::cuda
