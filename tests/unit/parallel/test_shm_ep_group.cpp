// ShmEpGroup (parallel/shm_ep_group.h): expert parallelism between rank threads through shared
// memory. N = 1, 2, 3 real threads each call their rank's hook with their own tokens (one rank
// with none, padding ids -1); every rank's output must equal the single-device
// Backend::moe_experts on the CPU backend (to fp32 rounding: the EP combine sums in j order,
// moe_experts in expert order), every rank must compute exactly the entries of the experts it
// owns, and an abort must release a rank waiting for a peer that never comes.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "parallel/ep_moe_plan.h"
#include "parallel/shm_ep_group.h"

namespace di::parallel {
namespace {

Tensor random_f32(const Shape& shape, std::mt19937& rng, float scale) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::uniform_real_distribution<float> d(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = d(rng);
  return t;
}

struct RankInput {
  Tensor x, ids, weights;
};

// T tokens, k distinct experts per token (or -1 padding with probability pad_prob).
RankInput make_input(int64_t t, int32_t e, int32_t k, int32_t h, float pad_prob,
                     std::mt19937& rng) {
  RankInput in;
  in.x = random_f32({t, h}, rng, 1.0f);
  in.ids = Tensor::empty({t, k}, DType::kI32);
  in.weights = random_f32({t, k}, rng, 1.0f);
  std::vector<int32_t> perm(static_cast<size_t>(e));
  std::bernoulli_distribution pad(pad_prob);
  for (int64_t i = 0; i < t; ++i) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int32_t j = 0; j < k; ++j) {
      in.ids.data<int32_t>()[i * k + j] = pad(rng) ? kNoExpert : perm[static_cast<size_t>(j)];
    }
  }
  return in;
}

// Single device: moe_experts with padding entries turned into weight-0 entries of expert 0.
Tensor reference(Backend& be, const RankInput& in, const ExpertWeights& w) {
  Tensor ids = Tensor::empty(in.ids.shape(), DType::kI32);
  Tensor wt = Tensor::empty(in.weights.shape(), DType::kF32);
  for (int64_t i = 0; i < in.ids.numel(); ++i) {
    const bool pad = in.ids.data<int32_t>()[i] == kNoExpert;
    ids.data<int32_t>()[i] = pad ? 0 : in.ids.data<int32_t>()[i];
    wt.f32()[i] = pad ? 0.0f : in.weights.f32()[i];
  }
  Tensor out = Tensor::empty(in.x.shape(), DType::kF32);
  be.moe_experts(in.x, ids, wt, w, out);
  return out;
}

double max_rel(const Tensor& ref, const Tensor& got) {
  double max_ref = 0.0, max_diff = 0.0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    max_ref = std::max(max_ref, static_cast<double>(std::fabs(ref.f32()[i])));
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(ref.f32()[i] - got.f32()[i])));
  }
  return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}

TEST(ShmEpGroup, RankThreadsEqualSingleDeviceMoeExperts) {
  const int32_t h = 24, inter = 12;
  for (int32_t e : {7, 8}) {
    for (int32_t k : {1, 2, 3}) {
      for (int32_t n : {1, 2, 3}) {
        std::mt19937 rng(static_cast<uint32_t>(1000 * e + 100 * k + n));
        ExpertWeights w;
        w.gate_up = random_f32({e, 2 * inter, h}, rng, 0.5f);
        w.down = random_f32({e, h, inter}, rng, 0.5f);
        ShmEpGroup group(n, e, k, h);
        const ExpertPlacement& placement = group.placement();
        // Three layers in a row (buffer reuse); token counts per rank vary per layer, the last
        // rank has none in the first layer, and a third of the entries are padding in layer 2.
        const int num_layers = 3;
        std::vector<std::vector<RankInput>> inputs(static_cast<size_t>(n));
        std::vector<std::vector<Tensor>> outputs(static_cast<size_t>(n));
        std::vector<int64_t> expected_rows(static_cast<size_t>(n), 0);
        const int64_t token_counts[] = {5, 17, 1, 0, 33};
        for (int32_t r = 0; r < n; ++r) {
          for (int l = 0; l < num_layers; ++l) {
            int64_t t = token_counts[(r + l) % 5];
            if (l == 0 && r == n - 1) t = 0;
            inputs[r].push_back(make_input(t, e, k, h, l == 2 ? 0.33f : 0.0f, rng));
            const RankInput& in = inputs[r].back();
            for (int64_t i = 0; i < in.ids.numel(); ++i) {
              const int32_t id = in.ids.data<int32_t>()[i];
              if (id != kNoExpert) ++expected_rows[id / placement.slots_per_rank()];
            }
          }
        }
        std::vector<std::thread> threads;
        std::vector<std::string> errors(static_cast<size_t>(n));
        for (int32_t r = 0; r < n; ++r) {
          threads.emplace_back([&, r] {
            try {
              auto be = make_cpu_backend();
              for (int l = 0; l < num_layers; ++l) {
                const RankInput& in = inputs[r][static_cast<size_t>(l)];
                Tensor out = Tensor::empty(in.x.shape(), DType::kF32);
                std::fill_n(out.f32(), out.numel(), 123.0f);  // every element must be written
                group.hook(r).run(*be, in.x, in.ids, in.weights, w, out);
                outputs[r].push_back(out);
              }
            } catch (const std::exception& ex) {
              errors[r] = ex.what();
            }
          });
        }
        for (auto& th : threads) th.join();
        auto be = make_cpu_backend();
        for (int32_t r = 0; r < n; ++r) {
          ASSERT_EQ(errors[r], "") << "rank " << r;
          ASSERT_EQ(outputs[r].size(), static_cast<size_t>(num_layers));
          for (int l = 0; l < num_layers; ++l) {
            const RankInput& in = inputs[r][static_cast<size_t>(l)];
            const Tensor ref = reference(*be, in, w);
            EXPECT_LE(max_rel(ref, outputs[r][static_cast<size_t>(l)]), 1e-6)
                << "E=" << e << " k=" << k << " N=" << n << " rank " << r << " layer " << l;
          }
          const ShmEpTotals tot = group.totals(r);
          EXPECT_EQ(tot.calls, num_layers);
          // Rank r computed exactly the (token, j) entries of the experts it owns.
          EXPECT_EQ(tot.rows_computed, expected_rows[static_cast<size_t>(r)]) << "rank " << r;
        }
      }
    }
  }
}

