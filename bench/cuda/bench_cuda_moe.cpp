// Benchmark of CudaBackend::moe_experts (issue #6) with random bf16 weights generated on the GPU.
//
//   decode path (device alignment + gate_up/silu + down + combine, captured in a CUDA graph):
//     DeepSeek-V2-Lite (H 2048, I 1408, E 64, top-6) and Qwen3-30B-A3B (H 2048, I 768, E 128,
//     top-8) at 2 / 4 / 8 / 16 tokens per expert (T chosen so every expert is touched that often)
//     and at T = 1; reports GB/s of expert weights read (touched experts x 3·H·I bf16) vs the 4.28
//     TB/s copy bandwidth, graph replay and eager times. Also path=decode_grouped: the tensor-core
//     grouped GEMM path at the same sizes (graph replay), except with --quick.
//   prefill at T = 4096, both paths: cuBLAS per expert after one read-back of the counts (default)
//     and the tensor-core grouped GEMM on device offsets (set_moe_grouped_gemm): TFLOP/s
//     (2 · T·k · 3·H·I) vs 787 TFLOP/s cuBLAS bf16 peak.
//
//   router (moe_route kernels alone, 20 launches per CUDA graph): serial (one thread per token)
//     vs warp (one warp per token) for the V2-Lite, Qwen3-30B-A3B and V3 router configs at
//     T = 1 / 32 / 256: "[moe] router=... T=... serial_us=... warp_us=..." (--router: only these).
//
//   T = 1 also as a chain of 8 calls on distinct experts in one graph (path=decode_t1_chain, the
//   way the model's layers follow each other), and with --trace FILE (a -DDI_TRACE=1 build) that
//   chain's kernel timeline to FILE.<shape>.csv (scripts/trace_layers.py).
//
//   bench_cuda_moe [--quick] [--grouped] [--router] [--t1] [--trace FILE] [--ncu]
//     --t1: one token only; --grouped: only the grouped prefill GEMM, so that a fault in the
//     opt-in kernel cannot hide the other numbers; --ncu: one more replay of the T = 1 chain
//     between cudaProfilerStart / Stop, for `ncu --profile-from-start off --graph-profiling node`
//     (each gate_up and down launch of the chain alone).
// Prints "[moe] ..." lines (machine-readable key=value).
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/kernels/moe.h"
#include "backend/cuda/kernels/trace.h"
#include "core/env.h"
#include "h200_ceilings.h"
#include "trace_csv.h"

