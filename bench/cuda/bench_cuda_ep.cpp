// Expert parallelism inside the model across GPUs (issue #8): one process per GPU, launched by
// scripts/gpu_steps/80_ep.sh with DI_EP_RANK / DI_EP_WORLD / DI_EP_DEVICE / DI_EP_UNIQUE_ID_FILE
// (parallel/cuda/ep_comm.h). Each rank runs the REAL model code on its GPU with its own requests
// and KV (DP attention); the routed experts of every MoE layer go through the EP hook
// (parallel/cuda/ep_moe_hook.h: NCCL dispatch -> this rank's experts -> combine). Eager only.
//
//   bench_cuda_ep --golden DIR [--golden DIR ...] [--max-tokens 8] [--fp32]
//     Every rank takes requests r, r + N, ... of 4 fixed prompts and runs them greedily (one
//     prefill forward, then max_tokens - 1 decode forwards; every rank runs the same number of
//     forwards, so the MoE layers stay in lockstep) twice: (a) plain Backend::moe_experts on
//     this GPU alone, (b) with the EP hook. Prints per rank and model:
//       [ep-golden] rank=0 world=2 model=deepseek_v3 requests=2 tokens_same=16/16
//                   max_rel_err=.. status=ok|mismatch
//     max_rel_err: max |a - b| / max |a| over this rank's first-step (prefill) logits.
//   bench_cuda_ep --bench [--preset deepseek-v2-lite] [--conc 1,32,128] [--ctx 2048]
//                 [--layers N] [--reps 5]
//     Random weights (make_random_model + CudaBackend::fill_random, as bench_cuda_model), random
//     KV, eager decode steps of conc_per_rank sequences per rank at position ctx. Every timed step
//     starts after an NCCL all-reduce (barrier); the step time is the max over ranks. Prints
//       [ep-bench] rank=.. world=.. conc_per_rank=.. mode=ep step_ms=.. tok_s_rank=..
//       [ep-bench] world=.. conc_per_rank=.. mode=ep step_ms=.. tok_s_total=..   (rank 0)
//     and with world 1 also mode=plain (Backend::moe_experts, no NCCL), the 1-GPU baseline.
// Exit status 0 only when every golden comparison matched and no step failed.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_graph.h"
#include "model/config.h"
#include "model/layers.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model/weight_loader.h"
#include "parallel/cuda/cuda_check.h"
#include "parallel/cuda/ep_comm.h"
#include "parallel/cuda/ep_moe_hook.h"
#include "parallel/ep_moe_plan.h"

namespace di {
namespace {

using parallel::cuda::EpComm;
using parallel::cuda::EpMoeHook;
using parallel::cuda::NcclTransport;

struct Args {
  std::vector<std::string> golden;
  bool bench = false;
  bool fp32 = false;
  int32_t max_tokens = 8;
  std::string preset = "deepseek-v2-lite";
  std::vector<int32_t> conc{1, 32, 128};
  int32_t ctx = 2048;
  int64_t layers = 0;
  int reps = 5;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (!std::strcmp(argv[i], "--golden")) {
      a.golden.push_back(next());
    } else if (!std::strcmp(argv[i], "--bench")) {
      a.bench = true;
    } else if (!std::strcmp(argv[i], "--fp32")) {
      a.fp32 = true;
    } else if (!std::strcmp(argv[i], "--max-tokens")) {
      a.max_tokens = std::max(1, std::atoi(next().c_str()));
    } else if (!std::strcmp(argv[i], "--preset")) {
      a.preset = next();
    } else if (!std::strcmp(argv[i], "--conc")) {
      a.conc.clear();
      std::stringstream ss(next());
      for (std::string v; std::getline(ss, v, ',');) a.conc.push_back(std::atoi(v.c_str()));
    } else if (!std::strcmp(argv[i], "--ctx")) {
      a.ctx = std::atoi(next().c_str());
    } else if (!std::strcmp(argv[i], "--layers")) {
      a.layers = std::atoll(next().c_str());
    } else if (!std::strcmp(argv[i], "--reps")) {
      a.reps = std::max(1, std::atoi(next().c_str()));
    } else {
      std::fprintf(stderr, "bench_cuda_ep: unknown argument %s\n", argv[i]);
      std::exit(2);
    }
  }
  return a;
}

// The EP group of this process plus a small device scratch for barriers / max-reductions.
struct Group {
  EpComm comm;
  NcclTransport transport;
  float* scratch = nullptr;  // device, 1 float

