// CUDA moe_experts (device-side alignment, decode kernels, prefill path) against the CPU op, plus
// CUDA-graph capture + replay of the decode path (bitwise equal to eager). Skips without a GPU.
// Prints one "[moe-op] ..." line per case and path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "op_case.h"

#ifdef DI_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/kernels/moe.h"
#include "backend/cuda/kernels/moe_grouped.h"
#include "core/cuda_check.h"
#endif

namespace di::testing {
namespace {

#ifdef DI_HAVE_CUDA

enum class Routing { kUniform, kSkewed };

struct MoeCase {
  int64_t tokens, experts, top_k, hidden, inter;
  Routing routing;
  std::string name() const {
    std::string s("t");  // appended piecewise (GCC 12 -Wrestrict false positive on "t" + ...)
    s += std::to_string(tokens);
    s += "_e";
    s += std::to_string(experts);
    s += "_k";
    s += std::to_string(top_k);
    s += "_h";
    s += std::to_string(hidden);
    s += "_i";
    s += std::to_string(inter);
    s += routing == Routing::kSkewed ? "_skewed" : "_uniform";
    return s;
  }
};

// Fast host fill (splitmix64), values rounded to bf16 so both backends see the same inputs.
Tensor host_fill(const Shape& shape, uint64_t seed, float scale) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    t.f32()[i] = round_bf16((2.0f * u - 1.0f) * scale);
  }
  return t;
}

// Distinct experts per token. Skewed: slot 0 of every token is one hot expert, the others come
// from a small pool, so most experts get no token and one gets all.
std::vector<int32_t> make_ids(const MoeCase& c, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> ids;
  const auto e = static_cast<int32_t>(c.experts);
  const int32_t hot = e / 2 + 1 < e ? e / 2 + 1 : 0;
  for (int64_t t = 0; t < c.tokens; ++t) {
    std::vector<int32_t> pool;
    if (c.routing == Routing::kUniform) {
      pool.resize(static_cast<size_t>(e));
      std::iota(pool.begin(), pool.end(), 0);
      std::shuffle(pool.begin(), pool.end(), rng);
    } else {
      pool.push_back(hot);
      std::vector<int32_t> rest;
      const int32_t limit = std::max<int32_t>(static_cast<int32_t>(c.top_k) + 1, e / 4);
      for (int32_t i = 0; i < std::min(limit, e); ++i)
        if (i != hot) rest.push_back(i);
      std::shuffle(rest.begin(), rest.end(), rng);
      pool.insert(pool.end(), rest.begin(), rest.end());
    }
    ids.insert(ids.end(), pool.begin(), pool.begin() + c.top_k);
  }
  return ids;
}

struct Inputs {
  Tensor x, gate_up, down, weights;
  std::vector<int32_t> ids;
};

Inputs make_inputs(const MoeCase& c) {
  Inputs in;
  in.x = host_fill({c.tokens, c.hidden}, 1, 1.0f);
  in.gate_up = host_fill({c.experts, 2 * c.inter, c.hidden}, 2, 0.05f);
  in.down = host_fill({c.experts, c.hidden, c.inter}, 3, 0.05f);
  in.weights = host_fill({c.tokens, c.top_k}, 4, 1.0f);
  in.ids = make_ids(c, 5);
  return in;
}

// The inputs on one backend (uploaded once, reused by every path).
struct OnBackend {
  Tensor x, ids, weights;
  ExpertWeights w;
};

OnBackend upload_inputs(Backend& be, const MoeCase& c, const Inputs& in) {
  return OnBackend{act(be, in.x), ints(be, in.ids).reshape({c.tokens, c.top_k}),
                   be.upload(in.weights, DType::kF32), ExpertWeights{act(be, in.gate_up), act(be, in.down)}};
}

Tensor run_moe(Backend& be, const MoeCase& c, const OnBackend& d) {
  Tensor y = be.empty({c.tokens, c.hidden}, be.compute_dtype());
  be.moe_experts(d.x, d.ids, d.weights, d.w, y);
  return be.download(y);
}

cuda::CudaBackend* gpu() {
  static std::unique_ptr<Backend> be =
      cuda::cuda_available() ? make_backend("cuda") : std::unique_ptr<Backend>{};
  return static_cast<cuda::CudaBackend*>(be.get());
}

bool check_bf16(const std::string& label, const Tensor& ref, const Tensor& got) {
  const Metrics m = compare(ref, got);
  const bool ok = m.diff < 1e-3 && m.mismatches == 0 && m.max_abs <= 2e-2 * std::max(m.max_ref, 1e-3);
  std::printf("[moe-op] %-52s n=%-8lld diff=%.2e max_abs=%.3e max_ref=%.3e %s\n", label.c_str(),
              static_cast<long long>(m.n), m.diff, m.max_abs, m.max_ref, ok ? "PASS" : "FAIL");
  std::fflush(stdout);
  return ok;
}

class CudaMoe : public ::testing::TestWithParam<MoeCase> {};

// Decode path (every case up to 2048 slots) and the default prefill path (cuBLAS), vs the CPU op.
TEST_P(CudaMoe, MatchesCpuOnBothPaths) {
  cuda::CudaBackend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device visible";
  const MoeCase& c = GetParam();
  const Inputs in = make_inputs(c);
  auto cpu = make_cpu_backend();
  const Tensor ref = run_moe(*cpu, c, upload_inputs(*cpu, c, in));
  const OnBackend d = upload_inputs(*be, c, in);
  const int64_t saved = be->moe_device_max_slots();
  if (c.tokens * c.top_k <= 2048) {
    be->set_moe_device_max_slots(int64_t{1} << 40);
    const Tensor got = run_moe(*be, c, d);
    EXPECT_TRUE(check_bf16(c.name() + "_decode", ref, got)) << c.name() << " decode path";
  }
  be->set_moe_device_max_slots(0);
  const Tensor got = run_moe(*be, c, d);
  be->set_moe_device_max_slots(saved);
  EXPECT_TRUE(check_bf16(c.name() + "_prefill", ref, got)) << c.name() << " prefill path (cuBLAS)";
}

// The opt-in tensor-core grouped prefill GEMM, vs the CPU op. A separate suite (filter
// *Grouped*) so the GPU step can run it in its own process: a fault there hides nothing else.
class CudaMoeGrouped : public ::testing::TestWithParam<MoeCase> {};

TEST_P(CudaMoeGrouped, MatchesCpu) {
  cuda::CudaBackend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device visible";
  const MoeCase& c = GetParam();
  const Inputs in = make_inputs(c);
  auto cpu = make_cpu_backend();
  const Tensor ref = run_moe(*cpu, c, upload_inputs(*cpu, c, in));
  const OnBackend d = upload_inputs(*be, c, in);
  const int64_t saved = be->moe_device_max_slots();
  be->set_moe_device_max_slots(0);
  be->set_moe_grouped_gemm(true);
  const Tensor got = run_moe(*be, c, d);
  be->set_moe_grouped_gemm(false);
  be->set_moe_device_max_slots(saved);
  EXPECT_TRUE(check_bf16(c.name() + "_grouped", ref, got)) << c.name() << " prefill path (grouped mma)";
}

std::vector<MoeCase> small_cases() {
  std::vector<MoeCase> v;
  const Routing U = Routing::kUniform, S = Routing::kSkewed;
  // Odd-ish sizes (H 136 = 4·32 + 8, I 72 = 2·32 + 8: k tails), every T, E and k of the brief.
  for (int64_t t : {1, 2, 3, 8, 33, 300, 1024})
    for (int64_t e : {8, 16, 64, 128})
      for (int64_t k : {1, 2, 6, 8})
        if (k <= e) v.push_back({t, e, k, 136, 72, ((t + e + k) % 2) ? S : U});
  return v;
}

