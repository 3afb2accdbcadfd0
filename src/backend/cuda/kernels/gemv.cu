// Small-M fused linear layers of the decode path; the contract is in gemv.h.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gemv.h"

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

__device__ __forceinline__ float round_bf16(float v) { return to_f32(from_f32<bf16>(v)); }

// Two floats to a bf16 pair (round to nearest even, as from_f32<bf16>); a goes to the low half.
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  const uint32_t lo = __bfloat16_as_ushort(__float2bfloat16_rn(a));
  const uint32_t hi = __bfloat16_as_ushort(__float2bfloat16_rn(b));
  return lo | (hi << 16);
}

template <int M, GemvIn IN>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemvParams p, int split) {
  extern __shared__ uint4 xs_vec[];  // [M][k / 8] staged activations
  __shared__ float red[kWarps][M];
  __shared__ float scratch[32];
  // Two register buffers of U 16-byte loads per lane: one is in flight while the other is used.
  constexpr int U = kLoadsPerLane<M>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int k8 = p.k / 8;
  const int rows_per_cta = kWarps / split;
  const int sub = warp % split;          // this warp's share of the row's k
  const int row_in_cta = warp / split;
  const int vstride = 32 * split;        // vectors between one lane's consecutive loads
  const uint4* wbase = static_cast<const uint4*>(p.w);
  // The warp's work as a flat list of items (row group g of this CTA, chunk c of the row), the
  // same count for every warp of the CTA: rows >= n load nothing but keep the CTA in step.
  const int chunks = (k8 + U * vstride - 1) / (U * vstride);
  const int64_t row_step = int64_t{gridDim.x} * rows_per_cta;
  const int64_t first_rb = int64_t{blockIdx.x} * rows_per_cta;
  const int64_t groups = first_rb < p.n ? (p.n - first_rb + row_step - 1) / row_step : 0;
  const int64_t items = groups * chunks;
  auto load = [&](uint4* buf, int64_t item) {
    const int64_t r = first_rb + (item / chunks) * row_step + row_in_cta;
    const int base = sub * 32 + static_cast<int>(item % chunks) * U * vstride;
    const uint4* wr = wbase + r * k8;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = base + lane + u * vstride;
      buf[u] = (r < p.n && v < k8) ? ld_stream(wr + v) : make_uint4(0, 0, 0, 0);
    }
  };
  uint4 wa[U], wb[U];
  // The first two items are in flight while the prologue runs.
  if (items > 0) load(wa, 0);
  if (items > 1) load(wb, 1);
  // Programmatic dependent launch (launched with the PDL attribute): everything above reads
  // only the weights, so it may overlap the previous kernel's tail. Wait for that kernel's
  // writes (x, the residual) before the prologue reads them, and let the next PDL kernel start
  // its own weight loads early. Both are no-ops for a plain launch.
  pdl_wait();
  pdl_trigger();

  const bf16* x = static_cast<const bf16*>(p.x);
  if constexpr (IN == GemvIn::kNone) {
    for (int i = threadIdx.x; i < M * k8; i += kThreads) {
      const int m = i / k8, v = i % k8;
      xs_vec[i] = reinterpret_cast<const uint4*>(x + m * p.ldx)[v];
    }
  } else if constexpr (IN == GemvIn::kRmsNorm) {
    // 16-byte loads, unrolled so a thread's loads are in flight together; the second pass reads
    // the same addresses again (L1 hits).
    const uint4* nw = static_cast<const uint4*>(p.norm_w);
#pragma unroll 1
    for (int m = 0; m < M; ++m) {
      const uint4* xr = reinterpret_cast<const uint4*>(x + m * p.ldx);
      float ss = 0.0f;
#pragma unroll 4
      for (int v = threadIdx.x; v < k8; v += kThreads) {
        float f[8];
        unpack8(xr[v], f);
#pragma unroll
        for (int i = 0; i < 8; ++i) ss = fmaf(f[i], f[i], ss);
      }
      ss = block_sum(ss, scratch);
      const float inv = rsqrtf(ss / static_cast<float>(p.k) + p.eps);
#pragma unroll 4
      for (int v = threadIdx.x; v < k8; v += kThreads) {
        float f[8], g[8];
        unpack8(xr[v], f);
        unpack8(nw[v], g);
        uint4 o;
        uint32_t* ou = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
        for (int i = 0; i < 4; ++i) ou[i] = pack2(f[2 * i] * inv * g[2 * i], f[2 * i + 1] * inv * g[2 * i + 1]);
        xs_vec[m * k8 + v] = o;
      }
    }
  } else {
#pragma unroll 1
    for (int m = 0; m < M; ++m) {
      const uint4* gr = reinterpret_cast<const uint4*>(x + m * p.ldx);
      const uint4* ur = reinterpret_cast<const uint4*>(x + m * p.ldx + p.k);
#pragma unroll 4
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
        xs_vec[m * k8 + v] = o;
      }
    }
  }
  __syncthreads();

  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  // acc += the item's weights · staged activations; at the row's last chunk: reduce, write.
  auto consume = [&](const uint4* buf, int64_t item) {
    const int64_t r = first_rb + (item / chunks) * row_step + row_in_cta;
    const int c = static_cast<int>(item % chunks);
    const int base = sub * 32 + c * U * vstride;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = base + lane + u * vstride;
      if (r < p.n && v < k8) {
        float wf[8];
        unpack8(buf[u], wf);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float xf[8];
          unpack8(xs_vec[m * k8 + v], xf);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[m] = fmaf(wf[i], xf[i], acc[m]);
        }
      }
    }
    if (c != chunks - 1) return;
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
    if (sub == 0 && r < p.n) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (lane != m) continue;  // lane m writes row m
        float v = p.y_f32 ? acc[m] : round_bf16(acc[m]);
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
          *res = from_f32<bf16>(to_f32(*res) + v);
        }
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  };
  // Software pipeline over the items: load item i + 2 into the buffer item i has just used.
  for (int64_t it = 0; it < items; it += 2) {
    consume(wa, it);
    if (it + 2 < items) load(wa, it + 2);
    if (it + 1 < items) {
      consume(wb, it + 1);
      if (it + 3 < items) load(wb, it + 3);
    }
  }
}

