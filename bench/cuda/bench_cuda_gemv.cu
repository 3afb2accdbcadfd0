// The batch-1 decode GEMV in isolation (issue #5): how close each Llama-3.1-8B projection comes
// to the bandwidth it could have, and what the weights-in-flight design buys.
//
//   [floor] a pure streaming read (no math) of the same bytes, U 16-byte loads in flight per
//           thread, full occupancy: the most a kernel of this size can get from HBM;
//   [gemv]  launch_gemv (kernels/gemv.h) for qkv / o_proj / gate_up (silu·mul epilogue) / down
//           at m = 1, and the same shapes before run 13 (gu_plain, down_silu: silu·mul in down's
//           prologue) and without the norm (qkv_copy): 16 launches on 16 distinct weight matrices
//           captured in one CUDA graph (PDL as in the model), for every weights-in-flight setting
//           (the policy, registers, cp.async rings of 2 / 3 stages; forced k splits for the
//           registers), plus a decoder-layer sequence (qkv, o, gate_up, down) x 8 (a tensor-core
//           variant measured here in run 13 lost to the FMA kernel and was removed);
//   [check] every ring setting's outputs against the register kernel's, bitwise (the reduction
//           order is the same by construction).
//
//   bench_cuda_gemv [--reps 20] [--shapes llama|moe]
//
// --shapes moe (run 37): the batch-1 attention projections of the MoE models instead
// (Qwen3-30B-A3B's qkv 5120 x 2048 and o_proj 2048 x 4096, DeepSeek-V2-Lite's q|kv_a 3648 x 2048
// and o_proj 2048 x 2048), without the layer sequence.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/kernels/gemv.h"
#include "core/env.h"

#include "graph_timing.h"
#include "h200_ceilings.h"

namespace {

using di::bench::kCopyBw;
constexpr int kMats = 16;            // distinct matrices per graph: 16 x 34 MB > 50 MB of L2

#define CK(x) DI_BENCH_CK(x)

__global__ void fill_kernel(__nv_bfloat16* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t h = (static_cast<uint64_t>(i) + seed) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    const float u = static_cast<float>(h & 0xFFFFFF) / 16777216.0f;  // [0, 1)
    p[i] = __float2bfloat16_rn((2.0f * u - 1.0f) * scale);
  }
}

// Streams n16 16-byte vectors, U per thread in flight, and folds them into one word per thread
// (written only when it would be a magic value, so nothing is eliminated).
template <int U>
__global__ void __launch_bounds__(256)
    read_floor_kernel(const uint4* p, int64_t n16, uint32_t* sink) {
  uint32_t acc = 0;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x * U;
  for (int64_t base = (blockIdx.x * int64_t{blockDim.x}) * U + threadIdx.x; base < n16;
       base += stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + int64_t{u} * blockDim.x;
      if (i < n16) {
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                     : "l"(p + i));
      } else {
        v[u] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678u) sink[threadIdx.x] = acc;
}

__nv_bfloat16* alloc_random(int64_t n, uint64_t seed, float scale) {
  __nv_bfloat16* p = nullptr;
  CK(cudaMalloc(&p, static_cast<size_t>(n) * 2));
  fill_kernel<<<1024, 256>>>(p, n, seed, scale);
  CK(cudaGetLastError());
  return p;
}

struct Proj {
  const char* name;
  di::cuda::GemvIn in;
  int32_t n, k;
  bool residual;  // x += (o_proj, down) instead of y =
  bool silu_out;  // y = silu(gate) · up of the two output halves
};

struct ProjBufs {
  std::vector<__nv_bfloat16*> w;  // kMats matrices [n, k]
  __nv_bfloat16 *x, *norm_w, *y, *res;
};

ProjBufs make_bufs(const Proj& pr, uint64_t seed) {
  ProjBufs b;
  for (int i = 0; i < kMats; ++i)
    b.w.push_back(alloc_random(int64_t{pr.n} * pr.k, seed + i, 0.02f));
  const int64_t xcols = pr.in == di::cuda::GemvIn::kSiluMul ? 2 * int64_t{pr.k} : pr.k;
  b.x = alloc_random(xcols, seed + 100, 1.0f);
  b.norm_w = alloc_random(pr.k, seed + 101, 1.0f);
  b.y = alloc_random(pr.n, seed + 102, 1.0f);
  b.res = alloc_random(pr.n, seed + 103, 1.0f);
  return b;
}