std::vector<MoeCase> cases() {
  std::vector<MoeCase> v = small_cases();
  const Routing U = Routing::kUniform, S = Routing::kSkewed;
  // Real sizes (DeepSeek-V2-Lite / Qwen3-30B-A3B hidden and intermediate), few experts so the
  // CPU reference stays quick.
  v.push_back({1, 8, 6, 2048, 1408, U});
  v.push_back({3, 8, 6, 2048, 1408, S});
  v.push_back({8, 16, 6, 2048, 1408, U});
  v.push_back({2, 16, 8, 2048, 768, U});
  v.push_back({33, 16, 8, 2048, 768, S});
  v.push_back({8, 8, 2, 2048, 768, S});
  return v;
}

std::vector<MoeCase> grouped_cases() {
  std::vector<MoeCase> v = small_cases();
  v.push_back({8, 16, 6, 2048, 1408, Routing::kUniform});
  v.push_back({33, 16, 8, 2048, 768, Routing::kSkewed});
  v.push_back({300, 8, 2, 256, 1408, Routing::kSkewed});  // ~600 rows on one expert
  return v;
}

std::string case_name(const ::testing::TestParamInfo<MoeCase>& i) { return i.param.name(); }
INSTANTIATE_TEST_SUITE_P(Table, CudaMoe, ::testing::ValuesIn(cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Table, CudaMoeGrouped, ::testing::ValuesIn(grouped_cases()), case_name);

// CudaBackend::check_integrity: at rest (after whatever tests ran before on the shared backend)
// its counters are zero; inside a graph capture it refuses (it would have to synchronize the
// stream), and the capture can still be ended.
TEST(CudaBackendIntegrity, AtRestAndRefusedInsideCapture) {
  cuda::CudaBackend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device visible";
  EXPECT_NO_THROW(be->check_integrity());
  ASSERT_EQ(cudaStreamBeginCapture(be->stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_THROW(be->check_integrity(), std::exception);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(be->stream(), &graph), cudaSuccess);
  if (graph != nullptr) cudaGraphDestroy(graph);
  EXPECT_NO_THROW(be->check_integrity());
}

// check_integrity reads every attention counter buffer, the outgrown ones too (a graph captured
// before the buffer grew still uses its predecessor): a word left armed in either is reported,
// and zeroed again the check passes.
TEST(CudaBackendIntegrity, ArmedCounterInAnyAttentionBufferIsReported) {
  cuda::CudaBackend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device visible";
  ASSERT_NO_THROW(be->check_integrity());
  const auto before = be->attention_counter_buffers();
  ASSERT_FALSE(before.empty());  // the backend reserves a first buffer
  // Grow the buffer: the current one joins the outgrown ones.
  ASSERT_TRUE(be->reserve_attention_counters(before.front().count + 1));
  const auto bufs = be->attention_counter_buffers();
  ASSERT_EQ(bufs.size(), before.size() + 1);
  EXPECT_GT(bufs.front().count, before.front().count);
  EXPECT_EQ(bufs.back().words, before.front().words);  // the outgrown buffer, kept
  EXPECT_NO_THROW(be->check_integrity());              // the new buffer starts zeroed
  for (const auto& b : {bufs.front(), bufs.back()}) {
    const unsigned armed = 3;
    uint32_t* word = b.words + b.count - 1;  // the last word
    ASSERT_EQ(cudaMemcpy(word, &armed, sizeof armed, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_THROW(be->check_integrity(), std::exception);
    ASSERT_EQ(cudaMemset(word, 0, sizeof armed), cudaSuccess);
    EXPECT_NO_THROW(be->check_integrity());
  }
}

// The decode path captured in a CUDA graph replays bitwise like eager, and a replay after the
// routing changed (new ids copied into the same buffer) follows the new routing.
TEST(CudaMoeGraph, CaptureReplayBitwiseEqualsEager) {
  cuda::CudaBackend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device visible";
  const MoeCase c{8, 64, 6, 2048, 1408, Routing::kUniform};
  const Inputs in = make_inputs(c);
  MoeCase c2 = c;
  c2.routing = Routing::kSkewed;
  const std::vector<int32_t> ids2 = make_ids(c2, 9);
  ASSERT_LE(c.tokens * c.top_k, be->moe_device_max_slots());

  Tensor x = act(*be, in.x);
  ExpertWeights w{act(*be, in.gate_up), act(*be, in.down)};
  Tensor ids = ints(*be, in.ids).reshape({c.tokens, c.top_k});
  Tensor wt = be->upload(in.weights, DType::kF32);
  Tensor y = be->empty({c.tokens, c.hidden}, DType::kBF16);
  be->moe_experts(x, ids, wt, w, y);
  const Tensor eager1 = be->download(y);
  const Tensor host_ids2 = host_i32(ids2);
  be->copy_to_device(host_ids2, ids);
  be->moe_experts(x, ids, wt, w, y);
  const Tensor eager2 = be->download(y);

  const Tensor host_ids1 = host_i32(in.ids);
  be->copy_to_device(host_ids1, ids);
  be->synchronize();
  cuda::CudaGraph graph;
  graph.capture(*be, [&] { be->moe_experts(x, ids, wt, w, y); });
  be->zeros({1}, DType::kI32);  // unrelated work between capture and replay
  CUDA_CHECK(cudaMemsetAsync(y.raw(), 0, y.nbytes(), be->stream()));
  graph.replay();
  const Tensor replay1 = be->download(y);
  be->copy_to_device(host_ids2, ids);
  graph.replay();
  const Tensor replay2 = be->download(y);

  const Metrics m1 = compare(eager1, replay1), m2 = compare(eager2, replay2);
  const Metrics d12 = compare(eager1, eager2);
  std::printf("[moe-op] graph_replay_vs_eager max_abs=%.3e / after_reroute max_abs=%.3e "
              "(routing change moved outputs by %.3e) %s\n",
              m1.max_abs, m2.max_abs, d12.max_abs,
              m1.max_abs == 0.0 && m2.max_abs == 0.0 && d12.max_abs > 0.0 ? "PASS" : "FAIL");
  EXPECT_EQ(m1.max_abs, 0.0);
  EXPECT_EQ(m2.max_abs, 0.0);
  EXPECT_GT(d12.max_abs, 0.0);
  // And eager is deterministic run to run.
  be->copy_to_device(host_ids1, ids);
  be->moe_experts(x, ids, wt, w, y);
  EXPECT_EQ(compare(eager1, be->download(y)).max_abs, 0.0);
  // Above the decode threshold, a capture still takes the device-only kernels (no read-back).
  const int64_t saved = be->moe_device_max_slots();
  be->set_moe_device_max_slots(4);
  cuda::CudaGraph graph_big;
  graph_big.capture(*be, [&] { be->moe_experts(x, ids, wt, w, y); });
  be->set_moe_device_max_slots(saved);
  graph_big.replay();
  const double m3 = compare(eager1, be->download(y)).max_abs;
  std::printf("[moe-op] graph_above_threshold_vs_eager max_abs=%.3e %s\n", m3, m3 == 0.0 ? "PASS" : "FAIL");
  EXPECT_EQ(m3, 0.0);
}

// The one-token path captured in a CUDA graph: six replays, the routing changed on the device
// between them (a skipped slot in one), each bitwise equal to the path run eagerly on the same
// ids (the graph reads the ids, it does not bake them in).
TEST(CudaMoeGraph, OneTokenReplayWithNewRoutesBitwiseEqualsEager) {
  cuda::CudaBackend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device visible";
  const int64_t h = 2048, inter = 768, e = 16, k = 8;
  const Tensor x = act(*be, host_fill({1, h}, 41, 1.0f));
  const ExpertWeights w{act(*be, host_fill({e, 2 * inter, h}, 42, 0.05f)),
                        act(*be, host_fill({e, h, inter}, 43, 0.05f))};
  const Tensor wts = be->upload(host_fill({1, k}, 44, 1.0f), DType::kF32);
  std::vector<std::vector<int32_t>> routes = {
      {0, 3, 5, 7, 9, 11, 13, 15}, {1, 2, 4, 6, 8, 10, 12, 14}, {15, 14, -1, 12, 11, 10, 9, 8}};
  Tensor ids = ints(*be, routes[0]).reshape({1, k});
  Tensor y = be->empty({1, h}, DType::kBF16);
  std::vector<Tensor> ref;
  for (const auto& r : routes) {
    be->copy_to_device(host_i32(r), ids);
    be->moe_experts(x, ids, wts, w, y);
    ref.push_back(be->download(y));
  }
  be->copy_to_device(host_i32(routes[0]), ids);
  be->synchronize();
  cuda::CudaGraph graph;
  graph.capture(*be, [&] { be->moe_experts(x, ids, wts, w, y); });
  int bad = 0;
  for (int rep = 0; rep < 6; ++rep) {
    const size_t r = static_cast<size_t>(rep) % routes.size();
    be->copy_to_device(host_i32(routes[r]), ids);
    CUDA_CHECK(cudaMemsetAsync(y.raw(), 0, y.nbytes(), be->stream()));
    graph.replay();
    const double d = compare(ref[r], be->download(y)).max_abs;
    bad += d != 0.0;
    std::printf("[moe-op] t1_graph_replay%d_route%zu max_abs=%.3e %s\n", rep, r, d,
                d == 0.0 ? "PASS" : "FAIL");
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(compare(ref[0], ref[1]).max_abs, 0.0);  // the routes differ in what they produce
}

// The tensor-core grouped prefill path reads only device offsets: captured, it replays bitwise
// like eager, also after the routing changed.
TEST(CudaMoeGroupedGraph, PrefillReplayBitwiseEqualsEager) {
  cuda::CudaBackend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device visible";
  const MoeCase c{300, 64, 6, 256, 136, Routing::kUniform};
  const Inputs in = make_inputs(c);
  MoeCase c2 = c;
  c2.routing = Routing::kSkewed;
  const Tensor host_ids1 = host_i32(in.ids), host_ids2 = host_i32(make_ids(c2, 9));
  const int64_t saved = be->moe_device_max_slots();
  be->set_moe_device_max_slots(0);
  be->set_moe_grouped_gemm(true);
  Tensor x = act(*be, in.x);
  ExpertWeights w{act(*be, in.gate_up), act(*be, in.down)};
  Tensor ids = ints(*be, in.ids).reshape({c.tokens, c.top_k});
  Tensor wt = be->upload(in.weights, DType::kF32);
  Tensor y = be->empty({c.tokens, c.hidden}, DType::kBF16);
  be->moe_experts(x, ids, wt, w, y);
  const Tensor eager1 = be->download(y);
  be->copy_to_device(host_ids2, ids);
  be->moe_experts(x, ids, wt, w, y);
  const Tensor eager2 = be->download(y);
  be->copy_to_device(host_ids1, ids);
  be->synchronize();
  cuda::CudaGraph graph;
  graph.capture(*be, [&] { be->moe_experts(x, ids, wt, w, y); });
  graph.replay();
  const Tensor replay1 = be->download(y);
  be->copy_to_device(host_ids2, ids);
  graph.replay();
  const Tensor replay2 = be->download(y);
  be->set_moe_grouped_gemm(false);
  be->set_moe_device_max_slots(saved);
  const double worst = std::max(compare(eager1, replay1).max_abs, compare(eager2, replay2).max_abs);
  const bool ok = worst == 0.0 && compare(eager1, eager2).max_abs > 0.0;
  std::printf("[moe-op] graph_grouped_prefill_vs_eager max_abs=%.3e %s\n", worst, ok ? "PASS" : "FAIL");
  EXPECT_TRUE(ok);
}

// Router + experts of a DeepSeek-V3-style layer (sigmoid, host correction bias, group limit,
// renormalised and scaled weights) in one graph: replays bitwise like eager, for two logit sets.
TEST(CudaMoeGraph, RouteAndExpertsReplayBitwiseEqualsEager) {
  cuda::CudaBackend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device visible";
  const int64_t t = 16, e = 64, k = 6, h = 256, inter = 128;
  MoeRoutingParams rp;
  rp.scoring = MoeRoutingParams::Scoring::kSigmoid;
  rp.group_score = MoeRoutingParams::GroupScore::kTopTwoSum;
  rp.num_experts = static_cast<int32_t>(e);
  rp.top_k = static_cast<int32_t>(k);
  rp.num_groups = 8;
  rp.topk_groups = 4;
  rp.renormalize = true;
  rp.renorm_eps = 1e-20f;
  rp.scaling = 2.5f;
  const Tensor bias_host = host_fill({e}, 21, 0.1f);  // host f32, as the model passes it
  rp.correction_bias = &bias_host;
  const Tensor logits1 = host_fill({t, e}, 22, 3.0f), logits2 = host_fill({t, e}, 23, 3.0f);
  Tensor logits = be->upload(logits1, DType::kF32);
  Tensor x = act(*be, host_fill({t, h}, 24, 1.0f));
  ExpertWeights w{act(*be, host_fill({e, 2 * inter, h}, 25, 0.05f)),
                  act(*be, host_fill({e, h, inter}, 26, 0.05f))};
  Tensor ids = be->empty({t, k}, DType::kI32), wts = be->empty({t, k}, DType::kF32);
  Tensor y = be->empty({t, h}, DType::kBF16);
  auto step = [&] {
    be->moe_route(logits, rp, ids, wts);
    be->moe_experts(x, ids, wts, w, y);
  };
  step();  // eager warm-up (uploads the host bias once)
  const Tensor e_ids1 = be->download(ids), e_w1 = be->download(wts), e_y1 = be->download(y);
  be->copy_to_device(logits2, logits);
  step();
  const Tensor e_ids2 = be->download(ids), e_w2 = be->download(wts), e_y2 = be->download(y);
  be->copy_to_device(logits1, logits);
  be->synchronize();
  cuda::CudaGraph graph;
  graph.capture(*be, step);
  graph.replay();
  const Tensor g_ids1 = be->download(ids), g_w1 = be->download(wts), g_y1 = be->download(y);
  be->copy_to_device(logits2, logits);
  graph.replay();
  const Tensor g_ids2 = be->download(ids), g_w2 = be->download(wts), g_y2 = be->download(y);
  const double worst = std::max({compare(e_w1, g_w1).max_abs, compare(e_y1, g_y1).max_abs,
                                 compare(e_w2, g_w2).max_abs, compare(e_y2, g_y2).max_abs});
  const int64_t id_mism = compare(e_ids1, g_ids1).mismatches + compare(e_ids2, g_ids2).mismatches;
  const bool ok = worst == 0.0 && id_mism == 0 && compare(e_y1, e_y2).max_abs > 0.0;
  std::printf("[moe-op] graph_route_experts_vs_eager max_abs=%.3e id_mismatches=%lld %s\n", worst,
              static_cast<long long>(id_mism), ok ? "PASS" : "FAIL");
  EXPECT_TRUE(ok);
}

// ---- moeperf (issue #6 decode speed): v2 decode kernels and the warp router ----

// v2 decode kernels (incl. the one-token path without align / combine) vs v1: bitwise equal,
// on every table case that takes the decode path.
TEST(CudaMoeDecodeV2, BitwiseEqualsV1) {
  cuda::CudaBackend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device visible";
  std::vector<MoeCase> v = cases();
  v.push_back({16, 8, 6, 2048, 1408, Routing::kSkewed});  // 16 rows on the hot expert (MT = 8, twice)
  v.push_back({1, 8, 8, 2048, 768, Routing::kUniform});    // one token, k = 8, Qwen3 sizes
  const int64_t saved = be->moe_device_max_slots();
  be->set_moe_device_max_slots(int64_t{1} << 40);
  double worst = 0.0;
  int n = 0, bad = 0;
  for (const MoeCase& c : v) {
    if (c.tokens * c.top_k > 2048) continue;
    const Inputs in = make_inputs(c);
    const OnBackend d = upload_inputs(*be, c, in);
    cuda::set_moe_decode_impl_override(cuda::MoeDecodeImpl::kV1);
    const Tensor a = run_moe(*be, c, d);
    cuda::set_moe_decode_impl_override(cuda::MoeDecodeImpl::kV2);
    const Tensor b = run_moe(*be, c, d);
    const double m = compare(a, b).max_abs;
    worst = std::max(worst, m);
    ++n;
    if (m != 0.0) {
      ++bad;
      std::printf("[moe-op] decode_v2_vs_v1 %s max_abs=%.3e FAIL\n", c.name().c_str(), m);
    }
  }
  cuda::set_moe_decode_impl_override(cuda::MoeDecodeImpl::kAuto);
  be->set_moe_device_max_slots(saved);
  std::printf("[moe-op] decode_v2_vs_v1 cases=%d not_bitwise=%d worst_max_abs=%.3e %s\n", n, bad, worst,
              bad == 0 ? "PASS" : "FAIL");
  EXPECT_EQ(bad, 0);
}

// The decode path forced onto `impl` (and, with t1_off, one token off its own kernels) on the
// cases `v`, against the CPU op: the number of cases outside the bf16 bounds.
int decode_cases_off_cpu(cuda::CudaBackend& be, const std::vector<MoeCase>& v,
                         cuda::MoeDecodeImpl impl, bool t1_off, const std::string& tag) {
  auto cpu = make_cpu_backend();
  const int64_t saved = be.moe_device_max_slots();
  be.set_moe_device_max_slots(int64_t{1} << 40);
  int bad = 0;
  for (const MoeCase& c : v) {
    const Inputs in = make_inputs(c);
    const Tensor ref = run_moe(*cpu, c, upload_inputs(*cpu, c, in));
    const OnBackend d = upload_inputs(be, c, in);
    cuda::set_moe_decode_impl_override(impl);
    if (t1_off) cuda::set_moe_t1_path_override(0);
    const Tensor got = run_moe(be, c, d);
    cuda::set_moe_t1_path_override(-1);
    cuda::set_moe_decode_impl_override(cuda::MoeDecodeImpl::kAuto);
    if (!check_bf16(c.name() + "_" + tag, ref, got)) ++bad;
  }
  be.set_moe_device_max_slots(saved);
  std::printf("[moe-op] decode_%s_vs_cpu cases=%zu failed=%d %s\n", tag.c_str(), v.size(), bad,
              bad == 0 ? "PASS" : "FAIL");
  return bad;
}

// The tensor-core decode kernels with the cp.async weight ring (MoeDecodeImpl::kTc) vs the CPU
// op (the one-token path off): every small case (odd H 136 / I 72: k tails and partial row
// tiles), real V2-Lite / Qwen3-30B-A3B sizes, skewed routing (a hot expert with more rows than one token
// group of 8, 16 or 32: the weights streamed once per group), and sizes past the decode range
// forced onto it.
TEST(CudaMoeDecodeTc, MatchesCpu) {
  cuda::CudaBackend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device visible";
  std::vector<MoeCase> v;
  for (const MoeCase& c : small_cases()) v.push_back(c);  // T = 1 too: the one-token path off
  v.push_back({1, 8, 6, 2048, 1408, Routing::kUniform});
  v.push_back({8, 16, 6, 2048, 1408, Routing::kUniform});
  v.push_back({33, 16, 8, 2048, 768, Routing::kSkewed});
  v.push_back({16, 8, 6, 2048, 1408, Routing::kSkewed});
  v.push_back({64, 8, 2, 2048, 768, Routing::kUniform});  // 16 rows per expert: 2 n-tiles
  v.push_back({300, 8, 2, 256, 1408, Routing::kSkewed});  // ~600 rows on one expert
  EXPECT_EQ(decode_cases_off_cpu(*be, v, cuda::MoeDecodeImpl::kTc, true, "tc"), 0);
}

// The one-token path (launch_moe_decode_t1) at hidden 2048, inter 768 / 1408 / 2048 (pipelined
// down kernel: 3 / 6 / 8 chunk-iterations per lane), 136 and 1032 (1 and 5 iterations: kernels
// built for 2 and 6, so a whole chunk-iteration runs past the row) and 2056 (> 2048: the pair
// kernel either way), top-k 1..8, with expert ids < 0 or >= E in some slots (skipped: the CPU
// reference gets weight 0 and a valid id there). The pipelined down is bitwise equal to the pair
// kernel (DEEPINFER_MOE_T1_DOWN=v1) and to the 4-kernel v1 path, and matches the CPU op.
TEST(CudaMoeDecodeT1, PipelinedDownBitwiseEqualsPairsAndMatchesCpu) {
  cuda::CudaBackend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device visible";
  auto cpu = make_cpu_backend();
  const int64_t h = 2048, e = 5, max_k = 8;  // few experts keep the host copies small; ids repeat
  int bad = 0, n = 0;
  for (int64_t inter : {768, 1408, 2048, 2056, 136, 1032}) {
    const Tensor x = host_fill({1, h}, 11, 1.0f);
    const Tensor gate_up = host_fill({e, 2 * inter, h}, 12, 0.05f);
    const Tensor down = host_fill({e, h, inter}, 13, 0.05f);
    const Tensor wts_all = host_fill({1, max_k}, 14, 1.0f);
    const Tensor x_d = act(*be, x);
    const ExpertWeights w_d{act(*be, gate_up), act(*be, down)};
    const Tensor x_c = act(*cpu, x);
    const ExpertWeights w_c{act(*cpu, gate_up), act(*cpu, down)};
    for (int64_t k = 1; k <= max_k + 1; ++k) {
      // k = max_k + 1: top-8 with every slot skipped (output zeros).
      const bool all_invalid = k == max_k + 1;
      const int64_t kk = all_invalid ? max_k : k;
      std::vector<int32_t> ids(static_cast<size_t>(kk)), ids_cpu(ids.size());
      Tensor wts = Tensor::empty({1, kk}, DType::kF32),
             wts_cpu = Tensor::empty({1, kk}, DType::kF32);
      for (int64_t j = 0; j < kk; ++j) {
        int32_t id = static_cast<int32_t>((3 * j + k) % e);
        if (all_invalid) id = j % 2 ? -1 : static_cast<int32_t>(e + j);
        if (k >= 2 && j == k / 2) id = -1;                       // a negative id mid-list
        if (k >= 5 && j == k - 1) id = static_cast<int32_t>(e);  // out of range, last slot
        if (k == 3 && j == 0) id = -7;                           // first slot
        const bool ok = id >= 0 && id < e;
        ids[static_cast<size_t>(j)] = id;
        ids_cpu[static_cast<size_t>(j)] = ok ? id : 0;
        wts.f32()[j] = wts_all.f32()[j];
        wts_cpu.f32()[j] = ok ? wts_all.f32()[j] : 0.0f;
      }
      const Tensor ids_d = ints(*be, ids).reshape({1, kk});
      const Tensor wts_d = be->upload(wts, DType::kF32);
      Tensor y_c = cpu->empty({1, h}, cpu->compute_dtype());
      cpu->moe_experts(x_c, ints(*cpu, ids_cpu).reshape({1, kk}), cpu->upload(wts_cpu, DType::kF32),
                       w_c, y_c);
      const Tensor ref = cpu->download(y_c);
      auto run = [&](cuda::MoeDecodeImpl impl, cuda::MoeT1DownImpl down_impl) {
        cuda::set_moe_decode_impl_override(impl);
        cuda::set_moe_t1_down_impl_override(down_impl);
        Tensor y = be->empty({1, h}, DType::kBF16);
        be->moe_experts(x_d, ids_d, wts_d, w_d, y);
        return be->download(y);
      };
      const Tensor pipe = run(cuda::MoeDecodeImpl::kV2, cuda::MoeT1DownImpl::kPipelined);
      const Tensor pairs = run(cuda::MoeDecodeImpl::kV2, cuda::MoeT1DownImpl::kPairs);
      const Tensor smem = run(cuda::MoeDecodeImpl::kV2, cuda::MoeT1DownImpl::kSmem);
      Tensor slot[3];  // one warp per slot, 1 / 2 / 4 columns per CTA
      for (int v = 0; v < 3; ++v) {
        cuda::set_moe_t1_slot_cols(1 << v);
        slot[v] = run(cuda::MoeDecodeImpl::kV2, cuda::MoeT1DownImpl::kSlot);
      }
      cuda::set_moe_t1_slot_cols(0);
      const Tensor v1 =
          run(cuda::MoeDecodeImpl::kV1, cuda::MoeT1DownImpl::kAuto);  // align + 3 kernels
      int64_t vs_pairs = 0, vs_v1 = 0, vs_smem = 0, vs_slot = 0;
      for (int64_t i = 0; i < h; ++i) {
        vs_pairs += pipe.f32()[i] != pairs.f32()[i];
        vs_v1 += pipe.f32()[i] != v1.f32()[i];
        vs_smem += pipe.f32()[i] != smem.f32()[i];
        for (const Tensor& t : slot) vs_slot += pipe.f32()[i] != t.f32()[i];
      }
      std::string label("t1_i");
      label += std::to_string(inter);
      label += "_k";
      label += std::to_string(kk);
      if (all_invalid) label += "_all_skipped";
      bool ok = vs_pairs == 0 && vs_v1 == 0 && vs_smem == 0 && vs_slot == 0;
      if (all_invalid) {
        double max_abs = 0.0;
        for (int64_t i = 0; i < h; ++i)
          max_abs = std::max(max_abs, static_cast<double>(std::fabs(pipe.f32()[i])));
        ok = ok && max_abs == 0.0;
      } else {
        ok = check_bf16(label, ref, pipe) && ok;
      }
      ++n;
      if (!ok) {
        ++bad;
        std::printf(
            "[moe-op] %s pipelined_vs_pairs_differing=%lld vs_v1_differing=%lld "
            "vs_smem_differing=%lld vs_slot_differing=%lld FAIL\n",
            label.c_str(), static_cast<long long>(vs_pairs), static_cast<long long>(vs_v1),
            static_cast<long long>(vs_smem), static_cast<long long>(vs_slot));
      }
    }
  }
  cuda::set_moe_decode_impl_override(cuda::MoeDecodeImpl::kAuto);
  cuda::set_moe_t1_down_impl_override(cuda::MoeT1DownImpl::kAuto);
  std::printf("[moe-op] decode_t1_pipelined_down cases=%d failed=%d %s\n", n, bad,
              bad == 0 ? "PASS" : "FAIL");
  EXPECT_EQ(bad, 0);
}

struct RouteCase {
  int64_t tokens;
  int32_t experts, top_k, groups, topk_groups;
  bool sigmoid, top_two, bias, renorm, ties;
};

// The warp router vs the serial kernel (bitwise: ids and weights) and vs the CPU op (ids exact,
// weights within 1e-5): softmax / sigmoid, bias, group limits (max / top-two sum), renormalised
// and scaled weights, E up to 256, T = 1 .. 300, and all-equal logits (ties: lower id first);
// a softmax without bias or groups selects on the logits in all three (moe_route_on_logits):
// renormalised (Qwen3's shape) or not (V2-Lite's, V2's 160), with ties, odd E, k = 32 of 512.
TEST(CudaMoeRoute, WarpEqualsSerialAndCpu) {
  cuda::CudaBackend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device visible";
  auto cpu = make_cpu_backend();
  std::vector<RouteCase> v;
  for (int64_t t : {1, 5, 33, 300}) {
    v.push_back({t, 64, 6, 1, 1, false, false, false, false, false});   // V2-Lite
    v.push_back({t, 64, 6, 8, 3, false, false, false, true, false});    // V2-style group max
    v.push_back({t, 128, 8, 1, 1, false, false, false, true, false});   // Qwen3-30B-A3B
    v.push_back({t, 256, 8, 8, 4, true, true, true, true, false});      // V3
    v.push_back({t, 160, 6, 1, 1, false, false, false, false, false});  // V2 (160 experts)
    v.push_back({t, 8, 2, 1, 1, true, false, true, false, false});
    v.push_back({t, 33, 1, 1, 1, false, false, false, false, false});   // odd E, k = 1
    v.push_back({t, 512, 32, 64, 5, true, true, true, true, false});    // the kernel's limits
    v.push_back({t, 64, 6, 8, 3, false, false, false, true, true});     // ties
    v.push_back({t, 256, 8, 8, 4, true, true, false, true, true});
    // Selection on the logits (moe_route_on_logits): ties, odd E, the top-k limit, renormalised
    // or not.
    v.push_back({t, 64, 6, 1, 1, false, false, false, true, true});
    v.push_back({t, 33, 3, 1, 1, false, false, false, true, false});
    v.push_back({t, 512, 32, 1, 1, false, false, false, true, false});
    v.push_back({t, 64, 6, 1, 1, false, false, false, false, true});
    v.push_back({t, 512, 32, 1, 1, false, false, false, false, false});
    v.push_back({t, 40, 4, 1, 1, false, false, false, false, false});
  }
  int bad = 0, n = 0;
  for (const RouteCase& c : v) {
    Tensor logits = Tensor::empty({c.tokens, c.experts}, DType::kF32);
    std::mt19937 rng(static_cast<uint32_t>(c.tokens * 1000 + c.experts + c.top_k));
    std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
    for (int64_t i = 0; i < logits.numel(); ++i) logits.f32()[i] = c.ties ? 0.5f : dist(rng);
    Tensor bias = Tensor::empty({c.experts}, DType::kF32);
    for (int64_t i = 0; i < bias.numel(); ++i) bias.f32()[i] = 0.1f * dist(rng);
    MoeRoutingParams rp;
    rp.scoring = c.sigmoid ? MoeRoutingParams::Scoring::kSigmoid : MoeRoutingParams::Scoring::kSoftmax;
    rp.group_score = c.top_two ? MoeRoutingParams::GroupScore::kTopTwoSum : MoeRoutingParams::GroupScore::kMax;
    rp.num_experts = c.experts;
    rp.top_k = c.top_k;
    rp.num_groups = c.groups;
    rp.topk_groups = c.topk_groups;
    rp.correction_bias = c.bias ? &bias : nullptr;
    rp.renormalize = c.renorm;
    rp.renorm_eps = c.renorm ? 1e-20f : 0.0f;
    rp.scaling = c.renorm ? 2.5f : 1.0f;
    Tensor ref_ids = cpu->empty({c.tokens, c.top_k}, DType::kI32);
    Tensor ref_w = cpu->empty({c.tokens, c.top_k}, DType::kF32);
    cpu->moe_route(logits, rp, ref_ids, ref_w);

    const Tensor d_logits = be->upload(logits, DType::kF32);
    const Tensor d_bias = be->upload(bias, DType::kF32);
    Tensor got_ids[2], got_w[2];
    const cuda::MoeRouteImpl impls[2] = {cuda::MoeRouteImpl::kSerial, cuda::MoeRouteImpl::kWarp};
    for (int i = 0; i < 2; ++i) {
      Tensor ids = be->empty({c.tokens, c.top_k}, DType::kI32);
      Tensor w = be->empty({c.tokens, c.top_k}, DType::kF32);
      cuda::MoeRouteParams p{static_cast<const float*>(d_logits.raw()),
                             c.bias ? static_cast<const float*>(d_bias.raw()) : nullptr,
                             static_cast<int32_t*>(ids.raw()), static_cast<float*>(w.raw()), c.tokens,
                             c.experts, c.top_k, c.groups, c.topk_groups, c.sigmoid, c.top_two, c.renorm,
                             rp.renorm_eps, rp.scaling};
      p.on_logits = moe_route_on_logits(rp);  // as the backend sets it
      cuda::launch_moe_route(p, be->stream(), impls[i]);
      CUDA_CHECK(cudaGetLastError());
      be->synchronize();
      got_ids[i] = be->download(ids);
      got_w[i] = be->download(w);
    }
    int64_t id_vs_serial = 0, id_vs_cpu = 0;
    double w_vs_serial = 0.0, w_vs_cpu = 0.0;
    for (int64_t i = 0; i < c.tokens * c.top_k; ++i) {
      const int32_t s = got_ids[0].data<int32_t>()[i], g = got_ids[1].data<int32_t>()[i];
      id_vs_serial += s != g ? 1 : 0;
      id_vs_cpu += g != ref_ids.data<int32_t>()[i] ? 1 : 0;
      w_vs_serial = std::max(w_vs_serial, static_cast<double>(std::fabs(got_w[0].f32()[i] - got_w[1].f32()[i])));
      w_vs_cpu = std::max(w_vs_cpu, static_cast<double>(std::fabs(ref_w.f32()[i] - got_w[1].f32()[i])));
    }
    const bool ok = id_vs_serial == 0 && w_vs_serial == 0.0 && id_vs_cpu == 0 && w_vs_cpu <= 1e-5;
    ++n;
    if (!ok) {
      ++bad;
      std::printf("[moe-op] route_warp t=%lld e=%d k=%d groups=%d/%d sigmoid=%d top2=%d bias=%d ties=%d: "
                  "ids_vs_serial=%lld w_vs_serial=%.3e ids_vs_cpu=%lld w_vs_cpu=%.3e FAIL\n",
                  static_cast<long long>(c.tokens), c.experts, c.top_k, c.groups, c.topk_groups,
                  c.sigmoid ? 1 : 0, c.top_two ? 1 : 0, c.bias ? 1 : 0, c.ties ? 1 : 0,
                  static_cast<long long>(id_vs_serial), w_vs_serial, static_cast<long long>(id_vs_cpu),
                  w_vs_cpu);
    }
  }
  std::printf("[moe-op] route_warp_vs_serial_and_cpu cases=%d failed=%d %s\n", n, bad, bad == 0 ? "PASS" : "FAIL");
  EXPECT_EQ(bad, 0);
}

// The fused router (Backend::moe_norm_route, one kernel): h bitwise the rms_norm op's, ids and
// weights bitwise the warp router's on the kernel's own logits, logits close to the GEMM's, for
// Qwen3-30B-A3B / V2-Lite / DeepSeek-V3 routing at 1-4 tokens and every rms_norm thread count
// (hidden 264 / 1024 / 2048 / 7168: 128 / 256 / 512 / 512 threads), twice in a row (the arrival
// counter is back at zero after each launch). The *_ties cases repeat the gate rows (expert i's
// row is row i % dup), so that equal logits meet in the top-k rounds: the model instances' sorted
// rounds (run 43) break ties by the lower id as the warp router's scan does.
TEST(CudaMoeFused, NormRouteBitwiseEqualsComposedOps) {
  cuda::CudaBackend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device visible";
  struct Case {
    const char* name;
    int64_t tokens, hidden;
    MoeRoutingParams r;
    bool bias;
    int64_t dup = 0;  // > 0: gate row i = row i % dup
  };
  const MoeRoutingParams qwen = qwen3_moe_routing(), v2 = v2_lite_routing(),
                         v3 = deepseek_v3_routing();
  // The golden models' sizes too: 8 experts (one CTA of the cluster router, half its warps
  // without an expert) and 20 (two CTAs, the second partly empty).
  MoeRoutingParams tiny8 = qwen, tiny20 = v2;
  tiny8.num_experts = 8;
  tiny8.top_k = 2;
  tiny20.num_experts = 20;
  tiny20.top_k = 3;
  // DeepSeek-V3's routing (sigmoid, bias, group limit) on 64 experts: the cluster router's
  // generic instance (RouteMode::kAny); qwen3 / tiny8 take its renormalising instance and
  // v2lite / tiny20 its full-softmax one.
  MoeRoutingParams v3_64 = v3;
  v3_64.num_experts = 64;
  const std::vector<Case> cases = {{"qwen3", 1, 2048, qwen, false},
                                   {"qwen3", 4, 2048, qwen, false},
                                   {"v2lite", 1, 2048, v2, false},
                                   {"v2lite", 3, 1024, v2, false},
                                   {"v2lite", 2, 264, v2, false},
                                   {"v3", 2, 7168, v3, true},
                                   {"v3", 1, 7168, v3, true},
                                   {"tiny8", 1, 264, tiny8, false},
                                   {"tiny20", 2, 1024, tiny20, false},
                                   {"v3_64", 2, 2048, v3_64, true},
                                   {"qwen3_ties", 1, 2048, qwen, false, 16},
                                   {"qwen3_ties", 1, 2048, qwen, false, 37},
                                   {"v2lite_ties", 1, 2048, v2, false, 5},
                                   {"v2lite_ties", 2, 1024, v2, false, 24}};
  int bad = 0;
  be->set_moe_norm_route_max_elems(cuda::kNormRouteMaxElems);  // the kernel at every size it takes
  // Both fused routers where both apply: the cluster router (up to 128 experts) and the counter
  // kernel; each against the composed ops, and the second against the first bitwise.
  std::vector<std::vector<Tensor>> first_outputs(cases.size());
  for (const int cluster : {1, 0}) {
    cuda::set_moe_route_cluster_override(cluster);
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const Case& c = cases[ci];
      const int64_t t = c.tokens, h = c.hidden, e = c.r.num_experts, k = c.r.top_k;
      const Tensor x = act(*be, host_fill({t, h}, 21, 2.0f));
      const Tensor nw = act(*be, host_fill({h}, 22, 1.0f));
      Tensor gate_h = host_fill({e, h}, 23, 0.1f);
      if (c.dup > 0)
        for (int64_t i = c.dup; i < e; ++i)
          std::memcpy(gate_h.f32() + i * h, gate_h.f32() + (i % c.dup) * h, h * sizeof(float));
      const Tensor gate = act(*be, gate_h);
      const Tensor bias = host_fill({e}, 24, 0.1f);
      MoeRoutingParams r = c.r;
      r.correction_bias = c.bias ? &bias : nullptr;
      Tensor hf = be->empty({t, h}, DType::kBF16), ids = be->empty({t, k}, DType::kI32),
             w = be->empty({t, k}, DType::kF32), logits = be->empty({t, e}, DType::kF32);
      MoeNormRouteParams q;
      q.x = &x;
      q.norm_w = &nw;
      q.eps = 1e-6f;
      q.gate = &gate;
      q.routing = r;
      q.h = &hf;
      q.topk_ids = &ids;
      q.topk_weights = &w;
      q.logits = &logits;
      be->set_moe_fused(1);
      int64_t differing = 0;
      double logit_err = 0.0;
      for (int rep = 0; rep < 2; ++rep) {
        const int64_t calls = be->moe_fused_route_calls();
        be->moe_norm_route(q);
        const bool fused = be->moe_fused_route_calls() == calls + 1;
        // The composed ops: rms_norm, the router GEMM, the warp router on the kernel's logits.
        Tensor hc = be->empty({t, h}, DType::kBF16), lc = be->empty({t, e}, DType::kF32);
        Tensor ids_r = be->empty({t, k}, DType::kI32), w_r = be->empty({t, k}, DType::kF32);
        be->rms_norm(x, nw, 1e-6f, hc);
        be->linear(hc, gate, nullptr, lc);
        be->moe_route(logits, r, ids_r, w_r);
        const Tensor a = be->download(hf), b = be->download(hc), la = be->download(logits),
                     lb = be->download(lc), ia = be->download(ids), ib = be->download(ids_r),
                     wa = be->download(w), wb = be->download(w_r);
        for (int64_t i = 0; i < a.numel(); ++i) differing += a.f32()[i] != b.f32()[i];
        for (int64_t i = 0; i < ia.numel(); ++i)
          differing += ia.data<int32_t>()[i] != ib.data<int32_t>()[i] || wa.f32()[i] != wb.f32()[i];
        double scale = 0.0;
        for (int64_t i = 0; i < lb.numel(); ++i)
          scale = std::max(scale, std::fabs(double{lb.f32()[i]}));
        for (int64_t i = 0; i < lb.numel(); ++i)
          logit_err = std::max(logit_err, std::fabs(double{la.f32()[i]} - lb.f32()[i]) / scale);
        if (!fused) ++differing;
      }
      // The other router's outputs of the same inputs (second pass): bitwise the first pass's.
      const std::vector<Tensor> outs = {be->download(hf), be->download(logits), be->download(ids),
                                        be->download(w)};
      int64_t cross = 0;
      if (first_outputs[ci].empty()) {
        first_outputs[ci] = outs;
      } else {
        for (size_t o = 0; o < outs.size(); ++o)
          cross += std::memcmp(outs[o].raw(), first_outputs[ci][o].raw(), outs[o].nbytes()) != 0;
      }
      const bool ok = differing == 0 && logit_err < 1e-4 && cross == 0;
      bad += !ok;
      std::printf(
          "[moe-op] norm_route_%s_t%lld_h%lld router=%s differing=%lld logit_err=%.2e "
          "vs_first_pass=%s %s\n",
          c.name, static_cast<long long>(t), static_cast<long long>(h),
          cuda::moe_norm_route_uses_cluster(static_cast<int>(e)) ? "cluster" : "counter",
          static_cast<long long>(differing), logit_err,
          cluster == 1 ? "-" : (cross == 0 ? "equal" : "DIFFER"), ok ? "PASS" : "FAIL");
    }
  }
  cuda::set_moe_route_cluster_override(-1);
  be->set_moe_fused(-1);
  be->set_moe_norm_route_max_elems(4096);
  EXPECT_EQ(bad, 0);
}

// The fused MoE output (Backend::moe_residual at one token: the one-token kernels with the
// shared expert as extra slots and the residual add in down's store) against the composed ops on
// the GPU (moe_experts, the shared MLP, two adds): bitwise without a shared expert, within bf16
// tolerance with one (one f32 sum instead of two roundings); skipped ids included.
TEST(CudaMoeFused, ResidualMatchesComposedOps) {
  cuda::CudaBackend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device visible";
  struct Case {
    int64_t hidden, inter, experts, top_k, shared_mult;
    bool skip;
  };
  const std::vector<Case> cases = {{2048, 768, 16, 8, 0, false},
                                   {2048, 768, 16, 8, 0, true},
                                   {2048, 1408, 8, 6, 2, false},
                                   {2048, 1408, 8, 6, 2, true},
                                   {1024, 512, 8, 3, 1, false},
                                   {1024, 2056, 4, 2, 1, false},
                                   // more columns than 16 per SM: the smem down kernel's
                                   // warps take several columns each
                                   {4096, 256, 4, 2, 1, true}};
  int bad = 0;
  for (const Case& c : cases) {
    const int64_t h = c.hidden, in = c.inter, e = c.experts, k = c.top_k, si = c.shared_mult * in;
    const Tensor x = act(*be, host_fill({1, h}, 31, 1.0f));
    const Tensor res0 = host_fill({1, h}, 32, 4.0f);
    const ExpertWeights w{act(*be, host_fill({e, 2 * in, h}, 33, 0.05f)),
                          act(*be, host_fill({e, h, in}, 34, 0.05f))};
    Tensor sgu, sd;
    if (si > 0) {
      sgu = act(*be, host_fill({2 * si, h}, 35, 0.05f));
      sd = act(*be, host_fill({h, si}, 36, 0.05f));
    }
    std::vector<int32_t> idv;
    for (int64_t j = 0; j < k; ++j) idv.push_back(static_cast<int32_t>((5 * j + 1) % e));
    if (c.skip) idv[static_cast<size_t>(k / 2)] = -1;
    const Tensor ids = ints(*be, idv).reshape({1, k});
    const Tensor wts = be->upload(host_fill({1, k}, 37, 1.0f), DType::kF32);
    auto run = [&](int fused) {
      be->set_moe_fused(fused);
      Tensor res = act(*be, res0);
      be->moe_residual({.x = &x,
                        .topk_ids = &ids,
                        .topk_weights = &wts,
                        .experts = &w,
                        .shared_gate_up = si > 0 ? &sgu : nullptr,
                        .shared_down = si > 0 ? &sd : nullptr,
                        .residual = &res});
      return be->download(res);
    };
    const int64_t calls = be->moe_fused_residual_calls();
    const Tensor fused = run(1);
    const bool took = be->moe_fused_residual_calls() == calls + 1;
    cuda::set_moe_t1_down_impl_override(cuda::MoeT1DownImpl::kPairs);
    const Tensor fused_pairs = run(1);  // the pair down kernel: the same bits
    cuda::set_moe_t1_down_impl_override(cuda::MoeT1DownImpl::kSmem);
    const Tensor fused_smem = run(1);  // act in shared memory: the same bits
    Tensor fused_slot[3];  // one warp per slot, 1 / 2 / 4 columns per CTA: the same bits
    cuda::set_moe_t1_down_impl_override(cuda::MoeT1DownImpl::kSlot);
    for (int v = 0; v < 3; ++v) {
      cuda::set_moe_t1_slot_cols(1 << v);
      fused_slot[v] = run(1);
    }
    cuda::set_moe_t1_slot_cols(0);
    cuda::set_moe_t1_down_impl_override(cuda::MoeT1DownImpl::kAuto);
    const Tensor composed = run(0);
    int64_t differing = 0, vs_pairs = 0, vs_smem = 0, vs_slot = 0;
    for (int64_t i = 0; i < h; ++i) {
      differing += fused.f32()[i] != composed.f32()[i];
      vs_pairs += fused.f32()[i] != fused_pairs.f32()[i];
      vs_smem += fused.f32()[i] != fused_smem.f32()[i];
      for (const Tensor& o : fused_slot) vs_slot += fused.f32()[i] != o.f32()[i];
    }
    std::string label = "residual_h" + std::to_string(h) + "_i" + std::to_string(in) + "_k" +
                        std::to_string(k) + "_shared" + std::to_string(c.shared_mult) +
                        (c.skip ? "_skip" : "");
    const bool ok = took && vs_pairs == 0 && vs_smem == 0 && vs_slot == 0 &&
                    (si > 0 ? check_bf16(label, composed, fused) : differing == 0);
    bad += !ok;
    std::printf("[moe-op] %s fused=%d differing=%lld vs_pairs=%lld vs_smem=%lld vs_slot=%lld %s\n",
                label.c_str(), took ? 1 : 0, static_cast<long long>(differing),
                static_cast<long long>(vs_pairs), static_cast<long long>(vs_smem),
                static_cast<long long>(vs_slot), ok ? "PASS" : "FAIL");
  }
  be->set_moe_fused(-1);
  EXPECT_EQ(bad, 0);
  // The router's counter was left at rest by every launch.
  EXPECT_NO_THROW(be->check_integrity());
}

// The shared slots started during the router (MoeDecodeT1Params::shared_early: gate_up as a PDL
// dependent of the router, the shared CTAs first, each recomputing x = rms_norm(residual) from
// the residual without waiting) against the same block with x read from the router's h: the
// router and the block in sequence as the model issues them (moe_norm_route, then moe_residual
// with the norm), bitwise, at every rms_norm thread count (hidden 264 / 1024 / 2048 / 7168), one to
// four shared slots, a skipped routed slot; three steps in a row on the same buffers.
TEST(CudaMoeFused, SharedEarlyBitEqualToRouterInput) {
  cuda::CudaBackend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device visible";
  struct Case {
    int64_t hidden, inter, shared_mult;
    MoeRoutingParams r;
    bool skip;
  };
  // V2-Lite's and V3's routing on fewer experts (the weights are filled on the host).
  MoeRoutingParams v2 = v2_lite_routing(), v3 = deepseek_v3_routing();
  v2.num_experts = 16;
  v3.num_experts = 16;
  v3.num_groups = 4;
  v3.topk_groups = 2;
  v3.top_k = 4;
  const std::vector<Case> cases = {{2048, 1408, 2, v2, false},
                                   {2048, 1408, 2, v2, true},
                                   {1024, 512, 1, v2, false},
                                   {264, 128, 4, v2, false},
                                   {7168, 2048, 1, v3, false}};
  int bad = 0;
  for (const Case& c : cases) {
    const int64_t h = c.hidden, in = c.inter, e = c.r.num_experts, k = c.r.top_k,
                  si = c.shared_mult * in;
    const Tensor res0 = host_fill({1, h}, 41, 3.0f);
    const Tensor nw = act(*be, host_fill({h}, 42, 1.0f));
    const Tensor gate = act(*be, host_fill({e, h}, 43, 0.1f));
    const Tensor bias = host_fill({e}, 44, 0.1f);
    const ExpertWeights w{act(*be, host_fill({e, 2 * in, h}, 45, 0.05f)),
                          act(*be, host_fill({e, h, in}, 46, 0.05f))};
    const Tensor sgu = act(*be, host_fill({2 * si, h}, 47, 0.05f));
    const Tensor sd = act(*be, host_fill({h, si}, 48, 0.05f));
    MoeRoutingParams r = c.r;
    r.correction_bias = r.scoring == MoeRoutingParams::Scoring::kSigmoid ? &bias : nullptr;
    auto run = [&](int early, int64_t* fused_calls) {
      cuda::set_moe_shared_early_override(early);
      be->set_moe_fused(1);
      Tensor res = act(*be, res0);
      std::vector<float> out;
      for (int step = 0; step < 3; ++step) {
        Tensor hf = be->empty({1, h}, DType::kBF16), ids = be->empty({1, k}, DType::kI32),
               wts = be->empty({1, k}, DType::kF32);
        be->moe_norm_route({.x = &res,
                            .norm_w = &nw,
                            .eps = 1e-6f,
                            .gate = &gate,
                            .routing = r,
                            .h = &hf,
                            .topk_ids = &ids,
                            .topk_weights = &wts});
        if (c.skip) {  // a skipped routed slot: the ids are overwritten after the router
          std::vector<int32_t> idv(static_cast<size_t>(k));
          for (int64_t j = 0; j < k; ++j) idv[static_cast<size_t>(j)] = static_cast<int32_t>(j);
          idv[static_cast<size_t>(k / 2)] = -1;
          ids = ints(*be, idv).reshape({1, k});
        }
        const int64_t before = be->moe_fused_residual_calls();
        be->moe_residual({.x = &hf,
                          .topk_ids = &ids,
                          .topk_weights = &wts,
                          .experts = &w,
                          .shared_gate_up = &sgu,
                          .shared_down = &sd,
                          .residual = &res,
                          .norm_w = &nw,
                          .eps = 1e-6f});
        *fused_calls += be->moe_fused_residual_calls() - before;
        const Tensor d = be->download(res);
        out.insert(out.end(), d.f32(), d.f32() + d.numel());
      }
      return out;
    };
    int64_t calls_on = 0, calls_off = 0;
    const std::vector<float> on = run(1, &calls_on), off = run(0, &calls_off);
    int64_t differing = 0;
    for (size_t i = 0; i < on.size(); ++i) differing += on[i] != off[i];
    const bool ok = differing == 0 && calls_on == 3 && calls_off == 3;
    bad += !ok;
    std::printf(
        "[moe-op] shared_early_h%lld_i%lld_shared%lld%s steps=3 fused=%lld/%lld "
        "differing=%lld %s\n",
        static_cast<long long>(h), static_cast<long long>(in),
        static_cast<long long>(c.shared_mult), c.skip ? "_skip" : "",
        static_cast<long long>(calls_on), static_cast<long long>(calls_off),
        static_cast<long long>(differing), ok ? "PASS" : "FAIL");
  }
  cuda::set_moe_shared_early_override(-1);
  be->set_moe_fused(-1);
  EXPECT_EQ(bad, 0);
}

#else

TEST(CudaMoe, Skipped) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace di::testing