namespace di {
namespace {

using di::bench::kCopyBw;
using di::bench::kPeakFlops;

struct MoeShape {
  const char* name;
  int64_t hidden, inter, experts, top_k;
};

// Median over `reps` of the mean time (us) of `inner` back-to-back calls, after `warmup` calls.
double time_us(cuda::CudaBackend& be, int warmup, int reps, int inner, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  be.synchronize();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(a, be.stream());
    for (int i = 0; i < inner; ++i) fn();
    cudaEventRecord(b, be.stream());
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    us.push_back(1e3 * ms / inner);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

Tensor host_i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// Balanced routing: slot (t, j) -> expert (offset + t·k + j) mod E (distinct within a token).
std::vector<int32_t> balanced_ids(int64_t tokens, int64_t k, int64_t experts, int64_t offset = 0) {
  std::vector<int32_t> ids(static_cast<size_t>(tokens * k));
  for (int64_t i = 0; i < tokens * k; ++i)
    ids[static_cast<size_t>(i)] = static_cast<int32_t>((offset + i) % experts);
  return ids;
}

// Bytes of one expert's gate, up and down matrices (bf16).
double expert_bytes(const MoeShape& s) {
  return 3.0 * static_cast<double>(s.hidden * s.inter) * 2.0;
}

struct Problem {
  Tensor x, ids, weights, out;
  int64_t tokens = 0, touched = 0;
};

Problem make_problem(cuda::CudaBackend& be, const MoeShape& s, int64_t tokens, uint64_t seed,
                     int64_t first_expert = 0) {
  Problem p;
  p.tokens = tokens;
  p.x = be.empty({tokens, s.hidden}, DType::kBF16);
  be.fill_random(p.x, seed, 1.0f);
  const std::vector<int32_t> ids = balanced_ids(tokens, s.top_k, s.experts, first_expert);
  p.touched = static_cast<int64_t>(std::set<int32_t>(ids.begin(), ids.end()).size());
  p.ids = be.upload(host_i32(ids), DType::kI32).reshape({tokens, s.top_k});
  Tensor w = Tensor::empty({tokens, s.top_k}, DType::kF32);
  for (int64_t i = 0; i < w.numel(); ++i) w.f32()[i] = 1.0f / static_cast<float>(s.top_k);
  p.weights = be.upload(w, DType::kF32);
  p.out = be.empty({tokens, s.hidden}, DType::kBF16);
  be.synchronize();
  return p;
}

// The one-token path as the model runs it, one call after another: kT1ChainCalls calls, call c
// routed to experts c·k .. c·k + k - 1 (mod E: no call reads what the previous one left in L2),
// captured in one graph. Prints the time per call ("path=decode_t1_chain"); with --trace FILE (a
// -DDI_TRACE=1 build) replays the graph once more with every instrumented CTA recorded, to
// FILE.<shape>.csv: scripts/trace_layers.py then gives each call's gate_up and down on a
// timeline (its "layers" are the calls), without the attention and router around them.
constexpr int kT1ChainCalls = 8;
void bench_t1_chain(cuda::CudaBackend& be, const MoeShape& s, const ExpertWeights& w,
                    const std::string& trace_path, bool ncu) {
  std::vector<Problem> ps;
  for (int c = 0; c < kT1ChainCalls; ++c)
    ps.push_back(make_problem(be, s, 1, 500 + static_cast<uint64_t>(c), int64_t{c} * s.top_k));
  const int64_t saved = be.moe_device_max_slots();
  be.set_moe_device_max_slots(int64_t{1} << 40);
  auto op = [&] {
    for (Problem& p : ps) be.moe_experts(p.x, p.ids, p.weights, w, p.out);
  };
  op();
  cuda::CudaGraph graph;
  graph.capture(be, op);
  const double us = time_us(be, 3, 7, 5, [&] { graph.replay(); }) / kT1ChainCalls;
  const double bytes = static_cast<double>(s.top_k) * expert_bytes(s);
  const double gbps = bytes / (us * 1e-6) / 1e9;
  std::printf(
      "[moe] shape=%s path=decode_t1_chain calls=%d k=%lld us_per_call=%.1f GBps=%.0f "
      "pct_bw=%.1f\n",
      s.name, kT1ChainCalls, static_cast<long long>(s.top_k), us, gbps,
      100.0 * gbps * 1e9 / kCopyBw);
  if (!trace_path.empty()) {
    be.synchronize();
    if (!cuda::trace_enable(1u << 20)) {
      std::printf("[trace] not recorded: this binary was built without -DDI_TRACE=1\n");
    } else {
      graph.replay();
      be.synchronize();
      bench::write_trace_csv(trace_path + "." + s.name + ".csv", cuda::trace_read());
    }
  }
  if (ncu) {  // one replay alone in the profiler's range (see the header)
    be.synchronize();
    CUDA_CHECK(cudaProfilerStart());
    graph.replay();
    be.synchronize();
    CUDA_CHECK(cudaProfilerStop());
  }
  be.synchronize();
  be.set_moe_device_max_slots(saved);
  std::fflush(stdout);
}

void bench_shape(cuda::CudaBackend& be, const MoeShape& s, bool quick, bool grouped_only,
                 bool t1_only, const std::string& trace_path, bool ncu) {
  ExpertWeights w{be.empty({s.experts, 2 * s.inter, s.hidden}, DType::kBF16),
                  be.empty({s.experts, s.hidden, s.inter}, DType::kBF16)};
  be.fill_random(w.gate_up, 11, 0.05f);
  be.fill_random(w.down, 12, 0.05f);
  be.synchronize();
  const int64_t saved = be.moe_device_max_slots();

  // Decode: T = 1, then ~all experts touched with 2 / 4 / 8 tokens each.
  std::vector<std::pair<int64_t, int64_t>> runs{{1, 1}};  // (tokens_per_expert, T)
  for (int64_t tpe : {2, 4, 8, 16}) runs.emplace_back(tpe, (tpe * s.experts + s.top_k - 1) / s.top_k);
  if (grouped_only) runs.clear();
  if (t1_only) runs.resize(1);
  for (auto [tpe, tokens] : runs) {
    Problem p = make_problem(be, s, tokens, 100 + static_cast<uint64_t>(tokens));
    if (tpe >= 2 && !quick) {
      // The tensor-core grouped GEMM at the same decode sizes (graph-captured, as
      // DEEPINFER_MOE_DECODE_GROUPED_MIN_ROWS would use it): path=decode_grouped.
      be.set_moe_device_max_slots(0);
      be.set_moe_grouped_gemm(true);
      auto op = [&] { be.moe_experts(p.x, p.ids, p.weights, w, p.out); };
      op();
      cuda::CudaGraph graph;
      graph.capture(be, op);
      const double us = time_us(be, 3, 7, 20, [&] { graph.replay(); });
      be.set_moe_grouped_gemm(false);
      be.set_moe_device_max_slots(saved);
      const double gbps = static_cast<double>(p.touched) * expert_bytes(s) / (us * 1e-6) / 1e9;
      std::printf("[moe] shape=%s path=decode_grouped tokens_per_expert=%lld T=%lld k=%lld experts_touched=%lld "
                  "us=%.1f GBps=%.0f pct_bw=%.1f\n",
                  s.name, static_cast<long long>(tpe), static_cast<long long>(tokens),
                  static_cast<long long>(s.top_k), static_cast<long long>(p.touched), us, gbps,
                  100.0 * gbps * 1e9 / kCopyBw);
      std::fflush(stdout);
    }
    be.set_moe_device_max_slots(int64_t{1} << 40);
    auto op = [&] { be.moe_experts(p.x, p.ids, p.weights, w, p.out); };
    const double eager_us = time_us(be, 3, quick ? 3 : 7, 10, op);
    cuda::CudaGraph graph;
    graph.capture(be, op);
    const double us = time_us(be, 3, quick ? 3 : 7, 20, [&] { graph.replay(); });
    be.set_moe_device_max_slots(saved);
    const double bytes = static_cast<double>(p.touched) * expert_bytes(s);
    const double gbps = bytes / (us * 1e-6) / 1e9;
    std::printf("[moe] shape=%s path=decode tokens_per_expert=%lld T=%lld k=%lld experts_touched=%lld "
                "us=%.1f eager_us=%.1f GBps=%.0f pct_bw=%.1f\n",
                s.name, static_cast<long long>(tpe), static_cast<long long>(tokens),
                static_cast<long long>(s.top_k), static_cast<long long>(p.touched), us, eager_us, gbps,
                100.0 * gbps * 1e9 / kCopyBw);
    std::fflush(stdout);
    if (tokens == 1) bench_t1_chain(be, s, w, trace_path, ncu);
  }

  // Prefill at T = 4096: cuBLAS per expert after one counts read-back (the default), and the
  // tensor-core grouped GEMM on device offsets (opt-in, set_moe_grouped_gemm).
  for (const bool grouped : {false, true}) {
    if (grouped != grouped_only || t1_only) continue;
    const int64_t tokens = 4096;
    Problem p = make_problem(be, s, tokens, 7);
    be.set_moe_grouped_gemm(grouped);
    auto op = [&] { be.moe_experts(p.x, p.ids, p.weights, w, p.out); };
    const double us = time_us(be, 2, quick ? 3 : 5, 3, op);
    be.set_moe_grouped_gemm(false);
    const double flops = 2.0 * static_cast<double>(tokens * s.top_k) * 3.0 * static_cast<double>(s.hidden * s.inter);
    const double tflops = flops / (us * 1e-6) / 1e12;
    std::printf("[moe] shape=%s path=%s T=%lld k=%lld us=%.1f TFLOPs=%.1f pct_peak=%.1f\n", s.name,
                grouped ? "prefill_grouped" : "prefill_cublas", static_cast<long long>(tokens),
                static_cast<long long>(s.top_k), us, tflops, 100.0 * tflops * 1e12 / kPeakFlops);
    std::fflush(stdout);
  }
}

struct RouterShape {
  const char* name;
  int32_t experts, top_k, groups, topk_groups;
  bool sigmoid, top_two, bias;
};

void bench_router(cuda::CudaBackend& be, bool quick) {
  const RouterShape shapes[] = {{"v2lite", 64, 6, 1, 1, false, false, false},
                                {"qwen3_30b_a3b", 128, 8, 1, 1, false, false, false},
                                {"v3", 256, 8, 8, 4, true, true, true}};
  for (const RouterShape& r : shapes) {
    for (int64_t tokens : {1, 32, 256}) {
      Tensor logits_host = Tensor::empty({tokens, r.experts}, DType::kF32);
      Tensor bias_host = Tensor::empty({r.experts}, DType::kF32);
      uint32_t state = 12345u;
      auto next = [&state] {  // LCG, uniform in [-1, 1)
        state = state * 1664525u + 1013904223u;
        return static_cast<float>(state >> 8) * (2.0f / 16777216.0f) - 1.0f;
      };
      for (int64_t i = 0; i < logits_host.numel(); ++i) logits_host.f32()[i] = 3.0f * next();
      for (int64_t i = 0; i < bias_host.numel(); ++i) bias_host.f32()[i] = 0.1f * next();
      const Tensor logits = be.upload(logits_host, DType::kF32);
      const Tensor bias = be.upload(bias_host, DType::kF32);
      Tensor ids = be.empty({tokens, r.top_k}, DType::kI32);
      Tensor wts = be.empty({tokens, r.top_k}, DType::kF32);
      be.synchronize();
      const cuda::MoeRouteParams p{static_cast<const float*>(logits.raw()),
                                   r.bias ? static_cast<const float*>(bias.raw()) : nullptr,
                                   static_cast<int32_t*>(ids.raw()), static_cast<float*>(wts.raw()), tokens,
                                   r.experts, r.top_k, r.groups, r.topk_groups, r.sigmoid, r.top_two,
                                   true, 1e-20f, 1.0f};
      double us[2];
      const cuda::MoeRouteImpl impls[2] = {cuda::MoeRouteImpl::kSerial, cuda::MoeRouteImpl::kWarp};
      for (int i = 0; i < 2; ++i) {
        constexpr int kLaunches = 20;
        cuda::CudaGraph graph;
        graph.capture(be, [&] {
          for (int l = 0; l < kLaunches; ++l) cuda::launch_moe_route(p, be.stream(), impls[i]);
        });
        us[i] = time_us(be, 2, quick ? 3 : 7, 1, [&] { graph.replay(); }) / kLaunches;
      }
      std::printf("[moe] router=%s T=%lld E=%d k=%d serial_us=%.2f warp_us=%.2f speedup=%.1f\n", r.name,
                  static_cast<long long>(tokens), r.experts, r.top_k, us[0], us[1], us[0] / us[1]);
      std::fflush(stdout);
    }
  }
  // The router with its pre-norm (Backend::moe_norm_route) at decode sizes: the fused kernel
  // (at every size it takes, beyond the backend's default policy) against rms_norm + router
  // GEMM + moe_route, 20 launches per graph.
  be.set_moe_norm_route_max_elems(cuda::kNormRouteMaxElems);
  for (const RouterShape& r : shapes) {
    const int64_t hidden = std::strcmp(r.name, "v3") == 0 ? 7168 : 2048;
    for (int64_t tokens : {1, 2, 4}) {
      Tensor x = be.empty({tokens, hidden}, DType::kBF16), nw = be.empty({hidden}, DType::kBF16);
      Tensor gate = be.empty({r.experts, hidden}, DType::kBF16),
             h = be.empty({tokens, hidden}, DType::kBF16);
      be.fill_random(x, 21, 2.0f);
      be.fill_random(nw, 22, 1.0f);
      be.fill_random(gate, 23, 0.1f);
      Tensor bias = Tensor::empty({r.experts}, DType::kF32);
      for (int64_t i = 0; i < r.experts; ++i) bias.f32()[i] = 0.001f * static_cast<float>(i % 7);
      Tensor ids = be.empty({tokens, r.top_k}, DType::kI32),
             wts = be.empty({tokens, r.top_k}, DType::kF32);
      MoeNormRouteParams q;
      q.x = &x;
      q.norm_w = &nw;
      q.gate = &gate;
      q.routing.num_experts = r.experts;
      q.routing.top_k = r.top_k;
      q.routing.num_groups = r.groups;
      q.routing.topk_groups = r.topk_groups;
      q.routing.scoring =
          r.sigmoid ? MoeRoutingParams::Scoring::kSigmoid : MoeRoutingParams::Scoring::kSoftmax;
      q.routing.group_score =
          r.top_two ? MoeRoutingParams::GroupScore::kTopTwoSum : MoeRoutingParams::GroupScore::kMax;
      q.routing.correction_bias = r.bias ? &bias : nullptr;
      q.h = &h;
      q.topk_ids = &ids;
      q.topk_weights = &wts;
      double us[2];
      for (int fused = 1; fused >= 0; --fused) {
        be.set_moe_fused(fused);
        be.moe_norm_route(q);  // eager first (uploads the host bias)
        constexpr int kLaunches = 20;
        cuda::CudaGraph graph;
        graph.capture(be, [&] {
          for (int l = 0; l < kLaunches; ++l) be.moe_norm_route(q);
        });
        us[fused] = time_us(be, 2, quick ? 3 : 7, 1, [&] { graph.replay(); }) / kLaunches;
      }
      be.set_moe_fused(-1);
      std::printf("[moe] norm_route=%s T=%lld H=%lld E=%d k=%d fused_us=%.2f composed_us=%.2f\n",
                  r.name, static_cast<long long>(tokens), static_cast<long long>(hidden), r.experts,
                  r.top_k, us[1], us[0]);
      std::fflush(stdout);
    }
  }
}

}  // namespace
}  // namespace di

int main(int argc, char** argv) {
  if (!di::env::report_environment("bench_cuda_moe")) return 2;  // core/env.h
  using namespace di;
  bool quick = false, grouped_only = false, router_only = false, t1_only = false;
  std::string trace_path;
  bool ncu = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--ncu")) ncu = true;
    if (!std::strcmp(argv[i], "--router")) router_only = true;
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    if (!std::strcmp(argv[i], "--grouped")) grouped_only = true;
    if (!std::strcmp(argv[i], "--t1")) t1_only = true;  // one token only (the T = 1 kernels)
    if (!std::strcmp(argv[i], "--trace")) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_cuda_moe: --trace needs a file prefix\n");
        return 2;
      }
      trace_path = argv[++i];
    }
  }
  if (!cuda::cuda_available()) {
    std::printf("[moe] skipped: no CUDA device\n");
    return 0;
  }
  try {
    cuda::CudaBackend be;
    if (router_only) {
      bench_router(be, quick);
      return 0;
    }
    const MoeShape shapes[] = {{"v2lite", 2048, 1408, 64, 6}, {"qwen3_30b_a3b", 2048, 768, 128, 8}};
    for (const MoeShape& s : shapes) {
      bench_shape(be, s, quick, grouped_only, t1_only, trace_path, ncu);
      be.synchronize();
      be.allocator().release_cached();
    }
  } catch (const std::exception& e) {
    std::printf("[moe] error: %s\n", e.what());
    return 1;
  }
  return 0;
}
