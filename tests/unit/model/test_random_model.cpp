// Random-weight models (make_random_model / RandomWeights): every architecture's tiny preset
// builds without a checkpoint, runs a prefill and a decode step on the CPU backend, and is
// deterministic for a seed (and different for another seed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/profiling_backend.h"
#include "core/error.h"
#include "model/config.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model/weight_loader.h"

namespace di {
namespace {

ModelConfig preset_config(const std::string& arch, const std::string& preset) {
  model::ModelSpec spec = model::model_spec(arch, preset).value();
  return parse_model_config(model::hf_config(spec, DType::kBF16).dump(), arch + ":" + preset)
      .value();
}

Tensor ints(Backend& be, const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  for (size_t i = 0; i < v.size(); ++i) t.data<int32_t>()[i] = v[i];
  return be.upload(t, DType::kI32);
}

// Prefill of 5 tokens, then one decode token, one sequence in block 0 (block size 16); returns
// the logits of both steps' last rows, concatenated.
std::vector<float> run_two_steps(Model& m, Backend& be) {
  const KvLayout layout = m.kv_layout(2, 16);
  Tensor pool =
      be.zeros({layout.num_blocks, layout.num_layers, layout.block_size, layout.entry_size},
               be.compute_dtype());
  std::vector<float> out;
  auto step = [&](const std::vector<int32_t>& ids, int32_t first_pos) {
    const auto n = static_cast<int32_t>(ids.size());
    std::vector<int32_t> pos;
    for (int32_t i = 0; i < n; ++i) pos.push_back(first_pos + i);
    PagedBatch b;
    b.positions = ints(be, pos);
    b.slot_mapping = ints(be, pos);  // block 0
    b.qo_indptr = ints(be, {0, n});
    b.kv_indptr = ints(be, {0, 1});
    b.kv_indices = ints(be, {0});
    b.kv_last_len = ints(be, {first_pos + n});
    b.num_seqs = 1;
    b.num_tokens = n;
    b.max_kv_len = first_pos + n;
    Tensor logits = be.download(m.forward(ints(be, ids), b, pool, ints(be, {n - 1})));
    out.insert(out.end(), logits.f32(), logits.f32() + logits.numel());
  };
  step({3, 1, 4, 1, 5}, 0);
  step({9}, 5);
  return out;
}

class RandomModel : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(RandomModel, RunsAndIsDeterministicForASeed) {
  const auto& [arch, preset] = GetParam();
  const ModelConfig config = preset_config(arch, preset);
  auto be = make_cpu_backend();
  RandomWeights r;
  r.seed = 7;
  auto a = make_random_model(config, *be, r, {.max_context = 64});
  auto b = make_random_model(config, *be, r, {.max_context = 64});
  r.seed = 8;
  auto c = make_random_model(config, *be, r, {.max_context = 64});
  EXPECT_EQ(a->num_mtp_layers(), 0);
  const std::vector<float> la = run_two_steps(*a, *be), lb = run_two_steps(*b, *be),
                           lc = run_two_steps(*c, *be);
  ASSERT_EQ(la.size(), static_cast<size_t>(2 * config.vocab_size));
  double spread = 0.0;
  for (float v : la) {
    ASSERT_TRUE(std::isfinite(v));
    spread = std::max(spread, static_cast<double>(std::fabs(v - la[0])));
  }
  EXPECT_GT(spread, 1e-3) << "logits are flat: weights look degenerate";
  EXPECT_EQ(la, lb) << "same seed, different logits";
  EXPECT_NE(la, lc) << "another seed gave the same logits";
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, RandomModel,
    ::testing::Values(std::pair<std::string, std::string>{"llama", "tiny"},
                      std::pair<std::string, std::string>{"qwen3_moe", "tiny"},
                      std::pair<std::string, std::string>{"deepseek_v2", "tiny"},
                      std::pair<std::string, std::string>{"deepseek_v3", "tiny"}),
    [](const auto& info) { return info.param.first; });

// ProfilingBackend forwards every op unchanged (same logits as the bare backend, enabled or not)
// and, enabled, records each op the model calls: the MoE and MLA ops of a DeepSeek-V3 model.
// The DeepSeek attention reads one token's q_a columns of the fused projection as a view and
// copies them for more tokens (model/deepseek_v3.cpp): a decode step (1 token) gives the logits
// of the same token as the last row of a 6-token prefill (up to GEMM summation order).
TEST(RandomModelMla, DecodeStepEqualsLastRowOfPrefill) {
  for (const char* arch : {"deepseek_v3", "deepseek_v2"}) {
    const ModelConfig config = preset_config(arch, "tiny");
    auto be = make_cpu_backend();
    RandomWeights r;
    r.seed = 9;
    auto m = make_random_model(config, *be, r, {.max_context = 64});
    const std::vector<float> two = run_two_steps(*m, *be);  // prefill 5, decode [9] at 5
    const KvLayout layout = m->kv_layout(2, 16);
    Tensor pool =
        be->zeros({layout.num_blocks, layout.num_layers, layout.block_size, layout.entry_size},
                  be->compute_dtype());
    const std::vector<int32_t> ids{3, 1, 4, 1, 5, 9}, pos{0, 1, 2, 3, 4, 5};
    PagedBatch b;
    b.positions = ints(*be, pos);
    b.slot_mapping = ints(*be, pos);
    b.qo_indptr = ints(*be, {0, 6});
    b.kv_indptr = ints(*be, {0, 1});
    b.kv_indices = ints(*be, {0});
    b.kv_last_len = ints(*be, {6});
    b.num_seqs = 1;
    b.num_tokens = 6;
    b.max_kv_len = 6;
    const Tensor whole = be->download(m->forward(ints(*be, ids), b, pool, ints(*be, {5})));
    const size_t vocab = static_cast<size_t>(whole.numel());
    ASSERT_EQ(two.size(), 2 * vocab) << arch;
    double max_ref = 0.0, max_diff = 0.0;
    for (size_t i = 0; i < vocab; ++i) {
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(whole.f32()[i])));
      max_diff =
          std::max(max_diff, std::fabs(static_cast<double>(whole.f32()[i]) - two[vocab + i]));
    }
    EXPECT_GT(max_ref, 0.0) << arch;
    EXPECT_LE(max_diff, 1e-4 * max_ref) << arch;
  }
}

