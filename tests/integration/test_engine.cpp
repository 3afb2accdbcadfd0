// The serving engine loop on the real golden models (CPU backend), through the public Engine API:
// greedy output equals the offline Generator (and so HF transformers); differential tests for
// prefix-cache hit vs miss, chunked vs whole prefill, alone vs batched, seeded sampling, n > 1
// forks, preemption under a tiny pool; aborts, finishes, validation, shutdown, and a concurrent
// stress run that must end with every block free and every invariant intact; the engine's device
// sampling path (emulated on the CPU) against its host path.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "backend/backend.h"
#include "backend/profiling_backend.h"
#include "engine/engine.h"
#include "engine/engine_loop.h"
#include "engine/generator.h"
#include "engine_test_util.h"
#include "golden_util.h"
#include "model/model.h"
#include "sampling/sampler.h"

namespace di {
namespace {

using testing::fixture;
using testing::golden_model_dirs;
using testing::greedy_request;
using testing::random_tokens;
using testing::source_dir;
using testing::start_engine;
using Clock = std::chrono::steady_clock;

// Thread-safe record of every event, by request; waits until every sample has finished.
class Collector {
 public:
  TokenSink sink(RequestId id, int32_t n) {
    {
      std::lock_guard lock(mu_);
      open_[id] += n;
    }
    return [this](const TokenEvent& e) {
      std::lock_guard lock(mu_);
      events_[e.id].push_back(e);
      if (e.finish != EngineFinish::kNone && --open_[e.id] == 0) cv_.notify_all();
    };
  }
  // Never-submitted sinks (rejected requests) must not be waited for.
  void forget(RequestId id, int32_t n) {
    std::lock_guard lock(mu_);
    open_[id] -= n;
  }
  bool wait_all(std::chrono::seconds timeout = std::chrono::seconds(300)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] {
      for (const auto& [id, n] : open_)
        if (n != 0) return false;
      return true;
    });
  }
  bool wait(RequestId id, std::chrono::seconds timeout = std::chrono::seconds(300)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return open_[id] == 0; });
  }
  std::vector<TokenEvent> events(RequestId id) {
    std::lock_guard lock(mu_);
    return events_[id];
  }
  size_t num_events(RequestId id) {
    std::lock_guard lock(mu_);
    return events_[id].size();
  }
  // Tokens of one sample, in order.
  std::vector<int32_t> tokens(RequestId id, int32_t sample_idx = 0) {
    std::vector<int32_t> out;
    for (const TokenEvent& e : events(id))
      if (e.sample_idx == sample_idx && e.token >= 0) out.push_back(e.token);
    return out;
  }
  TokenEvent final_event(RequestId id, int32_t sample_idx = 0) {
    for (const TokenEvent& e : events(id))
      if (e.sample_idx == sample_idx && e.finish != EngineFinish::kNone) return e;
    ADD_FAILURE() << "request " << id.value() << " sample " << sample_idx << " has no final event";
    return {};
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<RequestId, int32_t> open_;
  std::map<RequestId, std::vector<TokenEvent>> events_;
};

EngineConfig small_config(const std::string& model, int32_t block_size = 16,
                          int32_t num_blocks = 256) {
  EngineConfig c;
  c.model_dir = fixture(model);
  c.block_size = block_size;
  c.num_blocks = num_blocks;
  return c;
}

// Holds the engine loop inside a token sink until the test opens it: the sinks run on the loop's
// thread with no lock held, so while one waits here the engine takes no step, and what the test
// submits meanwhile is in the inbox at the next one. A scenario that needs "request A is still
// running when B arrives" uses this instead of hoping the loop is slower than the test thread.
class Gate {
 public:
  ~Gate() { open(); }  // a failed ASSERT must not leave the engine thread waiting
  // Delivers each event, then waits at the gate after the one with `at_tokens` output tokens.
  TokenSink hold(TokenSink inner, int32_t at_tokens = 1) {
    return [inner = std::move(inner), open = open_, at_tokens](const TokenEvent& ev) {
      inner(ev);
      if (ev.num_output_tokens == at_tokens && ev.token >= 0) open.wait();
    };
  }
  void open() {
    if (!opened_.exchange(true)) promise_.set_value();
  }

 private:
  std::promise<void> promise_;
  std::shared_future<void> open_ = promise_.get_future().share();
  std::atomic<bool> opened_{false};
};

// Submits and waits; returns the collector's view of the request.
void run_one(Engine& e, Collector& c, EngineRequest r) {
  const RequestId id = r.id;
  const int32_t n = r.n;
  Status st = e.submit(std::move(r), c.sink(id, n));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  ASSERT_TRUE(c.wait(id)) << "request " << id.value() << " did not finish";
}

void expect_all_free(const Engine& e) {
  EXPECT_NO_THROW(e.check_integrity());
  EngineStats s = e.stats();
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.num_waiting, 0);
}

double log_softmax_at(const std::vector<float>& logits, int32_t token) {
  double m = -INFINITY;
  for (float x : logits) m = std::max(m, static_cast<double>(x));
  double s = 0.0;
  for (float x : logits) s += std::exp(static_cast<double>(x) - m);
  return static_cast<double>(logits[static_cast<size_t>(token)]) - m - std::log(s);
}

// ---------------------------------------------------------------------------------------------

class EngineGolden : public ::testing::TestWithParam<std::string> {};

