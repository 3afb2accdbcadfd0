// The golden tiny models (tests/fixtures/golden) through the CUDA backend against the CPU backend:
// last-prompt logits within bf16 tolerance, greedy continuations compared and reported (bf16 may
// flip near-ties; a flip is a failure only when the CPU's top-2 margin is clearly larger than the
// logit error). Also: a decode step captured in a CUDA graph replays to the same logits as eager.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <tuple>
#include <numeric>

#include "../integration/golden_util.h"
#include "backend/backend.h"
#include "engine/generator.h"
#include "model/model.h"

#ifdef DI_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/kernels/attention.h"
#include "backend/decode_step.h"
#include "model/config.h"
#include "model/weight_loader.h"
#endif

namespace di {
namespace {

using testing::golden_model_dirs;
using testing::max_rel_error;

// bf16 mode: the CPU reference runs with the same bf16-rounded weights (LoadOptions::
// round_weights_to_bf16), so what is left is the kernels' own bf16 rounding of activations
// through a few tiny layers. (Against fp32 weights the tiny deepseek_v3's sigmoid router flips an
// expert on prompt 0: 5.4e-2 on the CPU alone with bf16-rounded weights; that is printed, not
// asserted.)
constexpr double kLogitRelTolerance = 3e-2;
// fp32 mode: max |cpu - gpu| / max |cpu| over the last prompt logits. Both sides are fp32 with
// different summation orders (OpenBLAS vs cuBLAS, kernel reductions): ~1e-6 expected.
constexpr double kFp32LogitRelTolerance = 1e-4;

bool gpu_present(std::string* why) {
#ifdef DI_HAVE_CUDA
  if (cuda::cuda_available()) return true;
  *why = "no CUDA device visible";
#else
  *why = "built without CUDA";
#endif
  return false;
}

std::string base_name(const std::string& dir) { return std::filesystem::path(dir).filename().string(); }

class CudaGolden : public ::testing::TestWithParam<std::string> {};

// One golden fixture through the CPU backend and `backend_name` for block sizes 16 / 1 / 64.
// bf16 ("cuda"): logits within kLogitRelTolerance, greedy flips tolerated on near-ties.
// fp32 ("cuda-fp32"): logits within kFp32LogitRelTolerance and greedy identical to the CPU and to
// the fixture (HF fp32), token for token.
void run_golden(const std::string& fixture, const char* backend_name, bool fp32) {
  std::ifstream f(fixture + "/golden.json");
  auto golden = nlohmann::json::parse(f);
  const std::string dir = testing::golden_model_path(fixture, golden.value("model_dir", ""));
  const auto prompts = golden["prompts"].get<std::vector<std::vector<int32_t>>>();
  const auto greedy = golden["greedy"].get<std::vector<std::vector<int32_t>>>();
  std::vector<GenerateRequest> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateRequest r;
    r.prompt = prompts[i];
    r.max_tokens = static_cast<int32_t>(greedy[i].size());
    reqs.push_back(r);
  }
  // CPU results per (fixture, block size, bf16-rounded weights): fp32 runs against the exact
  // weights, bf16 against the rounded ones (and, printed only, the exact ones).
  static std::map<std::tuple<std::string, int32_t, bool>, std::vector<GenerateResult>> cpu_cache;
  std::unique_ptr<Backend> cpu;
  std::map<bool, std::unique_ptr<Model>> cpu_models;
  auto cpu_results = [&](int32_t block_size, bool rounded, const GeneratorOptions& o)
      -> const std::vector<GenerateResult>& {
    auto it = cpu_cache.find({fixture, block_size, rounded});
    if (it != cpu_cache.end()) return it->second;
    if (!cpu) cpu = make_cpu_backend();
    auto& m = cpu_models[rounded];
    if (!m) m = load_model(dir, *cpu, LoadOptions{.round_weights_to_bf16 = rounded});
    Generator cg(*m, *cpu, o);
    return cpu_cache.emplace(std::make_tuple(fixture, block_size, rounded), cg.generate(reqs))
        .first->second;
  };
  auto gpu = make_backend(backend_name);
  auto gpu_model = load_model(dir, *gpu);
  GeneratorOptions opts;
  opts.keep_step_logits = true;
  for (int32_t block_size : {16, 1, 64}) {
    opts.block_size = block_size;
    const auto& ref = cpu_results(block_size, !fp32, opts);
    const std::vector<GenerateResult>* exact = fp32 ? &ref : &cpu_results(block_size, false, opts);
    Generator gg(*gpu_model, *gpu, opts);
    const auto got = gg.generate(reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      const double err = max_rel_error(ref[i].last_prompt_logits, got[i].last_prompt_logits);
      // Margin between the CPU's best two logits at the first sampled position.
      std::vector<float> l = ref[i].last_prompt_logits;
      std::partial_sort(l.begin(), l.begin() + 2, l.end(), std::greater<float>());
      float max_abs = 0;
      for (float v : ref[i].last_prompt_logits) max_abs = std::max(max_abs, std::fabs(v));
      size_t same = 0;
      while (same < ref[i].output.size() && same < got[i].output.size() &&
             ref[i].output[same] == got[i].output[same])
        ++same;
      if (fp32) {
        const bool fixture_same = got[i].output == greedy[i];
        const bool ok = err <= kFp32LogitRelTolerance && fixture_same && got[i].output == ref[i].output;
        std::printf("[golden-fp32] %-14s bs=%-2d prompt %zu (%3zu tok): logits max_rel_err=%.3e  "
                    "greedy %zu/%zu agree with cpu, %s fixture  %s\n",
                    base_name(fixture).c_str(), block_size, i, reqs[i].prompt.size(), err, same,
                    ref[i].output.size(), fixture_same ? "identical to" : "DIFFERS from",
                    ok ? "PASS" : "FAIL");
        std::fflush(stdout);
        EXPECT_LE(err, kFp32LogitRelTolerance) << fixture << " prompt " << i << " block size " << block_size;
        EXPECT_EQ(got[i].output, greedy[i]) << fixture << " prompt " << i << " block size " << block_size
                                            << ": fp32 greedy differs from the fixture";
        EXPECT_EQ(got[i].output, ref[i].output) << fixture << " prompt " << i << " block size "
                                                << block_size << ": fp32 greedy differs from the CPU";
        continue;
      }
      const bool clear_margin = (l[0] - l[1]) > 4.0 * err * max_abs;
      const double err_exact =
          max_rel_error((*exact)[i].last_prompt_logits, got[i].last_prompt_logits);
      std::printf("[golden] %-14s bs=%-2d prompt %zu (%3zu tok): logits max_rel_err=%.3e vs the "
                  "CPU on bf16-rounded weights (%.3e vs exact weights)  greedy %zu/%zu tokens "
                  "agree%s\n",
                  base_name(fixture).c_str(), block_size, i, reqs[i].prompt.size(), err, err_exact,
                  same, ref[i].output.size(), same == ref[i].output.size() ? "" : " (flip)");
      std::fflush(stdout);
      EXPECT_LE(err, kLogitRelTolerance) << fixture << " prompt " << i << " block size " << block_size;
      if (clear_margin) {
        EXPECT_GE(same, 1u) << fixture << " prompt " << i << ": first greedy token differs although the "
                            << "CPU margin " << (l[0] - l[1]) << " is far above the logit error";
      }
    }
  }
}

TEST_P(CudaGolden, MatchesCpuBackend) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << "CUDA golden test skipped: " << why;
  run_golden(GetParam(), "cuda", false);
}

