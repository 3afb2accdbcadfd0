#include <gtest/gtest.h>

#include <deque>
#include <random>

#include "core/error.h"
#include "parallel/expert_load.h"

namespace di::parallel {
namespace {

TEST(ExpertLoadWindow, CountsOnlyCompletedSteps) {
  ExpertLoadWindow w(2, 4, 3);
  w.record(0, std::vector<int32_t>{0, 1, 1, -1});  // -1 (padding) is skipped
  w.record(1, std::vector<int32_t>{3});
  EXPECT_EQ(w.loads(0)[1], 0);  // the step is still open
  w.end_step();
  w.check_integrity();
  EXPECT_EQ(std::vector<int64_t>(w.loads(0).begin(), w.loads(0).end()),
            (std::vector<int64_t>{1, 2, 0, 0}));
  EXPECT_EQ(w.loads(1)[3], 1);
  EXPECT_EQ(w.steps_in_window(), 1);
}

TEST(ExpertLoadWindow, OldStepsLeaveTheWindow) {
  ExpertLoadWindow w(1, 2, 3);
  for (int step = 0; step < 5; ++step) {
    w.add(0, std::vector<int64_t>{step, 10 * step});
    w.end_step();
    w.check_integrity();
  }
  // Steps 2, 3, 4 remain.
  EXPECT_EQ(w.loads(0)[0], 2 + 3 + 4);
  EXPECT_EQ(w.loads(0)[1], 20 + 30 + 40);
  EXPECT_EQ(w.steps_in_window(), 3);
  EXPECT_EQ(w.steps_recorded(), 5);
  w.reset();
  w.check_integrity();
  EXPECT_EQ(w.loads(0)[1], 0);
  EXPECT_EQ(w.steps_in_window(), 0);
}

TEST(ExpertLoadWindow, BucketsMatchASlidingSumAtBucketBoundaries) {
  // Window 12 steps in 4-step buckets vs a plain deque of per-step counts.
  const int32_t experts = 5;
  ExpertLoadWindow w(1, experts, 12, 4);
  std::deque<std::vector<int64_t>> steps;
  std::mt19937 rng(1);
  for (int step = 1; step <= 50; ++step) {
    std::vector<int32_t> ids(rng() % 20);
    std::vector<int64_t> counts(experts, 0);
    for (int32_t& e : ids) {
      e = static_cast<int32_t>(rng() % experts);
      ++counts[e];
    }
    w.record(0, ids);
    w.end_step();
    steps.push_back(counts);
    if (steps.size() > 12) steps.pop_front();
    w.check_integrity();
    if (step % 4 != 0) continue;
    for (int32_t e = 0; e < experts; ++e) {
      int64_t expected = 0;
      for (const auto& c : steps) expected += c[e];
      ASSERT_EQ(w.loads(0)[e], expected) << "step " << step << " expert " << e;
    }
  }
}

TEST(ExpertLoadWindow, RejectsBadInput) {
  EXPECT_THROW(ExpertLoadWindow(1, 4, 10, 3), Error);  // window not a multiple of the bucket
  ExpertLoadWindow w(1, 4, 2);
  EXPECT_THROW(w.record(1, std::vector<int32_t>{0}), Error);
  EXPECT_THROW(w.record(0, std::vector<int32_t>{4}), Error);
  EXPECT_THROW(w.add(0, std::vector<int64_t>{1, 2, 3}), Error);
  EXPECT_THROW(w.add(0, std::vector<int64_t>{1, -2, 3, 0}), Error);
}

}  // namespace
}  // namespace di::parallel
