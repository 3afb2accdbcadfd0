// EPLB on the CUDA backend (issue #8; kernels/moe_stats.cu): the three EPLB ops against the CPU
// oracle (exact: integer counts, integer maps, raw row copies) over odd sizes, then EplbRuntime on
// the MoE golden models through the CUDA backend: generation with EPLB on (4 simulated ranks,
// redundant replicas, a rebalance every few steps) against EPLB off on the same GPU; and EPLB in
// a DP group (`--dp-size N --eplb`, N = min(2, GPUs), NCCL exchange over physical slots) against
// one engine without EPLB. Skips without a GPU. Prints one machine-readable line per case:
// "[eplb-op] ..." / "[eplb-golden] ...".
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <random>

#include "../integration/golden_util.h"
#include "backend/backend.h"
#include "engine/dp_engine_group.h"
#include "engine/dp_expert_transport.h"
#include "engine/engine.h"
#include "engine/eplb_runtime.h"
#include "engine/generator.h"
#include "model/layers.h"
#include "model/model.h"

#ifdef DI_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace di {
namespace {

bool gpu_present(std::string* why) {
#ifdef DI_HAVE_CUDA
  if (cuda::cuda_available()) return true;
  *why = "no CUDA device visible";
#else
  *why = "built without CUDA";
#endif
  return false;
}

Tensor host_i32(const std::vector<int32_t>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::kI32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

std::vector<int32_t> to_vec(Backend& be, const Tensor& t) {
  Tensor h = be.download(t);
  return std::vector<int32_t>(h.data<int32_t>(), h.data<int32_t>() + h.numel());
}

struct Routing {
  std::vector<int32_t> ids;     // [tokens * k], some -1 when with_padding
  std::vector<int32_t> indptr;  // [E + 1]
  std::vector<int32_t> slots;   // [num_slots]
};

// Random distinct top-k ids per token and a random replica table (1..4 replicas per expert).
Routing make_routing(int64_t tokens, int32_t k, int32_t experts, bool with_padding, uint32_t seed) {
  std::mt19937 rng(seed);
  Routing r;
  std::vector<int32_t> perm(static_cast<size_t>(experts));
  for (int64_t t = 0; t < tokens; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int32_t j = 0; j < k; ++j) {
      const bool pad = with_padding && rng() % 7 == 0;
      r.ids.push_back(pad ? -1 : perm[static_cast<size_t>(j)]);
    }
  }
  r.indptr.push_back(0);
  int32_t next_slot = 0;
  for (int32_t e = 0; e < experts; ++e) {
    const int32_t n = 1 + static_cast<int32_t>(rng() % 4);
    for (int32_t i = 0; i < n; ++i) r.slots.push_back(next_slot++);
    r.indptr.push_back(next_slot);
  }
  std::shuffle(r.slots.begin(), r.slots.end(), rng);  // any slot ids, not only ascending
  r.slots.resize(r.slots.size() + 3, 0);              // padding past indptr[E], unused
  return r;
}

struct OpShape {
  int64_t tokens;
  int32_t k;
  int32_t experts;
};

class CudaEplbOps : public ::testing::TestWithParam<OpShape> {};

TEST_P(CudaEplbOps, MatchCpu) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << "CUDA EPLB op test skipped: " << why;
  const OpShape s = GetParam();
  auto cpu = make_cpu_backend();
  auto gpu = make_backend("cuda");
  const Routing r = make_routing(s.tokens, s.k, s.experts, false, 11);
  const Routing padded = make_routing(s.tokens, s.k, s.experts, true, 12);

  // Counts: accumulate twice (once with padding) into a non-zero start.
  std::vector<int32_t> start(static_cast<size_t>(s.experts));
  for (int32_t e = 0; e < s.experts; ++e) start[static_cast<size_t>(e)] = e * 3;
  std::vector<std::vector<int32_t>> counts;
  for (Backend* be : {cpu.get(), gpu.get()}) {
    Tensor c = be->upload(host_i32(start, {s.experts}), DType::kI32);
    be->moe_count_experts(be->upload(host_i32(r.ids, {s.tokens, s.k}), DType::kI32), c);
    be->moe_count_experts(be->upload(host_i32(padded.ids, {s.tokens, s.k}), DType::kI32), c);
    counts.push_back(to_vec(*be, c));
  }
  const bool counts_ok = counts[0] == counts[1];

