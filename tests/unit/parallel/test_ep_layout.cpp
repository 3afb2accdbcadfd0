#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "core/error.h"
#include "parallel/ep_exchange_ref.h"
#include "parallel/ep_layout.h"

namespace di::parallel {
namespace {

// A random valid placement: every expert once on a random rank, the remaining slots filled with
// random experts the rank lacks (or left empty when empty_fraction says so).
ExpertPlacement random_placement(int32_t num_experts, int32_t num_ranks, int32_t slots_per_rank,
                                 std::mt19937& rng, double empty_fraction = 0.0) {
  std::vector<int32_t> table(num_ranks * slots_per_rank, kEmptySlot);
  std::vector<int32_t> free_slots(table.size());
  for (size_t i = 0; i < free_slots.size(); ++i) free_slots[i] = static_cast<int32_t>(i);
  std::shuffle(free_slots.begin(), free_slots.end(), rng);
  for (int32_t e = 0; e < num_experts; ++e) table[free_slots[e]] = e;
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  for (size_t i = num_experts; i < free_slots.size(); ++i) {
    const int32_t s = free_slots[i];
    const int32_t q = s / slots_per_rank;
    if (coin(rng) < empty_fraction) continue;
    std::vector<int32_t> candidates;
    for (int32_t e = 0; e < num_experts; ++e) {
      if (std::find(table.begin() + q * slots_per_rank, table.begin() + (q + 1) * slots_per_rank,
                    e) == table.begin() + (q + 1) * slots_per_rank) {
        candidates.push_back(e);
      }
    }
    if (!candidates.empty()) table[s] = candidates[rng() % candidates.size()];
  }
  return ExpertPlacement(num_experts, num_ranks, slots_per_rank, table);
}

// Routing with distinct experts per token, some entries dropped (kNoExpert) when drop > 0.
RankBatch random_batch(int32_t num_tokens, int32_t top_k, int32_t num_experts, int32_t hidden,
                       std::mt19937& rng, double drop = 0.0) {
  RankBatch b;
  std::uniform_real_distribution<float> val(-2.0f, 2.0f);
  std::uniform_real_distribution<float> wt(0.0f, 1.0f);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  for (int32_t i = 0; i < num_tokens * hidden; ++i) b.x.push_back(val(rng));
  std::vector<int32_t> experts(num_experts);
  for (int32_t e = 0; e < num_experts; ++e) experts[e] = e;
  for (int32_t t = 0; t < num_tokens; ++t) {
    std::shuffle(experts.begin(), experts.end(), rng);
    for (int32_t j = 0; j < top_k; ++j) {
      b.topk_ids.push_back(coin(rng) < drop ? kNoExpert : experts[j]);
      b.topk_weights.push_back(wt(rng));
    }
  }
  return b;
}

void identity_expert(int32_t, std::span<const float> in, std::span<float> out, int32_t) {
  std::copy(in.begin(), in.end(), out.begin());
}

// Expert e computes y = x * (1 + e / 8) + e, so a row served by the wrong expert changes the sum.
void distinct_expert(int32_t e, std::span<const float> in, std::span<float> out, int32_t) {
  const float scale = 1.0f + static_cast<float>(e) / 8.0f;
  for (size_t i = 0; i < in.size(); ++i) out[i] = in[i] * scale + static_cast<float>(e);
}

RankBatch concat(std::span<const RankBatch> batches) {
  RankBatch all;
  for (const RankBatch& b : batches) {
    all.x.insert(all.x.end(), b.x.begin(), b.x.end());
    all.topk_ids.insert(all.topk_ids.end(), b.topk_ids.begin(), b.topk_ids.end());
    all.topk_weights.insert(all.topk_weights.end(), b.topk_weights.begin(), b.topk_weights.end());
  }
  return all;
}

TEST(EpLayout, HandMadePlan) {
  // 2 ranks x 2 slots: rank 0 holds experts {0, 1}, rank 1 holds {2, 0}.
  const ExpertPlacement p(3, 2, 2, {0, 1, 2, 0});
  // Rank 1's three tokens, top-2: (0, 2), (1, kNoExpert), (0, 1).
  const std::vector<int32_t> ids = {0, 2, 1, kNoExpert, 0, 1};
  const DispatchPlan plan = plan_dispatch(p, 1, ids, 2);
  check_dispatch_plan(plan, p, ids);
  // Expert 0 has replicas at slots 0 and 3; sender 1 starts at replica 1 % 2 = 1 (slot 3).
  EXPECT_EQ(plan.entry_slot, (std::vector<int32_t>{3, 2, 1, kEmptySlot, 0, 1}));
  // Rank 0 gets tokens 1 and 2; rank 1 gets token 0 (both its entries).
  EXPECT_EQ(plan.send_indptr, (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(plan.send_token_idx, (std::vector<int32_t>{1, 2, 0}));
  EXPECT_EQ(plan.send_local_slot, (std::vector<int32_t>{1, kEmptySlot, 0, 1, 1, 0}));
  EXPECT_EQ(plan.combine_indptr, (std::vector<int32_t>{0, 3, 5}));
  EXPECT_EQ(plan.entry_return_idx, (std::vector<int32_t>{3, 4, 0, -1, 1, 2}));

  // Rank 0 receives nothing from rank 0 and these two rows from rank 1.
  const std::vector<int32_t> recv_indptr = {0, 0, 2};
  const std::vector<int32_t> meta(plan.send_local_slot.begin(), plan.send_local_slot.begin() + 4);
  const ReceivePlan rp = plan_receive(0, 2, 2, 2, recv_indptr, meta);
  check_receive_plan(rp, meta);
  EXPECT_EQ(rp.slot_indptr, (std::vector<int32_t>{0, 1, 3}));  // slot 0: 1 row, slot 1: 2 rows
  EXPECT_EQ(rp.expand_src_row, (std::vector<int32_t>{1, 0, 1}));
  EXPECT_EQ(rp.return_src, (std::vector<int32_t>{1, 0, 2}));  // (row0,j0) (row1,j0) (row1,j1)
  EXPECT_EQ(rp.return_indptr, (std::vector<int32_t>{0, 0, 3}));
}

TEST(EpLayout, SpreadsReplicasEvenlyAndStaggersSenders) {
  // Expert 0 on all three ranks; 300 entries from each sender.
  const ExpertPlacement p(3, 3, 2, {0, 1, 0, 2, 0, kEmptySlot});
  const std::vector<int32_t> ids(300, 0);
  for (int32_t r = 0; r < 3; ++r) {
    const DispatchPlan plan = plan_dispatch(p, r, ids, 1);
    check_dispatch_plan(plan, p, ids);
    EXPECT_EQ(plan.entry_slot[0], p.replicas(0)[r]) << "sender " << r << " starts at replica r";
    for (int32_t q = 0; q < 3; ++q) EXPECT_EQ(plan.send_count(q), 100);
  }
  // 4 entries from each of 3 senders: the extra entry lands on a different replica per sender.
  std::vector<int64_t> slot_load(6, 0);
  for (int32_t r = 0; r < 3; ++r) {
    add_slot_load(plan_dispatch(p, r, std::vector<int32_t>(4, 0), 1), slot_load);
  }
  EXPECT_EQ(slot_load, (std::vector<int64_t>{4, 0, 4, 0, 4, 0}));
}

TEST(EpLayout, DispatchThenCombineWithIdentityExpertsIsExact) {
  std::mt19937 rng(7);
  const int32_t hidden = 5;
  for (int32_t num_ranks : {1, 2, 3, 8}) {
    for (int32_t top_k : {1, 2, 6}) {
      const int32_t num_experts = 16;
      const int32_t slots = (num_experts + num_ranks - 1) / num_ranks + 1;
      const ExpertPlacement p = random_placement(num_experts, num_ranks, slots, rng);
      std::vector<RankBatch> batches;
      for (int32_t r = 0; r < num_ranks; ++r) {
        // Odd sizes, and one rank with no tokens at all.
        const int32_t tokens = r == 1 ? 0 : 13 + 7 * r;
        batches.push_back(random_batch(tokens, top_k, num_experts, hidden, rng, 0.1));
      }
      EpLayerTrace trace;
      const auto out = run_ep_moe_reference(p, batches, top_k, hidden, identity_expert, &trace);
      for (int32_t r = 0; r < num_ranks; ++r) {
        check_dispatch_plan(trace.dispatch[r], p, batches[r].topk_ids);
        check_receive_plan(trace.receive[r], trace.recv_local_slot[r]);
        // Identity experts: out[t] = sum_j w[t,j] * x[t], summed in j order.
        const RankBatch& b = batches[r];
        for (size_t t = 0; t < b.x.size() / hidden; ++t) {
          for (int32_t h = 0; h < hidden; ++h) {
            float expected = 0.0f;
            for (int32_t j = 0; j < top_k; ++j) {
              if (b.topk_ids[t * top_k + j] == kNoExpert) continue;
              expected += b.topk_weights[t * top_k + j] * b.x[t * hidden + h];
            }
            ASSERT_EQ(out[r][t * hidden + h], expected)
                << "ranks " << num_ranks << " top_k " << top_k << " rank " << r << " token " << t;
          }
        }
      }
    }
  }
}

TEST(EpLayout, MatchesSingleDeviceBitForBitWithDistinctExperts) {
  std::mt19937 rng(11);
  const int32_t hidden = 8, top_k = 4, num_experts = 24, num_ranks = 4;
  for (int trial = 0; trial < 20; ++trial) {
    const int32_t slots = num_experts / num_ranks + static_cast<int32_t>(rng() % 4);
    const ExpertPlacement p =
        random_placement(num_experts, num_ranks, slots, rng, trial % 2 == 0 ? 0.5 : 0.0);
    std::vector<RankBatch> batches;
    for (int32_t r = 0; r < num_ranks; ++r) {
      batches.push_back(
          random_batch(static_cast<int32_t>(rng() % 40), top_k, num_experts, hidden, rng, 0.05));
    }
    const auto out = run_ep_moe_reference(p, batches, top_k, hidden, distinct_expert);
    // The same tokens on one device, in one batch.
    const std::vector<float> single =
        run_moe_reference(concat(batches), top_k, hidden, distinct_expert);
    std::vector<float> joined;
    for (const auto& o : out) joined.insert(joined.end(), o.begin(), o.end());
    ASSERT_EQ(joined, single) << "trial " << trial;
  }
}

TEST(EpLayout, CountsAndOffsetsAgreeAcrossRanks) {
  std::mt19937 rng(3);
  const int32_t num_ranks = 5, top_k = 3, num_experts = 20, hidden = 1;
  const ExpertPlacement p = random_placement(num_experts, num_ranks, 6, rng);
  std::vector<RankBatch> batches;
  for (int32_t r = 0; r < num_ranks; ++r) {
    batches.push_back(random_batch(50, top_k, num_experts, hidden, rng));
  }
  EpLayerTrace trace;
  run_ep_moe_reference(p, batches, top_k, hidden, identity_expert, &trace);
  int64_t total_sent = 0, total_served = 0;
  for (int32_t q = 0; q < num_ranks; ++q) {
    const ReceivePlan& rp = trace.receive[q];
    for (int32_t r = 0; r < num_ranks; ++r) {
      const DispatchPlan& dp = trace.dispatch[r];
      EXPECT_EQ(rp.recv_indptr[r + 1] - rp.recv_indptr[r], dp.send_count(q));
      EXPECT_EQ(rp.return_indptr[r + 1] - rp.return_indptr[r],
                dp.combine_indptr[q + 1] - dp.combine_indptr[q]);
    }
    // Every served entry belongs to a slot of this rank holding an expert.
    for (int32_t s = 0; s < p.slots_per_rank(); ++s) {
      if (rp.slot_indptr[s + 1] > rp.slot_indptr[s]) {
        EXPECT_NE(p.expert_at(q * p.slots_per_rank() + s), kEmptySlot);
      }
    }
    total_served += rp.num_entries();
  }
  for (const DispatchPlan& dp : trace.dispatch) total_sent += dp.num_entries_sent();
  EXPECT_EQ(total_sent, num_ranks * 50 * top_k);
  EXPECT_EQ(total_served, total_sent);
}

TEST(EpLayout, ChecksCatchCorruptPlans) {
  std::mt19937 rng(5);
  const ExpertPlacement p = random_placement(8, 2, 5, rng);
  const RankBatch b = random_batch(10, 2, 8, 1, rng);
  const DispatchPlan good = plan_dispatch(p, 0, b.topk_ids, 2);
  check_dispatch_plan(good, p, b.topk_ids);

  DispatchPlan wrong_slot = good;  // an entry sent to a slot holding another expert
  for (int32_t s = 0; s < p.num_slots(); ++s) {
    if (p.expert_at(s) != b.topk_ids[0]) {
      wrong_slot.entry_slot[0] = s;
      break;
    }
  }
  EXPECT_THROW(check_dispatch_plan(wrong_slot, p, b.topk_ids), Error);

  DispatchPlan bad_offsets = good;
  std::swap(bad_offsets.entry_return_idx[0], bad_offsets.entry_return_idx[1]);
  EXPECT_THROW(check_dispatch_plan(bad_offsets, p, b.topk_ids), Error);

  DispatchPlan bad_count = good;
  bad_count.send_indptr[1] += 1;
  EXPECT_THROW(check_dispatch_plan(bad_count, p, b.topk_ids), Error);

  EXPECT_THROW(plan_dispatch(p, 2, b.topk_ids, 2), Error);                  // no rank 2
  EXPECT_THROW(plan_dispatch(p, 0, std::vector<int32_t>{0, 8}, 2), Error);  // expert 8 of 8
  EXPECT_THROW(
      plan_receive(0, 2, 5, 2, std::vector<int32_t>{0, 1, 1}, std::vector<int32_t>{5, kEmptySlot}),
      Error);  // slot 5 of 5
}

}  // namespace
}  // namespace di::parallel
