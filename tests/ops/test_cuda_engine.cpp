// The serving engine on the CUDA backend with decode-step graphs (CUDA graphs, ModelRunner) against
// the same engine run eagerly, on the golden tiny models: several greedy requests of different
// lengths at once, so decode steps run in buckets of 1..8 with padding. Both runs prefill eagerly;
// the graph run must actually replay graphs, every request must finish with max_tokens tokens, and
// the two runs' tokens must agree — where they part, only on a near-tie (the two best tokens within
// kTieNats of each other in the eager run), since the padded bucket changes the GEMMs' row count
// and with it cuBLAS's choice of algorithm. Skipped without a GPU.
//
// Lines: [engine-graph] model=.. requests=.. tokens=.. same=.. near_tie_splits=.. graph_steps=..
//
// Device sampling (engine/sample_placement.h, Backend::sample_on_device) against the host sampler
// (EngineConfig::device_sampling = false, what DEEPINFER_GPU_SAMPLING=0 does): the same requests
// in the same phases give identical events, since both samplers draw the same token from the same
// logits. Phases of 1, 3 and 17 rows of greedy and seeded temperature / top-k / top-p / min-p
// requests, then a mix with a penalty and a logprobs request (their steps fall back to the host).
//
// Lines: [engine-sampling] backend=.. model=.. events=.. same=.. device_steps=.. steps=..
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "engine/engine.h"

namespace di {
namespace {

constexpr float kTieNats = 0.05f;

// The golden fixture's weights; the demo model's live in models/ (its golden.json says so).
std::string fixture(const std::string& name) {
  const char* src = std::getenv("DI_SOURCE_DIR");
  const std::string root = src ? src : ".";
  if (name == "demo_code") return root + "/models/deepinfer-demo-code";
  return root + "/tests/fixtures/golden/" + name;
}

struct EngineRun {
  std::map<uint64_t, std::vector<TokenEvent>> events;
  EngineStats stats;
};

EngineRun run_engine(const std::string& model, bool graphs, int32_t num_requests,
                     int32_t max_tokens) {
  EngineConfig c;
  c.model_dir = fixture(model);
  c.backend = "cuda";
  c.block_size = 16;
  c.num_blocks = 512;
  c.decode_graphs = graphs;
  auto started = Engine::start(c);
  if (!started.is_ok()) {
    ADD_FAILURE() << started.status().to_string();
    return {};
  }
  std::unique_ptr<Engine> engine = std::move(started).value();
  std::mutex mu;
  std::condition_variable cv;
  EngineRun run;
  int32_t open = num_requests;
  const int64_t vocab = engine->vocab_size();
  for (int32_t i = 0; i < num_requests; ++i) {
    EngineRequest r;
    r.id = RequestId(static_cast<uint64_t>(i + 1));
    for (int32_t t = 0; t < 5 + 11 * i; ++t)  // 5 .. 82 prompt tokens: ragged contexts
      r.prompt.push_back(static_cast<int32_t>((int64_t{t} * 7919 + 31 * i + 3) % vocab));
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0.0f;
    r.sampling.top_logprobs = 2;
    const uint64_t id = r.id.value();
    Status st = engine->submit(std::move(r), [&, id](const TokenEvent& e) {
      std::lock_guard lock(mu);
      run.events[id].push_back(e);
      if (e.finish != EngineFinish::kNone && --open == 0) cv.notify_all();
    });
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  std::unique_lock lock(mu);
  EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return open == 0; }))
      << model << ": requests did not finish";
  lock.unlock();
  engine->check_integrity();
  run.stats = engine->stats();
  return run;
}

