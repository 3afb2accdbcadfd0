#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "parallel/eplb_controller.h"
#include "parallel/synthetic_routing.h"

namespace di::parallel {
namespace {

// Applies a migration to a simulated weight table: weights[slot] = the expert whose weights the
// slot holds. Unmoved slots keep their weights; moved slots copy from the move's source slot as it
// was before the flip (sources are read from the old table, as staging buffers allow).
std::vector<int32_t> apply_migration(const ExpertPlacement& current, const MigrationPlan& plan,
                                     int32_t layer) {
  std::vector<int32_t> weights(current.slot_experts().begin(), current.slot_experts().end());
  const std::vector<int32_t> before = weights;
  for (const ExpertMove& m : plan.moves) {
    if (m.layer_idx != layer) continue;
    EXPECT_EQ(before[m.src_slot], m.expert_idx) << "source slot does not hold the expert";
    weights[m.dst_slot] = before[m.src_slot];
  }
  return weights;
}

TEST(EplbConfig, DefaultsFromTheIssue) {
  const EplbConfig prefill = EplbConfig::prefill();
  EXPECT_EQ(prefill.redundant_per_rank, 4);
  EXPECT_EQ(prefill.window_steps, 100);
  EXPECT_EQ(prefill.period_steps, 1000);
  const EplbConfig decode = EplbConfig::decode();
  EXPECT_EQ(decode.redundant_per_rank, 1);
  EXPECT_EQ(decode.window_steps, 1000);
  EXPECT_EQ(decode.period_steps, 10000);
  prefill.validate();
  decode.validate();
  EplbConfig bad = decode;
  bad.steps_per_bucket = 7;
  EXPECT_THROW(bad.validate(), Error);
  bad = decode;
  bad.period_steps = 0;
  EXPECT_THROW(bad.validate(), Error);
}

TEST(EplbMigration, AlignKeepsStayingExpertsInPlaceAndMovesOnlyArrivals) {
  // 2 ranks x 3 slots. Rank 0: {0, 1, 2} -> {2, 3, 0}; rank 1: {3, 4, 5} -> {4, 5, 1}.
  const ExpertPlacement cur(6, 2, 3, {0, 1, 2, 3, 4, 5});
  const ExpertPlacement next(6, 2, 3, {2, 3, 0, 4, 5, 1});
  const ExpertPlacement aligned = align_to(cur, next);
  EXPECT_EQ(std::vector<int32_t>(aligned.slot_experts().begin(), aligned.slot_experts().end()),
            (std::vector<int32_t>{0, 3, 2, 1, 4, 5}));
  const MigrationPlan plan = plan_migration({cur}, {aligned});
  ASSERT_EQ(plan.moves.size(), 2u);
  EXPECT_EQ(plan.moves[0].expert_idx, 3);
  EXPECT_EQ(plan.moves[0].src_slot, 3);
  EXPECT_EQ(plan.moves[0].dst_slot, 1);
  EXPECT_EQ(plan.moves[1].expert_idx, 1);
  EXPECT_EQ(plan.moves[1].src_slot, 1);
  EXPECT_EQ(plan.moves[1].dst_slot, 3);
  EXPECT_EQ(plan.max_incoming_per_rank, 1);
  // Unaligned input is refused: expert 0 would change slot on rank 0 without moving.
  EXPECT_THROW(plan_migration({cur}, {next}), Error);
}

TEST(EplbMigration, RandomReplansReachTheNewPlacementWithMinimalMoves) {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 100; ++trial) {
    const int32_t ranks = 2 + static_cast<int32_t>(rng() % 7);
    const int32_t experts = ranks + static_cast<int32_t>(rng() % 40);
    const int32_t slots = (experts + ranks - 1) / ranks + static_cast<int32_t>(rng() % 3);
    std::vector<int64_t> a(experts), b(experts);
    for (auto& x : a) x = static_cast<int64_t>(rng() % 1000);
    for (auto& x : b) x = static_cast<int64_t>(rng() % 1000);
    const ExpertPlacement cur = plan_placement(a, {ranks, slots});
    const ExpertPlacement next = align_to(cur, plan_placement(b, {ranks, slots}));
    const MigrationPlan plan = plan_migration({cur}, {next});
    EXPECT_EQ(apply_migration(cur, plan, 0),
              std::vector<int32_t>(next.slot_experts().begin(), next.slot_experts().end()));
    // Moves into a rank = experts it gains; none for experts it already had.
    int32_t gained = 0;
    for (int32_t q = 0; q < ranks; ++q) {
      for (int32_t s = 0; s < slots; ++s) {
        const int32_t e = next.expert_at(q * slots + s);
        if (e != kEmptySlot && cur.slot_on_rank(e, q) == kEmptySlot) ++gained;
      }
    }
    EXPECT_EQ(static_cast<int32_t>(plan.moves.size()), gained) << "trial " << trial;
  }
}

TEST(EplbController, RebalancesEveryPeriodAfterCommit) {
  EplbConfig config{1, 20, 50, 5, 0.02};
  const int32_t layers = 2, experts = 32, ranks = 4, top_k = 4;
  EplbController c(config, layers, experts, ranks);
  EXPECT_EQ(c.slots_per_rank(), 9);
  for (const ExpertPlacement& p : c.placements()) p.check_integrity();
  const ZipfRouting skewed(experts, top_k, 1.5, 1);
  int plans = 0;
  std::vector<double> first_lb;
  for (int step = 1; step <= 200; ++step) {
    for (int32_t l = 0; l < layers; ++l) c.record(l, skewed.route(64, step * 7 + l));
    std::optional<Rebalance> r = c.end_step();
    if (step % 50 != 0) {
      ASSERT_FALSE(r.has_value()) << "step " << step;
      continue;
    }
    if (!r) continue;  // nothing left to gain after the first plan
    ++plans;
    EXPECT_EQ(r->step, step);
    EXPECT_TRUE(c.has_pending());
    for (int32_t l = 0; l < layers; ++l) {
      r->placements[l].check_integrity();
      if (r->changed[l]) {
        EXPECT_LE(r->moe_lb_planned[l], r->moe_lb_current[l] - config.min_gain);
      }
    }
    for (int32_t l = 0; l < layers; ++l) {
      EXPECT_EQ(apply_migration(c.placements()[l], r->migration, l),
                std::vector<int32_t>(r->placements[l].slot_experts().begin(),
                                     r->placements[l].slot_experts().end()));
    }
    if (first_lb.empty()) first_lb = r->moe_lb_current;
    c.commit(*r);
    EXPECT_FALSE(c.has_pending());
  }
  ASSERT_GE(plans, 1);
  // The skew is stationary: after the first rebalance the window's moe_lb is close to 1.
  for (int32_t l = 0; l < layers; ++l) {
    EXPECT_GT(first_lb[l], 1.3) << "layer " << l;
    const double now = moe_lb(expected_rank_loads(c.placements()[l], c.window().loads(l)));
    EXPECT_LT(now, 1.1) << "layer " << l;
  }
}

TEST(EplbController, WaitsForCommitAndSkipsSmallGains) {
  EplbConfig config{1, 10, 10, 1, 0.02};
  EplbController c(config, 1, 8, 2);
  // Uniform routing: the initial (uniform-plan) placement is already balanced; no plan.
  std::vector<int32_t> uniform;
  for (int32_t e = 0; e < 8; ++e) uniform.push_back(e);
  for (int step = 0; step < 10; ++step) {
    c.record(0, uniform);
    EXPECT_FALSE(c.end_step().has_value());
  }
  // Skewed routing: a plan at the next period, then none while it is pending.
  const std::vector<int32_t> hot(40, 3);
  for (int step = 0; step < 10; ++step) {
    c.record(0, hot);
    c.record(0, uniform);
    const auto r = c.end_step();
    EXPECT_EQ(r.has_value(), step == 9);
  }
  EXPECT_TRUE(c.has_pending());
  for (int step = 0; step < 10; ++step) {
    c.record(0, hot);
    EXPECT_FALSE(c.end_step().has_value());
  }
  c.abandon();
  EXPECT_FALSE(c.has_pending());
  EXPECT_TRUE(c.plan_now().has_value());
}

}  // namespace
}  // namespace di::parallel
