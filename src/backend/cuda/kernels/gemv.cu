// Small-M fused linear layers of the decode path; the contract is in gemv.h.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gemv.h"
#include "core/env.h"

namespace di::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Dynamic shared memory gemv_supported allows: below every Hopper opt-in limit (227 KiB) minus
// the kernel's static shared memory (< 1 KiB).
constexpr int kMaxDynSmem = 220 * 1024;

// 16-byte weight loads per lane and register buffer (two buffers in flight).
template <int M>
constexpr int kLoadsPerLane = M <= 2 ? 8 : 4;

// Two floats to a bf16 pair (round to nearest even, as from_f32<bf16>); a goes to the low half.
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  const uint32_t lo = __bfloat16_as_ushort(__float2bfloat16_rn(a));
  const uint32_t hi = __bfloat16_as_ushort(__float2bfloat16_rn(b));
  return lo | (hi << 16);
}

// cp.async of 16 bytes global -> shared, cached in L2 only (the weights are read once).
__device__ __forceinline__ void cp_async16(uint4* dst, const uint4* src) {
#if DI_L2_EVICT_FIRST
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)),
               "l"(src), "l"(l2_stream_policy())
               : "memory");
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src)
               : "memory");
#endif
}

// Output row r of x row m from its fp32 sum, rounded as the composed path (cuBLAS bf16 output,
// bias_add, add): bf16(acc) [+ bias -> bf16] -> y (f32 y: acc [+ bias]); residual = bf16(res + r).
// have_res: res_pre is the residual element, already loaded (else it is loaded here). By value:
// a pointer to the caller's register put it in local memory (a stack store and load).
__device__ __forceinline__ void store_out(const GemvParams& p, int m, int64_t r, float acc,
                                          bool have_res, float res_pre) {
  float v = p.y_f32 ? acc : round_bf16(acc);
  if (p.bias != nullptr) {
    v += to_f32(static_cast<const bf16*>(p.bias)[r]);
    if (!p.y_f32) v = round_bf16(v);
  }
  if (p.y != nullptr) {
    if (p.y_f32) {
      static_cast<float*>(p.y)[m * p.ldy + r] = v;
    } else {
      static_cast<bf16*>(p.y)[m * p.ldy + r] = from_f32<bf16>(v);
    }
  }
  if (p.residual != nullptr) {
    bf16* res = static_cast<bf16*>(p.residual) + m * p.ldr + r;
    *res = from_f32<bf16>((have_res ? res_pre : to_f32(*res)) + v);
  }
}

// silu_out: y[m, r] from the fp32 sums of gate row r and up row n/2 + r, each rounded to bf16
// first (the GEMM's bf16 output), then as silu_mul_kernel.
__device__ __forceinline__ void store_silu(const GemvParams& p, int m, int64_t r, float gate_acc,
                                           float up_acc) {
  const float g = round_bf16(gate_acc), u = round_bf16(up_acc);
  static_cast<bf16*>(p.y)[m * p.ldy + r] = from_f32<bf16>(g / (1.0f + expf(-g)) * u);
}

// Staged inputs per 8 (kXSlots 16-byte slots, gemv.h's gemv_x_slots): the 8 bf16 values, or for
// one row on the register path (M = 1, S = 0: the batch-1 projections) the same 8 values as
// floats in two planes (floats 0-3 of every vector, then floats 4-7: 16 bytes per lane, no bank
// conflict), so that the main loop reads them without unpacking (same values, same fmaf: same
// bits). The rings and the bulk path keep bf16 (their shared memory sets how many CTAs fit on an
// SM).
template <int M, int S>
constexpr int kXSlots = gemv_x_slots(M, S);
template <int M, int S>
constexpr int64_t staged_bytes(int k) {
  return gemv_staged_bytes(M, S, k);
}

// Stores staged vector i of n (the bf16 values of 8 inputs).
template <int kSlots>
__device__ __forceinline__ void put_x(uint4* xs, int i, const uint4& bf, int n) {
  if constexpr (kSlots == 2) {
    float f[8];
    unpack8(bf, f);
    float4* d = reinterpret_cast<float4*>(xs) + i;
    d[0] = make_float4(f[0], f[1], f[2], f[3]);
    d[n] = make_float4(f[4], f[5], f[6], f[7]);
  } else {
    xs[i] = bf;
  }
}

