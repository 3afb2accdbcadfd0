// The CPU backend's router (the reference the CUDA kernels are checked against bit for bit in
// tests/ops/test_cuda_moe.cpp) against an independent formulation of each routing rule as HF
// transformers writes it: scores in float (softmax or sigmoid), + bias for the choice, group
// limit, top-k on the choice, weights = the unbiased scores, renormalised, scaled. The CPU op
// selects a softmax without bias or groups on the logits and sums the softmax's denominator in
// the warp order (moe_softmax_denominator); the ids must be equal and the weights agree to float
// rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace di {
namespace {

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> w;
};

// One token, float arithmetic like HF's routers.
Routed reference_route(const std::vector<float>& l, const MoeRoutingParams& p,
                       const std::vector<float>& bias) {
  const int e = p.num_experts;
  std::vector<float> score(e), choice(e);
  if (p.scoring == MoeRoutingParams::Scoring::kSoftmax) {
    const float mx = *std::max_element(l.begin(), l.end());
    float sum = 0.0f;
    for (int i = 0; i < e; ++i) sum += std::exp(l[i] - mx);
    for (int i = 0; i < e; ++i) score[i] = std::exp(l[i] - mx) / sum;
  } else {
    for (int i = 0; i < e; ++i) score[i] = 1.0f / (1.0f + std::exp(-l[i]));
  }
  for (int i = 0; i < e; ++i) choice[i] = score[i] + (bias.empty() ? 0.0f : bias[i]);
  if (p.num_groups > 1 && p.topk_groups < p.num_groups) {
    const int per = e / p.num_groups;
    std::vector<float> gs(p.num_groups);
    for (int g = 0; g < p.num_groups; ++g) {
      std::vector<float> c(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(c.rbegin(), c.rend());
      gs[g] = p.group_score == MoeRoutingParams::GroupScore::kMax ? c[0] : c[0] + c[1];
    }
    std::vector<int> go(p.num_groups);
    std::iota(go.begin(), go.end(), 0);
    std::stable_sort(go.begin(), go.end(), [&](int a, int b) { return gs[a] > gs[b]; });
    for (int g = p.topk_groups; g < p.num_groups; ++g)
      for (int i = go[g] * per; i < (go[g] + 1) * per; ++i) choice[i] = 0.0f;
  }
  std::vector<int32_t> order(e);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return choice[a] > choice[b]; });
  Routed r;
  float sum = 0.0f;
  for (int j = 0; j < p.top_k; ++j) sum += score[order[j]];
  for (int j = 0; j < p.top_k; ++j) {
    r.ids.push_back(order[j]);
    const float w = score[order[j]];
    r.w.push_back((p.renormalize ? w / (sum + p.renorm_eps) : w) * p.scaling);
  }
  return r;
}

TEST(MoeRoute, CpuMatchesReferenceFormulas) {
  auto be = make_cpu_backend();
  struct Case {
    const char* name;
    MoeRoutingParams p;
    bool bias;
  };
  auto make = [](MoeRoutingParams::Scoring s, int e, int k, int g, int tg, bool renorm,
                 float scaling) {
    MoeRoutingParams p;
    p.scoring = s;
    p.num_experts = e;
    p.top_k = k;
    p.num_groups = g;
    p.topk_groups = tg;
    p.renormalize = renorm;
    p.renorm_eps = renorm ? 1e-20f : 0.0f;
    p.scaling = scaling;
    return p;
  };
  const auto kSoft = MoeRoutingParams::Scoring::kSoftmax;
  const auto kSig = MoeRoutingParams::Scoring::kSigmoid;
  MoeRoutingParams v3 = make(kSig, 256, 8, 8, 4, true, 2.5f);
  v3.group_score = MoeRoutingParams::GroupScore::kTopTwoSum;
  const std::vector<Case> cases = {
      {"v2lite (on logits, full denominator)", make(kSoft, 64, 6, 1, 1, false, 1.0f), false},
      {"v2 160 experts", make(kSoft, 160, 6, 1, 1, false, 16.0f), false},
      {"qwen3 (on logits, renormalised)", make(kSoft, 128, 8, 1, 1, true, 1.0f), false},
      {"v2 group limited (general softmax)", make(kSoft, 64, 6, 8, 3, false, 1.0f), false},
      {"v3 sigmoid + bias + groups", v3, true},
      {"odd E", make(kSoft, 33, 3, 1, 1, false, 1.0f), false},
      {"512 experts", make(kSoft, 512, 32, 1, 1, false, 1.0f), false},
  };
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  for (const Case& c : cases) {
    const int64_t t = 17, e = c.p.num_experts, k = c.p.top_k;
    const char* off = std::getenv("DEEPINFER_MOE_ROUTE_ON_LOGITS");  // the A/B switch
    EXPECT_EQ(moe_route_on_logits(c.p), !(off && std::string(off) == "0") &&
                                            c.p.scoring == MoeRoutingParams::Scoring::kSoftmax &&
                                            !c.bias && c.p.num_groups == 1)
        << c.name;
    Tensor logits = Tensor::empty({t, e}, DType::kF32);
    for (int64_t i = 0; i < logits.numel(); ++i) logits.f32()[i] = dist(rng);
    std::vector<float> bias;
    Tensor bias_t = Tensor::empty({e}, DType::kF32);
    if (c.bias) {
      for (int64_t i = 0; i < e; ++i) bias.push_back(bias_t.f32()[i] = 0.1f * dist(rng));
    }
    MoeRoutingParams p = c.p;
    p.correction_bias = c.bias ? &bias_t : nullptr;
    Tensor ids = Tensor::empty({t, k}, DType::kI32), w = Tensor::empty({t, k}, DType::kF32);
    be->moe_route(logits, p, ids, w);
    for (int64_t r = 0; r < t; ++r) {
      const std::vector<float> row(logits.f32() + r * e, logits.f32() + (r + 1) * e);
      const Routed ref = reference_route(row, p, bias);
      for (int64_t j = 0; j < k; ++j) {
        ASSERT_EQ(ids.data<int32_t>()[r * k + j], ref.ids[j]) << c.name << " token " << r;
        EXPECT_NEAR(w.f32()[r * k + j], ref.w[j], 2e-6f * std::max(1.0f, std::fabs(ref.w[j])))
            << c.name << " token " << r << " slot " << j;
      }
    }
  }
}

// The denominator's fixed order (lane sums, then the butterfly) is a sum of the same terms: it
// agrees with the plain sum to double rounding, for E below, at and above one lane per expert.
TEST(MoeRoute, SoftmaxDenominatorIsTheSum) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-6.0f, 6.0f);
  for (int e : {1, 7, 32, 33, 64, 128, 160, 512}) {
    std::vector<float> l(e);
    for (float& v : l) v = dist(rng);
    const float mx = *std::max_element(l.begin(), l.end());
    double plain = 0.0;
    for (float v : l) plain += std::exp(static_cast<double>(v - mx));
    const double tree = moe_softmax_denominator(l.data(), e, mx);
    EXPECT_NEAR(tree, plain, 1e-13 * plain) << "E " << e;
    EXPECT_GE(tree, 1.0) << "E " << e;  // the max's term is exp(0) = 1
  }
  const float one = 0.0f;
  EXPECT_EQ(moe_softmax_denominator(&one, 1, 0.0f), 1.0);
}

}  // namespace
}  // namespace di