template <int M, GemvIn IN>
cudaError_t launch_m_in(const GemvParams& p, int num_sms, cudaStream_t stream) {
  // The shared-memory opt-in is per device: once per device this process uses, the most the
  // device allows next to the kernel's static shared memory (gemv_supported keeps below it).
  static std::atomic<uint64_t> opted_in{0};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if ((opted_in.load(std::memory_order_relaxed) & bit) == 0) {
    cudaFuncAttributes fa{};
    int optin = 0;
    if ((err = cudaFuncGetAttributes(&fa, gemv_kernel<M, IN>)) != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (err != cudaSuccess) return err;
    err = cudaFuncSetAttribute(gemv_kernel<M, IN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               optin - static_cast<int>(fa.sharedSizeBytes));
    if (err != cudaSuccess) return err;
    opted_in.fetch_or(bit, std::memory_order_relaxed);
  }
  const int64_t smem = gemv_smem_bytes(M, p.k);
  // Resident CTAs per SM for this shared-memory size (registers and smem), cached per size.
  static std::mutex mu;
  static std::map<int64_t, int> occ_of_smem;
  int occ = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = occ_of_smem.find(smem);
    if (it == occ_of_smem.end()) {
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gemv_kernel<M, IN>, kThreads,
                                                          static_cast<size_t>(smem));
      if (err != cudaSuccess) return err;
      it = occ_of_smem.emplace(smem, std::max(occ, 1)).first;
    }
    occ = it->second;
  }
  // A persistent grid of every resident CTA; a CTA takes row groups round-robin, so the last
  // pass is the tail. The split (warps per row, k split between them) is the smallest one whose
  // groups fill the passes to >= 90%, else the one that fills them best (small n: more splits).
  const int64_t slots = int64_t{occ} * num_sms;
  // A split must leave every lane a full load batch per row chunk (U vectors), or the loads in
  // flight shrink with it (run D: V2-Lite's 3648 x 2048 projection ran split 4 at 1 TB/s).
  constexpr int U = kLoadsPerLane<M>;
  const int max_split = std::max(1, std::min(kWarps, p.k / 8 / (U * 32)));
  int split = 1;
  double best = -1.0;
  for (int s = 1; s <= max_split; s *= 2) {
    const int64_t g = (p.n + kWarps / s - 1) / (kWarps / s);
    const double fill =
        static_cast<double>(g) / static_cast<double>(((g + slots - 1) / slots) * slots);
    if (fill > best + 1e-9) {
      best = fill;
      split = s;
    }
    if (fill >= 0.9) break;
  }
  const int rows_per_cta = kWarps / split;
  const int64_t groups = (p.n + rows_per_cta - 1) / rows_per_cta;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(groups, slots));
  return launch_pdl(gemv_kernel<M, IN>, dim3(grid), dim3(kThreads), static_cast<size_t>(smem),
                    stream, p, split);
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
  return gemv_smem_bytes(p.m, p.k) <= std::min<int64_t>(max_smem, kMaxDynSmem);
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