// The 8 inputs of staged vector i of n as floats.
template <int kSlots>
__device__ __forceinline__ void get_x(const uint4* xs, int i, float (&f)[8], int n) {
  if constexpr (kSlots == 2) {
    const float4* s = reinterpret_cast<const float4*>(xs) + i;
    const float4 a = s[0], b = s[n];
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
    f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  } else {
    unpack8(xs[i], f);
  }
}

// The prologue: x's m rows, through the input op, rounded to bf16, into shared memory as staged
// vector m * stride + v (put_x). Every thread of the CTA calls it; no barrier at the end.
template <int M, GemvIn IN, int kUnroll, int kSlots>
__device__ __forceinline__ void stage_x(const GemvParams& p, uint4* xs, int stride,
                                        float* scratch) {
  const int k8 = p.k / 8;
  const bf16* x = static_cast<const bf16*>(p.x);
  if constexpr (IN == GemvIn::kNone) {
#pragma unroll(kUnroll == 1 ? 1 : 4)
    for (int i = threadIdx.x; i < M * k8; i += kThreads) {
      const int m = M == 1 ? 0 : i / k8, v = M == 1 ? i : i % k8;  // no division for one row
      put_x<kSlots>(xs, m * stride + v, reinterpret_cast<const uint4*>(x + m * p.ldx)[v],
                    M * stride);
    }
  } else if constexpr (IN == GemvIn::kRmsNorm) {
    // 16-byte loads, unrolled so a thread's loads are in flight together; the second pass reads
    // the same addresses again, and the prefetched norm weights (L1 hits).
    const uint4* nw = static_cast<const uint4*>(p.norm_w);
#pragma unroll 1
    for (int m = 0; m < M; ++m) {
      const uint4* xr = reinterpret_cast<const uint4*>(x + m * p.ldx);
      float ss = 0.0f;
#pragma unroll(kUnroll)
      for (int v = threadIdx.x; v < k8; v += kThreads) {
        // The norm weights into L1 now, so the second pass waits for no load from L2.
        if (m == 0) asm volatile("prefetch.global.L1 [%0];" ::"l"(nw + v));
        float f[8];
        unpack8(xr[v], f);
#pragma unroll
        for (int i = 0; i < 8; ++i) ss = fmaf(f[i], f[i], ss);
      }
      ss = block_sum(ss, scratch);
      const float inv = rsqrtf(ss / static_cast<float>(p.k) + p.eps);
#pragma unroll(kUnroll)
      for (int v = threadIdx.x; v < k8; v += kThreads) {
        float f[8], g[8];
        unpack8(xr[v], f);
        unpack8(nw[v], g);
        uint4 o;
        uint32_t* ou = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
        for (int i = 0; i < 4; ++i)
          ou[i] = pack2(f[2 * i] * inv * g[2 * i], f[2 * i + 1] * inv * g[2 * i + 1]);
        put_x<kSlots>(xs, m * stride + v, o, M * stride);
      }
    }
  } else {
#pragma unroll 1
    for (int m = 0; m < M; ++m) {
      const uint4* gr = reinterpret_cast<const uint4*>(x + m * p.ldx);
      const uint4* ur = reinterpret_cast<const uint4*>(x + m * p.ldx + p.k);
#pragma unroll(kUnroll)
      for (int v = threadIdx.x; v < k8; v += kThreads) {
        float g[8], u[8];
        unpack8(gr[v], g);
        unpack8(ur[v], u);
        uint4 o;
        uint32_t* ou = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
        for (int i = 0; i < 4; ++i)
          ou[i] = pack2(g[2 * i] / (1.0f + expf(-g[2 * i])) * u[2 * i],
                        g[2 * i + 1] / (1.0f + expf(-g[2 * i + 1])) * u[2 * i + 1]);
        put_x<kSlots>(xs, m * stride + v, o, M * stride);
      }
    }
  }
}

