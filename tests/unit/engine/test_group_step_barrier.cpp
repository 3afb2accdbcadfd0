// GroupStepBarrier (engine/group_step_barrier.h): the per-iteration barrier of a DP group's
// ranks, driven by plain threads. Every rank of a round gets the same decision; the first arrival
// wakes the others; stop wins over work; an abandoned barrier never blocks; a failed step resets
// the transport at the next round, when every rank is at the barrier.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "engine/group_step_barrier.h"

namespace di {
namespace {

// Counts abort/reset calls; checks that reset happens only while every rank is at the barrier.
class CountingTransport final : public DpExpertTransport {
 public:
  int32_t num_ranks() const override { return 3; }
  void bind_thread(int32_t) override {}
  void attach(int32_t, Backend&, Model&, int32_t, int32_t) override {}
  void abort(const std::string&) override { ++aborts; }
  void reset() override { ++resets; }
  std::atomic<int> aborts{0}, resets{0};
};

// Runs one round on n threads; returns each rank's decision.
std::vector<GroupDecision> round(GroupStepBarrier& b, const std::vector<bool>& work,
                                 const std::vector<bool>& stop) {
  std::vector<GroupDecision> out(work.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < work.size(); ++r) {
    threads.emplace_back([&, r] { out[r] = b.arrive(static_cast<int32_t>(r), work[r], stop[r]); });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(GroupStepBarrier, EveryRankGetsTheSameDecision) {
  std::mutex mu;
  std::multiset<int32_t> woken;
  GroupStepBarrier b(
      3,
      [&](int32_t r) {
        std::lock_guard lock(mu);
        woken.insert(r);
      },
      nullptr);
  for (const auto& d : round(b, {false, false, false}, {false, false, false})) {
    EXPECT_FALSE(d.step);
    EXPECT_FALSE(d.stop);
  }
  // One rank's work makes every rank step (the others pad).
  for (const auto& d : round(b, {false, true, false}, {false, false, false})) {
    EXPECT_TRUE(d.step);
    EXPECT_FALSE(d.stop);
  }
  // Stop wins over work.
  for (const auto& d : round(b, {true, true, false}, {false, false, true})) {
    EXPECT_FALSE(d.step);
    EXPECT_TRUE(d.stop);
  }
  EXPECT_EQ(b.rounds(), 3u);
  EXPECT_EQ(b.step_rounds(), 1u);
  // The first arrival of the rounds after an idle one (rounds 1 and 2) woke the two others;
  // after the step round every rank comes back by itself.
  EXPECT_EQ(woken.size(), 4u);
}

TEST(GroupStepBarrier, FirstArrivalWakesTheOthers) {
  // Ranks 1 and 2 only arrive when woken (as idle EngineLoops do).
  std::atomic<bool> wake1{false}, wake2{false};
  GroupStepBarrier b(
      3, [&](int32_t r) { (r == 1 ? wake1 : wake2) = true; }, nullptr);
  GroupDecision d1, d2;
  std::thread t1([&] {
    while (!wake1) std::this_thread::yield();
    d1 = b.arrive(1, false, false);
  });
  std::thread t2([&] {
    while (!wake2) std::this_thread::yield();
    d2 = b.arrive(2, false, false);
  });
  const GroupDecision d0 = b.arrive(0, true, false);
  t1.join();
  t2.join();
  EXPECT_TRUE(d0.step && d1.step && d2.step);
}

TEST(GroupStepBarrier, RequestStopAndAbandon) {
  std::atomic<int> wakes{0};
  GroupStepBarrier b(
      2, [&](int32_t) { ++wakes; }, nullptr);
  b.request_stop();
  EXPECT_EQ(wakes.load(), 2);
  for (const auto& d : round(b, {true, true}, {false, false})) EXPECT_TRUE(d.stop);
  // Abandoned: a lone rank is not kept waiting for a rank that will never exist.
  GroupStepBarrier lonely(
      3, [](int32_t) {}, nullptr);
  std::thread waiter([&] { EXPECT_TRUE(lonely.arrive(0, true, false).stop); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  lonely.abandon();
  waiter.join();
  EXPECT_TRUE(lonely.arrive(1, false, false).stop);
}

TEST(GroupStepBarrier, FailedStepAbortsTheTransportAndResetsItAtTheNextRound) {
  CountingTransport t;
  GroupStepBarrier b(
      3, [](int32_t) {}, &t);
  round(b, {true, false, false}, {false, false, false});
  EXPECT_EQ(t.resets.load(), 0);
  b.step_failed(1, "boom");
  EXPECT_EQ(t.aborts.load(), 1);
  EXPECT_EQ(t.resets.load(), 0);  // not while ranks may still be inside the exchange
  round(b, {false, false, false}, {false, false, false});
  EXPECT_EQ(t.resets.load(), 1);
  round(b, {false, false, false}, {false, false, false});
  EXPECT_EQ(t.resets.load(), 1);
}

// Runs one agree_decode round on n threads; returns each rank's answer.
std::vector<DecodeShape> agree(GroupStepBarrier& b, const std::vector<DecodeShape>& mine) {
  std::vector<DecodeShape> out(mine.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < mine.size(); ++r) {
    threads.emplace_back([&, r] { out[r] = b.agree_decode(static_cast<int32_t>(r), mine[r]); });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(GroupStepBarrier, AgreeDecodeGivesEveryRankTheGroupShape) {
  GroupStepBarrier b(
      3, [](int32_t) {}, nullptr);
  // Plain decode steps of 3 and 5 sequences and a padding step: max rows, max blocks.
  for (const DecodeShape& d : agree(b, {{3, 7}, {5, 2}, {0, 0}})) {
    EXPECT_EQ(d.rows, 5);
    EXPECT_EQ(d.max_blocks, 7);
  }
  // One rank prefills: nobody takes the decode exchange.
  for (const DecodeShape& d : agree(b, {{3, 7}, {-1, 40}, {0, 0}})) {
    EXPECT_EQ(d.rows, -1);
    EXPECT_EQ(d.max_blocks, 0);
  }
  // Every rank padding (rows 0) is still a decode-shaped step; rounds repeat cleanly.
  for (int i = 0; i < 20; ++i) {
    for (const DecodeShape& d : agree(b, {{0, 0}, {0, 0}, {i, i}})) {
      EXPECT_EQ(d.rows, i);
      EXPECT_EQ(d.max_blocks, i);
    }
  }
}

TEST(GroupStepBarrier, AgreeDecodeIsReleasedByAFailedStep) {
  CountingTransport transport;
  GroupStepBarrier b(
      3, [](int32_t) {}, &transport);
  round(b, {true, true, true}, {false, false, false});
  // Ranks 0 and 1 wait in agree_decode; rank 2 fails its step before reaching it.
  std::vector<DecodeShape> out(2);
  std::thread t0([&] { out[0] = b.agree_decode(0, {1, 1}); });
  std::thread t1([&] { out[1] = b.agree_decode(1, {2, 1}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  b.step_failed(2, "boom");
  t0.join();
  t1.join();
  EXPECT_EQ(out[0].rows, -1);
  EXPECT_EQ(out[1].rows, -1);
  EXPECT_TRUE(out[0].failed && out[1].failed);
  EXPECT_EQ(transport.aborts.load(), 1);
  // A late arrival of the failed round is not blocked either.
  const DecodeShape late = b.agree_decode(2, {1, 1});
  EXPECT_EQ(late.rows, -1);
  EXPECT_TRUE(late.failed);
  // The next round resets the transport, and agreement works again.
  round(b, {true, false, false}, {false, false, false});
  EXPECT_EQ(transport.resets.load(), 1);
  for (const DecodeShape& d : agree(b, {{1, 3}, {0, 0}, {0, 0}})) EXPECT_EQ(d.rows, 1);
}

// The EPLB phase of a group step: prefill when any rank has a prompt token, on every rank, with a
// plain decode shape (rows >= 0) or not; never marked failed.
TEST(GroupStepBarrier, AgreeDecodeAgreesOnThePrefillPhase) {
  GroupStepBarrier b(
      3, [](int32_t) {}, nullptr);
  for (int i = 0; i < 10; ++i) {
    round(b, {true, false, false}, {false, false, false});
    const int32_t who = i % 4;  // 3: nobody prefills
    std::vector<DecodeShape> mine(3, DecodeShape{.rows = 1, .max_blocks = 1});
    if (who < 3) mine[static_cast<size_t>(who)] = DecodeShape{.rows = -1, .prefill = true};
    for (const DecodeShape& d : agree(b, mine)) {
      EXPECT_EQ(d.prefill, who < 3) << i;
      EXPECT_EQ(d.rows, who < 3 ? -1 : 1) << i;
      EXPECT_FALSE(d.failed);
    }
  }
}

// EPLB step counts: passed through when every rank brings the same, kEplbStepsDiffer to every
// rank when one differs (decode or not).
TEST(GroupStepBarrier, AgreeDecodeFlagsRanksAtDifferentEplbSteps) {
  GroupStepBarrier b(
      3, [](int32_t) {}, nullptr);
  for (int32_t rows : {1, -1}) {
    round(b, {true, false, false}, {false, false, false});
    std::vector<DecodeShape> mine(3, DecodeShape{.rows = rows, .eplb_steps = 7});
    for (const DecodeShape& d : agree(b, mine)) EXPECT_EQ(d.eplb_steps, 7);
    round(b, {true, false, false}, {false, false, false});
    mine[1].eplb_steps = 8;
    for (const DecodeShape& d : agree(b, mine)) {
      EXPECT_EQ(d.eplb_steps, DecodeShape::kEplbStepsDiffer);
    }
  }
}

}  // namespace
}  // namespace di
