#include <gtest/gtest.h>

#include <random>

#include "fake_engine.h"
#include "scheduler/scheduler.h"

namespace di {
namespace {

using testing::FakeEngine;
using testing::run_step;
using testing::Transcript;

// Thousands of random add / abort / finish / step operations on an 8-block pool. After every
// operation: KvCacheManager and queue invariants; every step: the fake engine checks that each
// sequence's KV context holds exactly its tokens. At the end every block is free or cached and
// unreferenced. Then the same requests replayed on a large pool with no aborts must produce the
// same tokens for every sequence that finished by itself in both runs.
TEST(SchedulerStress, RandomOperationsKeepEveryInvariant) {
  for (int32_t block_size : {1, 4}) {
    const int32_t num_blocks = 8;
    const Limits limits{12, 6};
    KvCacheManager kv(KvCacheConfig{num_blocks, block_size, "m", true});
    Scheduler sched(kv, SchedulerConfig{limits, num_blocks * block_size});
    FakeEngine engine(num_blocks, block_size);
    Transcript out;
    std::mt19937 rng(42 + block_size);
    uint64_t next_request = 0;
    int num_steps = 0;
    for (int op = 0; op < 3000; ++op) {
      int kind = static_cast<int>(rng() % 10);
      if (kind < 3) {
        // A small alphabet and shared stems make prefixes repeat.
        std::vector<TokenId> prompt(1 + rng() % (2 * block_size + 3));
        for (auto& t : prompt) t = 100 + static_cast<TokenId>(rng() % 3);
        RequestParams p;
        p.max_tokens = 1 + static_cast<int32_t>(rng() % 12);
        p.n = 1 + static_cast<int32_t>(rng() % 3);
        p.priority = static_cast<int32_t>(rng() % 3);
        p.cache_salt = rng() % 5 == 0 ? "tenant" : "";
        if (rng() % 4 == 0) p.stop_token_ids = {FakeEngine::next_token(prompt, 0)};
        ASSERT_TRUE(sched.add(RequestId(next_request++), std::move(prompt), std::move(p)).is_ok());
      } else if (kind == 3 && next_request > 0) {
        sched.abort(RequestId(rng() % next_request));
      } else if (kind == 4 && !sched.queues().seqs.empty()) {
        auto it = sched.queues().seqs.begin();
        std::advance(it, rng() % sched.queues().seqs.size());
        sched.finish(it->first, FinishReason::kStop);  // as if a stop string matched
      } else {
        run_step(sched, engine, out, limits);
        ++num_steps;
      }
      sched.check_integrity();
    }
    int guard = 0;
    while (sched.has_unfinished() && guard++ < 10000) run_step(sched, engine, out, limits);
    EXPECT_FALSE(sched.has_unfinished());
    sched.check_integrity();
    EXPECT_EQ(kv.num_seqs(), 0);
    EXPECT_EQ(kv.num_available_blocks(), num_blocks);
    EXPECT_GT(sched.num_preemptions(), 0) << "the workload must exercise preemption";
    EXPECT_GT(kv.stats().num_hit_tokens, 0u) << "the workload must exercise prefix hits";
    EXPECT_GT(num_steps, 500);
  }
}

}  // namespace
}  // namespace di