// S == 0: the weights of two items are in flight in registers (two buffers of U 16-byte loads
// per lane). S >= 2: S - 1 items are in flight in a per-thread ring of S shared-memory stages
// filled by cp.async (each thread reads back only what it copied itself, so no barrier): more
// bytes in flight per SM than the register file leaves room for. S == 1 (run 30; bulk_items
// below): as S == 0, but the first two items (those loaded before griddepcontrol.wait) come by
// bulk copy (the copy engine) into shared memory, read into the registers after the prologue.
// kEarly (S == 0; run 42): a warp's second item is requested before griddepcontrol.wait only on
// odd-numbered SMs; on the others it comes right after x is staged (same arithmetic, same bits).
// bench_cuda_xread: a dependent's first read after its wait takes ~2.2 us when every SM has 128
// KB of its own loads in flight, 0.3-0.6 us when half of them have (gemv_early_items below).
template <int M, GemvIn IN, int S, bool kEarly = false>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemvParams p, int split) {
  // [M][k / 8] staged activations, then (S >= 2) the ring [S][U][kThreads], (S == 1) the bulk
  // copies [kWarps][2][U][32]
  DI_TRACE_SCOPE(kTraceGemv, static_cast<uint32_t>(p.n));
  extern __shared__ uint4 xs_vec[];
  [[maybe_unused]] __shared__ uint64_t bulk_bar[kWarps];
  __shared__ float red[kWarps][M];
  __shared__ float scratch[32];
  constexpr int U = kLoadsPerLane<M>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int k8 = p.k / 8;
  const int rows_per_cta = kWarps / split;
  const int sub = warp % split;          // this warp's share of the row's k
  const int row_in_cta = warp / split;
  const int vstride = 32 * split;        // vectors between one lane's consecutive loads
  const uint4* wbase = static_cast<const uint4*>(p.w);
  // The warp's work as a flat list of items (row group g of this CTA, chunk c of the row), the
  // same count for every warp of the CTA: rows >= n_out load nothing but keep the CTA in step.
  // silu_out: output row r is weight rows r (gate) and n_out + r (up), one after the other.
  // Rows and items in 32 bits (n is int32; a warp has at most a few thousand items): 64-bit
  // division and address arithmetic were a large part of the code after the wait, which runs
  // cold (docs/batch1_decode.md, "Cold code"). Only the weight offset is widened.
  const int n_out = p.silu_out ? p.n / 2 : p.n;
  const int chunks = (k8 + U * vstride - 1) / (U * vstride);
  const int row_items = p.silu_out ? 2 * chunks : chunks;
  const int row_step = static_cast<int>(gridDim.x) * rows_per_cta;
  const int first_rb = static_cast<int>(blockIdx.x) * rows_per_cta;
  const int groups = first_rb < n_out ? (n_out - first_rb + row_step - 1) / row_step : 0;
  const int items = groups * row_items;
  struct Item {
    int r;      // output row
    int wr;     // weight row
    int c;      // chunk of the weight row
    bool last;  // the weight row's last chunk
  };
  // item / row_items as a multiply-high by the rounded-up reciprocal, not a division (~25
  // instructions, once per item and load): exact while items · row_items < 2^32 (gemv_supported).
  // row_items == 1 takes the item itself: its reciprocal, 2^32, does not fit (the sum wraps to 0).
  const uint32_t row_items_inv = 0xffffffffu / static_cast<uint32_t>(row_items) + 1u;
  auto locate = [&](int item) {
    Item t;
    const int gi = row_items == 1
                       ? item
                       : static_cast<int>(__umulhi(static_cast<uint32_t>(item), row_items_inv));
    t.r = first_rb + gi * row_step + row_in_cta;
    const int ci = item - gi * row_items;
    const bool up = ci >= chunks;
    t.c = up ? ci - chunks : ci;
    t.wr = up ? t.r + n_out : t.r;
    t.last = t.c == chunks - 1;
    return t;
  };
  // This lane's vectors of an item: wr + first + u * vstride for u < U (only those < k8, and
  // none past the last output row).
  struct Src {
    const uint4* wr;
    int first;
    bool row_ok;
  };
  auto source = [&](int item) {
    const Item t = locate(item);
    return Src{wbase + int64_t{t.wr} * k8, sub * 32 + t.c * U * vstride + lane, t.r < n_out};
  };
  auto load = [&](uint4* buf, int item) {
    const Src src = source(item);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = src.first + u * vstride;
      buf[u] = (src.row_ok && v < k8) ? ld_stream(src.wr + v) : make_uint4(0, 0, 0, 0);
    }
  };
  // Ring slot of (stage, u) for this thread: a warp's 32 lanes fill 512 contiguous bytes.
  constexpr int kSlots = kXSlots<M, S>;
  uint4* ring = xs_vec + M * k8 * kSlots + threadIdx.x;
  auto issue = [&](int item, int stage) {
    const Src src = source(item);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = src.first + u * vstride;
      if (src.row_ok && v < k8) cp_async16(ring + (stage * U + u) * kThreads, src.wr + v);
    }
  };
  uint4 wa[U], wb[U];
  // S == 1: lane l of this warp reads vector u of item i at bulk[(i * U + u) * 32 + l].
  [[maybe_unused]] uint4* bulk = xs_vec + M * k8 * kSlots + warp * 2 * U * 32;
  // The first items are in flight while the prologue runs.
  [[maybe_unused]] bool pre_b = true;  // item 1 before the wait (kEarly: odd SMs only)
  if constexpr (S == 0) {
    if constexpr (kEarly) {
      unsigned sm;
      asm("mov.u32 %0, %%smid;" : "=r"(sm));
      pre_b = (sm & 1u) != 0;
    }
    if (items > 0) load(wa, 0);
    if (pre_b && items > 1) load(wb, 1);
  } else if constexpr (S == 1) {
    // Lane 0 arms the warp's barrier with the bytes of both items and issues one bulk copy per
    // (item, u): the 32 lanes' vectors of a u are contiguous (<= 512 bytes, those below k8).
    if (lane == 0) {
      mbar_init(&bulk_bar[warp], 1);
      fence_mbar_init();
      uint32_t total = 0;
      for (int i = 0; i < 2 && i < items; ++i) {
        const Src src = source(i);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int v = src.first + u * vstride;
          if (src.row_ok && v < k8) total += static_cast<uint32_t>(min(32, k8 - v)) * 16;
        }
      }
      mbar_expect_tx(&bulk_bar[warp], total);
      for (int i = 0; i < 2 && i < items; ++i) {
        const Src src = source(i);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int v = src.first + u * vstride;
          if (src.row_ok && v < k8)
            bulk_copy_g2s_stream(bulk + (i * U + u) * 32, src.wr + v,
                                 static_cast<uint32_t>(min(32, k8 - v)) * 16, &bulk_bar[warp]);
        }
      }
    }
  } else {
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
      if (s < items) issue(s, s);
      cp_async_commit();
    }
  }
  // Programmatic dependent launch (launched with the PDL attribute): everything above reads
  // only the weights, so it may overlap the previous kernel's tail. Wait for that kernel's
  // writes (x, the residual) before the prologue reads them, and let the next PDL kernel start
  // its own weight loads early. Both are no-ops for a plain launch.
  pdl_wait();
  DI_TRACE_WAITED();
  pdl_trigger();

  // The residual of the warp's first output row (lane m: x row m), requested with the prologue's
  // loads: read at the store, it was one more round trip at the very end (o_proj and down at
  // batch 1: one row per warp). After the wait: the previous kernel may have written it.
  float res_first = 0.0f;
  int r_first = -1;
  if (p.residual != nullptr && !p.silu_out && items > 0 && sub == 0) {
    const int r0 = locate(0).r;
    if (r0 < n_out && lane < M) {
      r_first = r0;
      res_first = to_f32(static_cast<const bf16*>(p.residual)[lane * p.ldr + r0]);
    }
  }

  // Unrolled x staging (4 vectors per thread per pass) only for the rings (S >= 2) and silu_mul's
  // 2k inputs (Llama-3.1-8B's down: 7 per thread). For the others the unrolled body runs only
  // from 4 vectors per thread, k >= 8192, and every model measured here has k <= 4096, so it was
  // dead code behind the remainder loop; code run for the first time costs ~0.2 us per KB
  // (docs/batch1_decode.md, "Cold code"). At k >= 8192 the rolled loop takes its loads one round
  // trip at a time (not measured).
  constexpr int kStageUnroll = S >= 2 ? 8 : (IN == GemvIn::kSiluMul ? 4 : 1);
  stage_x<M, IN, kStageUnroll, kSlots>(p, xs_vec, k8, scratch);
  __syncthreads();
  DI_TRACE_MARK();  // x staged
  if constexpr (S == 0 && kEarly) {
    if (!pre_b && items > 1) load(wb, 1);
  }
  if constexpr (S == 1) {  // the bulk-copied items into the registers the loop consumes
    mbar_wait(&bulk_bar[warp], 0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      wa[u] = bulk[u * 32 + lane];
      wb[u] = bulk[(U + u) * 32 + lane];
    }
  }

  float acc[M], gate[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = gate[m] = 0.0f;
  // acc += the item's weights · staged activations; at the row's last chunk: reduce, write.
  auto consume = [&](const uint4* buf, int item) {
    const Item t = locate(item);
    const int r = t.r;
    const int base = sub * 32 + t.c * U * vstride;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = base + lane + u * vstride;
      if (r < n_out && v < k8) {
        float wf[8];
        unpack8(buf[u], wf);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float xf[8];
          get_x<kSlots>(xs_vec, m * k8 + v, xf, M * k8);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[m] = fmaf(wf[i], xf[i], acc[m]);
        }
      }
    }
    if (!t.last) return;
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = warp_sum(acc[m]);
    if (split > 1) {  // split-K inside the CTA: fixed order, deterministic
      if (lane == 0) {
#pragma unroll
        for (int m = 0; m < M; ++m) red[warp][m] = acc[m];
      }
      __syncthreads();
      if (sub == 0) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float t = 0.0f;
          for (int j = 0; j < split; ++j) t += red[warp + j][m];
          acc[m] = t;
        }
      }
      __syncthreads();
    }
    if (p.silu_out && t.wr == r) {  // the gate row: kept until its up row is done
#pragma unroll
      for (int m = 0; m < M; ++m) {
        gate[m] = acc[m];
        acc[m] = 0.0f;
      }
      return;
    }
    if (sub == 0 && r < n_out) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (lane != m) continue;  // lane m writes row m
        if (p.silu_out) {
          store_silu(p, m, r, gate[m], acc[m]);
        } else {
          store_out(p, m, r, acc[m], r == r_first, res_first);
        }
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  };
  if constexpr (S <= 1) {
    // Software pipeline over the items: load item i + 2 into the buffer item i has just used.
    for (int it = 0; it < items; it += 2) {
      consume(wa, it);
      if (it + 2 < items) load(wa, it + 2);
      if (it + 1 < items) {
        consume(wb, it + 1);
        if (it + 3 < items) load(wb, it + 3);
      }
    }
  } else {
    // Item i + S - 1 goes into the stage item i - 1 has left; one commit group per item (empty
    // past the end) keeps "all but the newest S - 1 groups done" meaning "item i has landed".
    int stage = 0;
    for (int it = 0; it < items; ++it) {
      if (it + S - 1 < items) issue(it + S - 1, stage == 0 ? S - 1 : stage - 1);
      cp_async_commit();
      cp_async_wait<S - 1>();
#pragma unroll
      for (int u = 0; u < U; ++u) wa[u] = ring[(stage * U + u) * kThreads];
      consume(wa, it);
      stage = stage == S - 1 ? 0 : stage + 1;
    }
  }
}

