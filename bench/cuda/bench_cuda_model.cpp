// Real-model decode benchmark on the CUDA backend with random device weights: the model is the
// REAL model code (src/model: make_random_model over the ModelConfig of a make-model preset),
// every matrix created on the GPU and filled by CudaBackend::fill_random (uniform, std
// 1/sqrt(fan_in); norms ~1; see RandomWeights) — no safetensors are written or read.
//
// The KV cache is filled by writing random values directly (fill_random over the whole pool, no
// prefill), then each concurrency times decode steps of one new token per sequence at position
// `ctx` (so every sequence attends ctx + 1 entries). Steps run through cuda::DecodeGraph, replayed
// as a CUDA graph (MoE included: the decode path of CudaBackend::moe_experts keeps its offsets on
// the device); when a capture fails the step is timed eager instead — the printed mode says which.
//
// Roofline: bytes read per step at 4.3 TB/s = weights touched (attention, dense MLPs, router,
// shared experts, lm_head; for MoE layers the expected number of distinct experts touched by
// conc tokens choosing top-k of E uniformly, E·(1 − (1 − k/E)^conc)) + the KV of conc·(ctx + 1)
// tokens. Embedding rows and norms are ignored. (Reference, issue #6: V2-Lite 866 / 4,330 /
// 23,300 and Qwen3-30B-A3B 684 / 2,310 / 9,830 tok/s at concurrency 1 / 32 / 256.)
//
//   bench_cuda_model --preset deepseek-v2-lite [--conc 1,32,256] [--ctx 2048] [--layers N]
//                    [--block-size 64] [--reps 5] [--graph|--eager] [--roofline-only] [--tag T]
//                    [--profile]   (then one eager step op by op: ProfilingBackend's table)
//                    [--ncu]       (then one more step between cudaProfilerStart/Stop, for
//                                   `ncu --profile-from-start off --graph-profiling node`:
//                                   per-kernel device times of the captured step)
//                    [--dup PATTERN] (every op whose profiling key contains PATTERN issued
//                                   twice in the step: the step time's growth over the plain run
//                                   is that op's cost inside the graph; ProfilingBackend)
//                    [--trace FILE] (a build with -DDI_TRACE=1: one more step as timed, every
//                                   instrumented kernel's CTAs' start / wait / end written to
//                                   FILE as CSV; scripts/trace_layers.py summarizes it)
// Prints one line per concurrency:
//   [model] preset=deepseek-v2-lite conc=32 ctx=2048 mode=eager step_ms=.. tok_s=..
//           roofline_tok_s=.. pct=..
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/kernels/mla_decode_cluster.h"
#include "backend/cuda/kernels/trace.h"
#include "backend/profiling_backend.h"
#include "bench_timing.h"
#include "core/env.h"
#include "model/config.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model/weight_loader.h"
#include "trace_csv.h"

