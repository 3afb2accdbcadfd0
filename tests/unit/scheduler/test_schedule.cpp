#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "core/error.h"
#include "fake_engine.h"
#include "scheduler/scheduler.h"

namespace di {
namespace {

using testing::FakeEngine;
using testing::run_step;
using testing::Transcript;

std::vector<TokenId> iota_tokens(int32_t n, TokenId first) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

struct Harness {
  Harness(int32_t num_blocks, int32_t block_size, Limits limits, int32_t max_model_len = 0)
      : kv(KvCacheConfig{num_blocks, block_size, "m", true}),
        sched(kv, SchedulerConfig{limits, max_model_len}),
        engine(num_blocks, block_size),
        limits(limits) {}

  void add(uint64_t id, std::vector<TokenId> prompt, int32_t max_tokens, int32_t priority = 0,
           int32_t n = 1) {
    RequestParams p;
    p.max_tokens = max_tokens;
    p.priority = priority;
    p.n = n;
    Status st = sched.add(RequestId(id), std::move(prompt), std::move(p));
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    sched.check_integrity();
  }
  std::vector<SeqEvent> step() { return run_step(sched, engine, out, limits); }
  int run_to_completion(int max_steps = 10000) {
    int steps = 0;
    while (sched.has_unfinished() && steps < max_steps) {
      step();
      ++steps;
    }
    EXPECT_FALSE(sched.has_unfinished());
    return steps;
  }
  const Sequence* find(uint64_t request, int32_t sample_idx = 0) const {
    for (const auto& [id, s] : sched.queues().seqs) {
      if (s.request_id == RequestId(request) && s.sample_idx == sample_idx) return &s;
    }
    return nullptr;
  }
  std::vector<TokenId>& tok(uint64_t request, int32_t sample) {
    return out.tokens[{request, sample}];
  }
  FinishReason reason(uint64_t request, int32_t sample) { return out.reasons[{request, sample}]; }
  int32_t cached(uint64_t request, int32_t sample) { return out.cached[{request, sample}]; }
  void expect_all_blocks_released() const {
    EXPECT_EQ(kv.num_seqs(), 0);
    EXPECT_EQ(kv.num_available_blocks(), kv.num_blocks());
  }