// The fp32 verification mode (issue #5): same models, tight tolerance, identical greedy tokens.
TEST_P(CudaGolden, Fp32ModeMatchesCpuAndFixture) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << "CUDA golden test skipped: " << why;
  run_golden(GetParam(), "cuda-fp32", true);
}

std::string name_of(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = base_name(info.param);
  for (auto& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGolden, ::testing::ValuesIn(golden_model_dirs()), name_of);

// Prefill a prompt eagerly, then decode steps both eagerly and through the captured graph.
TEST(CudaGraph, DecodeReplayEqualsEager) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << "CUDA graph test skipped: " << why;
#ifdef DI_HAVE_CUDA
  std::string dir;
  for (const auto& d : golden_model_dirs())
    if (base_name(d).rfind("llama", 0) == 0 || base_name(d) == "qwen3") dir = d;
  if (dir.empty()) GTEST_SKIP() << "no dense golden fixture";
  auto be_ptr = make_backend("cuda");
  auto& be = static_cast<cuda::CudaBackend&>(*be_ptr);
  auto model = load_model(dir, be);
  const int32_t bs = 16, max_blocks = 8, bucket = 4;
  const KvLayout layout = model->kv_layout(bucket * max_blocks, bs);
  Tensor pool = be.zeros({layout.num_blocks, layout.num_layers, layout.block_size, layout.entry_size},
                         be.compute_dtype());
  // Three live sequences (one padding slot), prompts of lengths 5, 17, 30.
  const std::vector<int32_t> lens = {5, 17, 30};
  std::vector<std::vector<int32_t>> tables(lens.size());
  for (size_t s = 0; s < lens.size(); ++s)
    for (int32_t b = 0; b < max_blocks; ++b) tables[s].push_back(static_cast<int32_t>(s) * max_blocks + b);
  const int64_t vocab = model->config().vocab_size;
  auto host = [](const std::vector<int32_t>& v) {
    Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
    std::copy(v.begin(), v.end(), t.data<int32_t>());
    return t;
  };
  std::vector<int32_t> last_token(lens.size());
  for (size_t s = 0; s < lens.size(); ++s) {
    std::vector<int32_t> ids, pos, slots;
    for (int32_t p = 0; p < lens[s]; ++p) {
      ids.push_back(static_cast<int32_t>((p * 7 + s * 13 + 1) % vocab));
      pos.push_back(p);
      slots.push_back(tables[s][static_cast<size_t>(p / bs)] * bs + p % bs);
    }
    const int32_t nb = (lens[s] + bs - 1) / bs;
    PagedBatch b;
    b.positions = be.upload(host(pos), DType::kI32);
    b.slot_mapping = be.upload(host(slots), DType::kI32);
    b.qo_indptr = be.upload(host({0, lens[s]}), DType::kI32);
    b.kv_indptr = be.upload(host({0, nb}), DType::kI32);
    b.kv_indices = be.upload(host(std::vector<int32_t>(tables[s].begin(), tables[s].begin() + nb)), DType::kI32);
    b.kv_last_len = be.upload(host({lens[s] - (nb - 1) * bs}), DType::kI32);
    b.num_seqs = 1;
    b.num_tokens = lens[s];
    b.max_kv_len = lens[s];
    model->forward(be.upload(host(ids), DType::kI32), b, pool, be.upload(host({lens[s] - 1}), DType::kI32));
    last_token[s] = ids.back();
  }
  cuda::DecodeGraph graph(
      be, [&](const Tensor& ids, const PagedBatch& b, const Tensor& rows) { return model->forward(ids, b, pool, rows); },
      bucket, max_blocks, bs);
  graph.capture();
  double worst = 0.0;
  for (int32_t step = 0; step < 6; ++step) {
    cuda::DecodeStepInputs in;
    in.block_size = bs;
    for (size_t s = 0; s < lens.size(); ++s) {
      const int32_t p = lens[s] + step;
      in.token_ids.push_back(last_token[s]);
      in.positions.push_back(p);
      in.slots.push_back(tables[s][static_cast<size_t>(p / bs)] * bs + p % bs);
      in.block_tables.push_back(tables[s]);
    }
    Tensor eager = be.download(graph.run_eager(in));
    Tensor replay = be.download(graph.run(in));
    double max_diff = 0.0;
    for (int64_t i = 0; i < static_cast<int64_t>(lens.size()) * vocab; ++i)
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(eager.f32()[i] - replay.f32()[i])));
    worst = std::max(worst, max_diff);
    for (size_t s = 0; s < lens.size(); ++s) {
      const float* l = eager.f32() + static_cast<int64_t>(s) * vocab;
      last_token[s] = static_cast<int32_t>(std::max_element(l, l + vocab) - l);
    }
  }
  std::printf("[graph] %s bucket %d: replay vs eager max |diff| over 6 steps = %.3e %s\n",
              base_name(dir).c_str(), bucket, worst, worst == 0.0 ? "PASS (bitwise)" : "");
  EXPECT_EQ(worst, 0.0) << "graph replay differs from the eager step";