namespace di {
namespace {

constexpr double kBandwidth = 4.3e12;  // bytes/s, the roofline

struct Args {
  std::string preset = "deepseek-v2-lite";
  std::vector<int32_t> conc{1, 32, 256};
  int32_t ctx = 2048;
  int32_t block_size = 64;
  int64_t layers = 0;  // 0 = the preset's
  int reps = 5;
  int graph = -1;              // -1 / 1 graph (eager if the capture fails), 0 eager
  bool roofline_only = false;  // print the rooflines and exit (no GPU needed)
  std::string tag;             // printed as tag=... (e.g. an A/B variant set through the env)
  std::string dup;             // --dup: ops to issue twice (ProfilingBackend::set_duplicate)
  bool profile = false;        // after timing, one eager step op by op (ProfilingBackend)
  bool ncu = false;            // after timing, one step inside a profiler range (see header)
  bool mla_timing = false;     // after timing, the MLA cluster kernel's phases in one replay
  std::string trace;           // --trace: the kernel timeline of one step (trace.h) to this file
};

std::string arch_of(const std::string& preset) {
  if (preset == "deepseek-v2-lite") return "deepseek_v2";
  if (preset == "qwen3-30b-a3b") return "qwen3_moe";
  if (preset == "llama3-8b") return "llama";
  if (preset == "deepseek-v3-fp8-small") return "deepseek_v3";
  return "";
}

// Parameters read by one decode step of `conc` sequences (see the header comment).
double step_params(const ModelConfig& c, int32_t conc) {
  const double h = static_cast<double>(c.hidden_size);
  double attn = 0.0;
  if (c.is_mla()) {
    const double hq = static_cast<double>(c.num_attention_heads),
                 dn = static_cast<double>(c.qk_nope_head_dim),
                 dr = static_cast<double>(c.qk_rope_head_dim),
                 dv = static_cast<double>(c.v_head_dim), lat = static_cast<double>(c.kv_lora_rank),
                 lq = static_cast<double>(c.q_lora_rank);
    attn = (lq > 0 ? h * lq + lq * hq * (dn + dr) : hq * (dn + dr) * h) + (lat + dr) * h +
           hq * (dn + dv) * lat + h * hq * dv;
  } else {
    const double d = static_cast<double>(c.head_dim),
                 hq = static_cast<double>(c.num_attention_heads),
                 hkv = static_cast<double>(c.num_key_value_heads);
    attn = (hq + 2 * hkv) * d * h + h * hq * d;
  }
  const double e = static_cast<double>(c.num_experts),
               k = static_cast<double>(c.num_experts_per_tok);
  const double touched = e > 0 ? e * (1.0 - std::pow(1.0 - k / e, static_cast<double>(conc))) : 0.0;
  const double expert = 3.0 * static_cast<double>(c.moe_intermediate_size) * h;
  double total = static_cast<double>(c.vocab_size) * h;  // lm_head
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    total += attn;
    if (c.is_moe_layer(l)) {
      total += e * h + touched * expert + static_cast<double>(c.n_shared_experts) * expert;
    } else {
      total += 3.0 * static_cast<double>(c.intermediate_size) * h;
    }
  }
  return total;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (!std::strcmp(argv[i], "--preset")) {
      a.preset = next();
    } else if (!std::strcmp(argv[i], "--conc")) {
      a.conc.clear();
      std::stringstream ss(next());
      for (std::string v; std::getline(ss, v, ',');) a.conc.push_back(std::atoi(v.c_str()));
    } else if (!std::strcmp(argv[i], "--ctx")) {
      a.ctx = std::atoi(next().c_str());
    } else if (!std::strcmp(argv[i], "--block-size")) {
      a.block_size = std::atoi(next().c_str());
    } else if (!std::strcmp(argv[i], "--layers")) {
      a.layers = std::atoll(next().c_str());
    } else if (!std::strcmp(argv[i], "--reps")) {
      a.reps = std::max(1, std::atoi(next().c_str()));
    } else if (!std::strcmp(argv[i], "--graph")) {
      a.graph = 1;
    } else if (!std::strcmp(argv[i], "--eager")) {
      a.graph = 0;
    } else if (!std::strcmp(argv[i], "--tag")) {
      a.tag = next();
    } else if (!std::strcmp(argv[i], "--dup")) {
      a.dup = next();
    } else if (!std::strcmp(argv[i], "--profile")) {
      a.profile = true;
    } else if (!std::strcmp(argv[i], "--ncu")) {
      a.ncu = true;
    } else if (!std::strcmp(argv[i], "--mla-timing")) {
      a.mla_timing = true;
    } else if (!std::strcmp(argv[i], "--trace")) {
      a.trace = next();
    } else if (!std::strcmp(argv[i], "--roofline-only")) {
      a.roofline_only = true;
    } else {
      std::fprintf(stderr, "bench_cuda_model: unknown argument %s\n", argv[i]);
      std::exit(2);
    }
  }
  return a;
}