  KvCacheManager kv;
  Scheduler sched;
  FakeEngine engine;
  Limits limits;
  Transcript out;
};

TEST(Schedule, ChunkedPrefillProgressesAcrossStepsToCompletion) {
  Harness h(8, 16, Limits{32, 8});
  h.add(1, iota_tokens(100, 1), 3);
  std::vector<std::pair<int32_t, int32_t>> chunks;
  for (int i = 0; i < 4; ++i) {
    ScheduleResult r = schedule(h.sched.queues(), KvBudget(h.kv), h.limits);
    ASSERT_EQ(r.prefills.size(), 1u);
    chunks.emplace_back(r.prefills[0].start, r.prefills[0].num_tokens);
    EXPECT_EQ(r.prefills[0].num_samples, i == 3 ? 1 : 0);
    std::vector<SeqEvent> ev = h.step();
    EXPECT_EQ(ev.size(), i == 3 ? 1u : 0u);
  }
  EXPECT_EQ(chunks,
            (std::vector<std::pair<int32_t, int32_t>>{{0, 32}, {32, 32}, {64, 32}, {96, 4}}));
  h.run_to_completion();
  EXPECT_EQ(h.tok(1, 0).size(), 3u);
  EXPECT_EQ(h.reason(1, 0), FinishReason::kLength);
  h.expect_all_blocks_released();
}

TEST(Schedule, IsPureAndDeterministic) {
  Harness h(16, 4, Limits{10, 8});
  h.add(1, iota_tokens(7, 1), 5);
  h.add(2, iota_tokens(9, 50), 5);
  h.step();
  h.add(3, iota_tokens(30, 100), 5);
  int32_t available = h.kv.num_available_blocks();
  ScheduleResult a = schedule(h.sched.queues(), KvBudget(h.kv), h.limits);
  ScheduleResult b = schedule(h.sched.queues(), KvBudget(h.kv), h.limits);
  EXPECT_EQ(h.kv.num_available_blocks(), available);
  ASSERT_EQ(a.prefills.size(), b.prefills.size());
  for (size_t i = 0; i < a.prefills.size(); ++i) {
    EXPECT_EQ(a.prefills[i].seq_id, b.prefills[i].seq_id);
    EXPECT_EQ(a.prefills[i].num_tokens, b.prefills[i].num_tokens);
  }
  EXPECT_EQ(a.num_batched_tokens, b.num_batched_tokens);
  h.sched.check_integrity();
}

TEST(Schedule, DecodesGoFirstAndTheTokenBudgetHolds) {
  Harness h(64, 4, Limits{16, 8});
  h.add(1, iota_tokens(4, 1), 20);
  h.add(2, iota_tokens(5, 40), 20);
  h.step();  // both prompts in one step: 9 tokens
  h.add(3, iota_tokens(40, 100), 2);
  StepPlan plan = h.sched.step();
  const ScheduleResult& r = plan.schedule;
  ASSERT_EQ(r.decodes.size(), 2u);
  ASSERT_EQ(r.prefills.size(), 1u);
  EXPECT_EQ(r.prefills[0].start, 0);
  EXPECT_EQ(r.prefills[0].num_tokens, 14);  // 16 - 2 decodes
  EXPECT_EQ(r.num_batched_tokens, 16);
  EXPECT_EQ(plan.positions.front(), 4);  // decode of request 1 first in the batch
  h.engine.sample_base = [&](const ScheduledSeq& e) {
    return h.sched.queues().seq(e.seq_id).sample_idx;
  };
  h.sched.update(plan, h.engine.run(plan, h.kv));
  h.sched.check_integrity();
  while (h.sched.has_unfinished()) {
    StepPlan p = h.sched.step();
    EXPECT_LE(p.schedule.num_batched_tokens, 16);
    h.sched.update(p, h.engine.run(p, h.kv));
    h.sched.check_integrity();
  }
  h.expect_all_blocks_released();
}

TEST(Schedule, MaxNumSeqsLimitsAdmission) {
  Harness h(64, 4, Limits{1000, 2});
  h.add(1, iota_tokens(3, 1), 4);
  h.add(2, iota_tokens(3, 10), 4);
  h.add(3, iota_tokens(3, 20), 4);
  StepPlan p = h.sched.step();
  EXPECT_EQ(p.schedule.admitted.size(), 2u);
  EXPECT_EQ(p.schedule.waiting.size(), 1u);
  h.sched.update(p, h.engine.run(p, h.kv));
  h.run_to_completion();
}

TEST(Schedule, PreemptsTheLatestArrivalAndResumesWithoutLosingTokens) {
  // 5 blocks of 4 tokens; two requests that each grow to 6 + 8 = 14 tokens (4 blocks).
  Harness h(5, 4, Limits{64, 8});
  h.add(1, iota_tokens(6, 1), 8);
  h.add(2, iota_tokens(6, 100), 8);
  bool saw_preemption = false;
  std::vector<TokenId> output_at_preemption;
  for (int i = 0; i < 100 && h.sched.has_unfinished(); ++i) {
    StepPlan plan = h.sched.step();
    h.sched.check_integrity();
    if (!plan.schedule.preempted.empty() && !saw_preemption) {
      saw_preemption = true;
      ASSERT_EQ(plan.schedule.preempted.size(), 1u);
      const Sequence& victim = h.sched.queues().seq(plan.schedule.preempted[0]);
      EXPECT_EQ(victim.request_id, RequestId(2));  // later arrival, same priority
      EXPECT_EQ(victim.status, SeqStatus::kPreempted);
      output_at_preemption = victim.output;
      EXPECT_FALSE(output_at_preemption.empty());
    }
    h.engine.sample_base = [&](const ScheduledSeq& e) {
      return h.sched.queues().seq(e.seq_id).sample_idx;
    };
    std::vector<SeqEvent> ev = h.sched.update(plan, h.engine.run(plan, h.kv));
    h.sched.check_integrity();
    for (const SeqEvent& e : ev) h.out.tokens[{e.request_id.value(), 0}].push_back(e.token);
  }
  EXPECT_TRUE(saw_preemption);
  EXPECT_GE(h.sched.num_preemptions(), 1);
  EXPECT_FALSE(h.sched.has_unfinished());
  // Request 2 kept what it had generated and continued it.
  std::vector<TokenId>& out2 = h.tok(2, 0);
  ASSERT_EQ(out2.size(), 8u);
  EXPECT_TRUE(std::equal(output_at_preemption.begin(), output_at_preemption.end(), out2.begin()));
  // Differential: the same requests on a pool that never preempts give the same tokens.
  Harness big(64, 4, Limits{64, 8});
  big.add(1, iota_tokens(6, 1), 8);
  big.add(2, iota_tokens(6, 100), 8);
  big.run_to_completion();
  EXPECT_EQ(big.sched.num_preemptions(), 0);
  EXPECT_EQ(big.tok(1, 0), h.tok(1, 0));
  EXPECT_EQ(big.tok(2, 0), out2);
  h.expect_all_blocks_released();
}

TEST(Schedule, PriorityOrdersAdmissionAndPicksTheVictim) {
  // Admission: an urgent request that arrives later is admitted first.
  {
    Harness h(4, 4, Limits{64, 8});
    h.add(1, iota_tokens(10, 1), 2, /*priority=*/5);
    h.add(2, iota_tokens(10, 50), 2, /*priority=*/0);
    StepPlan p = h.sched.step();
    ASSERT_EQ(p.schedule.admitted.size(), 1u);  // 3 blocks each, 4 in the pool
    EXPECT_EQ(h.sched.queues().seq(p.schedule.admitted[0]).request_id, RequestId(2));
    h.sched.update(p, h.engine.run(p, h.kv));
    h.run_to_completion();
  }
  // Preemption: the least urgent running sequence goes, even though it arrived first.
  {
    Harness h(5, 4, Limits{64, 8});
    h.add(1, iota_tokens(6, 1), 8, /*priority=*/1);
    h.add(2, iota_tokens(6, 100), 8, /*priority=*/0);
    std::vector<RequestId> victims;
    while (h.sched.has_unfinished()) {
      StepPlan p = h.sched.step();
      for (SeqId v : p.schedule.preempted) victims.push_back(h.sched.queues().seq(v).request_id);
      h.engine.sample_base = [&](const ScheduledSeq& e) {
        return h.sched.queues().seq(e.seq_id).sample_idx;
      };
      h.sched.update(p, h.engine.run(p, h.kv));
      h.sched.check_integrity();
    }
    ASSERT_FALSE(victims.empty());
    EXPECT_EQ(victims[0], RequestId(1));
    h.expect_all_blocks_released();
  }
}

TEST(Schedule, AbortFromEveryQueueFreesEverything) {
  Harness h(6, 4, Limits{8, 8});
  h.add(1, iota_tokens(6, 1), 50);     // will be decoding
  h.add(2, iota_tokens(12, 100), 50);  // will be mid-prefill (budget 8)
  h.add(3, iota_tokens(12, 200), 50);  // will be waiting (no blocks left)
  h.step();                            // 1 prefilled (6), 2 admitted, 2 tokens of it
  h.step();
  ASSERT_NE(h.find(1), nullptr);
  EXPECT_FALSE(h.find(1)->output.empty());
  EXPECT_EQ(h.find(2)->status, SeqStatus::kRunning);
  EXPECT_LT(h.kv.num_computed_tokens(h.find(2)->seq_id), 12);
  EXPECT_EQ(h.find(3)->status, SeqStatus::kWaiting);
  EXPECT_EQ(h.sched.abort(RequestId(3)), 1);  // waiting
  h.sched.check_integrity();
  EXPECT_EQ(h.sched.abort(RequestId(2)), 1);  // running, prefilling
  h.sched.check_integrity();
  EXPECT_EQ(h.sched.abort(RequestId(1)), 1);  // running, decoding
  h.sched.check_integrity();
  EXPECT_EQ(h.sched.abort(RequestId(1)), 0);  // already gone
  EXPECT_EQ(h.sched.abort(RequestId(99)), 0);
  h.expect_all_blocks_released();
  EXPECT_FALSE(h.sched.has_unfinished());

  // Preempted (waiting again with output), and aborted between step() and update().
  Harness g(5, 4, Limits{64, 8});
  g.add(1, iota_tokens(6, 1), 8);
  g.add(2, iota_tokens(6, 100), 8);
  bool aborted_preempted = false;
  while (g.sched.has_unfinished()) {
    StepPlan p = g.sched.step();
    if (!p.schedule.preempted.empty() && !aborted_preempted) {
      RequestId victim = g.sched.queues().seq(p.schedule.preempted[0]).request_id;
      EXPECT_EQ(g.sched.queues().seq(p.schedule.preempted[0]).status, SeqStatus::kPreempted);
      EXPECT_EQ(g.sched.abort(victim), 1);
      aborted_preempted = true;
    }
    g.engine.sample_base = [&](const ScheduledSeq& e) {
      return g.sched.queues().seq(e.seq_id).sample_idx;
    };
    std::vector<SampledTokens> sampled = g.engine.run(p, g.kv);
    if (aborted_preempted) g.sched.abort(RequestId(1));  // in flight: update() drops its results
    g.sched.update(p, sampled);
    g.sched.check_integrity();
  }
  EXPECT_TRUE(aborted_preempted);
  g.expect_all_blocks_released();
}

TEST(Schedule, GroupOfNSharesThePromptAndForksAfterPrefill) {
  Harness h(16, 4, Limits{64, 8});
  h.add(1, iota_tokens(6, 1), 4, 0, /*n=*/3);
  StepPlan p = h.sched.step();
  ASSERT_EQ(p.schedule.prefills.size(), 1u);
  EXPECT_EQ(p.schedule.prefills[0].num_samples, 3);
  h.engine.sample_base = [&](const ScheduledSeq& e) {
    return h.sched.queues().seq(e.seq_id).sample_idx;
  };
  std::vector<SeqEvent> ev = h.sched.update(p, h.engine.run(p, h.kv));
  h.sched.check_integrity();
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(h.kv.num_seqs(), 3);
  BlockId full = h.kv.block_table(h.find(1, 0)->seq_id)[0];
  EXPECT_EQ(h.kv.ref_count(full), 3);  // the prompt's full block, shared
  EXPECT_EQ(h.kv.num_free_blocks(), 14);
  StepPlan d = h.sched.step();
  EXPECT_EQ(d.schedule.decodes.size(), 3u);
  EXPECT_EQ(d.block_copies.size(), 2u);  // partial block [4 5 | t]: n - 1 copies
  std::vector<SeqEvent> ev2 = h.sched.update(d, h.engine.run(d, h.kv));
  h.sched.check_integrity();
  ASSERT_EQ(ev2.size(), 3u);
  h.run_to_completion();
  std::set<std::vector<TokenId>> distinct;
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(ev[k].sample_idx, k);
    EXPECT_EQ(ev2[k].sample_idx, k);
    std::vector<TokenId> tokens{ev[k].token, ev2[k].token};
    auto& rest = h.tok(1, k);
    tokens.insert(tokens.end(), rest.begin(), rest.end());
    EXPECT_EQ(tokens.size(), 4u);
    distinct.insert(tokens);
  }
  EXPECT_EQ(distinct.size(), 3u);
  h.expect_all_blocks_released();
}

TEST(Schedule, StopTokenMaxTokensAndMaxModelLen) {
  Harness h(16, 4, Limits{64, 8}, /*max_model_len=*/10);
  std::vector<TokenId> prompt = iota_tokens(5, 1);
  TokenId first = FakeEngine::next_token(prompt, 0);
  RequestParams stop;
  stop.max_tokens = 10;
  stop.stop_token_ids = {first};
  ASSERT_TRUE(h.sched.add(RequestId(1), prompt, stop).is_ok());
  h.add(2, iota_tokens(5, 1), 3);  // max_tokens
  h.add(3, iota_tokens(7, 1), 9);  // runs into max_model_len after 3 tokens
  h.run_to_completion();
  EXPECT_EQ(h.reason(1, 0), FinishReason::kStop);
  EXPECT_EQ(h.tok(1, 0), std::vector<TokenId>{first});
  EXPECT_EQ(h.reason(2, 0), FinishReason::kLength);
  EXPECT_EQ(h.tok(2, 0).size(), 3u);
  EXPECT_EQ(h.reason(3, 0), FinishReason::kLength);
  EXPECT_EQ(h.tok(3, 0).size(), 3u);
  h.expect_all_blocks_released();
}

TEST(Schedule, ExternalFinishForStopStrings) {
  Harness h(16, 4, Limits{64, 8});
  h.add(1, iota_tokens(5, 1), 100);
  h.step();
  h.step();
  h.sched.finish(h.find(1)->seq_id, FinishReason::kStop);
  h.sched.check_integrity();
  h.expect_all_blocks_released();
}

TEST(Schedule, RejectsBadRequestsWithoutCrashing) {
  Harness h(4, 4, Limits{64, 8});
  EXPECT_EQ(h.sched.add(RequestId(1), {}, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h.sched.add(RequestId(1), iota_tokens(16, 0), {}).code(),
            StatusCode::kInvalidArgument);  // no room for an output token
  RequestParams zero_n;
  zero_n.n = 0;
  EXPECT_EQ(h.sched.add(RequestId(1), {1}, zero_n).code(), StatusCode::kInvalidArgument);
  RequestParams zero_max;
  zero_max.max_tokens = 0;
  EXPECT_EQ(h.sched.add(RequestId(1), {1}, zero_max).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h.sched.add(RequestId(1), {-5}, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(h.sched.add(RequestId(1), {1}, {}).is_ok());
  EXPECT_EQ(h.sched.add(RequestId(1), {1}, {}).code(), StatusCode::kAlreadyExists);
  h.sched.check_integrity();
}

TEST(Schedule, SecondRequestOnA1000TokenPrefixReportsCachedTokens) {
  Harness h(64, 64, Limits{8192, 8});
  std::vector<TokenId> prefix = iota_tokens(1000, 1);
  std::vector<TokenId> a = prefix, b = prefix;
  a.push_back(5000);
  b.insert(b.end(), {6000, 6001});
  h.add(1, a, 2);
  h.run_to_completion();
  h.add(2, b, 2);
  StepPlan p = h.sched.step();
  ASSERT_EQ(p.schedule.prefills.size(), 1u);
  EXPECT_EQ(p.schedule.prefills[0].start, 960);
  EXPECT_EQ(p.schedule.prefills[0].num_tokens, 1002 - 960);
  h.sched.update(p, h.engine.run(p, h.kv));
  h.run_to_completion();
  EXPECT_EQ(h.cached(1, 0), 0);
  EXPECT_EQ(h.cached(2, 0), (1000 / 64) * 64);
  EXPECT_EQ(h.kv.stats().num_hit_tokens, 960u);
}

}  // namespace
}  // namespace di