// A tiny DeepSeek-V3 model on the CPU twice, with the same weights: bare and through `prof`;
// `want` is the bare model's two steps of logits.
struct ProfiledPair {
  std::unique_ptr<Backend> be = make_cpu_backend();
  ProfilingBackend prof{*be};
  std::unique_ptr<Model> bare, wrapped;
  std::vector<float> want;
  ProfiledPair() {
    const ModelConfig config = preset_config("deepseek_v3", "tiny");
    RandomWeights r;
    r.seed = 5;
    bare = make_random_model(config, *be, r, {.max_context = 64});
    wrapped = make_random_model(config, prof, r, {.max_context = 64});
    want = run_two_steps(*bare, *be);
  }
};

TEST(ProfilingBackendTest, ForwardsAndCountsOps) {
  ProfiledPair pp;
  ProfilingBackend& prof = pp.prof;
  auto& wrapped = pp.wrapped;
  const std::vector<float>& want = pp.want;
  EXPECT_EQ(run_two_steps(*wrapped, prof), want);  // disabled: pure forwarding
  EXPECT_TRUE(prof.stats().empty());
  prof.set_enabled(true);
  EXPECT_EQ(run_two_steps(*wrapped, prof), want);
  prof.set_enabled(false);
  const auto stats = prof.stats();
  ASSERT_FALSE(stats.empty());
  bool saw_route = false, saw_experts = false, saw_attention = false, saw_mla = false;
  for (const auto& s : stats) {
    EXPECT_GT(s.calls, 0) << s.key;
    EXPECT_GE(s.total_us, 0.0) << s.key;
    // The MoE block is two ops (router with its norm; experts with the residual add).
    saw_route |= s.key.rfind("moe_norm_route", 0) == 0;
    saw_experts |= s.key.rfind("moe_residual", 0) == 0;
    saw_attention |= s.key.rfind("paged_attention", 0) == 0;
    saw_mla |= s.key.rfind("mla_rope_store", 0) == 0;
  }
  EXPECT_TRUE(saw_route && saw_experts && saw_attention && saw_mla) << prof.table(50);
  for (size_t i = 1; i < stats.size(); ++i) EXPECT_GE(stats[i - 1].total_us, stats[i].total_us);
  EXPECT_NE(prof.table(5).find("total over"), std::string::npos);
}