TEST(ShmEpGroup, OneRankComputesOnlyItsExperts) {
  // Ownership seen from the outside: rank 1 of 2 gets all-zero weights for the experts rank 0
  // owns, so any expert rank 1 computed for rank 0's range would show up as zero rows there.
  const int32_t e = 4, h = 8, inter = 4, k = 2;
  std::mt19937 rng(7);
  ExpertWeights w;
  w.gate_up = random_f32({e, 2 * inter, h}, rng, 0.5f);
  w.down = random_f32({e, h, inter}, rng, 0.5f);
  ExpertWeights w_rank1 = w;
  w_rank1.gate_up = Tensor::empty(w.gate_up.shape(), DType::kF32);
  w_rank1.down = Tensor::empty(w.down.shape(), DType::kF32);
  std::copy_n(w.gate_up.f32(), w.gate_up.numel(), w_rank1.gate_up.f32());
  std::copy_n(w.down.f32(), w.down.numel(), w_rank1.down.f32());
  const int64_t per_expert = 2 * inter * h;
  std::fill_n(w_rank1.gate_up.f32(), 2 * per_expert, 0.0f);  // experts 0 and 1: rank 0's
  ShmEpGroup group(2, e, k, h);
  ASSERT_EQ(group.placement().slots_per_rank(), 2);
  const RankInput in0 = make_input(9, e, k, h, 0.0f, rng);
  const RankInput in1 = make_input(4, e, k, h, 0.0f, rng);
  Tensor out0 = Tensor::empty(in0.x.shape(), DType::kF32);
  Tensor out1 = Tensor::empty(in1.x.shape(), DType::kF32);
  std::thread t1([&] {
    auto be = make_cpu_backend();
    group.hook(1).run(*be, in1.x, in1.ids, in1.weights, w_rank1, out1);
  });
  auto be = make_cpu_backend();
  group.hook(0).run(*be, in0.x, in0.ids, in0.weights, w, out0);
  t1.join();
  EXPECT_LE(max_rel(reference(*be, in0, w), out0), 1e-6);
  EXPECT_LE(max_rel(reference(*be, in1, w), out1), 1e-6);
}

TEST(ShmEpGroup, AbortReleasesAWaitingRankAndResetRecovers) {
  const int32_t e = 4, h = 8, inter = 4, k = 2;
  std::mt19937 rng(3);
  ExpertWeights w;
  w.gate_up = random_f32({e, 2 * inter, h}, rng, 0.5f);
  w.down = random_f32({e, h, inter}, rng, 0.5f);
  ShmEpGroup group(2, e, k, h);
  const RankInput in = make_input(3, e, k, h, 0.0f, rng);
  std::string error;
  std::thread waiter([&] {
    auto be = make_cpu_backend();
    Tensor out = Tensor::empty(in.x.shape(), DType::kF32);
    try {
      group.hook(0).run(*be, in.x, in.ids, in.weights, w, out);  // rank 1 never comes
    } catch (const Error& ex) {
      error = ex.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  group.abort("rank 1 failed its step");
  waiter.join();
  EXPECT_NE(error.find("rank 1 failed its step"), std::string::npos) << error;
  // Still aborted: a call throws at once.
  auto be = make_cpu_backend();
  Tensor out = Tensor::empty(in.x.shape(), DType::kF32);
  EXPECT_THROW(group.hook(1).run(*be, in.x, in.ids, in.weights, w, out), Error);
  // After reset both ranks exchange normally again.
  group.reset();
  Tensor out0 = Tensor::empty(in.x.shape(), DType::kF32);
  std::thread t0([&] {
    auto be0 = make_cpu_backend();
    group.hook(0).run(*be0, in.x, in.ids, in.weights, w, out0);
  });
  group.hook(1).run(*be, in.x, in.ids, in.weights, w, out);
  t0.join();
  const Tensor ref = reference(*be, in, w);
  EXPECT_LE(max_rel(ref, out0), 1e-6);
  EXPECT_LE(max_rel(ref, out), 1e-6);
}

}  // namespace
}  // namespace di::parallel
