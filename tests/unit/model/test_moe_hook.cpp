// MoeBlock's expert hook (model/layers.h, issue #8): when set, the block routes as usual and
// hands (x, topk_ids, topk_weights, experts, out) to the hook instead of Backend::moe_experts.
// The CPU hook below simulates what parallel/cuda/ep_moe_hook.h does across N ranks: entries go to
// the rank owning their expert (contiguous ranges), each rank runs moe_experts ONCE on its rows
// with top-1 and weight 1, and the token's rank combines sum_j w[t, j] * y[t, j] in j order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <vector>

#include "backend/backend.h"
#include "model/layers.h"

namespace di {
namespace {

Tensor filled(const Shape& shape, uint32_t seed, float scale) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  uint32_t s = seed * 2654435761u + 1u;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 1664525u + 1013904223u;
    t.f32()[i] = scale * (static_cast<float>(s >> 8) / static_cast<float>(1u << 24) - 0.5f);
  }
  return t;
}

class SimulatedEpHook final : public MoeExpertHook {
 public:
  explicit SimulatedEpHook(int32_t num_ranks) : num_ranks_(num_ranks) {}
  void run(Backend& be, const Tensor& x, const Tensor& ids, const Tensor& w,
           const ExpertWeights& experts, Tensor& out) override {
    ++calls;
    const int64_t t = x.size(0), h = x.size(1), k = ids.size(1);
    const auto e = static_cast<int32_t>(experts.gate_up.size(0));
    const int32_t spr = (e + num_ranks_ - 1) / num_ranks_;
    std::vector<float> y(static_cast<size_t>(t * k * h), 0.0f);  // y[t, j]
    for (int32_t r = 0; r < num_ranks_; ++r) {
      std::vector<int64_t> entries;  // (t, j) served by rank r, in (t, j) order
      for (int64_t i = 0; i < t * k; ++i)
        if (ids.data<int32_t>()[i] / spr == r) entries.push_back(i);
      const auto m = static_cast<int64_t>(entries.size());
      if (m == 0) continue;
      Tensor rows = Tensor::empty({m, h}, DType::kF32), rid = Tensor::empty({m, 1}, DType::kI32);
      Tensor ones = Tensor::empty({m, 1}, DType::kF32), res = Tensor::empty({m, h}, DType::kF32);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t c = 0; c < h; ++c) rows.f32()[i * h + c] = x.f32()[entries[i] / k * h + c];
        rid.data<int32_t>()[i] = ids.data<int32_t>()[entries[i]];
        ones.f32()[i] = 1.0f;
      }
      be.moe_experts(rows, rid, ones, experts, res);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t c = 0; c < h; ++c) y[entries[i] * h + c] = res.f32()[i * h + c];
    }
    for (int64_t tt = 0; tt < t; ++tt) {
      for (int64_t c = 0; c < h; ++c) {
        float acc = 0.0f;
        for (int64_t j = 0; j < k; ++j) acc += w.f32()[tt * k + j] * y[(tt * k + j) * h + c];
        out.f32()[tt * h + c] = acc;
      }
    }
  }
  int calls = 0;

 private:
  int32_t num_ranks_;
};

// A softmax-routed block of e random experts (hidden h, intermediate inter, top-k k,
// renormalised): the same weights for the same sizes.
MoeBlock random_block(int64_t e, int64_t h, int64_t inter, int64_t k) {
  MoeBlock b;
  b.gate = filled({e, h}, 1, 1.0f);
  b.experts.gate_up = filled({e, 2 * inter, h}, 2, 0.5f);
  b.experts.down = filled({e, h, inter}, 3, 0.5f);
  b.routing.num_experts = static_cast<int32_t>(e);
  b.routing.top_k = static_cast<int32_t>(k);
  b.routing.renormalize = true;
  return b;
}

TEST(MoeExpertHook, SimulatedEpEqualsMoeExperts) {
  auto be = make_cpu_backend();
  const int64_t e = 6, h = 16, inter = 8, k = 2;
  for (int64_t t : {1, 7, 33}) {
    for (int32_t ranks : {1, 2, 3, 4}) {
      MoeBlock b = random_block(e, h, inter, k);
      const Tensor x = filled({t, h}, 4 + static_cast<uint32_t>(t), 1.0f);
      Tensor plain = Tensor::empty({t, h}, DType::kF32), ep = Tensor::empty({t, h}, DType::kF32);
      b.forward(*be, x, plain);
      SimulatedEpHook hook(ranks);
      b.expert_hook = &hook;
      b.forward(*be, x, ep);
      EXPECT_EQ(hook.calls, 1);
      double worst = 0.0;
      for (int64_t i = 0; i < t * h; ++i)
        worst = std::max(worst, std::fabs(static_cast<double>(plain.f32()[i] - ep.f32()[i])));
      EXPECT_LT(worst, 1e-5) << "t=" << t << " ranks=" << ranks;
    }
  }
}

