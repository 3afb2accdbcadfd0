// Engine loop throughput on a tiny golden model (CPU backend): steps/s and generated tokens/s for
// batches of 1, 16 and 64 concurrent greedy requests, side by side with the offline Generator on
// the same workload (the ratio is the engine loop's overhead: scheduler, KV manager, messages,
// sinks). Numbers go to docs/engine.md; the test checks that the runs it times are complete and
// equal to the Generator's tokens.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>

#include "backend/backend.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "golden_util.h"
#include "model/model.h"

namespace di {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::vector<std::vector<int32_t>> prompts(int n, int32_t len) {
  std::mt19937 rng(42);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(n));
  for (auto& p : out)
    for (int32_t i = 0; i < len; ++i) p.push_back(static_cast<int32_t>(rng() % 997));
  return out;
}

TEST(BenchEngine, StepsAndTokensPerSecond) {
  const std::string model_name = "qwen3";
  const std::string dir = testing::source_dir() + "/tests/fixtures/golden/" + model_name;
  constexpr int32_t kPrompt = 32, kTokens = 64;
  std::printf("model %s (CPU backend), prompt %d tokens, %d generated tokens per request\n",
              model_name.c_str(), kPrompt, kTokens);
  std::printf("%6s %12s %12s %14s %16s %8s\n", "batch", "engine s", "steps/s", "engine tok/s",
              "generator tok/s", "ratio");
  constexpr int kReps = 3;  // best of 3: the machine is shared, the minimum is the least noisy
  for (int batch : {1, 16, 64}) {
    const auto ps = prompts(batch, kPrompt);
    // Offline Generator: one continuous batch, no scheduler.
    std::vector<GenerateResult> expected;
    double gen_s = 1e9;
    {
      auto be = make_cpu_backend();
      auto model = load_model(dir, *be);
      std::vector<GenerateRequest> reqs;
      for (const auto& p : ps) {
        GenerateRequest r;
        r.prompt = p;
        r.max_tokens = kTokens;
        reqs.push_back(r);
      }
      Generator gen(*model, *be, GeneratorOptions{16, 0, 0, false});
      for (int rep = 0; rep < kReps; ++rep) {
        const auto t0 = Clock::now();
        expected = gen.generate(reqs);
        gen_s = std::min(gen_s, seconds_since(t0));
      }
    }
    EngineConfig cfg;
    cfg.model_dir = dir;
    cfg.block_size = 16;
    cfg.num_blocks = 1024;
    cfg.enable_prefix_caching = false;  // repetitions must recompute their prompts
    auto started = Engine::start(cfg);
    ASSERT_TRUE(started.is_ok()) << started.status().to_string();
    auto engine = std::move(started).value();
    double engine_s = 1e9, steps_per_s = 0.0;
    for (int rep = 0; rep < kReps; ++rep) {
      std::mutex mu;
      std::condition_variable cv;
      int open = batch;
      std::map<uint64_t, std::vector<int32_t>> out;
      const uint64_t steps0 = engine->stats().steps;
      const auto t0 = Clock::now();
      for (int i = 0; i < batch; ++i) {
        EngineRequest r;
        r.id = RequestId(static_cast<uint64_t>(rep * batch + i));
        r.prompt = ps[static_cast<size_t>(i)];
        r.max_tokens = kTokens;
        r.sampling.temperature = 0.0f;
        ASSERT_TRUE(engine
                        ->submit(std::move(r),
                                 [&](const TokenEvent& e) {
                                   std::lock_guard lock(mu);
                                   out[e.id.value()].push_back(e.token);
                                   if (e.finish != EngineFinish::kNone && --open == 0) {
                                     cv.notify_all();
                                   }
                                 })
                        .is_ok());
      }
      {
        std::unique_lock lock(mu);
        ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(300), [&] { return open == 0; }));
      }
      const double t = seconds_since(t0);
      if (t < engine_s) {
        engine_s = t;
        steps_per_s = static_cast<double>(engine->stats().steps - steps0) / t;
      }
      for (int i = 0; i < batch; ++i) {
        EXPECT_EQ(out[static_cast<uint64_t>(rep * batch + i)],
                  expected[static_cast<size_t>(i)].output);
      }
    }
    EXPECT_EQ(engine->stats().generated_tokens, static_cast<uint64_t>(kReps) * batch * kTokens);
    const double tok = static_cast<double>(batch) * kTokens;
    std::printf("%6d %12.3f %12.0f %14.0f %16.0f %8.2f\n", batch, engine_s, steps_per_s,
                tok / engine_s, tok / gen_s, gen_s / engine_s);
  }
}

}  // namespace
}  // namespace di
