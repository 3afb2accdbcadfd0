// GroupLoadSum (engine/group_load_sum.h): the in-process all-reduce of EPLB's loads in a DP
// group, on plain threads.
#include "engine/group_load_sum.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <thread>
#include <vector>

namespace di {
namespace {

// GroupLoadSum (group_load_sum.h): every rank gets the element-wise sum over the ranks, round
// after round; an abort releases a rank waiting for a peer that never comes, later calls throw
// until reset(), and a size mismatch fails the whole round.
TEST(GroupLoadSum, SumsOverTheRanksEveryRound) {
  GroupLoadSum sum(3);
  for (int64_t round_idx = 0; round_idx < 20; ++round_idx) {
    std::vector<std::vector<int64_t>> v(3);
    std::vector<std::thread> ts;
    for (int32_t r = 0; r < 3; ++r) {
      v[static_cast<size_t>(r)] = {r, 10 * r + round_idx, 0, -r};
      ts.emplace_back([&, r] { sum.all_reduce(r, v[static_cast<size_t>(r)]); });
    }
    for (auto& t : ts) t.join();
    for (const auto& x : v) {
      EXPECT_EQ(x, (std::vector<int64_t>{3, 30 + 3 * round_idx, 0, -3})) << round_idx;
    }
  }
  EXPECT_EQ(sum.rounds(), 20u);
  sum.check_integrity();
}

TEST(GroupLoadSum, AbortReleasesWaitersUntilReset) {
  GroupLoadSum sum(2);
  std::vector<int64_t> a{1, 2};
  std::atomic<bool> threw{false};
  std::thread t([&] {
    try {
      sum.all_reduce(0, a);
    } catch (const std::exception&) {
      threw = true;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  sum.abort("rank 1 cannot read its counts");
  t.join();
  EXPECT_TRUE(threw.load());
  sum.check_integrity();
  std::vector<int64_t> b{5, 6};
  EXPECT_THROW(sum.all_reduce(1, b), std::exception);
  sum.reset();
  sum.check_integrity();
  std::thread t0([&] { sum.all_reduce(0, a); });
  sum.all_reduce(1, b);
  t0.join();
  EXPECT_EQ(a, (std::vector<int64_t>{6, 8}));
  EXPECT_EQ(b, a);
  // Different sizes: both ranks of the round throw (nobody waits forever).
  std::vector<int64_t> c{1}, d{1, 2};
  std::atomic<int> throws{0};
  std::thread t1([&] {
    try {
      sum.all_reduce(0, c);
    } catch (const std::exception&) {
      ++throws;
    }
  });
  try {
    sum.all_reduce(1, d);
  } catch (const std::exception&) {
    ++throws;
  }
  t1.join();
  EXPECT_EQ(throws.load(), 2);
  sum.check_integrity();  // aborted, with its reason, and nobody left waiting
  sum.reset();
  sum.check_integrity();
}

}  // namespace
}  // namespace di