// Rings (depth 2 and 3) are built for m <= kRingMaxRows; 0 is the register double buffer.
constexpr int kRingMaxRows = 2;

// -1: the policy of ring_depth(); 0 / 2 / 3: forced (DEEPINFER_GEMV_RING).
EnvSetting g_ring_stages{"DEEPINFER_GEMV_RING", -1};
EnvSetting g_split{"DEEPINFER_GEMV_SPLIT", 0};

// Bytes of the S-stage ring of one CTA.
template <int M>
constexpr int64_t ring_bytes(int s) {
  return int64_t{s} * kLoadsPerLane<M> * 16 * kThreads;
}

// Opens gemv_kernel<M, IN, S> to the device's shared-memory opt-in (once per device) and returns
// its resident CTAs per SM with `smem` bytes of dynamic shared memory (cached per size; 0 when
// it does not fit).
template <int M, GemvIn IN, int S>
cudaError_t occupancy(int64_t smem, int* occ) {
  static std::atomic<uint64_t> opted_in{0};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if ((opted_in.load(std::memory_order_relaxed) & bit) == 0) {
    cudaFuncAttributes fa{};
    int optin = 0;
    if ((err = cudaFuncGetAttributes(&fa, gemv_kernel<M, IN, S>)) != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (err != cudaSuccess) return err;
    err = cudaFuncSetAttribute(gemv_kernel<M, IN, S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               optin - static_cast<int>(fa.sharedSizeBytes));
    if (err != cudaSuccess) return err;
    opted_in.fetch_or(bit, std::memory_order_relaxed);
  }
  static std::mutex mu;
  static std::map<int64_t, int> occ_of_smem;
  std::lock_guard<std::mutex> lock(mu);
  auto it = occ_of_smem.find(smem);
  if (it == occ_of_smem.end()) {
    int o = 0;
    if (smem <= kMaxDynSmem) {
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, gemv_kernel<M, IN, S>, kThreads,
                                                          static_cast<size_t>(smem));
      if (err != cudaSuccess) return err;
    }
    it = occ_of_smem.emplace(smem, o).first;
  }
  *occ = it->second;
  return cudaSuccess;
}