// All golden prompts submitted at once; tokens must equal HF's greedy continuation and the
// Generator's; the first token's raw logprob must equal log_softmax of the Generator's logits.
TEST_P(EngineGolden, GreedyEqualsGeneratorAndTransformers) {
  std::ifstream f(GetParam() + "/golden.json");
  auto golden = nlohmann::json::parse(f);
  // The fixture's model: the directory itself, or "model_dir" (the shipped demo model).
  const std::string dir = testing::golden_model_path(GetParam(), golden.value("model_dir", ""));
  const auto prompts = golden["prompts"].get<std::vector<std::vector<int32_t>>>();
  const auto greedy = golden["greedy"].get<std::vector<std::vector<int32_t>>>();
  ASSERT_FALSE(prompts.empty());

  std::vector<GenerateResult> expected;
  {
    auto be = make_cpu_backend();
    auto model = load_model(dir, *be);
    std::vector<GenerateRequest> reqs;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerateRequest r;
      r.prompt = prompts[i];
      r.max_tokens = static_cast<int32_t>(greedy[i].size());
      reqs.push_back(r);
    }
    Generator gen(*model, *be, GeneratorOptions{});
    expected = gen.generate(reqs);
  }

  EngineConfig c;
  c.model_dir = dir;
  c.block_size = 16;
  c.num_blocks = 64;
  auto engine = start_engine(c);
  ASSERT_TRUE(engine);
  Collector col;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest r = greedy_request(i + 1, prompts[i], static_cast<int32_t>(greedy[i].size()));
    r.logprobs = true;
    ASSERT_TRUE(engine->submit(std::move(r), col.sink(RequestId(i + 1), 1)).is_ok());
  }
  ASSERT_TRUE(col.wait_all());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const RequestId id(i + 1);
    EXPECT_EQ(col.tokens(id), greedy[i]) << dir << " prompt " << i << " vs transformers";
    EXPECT_EQ(col.tokens(id), expected[i].output) << dir << " prompt " << i << " vs Generator";
    auto events = col.events(id);
    ASSERT_EQ(events.size(), greedy[i].size());
    const double want = log_softmax_at(expected[i].last_prompt_logits, events[0].token);
    EXPECT_NEAR(events[0].logprob.logprob, want, 1e-4) << dir << " prompt " << i;
    EXPECT_EQ(events[0].logprob.token, events[0].token);
    TokenEvent last = events.back();
    EXPECT_EQ(last.finish, EngineFinish::kLength);
    EXPECT_EQ(last.num_prompt_tokens, static_cast<int32_t>(prompts[i].size()));
    EXPECT_EQ(last.num_output_tokens, static_cast<int32_t>(greedy[i].size()));
    EXPECT_EQ(last.num_cached_tokens, 0);
  }
  expect_all_free(*engine);
  EngineStats s = engine->stats();
  EXPECT_EQ(s.requests_finished, prompts.size());
  uint64_t prompt_tokens = 0, generated = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    prompt_tokens += prompts[i].size();
    generated += greedy[i].size();
  }
  EXPECT_EQ(s.prompt_tokens, prompt_tokens);
  EXPECT_EQ(s.generated_tokens, generated);
  EXPECT_GT(s.steps, 0u);
}

std::string name_of(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = std::filesystem::path(info.param).filename().string();
  for (auto& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineGolden, ::testing::ValuesIn(golden_model_dirs()), name_of);

// ---------------------------------------------------------------------------------------------

struct SampleRun {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  TokenEvent last;
};

SampleRun collect(Collector& c, RequestId id, int32_t sample_idx = 0) {
  SampleRun r;
  for (const TokenEvent& e : c.events(id)) {
    if (e.sample_idx != sample_idx) continue;
    if (e.token >= 0) {
      r.tokens.push_back(e.token);
      r.logprobs.push_back(e.logprob);
    }
    if (e.finish != EngineFinish::kNone) r.last = e;
  }
  return r;
}

void expect_logprobs_near(const SampleRun& a, const SampleRun& b, double tol,
                          const std::string& what) {
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << what;
  for (size_t i = 0; i < a.logprobs.size(); ++i) {
    EXPECT_NEAR(a.logprobs[i].logprob, b.logprobs[i].logprob, tol) << what << " token " << i;
    ASSERT_EQ(a.logprobs[i].top.size(), b.logprobs[i].top.size()) << what;
    for (size_t k = 0; k < a.logprobs[i].top.size(); ++k) {
      EXPECT_EQ(a.logprobs[i].top[k].first, b.logprobs[i].top[k].first) << what << " token " << i;
      EXPECT_NEAR(a.logprobs[i].top[k].second, b.logprobs[i].top[k].second, tol)
          << what << " token " << i;
    }
  }
}

class EnginePrefix : public ::testing::TestWithParam<std::string> {};

// A second request sharing a 200-token prefix hits the cache for its 12 full 16-token blocks and
// gets the same tokens and logprobs as with prefix caching off.
TEST_P(EnginePrefix, CacheHitEqualsMiss) {
  const std::string model = GetParam();
  const int64_t vocab = 997;  // below every fixture's vocabulary
  const std::vector<int32_t> shared = random_tokens(200, vocab, 7);
  std::vector<int32_t> a = shared, b = shared;
  for (int32_t t : random_tokens(9, vocab, 8)) a.push_back(t);
  for (int32_t t : random_tokens(21, vocab, 9)) b.push_back(t);
  const int32_t kBlock = 16, kShared = 200 / kBlock * kBlock;  // 192

  auto request = [&](uint64_t id, const std::vector<int32_t>& prompt) {
    EngineRequest r = greedy_request(id, prompt, 16);
    r.sampling.top_logprobs = 5;
    return r;
  };
  SampleRun hit, miss, first;
  {
    auto engine = start_engine(small_config(model, kBlock));
    ASSERT_TRUE(engine);
    Collector c;
    run_one(*engine, c, request(1, a));
    run_one(*engine, c, request(2, b));
    first = collect(c, RequestId(1));
    hit = collect(c, RequestId(2));
    EXPECT_EQ(first.last.num_cached_tokens, 0);
    EXPECT_EQ(hit.last.num_cached_tokens, kShared);
    EngineStats s = engine->stats();
    EXPECT_EQ(s.cached_prompt_tokens, static_cast<uint64_t>(kShared));
    EXPECT_EQ(s.prompt_tokens, a.size() + b.size());
    EXPECT_GT(s.kv_blocks_cached, 0);
    expect_all_free(*engine);
  }
  {
    EngineConfig cfg = small_config(model, kBlock);
    cfg.enable_prefix_caching = false;
    auto engine = start_engine(cfg);
    ASSERT_TRUE(engine);
    Collector c;
    run_one(*engine, c, request(1, a));
    run_one(*engine, c, request(2, b));
    miss = collect(c, RequestId(2));
    EXPECT_EQ(miss.last.num_cached_tokens, 0);
    EXPECT_EQ(engine->stats().cached_prompt_tokens, 0u);
    expect_all_free(*engine);
  }
  EXPECT_EQ(hit.tokens, miss.tokens);
  ASSERT_EQ(hit.tokens.size(), 16u);
  expect_logprobs_near(hit, miss, 1e-4, model + " hit vs miss");
  ASSERT_EQ(hit.logprobs[0].top.size(), 5u);
}

INSTANTIATE_TEST_SUITE_P(Models, EnginePrefix,
                         ::testing::Values("llama_untied", "qwen3_moe", "deepseek_v2",
                                           "deepseek_v3"));

// ---------------------------------------------------------------------------------------------

// Runs `prompts` (greedy, all submitted at once) on a fresh engine and returns each request's run.
std::vector<SampleRun> run_batch(const EngineConfig& cfg,
                                 const std::vector<std::vector<int32_t>>& prompts,
                                 int32_t max_tokens, EngineStats* stats = nullptr) {
  auto engine = start_engine(cfg);
  if (!engine) return {};
  Collector c;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest r = greedy_request(i + 1, prompts[i], max_tokens);
    r.logprobs = true;
    EXPECT_TRUE(engine->submit(std::move(r), c.sink(RequestId(i + 1), 1)).is_ok());
  }
  EXPECT_TRUE(c.wait_all());
  std::vector<SampleRun> out;
  for (size_t i = 0; i < prompts.size(); ++i) out.push_back(collect(c, RequestId(i + 1)));
  expect_all_free(*engine);
  if (stats) *stats = engine->stats();
  return out;
}