di::cuda::GemvParams params(const Proj& pr, const ProjBufs& b, int i, bool accumulate) {
  di::cuda::GemvParams p;
  p.in = pr.in;
  p.x = b.x;
  p.ldx = pr.in == di::cuda::GemvIn::kSiluMul ? 2 * int64_t{pr.k} : pr.k;
  p.norm_w = b.norm_w;
  p.eps = 1e-5f;
  p.w = b.w[i];
  if (pr.residual && accumulate) {
    p.residual = b.res;
    p.ldr = pr.n;
  } else {
    p.y = b.y;
    p.ldy = pr.n;
  }
  p.m = 1;
  p.n = pr.n;
  p.k = pr.k;
  p.silu_out = pr.silu_out;
  if (pr.silu_out) p.ldy = pr.n / 2;
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  if (!di::env::report_environment("bench_cuda_gemv")) return 2;  // core/env.h
  int reps = 20;
  bool moe = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--shapes") == 0 && i + 1 < argc) {
      const char* v = argv[++i];
      if (std::strcmp(v, "moe") == 0) {
        moe = true;
      } else if (std::strcmp(v, "llama") != 0) {
        std::fprintf(stderr, "--shapes: expected llama or moe, got '%s'\n", v);
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: bench_cuda_gemv [--reps N] [--shapes llama|moe]\n");
      return 2;
    }
  }
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint32_t* sink = nullptr;
  CK(cudaMalloc(&sink, 1024 * 4));

  // The first four are a decoder layer as the model issues it (silu·mul in gate_up's epilogue);
  // then the shapes before run 13 (silu·mul in down's prologue) and without prologue math.
  const std::vector<Proj> llama_projs = {
      {"qkv", di::cuda::GemvIn::kRmsNorm, 6144, 4096, false, false},
      {"o_proj", di::cuda::GemvIn::kNone, 4096, 4096, true, false},
      {"gate_up", di::cuda::GemvIn::kRmsNorm, 28672, 4096, false, true},
      {"down", di::cuda::GemvIn::kNone, 4096, 14336, true, false},
      {"gu_plain", di::cuda::GemvIn::kRmsNorm, 28672, 4096, false, false},
      {"down_silu", di::cuda::GemvIn::kSiluMul, 4096, 14336, true, false},
      {"qkv_copy", di::cuda::GemvIn::kNone, 6144, 4096, false, false},
  };
  const std::vector<Proj> moe_projs = {
      {"q3_qkv", di::cuda::GemvIn::kRmsNorm, 5120, 2048, false, false},
      {"q3_o", di::cuda::GemvIn::kNone, 2048, 4096, true, false},
      {"v2_qkva", di::cuda::GemvIn::kRmsNorm, 3648, 2048, false, false},
      {"v2_o", di::cuda::GemvIn::kNone, 2048, 2048, true, false},
      {"q3_qkv_cp", di::cuda::GemvIn::kNone, 5120, 2048, false, false},
  };
  const std::vector<Proj>& projs = moe ? moe_projs : llama_projs;
  const int kProjs = static_cast<int>(projs.size());
  std::vector<ProjBufs> bufs;
  for (int i = 0; i < kProjs; ++i) bufs.push_back(make_bufs(projs[i], 1000 * (i + 1)));
  CK(cudaDeviceSynchronize());

  // D2D copy reference (1 GiB read + 1 GiB written).
  {
    const size_t bytes = size_t{1} << 30;
    void *a = nullptr, *b = nullptr;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemsetAsync(a, 1, bytes, s));
    const double ms =
        di::bench::graph_replay_ms(s, reps, [&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s)); });
    std::printf("[copy] 1 GiB D2D: %.3f ms = %.2f TB/s (read + write)\n", ms,
                2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e12);
    CK(cudaFree(a));
    CK(cudaFree(b));
  }

  // Pure-read floor per projection size, U loads in flight per thread.
  auto floor_row = [&](const char* name, int64_t bytes, const std::vector<__nv_bfloat16*>& mats) {
    auto one = [&](auto uc) {
      constexpr int U = decltype(uc)::value;
      int occ = 0;
      CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, read_floor_kernel<U>, 256, 0));
      const int grid = occ * sms;
      const double ms = di::bench::graph_replay_ms(s, reps, [&] {
        for (int i = 0; i < kMats; ++i) {
          read_floor_kernel<U>
              <<<grid, 256, 0, s>>>(reinterpret_cast<const uint4*>(mats[i]), bytes / 16, sink);
        }
      });
      const double us = ms * 1e3 / kMats;
      std::printf(
          "[floor] %-8s %7.1f MB  U=%d (%3lld KB in flight/SM)  %7.2f us  %5.2f TB/s  %5.1f %%\n",
          name, bytes / 1e6, U, static_cast<long long>(occ) * 256 * U * 16 / 1024, us,
          bytes / (us * 1e-6) / 1e12, 100.0 * bytes / (us * 1e-6) / kCopyBw);
    };
    one(std::integral_constant<int, 2>{});
    one(std::integral_constant<int, 4>{});
    one(std::integral_constant<int, 8>{});
  };
  for (int i = 0; i < kProjs; ++i) {
    floor_row(projs[i].name, int64_t{projs[i].n} * projs[i].k * 2, bufs[i].w);
  }

  // The GEMV per projection and per weights-in-flight setting.
  // -1 the ring policy, 0 registers, 2 / 3 rings.
  const int settings[] = {-1, 0, 2, 3};
  auto setting_name = [](int st) {
    return st == 0  ? std::string("regs")
           : st < 0 ? std::string("policy")
                    : "ring" + std::to_string(st);
  };
  auto bf16f = [](uint16_t h) {
    const uint32_t u = uint32_t{h} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  // max |a - b| / max |b| over the outputs (other k splits sum in another order).
  auto rel_diff = [&](const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      md = std::max(md, static_cast<double>(std::fabs(bf16f(a[i]) - bf16f(b[i]))));
      mb = std::max(mb, static_cast<double>(std::fabs(bf16f(b[i]))));
    }
    return mb > 0 ? md / mb : md;
  };
  // Reference outputs (registers), for the bitwise check.
  std::vector<std::vector<uint16_t>> ref(kProjs);
  auto out_of = [&](int i) {
    const Proj& pr = projs[i];
    std::vector<uint16_t> h(static_cast<size_t>(pr.silu_out ? pr.n / 2 : pr.n));
    // y = gemv(x) (no accumulation) so the output does not depend on earlier runs.
    di::cuda::GemvParams p = params(pr, bufs[i], 0, false);
    CK(di::cuda::launch_gemv(p, sms, s));
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(h.data(), bufs[i].y, h.size() * 2, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    return h;
  };
  di::cuda::set_gemv_ring_stages(0);
  for (int i = 0; i < kProjs; ++i) ref[i] = out_of(i);
  int mismatches = 0;
  for (int st : settings) {
    const bool quick = st != 0;  // the forced splits only for the registers
    di::cuda::set_gemv_ring_stages(st);
    // Forced warps per row first (a split the shape does not allow falls back to the rule).
    for (int sp : {2, 4}) {
      if (quick) break;
      di::cuda::set_gemv_split(sp);
      for (int i = 0; i < kProjs; ++i) {
        const Proj& pr = projs[i];
        const std::vector<uint16_t> got = out_of(i);
        if (got != ref[i])
          std::printf(
              "[gemv] %s %s split %d: output differs from regs by %.2e rel (expected: other k "
              "split)\n",
              pr.name, setting_name(st).c_str(), sp, rel_diff(got, ref[i]));
        const double ms = di::bench::graph_replay_ms(s, reps, [&] {
          for (int j = 0; j < kMats; ++j)
            CK(di::cuda::launch_gemv(params(pr, bufs[i], j, true), sms, s));
        });
        const double us = ms * 1e3 / kMats;
        const double bytes = 2.0 * pr.n * pr.k;
        std::printf("[gemv] %-8s %-6s split%d %7.2f us  %5.2f TB/s  %5.1f %% of copy BW\n", pr.name,
                    setting_name(st).c_str(), sp, us, bytes / (us * 1e-6) / 1e12,
                    100.0 * bytes / (us * 1e-6) / kCopyBw);
      }
    }
    di::cuda::set_gemv_split(0);
    double layer_sum = 0;
    for (int i = 0; i < kProjs; ++i) {
      const Proj& pr = projs[i];
      const std::vector<uint16_t> got = out_of(i);
      const bool same = got == ref[i];
      const double rd = rel_diff(got, ref[i]);
      // Every setting sums in the same order: the registers' outputs bitwise.
      if (!same) ++mismatches;
      const double ms = di::bench::graph_replay_ms(s, reps, [&] {
        for (int j = 0; j < kMats; ++j) {
          CK(di::cuda::launch_gemv(params(pr, bufs[i], j, true), sms, s));
        }
      });
      const double us = ms * 1e3 / kMats;
      const double bytes = 2.0 * pr.n * pr.k;
      if (i < 4) layer_sum += us;
      std::printf(
          "[gemv] %-8s %-6s %7.2f us  %5.2f TB/s  %5.1f %% of copy BW  (ideal %.2f us)  vs regs: "
          "%s (%.2e rel)\n",
          pr.name, setting_name(st).c_str(), us, bytes / (us * 1e-6) / 1e12,
          100.0 * bytes / (us * 1e-6) / kCopyBw, bytes / kCopyBw * 1e6,
          same ? "bitwise equal" : "differs", rd);
    }
    if (moe) continue;  // the layer sequence is Llama's
    // A decoder layer's four projections in sequence, 8 layers (distinct weights).
    const double ms = di::bench::graph_replay_ms(s, reps, [&] {
      for (int l = 0; l < 8; ++l) {
        for (int i = 0; i < 4; ++i)
          CK(di::cuda::launch_gemv(params(projs[i], bufs[i], l, true), sms, s));
      }
    });
    double bytes = 0;
    for (int i = 0; i < 4; ++i) bytes += 2.0 * projs[i].n * projs[i].k;
    std::printf(
        "[gemv] layer    %-6s %7.2f us per layer (sum of the four alone %.2f)  %5.2f TB/s  %5.1f "
        "%%\n",
        setting_name(st).c_str(), ms * 1e3 / 8, layer_sum, bytes / (ms * 1e-3 / 8) / 1e12,
        100.0 * bytes / (ms * 1e-3 / 8) / kCopyBw);
  }
  std::printf("[check] settings vs registers: %d mismatching outputs\n", mismatches);
  return mismatches == 0 ? 0 : 1;
}