class CudaEngineGraphs : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaEngineGraphs, GraphDecodeMatchesEager) {
  if (!cuda::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string model = GetParam();
  constexpr int32_t kRequests = 7, kMaxTokens = 24;
  EngineRun eager = run_engine(model, false, kRequests, kMaxTokens);
  EngineRun graph = run_engine(model, true, kRequests, kMaxTokens);
  EXPECT_EQ(eager.stats.graph_steps, 0u);
  EXPECT_GT(graph.stats.graph_steps, 0u) << "no decode step replayed a graph";
  int32_t tokens = 0, same = 0, tie_splits = 0, bad_splits = 0;
  for (int32_t i = 1; i <= kRequests; ++i) {
    const auto& a = eager.events[static_cast<uint64_t>(i)];
    const auto& b = graph.events[static_cast<uint64_t>(i)];
    ASSERT_FALSE(a.empty());
    ASSERT_FALSE(b.empty());
    EXPECT_EQ(a.back().num_output_tokens, kMaxTokens) << model << " request " << i;
    EXPECT_EQ(b.back().num_output_tokens, kMaxTokens) << model << " request " << i;
    for (size_t k = 0; k < std::min(a.size(), b.size()); ++k) {
      if (a[k].token < 0 || b[k].token < 0) continue;
      ++tokens;
      if (a[k].token == b[k].token) {
        ++same;
        continue;
      }
      // The first difference: after it the two continuations condition on different text.
      const auto& top = a[k].logprob.top;
      const bool tie = top.size() >= 2 && top[0].second - top[1].second < kTieNats;
      (tie ? tie_splits : bad_splits)++;
      if (!tie)
        ADD_FAILURE() << model << " request " << i << " token " << k << ": eager " << a[k].token
                      << " vs graph " << b[k].token << " without a near-tie";
      break;
    }
  }
  std::printf(
      "[engine-graph] model=%s requests=%d tokens=%d same=%d near_tie_splits=%d bad_splits=%d "
      "graph_steps=%llu steps=%llu\n",
      model.c_str(), kRequests, tokens, same, tie_splits, bad_splits,
      static_cast<unsigned long long>(graph.stats.graph_steps),
      static_cast<unsigned long long>(graph.stats.steps));
}

INSTANTIATE_TEST_SUITE_P(Golden, CudaEngineGraphs,
                         ::testing::Values("llama_tied", "qwen3", "qwen3_moe", "deepseek_v2",
                                           "deepseek_v3", "demo_code"),
                         [](const auto& info) { return info.param; });

// ---- device sampling vs host sampling ----

struct SamplingRun {
  std::map<uint64_t, std::vector<TokenEvent>> events;
  EngineStats stats;
};

EngineRequest sampling_request(uint64_t id, int64_t vocab, int32_t prompt_len, int32_t max_tokens,
                               float temperature, int32_t top_k, float top_p, float min_p) {
  EngineRequest r;
  r.id = RequestId(id);
  for (int32_t t = 0; t < prompt_len; ++t)
    r.prompt.push_back(
        static_cast<int32_t>((int64_t{t} * 7919 + 131 * static_cast<int64_t>(id) + 5) % vocab));
  r.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.top_k = top_k;
  r.sampling.top_p = top_p;
  r.sampling.min_p = min_p;
  r.sampling.seed = 77 + id;
  return r;
}

// Phase k's requests run together; the next phase starts when they have all finished.
std::vector<std::vector<EngineRequest>> sampling_phases(int64_t vocab) {
  std::vector<std::vector<EngineRequest>> phases(4);
  uint64_t id = 1;
  // Five settings in turn: greedy, top-k, top-p, min-p, all three.
  auto plain = [&](int32_t prompt_len, int32_t max_tokens) {
    const uint64_t k = id % 5;
    const float t = k == 0 ? 0.0f : 0.6f + 0.2f * static_cast<float>(k);
    const int32_t top_k = k == 1 || k == 4 ? 20 : -1;
    const float top_p = k == 2 || k == 4 ? 0.9f : 1.0f;
    const float min_p = k == 3 || k == 4 ? 0.05f : 0.0f;
    EngineRequest r = sampling_request(id++, vocab, prompt_len, max_tokens, t, top_k, top_p, min_p);
    return r;
  };
  phases[0].push_back(plain(9, 12));                                                  // 1 row
  for (int32_t i = 0; i < 3; ++i) phases[1].push_back(plain(5 + 13 * i, 10 + i));     // 3 rows
  for (int32_t i = 0; i < 17; ++i) phases[2].push_back(plain(4 + 7 * i, 8 + i % 5));  // 17 rows
  // The mix: a penalty and a logprobs request (host steps while they run), n = 2, plain rows.
  EngineRequest pen = plain(21, 4);
  pen.sampling.repetition_penalty = 1.2f;
  pen.sampling.presence_penalty = 0.5f;
  EngineRequest lp = plain(17, 5);
  lp.logprobs = true;
  lp.sampling.top_logprobs = 2;
  EngineRequest two = plain(30, 10);
  two.n = 2;
  phases[3] = {pen, lp, two, plain(12, 14), plain(40, 12), plain(3, 16)};
  return phases;
}

// Each phase is submitted from the sink of the previous phase's last final event, on the engine
// thread before it drains its inbox again, so the engine sees a phase's requests at once and both
// runs step through the same batches (a split admission would change the GEMMs' shapes).
SamplingRun run_sampling(const std::string& backend, const std::string& model,
                         bool device_sampling) {
  EngineConfig c;
  c.model_dir = fixture(model);
  c.backend = backend;
  c.block_size = 16;
  c.num_blocks = 512;
  c.device_sampling = device_sampling;
  SamplingRun run;  // before the engine: its sinks write here until it is gone
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<EngineRequest>> phases;
  size_t next_phase = 0;
  int32_t open = 0;
  bool done = false;
  std::function<void()> submit_next;  // called with mu held; declared before the engine too
  auto started = Engine::start(c);
  if (!started.is_ok()) {
    ADD_FAILURE() << started.status().to_string();
    return {};
  }
  std::unique_ptr<Engine> engine = std::move(started).value();
  phases = sampling_phases(engine->vocab_size());
  auto sink_of = [&](uint64_t id) {
    return [&, id](const TokenEvent& e) {
      std::lock_guard lock(mu);
      run.events[id].push_back(e);
      if (e.finish != EngineFinish::kNone && --open == 0) submit_next();
    };
  };
  submit_next = [&] {
    if (next_phase == phases.size()) {
      done = true;
      cv.notify_all();
      return;
    }
    std::vector<EngineRequest>& phase = phases[next_phase++];
    for (const EngineRequest& r : phase) open += r.n;
    for (EngineRequest& r : phase) {
      const uint64_t id = r.id.value();
      const int32_t n = r.n;
      Status st = engine->submit(std::move(r), sink_of(id));
      if (!st.is_ok()) {
        ADD_FAILURE() << "request " << id << ": " << st.to_string();
        open -= n;
      }
    }
    if (open == 0) submit_next();
  };
  std::unique_lock lock(mu);
  submit_next();
  EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return done; }))
      << backend << " " << model << ": requests did not finish";
  next_phase = phases.size();  // after a timeout: the shutdown's abort events submit nothing
  lock.unlock();
  engine->check_integrity();
  run.stats = engine->stats();
  return run;
}