// A persistent grid of every resident CTA; a CTA takes groups of `units` (rows)
// round-robin, kWarps / split units per group, so the last pass is the tail. The split (warps
// per unit, k split between them) is the smallest one whose groups fill the passes to >= 90%,
// else the one that fills them best (small n: more splits); forced by set_gemv_split.
struct GridPlan {
  unsigned grid;
  int split;
};
GridPlan plan_grid(int64_t units, int64_t slots, int max_split) {
  int split = 1;
  double best = -1.0;
  const int forced = g_split.load();
  if (forced > 0 && (forced & (forced - 1)) == 0 && forced <= max_split) {
    split = forced;
  } else {
    for (int s = 1; s <= max_split; s *= 2) {
      const int64_t g = (units + kWarps / s - 1) / (kWarps / s);
      const double fill =
          static_cast<double>(g) / static_cast<double>(((g + slots - 1) / slots) * slots);
      if (fill > best + 1e-9) {
        best = fill;
        split = s;
      }
      if (fill >= 0.9) break;
    }
  }
  const int64_t groups = (units + kWarps / split - 1) / (kWarps / split);
  return {static_cast<unsigned>(std::min<int64_t>(groups, slots)), split};
}

// One row with the norm prologue on the registers (the caller checks that): kEarly where the
// policy or set_gemv_early says so. Policy: when a warp has more than two items on average
// (Qwen3-30B-A3B's qkv, 5,120 x 2,048: 2.4), i.e. its third is loaded after the wait anyway.
// Measured on the H200 (run 42, batch 1, same binary, interleaved): Qwen3-30B-A3B 403.6 / 403.6
// -> 408.3 / 408.2 tok/s (call 3), 405.0 / 405.8 -> 409.2 / 410.4 (call 7); the same split on
// V2-Lite's q|kv_a (3,648 x 2,048, 1.7 items per warp) lost (529.8 / 530.1 -> 522.0 / 521.7),
// and on the o_projs (no norm) it changed nothing. Also measured and not kept (call 2, 3, 7):
// no pre-wait item on even SMs, or only the first item everywhere (-0.5 to -1.5 %).
EnvSetting g_early{"DEEPINFER_GEMV_EARLY", -1};
std::atomic<int64_t> g_early_launches{0};
bool gemv_early_items(const GemvParams& p, const GridPlan& g) {
  const int mode = g_early.load();
  if (mode >= 0) return mode != 0;
  constexpr int U = kLoadsPerLane<1>;
  const int64_t rows_per_cta = kWarps / g.split;
  const int64_t groups = (int64_t{p.n} + rows_per_cta - 1) / rows_per_cta;
  const int64_t chunks = (int64_t{p.k} / 8 + U * 32 * g.split - 1) / (U * 32 * g.split);
  return groups * chunks > 2 * int64_t{g.grid};
}

