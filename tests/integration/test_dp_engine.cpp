// DpEngineGroup (engine/dp_engine_group.h): DP attention + expert parallelism in the serving
// engine, on the CPU backend with the shared-memory EP exchange. Real golden MoE models
// (deepseek_v2, deepseek_v3, qwen3_moe); the oracle is one EngineLoop on the same requests.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>

#include "engine/dp_engine_group.h"
#include "engine/engine.h"
#include "engine/eplb_runtime.h"
#include "engine_test_util.h"
#include "golden_util.h"
#include "model/layers.h"

namespace di {
namespace {

using testing::fixture;
using testing::greedy_request;
using testing::random_tokens;
using testing::source_dir;
using testing::start_engine;

// Every event by request; waits for final events.
class Collector {
 public:
  TokenSink sink(RequestId id) {
    {
      std::lock_guard lock(mu_);
      open_[id] += 1;
    }
    return [this](const TokenEvent& e) {
      std::lock_guard lock(mu_);
      events_[e.id].push_back(e);
      if (e.finish != EngineFinish::kNone) --open_[e.id];
      cv_.notify_all();  // wait_tokens waits for any event
    };
  }
  bool wait_all(std::chrono::seconds timeout = std::chrono::seconds(120)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] {
      for (const auto& [id, n] : open_)
        if (n != 0) return false;
      return true;
    });
  }
  bool wait_tokens(RequestId id, size_t n,
                   std::chrono::seconds timeout = std::chrono::seconds(60)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return events_[id].size() >= n; });
  }
  std::vector<int32_t> tokens(RequestId id) {
    std::lock_guard lock(mu_);
    std::vector<int32_t> out;
    for (const TokenEvent& e : events_[id])
      if (e.token >= 0) out.push_back(e.token);
    return out;
  }
  EngineFinish finish(RequestId id) {
    std::lock_guard lock(mu_);
    for (const TokenEvent& e : events_[id])
      if (e.finish != EngineFinish::kNone) return e.finish;
    return EngineFinish::kNone;
  }
  int num_finals(RequestId id) {
    std::lock_guard lock(mu_);
    int n = 0;
    for (const TokenEvent& e : events_[id]) n += e.finish != EngineFinish::kNone ? 1 : 0;
    return n;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<RequestId, int32_t> open_;
  std::map<RequestId, std::vector<TokenEvent>> events_;
};

EngineConfig config_for(const std::string& model, int32_t dp_size) {
  EngineConfig c;
  c.model_dir = fixture(model);
  c.block_size = 16;
  c.num_blocks = 96;          // per rank
  c.max_batched_tokens = 24;  // long prompts are chunked over several steps
  c.dp_size = dp_size;
  return c;
}

struct Workload {
  std::vector<EngineRequest> first;  // submitted together
  std::vector<EngineRequest> late;   // submitted once the first ones are decoding
};

// 8 concurrent requests, alternately placed on ranks 0 and 1 by the least-loaded rule (while no
// rank has stepped yet; see pinned()): rank 0 gets long prompts and long outputs, rank 1 short
// ones, so rank 1 runs out of work and pads while rank 0 decodes; 2 late requests prefill
// (chunked) while the others decode.
Workload workload(int64_t vocab, uint64_t id_base) {
  Workload w;
  const int32_t prompt_len[] = {70, 3, 41, 9, 33, 1, 57, 12};
  const int32_t max_tokens[] = {14, 2, 11, 1, 12, 3, 9, 2};
  for (int i = 0; i < 8; ++i) {
    w.first.push_back(greedy_request(
        id_base + static_cast<uint64_t>(i),
        random_tokens(prompt_len[i], vocab, 100 + static_cast<uint32_t>(i)), max_tokens[i]));
  }
  w.late.push_back(greedy_request(id_base + 8, random_tokens(50, vocab, 200), 6));
  w.late.push_back(greedy_request(id_base + 9, random_tokens(29, vocab, 201), 5));
  return w;
}

// The workload with its first 8 requests pinned to the alternating ranks. The least-loaded rule
// gives that placement only while no rank has stepped: on a loaded machine a rank can prefill
// (its KV blocks break the open-sample tie) or finish a short request before the next submit,
// and the long requests then spread over both ranks (CI saw 'rank 1 never padded' twice).
Workload pinned(Workload w) {
  for (size_t i = 0; i < w.first.size(); ++i) w.first[i].dp_rank = static_cast<int32_t>(i % 2);
  return w;
}