using BackendModel = std::pair<std::string, std::string>;
class CudaEngineSampling : public ::testing::TestWithParam<BackendModel> {};

TEST_P(CudaEngineSampling, DeviceSamplingEqualsHostSampling) {
  if (!cuda::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const auto& [backend, model] = GetParam();
  const SamplingRun host = run_sampling(backend, model, false);
  const SamplingRun device = run_sampling(backend, model, true);
  int32_t events = 0, same = 0;
  ASSERT_EQ(host.events.size(), device.events.size());
  for (const auto& [id, a] : host.events) {
    const auto& b = device.events.at(id);
    EXPECT_EQ(a.size(), b.size()) << model << " request " << id;
    for (size_t k = 0; k < std::min(a.size(), b.size()); ++k) {
      ++events;
      const bool eq =
          a[k].sample_idx == b[k].sample_idx && a[k].token == b[k].token &&
          a[k].finish == b[k].finish && a[k].num_output_tokens == b[k].num_output_tokens &&
          a[k].logprob.token == b[k].logprob.token &&
          a[k].logprob.logprob == b[k].logprob.logprob && a[k].logprob.top == b[k].logprob.top;
      if (eq) {
        ++same;
        continue;
      }
      ADD_FAILURE() << backend << " " << model << " request " << id << " event " << k
                    << ": host token " << a[k].token << " finish " << static_cast<int>(a[k].finish)
                    << ", device token " << b[k].token << " finish "
                    << static_cast<int>(b[k].finish);
      break;  // the continuations part here
    }
  }
  const EngineStats& s = device.stats;
  std::printf(
      "[engine-sampling] backend=%s model=%s events=%d same=%d device_steps=%llu steps=%llu "
      "graph_steps=%llu sample_us_per_step host=%.1f device=%.1f\n",
      backend.c_str(), model.c_str(), events, same,
      static_cast<unsigned long long>(s.device_sample_steps),
      static_cast<unsigned long long>(s.steps), static_cast<unsigned long long>(s.graph_steps),
      host.stats.steps ? static_cast<double>(host.stats.sample_us) / host.stats.steps : 0.0,
      s.steps ? static_cast<double>(s.sample_us) / s.steps : 0.0);
  EXPECT_EQ(host.stats.device_sample_steps, 0u);
  EXPECT_GT(s.device_sample_steps, 0u) << "no step sampled on the device";
  // The penalty / logprobs requests' steps (prefill + 3 decodes at least) stayed on the host.
  EXPECT_GE(s.steps, s.device_sample_steps + 4) << "no step fell back to the host";
  EXPECT_EQ(s.steps, host.stats.steps);
  EXPECT_EQ(s.generated_tokens, host.stats.generated_tokens);
}

INSTANTIATE_TEST_SUITE_P(
    Golden, CudaEngineSampling,
    ::testing::Values(BackendModel{"cuda-fp32", "llama_tied"}, BackendModel{"cuda-fp32", "qwen3"},
                      BackendModel{"cuda-fp32", "qwen3_moe"},
                      BackendModel{"cuda-fp32", "deepseek_v3"}, BackendModel{"cuda", "llama_tied"},
                      BackendModel{"cuda", "qwen3_moe"}, BackendModel{"cuda", "demo_code"}),
    [](const auto& info) {
      std::string name = info.param.first + "_" + info.param.second;
      for (char& ch : name)
        if (ch == '-') ch = '_';
      return name;
    });

}  // namespace
}  // namespace di