template <int M, GemvIn IN, int S>
cudaError_t launch_grid(const GemvParams& p, int num_sms, int occ, int64_t smem,
                        cudaStream_t stream) {
  const int64_t slots = int64_t{std::max(occ, 1)} * num_sms;
  const int64_t n_out = p.silu_out ? p.n / 2 : p.n;
  // A split must leave every lane a full load batch per row chunk (U vectors), or the loads in
  // flight shrink with it (run D: V2-Lite's 3648 x 2048 projection ran split 4 at 1 TB/s).
  constexpr int U = kLoadsPerLane<M>;
  const int max_split = std::max(1, std::min(kWarps, p.k / 8 / (U * 32)));
  const GridPlan g = plan_grid(n_out, slots, max_split);
  // DEEPINFER_GEMV_PDL=0 (diagnostic): a plain launch (no weight loads during the previous kernel).
  static const bool pdl = di::env::get_int("DEEPINFER_GEMV_PDL", 1) != 0;
  if constexpr (M == 1 && S == 0 && IN == GemvIn::kRmsNorm) {
    if (gemv_early_items(p, g)) {
      g_early_launches.fetch_add(1, std::memory_order_relaxed);
      return launch_dependent_if(pdl, gemv_kernel<M, IN, S, true>, dim3(g.grid), dim3(kThreads),
                                 static_cast<size_t>(smem), stream, p, g.split);
    }
  }
  return launch_dependent_if(pdl, gemv_kernel<M, IN, S>, dim3(g.grid), dim3(kThreads),
                             static_cast<size_t>(smem), stream, p, g.split);
}