#endif
}

// A captured decode step covers its bucket's longest context: every sequence's KV is split as if
// it were that long, and the splits past a sequence's end are empty. The engine mixes graph steps
// with eager ones (eager splits a batch by its own longest context), so the two must agree bit
// for bit. The golden fixtures are too short to split and their 2 q heads per kv head take the
// CUDA-core kernel, so this runs a random-weight Qwen3-MoE shape with 4 q heads per kv head
// (head dim 128: the tensor-core decode kernel and the split combine), q/k norms, MoE layers
// (the one-token router and experts), at contexts of 300 / 517 / 1000 in a graph sized for 2048:
// 32 splits in the graph against 16 eager.
TEST(CudaGraph, LongContextReplayEqualsEagerAtItsOwnSplits) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << "CUDA graph test skipped: " << why;
#ifdef DI_HAVE_CUDA
  const std::string config_json = R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 512,
    "head_dim": 128, "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 2,
    "intermediate_size": 1024, "moe_intermediate_size": 256, "num_experts": 16,
    "num_experts_per_tok": 4, "norm_topk_prob": true, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "max_position_embeddings": 4096, "tie_word_embeddings": false, "vocab_size": 1009,
    "hidden_act": "silu", "attention_bias": false})";
  const ModelConfig config = parse_model_config(config_json, "graph_long_context").value();
  ASSERT_TRUE(cuda::gqa_decode_mma_for(4, 128));
  auto be_ptr = make_backend("cuda");
  auto& be = static_cast<cuda::CudaBackend&>(*be_ptr);
  RandomWeights random;
  random.seed = 11;
  random.fill = [&be](Tensor& t, uint64_t seed, float scale) { be.fill_random(t, seed, scale); };
  LoadOptions opts;
  opts.max_context = 2048 + 16;
  auto model = make_random_model(config, be, random, opts);
  const int32_t bs = 16, max_blocks = 2048 / bs, bucket = 4;
  const KvLayout layout = model->kv_layout(bucket * max_blocks, bs);
  Tensor pool =
      be.empty({layout.num_blocks, layout.num_layers, bs, layout.entry_size}, DType::kBF16);
  be.fill_random(pool, 4242, 1.0f);  // earlier positions' K/V: random, as in the benchmark
  const std::vector<int32_t> lens = {300, 517, 1000};
  std::vector<std::vector<int32_t>> tables(lens.size());
  for (size_t s = 0; s < lens.size(); ++s)
    for (int32_t b = 0; b < max_blocks; ++b)
      tables[s].push_back(static_cast<int32_t>(s) * max_blocks + b);
  cuda::DecodeGraph graph(
      be,
      [&](const Tensor& ids, const PagedBatch& b, const Tensor& rows) {
        return model->forward(ids, b, pool, rows);
      },
      bucket, max_blocks, bs);
  graph.capture();
  const int64_t vocab = config.vocab_size;
  std::vector<int32_t> tokens = {17, 401, 999};
  int64_t differing = 0;
  for (int32_t step = 0; step < 3; ++step) {
    cuda::DecodeStepInputs in;
    in.block_size = bs;
    int32_t longest = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
      const int32_t p = lens[s] + step;
      in.token_ids.push_back(tokens[s]);
      in.positions.push_back(p);
      in.slots.push_back(tables[s][static_cast<size_t>(p / bs)] * bs + p % bs);
      in.block_tables.push_back(tables[s]);
      longest = std::max(longest, p + 1);
    }
    // Eager: the same padded batch of `bucket` rows (so every GEMM has the graph's shape), but
    // the attention planned for this batch's longest context instead of the bucket's.
    const PaddedDecodeStep padded = pad_decode_step(in, bucket, max_blocks, bs);
    PagedBatch b;
    b.positions = be.upload(padded.positions, DType::kI32);
    b.slot_mapping = be.upload(padded.slots, DType::kI32);
    b.qo_indptr = be.upload(padded.qo_indptr, DType::kI32);
    b.kv_indptr = be.upload(padded.kv_indptr, DType::kI32);
    b.kv_indices = be.upload(padded.kv_indices, DType::kI32);
    b.kv_last_len = be.upload(padded.kv_last_len, DType::kI32);
    b.num_seqs = bucket;
    b.num_tokens = bucket;
    b.max_kv_len = longest;
    const Tensor eager = be.download(model->forward(be.upload(padded.ids, DType::kI32), b, pool,
                                                    be.upload(padded.rows, DType::kI32)));
    const Tensor replay = be.download(graph.run(in));
    ASSERT_EQ(eager.numel(), replay.numel());
    const int64_t live = static_cast<int64_t>(lens.size()) * vocab;
    // Real logits (a NaN row would compare equal bit for bit too): finite, not constant.
    const auto [lo, hi] = std::minmax_element(eager.f32(), eager.f32() + live);
    ASSERT_TRUE(std::isfinite(*lo) && std::isfinite(*hi) && *hi > *lo)
        << "eager logits " << *lo << " .. " << *hi;
    for (int64_t i = 0; i < live; ++i)
      differing += std::memcmp(eager.f32() + i, replay.f32() + i, sizeof(float)) != 0 ? 1 : 0;
    for (size_t s = 0; s < lens.size(); ++s) {  // greedy next tokens, from the eager logits
      const float* l = eager.f32() + static_cast<int64_t>(s) * vocab;
      tokens[s] = static_cast<int32_t>(std::max_element(l, l + vocab) - l);
    }
  }
  std::printf(
      "[graph] long context (300/517/1000 in a 2048 graph, 32 vs 16 splits): "
      "%lld logits differ over 3 steps %s\n",
      static_cast<long long>(differing), differing == 0 ? "PASS (bitwise)" : "FAIL");
  EXPECT_EQ(differing, 0) << "graph replay differs from the eager step at its own split count";
