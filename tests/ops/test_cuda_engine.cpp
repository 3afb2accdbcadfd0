// The serving engine on the CUDA backend with decode-step graphs (CUDA graphs, ModelRunner) against
// the same engine run eagerly, on the golden tiny models: several greedy requests of different
// lengths at once, so decode steps run in buckets of 1..8 with padding. Both runs prefill eagerly;
// the graph run must actually replay graphs, every request must finish with max_tokens tokens, and
// the two runs' tokens must agree — where they part, only on a near-tie (the two best tokens within
// kTieNats of each other in the eager run), since the padded bucket changes the GEMMs' row count
// and with it cuBLAS's choice of algorithm. Skipped without a GPU.
//
// Lines: [engine-graph] model=.. requests=.. tokens=.. same=.. near_tie_splits=.. graph_steps=..
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
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

EngineRun run_engine(const std::string& model, bool graphs, int32_t num_requests, int32_t max_tokens) {
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

}  // namespace
}  // namespace di