// Launches the ring of depth S when it fits next to the staged activations (*launched false
// otherwise: the caller uses the registers).
template <int M, GemvIn IN, int S>
cudaError_t launch_ring(const GemvParams& p, int num_sms, cudaStream_t stream, bool* launched) {
  const int64_t smem = staged_bytes<M, S>(p.k) + ring_bytes<M>(S);
  int occ = 0;
  *launched = false;
  cudaError_t err = occupancy<M, IN, S>(smem, &occ);
  if (err != cudaSuccess || occ == 0) return err;
  *launched = true;
  return launch_grid<M, IN, S>(p, num_sms, occ, smem, stream);
}

// The ring depth of a call: the forced setting, else (policy) 3 stages for one row, at least
// kRingMinDim inputs and outputs and at most kRingMaxBytes of weights, else the registers.
// Measured on the H200 (run 13, docs/cuda_backend.md): Llama-3.1-8B's o_proj (4096 x 4096)
// 12.3 -> 10.8 us and qkv (6144 x 4096) 16.0 -> 14.9 us on the ring; gate_up (235 MB) and down
// (117 MB) are faster on the registers, and so are the k = 2048 models' projections and
// Qwen3-30B-A3B's o_proj (2048 x 4096): the ring cost that model 7.6 %, then 1.6 % at batch 1.
constexpr int64_t kRingMaxBytes = 64ll << 20;
constexpr int32_t kRingMinDim = 4096;
template <int M>
int ring_depth(const GemvParams& p) {
  const int want = g_ring_stages.load();
  if (want >= 0) return want;
  const int64_t bytes = int64_t{p.n} * p.k * 2;
  return M == 1 && p.k >= kRingMinDim && p.n >= kRingMinDim && bytes <= kRingMaxBytes ? 3 : 0;
}

// One row on registers: the items loaded before the wait by bulk copy (S = 1) for weights of at
// least kBulkMinBytes (policy), or as set_gemv_bulk forces. Measured on the H200 (run 30, batch
// 1, ctx 2048, same binary, two interleaved pairs): on every m = 1 projection (call 5)
// Qwen3-30B-A3B 359.6 / 360.5 -> 352.0 / 352.2 tok/s, V2-Lite 501.3 / 500.7 -> 486.2 / 486.8,
// Llama-3.1-8B 228.2 -> 230.6; with the 64 MB policy (call 6) Qwen3 359.8 / 358.5 -> 360.0 /
// 359.9, V2-Lite 499.7 / 499.6 -> 499.9 / 500.4, Llama 228.2 / 227.9 -> 230.4 / 230.4 (its
// gate_up and down, 235 / 117 MB, and the lm_heads take it).
// bench_cuda_l2lat: the loads in flight of register streams slow every L2 hit on their SM
// (149 -> 348 ns per hop), bulk copies' do not (150), but a bulk stream saturates HBM, which
// slows L2 hits everywhere (~700-1,200 ns): small projections, which run beside the attention
// and the router, keep the registers.
constexpr int64_t kBulkMinBytes = int64_t{64} << 20;
EnvSetting g_bulk_mode{"DEEPINFER_GEMV_BULK", -1};
std::atomic<int64_t> g_bulk_launches{0};
bool bulk_items(const GemvParams& p) {
  const int mode = g_bulk_mode.load();
  if (mode >= 0) return mode != 0;
  return int64_t{p.n} * p.k * 2 >= kBulkMinBytes;
}