#endif
}

// ---- batch invariance of decode (issue #5) ---------------------------------------------------
// The split-KV decode attention uses a fixed split size (64 tokens, independent of the batch) and
// merges splits in order, so a sequence's attention output must not depend on what else is in the
// batch: bitwise. Checked at the op level in both modes (hard), and at the model level (reported:
// the GEMMs go through cuBLAS, whose algorithm choice may depend on M = the batch size).
#ifdef DI_HAVE_CUDA
namespace {

Tensor host_i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

Tensor host_uniform(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t.f32()[i] = static_cast<float>(x >> 40) / static_cast<float>(1ull << 24) * 2.0f - 1.0f;
  }
  return t;
}

// A decode batch (one new token per sequence at position len - 1) over the given sequences of
// `lens` whose block tables are `tables`.
PagedBatch decode_batch(Backend& be, const std::vector<int32_t>& lens,
                        const std::vector<std::vector<int32_t>>& tables, int32_t bs) {
  std::vector<int32_t> pos, slots, qo{0}, kvp{0}, idx, last;
  int32_t max_len = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    const int32_t len = lens[s], nb = (len + bs - 1) / bs;
    pos.push_back(len - 1);
    slots.push_back(tables[s][static_cast<size_t>((len - 1) / bs)] * bs + (len - 1) % bs);
    qo.push_back(static_cast<int32_t>(s) + 1);
    for (int32_t b = 0; b < nb; ++b) idx.push_back(tables[s][static_cast<size_t>(b)]);
    kvp.push_back(static_cast<int32_t>(idx.size()));
    last.push_back(len - (nb - 1) * bs);
    max_len = std::max(max_len, len);
  }
  PagedBatch b;
  b.positions = be.upload(host_i32(pos), DType::kI32);
  b.slot_mapping = be.upload(host_i32(slots), DType::kI32);
  b.qo_indptr = be.upload(host_i32(qo), DType::kI32);
  b.kv_indptr = be.upload(host_i32(kvp), DType::kI32);
  b.kv_indices = be.upload(host_i32(idx), DType::kI32);
  b.kv_last_len = be.upload(host_i32(last), DType::kI32);
  b.num_seqs = static_cast<int32_t>(lens.size());
  b.num_tokens = b.num_seqs;
  b.max_kv_len = max_len;
  return b;
}

