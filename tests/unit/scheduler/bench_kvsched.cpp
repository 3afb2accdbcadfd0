// Micro-benchmarks quoted in docs/kv_cache.md and docs/scheduler.md. Timings are printed, not
// asserted (they depend on the machine); the results being timed are checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>

#include "scheduler/scheduler.h"

namespace di {
namespace {

template <typename F>
double median_us(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[reps / 2];
}

TEST(Bench, PrefixLookupOf32kTokenPrompt) {
  KvCacheManager kv(KvCacheConfig{600, 64, "deepseek-v3", true});
  std::vector<TokenId> prompt(32768);
  std::iota(prompt.begin(), prompt.end(), 1000);
  kv.admit(SeqId(0), prompt, "");
  kv.allocate_slots(SeqId(0));
  kv.mark_computed(SeqId(0), 32768);
  std::vector<BlockHash> hashes;
  double hash_us = median_us(21, [&] { hashes = kv.hash_tokens(prompt, "salt-not-used"); });
  hashes = kv.hash_tokens(prompt, "");
  PrefixMatch m;
  double match_us = median_us(101, [&] { m = kv.match_prefix(hashes, 32769); });
  EXPECT_EQ(m.num_cached_tokens, 32768);
  std::printf(
      "32768-token prompt (512 blocks of 64): hash chain %.0f us (%.2f us/block), "
      "longest-prefix match %.1f us\n",
      hash_us, hash_us / 512, match_us);
}

TEST(Bench, ScheduleWith256RunningDecodes) {
  const int32_t num_seqs = 256;
  KvCacheManager kv(KvCacheConfig{num_seqs * 20, 64, "m", true});
  Limits limits{8192, num_seqs};
  Scheduler sched(kv, SchedulerConfig{limits, 0});
  for (int32_t r = 0; r < num_seqs; ++r) {
    std::vector<TokenId> prompt(1000);
    std::iota(prompt.begin(), prompt.end(), r * 1000);
    RequestParams p;
    p.max_tokens = 200;
    ASSERT_TRUE(sched.add(RequestId(r), std::move(prompt), std::move(p)).is_ok());
  }
  auto fake_step = [&] {
    StepPlan plan = sched.step();
    std::vector<SampledTokens> sampled;
    for (const auto* list : {&plan.schedule.decodes, &plan.schedule.prefills}) {
      for (const ScheduledSeq& e : *list) {
        if (e.num_samples > 0)
          sampled.push_back({e.seq_id, std::vector<TokenId>(e.num_samples, 7)});
      }
    }
    sched.update(plan, sampled);
    return plan.schedule.decodes.size();
  };
  int guard = 0;
  while (fake_step() < static_cast<size_t>(num_seqs) && guard++ < 100) {
  }
  sched.check_integrity();
  ScheduleResult r;
  double schedule_us = median_us(201, [&] { r = schedule(sched.queues(), KvBudget(kv), limits); });
  EXPECT_EQ(r.decodes.size(), static_cast<size_t>(num_seqs));
  EXPECT_EQ(r.num_batched_tokens, num_seqs);
  size_t decodes = 0;
  double step_us = median_us(51, [&] { decodes = fake_step(); });
  EXPECT_EQ(decodes, static_cast<size_t>(num_seqs));
  std::printf(
      "256 running decodes (1000-token prompts): schedule() %.1f us, "
      "step() + update() incl. batch inputs %.1f us\n",
      schedule_us, step_us);
}

}  // namespace
}  // namespace di