// With EPLB attached too (a DP group with EPLB): the block counts the logical ids, maps them to
// physical slots, and the hook gets the physical ids and the physical weights (its ranks own
// slots, not experts). 4 experts in 6 slots, experts 0 and 1 with a second replica: the output
// equals plain moe_experts on the logical experts, the counts are the logical routing, and the
// hook saw ids of replica slots.
TEST(MoeExpertHook, WithEplbGetsPhysicalSlots) {
  auto be = make_cpu_backend();
  const int64_t e = 4, h = 8, inter = 4, k = 2, t = 9;
  MoeBlock b = random_block(e, h, inter, k);
  const Tensor x = filled({t, h}, 5, 1.0f);
  Tensor plain = Tensor::empty({t, h}, DType::kF32), got = Tensor::empty({t, h}, DType::kF32);
  b.forward(*be, x, plain);

  const std::vector<int32_t> slot_expert{0, 1, 2, 3, 0, 1};  // 2 ranks x 3 slots
  MoeEplbState eplb;
  eplb.physical.gate_up = Tensor::empty({6, 2 * inter, h}, DType::kF32);
  eplb.physical.down = Tensor::empty({6, h, inter}, DType::kF32);
  for (int32_t s = 0; s < 6; ++s) {
    be->copy_rows(b.experts.gate_up, slot_expert[static_cast<size_t>(s)], eplb.physical.gate_up, s,
                  1);
    be->copy_rows(b.experts.down, slot_expert[static_cast<size_t>(s)], eplb.physical.down, s, 1);
  }
  eplb.replica_indptr = Tensor::empty({e + 1}, DType::kI32);
  eplb.replica_slots = Tensor::empty({6}, DType::kI32);
  const int32_t indptr[] = {0, 2, 4, 5, 6}, slots[] = {0, 4, 1, 5, 2, 3};
  std::copy(std::begin(indptr), std::end(indptr), eplb.replica_indptr.data<int32_t>());
  std::copy(std::begin(slots), std::end(slots), eplb.replica_slots.data<int32_t>());
  Tensor counts = Tensor::zeros({e}, DType::kI32);
  eplb.counts = &counts;
  std::vector<int32_t> trace;
  eplb.trace = &trace;

  class RecordingHook final : public MoeExpertHook {
   public:
    void run(Backend& be, const Tensor& x, const Tensor& ids, const Tensor& w,
             const ExpertWeights& experts, Tensor& out) override {
      rows = experts.gate_up.size(0);
      for (int64_t i = 0; i < ids.numel(); ++i) max_id = std::max(max_id, ids.data<int32_t>()[i]);
      inner.run(be, x, ids, w, experts, out);
    }
    SimulatedEpHook inner{2};
    int64_t rows = 0;
    int32_t max_id = -1;
  } hook;
  b.experts = ExpertWeights{};  // as EplbRuntime leaves it: the slots hold every expert
  b.eplb = &eplb;
  b.expert_hook = &hook;
  b.forward(*be, x, got);
  EXPECT_EQ(hook.inner.calls, 1);
  EXPECT_EQ(hook.rows, 6) << "the hook must get the physical weights";
  EXPECT_GE(hook.max_id, 4) << "no token went to a replica slot";
  for (int64_t i = 0; i < t * h; ++i) EXPECT_NEAR(plain.f32()[i], got.f32()[i], 1e-5) << i;
  std::vector<int32_t> recount(static_cast<size_t>(e), 0);
  for (int32_t id : trace) ++recount[static_cast<size_t>(id)];
  EXPECT_EQ(static_cast<int64_t>(trace.size()), t * k);
  for (int64_t x_idx = 0; x_idx < e; ++x_idx) {
    EXPECT_EQ(counts.data<int32_t>()[x_idx], recount[static_cast<size_t>(x_idx)]);
  }
}

}  // namespace
}  // namespace di
