#include <gtest/gtest.h>

#include "core/error.h"
#include "parallel/expert_placement.h"

namespace di::parallel {
namespace {

TEST(ExpertPlacement, RoundRobinSpreadsExpertsOverRanks) {
  const ExpertPlacement p = ExpertPlacement::round_robin(10, 4);  // 3 slots per rank, 2 empty
  EXPECT_EQ(p.slots_per_rank(), 3);
  EXPECT_EQ(p.num_slots(), 12);
  for (int32_t e = 0; e < 10; ++e) {
    ASSERT_EQ(p.num_replicas(e), 1);
    const int32_t s = p.replicas(e)[0];
    EXPECT_EQ(p.expert_at(s), e);
    EXPECT_EQ(p.rank_of_slot(s), e % 4);
    EXPECT_EQ(p.local_slot(s), e / 4);
    EXPECT_EQ(p.slot_on_rank(e, e % 4), s);
    EXPECT_EQ(p.slot_on_rank(e, (e + 1) % 4), kEmptySlot);
  }
  EXPECT_EQ(p.expert_at(2 * 3 + 2), kEmptySlot);
  EXPECT_EQ(p.expert_at(3 * 3 + 2), kEmptySlot);
  p.check_integrity();
}

TEST(ExpertPlacement, IndexesReplicasInSlotOrder) {
  // 2 ranks x 3 slots: expert 0 on both ranks.
  const ExpertPlacement p(4, 2, 3, {0, 1, 2, 3, 0, kEmptySlot});
  EXPECT_EQ(p.num_replicas(0), 2);
  EXPECT_EQ(p.replicas(0)[0], 0);
  EXPECT_EQ(p.replicas(0)[1], 4);
  EXPECT_EQ(p.slot_on_rank(0, 1), 4);
  EXPECT_EQ(p.num_replicas(3), 1);
}

TEST(ExpertPlacement, RejectsBrokenTables) {
  EXPECT_THROW(ExpertPlacement(3, 2, 2, {0, 1, 1, kEmptySlot}), Error);  // expert 2 missing
  EXPECT_THROW(ExpertPlacement(3, 2, 2, {0, 0, 1, 2}), Error);           // two 0s on rank 0
  EXPECT_THROW(ExpertPlacement(3, 2, 2, {0, 1, 2, 3}), Error);           // expert 3 of 3
  EXPECT_THROW(ExpertPlacement(3, 2, 2, {0, 1, 2}), Error);              // table too short
  EXPECT_NO_THROW(ExpertPlacement(3, 2, 2, {0, 1, 2, 0}));               // 0 on both ranks
}

TEST(ExpertPlacement, MoeLbIsMaxOverMean) {
  EXPECT_DOUBLE_EQ(moe_lb(std::vector<double>{1, 1, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(moe_lb(std::vector<double>{4, 0, 0, 0}), 4.0);
  EXPECT_DOUBLE_EQ(moe_lb(std::vector<int64_t>{3, 1}), 1.5);
  EXPECT_DOUBLE_EQ(moe_lb(std::vector<int64_t>{0, 0}), 1.0);
  // Expert 0 (load 6) split over both ranks: 3 + 2 vs 3 + 1 + 0.
  const ExpertPlacement p(4, 2, 3, {0, 1, 2, 3, 0, kEmptySlot});
  const std::vector<double> loads = expected_rank_loads(p, std::vector<int64_t>{6, 2, 0, 1});
  EXPECT_DOUBLE_EQ(loads[0], 5.0);
  EXPECT_DOUBLE_EQ(loads[1], 4.0);
}

}  // namespace
}  // namespace di::parallel