  explicit Group(const parallel::cuda::EpCommConfig& cfg) : comm(cfg), transport(comm) {
    CUDA_CHECK(cudaMalloc(&scratch, sizeof(float)));
  }
  ~Group() { cudaFree(scratch); }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int32_t rank() const { return comm.rank_idx(); }
  int32_t world() const { return comm.num_ranks(); }

  // Max of `v` over the ranks (also a barrier); syncs `stream`.
  float all_max(float v, cudaStream_t stream) {
    CUDA_CHECK(cudaMemcpyAsync(scratch, &v, sizeof(float), cudaMemcpyHostToDevice, stream));
    NCCL_CHECK(ncclAllReduce(scratch, scratch, 1, ncclFloat, ncclMax, comm.get(), stream));
    float out = 0.0f;
    CUDA_CHECK(cudaMemcpyAsync(&out, scratch, sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return out;
  }
};

std::unique_ptr<EpMoeHook> make_hook(Group& g, const ModelConfig& c, cuda::CudaBackend& be) {
  return std::make_unique<EpMoeHook>(g.transport, static_cast<int32_t>(c.num_experts),
                                     static_cast<int32_t>(c.hidden_size),
                                     static_cast<int32_t>(c.num_experts_per_tok),
                                     be.compute_dtype(), be.stream());
}

// ---------------------------------------------------------------- golden

struct GreedyResult {
  std::vector<std::vector<int32_t>> tokens;  // per request
  std::vector<float> first_logits;           // [R, V] of the prefill step
};

Tensor upload_i32(Backend& be, const std::vector<int32_t>& v) {
  Tensor h = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  if (!v.empty()) std::memcpy(h.raw(), v.data(), v.size() * sizeof(int32_t));
  return be.upload(h, DType::kI32);
}

// Greedy decoding of `prompts` as one batch: a prefill forward over every prompt, then
// max_tokens - 1 decode forwards (max_tokens forwards in all, whatever the prompts).
GreedyResult run_greedy(Model& model, Backend& be, const std::vector<std::vector<int32_t>>& prompts,
                        int32_t max_tokens) {
  constexpr int32_t kBs = 16;
  const auto n = static_cast<int32_t>(prompts.size());
  const int64_t vocab = model.config().vocab_size;
  std::vector<int32_t> bps(n);
  int32_t num_blocks = 0;
  for (int32_t s = 0; s < n; ++s) {
    bps[s] = (static_cast<int32_t>(prompts[s].size()) + max_tokens + kBs - 1) / kBs;
    num_blocks += bps[s];
  }
  const KvLayout layout = model.kv_layout(std::max(num_blocks, 1), kBs);
  Tensor pool = be.zeros({layout.num_blocks, layout.num_layers, kBs, layout.entry_size},
                         be.compute_dtype());
  std::vector<int32_t> first_block(n, 0);
  for (int32_t s = 1; s < n; ++s) first_block[s] = first_block[s - 1] + bps[s - 1];

  GreedyResult res;
  res.tokens.assign(n, {});
  std::vector<int32_t> len(n);  // tokens in the cache after this step
  for (int32_t step = 0; step < max_tokens; ++step) {
    std::vector<int32_t> ids, pos, slots, qo{0}, kv_indptr{0}, kv_indices, last_len, rows;
    int32_t max_kv = 0;
    for (int32_t s = 0; s < n; ++s) {
      std::vector<int32_t> feed;
      int32_t start = 0;
      if (step == 0) {
        feed = prompts[s];
      } else {
        feed = {res.tokens[s].back()};
        start = len[s];
      }
      for (size_t i = 0; i < feed.size(); ++i) {
        const int32_t p = start + static_cast<int32_t>(i);
        ids.push_back(feed[i]);
        pos.push_back(p);
        slots.push_back((first_block[s] + p / kBs) * kBs + p % kBs);
      }
      len[s] = start + static_cast<int32_t>(feed.size());
      qo.push_back(static_cast<int32_t>(ids.size()));
      rows.push_back(static_cast<int32_t>(ids.size()) - 1);
      const int32_t used = (len[s] + kBs - 1) / kBs;
      for (int32_t b = 0; b < used; ++b) kv_indices.push_back(first_block[s] + b);
      kv_indptr.push_back(static_cast<int32_t>(kv_indices.size()));
      last_len.push_back(len[s] - (used - 1) * kBs);
      max_kv = std::max(max_kv, len[s]);
    }
    PagedBatch batch;
    batch.positions = upload_i32(be, pos);
    batch.slot_mapping = upload_i32(be, slots);
    batch.qo_indptr = upload_i32(be, qo);
    batch.kv_indptr = upload_i32(be, kv_indptr);
    batch.kv_indices = upload_i32(be, kv_indices);
    batch.kv_last_len = upload_i32(be, last_len);
    batch.num_seqs = n;
    batch.num_tokens = static_cast<int32_t>(ids.size());
    batch.max_kv_len = max_kv;
    const Tensor logits = model.forward(upload_i32(be, ids), batch, pool, upload_i32(be, rows));
    const Tensor host = be.download(logits);  // [n, V] f32
    const float* l = host.data<float>();
    if (step == 0) res.first_logits.assign(l, l + static_cast<int64_t>(n) * vocab);
    for (int32_t s = 0; s < n; ++s) {
      const float* row = l + static_cast<int64_t>(s) * vocab;
      res.tokens[s].push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
    }
  }
  return res;
}

// 4 fixed prompts (lengths 7, 1, 33, 20) of deterministic token ids in [2, vocab).
std::vector<std::vector<int32_t>> fixed_prompts(int64_t vocab) {
  const int32_t lens[] = {7, 1, 33, 20};
  std::vector<std::vector<int32_t>> out;
  for (int32_t p = 0; p < 4; ++p) {
    std::vector<int32_t> v;
    for (int32_t i = 0; i < lens[p]; ++i)
      v.push_back(static_cast<int32_t>(2 + (int64_t{p} * 7919 + int64_t{i} * 131 + 17) % (vocab - 2)));
    out.push_back(std::move(v));
  }
  return out;
}

bool run_golden(Group& g, const Args& args, const std::string& dir) {
  const std::string name = std::filesystem::path(dir).filename().string();
  cuda::CudaBackend be(args.fp32 ? DType::kF32 : DType::kBF16);
  std::unique_ptr<Model> model = load_model(dir, be, {});
  const ModelConfig& c = model->config();
  const auto all = fixed_prompts(c.vocab_size);
  const std::vector<int32_t> mine =
      parallel::requests_of_rank(static_cast<int32_t>(all.size()), g.rank(), g.world());
  DI_CHECK(!mine.empty(), "rank {} of {} has no request: use at most {} ranks", g.rank(),
           g.world(), all.size());
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t i : mine) prompts.push_back(all[i]);

  const GreedyResult plain = run_greedy(*model, be, prompts, args.max_tokens);
  std::unique_ptr<EpMoeHook> hook = make_hook(g, c, be);
  parallel::cuda::attach_expert_hook(model->moe_blocks(), hook.get());
  const GreedyResult ep = run_greedy(*model, be, prompts, args.max_tokens);
  parallel::cuda::attach_expert_hook(model->moe_blocks(), nullptr);

  int64_t same = 0, total = 0;
  for (size_t s = 0; s < prompts.size(); ++s) {
    for (size_t i = 0; i < plain.tokens[s].size(); ++i) {
      ++total;
      same += plain.tokens[s][i] == ep.tokens[s][i] ? 1 : 0;
    }
  }
  double max_abs = 0.0, max_diff = 0.0;
  for (size_t i = 0; i < plain.first_logits.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(plain.first_logits[i])));
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(plain.first_logits[i]) -
                                            static_cast<double>(ep.first_logits[i])));
  }
  const double rel = max_abs > 0 ? max_diff / max_abs : max_diff;
  const bool ok = same == total && std::isfinite(rel);
  // The exit status: fp32 is the equality check (every token); in bf16 expert rows are rounded
  // before the combine, so only the first step's logits must agree (a later near-tie may flip a
  // token; reported as status=mismatch but not a failure).
  const bool pass = args.fp32 ? ok : std::isfinite(rel) && rel <= 3e-2;
  std::printf(
      "[ep-golden] rank=%d world=%d model=%s dtype=%s requests=%zu moe_layers=%zu "
      "ep_calls=%lld rows_sent=%lld rows_computed=%lld tokens_same=%lld/%lld max_rel_err=%.3g "
      "status=%s\n",
      g.rank(), g.world(), name.c_str(), args.fp32 ? "fp32" : "bf16", prompts.size(),
      model->moe_blocks().size(), static_cast<long long>(hook->totals().calls),
      static_cast<long long>(hook->totals().rows_sent),
      static_cast<long long>(hook->totals().rows_computed), static_cast<long long>(same),
      static_cast<long long>(total), rel, ok ? "ok" : "mismatch");
  std::fflush(stdout);
  return pass;
}