  std::vector<std::vector<int32_t>> maps;
  for (Backend* be : {cpu.get(), gpu.get()}) {
    Tensor ids = be->upload(host_i32(r.ids, {s.tokens, s.k}), DType::kI32);
    Tensor phys = be->empty({s.tokens, s.k}, DType::kI32);
    be->moe_map_replicas(
        ids, be->upload(host_i32(r.indptr, {s.experts + 1}), DType::kI32),
        be->upload(host_i32(r.slots, {static_cast<int64_t>(r.slots.size())}), DType::kI32), phys);
    maps.push_back(to_vec(*be, phys));
  }
  const bool map_ok = maps[0] == maps[1];

  // copy_rows on bf16 weights [rows, 5, 3] (odd row size): rows 1..3 -> 4..6 and a self copy.
  Tensor w_host = Tensor::empty({8, 5, 3}, DType::kF32);
  for (int64_t i = 0; i < w_host.numel(); ++i) w_host.f32()[i] = static_cast<float>(i % 97) - 40.0f;
  std::vector<Tensor> copies;
  for (Backend* be : {cpu.get(), gpu.get()}) {
    Tensor w = be->upload(w_host, be->compute_dtype());
    Tensor dst = be->zeros({8, 5, 3}, be->compute_dtype());
    be->copy_rows(w, 1, dst, 4, 3);
    be->copy_rows(w, 7, dst, 0, 1);
    copies.push_back(be->download(dst));
  }
  bool copy_ok = copies[0].numel() == copies[1].numel();
  for (int64_t i = 0; copy_ok && i < copies[0].numel(); ++i)
    copy_ok = copies[0].f32()[i] == copies[1].f32()[i];

  std::printf("[eplb-op] tokens=%lld k=%d experts=%d count=%s map=%s copy_rows=%s\n",
              static_cast<long long>(s.tokens), s.k, s.experts, counts_ok ? "PASS" : "FAIL",
              map_ok ? "PASS" : "FAIL", copy_ok ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_TRUE(counts_ok);
  EXPECT_TRUE(map_ok);
  EXPECT_TRUE(copy_ok);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaEplbOps,
                         ::testing::Values(OpShape{1, 1, 8}, OpShape{17, 2, 8}, OpShape{64, 4, 16},
                                           OpShape{1000, 8, 64}, OpShape{4097, 8, 256},
                                           OpShape{0, 2, 8}));

// ---------------------------------------------------------------------------------------------

// (fixture, backend): "cuda-fp32" is the equality check (replicas hold the same weights; only
// the per-replica GEMM row counts differ, ~1e-6 in fp32); "cuda" (bf16) is reported and checks
// the counts and rebalances only: there the changed row counts move results by bf16 noise, and on
// the trained demo model that was once enough to flip a near-tie of its sigmoid router (run 8:
// 2/4 greedy identical, while run 7, before the decode kernels changed, was bitwise identical).
class CudaEplbGolden : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(CudaEplbGolden, EplbOnMatchesEplbOff) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << "CUDA EPLB golden test skipped: " << why;
  const std::string model_name = GetParam().first, backend_name = GetParam().second;
  const bool fp32 = backend_name == "cuda-fp32";
  const std::string fixture = testing::source_dir() + "/tests/fixtures/golden/" + model_name;
  std::ifstream f(fixture + "/golden.json");
  auto golden = nlohmann::json::parse(f);
  const std::string dir = testing::golden_model_path(fixture, golden.value("model_dir", ""));
  const auto prompts = golden["prompts"].get<std::vector<std::vector<int32_t>>>();
  const int32_t max_tokens = 10;
  std::vector<GenerateRequest> reqs;
  int64_t tokens = 0;
  for (const auto& p : prompts) {
    GenerateRequest r;
    r.prompt = p;
    r.max_tokens = max_tokens;
    reqs.push_back(r);
    tokens += static_cast<int64_t>(p.size()) + max_tokens - 1;
  }
  GeneratorOptions gopts;
  gopts.block_size = 16;
  gopts.prefill_chunk = 3;