bool bitwise_equal(const float* a, const float* b, int64_t n, double* max_diff) {
  bool same = true;
  *max_diff = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0) same = false;
    *max_diff = std::max(*max_diff, static_cast<double>(std::fabs(a[i] - b[i])));
  }
  return same;
}

void attention_batch_invariance(const char* backend_name) {
  auto be = make_backend(backend_name);
  const int32_t bs = 16, hq = 8, hkv = 2, d = 128;
  // Batch of 8: targets at 1 (kv 300: 5 splits of 64) and 5 (kv 40: one split alone, several in
  // the batch whose longest sequence has 2500 tokens).
  const std::vector<int32_t> lens = {1000, 300, 1, 65, 2500, 40, 64, 17};
  const std::vector<size_t> targets = {1, 5};
  std::vector<std::vector<int32_t>> tables(lens.size());
  int32_t next = 0;
  for (size_t s = 0; s < lens.size(); ++s)
    for (int32_t b = 0; b < (lens[s] + bs - 1) / bs; ++b) tables[s].push_back(next++);
  KvLayout layout;
  layout.num_blocks = next;
  layout.num_layers = 1;
  layout.block_size = bs;
  layout.entry_size = 2 * hkv * d;
  Tensor pool = be->upload(host_uniform({layout.num_blocks, 1, bs, layout.entry_size}, 7),
                           be->compute_dtype());
  const int64_t row = int64_t{hq} * d;
  Tensor q_host = host_uniform({static_cast<int64_t>(lens.size()), hq, d}, 11);
  auto run = [&](const std::vector<size_t>& seqs) {
    std::vector<int32_t> l;
    std::vector<std::vector<int32_t>> t;
    Tensor qh = Tensor::empty({static_cast<int64_t>(seqs.size()), hq, d}, DType::kF32);
    for (size_t i = 0; i < seqs.size(); ++i) {
      l.push_back(lens[seqs[i]]);
      t.push_back(tables[seqs[i]]);
      std::copy(q_host.f32() + static_cast<int64_t>(seqs[i]) * row,
                q_host.f32() + static_cast<int64_t>(seqs[i] + 1) * row, qh.f32() + static_cast<int64_t>(i) * row);
    }
    PagedBatch b = decode_batch(*be, l, t, bs);
    Tensor q = be->upload(qh, be->compute_dtype());
    Tensor out = be->empty({static_cast<int64_t>(seqs.size()), hq, d}, be->compute_dtype());
    PagedAttentionParams ap;
    ap.q = &q;
    ap.out = &out;
    ap.pool = &pool;
    ap.layout = layout;
    ap.num_q_heads = hq;
    ap.num_kv_heads = hkv;
    ap.head_dim_qk = ap.head_dim_v = d;
    ap.k_offset = 0;
    ap.v_offset = hkv * d;
    ap.kv_head_stride = d;
    ap.scale = 0.088f;
    ap.batch = &b;
    be->paged_attention(ap);
    return be->download(out);
  };
  std::vector<size_t> all(lens.size());
  std::iota(all.begin(), all.end(), size_t{0});
  const Tensor batched = run(all);
  for (size_t tgt : targets) {
    const Tensor alone = run({tgt});
    double max_diff = 0.0;
    const bool same = bitwise_equal(alone.f32(), batched.f32() + static_cast<int64_t>(tgt) * row, row, &max_diff);
    std::printf("[batch-inv] attention %-9s kv_len %4d alone vs in a batch of 8: max|diff| = %.3e  %s\n",
                backend_name, lens[tgt], max_diff, same ? "PASS (bitwise)" : "FAIL");
    std::fflush(stdout);
    EXPECT_TRUE(same) << backend_name << ": attention output of the kv_len " << lens[tgt]
                      << " sequence depends on the batch (max |diff| " << max_diff << ")";
  }
}