// Duplicate mode (bench_cuda_model --dup): every op whose key contains the pattern runs twice,
// the second time into scratch outputs where it accumulates, so the model's logits are the bare
// model's, and dup_count() equals the matching calls the enabled profiler counts.
TEST(ProfilingBackendTest, DuplicateModeKeepsLogitsAndCountsMatchingCalls) {
  ProfiledPair pp;
  ProfilingBackend& prof = pp.prof;
  auto& wrapped = pp.wrapped;
  const std::vector<float>& want = pp.want;
  prof.set_enabled(true);
  (void)run_two_steps(*wrapped, prof);
  prof.set_enabled(false);
  const auto stats = prof.stats();
  for (const char* pattern : {"moe_residual", "moe_norm_route", "fused_linear", "+=residual",
                              "paged_attention", "mla_rope_store", "head_linear"}) {
    int64_t calls = 0;
    for (const auto& s : stats)
      if (s.key.find(pattern) != std::string::npos) calls += s.calls;
    prof.set_duplicate(pattern);
    EXPECT_EQ(run_two_steps(*wrapped, prof), want) << pattern;
    EXPECT_EQ(prof.dup_count(), calls) << pattern;
    EXPECT_GT(calls, 0) << pattern;
  }
  prof.set_duplicate("");
  EXPECT_EQ(run_two_steps(*wrapped, prof), want);
  EXPECT_EQ(prof.dup_count(), 0);
}

TEST(RandomWeightsTest, HostValuesFollowTheScaleRules) {
  RandomWeights r;
  r.seed = 3;
  Tensor w = random_weight_host(r, "model.layers.0.mlp.down_proj.weight", {64, 300});
  const float bound = std::sqrt(3.0f / 300.0f);
  double sum_sq = 0.0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    ASSERT_LE(std::fabs(w.f32()[i]), bound);
    sum_sq += w.f32()[i] * w.f32()[i];
  }
  EXPECT_NEAR(std::sqrt(sum_sq / static_cast<double>(w.numel())), 1.0 / std::sqrt(300.0), 0.01);
  Tensor n = random_weight_host(r, "model.norm.weight", {100});
  for (int64_t i = 0; i < n.numel(); ++i) ASSERT_NEAR(n.f32()[i], 1.0f, 0.1f);
  Tensor again = random_weight_host(r, "model.layers.0.mlp.down_proj.weight", {64, 300});
  EXPECT_EQ(0, std::memcmp(w.raw(), again.raw(), w.nbytes()));
}

// A random model too large for the backend stops at the first tensor that does not fit, with
// the numbers, before that tensor is made: llama tiny at hidden 2^20 and vocab 2^20 (its
// embedding alone would be 4 TiB as f32).
TEST(RandomModelMemory, RefusesATensorThatDoesNotFit) {
  auto cpu = make_cpu_backend();
  ASSERT_GT(cpu->available_memory_bytes(), 0);
  ModelConfig c = preset_config("llama", "tiny");
  c.hidden_size = int64_t{1} << 20;
  c.vocab_size = int64_t{1} << 20;
  RandomWeights r;
  r.seed = 1;
  try {
    make_random_model(c, *cpu, r, {});
    FAIL() << "a 4 TiB model was made";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("random weights: '"), std::string::npos) << what;
    EXPECT_NE(what.find("GB is available on the cpu backend after"), std::string::npos) << what;
    EXPECT_NE(what.find("this model does not fit"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace di