// The MLA cluster kernel's phases (MlaClusterDecodeParams::timing) of one launch: per CTA that
// ran, its start and end on the GPU-wide timer relative to the launch's first start, and each
// mark's time since the CTA's own start (SM cycles scaled by the CTA's cycles per ns); then the
// median of each mark over the CTAs that passed it.
void print_mla_timing(const std::vector<unsigned long long>& h, int32_t conc) {
  constexpr int kSlots = cuda::kMlaTimingSlots;
  static const char* const kNames[] = {"prewait", "waited",   "stage0", "scores0", "softmax0",
                                       "stages",  "cluster1", "merged", "voted",   "end"};
  static_assert(std::size(kNames) == cuda::kMlaMarks);
  const size_t ctas = h.size() / kSlots / 2;  // the first half (the second: mla_merge_uv's)
  unsigned long long t0 = ~0ull, t1 = 0;
  for (size_t c = 0; c < ctas; ++c)
    if (h[c * kSlots] != 0) {
      t0 = std::min(t0, h[c * kSlots]);
      t1 = std::max(t1, h[c * kSlots + 1]);
    }
  if (t1 == 0) {
    std::printf("[mla-timing] conc=%d: no cluster-kernel launch recorded\n", conc);
    return;
  }
  std::vector<std::vector<double>> at(cuda::kMlaMarks);
  for (size_t c = 0; c < ctas; ++c) {
    const unsigned long long* r = &h[c * kSlots];
    if (r[0] == 0) continue;
    const double cycles_end = static_cast<double>(r[2 + cuda::kMlaEnd]);
    const double ns_per_cycle = cycles_end > 0 ? static_cast<double>(r[1] - r[0]) / cycles_end : 0;
    std::string line;
    for (int m = 0; m < cuda::kMlaMarks; ++m) {
      if (r[2 + m] == 0) continue;
      const double ns = static_cast<double>(r[2 + m]) * ns_per_cycle;
      at[static_cast<size_t>(m)].push_back(ns);
      char part[48];
      std::snprintf(part, sizeof part, " %s=%d", kNames[m], static_cast<int>(ns));
      line += part;
    }
    std::printf("[mla-timing] conc=%d cta=%zu (cluster %zu rank %zu) start=+%llu end=+%llu ns:%s\n",
                conc, c, c / 8, c % 8, r[0] - t0, r[1] - t0, line.c_str());
  }
  std::string med;
  for (int m = 0; m < cuda::kMlaMarks; ++m) {
    std::vector<double>& v = at[static_cast<size_t>(m)];
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    char part[64];
    std::snprintf(part, sizeof part, " %s=%d(%zu)", kNames[m], static_cast<int>(v[v.size() / 2]),
                  v.size());
    med += part;
  }
  std::printf("[mla-timing] conc=%d launch span %llu ns; median ns since CTA start (CTAs):%s\n",
              conc, t1 - t0, med.c_str());
  // The deferred merge's CTAs (MlaMergeUvParams::timing): each mark on the GPU-wide timer,
  // relative to the cluster kernel's first CTA start.
  const unsigned long long* m = &h[ctas * kSlots];
  const size_t merge_ctas = h.size() / 2 / cuda::kMlaMergeTimingSlots;
  std::vector<std::vector<long long>> mk(cuda::kMlaMergeTimingSlots);
  for (size_t c = 0; c < merge_ctas; ++c) {
    const unsigned long long* r = m + c * cuda::kMlaMergeTimingSlots;
    if (r[0] == 0) continue;
    for (int i = 0; i < cuda::kMlaMergeTimingSlots; ++i)
      if (r[i] != 0)  // marks only some kernels write
        mk[static_cast<size_t>(i)].push_back(static_cast<long long>(r[i]) -
                                             static_cast<long long>(t0));
  }
  if (mk[0].empty()) return;
  static const char* const kMergeNames[] = {"start", "waited",  "max",    "norm", "chunk0",
                                            "merged", "mma",  "reduced", "stored", "end"};
  static_assert(std::size(kMergeNames) == cuda::kMlaMergeTimingSlots);
  std::string line;
  for (int i = 0; i < cuda::kMlaMergeTimingSlots; ++i) {
    std::vector<long long>& v = mk[static_cast<size_t>(i)];
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    char part[96];
    std::snprintf(part, sizeof part, " %s=%lld/%lld/%lld", kMergeNames[i], v.front(),
                  v[v.size() / 2], v.back());
    line += part;
  }
  std::printf(
      "[mla-timing] conc=%d merge ctas=%zu, ns after the cluster kernel's first start "
      "(min/median/max): cluster end=%llu%s\n",
      conc, mk[0].size(), t1 - t0, line.c_str());
}