// The same decode step of a golden dense model, one sequence alone vs in a batch of 8 (after
// prefilling all 8 one by one). Reported, not asserted (cuBLAS GEMMs, see above).
void model_batch_invariance(const char* backend_name) {
  std::string dir;
  for (const auto& d : golden_model_dirs())
    if (base_name(d).rfind("llama", 0) == 0 || base_name(d) == "qwen3") dir = d;
  if (dir.empty()) return;
  auto be = make_backend(backend_name);
  auto model = load_model(dir, *be);
  const int32_t bs = 16, max_blocks = 8;
  const std::vector<int32_t> lens = {9, 70, 3, 33, 100, 1, 47, 20};
  const size_t target = 3;
  const KvLayout layout = model->kv_layout(static_cast<int32_t>(lens.size()) * max_blocks, bs);
  Tensor pool = be->zeros({layout.num_blocks, layout.num_layers, layout.block_size, layout.entry_size},
                          be->compute_dtype());
  std::vector<std::vector<int32_t>> tables(lens.size());
  for (size_t s = 0; s < lens.size(); ++s)
    for (int32_t b = 0; b < max_blocks; ++b) tables[s].push_back(static_cast<int32_t>(s) * max_blocks + b);
  const int64_t vocab = model->config().vocab_size;
  auto token = [&](size_t s, int32_t p) { return static_cast<int32_t>((p * 7 + s * 13 + 1) % vocab); };
  for (size_t s = 0; s < lens.size(); ++s) {  // prefill lens[s] - 1 tokens; the decode step adds one
    const int32_t n = lens[s] - 1;
    if (n == 0) continue;
    std::vector<int32_t> ids, pos, slots;
    for (int32_t p = 0; p < n; ++p) {
      ids.push_back(token(s, p));
      pos.push_back(p);
      slots.push_back(tables[s][static_cast<size_t>(p / bs)] * bs + p % bs);
    }
    const int32_t nb = (n + bs - 1) / bs;
    PagedBatch b;
    b.positions = be->upload(host_i32(pos), DType::kI32);
    b.slot_mapping = be->upload(host_i32(slots), DType::kI32);
    b.qo_indptr = be->upload(host_i32({0, n}), DType::kI32);
    b.kv_indptr = be->upload(host_i32({0, nb}), DType::kI32);
    b.kv_indices = be->upload(host_i32(std::vector<int32_t>(tables[s].begin(), tables[s].begin() + nb)), DType::kI32);
    b.kv_last_len = be->upload(host_i32({n - (nb - 1) * bs}), DType::kI32);
    b.num_seqs = 1;
    b.num_tokens = n;
    b.max_kv_len = n;
    model->forward(be->upload(host_i32(ids), DType::kI32), b, pool, be->upload(host_i32({n - 1}), DType::kI32));
  }
  auto step = [&](const std::vector<size_t>& seqs) {
    std::vector<int32_t> l, ids, rows;
    std::vector<std::vector<int32_t>> t;
    for (size_t i = 0; i < seqs.size(); ++i) {
      l.push_back(lens[seqs[i]]);
      t.push_back(tables[seqs[i]]);
      ids.push_back(token(seqs[i], lens[seqs[i]] - 1));
      rows.push_back(static_cast<int32_t>(i));
    }
    PagedBatch b = decode_batch(*be, l, t, bs);
    return be->download(model->forward(be->upload(host_i32(ids), DType::kI32), b, pool,
                                       be->upload(host_i32(rows), DType::kI32)));
  };
  const Tensor alone = step({target});
  std::vector<size_t> all(lens.size());
  std::iota(all.begin(), all.end(), size_t{0});
  const Tensor batched = step(all);
  double max_diff = 0.0;
  const bool same = bitwise_equal(alone.f32(), batched.f32() + static_cast<int64_t>(target) * vocab, vocab, &max_diff);
  std::printf("[batch-inv] model %-9s %-12s logits alone vs in a batch of 8: max|diff| = %.3e  %s\n",
              backend_name, base_name(dir).c_str(), max_diff,
              same ? "bitwise" : "NOT bitwise (reported only: GEMM algorithms may depend on M)");
  std::fflush(stdout);
}

}  // namespace
#endif

TEST(BatchInvariance, DecodeAttentionAloneVsBatchOf8) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << "batch invariance test skipped: " << why;
#ifdef DI_HAVE_CUDA
  attention_batch_invariance("cuda");
  attention_batch_invariance("cuda-fp32");
#endif
}

TEST(BatchInvariance, ModelDecodeAloneVsBatchOf8Reported) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << "batch invariance test skipped: " << why;
#ifdef DI_HAVE_CUDA
  model_batch_invariance("cuda");
  model_batch_invariance("cuda-fp32");
#endif
}

}  // namespace
}  // namespace di
