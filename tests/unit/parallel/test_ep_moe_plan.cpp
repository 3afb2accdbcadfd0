// Host planning of EP inside the model (parallel/ep_moe_plan.h, used by cuda/ep_moe_hook.h).
#include <gtest/gtest.h>

#include "core/error.h"
#include "parallel/ep_layout.h"
#include "parallel/ep_moe_plan.h"

namespace di::parallel {
namespace {

TEST(EpMoePlan, ContiguousPlacementGivesEachRankARange) {
  const ExpertPlacement p = contiguous_placement(64, 2);  // V2-Lite on 2 GPUs
  EXPECT_EQ(p.slots_per_rank(), 32);
  for (int32_t e = 0; e < 64; ++e) {
    ASSERT_EQ(p.num_replicas(e), 1);
    EXPECT_EQ(p.replicas(e)[0], e);
    EXPECT_EQ(p.rank_of_slot(e), e / 32);
  }
  p.check_integrity();
  const ExpertPlacement one = contiguous_placement(8, 1);
  EXPECT_EQ(one.slots_per_rank(), 8);
  for (int32_t e = 0; e < 8; ++e) EXPECT_EQ(one.rank_of_slot(one.replicas(e)[0]), 0);
}

TEST(EpMoePlan, ContiguousPlacementLeavesTrailingSlotsEmpty) {
  const ExpertPlacement p = contiguous_placement(10, 4);  // 3 per rank: 0-2, 3-5, 6-8, 9
  EXPECT_EQ(p.slots_per_rank(), 3);
  EXPECT_EQ(p.expert_at(9), 9);
  EXPECT_EQ(p.expert_at(10), kEmptySlot);
  EXPECT_EQ(p.expert_at(11), kEmptySlot);
  EXPECT_EQ(p.slot_on_rank(4, 1), 4);
  EXPECT_EQ(p.slot_on_rank(4, 0), kEmptySlot);
  p.check_integrity();
  EXPECT_THROW(contiguous_placement(2, 3), Error);
  EXPECT_THROW(contiguous_placement(0, 1), Error);
}

TEST(EpMoePlan, ExpandedRowExperts) {
  const ExpertPlacement p = contiguous_placement(10, 4);
  // Rank 1 holds experts 3, 4, 5 in local slots 0, 1, 2: 2 rows of 3, none of 4, 3 of 5.
  const std::vector<int32_t> indptr{0, 2, 2, 5};
  EXPECT_EQ(expanded_row_experts(p, 1, indptr), (std::vector<int32_t>{3, 3, 5, 5, 5}));
  EXPECT_TRUE(expanded_row_experts(p, 0, std::vector<int32_t>{0, 0, 0, 0}).empty());
  // Rank 3's slots 1 and 2 are empty: rows there are a bug.
  EXPECT_THROW(expanded_row_experts(p, 3, std::vector<int32_t>{0, 1, 2, 2}), Error);
  EXPECT_THROW(expanded_row_experts(p, 1, std::vector<int32_t>{0, 2}), Error);  // wrong size
  EXPECT_THROW(expanded_row_experts(p, 4, indptr), Error);                     // no such rank
}

// The plan the hook runs on: with the contiguous placement, every entry lands on the rank owning
// its expert, and the receiver's expanded rows carry exactly the routed experts.
TEST(EpMoePlan, DispatchAndReceiveFollowTheContiguousRanges) {
  const int32_t e = 8, n = 2, k = 2;
  const ExpertPlacement p = contiguous_placement(e, n);
  const std::vector<int32_t> ids{0, 5, 4, 7, 1, 2};  // 3 tokens of rank 0
  const DispatchPlan d = plan_dispatch(p, 0, ids, k);
  // Token 0 -> both ranks; token 1 -> rank 1 only; token 2 -> rank 0 only.
  EXPECT_EQ(d.send_count(0), 2);
  EXPECT_EQ(d.send_count(1), 2);
  // Rank 0 receives its own 2 rows (as if rank 1 sent nothing) and expands them.
  const std::vector<int32_t> recv_indptr{0, 2, 2};
  std::vector<int32_t> local(d.send_local_slot.begin(),
                             d.send_local_slot.begin() + static_cast<ptrdiff_t>(2 * k));
  const ReceivePlan r = plan_receive(0, n, p.slots_per_rank(), k, recv_indptr, local);
  std::vector<int32_t> rows = expanded_row_experts(p, 0, r.slot_indptr);
  EXPECT_EQ(rows, (std::vector<int32_t>{0, 1, 2}));
}

TEST(EpMoePlan, RequestsOfRank) {
  EXPECT_EQ(requests_of_rank(4, 0, 2), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(requests_of_rank(4, 1, 2), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(requests_of_rank(4, 0, 1), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_TRUE(requests_of_rank(2, 3, 4).empty());
  EXPECT_THROW(requests_of_rank(4, 2, 2), Error);
}

}  // namespace
}  // namespace di::parallel