int run(const Args& args) {
  const std::string arch = arch_of(args.preset);
  if (arch.empty()) {
    std::printf(
        "[model] preset=%s error=unknown preset (deepseek-v2-lite, qwen3-30b-a3b, llama3-8b)\n",
        args.preset.c_str());
    return 2;
  }
  model::ModelSpec spec = model::model_spec(arch, args.preset).value();
  ModelConfig config =
      parse_model_config(model::hf_config(spec, DType::kBF16).dump(), args.preset).value();
  if (args.layers > 0) config.num_hidden_layers = std::min(config.num_hidden_layers, args.layers);
  if (args.roofline_only) {
    const double kv_token_bytes =
        2.0 * static_cast<double>(config.num_hidden_layers) *
        static_cast<double>(config.is_mla() ? config.kv_lora_rank + config.qk_rope_head_dim
                                            : 2 * config.num_key_value_heads * config.head_dim);
    for (int32_t conc : args.conc) {
      const double bytes =
          2.0 * step_params(config, conc) + conc * (args.ctx + 1.0) * kv_token_bytes;
      std::printf(
          "[model] preset=%s conc=%d ctx=%d weights_touched_gb=%.2f kv_gb=%.2f "
          "roofline_tok_s=%.1f\n",
          args.preset.c_str(), conc, args.ctx, 2.0 * step_params(config, conc) / 1e9,
          conc * (args.ctx + 1.0) * kv_token_bytes / 1e9, conc / (bytes / kBandwidth));
    }
    return 0;
  }

  cuda::CudaBackend be;
  const auto t0 = std::chrono::steady_clock::now();
  RandomWeights random;
  random.seed = 1;
  random.fill = [&be](Tensor& t, uint64_t seed, float scale) { be.fill_random(t, seed, scale); };
  LoadOptions opts;
  opts.max_context = args.ctx + args.block_size + 1;
  // The model drives `prof`, which only forwards to `be` until --profile enables it.
  ProfilingBackend prof(be);
  std::unique_ptr<Model> model = make_random_model(config, prof, random, opts);
  be.synchronize();
  const double weight_bytes = static_cast<double>(be.allocator().bytes_in_use());

  const int32_t bs = args.block_size, ctx = args.ctx;
  const int32_t bps = (ctx + 1 + bs - 1) / bs;  // blocks per sequence (covers position ctx)
  const int32_t max_conc = *std::max_element(args.conc.begin(), args.conc.end());
  const KvLayout layout = model->kv_layout(max_conc * bps, bs);
  Tensor pool =
      be.empty({layout.num_blocks, layout.num_layers, bs, layout.entry_size}, DType::kBF16);
  be.fill_random(pool, 4242, 1.0f);  // random KV written directly (no prefill)
  be.synchronize();
  const bool moe = config.num_experts > 0;
  (void)moe;
  const bool use_graph = args.graph != 0;
  std::printf(
      "[model] setup preset=%s layers=%lld weights_gb=%.2f kv_gb=%.2f kv=random_fill "
      "mode=%s setup_s=%.1f\n",
      args.preset.c_str(), static_cast<long long>(config.num_hidden_layers), weight_bytes / 1e9,
      static_cast<double>(pool.nbytes()) / 1e9, use_graph ? "graph" : "eager",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::fflush(stdout);
  const double kv_token_bytes = 2.0 * layout.entry_size * static_cast<double>(layout.num_layers);

  // --mla-timing: every MLA cluster launch records its phases (the last layer's stays).
  constexpr int64_t kTimingCtas = 4096;
  constexpr size_t kTimingWords = size_t{kTimingCtas} * cuda::kMlaTimingSlots;
  constexpr size_t kTimingBytes = kTimingWords * sizeof(unsigned long long);
  unsigned long long* timing = nullptr;
  if (args.mla_timing) {
    CUDA_CHECK(cudaMalloc(&timing, kTimingBytes));
    CUDA_CHECK(cudaMemset(timing, 0, kTimingBytes));
    be.set_mla_timing(timing, kTimingCtas);
  }
  int failures = 0;
  for (int32_t conc : args.conc) {
    try {
      auto fwd = [&](const Tensor& ids, const PagedBatch& b, const Tensor& rows) {
        return model->forward(ids, b, pool, rows);
      };
      cuda::DecodeGraph graph(be, fwd, conc, bps, bs);
      cuda::DecodeStepInputs in;
      in.block_size = bs;
      for (int32_t s = 0; s < conc; ++s) {
        std::vector<int32_t> table;
        for (int32_t b = 0; b < bps; ++b) table.push_back(s * bps + b);
        in.token_ids.push_back(static_cast<int32_t>((int64_t{s} * 7919 + 13) % config.vocab_size));
        in.positions.push_back(ctx);
        in.slots.push_back(table[static_cast<size_t>(ctx / bs)] * bs + ctx % bs);
        in.block_tables.push_back(std::move(table));
      }
      double ms = 0.0;
      bool graphed = use_graph;
      prof.set_duplicate(args.dup);  // counted over the warm-up step and the captured one
      if (graphed) {
        try {
          graph.capture();
        } catch (const std::exception& e) {
          std::printf("[model] preset=%s conc=%d capture failed (%s); timing eager\n",
                      args.preset.c_str(), conc, e.what());
          graphed = false;
        }
      }
      if (graphed) {
        graph.run(in);
        ms = bench::median_event_ms(be, 2, std::max(args.reps, 10), [&] { graph.replay(); });
      } else {
        ms = bench::median_event_ms(be, 1, args.reps, [&] { (void)graph.run_eager(in); });
      }
      auto step_as_timed = [&] {  // one step the way it was timed (graph or eager)
        if (graphed) {
          graph.replay();
        } else {
          (void)graph.run_eager(in);
        }
      };
      if (args.ncu) {  // the step as timed, alone in the profiler's range
        be.synchronize();
        CUDA_CHECK(cudaProfilerStart());
        step_as_timed();
        be.synchronize();
        CUDA_CHECK(cudaProfilerStop());
      }
      if (timing != nullptr) {  // one more step; its last MLA launch's phases
        be.synchronize();
        CUDA_CHECK(cudaMemset(timing, 0, kTimingBytes));
        step_as_timed();
        be.synchronize();
        std::vector<unsigned long long> h(kTimingWords);
        CUDA_CHECK(cudaMemcpy(h.data(), timing, kTimingBytes, cudaMemcpyDeviceToHost));
        print_mla_timing(h, conc);
      }
      if (!args.trace.empty()) {  // one more step as timed, its kernels' CTAs recorded
        be.synchronize();
        if (!cuda::trace_enable(1u << 21)) {
          std::printf("[trace] not recorded: this binary was built without -DDI_TRACE=1\n");
        } else {
          step_as_timed();
          const std::vector<cuda::TraceEvent> ev = cuda::trace_read();
          std::string path = args.trace;  // one file per concurrency when there are several
          if (args.conc.size() > 1) path.append(1, '.').append(std::to_string(conc));
          bench::write_trace_csv(path, ev);
        }
      }
      if (args.profile) {  // one warm-up, then one eager step timed op by op
        (void)graph.run_eager(in);
        prof.reset();
        prof.set_enabled(true);
        (void)graph.run_eager(in);
        prof.set_enabled(false);
        std::printf("[profile] preset=%s conc=%d ctx=%d: one eager step, each op synchronized "
                    "(device time + one launch per op)\n%s",
                    args.preset.c_str(), conc, ctx, prof.table(30).c_str());
      }
      const double bytes = 2.0 * step_params(config, conc) + conc * (ctx + 1.0) * kv_token_bytes;
      const double roof_tok_s = conc / (bytes / kBandwidth);
      const double tok_s = 1e3 * conc / ms;
      std::string dup;
      if (!args.dup.empty())
        dup = " dup=\"" + args.dup +
              "\" dup_per_step=" + std::to_string(prof.dup_count() / (graphed ? 2 : 1 + args.reps));
      prof.set_duplicate("");
      std::printf(
          "[model] preset=%s%s%s conc=%d ctx=%d mode=%s step_ms=%.3f tok_s=%.1f "
          "roofline_tok_s=%.1f pct=%.1f%s\n",
          args.preset.c_str(), args.tag.empty() ? "" : " tag=", args.tag.c_str(), conc, ctx,
          graphed ? "graph" : "eager", ms, tok_s, roof_tok_s, 100.0 * tok_s / roof_tok_s,
          dup.c_str());
    } catch (const std::exception& e) {
      ++failures;
      std::printf("[model] preset=%s conc=%d ctx=%d error=%s\n", args.preset.c_str(), conc, ctx,
                  e.what());
    }
    std::fflush(stdout);
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace di

int main(int argc, char** argv) {
  if (!di::env::report_environment("bench_cuda_model")) return 2;  // core/env.h
  const di::Args args = di::parse(argc, argv);
  if (!args.roofline_only && !di::cuda::cuda_available()) {
    std::printf("[model] skipped: no CUDA device\n");
    return 0;
  }
  try {
    return di::run(args);
  } catch (const std::exception& e) {
    std::printf("[model] preset=%s error=%s\n", args.preset.c_str(), e.what());
    return 1;
  }
}