// Every architecture (dense GQA, MoE on GQA, MLA with and without q_lora): the chunk boundaries
// must not change a token or a logprob.
TEST(Engine, ChunkedPrefillEqualsWholePrefill) {
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t n : {1, 7, 33, 70, 150}) prompts.push_back(random_tokens(n, 997, 100 + n));
  for (const char* model : {"qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3"}) {
    EngineConfig whole = small_config(model);
    EngineConfig chunked = small_config(model);
    chunked.max_batched_tokens = 7;
    EngineStats chunked_stats;
    auto a = run_batch(whole, prompts, 12);
    auto b = run_batch(chunked, prompts, 12, &chunked_stats);
    ASSERT_EQ(a.size(), prompts.size());
    ASSERT_EQ(b.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(a[i].tokens, b[i].tokens) << model << " prompt " << i;
      expect_logprobs_near(a[i], b[i], 1e-4, std::string(model) + " chunked");
    }
    // 261 prompt tokens + 5 x 11 decodes at <= 7 tokens per step.
    EXPECT_GE(chunked_stats.steps, (261u + 55u) / 7u) << model;
  }
}

// `serve --random-weights`: a directory with only config.json runs, deterministically for a seed,
// differently for another seed; a directory whose config.json is missing is a clear error.
TEST(Engine, RandomWeightsFromConfigOnly) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "deepinfer_random_weights_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(fixture("deepseek_v3") + "/config.json", dir / "config.json");
  std::vector<std::vector<int32_t>> prompts{random_tokens(9, 997, 5), random_tokens(40, 997, 6)};
  EngineConfig c = small_config("deepseek_v3");
  c.model_dir = dir.string();
  c.random_weights = true;
  auto a = run_batch(c, prompts, 8);
  auto b = run_batch(c, prompts, 8);
  c.random_seed = 2;
  auto other = run_batch(c, prompts, 8);
  ASSERT_EQ(a.size(), prompts.size());
  ASSERT_EQ(other.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(a[i].tokens.size(), 8u);
    EXPECT_EQ(a[i].tokens, b[i].tokens) << "prompt " << i;
  }
  EXPECT_NE(a[0].tokens, other[0].tokens);
  fs::remove(dir / "config.json");
  EngineConfig missing = c;
  auto r = Engine::start(missing);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("config.json"), std::string::npos) << r.status().to_string();
  fs::remove_all(dir);
}

// Batch 1 vs 16 on every architecture: the MoE models route each token alone (a batch changes
// which experts run together, not any token's sums) and MLA attends each sequence alone.
class EngineBatch : public ::testing::TestWithParam<const char*> {};

TEST_P(EngineBatch, AloneEqualsBatchOf16) {
  const std::string model = GetParam();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 16; ++i) prompts.push_back(random_tokens(5 + 9 * i, 997, 200 + i));
  auto batched = run_batch(small_config(model), prompts, 10);
  ASSERT_EQ(batched.size(), 16u);
  auto engine = start_engine(small_config(model));
  ASSERT_TRUE(engine);
  Collector c;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest r = greedy_request(i + 1, prompts[i], 10);
    r.logprobs = true;
    run_one(*engine, c, std::move(r));
    const SampleRun alone = collect(c, RequestId(i + 1));
    EXPECT_EQ(alone.tokens, batched[i].tokens) << model << " prompt " << i;
    expect_logprobs_near(alone, batched[i], 1e-4, model + " alone vs batch");
  }
}

