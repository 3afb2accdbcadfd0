// Arrival schedules and the session-ordered request queue.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <thread>

#include "bench/arrivals.h"
#include "bench/session_queue.h"

namespace di::bench {
namespace {

TEST(Arrivals, PoissonMeanRateAndExponentialGaps) {
  const double rate = 20.0;
  const int64_t n = 20001;
  const auto t = arrival_offsets(n, rate, /*seed=*/42);
  ASSERT_EQ(t.size(), static_cast<size_t>(n));
  EXPECT_EQ(t[0], 0.0);
  for (size_t i = 1; i < t.size(); ++i) ASSERT_GE(t[i], t[i - 1]);
  // n-1 gaps of mean 1/rate: the sample mean is within ~4 standard errors (1/rate/sqrt(n)).
  const double mean_gap = t.back() / static_cast<double>(n - 1);
  EXPECT_NEAR(mean_gap, 1.0 / rate, 4.0 / rate / std::sqrt(n - 1.0));
  // Exponential: coefficient of variation 1, and P(gap > mean) = e^-1.
  double ss = 0;
  int64_t above = 0;
  for (size_t i = 1; i < t.size(); ++i) {
    const double g = t[i] - t[i - 1];
    ss += (g - mean_gap) * (g - mean_gap);
    above += g > 1.0 / rate ? 1 : 0;
  }
  EXPECT_NEAR(std::sqrt(ss / (n - 1)) / mean_gap, 1.0, 0.05);
  EXPECT_NEAR(static_cast<double>(above) / (n - 1), std::exp(-1.0), 0.02);
  // Seeded: same seed, same schedule; another seed, another schedule.
  EXPECT_EQ(arrival_offsets(100, rate, 42), arrival_offsets(100, rate, 42));
  EXPECT_NE(arrival_offsets(100, rate, 42), arrival_offsets(100, rate, 43));
}

TEST(Arrivals, BurstinessKeepsTheMeanAndChangesTheSpread) {
  const int64_t n = 20001;
  for (double b : {0.25, 4.0}) {
    const auto t = arrival_offsets(n, 10.0, 7, b);
    const double mean_gap = t.back() / (n - 1);
    EXPECT_NEAR(mean_gap, 0.1, 0.1 * 8 / std::sqrt(b * (n - 1)));
    double ss = 0;
    for (size_t i = 1; i < t.size(); ++i) {
      const double g = t[i] - t[i - 1];
      ss += (g - mean_gap) * (g - mean_gap);
    }
    EXPECT_NEAR(std::sqrt(ss / (n - 1)) / mean_gap, 1.0 / std::sqrt(b), 0.1 / std::sqrt(b));
  }
}

TEST(Arrivals, InfiniteOrZeroRateReleasesEverythingAtOnce) {
  for (double rate : {0.0, std::numeric_limits<double>::infinity()}) {
    for (double t : arrival_offsets(10, rate, 1)) EXPECT_EQ(t, 0.0);
  }
}

TEST(SessionQueue, TurnsOfASessionWaitForThePreviousTurn) {
  // Sessions: 0 has turns at indices 0,1,2; 1 at 3,4; 2 at 5.
  SessionQueue q({0, 0, 0, 1, 1, 2});
  EXPECT_EQ(q.try_take(), 0u);
  EXPECT_EQ(q.try_take(), 3u);  // 1 waits for 0
  EXPECT_EQ(q.try_take(), 5u);
  EXPECT_EQ(q.try_take(), std::nullopt);  // everything left waits on an in-flight turn
  q.complete(3);
  EXPECT_EQ(q.try_take(), 4u);
  q.complete(0);
  EXPECT_EQ(q.try_take(), 1u);
  EXPECT_EQ(q.try_take(), std::nullopt);
  q.complete(1);
  EXPECT_EQ(q.try_take(), 2u);
  EXPECT_EQ(q.num_taken(), 6u);
  EXPECT_THROW(q.complete(2 + 100), std::exception);
}

TEST(SessionQueue, ConcurrentWorkersNeverOverlapTurnsOfOneSession) {
  const int kSessions = 8, kTurns = 25;
  std::vector<int32_t> session_of;
  for (int s = 0; s < kSessions; ++s) {
    for (int t = 0; t < kTurns; ++t) session_of.push_back(s);
  }
  SessionQueue q(session_of);
  std::vector<std::atomic<int>> in_flight(kSessions);
  std::vector<std::atomic<int>> next_turn(kSessions);
  std::atomic<bool> bad{false};
  auto worker = [&] {
    while (auto idx = q.take()) {
      const int s = session_of[*idx];
      const int turn = static_cast<int>(*idx) % kTurns;
      if (in_flight[s].fetch_add(1) != 0) bad = true;
      if (next_turn[s].load() != turn) bad = true;
      std::this_thread::yield();
      next_turn[s].fetch_add(1);
      in_flight[s].fetch_sub(1);
      q.complete(*idx);
    }
  };
  std::vector<std::thread> ts;
  for (int i = 0; i < 6; ++i) ts.emplace_back(worker);
  for (auto& t : ts) t.join();
  EXPECT_FALSE(bad.load());
  EXPECT_EQ(q.num_completed(), session_of.size());
  for (int s = 0; s < kSessions; ++s) EXPECT_EQ(next_turn[s].load(), kTurns);
}

}  // namespace
}  // namespace di::bench