std::map<RequestId, std::vector<int32_t>> run(Engine& engine, const Workload& w, Collector& col) {
  for (const EngineRequest& r : w.first) {
    EXPECT_TRUE(engine.submit(r, col.sink(r.id)).is_ok());
  }
  // Late requests once the first long one has produced a few tokens.
  EXPECT_TRUE(col.wait_tokens(w.first.front().id, 3));
  EXPECT_NO_THROW(engine.check_integrity());
  for (const EngineRequest& r : w.late) {
    EXPECT_TRUE(engine.submit(r, col.sink(r.id)).is_ok());
  }
  EXPECT_TRUE(col.wait_all());
  std::map<RequestId, std::vector<int32_t>> out;
  for (const auto* list : {&w.first, &w.late})
    for (const EngineRequest& r : *list) out[r.id] = col.tokens(r.id);
  return out;
}

// run() on a DP group while another thread checks the group's invariants, racing its steps.
std::map<RequestId, std::vector<int32_t>> run_checked(DpEngineGroup& group, const Workload& w,
                                                      Collector& col) {
  std::atomic<bool> done{false};
  std::thread checker([&] {
    while (!done.load()) {
      EXPECT_NO_THROW(group.check_integrity());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  auto got = run(group, w, col);
  done = true;
  checker.join();
  return got;
}

class DpEngineGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(DpEngineGolden, TwoRanksEqualOneEngine) {
  auto single = start_engine(config_for(GetParam(), 0));
  auto group_engine = start_engine(config_for(GetParam(), 2));
  ASSERT_TRUE(single && group_engine);
  auto* group = dynamic_cast<DpEngineGroup*>(group_engine.get());
  ASSERT_NE(group, nullptr);
  ASSERT_TRUE(group->expert_parallel());
  ASSERT_EQ(group->num_ranks(), 2);
  const Workload w = workload(single->vocab_size(), 1);

  Collector ref_col, col;
  const auto expected = run(*single, w, ref_col);
  const auto got = run_checked(*group, pinned(w), col);

  for (const auto& [id, tokens] : expected) {
    EXPECT_EQ(got.at(id), tokens) << GetParam() << " request " << id.value();
    EXPECT_FALSE(tokens.empty());
    EXPECT_EQ(col.num_finals(id), 1);
    EXPECT_EQ(col.finish(id), EngineFinish::kLength);
  }
  // Lockstep: every group step is one forward on every rank (the rank that padded in the last
  // round may publish its stats just after the other rank's final event, so wait for them before
  // reading any rank's stats: CI once read rank 1's before its padding steps were published).
  const auto forwards = [&](int32_t r) {
    const EngineStats st = group->rank_stats(r);
    return st.steps + st.padding_steps;
  };
  for (int i = 0;
       i < 100 && (forwards(0) != group->group_steps() || forwards(1) != group->group_steps());
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(forwards(0), group->group_steps());
  EXPECT_EQ(forwards(1), group->group_steps());
  // Both ranks served requests; the one with the short ones padded while the other decoded.
  const EngineStats r0 = group->rank_stats(0), r1 = group->rank_stats(1);
  EXPECT_GT(r0.requests_finished, 0u);
  EXPECT_GT(r1.requests_finished, 0u);
  EXPECT_GT(r1.padding_steps, 0u) << "rank 1 never padded";
  // Time accounting: both ranks ran forwards and sampled; a DP rank waits at the barriers.
  EXPECT_GT(r0.forward_us + r1.forward_us, 0u);
  EXPECT_GT(r0.sample_us, 0u);
  EXPECT_GT(r0.group_wait_us + r1.group_wait_us, 0u);

  const EngineStats s = group->stats();
  EXPECT_EQ(s.dp_size, 2);
  EXPECT_EQ(s.requests_finished, 10u);
  EXPECT_EQ(s.generated_tokens, single->stats().generated_tokens);
  EXPECT_EQ(s.prompt_tokens, single->stats().prompt_tokens);
  EXPECT_EQ(s.kv_blocks_total, 2 * 96);
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.num_running + s.num_waiting, 0);
  EXPECT_NO_THROW(group->check_integrity());

  // Idle: no rounds while nobody has work (the ranks sleep on their inboxes).
  const uint64_t steps = group->group_steps();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(group->group_steps(), steps);
}

// Each rank's copy of the experts it does not own is zeroed (an expert with zero weights outputs
// zero): the group must still give the single engine's tokens, so every routed row really goes to
// its owner rank and nobody computes another rank's experts.
TEST_P(DpEngineGolden, EachRankComputesOnlyItsOwnExperts) {
  auto single = start_engine(config_for(GetParam(), 0));
  auto engine = start_engine(config_for(GetParam(), 2));
  ASSERT_TRUE(single && engine);
  auto* group = dynamic_cast<DpEngineGroup*>(engine.get());
  for (int32_t r = 0; r < 2; ++r) {
    for (MoeBlock* b : group->rank(r).model().moe_blocks()) {
      const int64_t e = b->experts.gate_up.size(0), spr = (e + 1) / 2;
      const int64_t per_expert = b->experts.gate_up.numel() / e;
      for (int64_t x = 0; x < e; ++x) {
        if (x / spr == r) continue;
        std::fill_n(b->experts.gate_up.f32() + x * per_expert, per_expert, 0.0f);
      }
    }
  }
  const Workload w = workload(single->vocab_size(), 300);
  Collector ref_col, col;
  EXPECT_EQ(run(*engine, w, col), run(*single, w, ref_col)) << GetParam();
  EXPECT_NO_THROW(engine->check_integrity());
}

INSTANTIATE_TEST_SUITE_P(Models, DpEngineGolden,
                         ::testing::Values("deepseek_v2", "deepseek_v3", "qwen3_moe"));

TEST(DpEngineGroup, PlacesOnTheLeastLoadedRankAndAbortsOnTheHoldingRank) {
  auto single = start_engine(config_for("qwen3_moe", 0));
  auto engine = start_engine(config_for("qwen3_moe", 2));
  ASSERT_TRUE(single && engine);
  auto* group = dynamic_cast<DpEngineGroup*>(engine.get());
  const int64_t vocab = engine->vocab_size();
  Collector col, ref_col;
  // Open samples decide: 1 -> rank 0 (0 vs 0, no KV used yet: lowest rank); 2 (n = 3) -> rank 1
  // (1 vs 0); 3 -> rank 0 (1 vs 3); 4 -> rank 0 (2 vs 3).
  EngineRequest a = greedy_request(1, random_tokens(20, vocab, 1), 120);
  EngineRequest b = greedy_request(2, random_tokens(11, vocab, 2), 120);
  b.n = 3;
  b.sampling.temperature = 1.0f;
  b.sampling.seed = 5;
  EngineRequest c = greedy_request(3, random_tokens(5, vocab, 3), 40);
  EngineRequest d = greedy_request(4, random_tokens(7, vocab, 4), 40);
  // Request 2's sink: a duplicate submit of its id at its first event (refused although rank 0
  // does not hold it), an abort from inside the sink at its 4th event (rank 1).
  std::atomic<int> b_events{0};
  std::atomic<int> duplicate_code{-1};
  TokenSink b_sink = col.sink(b.id);
  col.sink(b.id);
  col.sink(b.id);  // n = 3: three final events
  auto b_wrapped = [&, b_sink](const TokenEvent& e) {
    b_sink(e);
    const int k = ++b_events;
    if (k == 1) {
      duplicate_code = static_cast<int>(
          engine->submit(greedy_request(2, {1, 2}, 2), [](const TokenEvent&) {}).code());
    }
    if (k == 4) engine->abort(RequestId(2));
  };
  ASSERT_TRUE(engine->submit(a, col.sink(a.id)).is_ok());
  ASSERT_TRUE(engine->submit(b, b_wrapped).is_ok());
  ASSERT_TRUE(engine->submit(c, col.sink(c.id)).is_ok());
  ASSERT_TRUE(engine->submit(d, col.sink(d.id)).is_ok());
  EXPECT_EQ(group->rank_of(a.id), 0);
  EXPECT_EQ(group->rank_of(b.id), 1);
  EXPECT_EQ(group->rank_of(c.id), 0);
  EXPECT_EQ(group->rank_of(d.id), 0);
  engine->abort(RequestId(999));  // unknown: no-op
  ASSERT_TRUE(col.wait_all());
  EXPECT_EQ(duplicate_code.load(), static_cast<int>(StatusCode::kAlreadyExists));
  EXPECT_EQ(col.finish(b.id), EngineFinish::kAbort);
  EXPECT_EQ(col.num_finals(b.id), 3);
  EXPECT_LT(col.tokens(b.id).size(), 3u * 120u);
  EXPECT_EQ(col.finish(a.id), EngineFinish::kLength);
  EXPECT_EQ(col.tokens(a.id).size(), 120u);
  EXPECT_EQ(group->rank_of(b.id), -1);
  // Request 1 equals the single engine's output: its rank ran alongside the other's steps.
  ASSERT_TRUE(single->submit(a, ref_col.sink(a.id)).is_ok());
  ASSERT_TRUE(ref_col.wait_all());
  EXPECT_EQ(col.tokens(a.id), ref_col.tokens(a.id));

  const EngineStats s = engine->stats();
  EXPECT_EQ(s.requests_aborted, 1u);
  EXPECT_EQ(s.requests_finished, 3u);
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_NO_THROW(engine->check_integrity());
  // The id is free again once its final events were delivered.
  ASSERT_TRUE(engine->submit(greedy_request(2, {1, 2, 3}, 2), col.sink(RequestId(2))).is_ok());
  ASSERT_TRUE(col.wait_all());
}

// EngineRequest::dp_rank: a pinned request runs on the rank it names, whatever the loads say; a
// rank outside the group is refused with a message, and a lone engine accepts only rank 0.
TEST(DpEngineGroup, APinnedRequestRunsOnTheNamedRank) {
  auto single = start_engine(config_for("qwen3_moe", 0));
  auto engine = start_engine(config_for("qwen3_moe", 2));
  ASSERT_TRUE(single && engine);
  auto* group = dynamic_cast<DpEngineGroup*>(engine.get());
  const int64_t vocab = engine->vocab_size();
  Collector col, ref_col;
  // Both on rank 1 although the second would go to the idle rank 0 by the least-loaded rule.
  for (uint64_t id : {1u, 2u}) {
    EngineRequest r = greedy_request(id, random_tokens(9, vocab, static_cast<uint32_t>(id)), 60);
    r.dp_rank = 1;
    ASSERT_TRUE(engine->submit(r, col.sink(r.id)).is_ok());
    EXPECT_EQ(group->rank_of(r.id), 1);
  }
  for (int32_t bad : {2, -2}) {
    EngineRequest r = greedy_request(3, {1, 2, 3}, 2);
    r.dp_rank = bad;
    const Status st = engine->submit(r, [](const TokenEvent&) {});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("dp_rank must be in [-1, 2)"), std::string::npos) << st.message();
  }
  EXPECT_EQ(group->rank_of(RequestId(3)), -1);
  ASSERT_TRUE(col.wait_all());
  EXPECT_EQ(group->rank_stats(1).requests_finished, 2u);
  EXPECT_EQ(group->rank_stats(0).requests_finished, 0u);

  EngineRequest one = greedy_request(4, {1, 2, 3}, 2);
  one.dp_rank = 1;
  const Status st = single->submit(one, [](const TokenEvent&) {});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("dp_rank 1 is not this engine's rank"), std::string::npos)
      << st.message();
  one.dp_rank = 0;
  ASSERT_TRUE(single->submit(one, ref_col.sink(one.id)).is_ok());
  ASSERT_TRUE(ref_col.wait_all());
  EXPECT_EQ(ref_col.finish(one.id), EngineFinish::kLength);
}

TEST(DpEngineGroup, DestructionWithRequestsInFlightAbortsThemWithoutDeadlock) {
  Collector col;
  {
    auto engine = start_engine(config_for("deepseek_v3", 3));
    ASSERT_TRUE(engine);
    const int64_t vocab = engine->vocab_size();
    for (uint64_t i = 1; i <= 4; ++i) {
      TokenSink inner = col.sink(RequestId(i));
      // A slow sink (test only) keeps the requests in flight: ~2 ms per token.
      TokenSink slow = [inner](const TokenEvent& e) {
        inner(e);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      };
      ASSERT_TRUE(
          engine
              ->submit(greedy_request(i, random_tokens(9, vocab, static_cast<uint32_t>(i)), 200),
                       slow)
              .is_ok());
    }
    ASSERT_TRUE(col.wait_tokens(RequestId(1), 2));
  }  // ~DpEngineGroup while 3 ranks step in lockstep
  ASSERT_TRUE(col.wait_all(std::chrono::seconds(5)));
  for (uint64_t i = 1; i <= 4; ++i) {
    EXPECT_EQ(col.num_finals(RequestId(i)), 1);
    EXPECT_EQ(col.finish(RequestId(i)), EngineFinish::kAbort);
  }
}

TEST(DpEngineGroup, OneRankGroupEqualsOneEngine) {
  // `serve --dp-size 1`: the group code path (barrier, hook, self exchange) with one rank.
  auto single = start_engine(config_for("deepseek_v2", 0));
  auto engine = start_engine(config_for("deepseek_v2", 1));
  ASSERT_TRUE(single && engine);
  auto* group = dynamic_cast<DpEngineGroup*>(engine.get());
  ASSERT_TRUE(group->expert_parallel());
  const Workload w = workload(engine->vocab_size(), 70);
  Collector ref_col, col;
  EXPECT_EQ(run(*engine, w, col), run(*single, w, ref_col));
  EXPECT_EQ(group->rank_stats(0).padding_steps, 0u);  // nobody to pad for
  EXPECT_EQ(engine->stats().kv_blocks_used, 0);
  EXPECT_NO_THROW(engine->check_integrity());
}

// Submits greedy requests 1..4 (12 random prompt tokens, 8 new) to an engine whose step will
// throw on one rank, and expects all four to end kError without any rank staying blocked.
void expect_four_requests_fail(Engine& engine) {
  const int64_t vocab = engine.vocab_size();
  Collector col;
  for (uint64_t i = 1; i <= 4; ++i) {
    ASSERT_TRUE(
        engine
            .submit(greedy_request(i, random_tokens(12, vocab, static_cast<uint32_t>(i)), 8),
                    col.sink(RequestId(i)))
            .is_ok());
  }
  ASSERT_TRUE(col.wait_all(std::chrono::seconds(30))) << "a rank stayed blocked in the exchange";
  for (uint64_t i = 1; i <= 4; ++i) EXPECT_EQ(col.finish(RequestId(i)), EngineFinish::kError) << i;
}

TEST(DpEngineGroup, AFailedStepReleasesTheOtherRankAndTheGroupRecovers) {
  auto single = start_engine(config_for("qwen3_moe", 0));
  auto engine = start_engine(config_for("qwen3_moe", 2));
  ASSERT_TRUE(single && engine);
  auto* group = dynamic_cast<DpEngineGroup*>(engine.get());
  // Rank 1's expert weights get a bad shape: its moe_experts throws in the middle of the
  // exchange while rank 0 waits for its rows.
  std::vector<MoeBlock*> blocks = group->rank(1).model().moe_blocks();
  const Tensor good = blocks[0]->experts.down;
  blocks[0]->experts.down =
      Tensor::zeros({good.size(0), good.size(1) + 1, good.size(2)}, DType::kF32);
  const int64_t vocab = engine->vocab_size();
  ASSERT_NO_FATAL_FAILURE(expect_four_requests_fail(*engine));
  EXPECT_EQ(engine->stats().requests_failed, 4u);
  EXPECT_EQ(engine->stats().kv_blocks_used, 0);
  EXPECT_NO_THROW(engine->check_integrity());
  // Repaired (between steps: the ranks are idle), the group serves again and equals one engine.
  blocks[0]->experts.down = good;
  const Workload w = workload(vocab, 20);
  Collector ref_col, col2;
  EXPECT_EQ(run(*engine, w, col2), run(*single, w, ref_col));
  EXPECT_NO_THROW(engine->check_integrity());
}

// EPLB in a DP group (issue #8): tiny windows and periods so that several rebalances happen while
// requests run, min_gain 0 so that a plan is applied whenever it differs, redundant slots so that
// replicas exist. Fields: redundant per rank, window, period, steps per bucket, min_gain.
EplbOptions busy_eplb() {
  EplbOptions o;
  o.enabled = true;
  o.prefill = {2, 2, 2, 1, 0.0};
  o.decode = {1, 4, 3, 2, 0.0};
  return o;
}

// Every rank ran one forward per group step (the rank that padded in the last round may publish
// its stats just after the other rank's final event).
void wait_lockstep(DpEngineGroup& group) {
  const auto forwards = [&](int32_t r) {
    const EngineStats st = group.rank_stats(r);
    return st.steps + st.padding_steps;
  };
  const auto in_step = [&] {
    for (int32_t r = 0; r < group.num_ranks(); ++r)
      if (forwards(r) != group.group_steps()) return false;
    return true;
  };
  for (int i = 0; i < 200 && !in_step(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int32_t r = 0; r < group.num_ranks(); ++r) {
    EXPECT_EQ(forwards(r), group.group_steps()) << "rank " << r;
  }
}

// What a test reads from one rank's EplbRuntime, between steps.
struct RankEplb {
  EplbStats stats;
  std::vector<EplbRebalanceRecord> history;
  std::vector<parallel::ExpertPlacement> placements;
  std::vector<std::vector<std::vector<int64_t>>> window;  // [phase][layer][expert], group sums
  std::vector<std::vector<int64_t>> counts;               // [layer][expert], this rank, both phases
  std::vector<int64_t> steps;                             // [phase] EPLB steps closed
};

RankEplb read_eplb(DpEngineGroup& group, int32_t r) {
  RankEplb out;
  group.rank(r).with_eplb([&](EplbRuntime* e) {
    ASSERT_NE(e, nullptr);
    EXPECT_NO_THROW(e->check_integrity(/*compare_weights=*/true)) << "rank " << r;
    out.stats = e->stats();
    out.history = e->history();
    out.placements = e->placements();
    for (EplbPhase p : {EplbPhase::kPrefill, EplbPhase::kDecode}) {
      out.window.push_back(e->controller(p).window().all_loads());
      out.steps.push_back(e->controller(p).step());
    }
    out.counts = e->total_counts(EplbPhase::kPrefill);
    const auto dec = e->total_counts(EplbPhase::kDecode);
    for (size_t l = 0; l < dec.size(); ++l)
      for (size_t x = 0; x < dec[l].size(); ++x) out.counts[l][x] += dec[l][x];
  });
  return out;
}

// Starts tracing every routed logical id of every MoE layer on every rank (before any step).
std::vector<std::vector<std::vector<int32_t>>> trace_all(DpEngineGroup& group) {
  std::vector<std::vector<std::vector<int32_t>>> traces(static_cast<size_t>(group.num_ranks()));
  for (int32_t r = 0; r < group.num_ranks(); ++r) {
    group.rank(r).with_eplb([&](EplbRuntime* e) {
      ASSERT_NE(e, nullptr);
      traces[static_cast<size_t>(r)].resize(static_cast<size_t>(e->num_layers()));
      e->set_trace(&traces[static_cast<size_t>(r)]);
    });
  }
  return traces;
}

void stop_tracing(DpEngineGroup& group) {
  for (int32_t r = 0; r < group.num_ranks(); ++r) {
    group.rank(r).with_eplb([](EplbRuntime* e) { e->set_trace(nullptr); });
  }
}

// The group's EPLB invariants after a run: every rank rebalanced >= min_rebalances times, at the
// same steps with the same placements; every rank's window holds the same (group-summed) loads;
// the ranks' own counts sum to a recount of every routed id, and every token forwarded by the
// group (padding tokens too) was counted top_k times per layer.
void expect_group_eplb(DpEngineGroup& group,
                       const std::vector<std::vector<std::vector<int32_t>>>& traces,
                       uint64_t min_rebalances) {
  wait_lockstep(group);
  const int32_t n = group.num_ranks();
  std::vector<RankEplb> ranks;
  for (int32_t r = 0; r < n; ++r) ranks.push_back(read_eplb(group, r));
  EXPECT_NO_THROW(group.check_integrity());
  const RankEplb& first = ranks.front();
  EXPECT_GE(first.stats.rebalances, min_rebalances);
  EXPECT_EQ(first.history.size(), first.stats.rebalances);
  for (int32_t r = 1; r < n; ++r) {
    const RankEplb& rk = ranks[static_cast<size_t>(r)];
    EXPECT_EQ(rk.stats.rebalances, first.stats.rebalances) << "rank " << r;
    EXPECT_TRUE(rk.history == first.history) << "rank " << r << " re-placed differently";
    EXPECT_TRUE(rk.placements == first.placements) << "rank " << r;
    EXPECT_EQ(rk.window, first.window) << "rank " << r << " planned from other loads";
    EXPECT_EQ(rk.steps, first.steps) << "rank " << r << " counted other EPLB steps";
  }
  // Replicas landed on some hot expert.
  bool replicated = false;
  for (const parallel::ExpertPlacement& p : first.placements)
    for (int32_t x = 0; x < p.num_experts(); ++x) replicated = replicated || p.num_replicas(x) > 1;
  EXPECT_TRUE(replicated) << "no expert got a second replica";

  const int32_t layers = static_cast<int32_t>(first.counts.size());
  const int32_t experts = static_cast<int32_t>(first.counts.front().size());
  const int32_t top_k = group.rank(0).model().moe_blocks().front()->routing.top_k;
  int64_t forwarded = 0;  // tokens through the model on every rank: prompt (not cached), decode
  for (int32_t r = 0; r < n; ++r) {
    const EngineStats st = group.rank_stats(r);
    EXPECT_EQ(st.preemptions, 0u);
    forwarded +=
        static_cast<int64_t>(st.prompt_tokens - st.cached_prompt_tokens + st.generated_tokens -
                             st.requests_finished + st.padding_steps);
  }
  for (int32_t l = 0; l < layers; ++l) {
    std::vector<int64_t> recount(static_cast<size_t>(experts), 0), sum(recount);
    for (int32_t r = 0; r < n; ++r) {
      for (int32_t x : traces[static_cast<size_t>(r)][static_cast<size_t>(l)]) {
        ASSERT_TRUE(x >= 0 && x < experts);
        ++recount[static_cast<size_t>(x)];
      }
      for (int32_t x = 0; x < experts; ++x) {
        sum[static_cast<size_t>(x)] +=
            ranks[static_cast<size_t>(r)].counts[static_cast<size_t>(l)][static_cast<size_t>(x)];
      }
    }
    EXPECT_EQ(sum, recount) << "layer " << l;
    int64_t total = 0;
    for (int64_t c : sum) total += c;
    EXPECT_EQ(total, forwarded * top_k) << "layer " << l;
  }
}

// Prompts made of one repeated token load few experts: replicas go there.
Workload skewed_workload(int64_t vocab, uint64_t id_base) {
  Workload w = workload(vocab, id_base);
  for (size_t i = 0; i < w.first.size(); i += 3) {
    std::fill(w.first[i].prompt.begin(), w.first[i].prompt.end(), 7 + static_cast<int32_t>(i));
  }
  std::fill(w.late[0].prompt.begin(), w.late[0].prompt.end(), 11);
  return w;
}

class DpEplbGolden : public ::testing::TestWithParam<std::tuple<std::string, int32_t>> {};

// EPLB on in an N-rank group vs a plain engine without EPLB: the same greedy tokens while the
// group re-places its experts several times mid-run (every rank computing only its own physical
// slots), and every rank holds the same placement after each rebalance.
TEST_P(DpEplbGolden, GroupWithEplbEqualsOneEngineWithout) {
  const auto& [model, n] = GetParam();
  auto single = start_engine(config_for(model, 0));
  EngineConfig c = config_for(model, n);
  c.eplb = busy_eplb();
  auto engine = start_engine(c);
  ASSERT_TRUE(single && engine);
  auto* group = dynamic_cast<DpEngineGroup*>(engine.get());
  ASSERT_NE(group, nullptr);
  EXPECT_TRUE(engine->stats().eplb_enabled);
  auto traces = trace_all(*group);
  const Workload w = skewed_workload(single->vocab_size(), 500);

  Collector ref_col, col;
  const auto expected = run(*single, w, ref_col);
  const auto got = run_checked(*group, w, col);
  for (const auto& [id, tokens] : expected) {
    EXPECT_EQ(got.at(id), tokens) << model << " x" << n << " request " << id.value();
    EXPECT_EQ(col.finish(id), EngineFinish::kLength);
  }
  expect_group_eplb(*group, traces, 3);
  EXPECT_EQ(engine->stats().eplb_rebalances, group->rank_stats(0).eplb_rebalances);
  stop_tracing(*group);
}

INSTANTIATE_TEST_SUITE_P(Models, DpEplbGolden,
                         ::testing::Values(std::tuple{"deepseek_v2", 2},
                                           std::tuple{"deepseek_v3", 2}, std::tuple{"qwen3_moe", 2},
                                           std::tuple{"qwen3_moe", 3}));

// One request on a 2-rank group: rank 1 only pads (no token of its own) through every rebalance,
// yet plans from the group's loads and re-places exactly like rank 0.
TEST(DpEngineGroupEplb, AnIdleRankRebalancesWithTheGroup) {
  auto single = start_engine(config_for("deepseek_v3", 0));
  EngineConfig c = config_for("deepseek_v3", 2);
  c.eplb = busy_eplb();
  auto engine = start_engine(c);
  ASSERT_TRUE(single && engine);
  auto* group = dynamic_cast<DpEngineGroup*>(engine.get());
  auto traces = trace_all(*group);
  std::vector<int32_t> prompt = random_tokens(40, single->vocab_size(), 9);
  std::fill(prompt.begin(), prompt.begin() + 20, 5);  // skew
  const EngineRequest req = greedy_request(1, prompt, 24);
  Collector ref_col, col;
  ASSERT_TRUE(single->submit(req, ref_col.sink(req.id)).is_ok());
  ASSERT_TRUE(engine->submit(req, col.sink(req.id)).is_ok());
  ASSERT_TRUE(ref_col.wait_all() && col.wait_all());
  EXPECT_EQ(col.tokens(req.id), ref_col.tokens(req.id));
  expect_group_eplb(*group, traces, 3);
  EXPECT_EQ(group->rank_stats(1).steps, 0u);
  EXPECT_EQ(group->rank_stats(1).padding_steps, group->group_steps());
  stop_tracing(*group);
}

// A step that fails on rank 1 mid-exchange (bad physical expert weights) with EPLB on: no rank
// waits forever (in the exchange or in the load all-reduce at the per-step prefill buckets), every
// request ends kError, the ranks' EPLB steps stay aligned, and after the repair the group serves
// again with the single engine's tokens and identical windows on both ranks.
TEST(DpEngineGroupEplb, AFailedStepKeepsTheRanksInLockstep) {
  auto single = start_engine(config_for("qwen3_moe", 0));
  EngineConfig c = config_for("qwen3_moe", 2);
  c.eplb.enabled = true;  // default periods: no rebalance, but a load all-reduce every prefill step
  auto engine = start_engine(c);
  ASSERT_TRUE(single && engine);
  auto* group = dynamic_cast<DpEngineGroup*>(engine.get());
  MoeEplbState* state = group->rank(1).model().moe_blocks()[0]->eplb;
  ASSERT_NE(state, nullptr);
  const Tensor good = state->physical.down;
  state->physical.down = Tensor::zeros({good.size(0), good.size(1) + 1, good.size(2)}, DType::kF32);
  const int64_t vocab = engine->vocab_size();
  ASSERT_NO_FATAL_FAILURE(expect_four_requests_fail(*engine));
  state->physical.down = good;  // the ranks are idle
  const Workload w = workload(vocab, 40);
  Collector ref_col, col2;
  EXPECT_EQ(run(*engine, w, col2), run(*single, w, ref_col));
  // No wait_lockstep: the failed steps count as neither steps nor padding steps. Every rank was in
  // the last step (its exchange needs them all), and with_eplb waits for a step to end.
  const RankEplb r0 = read_eplb(*group, 0), r1 = read_eplb(*group, 1);
  EXPECT_EQ(r0.steps, r1.steps);
  EXPECT_GT(r0.steps[0], 0);
  EXPECT_EQ(r0.window, r1.window);
  EXPECT_NO_THROW(engine->check_integrity());
}

// A rank whose EPLB steps got out of line (here: one extra step closed by hand) would wait in a
// load all-reduce the others never reach. The step agreement catches it first: the steps fail on
// every rank with a message, nothing hangs.
TEST(DpEngineGroupEplb, RanksAtDifferentEplbStepsFailInsteadOfHanging) {
  EngineConfig c = config_for("qwen3_moe", 2);
  c.eplb = busy_eplb();
  auto engine = start_engine(c);
  ASSERT_TRUE(engine);
  auto* group = dynamic_cast<DpEngineGroup*>(engine.get());
  group->rank(1).with_eplb([](EplbRuntime* e) {
    e->begin_step(EplbPhase::kDecode);
    e->end_step();
  });
  Collector col;
  const EngineRequest r = greedy_request(1, random_tokens(10, engine->vocab_size(), 3), 4);
  ASSERT_TRUE(engine->submit(r, col.sink(r.id)).is_ok());
  ASSERT_TRUE(col.wait_all(std::chrono::seconds(30))) << "the group hung";
  EXPECT_EQ(col.finish(r.id), EngineFinish::kError);
  EXPECT_NO_THROW(engine->check_integrity());
}

TEST(DpEngineGroup, DenseModelRunsIndependentRanks) {
  auto single = start_engine(config_for("qwen3", 0));
  auto engine = start_engine(config_for("qwen3", 2));
  ASSERT_TRUE(single && engine);
  auto* group = dynamic_cast<DpEngineGroup*>(engine.get());
  EXPECT_FALSE(group->expert_parallel());
  const Workload w = workload(engine->vocab_size(), 50);
  Collector ref_col, col;
  EXPECT_EQ(run(*engine, w, col), run(*single, w, ref_col));
  EXPECT_EQ(group->rank_stats(0).padding_steps + group->rank_stats(1).padding_steps, 0u);
  EXPECT_EQ(engine->stats().kv_blocks_used, 0);
  EXPECT_NO_THROW(engine->check_integrity());
}

TEST(DpEngineGroup, RejectsBadConfigs) {
  EngineConfig c = config_for("qwen3", 2);  // dense
  c.eplb.enabled = true;
  auto r = Engine::start(c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("MoE"), std::string::npos) << r.status().to_string();
  c = config_for("qwen3_moe", 2);
  c.eplb.enabled = true;
  c.eplb.ep_ranks = 4;  // the group's EPLB plans over its 2 ranks
  r = Engine::start(c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("--ep-ranks"), std::string::npos) << r.status().to_string();
  c = config_for("qwen3_moe", 9);  // 8 routed experts
  r = Engine::start(c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("routed experts"), std::string::npos);
  c = config_for("qwen3_moe", -1);
  EXPECT_FALSE(Engine::start(c).is_ok());
  c = config_for("qwen3_moe", 2);
  c.num_blocks = 0;
  c.kv_cache_bytes = 0;  // rank 0 fails to size its pool: nothing hangs
  r = Engine::start(c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("DP rank 0"), std::string::npos) << r.status().to_string();
}

}  // namespace
}  // namespace di