template <int M, GemvIn IN>
cudaError_t launch_m_in(const GemvParams& p, int num_sms, cudaStream_t stream) {
  if constexpr (M <= kRingMaxRows) {
    bool launched = false;
    cudaError_t err = cudaSuccess;
    switch (ring_depth<M>(p)) {
      case 2: err = launch_ring<M, IN, 2>(p, num_sms, stream, &launched); break;
      case 3: err = launch_ring<M, IN, 3>(p, num_sms, stream, &launched); break;
      default: break;
    }
    if (err != cudaSuccess || launched) return err;
  }
  int occ = 0;
  if constexpr (M == 1) {
    if (bulk_items(p)) {  // the first items by bulk copy (S = 1) when its shared memory fits
      const int64_t bsmem =
          staged_bytes<M, 1>(p.k) + int64_t{kWarps} * 2 * kLoadsPerLane<M> * 32 * 16;
      cudaError_t err = occupancy<M, IN, 1>(bsmem, &occ);
      if (err != cudaSuccess) return err;
      if (occ > 0) {
        g_bulk_launches.fetch_add(1, std::memory_order_relaxed);
        return launch_grid<M, IN, 1>(p, num_sms, occ, bsmem, stream);
      }
    }
  }
  const int64_t smem = staged_bytes<M, 0>(p.k);
  cudaError_t err = occupancy<M, IN, 0>(smem, &occ);
  if (err != cudaSuccess) return err;
  return launch_grid<M, IN, 0>(p, num_sms, occ, smem, stream);
}

template <int M>
cudaError_t launch_m(const GemvParams& p, int num_sms, cudaStream_t stream) {
  switch (p.in) {
    case GemvIn::kNone: return launch_m_in<M, GemvIn::kNone>(p, num_sms, stream);
    case GemvIn::kRmsNorm: return launch_m_in<M, GemvIn::kRmsNorm>(p, num_sms, stream);
    case GemvIn::kSiluMul: return launch_m_in<M, GemvIn::kSiluMul>(p, num_sms, stream);
  }
  return cudaErrorInvalidValue;
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

}  // namespace

bool gemv_supported(const GemvParams& p, int64_t max_smem) {
  if (p.m < 1 || p.m > kGemvMaxRows || p.n < 1 || p.k < 8 || p.k % 8 != 0) return false;
  if (!aligned16(p.x) || !aligned16(p.w) || p.ldx % 8 != 0) return false;
  if (p.in == GemvIn::kRmsNorm && (p.norm_w == nullptr || !aligned16(p.norm_w))) return false;
  if (p.ldx < (p.in == GemvIn::kSiluMul ? 2 * int64_t{p.k} : int64_t{p.k})) return false;
  if (p.y == nullptr && p.residual == nullptr) return false;
  if (p.silu_out && (p.n % 2 != 0 || p.y == nullptr || p.y_f32 || p.bias != nullptr ||
                     p.residual != nullptr))
    return false;
  // The kernel's item arithmetic (locate): items · row_items < 2^32 for any grid and split,
  // with row_items <= 2 · ceil(k / 256) and items <= n_out · row_items.
  const int64_t row_items = 2 * ((int64_t{p.k} / 8 + 31) / 32);
  if (int64_t{p.n} * row_items * row_items >= (int64_t{1} << 32)) return false;
  return gemv_smem_bytes(p.m, p.k) <= std::min<int64_t>(max_smem, kMaxDynSmem);
}

void set_gemv_ring_stages(int stages) {
  g_ring_stages.store(stages);
}
void set_gemv_bulk(int mode) {
  g_bulk_mode.store(mode);
}
int gemv_bulk() {
  return g_bulk_mode.load();
}
int64_t gemv_bulk_launches() {
  return g_bulk_launches.load(std::memory_order_relaxed);
}
int gemv_ring_stages() {
  return g_ring_stages.load();
}
void set_gemv_early(int mode) {
  g_early.store(mode);
}
int gemv_early() {
  return g_early.load();
}
int64_t gemv_early_launches() {
  return g_early_launches.load(std::memory_order_relaxed);
}
void set_gemv_split(int split) {
  g_split.store(split);
}

cudaError_t launch_gemv(const GemvParams& p, int num_sms, cudaStream_t stream) {
  switch (p.m) {
    case 1: return launch_m<1>(p, num_sms, stream);
    case 2: return launch_m<2>(p, num_sms, stream);
    case 3: return launch_m<3>(p, num_sms, stream);
    case 4: return launch_m<4>(p, num_sms, stream);
    case 5: return launch_m<5>(p, num_sms, stream);
    case 6: return launch_m<6>(p, num_sms, stream);
    case 7: return launch_m<7>(p, num_sms, stream);
    case 8: return launch_m<8>(p, num_sms, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace di::cuda