  auto be = make_backend(backend_name);
  auto ref_model = load_model(dir, *be);
  const auto ref = Generator(*ref_model, *be, gopts).generate(reqs);
  ref_model.reset();

  auto model = load_model(dir, *be);
  EplbOptions o;
  o.enabled = true;
  o.ep_ranks = 4;
  o.prefill = {2, 2, 2, 1, 0.0};
  o.decode = {1, 4, 3, 2, 0.0};
  EplbRuntime eplb(*model, *be, o);
  ASSERT_NO_THROW(eplb.check_integrity());
  gopts.eplb = &eplb;
  const auto got = Generator(*model, *be, gopts).generate(reqs);
  ASSERT_NO_THROW(eplb.check_integrity());

  // Every routed entry was counted once (device counts, read back per bucket).
  const int32_t k = model->moe_blocks()[0]->routing.top_k;
  int64_t counted = 0;
  for (EplbPhase ph : {EplbPhase::kPrefill, EplbPhase::kDecode})
    for (const auto& layer : eplb.total_counts(ph))
      for (int64_t c : layer) counted += c;
  const int64_t want = tokens * k * eplb.num_layers();

  size_t same = 0;
  double worst = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    same += got[i].output == ref[i].output;
    worst = std::max(worst,
                     testing::max_rel_error(ref[i].last_prompt_logits, got[i].last_prompt_logits));
  }
  std::printf(
      "[eplb-golden] model=%s backend=%s rebalances=%llu copies=%llu counted=%lld expected=%lld "
      "greedy_same=%zu/%zu max_rel_err=%.3g%s\n",
      model_name.c_str(), backend_name.c_str(),
      static_cast<unsigned long long>(eplb.stats().rebalances),
      static_cast<unsigned long long>(eplb.stats().experts_moved), static_cast<long long>(counted),
      static_cast<long long>(want), same, ref.size(), worst, fp32 ? "" : " (bf16: reported)");
  std::fflush(stdout);
  EXPECT_GE(eplb.stats().rebalances, 2u);
  EXPECT_EQ(counted, want);
  if (fp32) {  // a wrong replica or a torn migration would be off by O(1)
    EXPECT_LE(worst, 1e-4);
    EXPECT_EQ(same, ref.size()) << "greedy continuations differ with EPLB on (fp32)";
  }
}

INSTANTIATE_TEST_SUITE_P(
    MoeFixtures, CudaEplbGolden,
    ::testing::Values(std::pair<std::string, std::string>{"qwen3_moe", "cuda-fp32"},
                      std::pair<std::string, std::string>{"deepseek_v3", "cuda-fp32"},
                      std::pair<std::string, std::string>{"demo_code", "cuda-fp32"},
                      std::pair<std::string, std::string>{"qwen3_moe", "cuda"},
                      std::pair<std::string, std::string>{"deepseek_v3", "cuda"},
                      std::pair<std::string, std::string>{"demo_code", "cuda"}),
    [](const auto& info) {
      return info.param.first + (info.param.second == "cuda" ? "_bf16" : "_fp32");
    });

// ---------------------------------------------------------------------------------------------

// EPLB in a DP group on GPUs (issue #8): every rank holds all N·S slots and computes its own over
// NCCL, loads are summed over the ranks, all re-place at the same steps. Against one engine
// without EPLB on the same golden prompts (concurrent greedy requests). cuda-fp32: tokens equal
// (eager, throughput exchange); cuda (bf16: latency exchange + decode graphs): reported.
class CudaEplbDpGroup : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

std::map<RequestId, std::vector<int32_t>> serve_greedy(Engine& engine,
                                                       const std::vector<std::vector<int32_t>>& p,
                                                       int32_t max_tokens) {
  std::mutex mu;
  std::condition_variable cv;
  std::map<RequestId, std::vector<int32_t>> out;
  size_t finals = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    EngineRequest r;
    r.id = RequestId(i + 1);
    r.prompt = p[i];
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0.0f;
    const Status st = engine.submit(r, [&](const TokenEvent& e) {
      std::lock_guard lock(mu);
      if (e.token >= 0) out[e.id].push_back(e.token);
      if (e.finish != EngineFinish::kNone) ++finals;
      cv.notify_all();
    });
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  std::unique_lock lock(mu);
  EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(300), [&] { return finals == p.size(); }))
      << "requests did not finish";
  return out;
}