// ---------------------------------------------------------------- bench

bool run_bench(Group& g, const Args& args) {
  const std::string arch = args.preset == "deepseek-v2-lite" ? "deepseek_v2"
                           : args.preset == "qwen3-30b-a3b"  ? "qwen3_moe"
                                                             : "";
  DI_CHECK(!arch.empty(), "bench_cuda_ep: unknown preset {}", args.preset);
  const model::ModelSpec spec = model::model_spec(arch, args.preset).value();
  ModelConfig config =
      parse_model_config(model::hf_config(spec, DType::kBF16).dump(), args.preset).value();
  if (args.layers > 0) config.num_hidden_layers = std::min(config.num_hidden_layers, args.layers);

  const auto t0 = std::chrono::steady_clock::now();
  cuda::CudaBackend be;
  RandomWeights random;
  random.seed = 1;  // the same weights on every rank
  random.fill = [&be](Tensor& t, uint64_t seed, float scale) { be.fill_random(t, seed, scale); };
  LoadOptions opts;
  constexpr int32_t kBs = 64;
  opts.max_context = args.ctx + kBs + 1;
  std::unique_ptr<Model> model = make_random_model(config, be, random, opts);
  const int32_t ctx = args.ctx;
  const int32_t bps = (ctx + 1 + kBs - 1) / kBs;
  const int32_t max_conc = *std::max_element(args.conc.begin(), args.conc.end());
  const KvLayout layout = model->kv_layout(max_conc * bps, kBs);
  Tensor pool =
      be.empty({layout.num_blocks, layout.num_layers, kBs, layout.entry_size}, DType::kBF16);
  be.fill_random(pool, 4242 + static_cast<uint64_t>(g.rank()), 1.0f);
  be.synchronize();
  std::unique_ptr<EpMoeHook> hook = make_hook(g, config, be);
  if (g.rank() == 0) {
    std::printf("[ep-bench] setup preset=%s world=%d layers=%lld moe_layers=%zu ctx=%d setup_s=%.1f\n",
                args.preset.c_str(), g.world(), static_cast<long long>(config.num_hidden_layers),
                model->moe_blocks().size(), ctx,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::fflush(stdout);
  }

  bool ok = true;
  std::vector<std::string> modes{"ep"};
  if (g.world() == 1) modes.insert(modes.begin(), "plain");
  for (int32_t conc : args.conc) {
    for (const std::string& mode : modes) {
      // Every rank runs the same sequence of steps; an error on one rank would hang the others
      // in NCCL, so errors end the process (the script's timeout reaps the rest).
      parallel::cuda::attach_expert_hook(model->moe_blocks(),
                                         mode == "ep" ? hook.get() : nullptr);
      auto fwd = [&](const Tensor& ids, const PagedBatch& b, const Tensor& rows) {
        return model->forward(ids, b, pool, rows);
      };
      cuda::DecodeGraph step(be, fwd, conc, bps, kBs);
      cuda::DecodeStepInputs in;
      in.block_size = kBs;
      for (int32_t s = 0; s < conc; ++s) {
        std::vector<int32_t> table;
        for (int32_t b = 0; b < bps; ++b) table.push_back(s * bps + b);
        in.token_ids.push_back(static_cast<int32_t>(
            (int64_t{s} * 7919 + 13 + int64_t{g.rank()} * 104729) % config.vocab_size));
        in.positions.push_back(ctx);
        in.slots.push_back(table[static_cast<size_t>(ctx / kBs)] * kBs + ctx % kBs);
        in.block_tables.push_back(std::move(table));
      }
      (void)step.run_eager(in);  // warm-up (allocator cache, cuBLAS handles)
      be.synchronize();
      hook->reset_totals();
      std::vector<double> ms;
      for (int rep = 0; rep < args.reps; ++rep) {
        if (mode == "ep") g.all_max(0.0f, be.stream());  // barrier
        const auto a = std::chrono::steady_clock::now();
        (void)step.run_eager(in);
        be.synchronize();
        ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a)
                .count());
      }
      std::sort(ms.begin(), ms.end());
      const double mine = ms[ms.size() / 2];
      const double rank_tok_s = 1e3 * conc / mine;
      const int64_t calls = std::max<int64_t>(1, hook->totals().calls);
      std::printf(
          "[ep-bench] rank=%d world=%d conc_per_rank=%d ctx=%d mode=%s step_ms=%.3f "
          "tok_s_rank=%.1f rows_sent_per_layer=%.1f rows_computed_per_layer=%.1f\n",
          g.rank(), g.world(), conc, ctx, mode.c_str(), mine, rank_tok_s,
          static_cast<double>(hook->totals().rows_sent) / static_cast<double>(calls),
          static_cast<double>(hook->totals().rows_computed) / static_cast<double>(calls));
      std::fflush(stdout);
      // The group's step time is its slowest rank's.
      const double step_ms =
          mode == "ep" ? g.all_max(static_cast<float>(mine), be.stream()) : mine;
      if (g.rank() == 0) {
        std::printf("[ep-bench] world=%d conc_per_rank=%d ctx=%d mode=%s step_ms=%.3f tok_s_total=%.1f\n",
                    g.world(), conc, ctx, mode.c_str(), step_ms,
                    1e3 * conc * g.world() / step_ms);
        std::fflush(stdout);
      }
      ok = ok && std::isfinite(step_ms);
    }
  }
  parallel::cuda::attach_expert_hook(model->moe_blocks(), nullptr);
  return ok;
}

}  // namespace
}  // namespace di

int main(int argc, char** argv) {
  const di::Args args = di::parse(argc, argv);
  if (!di::cuda::cuda_available()) {
    std::printf("[ep] skipped: no CUDA device\n");
    return 0;
  }
  int32_t rank = -1;
  try {
    const auto cfg = di::parallel::cuda::ep_comm_config_from_env();
    rank = cfg.rank_idx;
    // The communicator first: it makes DI_EP_DEVICE current, so the backends below (their
    // streams and allocations) live on this rank's GPU.
    di::Group group(cfg);
    std::printf("[ep] rank=%d world=%d device=%d init=%s nccl=%s\n", group.rank(), group.world(),
                group.comm.device_idx(), group.comm.init_path(),
                di::parallel::cuda::nccl_runtime_version().c_str());
    std::fflush(stdout);
    bool ok = true;
    for (const std::string& dir : args.golden) ok = di::run_golden(group, args, dir) && ok;
    if (args.bench) ok = di::run_bench(group, args) && ok;
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("[ep] rank=%d error=%s\n", rank, e.what());
    std::fflush(stdout);
    // Peers may be blocked in NCCL waiting for this rank: do not run destructors that would
    // wait on the communicator.
    std::_Exit(1);
  }
}
