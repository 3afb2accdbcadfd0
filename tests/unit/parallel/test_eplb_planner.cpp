#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "core/error.h"
#include "parallel/eplb_planner.h"
#include "parallel/eplb_sim.h"
#include "parallel/synthetic_routing.h"

namespace di::parallel {
namespace {

double planned_lb(const std::vector<int64_t>& load, int32_t ranks, int32_t slots) {
  return moe_lb(expected_rank_loads(plan_placement(load, {ranks, slots}), load));
}

TEST(EplbPlanner, UniformLoadIsPerfectlyBalanced) {
  const std::vector<int64_t> load(64, 100);
  EXPECT_DOUBLE_EQ(planned_lb(load, 8, 8), 1.0);
  // 8 spare slots: replicas of 8 experts (half load each), still exactly balanced.
  EXPECT_DOUBLE_EQ(planned_lb(load, 8, 9), 1.0);
  const ExpertPlacement p = plan_placement(load, {8, 9});
  int32_t replicated = 0;
  for (int32_t e = 0; e < 64; ++e) replicated += p.num_replicas(e) == 2;
  EXPECT_EQ(replicated, 8);
}

TEST(EplbPlanner, HotExpertGetsTheReplicas) {
  std::vector<int64_t> load(17, 10);
  load[5] = 100;
  // 4 ranks x 5 slots: 3 spare slots, all to expert 5 (100/2, 100/3 and 100/4 all exceed 10).
  const std::vector<int32_t> reps = plan_replica_counts(load, 20, 4);
  for (int32_t e = 0; e < 17; ++e) EXPECT_EQ(reps[e], e == 5 ? 4 : 1) << "expert " << e;
  // Expert 5 on every rank (25 each) and four experts of 10 beside it: 65 everywhere.
  const ExpertPlacement p = plan_placement(load, {4, 5});
  for (int32_t q = 0; q < 4; ++q) EXPECT_NE(p.slot_on_rank(5, q), kEmptySlot);
  EXPECT_DOUBLE_EQ(moe_lb(expected_rank_loads(p, load)), 1.0);
  // Without the spare slots the hot expert's rank carries 100 + 3 x 10 against a mean of 65.
  const ExpertPlacement no_spares =
      plan_placement(std::vector<int64_t>(load.begin(), load.end() - 1), {4, 4});
  EXPECT_DOUBLE_EQ(
      moe_lb(expected_rank_loads(no_spares, std::vector<int64_t>(load.begin(), load.end() - 1))),
      130.0 / 62.5);
}

TEST(EplbPlanner, ReplicasFollowLoadPerReplicaAndAreCappedAtRanks) {
  // 2 ranks: expert 0 may have at most 2 replicas, so the other spares go to 1 then 2.
  const std::vector<int64_t> load = {1000, 90, 80, 10};
  EXPECT_EQ(plan_replica_counts(load, 7, 2), (std::vector<int32_t>{2, 2, 2, 1}));
  // 300/2 = 150 > 100 takes the first spare, 150 > 100 the second (300/3 = 100 ties with 100:
  // the lower id wins the third), unless capped.
  EXPECT_EQ(plan_replica_counts(std::vector<int64_t>{300, 100}, 3, 4),
            (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(plan_replica_counts(std::vector<int64_t>{300, 100}, 4, 4),
            (std::vector<int32_t>{3, 1}));
  EXPECT_EQ(plan_replica_counts(std::vector<int64_t>{300, 100}, 5, 4),
            (std::vector<int32_t>{4, 1}));
  EXPECT_EQ(plan_replica_counts(std::vector<int64_t>{300, 100}, 5, 3),
            (std::vector<int32_t>{3, 2}));
  // Ties go to the lower expert id.
  EXPECT_EQ(plan_replica_counts(std::vector<int64_t>{5, 5, 5}, 4, 3),
            (std::vector<int32_t>{2, 1, 1}));
  EXPECT_THROW(plan_replica_counts(std::vector<int64_t>{1, 2, 3}, 2, 2), Error);
  EXPECT_THROW(plan_replica_counts(std::vector<int64_t>{1, -2}, 2, 2), Error);
  EXPECT_THROW(plan_placement(std::vector<int64_t>(9, 1), {2, 4}), Error);  // 9 experts, 8 slots
}

TEST(EplbPlanner, MakesRoomWhenOnlyHoldersHaveFreeSlots) {
  // 3 ranks x 3 slots. Expert 0 (100) fills rank 0's load; six experts of 30 fill ranks 1 and 2;
  // expert 7 has 2 replicas of 20, placed last: the first goes to rank 0, the only rank with room,
  // and the second finds only rank 0 again, so a 30 moves from a full rank to rank 0.
  std::vector<int64_t> load = {100, 30, 30, 30, 30, 30, 30, 40};
  std::vector<int32_t> reps = {1, 1, 1, 1, 1, 1, 1, 2};
  const ExpertPlacement p = pack_replicas(load, reps, {3, 3, 0});
  p.check_integrity();
  EXPECT_EQ(p.num_replicas(7), 2);
  // Rank 0 must hold expert 0 and two more distinct experts: 100 + 20 + 30 is the best possible.
  const std::vector<double> rank_load = expected_rank_loads(p, load);
  EXPECT_DOUBLE_EQ(*std::max_element(rank_load.begin(), rank_load.end()), 150.0);
  EXPECT_THROW(pack_replicas(load, std::vector<int32_t>{1, 1, 1, 1, 1, 1, 1, 4}, {3, 3}), Error);
  EXPECT_THROW(pack_replicas(load, std::vector<int32_t>{2, 2, 1, 1, 1, 1, 1, 2}, {3, 3}), Error);
}

TEST(EplbPlanner, PropertiesOverRandomLoads) {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 300; ++trial) {
    const int32_t ranks = 1 + static_cast<int32_t>(rng() % 9);
    const int32_t experts = 1 + static_cast<int32_t>(rng() % 70);
    const int32_t slots = (experts + ranks - 1) / ranks + static_cast<int32_t>(rng() % 4);
    std::vector<int64_t> load(experts);
    const int kind = trial % 4;
    for (int32_t e = 0; e < experts; ++e) {
      if (kind == 0) load[e] = static_cast<int64_t>(rng() % 1000);
      if (kind == 1) load[e] = rng() % 3 == 0 ? 0 : static_cast<int64_t>(rng() % 10);
      if (kind == 2) load[e] = static_cast<int64_t>(1e6 / std::pow(e + 1.0, 1.5));
      if (kind == 3) load[e] = e == 0 ? 1'000'000'000'000 : static_cast<int64_t>(rng() % 5);
    }
    const ExpertPlacement p = plan_placement(load, {ranks, slots});
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << experts << " experts, "
                                      << ranks << " ranks x " << slots << " slots");
    p.check_integrity();  // every expert placed, no duplicate replica on a rank
    ASSERT_EQ(p.num_ranks(), ranks);
    ASSERT_EQ(p.slots_per_rank(), slots);
    // All slots are used unless every expert already sits on every rank.
    int32_t used = 0;
    for (int32_t s = 0; s < p.num_slots(); ++s) used += p.expert_at(s) != kEmptySlot;
    EXPECT_EQ(used, std::min(p.num_slots(), experts * ranks));
    // Replica counts are the ones step 1 chose.
    const std::vector<int32_t> reps = plan_replica_counts(load, ranks * slots, ranks);
    for (int32_t e = 0; e < experts; ++e) ASSERT_EQ(p.num_replicas(e), reps[e]);
    // Deterministic.
    EXPECT_TRUE(plan_placement(load, {ranks, slots}) == p);
    // Refinement never makes the plan worse than plain LPT.
    const ExpertPlacement lpt = plan_placement(load, {ranks, slots, 0});
    lpt.check_integrity();
    EXPECT_LE(moe_lb(expected_rank_loads(p, load)), moe_lb(expected_rank_loads(lpt, load)) + 1e-12);
  }
}

TEST(ZipfRouting, IsDeterministicDistinctAndSkewed) {
  const ZipfRouting z(64, 6, 1.2, 9);
  const std::vector<int32_t> a = z.route(2000, 1);
  EXPECT_EQ(a, z.route(2000, 1));
  EXPECT_NE(a, z.route(2000, 2));
  for (size_t t = 0; t < 2000; ++t) {
    std::vector<int32_t> row(a.begin() + t * 6, a.begin() + (t + 1) * 6);
    std::sort(row.begin(), row.end());
    ASSERT_EQ(std::adjacent_find(row.begin(), row.end()), row.end()) << "token " << t;
  }
  const std::vector<int64_t> load = count_expert_load(a, 64);
  EXPECT_EQ(std::accumulate(load.begin(), load.end(), int64_t{0}), 12000);
  const int32_t hottest = static_cast<int32_t>(
      std::max_element(z.popularity().begin(), z.popularity().end()) - z.popularity().begin());
  EXPECT_EQ(std::max_element(load.begin(), load.end()) - load.begin(), hottest);
  // Steep skew exercises the draw-from-the-rest path: still k distinct experts per token.
  const ZipfRouting steep(16, 8, 6.0, 3);
  const std::vector<int32_t> b = steep.route(200, 5);
  for (size_t t = 0; t < 200; ++t) {
    std::vector<int32_t> row(b.begin() + t * 8, b.begin() + (t + 1) * 8);
    std::sort(row.begin(), row.end());
    ASSERT_EQ(std::adjacent_find(row.begin(), row.end()), row.end()) << "token " << t;
  }
}

// The acceptance test of issue #8: a skewed trace, static EP vs EPLB. Zipf s = 1.2 puts ~12% of
// all entries on the hottest expert (top-8 of 256: at most 1/8 = one whole rank's mean load), so
// static round-robin EP runs 1.4-2.4x the mean on its busiest rank, depending on which experts
// share that rank. EPLB plans on one 8192-token trace and is measured on a fresh one; what remains
// is sampling noise (~8k entries per rank: 1.1% standard deviation, max of 8 ranks about +2-3%)
// and the rounding of replica splits, so after <= 1.06 holds with margin (measured <= 1.033).
TEST(EplbPlanner, ZipfTraceImprovesMoeLb) {
  struct Case {
    EplbSimOptions o;
    double before_min;       // every layer
    double before_mean_min;  // mean over layers
    double after_max;        // every layer
  };
  std::vector<Case> cases;
  {
    EplbSimOptions o;  // DeepSeek-V3-like: 256 experts top-8 on 8 ranks, 1 redundant per rank
    cases.push_back({o, 1.3, 1.5, 1.06});
  }
  {
    EplbSimOptions o;  // DeepSeek-V2-Lite-like: 64 experts top-6 on 8 ranks, 1 redundant per rank
    o.num_experts = 64;
    o.top_k = 6;
    cases.push_back({o, 1.3, 1.5, 1.06});
  }
  for (const Case& c : cases) {
    const auto layers = simulate_eplb(c.o);
    ASSERT_EQ(static_cast<int32_t>(layers.size()), c.o.num_layers);
    double sum_before = 0.0;
    for (size_t l = 0; l < layers.size(); ++l) {
      SCOPED_TRACE(::testing::Message() << c.o.num_experts << " experts, layer " << l);
      EXPECT_GE(layers[l].moe_lb_before, c.before_min);
      EXPECT_LE(layers[l].moe_lb_after, c.after_max);
      EXPECT_GE(layers[l].moe_lb_after, 1.0);
      sum_before += layers[l].moe_lb_before;
    }
    EXPECT_GE(sum_before / static_cast<double>(layers.size()), c.before_mean_min);
  }
}

}  // namespace
}  // namespace di::parallel