TEST_P(CudaEplbDpGroup, GroupWithEplbEqualsOneEngineWithout) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << "CUDA DP+EPLB test skipped: " << why;
#ifndef DI_HAVE_EP_NCCL
  GTEST_SKIP() << "CUDA DP+EPLB test skipped: built without NCCL";
#endif
  const std::string model_name = GetParam().first, backend_name = GetParam().second;
  const bool fp32 = backend_name == "cuda-fp32";
  const std::string fixture = testing::source_dir() + "/tests/fixtures/golden/" + model_name;
  std::ifstream f(fixture + "/golden.json");
  auto golden = nlohmann::json::parse(f);
  auto prompts = golden["prompts"].get<std::vector<std::vector<int32_t>>>();
  prompts.push_back(std::vector<int32_t>(40, prompts.front().front()));  // few hot experts
  const auto gpus = static_cast<int32_t>(probe_healthy_cuda_devices(nullptr).size());
  const int32_t dp = std::clamp<int32_t>(gpus, 1, 2);

  EngineConfig c;
  c.model_dir = testing::golden_model_path(fixture, golden.value("model_dir", ""));
  c.backend = backend_name;
  c.block_size = 16;
  c.num_blocks = 256;
  c.max_batched_tokens = 24;  // chunked prefill: prefill and decode steps interleave
  auto one = Engine::start(c);
  ASSERT_TRUE(one.is_ok()) << one.status().to_string();
  const auto want = serve_greedy(*one.value(), prompts, 12);
  one.value().reset();

  c.dp_size = dp;
  c.eplb.enabled = true;
  c.eplb.prefill = {2, 2, 2, 1, 0.0};
  c.eplb.decode = {1, 4, 3, 2, 0.0};
  auto started = Engine::start(c);
  ASSERT_TRUE(started.is_ok()) << started.status().to_string();
  Engine& engine = *started.value();
  const auto got = serve_greedy(engine, prompts, 12);
  ASSERT_NO_THROW(engine.check_integrity());
  auto* group = dynamic_cast<DpEngineGroup*>(&engine);
  ASSERT_NE(group, nullptr);
  std::vector<uint64_t> rebalances;
  for (int32_t r = 0; r < group->num_ranks(); ++r) {
    group->rank(r).with_eplb([&](EplbRuntime* e) {
      ASSERT_NE(e, nullptr);
      EXPECT_NO_THROW(e->check_integrity(/*compare_weights=*/true)) << "rank " << r;
      rebalances.push_back(e->stats().rebalances);
    });
  }
  ASSERT_EQ(static_cast<int32_t>(rebalances.size()), dp);
  size_t same = 0;
  for (const auto& [id, tokens] : want) same += got.count(id) && got.at(id) == tokens;
  std::printf("[eplb-dp] model=%s backend=%s dp=%d rebalances=%llu greedy_same=%zu/%zu%s\n",
              model_name.c_str(), backend_name.c_str(), dp,
              static_cast<unsigned long long>(rebalances.front()), same, want.size(),
              fp32 ? "" : " (bf16: reported)");
  std::fflush(stdout);
  // One GPU: a one-rank group (NCCL self exchange), where the planner makes no replicas.
  if (dp >= 2) {
    EXPECT_GE(rebalances.front(), 2u);
  }
  for (uint64_t n : rebalances) EXPECT_EQ(n, rebalances.front());
  if (fp32) {
    EXPECT_EQ(same, want.size()) << "greedy tokens differ with DP + EPLB (fp32)";
  }
}

INSTANTIATE_TEST_SUITE_P(
    MoeFixtures, CudaEplbDpGroup,
    ::testing::Values(std::pair<std::string, std::string>{"qwen3_moe", "cuda-fp32"},
                      std::pair<std::string, std::string>{"deepseek_v3", "cuda-fp32"},
                      std::pair<std::string, std::string>{"qwen3_moe", "cuda"}),
    [](const auto& info) {
      return info.param.first + (info.param.second == "cuda" ? "_bf16" : "_fp32");
    });

}  // namespace
}  // namespace di