INSTANTIATE_TEST_SUITE_P(Models, EngineBatch,
                         ::testing::Values("llama_tied", "qwen3_moe", "deepseek_v2", "deepseek_v3"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

EngineRequest sampled_request(uint64_t id, std::vector<int32_t> prompt, uint64_t seed,
                              int32_t max_tokens) {
  EngineRequest r;
  r.id = RequestId(id);
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 1.0f;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = seed;
  return r;
}

// Same seed, same tokens alone or in a batch of other sampled requests; equal to the offline
// Generator with the same settings; a different seed gives different tokens.
TEST(Engine, SeededSamplingIsBatchInvariant) {
  const std::string model = "qwen3";
  const std::vector<int32_t> prompt = random_tokens(40, 997, 300);
  constexpr int32_t kTokens = 20;
  std::vector<int32_t> alone, other_seed, batched;
  {
    auto engine = start_engine(small_config(model));
    ASSERT_TRUE(engine);
    Collector c;
    run_one(*engine, c, sampled_request(1, prompt, 1234, kTokens));
    run_one(*engine, c, sampled_request(2, prompt, 999, kTokens));
    alone = c.tokens(RequestId(1));
    other_seed = c.tokens(RequestId(2));
    for (int i = 0; i < 12; ++i) {
      ASSERT_TRUE(engine
                      ->submit(sampled_request(10 + i, random_tokens(3 + 5 * i, 997, 400 + i),
                                               77 + i, kTokens),
                               c.sink(RequestId(10 + i), 1))
                      .is_ok());
      if (i == 5) {
        ASSERT_TRUE(
            engine->submit(sampled_request(3, prompt, 1234, kTokens), c.sink(RequestId(3), 1))
                .is_ok());
      }
    }
    ASSERT_TRUE(c.wait_all());
    batched = c.tokens(RequestId(3));
  }
  ASSERT_EQ(alone.size(), static_cast<size_t>(kTokens));
  EXPECT_EQ(alone, batched);
  EXPECT_NE(alone, other_seed);

  auto be = make_cpu_backend();
  auto m = load_model(fixture(model), *be);
  GenerateRequest g;
  g.prompt = prompt;
  g.max_tokens = kTokens;
  g.temperature = 1.0f;
  g.top_p = 0.95f;
  g.seed = 1234;
  Generator gen(*m, *be, GeneratorOptions{});
  EXPECT_EQ(gen.generate({g}).at(0).output, alone);
}

// n = 4 samples share the prompt's blocks (a partial last block: copy-on-write); sample k equals
// an n = 1 request seeded with sample_seed(seed, k), which recomputes the prompt on its own.
TEST(Engine, ParallelSamplesShareThePrompt) {
  const std::string model = "deepseek_v2";
  const std::vector<int32_t> prompt = random_tokens(37, 997, 500);  // 2 full blocks + 5 tokens
  constexpr int32_t kN = 4, kTokens = 14;
  EngineConfig cfg = small_config(model);
  cfg.enable_prefix_caching = false;  // the singles must not reuse the group's blocks
  auto engine = start_engine(cfg);
  ASSERT_TRUE(engine);
  Collector c;
  EngineRequest group = sampled_request(1, prompt, 42, kTokens);
  group.n = kN;
  run_one(*engine, c, group);
  std::set<std::vector<int32_t>> distinct;
  for (int32_t k = 0; k < kN; ++k) {
    SampleRun s = collect(c, RequestId(1), k);
    ASSERT_EQ(s.tokens.size(), static_cast<size_t>(kTokens)) << "sample " << k;
    EXPECT_EQ(s.last.finish, EngineFinish::kLength);
    EXPECT_EQ(s.last.num_output_tokens, kTokens);
    EXPECT_EQ(s.last.num_prompt_tokens, 37);
    distinct.insert(s.tokens);
    run_one(*engine, c, sampled_request(10 + k, prompt, sample_seed(42, k), kTokens));
    EXPECT_EQ(c.tokens(RequestId(10 + k)), s.tokens) << "sample " << k;
  }
  EXPECT_EQ(distinct.size(), static_cast<size_t>(kN));
  EXPECT_EQ(engine->stats().requests_finished, 1u + kN);
  EXPECT_EQ(engine->stats().generated_tokens, 2u * kN * kTokens);
  expect_all_free(*engine);
}

// A pool too small for the batch forces recompute preemption; nothing is lost or changed.
TEST(Engine, PreemptionUnderATinyPoolLosesNothing) {
  const std::string model = "qwen3_moe";
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(random_tokens(10 + i, 997, 600 + i));
  EngineStats big_stats, tiny_stats;
  auto big = run_batch(small_config(model, 4, 256), prompts, 30, &big_stats);
  // 8 sequences of up to 47 tokens need 12 blocks of 4 each; 24 blocks hold two of them.
  EngineConfig tiny = small_config(model, 4, 24);
  tiny.enable_prefix_caching = false;
  auto small = run_batch(tiny, prompts, 30, &tiny_stats);
  ASSERT_EQ(big.size(), prompts.size());
  ASSERT_EQ(small.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(big[i].tokens, small[i].tokens) << "prompt " << i;
    EXPECT_EQ(small[i].last.num_output_tokens, 30);
  }
  EXPECT_EQ(big_stats.preemptions, 0u);
  EXPECT_GT(tiny_stats.preemptions, 0u);
}

// A stop token id ends the sample with kStop at its first occurrence; the token is reported.
TEST(Engine, StopTokenIdsEndWithStop) {
  auto engine = start_engine(small_config("qwen3"));
  ASSERT_TRUE(engine);
  Collector c;
  const std::vector<int32_t> prompt = random_tokens(12, 997, 77);
  run_one(*engine, c, greedy_request(1, prompt, 12));
  const std::vector<int32_t> free_run = c.tokens(RequestId(1));
  ASSERT_EQ(free_run.size(), 12u);
  const int32_t stop = free_run[4];
  const size_t first =
      static_cast<size_t>(std::find(free_run.begin(), free_run.end(), stop) - free_run.begin());
  EngineRequest r = greedy_request(2, prompt, 12);
  r.stop_token_ids = {stop, 100000};
  run_one(*engine, c, r);
  const std::vector<int32_t> stopped = c.tokens(RequestId(2));
  EXPECT_EQ(stopped, std::vector<int32_t>(free_run.begin(), free_run.begin() + first + 1));
  TokenEvent f = c.final_event(RequestId(2));
  EXPECT_EQ(f.finish, EngineFinish::kStop);
  EXPECT_EQ(f.token, stop);
  EXPECT_EQ(f.num_output_tokens, static_cast<int32_t>(first + 1));
  expect_all_free(*engine);
}

// ---------------------------------------------------------------------------------------------

TEST(Engine, AbortAndFinishFreeEverything) {
  auto engine = start_engine(small_config("llama_untied"));
  ASSERT_TRUE(engine);
  Collector c;
  // A long generation, aborted from the test thread after a few tokens.
  // Its first token holds the engine until requests 2 and 3 are submitted, its 5th until the
  // test has sent the abort and the finish below: neither can come after request 1 or 3 ran to
  // its 200 tokens, however the threads are scheduled.
  Gate started, sent;
  ASSERT_TRUE(engine
                  ->submit(greedy_request(1, random_tokens(20, 997, 1), 200),
                           started.hold(sent.hold(c.sink(RequestId(1), 1), 5), 1))
                  .is_ok());
  // Aborted from inside its own sink (on the engine thread) at its 3rd token.
  Engine* e = engine.get();
  TokenSink inner = c.sink(RequestId(2), 1);
  ASSERT_TRUE(engine
                  ->submit(greedy_request(2, random_tokens(30, 997, 2), 200),
                           [inner, e](const TokenEvent& ev) {
                             inner(ev);
                             if (ev.token >= 0 && ev.num_output_tokens == 3) e->abort(ev.id);
                           })
                  .is_ok());
  // Finished (a stop string matched) from the test thread.
  ASSERT_TRUE(
      engine->submit(greedy_request(3, random_tokens(25, 997, 3), 200), c.sink(RequestId(3), 1))
          .is_ok());
  started.open();
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while ((c.num_events(RequestId(1)) < 5 || c.num_events(RequestId(3)) < 1) &&
         Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  engine->abort(RequestId(1));
  engine->finish(RequestId(3));
  engine->abort(RequestId(12345));  // unknown: a no-op
  sent.open();
  ASSERT_TRUE(c.wait_all());
  engine->abort(RequestId(1));  // already ended: a no-op
  engine->finish(RequestId(3));

  SampleRun r1 = collect(c, RequestId(1)), r2 = collect(c, RequestId(2)),
            r3 = collect(c, RequestId(3));
  EXPECT_EQ(r1.last.finish, EngineFinish::kAbort);
  EXPECT_EQ(r1.last.token, -1);
  EXPECT_GE(r1.tokens.size(), 5u);
  EXPECT_LT(r1.tokens.size(), 200u);
  EXPECT_EQ(r1.last.num_output_tokens, static_cast<int32_t>(r1.tokens.size()));
  EXPECT_EQ(r2.last.finish, EngineFinish::kAbort);
  EXPECT_EQ(r2.tokens.size(), 3u);
  EXPECT_EQ(r2.last.num_output_tokens, 3);
  EXPECT_EQ(r3.last.finish, EngineFinish::kStop);
  EXPECT_EQ(r3.last.num_output_tokens, static_cast<int32_t>(r3.tokens.size()));
  EXPECT_LT(r3.tokens.size(), 200u);
  for (RequestId id : {RequestId(1), RequestId(2), RequestId(3)}) {
    int finals = 0;
    for (const TokenEvent& ev : c.events(id)) finals += ev.finish != EngineFinish::kNone;
    EXPECT_EQ(finals, 1) << "request " << id.value();
  }
  expect_all_free(*engine);
  EngineStats s = engine->stats();
  EXPECT_EQ(s.requests_aborted, 2u);
  EXPECT_EQ(s.requests_finished, 1u);
  EXPECT_EQ(s.generated_tokens, r1.tokens.size() + r2.tokens.size() + r3.tokens.size());

  // An ended id may be reused; the engine keeps serving.
  run_one(*engine, c, greedy_request(50, random_tokens(5, 997, 4), 3));
  EXPECT_EQ(c.tokens(RequestId(50)).size(), 3u);
  // The loop sleeps when idle: no steps without work.
  const uint64_t steps = engine->stats().steps;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(engine->stats().steps, steps);
}

// Aborting an n > 1 group in the middle of its chunked prefill (admitted, not forked yet: one
// sequence stands for 3 samples) and a request still waiting behind it: every sample gets
// exactly one kAbort and every block is freed.
TEST(Engine, AbortPrefillingGroupAndWaitingRequest) {
  EngineConfig cfg = small_config("llama_tied", 16, 32);
  cfg.max_batched_tokens = 4;  // a 200-token prompt takes 50 steps
  auto engine = start_engine(cfg);
  ASSERT_TRUE(engine);
  Collector c;
  // Request 0 decodes one token per step beside the group's 3-token chunks; at its 5th token
  // (the group has computed ~12 of its 200 prompt tokens) its sink aborts the other two.
  // Request 0's first token waits at the gate until the other two are submitted, so its 5th
  // token always comes after they are in the engine, however the threads are scheduled.
  Engine* e = engine.get();
  Gate gate;
  TokenSink trigger = gate.hold(c.sink(RequestId(100), 1));
  ASSERT_TRUE(engine
                  ->submit(greedy_request(100, random_tokens(4, 997, 4), 30),
                           [trigger, e](const TokenEvent& ev) {
                             trigger(ev);
                             if (ev.num_output_tokens == 5 && ev.token >= 0) {
                               e->abort(RequestId(1));
                               e->abort(RequestId(2));
                             }
                           })
                  .is_ok());
  EngineRequest group = sampled_request(1, random_tokens(200, 997, 5), 3, 8);
  group.n = 3;
  ASSERT_TRUE(engine->submit(group, c.sink(RequestId(1), 3)).is_ok());
  ASSERT_TRUE(
      engine->submit(greedy_request(2, random_tokens(40, 997, 6), 8), c.sink(RequestId(2), 1))
          .is_ok());
  gate.open();
  ASSERT_TRUE(c.wait_all());
  EXPECT_EQ(c.tokens(RequestId(100)).size(), 30u);
  EXPECT_EQ(engine->stats().steps, 30u);  // the group never finished its prefill
  for (int32_t k = 0; k < 3; ++k) {
    EXPECT_EQ(c.events(RequestId(1)).size(), 3u);
    TokenEvent f = c.final_event(RequestId(1), k);
    EXPECT_EQ(f.finish, EngineFinish::kAbort) << "sample " << k;
    EXPECT_EQ(f.token, -1);
    EXPECT_EQ(f.num_prompt_tokens, 200);
    EXPECT_EQ(f.num_output_tokens, 0);
  }
  ASSERT_EQ(c.events(RequestId(2)).size(), 1u);
  EXPECT_EQ(c.final_event(RequestId(2)).finish, EngineFinish::kAbort);
  expect_all_free(*engine);
  EXPECT_EQ(engine->stats().requests_aborted, 2u);
  EXPECT_EQ(engine->stats().generated_tokens, 30u);
}

TEST(Engine, SubmitRejectsBadRequestsWithoutCallingTheSink) {
  auto engine = start_engine(small_config("llama_untied"));
  ASSERT_TRUE(engine);
  const int64_t vocab = engine->vocab_size();
  EXPECT_EQ(vocab, 997);
  EXPECT_EQ(engine->max_model_len(), 256);
  int calls = 0;
  TokenSink counting = [&calls](const TokenEvent&) { ++calls; };
  auto expect_rejected = [&](EngineRequest r, StatusCode code, const char* what) {
    Status st = engine->submit(std::move(r), counting);
    EXPECT_EQ(st.code(), code) << what << ": " << st.to_string();
    EXPECT_FALSE(st.message().empty()) << what;
  };
  auto ok = [&](uint64_t id) { return greedy_request(id, {1, 2, 3}, 4); };
  EngineRequest r = ok(1);
  r.prompt.clear();
  expect_rejected(r, StatusCode::kInvalidArgument, "empty prompt");
  r = ok(1);
  r.prompt[1] = static_cast<int32_t>(vocab);
  expect_rejected(r, StatusCode::kInvalidArgument, "id == vocab");
  r = ok(1);
  r.prompt[0] = -1;
  expect_rejected(r, StatusCode::kInvalidArgument, "negative id");
  r = ok(1);
  r.prompt.assign(250, 5);
  r.max_tokens = 7;
  expect_rejected(r, StatusCode::kInvalidArgument, "prompt + max_tokens > max_model_len");
  r = ok(1);
  r.max_tokens = 0;
  expect_rejected(r, StatusCode::kInvalidArgument, "max_tokens 0");
  r = ok(1);
  r.n = 0;
  expect_rejected(r, StatusCode::kInvalidArgument, "n 0");
  r = ok(1);
  r.n = 100000;
  expect_rejected(r, StatusCode::kInvalidArgument, "n too large");
  r = ok(1);
  r.sampling.top_p = 0.0f;
  expect_rejected(r, StatusCode::kInvalidArgument, "top_p 0");
  r = ok(1);
  r.sampling.temperature = -1.0f;
  expect_rejected(r, StatusCode::kInvalidArgument, "negative temperature");
  r = ok(1);
  r.sampling.top_logprobs = 21;
  expect_rejected(r, StatusCode::kInvalidArgument, "top_logprobs 21");
  EXPECT_EQ(engine->submit(ok(1), TokenSink{}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(calls, 0);

  // A duplicate of a live id is refused; once the first has ended the id is free again. The
  // first request's tokens wait at the gate, so it is live while the duplicate arrives.
  Collector c;
  Gate gate;
  ASSERT_TRUE(
      engine->submit(greedy_request(7, {1, 2, 3}, 50), gate.hold(c.sink(RequestId(7), 1))).is_ok());
  expect_rejected(greedy_request(7, {4, 5}, 2), StatusCode::kAlreadyExists, "duplicate id");
  gate.open();
  ASSERT_TRUE(c.wait(RequestId(7)));
  run_one(*engine, c, greedy_request(7, {4, 5}, 2));
  EXPECT_EQ(calls, 0);
  expect_all_free(*engine);
}

TEST(Engine, StartRejectsBadConfigs) {
  EngineConfig c = small_config("llama_untied");
  c.model_dir = fixture("no_such_model");
  EXPECT_FALSE(Engine::start(c).is_ok());
  c = small_config("llama_untied");
  c.backend = "tpu";
  EXPECT_FALSE(Engine::start(c).is_ok());
  c = small_config("llama_untied");
  c.max_model_len = 100000;
  EXPECT_FALSE(Engine::start(c).is_ok());
  c = small_config("llama_untied", 16, 4);  // 64 tokens of pool
  c.max_model_len = 65;
  EXPECT_FALSE(Engine::start(c).is_ok());
  c = small_config("llama_untied", 0);
  EXPECT_FALSE(Engine::start(c).is_ok());
  // Pool sized from bytes: llama_untied has 2 layers x 16 tokens x (2 x 2 kv heads x 16) floats.
  c = small_config("llama_untied", 16, 0);
  c.kv_cache_bytes = 1 << 20;
  auto e = Engine::start(c);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  auto be = make_cpu_backend();
  auto m = load_model(fixture("llama_untied"), *be);
  const int64_t block_bytes = m->kv_layout(1, 16).block_stride() * 4;
  EXPECT_EQ(e.value()->stats().kv_blocks_total, (1 << 20) / block_bytes);
  EXPECT_EQ(e.value()->max_model_len(), 256);
}

// A KV pool larger than the memory left after the model is refused with the numbers, before
// the allocator sees it (8 TB here: ~10^9 blocks of 8 KB, more than any test machine has).
TEST(Engine, StartRefusesAKvPoolThatCannotFit) {
  auto be = make_cpu_backend();
  ASSERT_GT(be->available_memory_bytes(), 0);
  EngineConfig c = small_config("llama_untied", 16, 0);
  c.kv_cache_bytes = int64_t{8} << 40;
  auto e = Engine::start(c);
  ASSERT_FALSE(e.is_ok());
  EXPECT_EQ(e.status().code(), StatusCode::kResourceExhausted) << e.status().to_string();
  const std::string msg = e.status().message();
  EXPECT_NE(msg.find("the KV cache pool (1073741824 blocks of 16 tokens, 8796.09 GB) does not fit"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("is available on the cpu backend after loading the model"), std::string::npos)
      << msg;
}

// Destroying the engine ends everything in flight or queued with kAbort.
TEST(Engine, DestructorAbortsOutstandingRequests) {
  Collector c;
  {
    auto engine = start_engine(small_config("qwen3"));
    ASSERT_TRUE(engine);
    for (uint64_t i = 1; i <= 6; ++i) {
      EngineRequest r = greedy_request(i, random_tokens(10 + i, 997, 900 + i), 200);
      r.n = i == 3 ? 2 : 1;
      ASSERT_TRUE(engine->submit(std::move(r), c.sink(RequestId(i), i == 3 ? 2 : 1)).is_ok());
    }
    while (c.num_events(RequestId(1)) < 2)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(c.wait_all(std::chrono::seconds(1)));
  for (uint64_t i = 1; i <= 6; ++i) {
    for (int32_t k = 0; k < (i == 3 ? 2 : 1); ++k) {
      EXPECT_EQ(c.final_event(RequestId(i), k).finish, EngineFinish::kAbort) << i << "/" << k;
    }
  }
}

// 200 requests from 4 threads (greedy and sampled, n up to 3, random lengths), a third of them
// aborted and some finished at random moments, check_integrity() racing the loop from another
// thread. Every sample ends exactly once with consistent usage; every block is free at the end;
// the greedy n = 1 requests that were not ended early equal their runs alone.
TEST(Engine, ConcurrentStressFreesEverything) {
  EngineConfig cfg = small_config("deepseek_v3", 4, 64);  // 256 tokens: preemption happens
  cfg.max_batched_tokens = 64;
  cfg.max_running = 24;
  auto engine = start_engine(cfg);
  ASSERT_TRUE(engine);
  Collector c;
  constexpr int kThreads = 4, kPerThread = 50;
  std::mutex mu;
  std::map<RequestId, EngineRequest> submitted;
  std::set<RequestId> ended_early;
  std::atomic<bool> done{false};
  std::thread checker([&] {
    while (!done) {
      EXPECT_NO_THROW(engine->check_integrity());
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1000 + t);
      for (int i = 0; i < kPerThread; ++i) {
        const uint64_t id = 1 + t * kPerThread + i;
        EngineRequest r;
        r.id = RequestId(id);
        r.prompt = random_tokens(1 + rng() % 40, 997, static_cast<uint32_t>(id));
        r.max_tokens = 1 + static_cast<int32_t>(rng() % 16);
        r.n = rng() % 5 == 0 ? 1 + static_cast<int32_t>(rng() % 3) : 1;
        r.sampling.temperature = rng() % 2 ? 0.0f : 0.9f;
        r.sampling.seed = rng();
        r.priority = static_cast<int32_t>(rng() % 3);
        if (rng() % 4 == 0) r.prompt.insert(r.prompt.begin(), 30, 11);  // shared prefixes
        {
          std::lock_guard lock(mu);
          submitted[r.id] = r;
        }
        ASSERT_TRUE(engine->submit(r, c.sink(r.id, r.n)).is_ok());
        const uint32_t roll = rng() % 6;
        if (roll < 2) {
          std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
          std::lock_guard lock(mu);
          ended_early.insert(r.id);
          if (roll == 0)
            engine->abort(r.id);
          else
            engine->finish(r.id);
        }
        if (rng() % 8 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 5));
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(c.wait_all());
  done = true;
  checker.join();
  expect_all_free(*engine);

  uint64_t generated = 0, aborted = 0;
  for (const auto& [id, r] : submitted) {
    std::vector<int> finals(static_cast<size_t>(r.n), 0), tokens(static_cast<size_t>(r.n), 0);
    bool any_abort = false;
    for (const TokenEvent& ev : c.events(id)) {
      ASSERT_GE(ev.sample_idx, 0);
      ASSERT_LT(ev.sample_idx, r.n);
      EXPECT_EQ(finals[static_cast<size_t>(ev.sample_idx)], 0) << "event after the final one";
      if (ev.token >= 0) ++tokens[static_cast<size_t>(ev.sample_idx)];
      if (ev.finish == EngineFinish::kNone) continue;
      ++finals[static_cast<size_t>(ev.sample_idx)];
      EXPECT_NE(ev.finish, EngineFinish::kError) << ev.error;
      EXPECT_EQ(ev.num_output_tokens, tokens[static_cast<size_t>(ev.sample_idx)]) << id.value();
      EXPECT_EQ(ev.num_prompt_tokens, static_cast<int32_t>(r.prompt.size()));
      EXPECT_LE(ev.num_output_tokens, r.max_tokens);
      if (ev.finish == EngineFinish::kLength) {
        EXPECT_EQ(ev.num_output_tokens, r.max_tokens);
      }
      any_abort |= ev.finish == EngineFinish::kAbort;
      if (!ended_early.contains(id)) {
        EXPECT_TRUE(ev.finish == EngineFinish::kLength || ev.finish == EngineFinish::kStop)
            << id.value();
      }
    }
    for (int32_t k = 0; k < r.n; ++k) {
      EXPECT_EQ(finals[static_cast<size_t>(k)], 1) << "request " << id.value() << " sample " << k;
      generated += static_cast<uint64_t>(tokens[static_cast<size_t>(k)]);
    }
    aborted += any_abort;
  }
  EngineStats s = engine->stats();
  EXPECT_EQ(s.generated_tokens, generated);
  EXPECT_EQ(s.requests_aborted, aborted);
  EXPECT_EQ(s.requests_aborted + s.requests_finished, submitted.size());
  EXPECT_EQ(s.requests_failed, 0u);
  EXPECT_GT(s.preemptions, 0u);
  EXPECT_GT(s.cached_prompt_tokens, 0u);

  // Greedy requests that ran to the end equal their runs alone (batching, preemption and prefix
  // hits changed nothing).
  int checked = 0;
  for (const auto& [id, r] : submitted) {
    if (ended_early.contains(id) || r.n != 1 || r.sampling.temperature != 0.0f) continue;
    if (++checked > 12) break;
    EngineRequest again = r;
    again.id = RequestId(id.value() + 100000);
    run_one(*engine, c, again);
    EXPECT_EQ(c.tokens(again.id), c.tokens(id)) << "request " << id.value();
  }
  EXPECT_GT(checked, 5);
}

// ---------------------------------------------------------------------------------------------
// Device sampling (engine/sample_placement.h). The CPU backend has no device sampler, so every
// step samples on the host. EmulatedDeviceSampler gives it one that keeps Backend::
// sample_on_device's promise (sampling::sample from DeviceSampleRow's fields alone), so the
// engine's device path (logits left where the forward put them, rows handed over, tokens mapped
// back) runs in CI and must reproduce the host path's events exactly.

class EmulatedDeviceSampler final : public ProfilingBackend {
 public:
  explicit EmulatedDeviceSampler(std::unique_ptr<Backend> inner)
      : ProfilingBackend(*inner), owned_(std::move(inner)) {}

  bool can_sample_on_device() const override { return true; }
  std::vector<int32_t> sample_on_device(const Tensor& logits,
                                        std::span<const DeviceSampleRow> rows) override {
    EXPECT_EQ(logits.dim(), 2);
    EXPECT_EQ(logits.size(0), static_cast<int64_t>(rows.size()));
    const int64_t vocab = logits.size(1);
    std::vector<int32_t> tokens;
    for (size_t r = 0; r < rows.size(); ++r) {
      SamplingParams p;
      p.temperature = rows[r].temperature;
      p.top_k = rows[r].top_k;
      p.top_p = rows[r].top_p;
      p.min_p = rows[r].min_p;
      p.seed = rows[r].seed;
      std::span<const float> l(logits.f32() + static_cast<int64_t>(r) * vocab,
                               static_cast<size_t>(vocab));
      tokens.push_back(all_masked ? -1 : sampling::sample_token(l, p, rows[r].position, {}, {}));
    }
    ++calls;
    num_rows += static_cast<int64_t>(rows.size());
    return tokens;
  }

  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> num_rows{0};
  std::atomic<bool> all_masked{false};  // answer -1 (every logit -inf/NaN) for every row

 private:
  std::unique_ptr<Backend> owned_;  // the inner backend the base forwards to
};

// An EngineLoop on the CPU backend wrapped in an EmulatedDeviceSampler (`*sampler` points at it).
std::unique_ptr<Engine> start_emulated(const EngineConfig& c, EmulatedDeviceSampler** sampler) {
  Result<EngineParts> parts = load_engine_parts(c);
  if (!parts.is_ok()) {
    ADD_FAILURE() << parts.status().to_string();
    return nullptr;
  }
  EngineParts& p = parts.value();
  auto backend = std::make_unique<EmulatedDeviceSampler>(std::move(p.backend));
  *sampler = backend.get();
  return std::make_unique<EngineLoop>(c, std::move(backend), std::move(p.model), p.num_blocks,
                                      p.max_model_len);
}

// Greedy and seeded temperature / top-k / top-p / min-p requests (one with n = 2: two rows from
// one logits row), plus a penalty request and a logprobs request that end early: while they run,
// the steps sample on the host; afterwards the device path takes over.
std::vector<EngineRequest> mixed_requests() {
  std::vector<EngineRequest> out;
  uint64_t id = 1;
  auto add = [&](float t, int32_t top_k, float top_p, float min_p, int32_t max_tokens) {
    EngineRequest r = greedy_request(
        id, random_tokens(3 + 7 * static_cast<int64_t>(id), 997, 900 + static_cast<uint32_t>(id)),
        max_tokens);
    r.sampling.temperature = t;
    r.sampling.top_k = top_k;
    r.sampling.top_p = top_p;
    r.sampling.min_p = min_p;
    r.sampling.seed = 1000 + id;
    ++id;
    out.push_back(std::move(r));
    return &out.back();
  };
  add(0.0f, -1, 1.0f, 0.0f, 12);
  add(0.0f, -1, 1.0f, 0.0f, 9);
  add(0.8f, 20, 1.0f, 0.0f, 12);
  add(1.2f, -1, 0.9f, 0.0f, 11);
  add(1.0f, -1, 1.0f, 0.05f, 12);
  add(0.7f, 50, 0.95f, 0.02f, 10);
  add(1.0f, -1, 0.9f, 0.0f, 8)->n = 2;
  // The penalty request outlives the logprobs one, and its penalties change greedy tokens (the
  // tiny models repeat themselves): a device step for it would show in the tokens.
  EngineRequest* pen = add(0.0f, -1, 1.0f, 0.0f, 8);
  pen->sampling.repetition_penalty = 1.5f;
  pen->sampling.frequency_penalty = 1.0f;
  pen->sampling.presence_penalty = 1.0f;
  EngineRequest* lp = add(1.0f, -1, 0.9f, 0.0f, 3);
  lp->logprobs = true;
  lp->sampling.top_logprobs = 2;
  return out;
}

struct MixedRun {
  std::map<RequestId, std::vector<TokenEvent>> events;
  EngineStats stats;
};

// The mix is submitted from the sink of a one-token starter request, on the engine thread before
// it drains its inbox again: the engine admits the whole mix at once, so every run steps through
// the same batches.
MixedRun run_mixed(Engine& engine) {
  Collector c;
  std::vector<EngineRequest> requests = mixed_requests();
  std::vector<TokenSink> sinks;
  for (const EngineRequest& r : requests) sinks.push_back(c.sink(r.id, r.n));
  const RequestId starter_id(500);
  TokenSink starter_sink = c.sink(starter_id, 1);
  Status st = engine.submit(greedy_request(starter_id.value(), random_tokens(4, 997, 1), 1),
                            [&, starter_sink](const TokenEvent& e) {
                              starter_sink(e);
                              if (e.finish == EngineFinish::kNone) return;
                              for (size_t i = 0; i < requests.size(); ++i) {
                                Status s = engine.submit(requests[i], sinks[i]);
                                EXPECT_TRUE(s.is_ok()) << s.to_string();
                                if (!s.is_ok()) c.forget(requests[i].id, requests[i].n);
                              }
                            });
  if (!st.is_ok()) {
    ADD_FAILURE() << st.to_string();
    return {};
  }
  EXPECT_TRUE(c.wait_all());
  MixedRun run;
  for (const EngineRequest& r : requests) run.events[r.id] = c.events(r.id);
  expect_all_free(engine);
  run.stats = engine.stats();
  return run;
}

void expect_same_events(const MixedRun& want, const MixedRun& got, const std::string& what) {
  ASSERT_EQ(want.events.size(), got.events.size()) << what;
  for (const auto& [id, a] : want.events) {
    const std::vector<TokenEvent>& b = got.events.at(id);
    ASSERT_EQ(a.size(), b.size()) << what << ": request " << id.value();
    for (size_t k = 0; k < a.size(); ++k) {
      const std::string at =
          what + ": request " + std::to_string(id.value()) + " event " + std::to_string(k);
      EXPECT_EQ(a[k].sample_idx, b[k].sample_idx) << at;
      EXPECT_EQ(a[k].token, b[k].token) << at;
      EXPECT_EQ(a[k].finish, b[k].finish) << at;
      EXPECT_EQ(a[k].num_output_tokens, b[k].num_output_tokens) << at;
      EXPECT_EQ(a[k].logprob.token, b[k].logprob.token) << at;
      EXPECT_EQ(a[k].logprob.logprob, b[k].logprob.logprob) << at;
      EXPECT_EQ(a[k].logprob.top, b[k].logprob.top) << at;
    }
  }
}

// The CPU backend never samples on the device: the engine's output and step count are those of
// device sampling switched off.
TEST(Engine, CpuBackendSamplesEveryStepOnTheHost) {
  auto on = start_engine(small_config("qwen3"));
  EngineConfig off_config = small_config("qwen3");
  off_config.device_sampling = false;
  auto off = start_engine(off_config);
  ASSERT_TRUE(on && off);
  const MixedRun a = run_mixed(*on);
  const MixedRun b = run_mixed(*off);
  EXPECT_EQ(a.stats.device_sample_steps, 0u);
  EXPECT_EQ(b.stats.device_sample_steps, 0u);
  EXPECT_EQ(a.stats.steps, b.stats.steps);
  expect_same_events(b, a, "cpu backend");
}

TEST(Engine, DeviceSamplingPathEqualsHostPath) {
  const EngineConfig config = small_config("qwen3");
  auto host = start_engine(config);
  ASSERT_TRUE(host);
  const MixedRun want = run_mixed(*host);

  EmulatedDeviceSampler* sampler = nullptr;
  auto device = start_emulated(config, &sampler);
  ASSERT_TRUE(device);
  const MixedRun got = run_mixed(*device);
  expect_same_events(want, got, "device path");
  const EngineStats& s = got.stats;
  std::printf("[engine-device-sampling] steps=%llu device_sample_steps=%llu rows=%lld\n",
              static_cast<unsigned long long>(s.steps),
              static_cast<unsigned long long>(s.device_sample_steps),
              static_cast<long long>(sampler->num_rows.load()));
  EXPECT_GT(s.device_sample_steps, 0u) << "no step took the device path";
  // The penalty request's 8 steps (its prefill and 7 decodes) sample on the host.
  EXPECT_GE(s.steps, s.device_sample_steps + 8);
  EXPECT_EQ(static_cast<uint64_t>(sampler->calls.load()), s.device_sample_steps);
  EXPECT_LT(static_cast<uint64_t>(sampler->num_rows.load()), s.generated_tokens);
  EXPECT_EQ(s.steps, want.stats.steps);

  // Alone, a logprobs request and a penalty request never reach the device sampler.
  const int64_t calls = sampler->calls.load();
  Collector c;
  EngineRequest lp = greedy_request(700, random_tokens(6, 997, 7), 3);
  lp.logprobs = true;
  lp.sampling.top_logprobs = 2;
  run_one(*device, c, lp);
  EngineRequest pen = greedy_request(701, random_tokens(6, 997, 8), 3);
  pen.sampling.presence_penalty = 0.5f;
  run_one(*device, c, pen);
  EXPECT_EQ(sampler->calls.load(), calls);
  const std::vector<TokenEvent> lp_events = c.events(RequestId(700));
  ASSERT_EQ(lp_events.size(), 3u);
  for (const TokenEvent& e : lp_events) EXPECT_EQ(e.logprob.top.size(), 2u);
}

TEST(Engine, DeviceSamplingSwitchedOffByConfigOrEnvironment) {
  EngineConfig config = small_config("llama_tied");
  config.device_sampling = false;
  EmulatedDeviceSampler* sampler = nullptr;
  auto off = start_emulated(config, &sampler);
  ASSERT_TRUE(off);
  const MixedRun a = run_mixed(*off);
  EXPECT_EQ(a.stats.device_sample_steps, 0u);
  EXPECT_EQ(sampler->calls.load(), 0);

  config.device_sampling = true;
  const char* saved = std::getenv("DEEPINFER_GPU_SAMPLING");
  const std::string old = saved != nullptr ? saved : "";
  ::setenv("DEEPINFER_GPU_SAMPLING", "0", 1);
  auto env_off = start_emulated(config, &sampler);  // read when the engine starts
  if (saved != nullptr) {
    ::setenv("DEEPINFER_GPU_SAMPLING", old.c_str(), 1);
  } else {
    ::unsetenv("DEEPINFER_GPU_SAMPLING");
  }
  ASSERT_TRUE(env_off);
  const MixedRun b = run_mixed(*env_off);
  EXPECT_EQ(b.stats.device_sample_steps, 0u);
  EXPECT_EQ(sampler->calls.load(), 0);
  expect_same_events(a, b, "environment switch");
}

// A device row whose logits are all -inf/NaN (-1) fails the step as the host sampler's throw
// does: every request in flight ends with kError, and the engine serves the next request.
TEST(Engine, DeviceSamplerFailureFailsTheStepOnly) {
  EmulatedDeviceSampler* sampler = nullptr;
  auto engine = start_emulated(small_config("llama_tied"), &sampler);
  ASSERT_TRUE(engine);
  Collector c;
  sampler->all_masked = true;
  run_one(*engine, c, greedy_request(1, random_tokens(9, 997, 5), 4));
  const TokenEvent f = c.final_event(RequestId(1));
  EXPECT_EQ(f.finish, EngineFinish::kError);
  EXPECT_NE(f.error.find("device sampler"), std::string::npos) << f.error;
  EXPECT_TRUE(c.tokens(RequestId(1)).empty());
  sampler->all_masked = false;
  run_one(*engine, c, greedy_request(2, random_tokens(9, 997, 5), 4));
  EXPECT_EQ(c.final_event(RequestId(2)).finish, EngineFinish::kLength);
  EXPECT_EQ(c.tokens(RequestId(2)).size(), 4u);
  EXPECT_EQ(engine->stats().requests_failed, 1u);
  expect_all_free(*engine);
}

}  // namespace
}  // namespace di
