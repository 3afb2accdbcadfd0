#include "bench/engine_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <random>

#include "bench/stats.h"
#include "core/error.h"
#include "core/logging.h"
#include "engine/engine.h"
#include "model/config.h"
#include "model/default_model.h"

namespace di::bench {

using nlohmann::json;

EngineRoundMetrics engine_round_metrics(const EngineRound& round) {
  const auto& tt = round.token_times;
  DI_CHECK(!tt.empty(), "a round without requests");
  double prefill_end = 0, end = 0;
  int64_t num_tokens = 0;
  std::vector<double> ttft;
  for (const auto& t : tt) {
    DI_CHECK(!t.empty(), "a request produced no token");
    prefill_end = std::max(prefill_end, t.front());
    end = std::max(end, t.back());
    num_tokens += static_cast<int64_t>(t.size());
    ttft.push_back(t.front() * 1000.0);
  }
  DI_CHECK(prefill_end > 0, "token times must be positive (seconds after the submit)");
  std::vector<double> steps;
  int64_t decode_tokens = 0;
  for (const auto& t : tt) {
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i] > prefill_end) ++decode_tokens;
      if (i > 0 && t[i - 1] >= prefill_end) steps.push_back((t[i] - t[i - 1]) * 1000.0);
    }
  }
  EngineRoundMetrics m;
  const double b = static_cast<double>(tt.size());
  m.prefill_tok_s = b * round.input_len / prefill_end;
  if (end > prefill_end && decode_tokens > 0) m.decode_tok_s = decode_tokens / (end - prefill_end);
  const Summary s = summarize(steps);
  m.step_ms_mean = s.mean;
  m.step_ms_p50 = s.p50;
  m.step_ms_p99 = s.p99;
  const Summary f = summarize(ttft);
  m.ttft_ms_mean = f.mean;
  m.ttft_ms_p50 = f.p50;
  m.ttft_ms_max = f.max;
  m.e2e_s = end;
  m.total_tok_s = (b * round.input_len + static_cast<double>(num_tokens)) / end;
  return m;
}

namespace {

using Clock = std::chrono::steady_clock;

// Submits `batch` requests at once and waits for all of them; returns their token times.
EngineRound run_round(Engine& engine, const EngineBenchOptions& o, int32_t batch,
                      std::mt19937_64& rng, uint64_t& next_id) {
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(engine.vocab_size() - 1));
  EngineRound round;
  round.input_len = o.input_len;
  round.token_times.assign(static_cast<size_t>(batch), {});
  for (auto& t : round.token_times) t.reserve(static_cast<size_t>(o.output_len));
  std::mutex mu;
  std::condition_variable cv;
  int32_t num_done = 0;
  std::string error;
  std::vector<EngineRequest> reqs(static_cast<size_t>(batch));
  for (auto& r : reqs) {
    r.id = RequestId{next_id++};
    r.prompt.resize(static_cast<size_t>(o.input_len));
    for (auto& t : r.prompt) t = token(rng);
    r.max_tokens = o.output_len;
    r.sampling.temperature = 0.0f;
  }
  const Clock::time_point t0 = Clock::now();
  for (int32_t i = 0; i < batch; ++i) {
    // Sinks run on the engine thread: take the time, append, return.
    auto sink = [&, i](const TokenEvent& e) {
      const double t = std::chrono::duration<double>(Clock::now() - t0).count();
      std::lock_guard lock(mu);
      if (e.token >= 0) round.token_times[static_cast<size_t>(i)].push_back(t);
      if (e.finish != EngineFinish::kNone) {
        if (e.finish != EngineFinish::kLength && error.empty()) {
          error = e.error.empty() ? "a request ended before max_tokens" : e.error;
        }
        ++num_done;
        cv.notify_all();
      }
    };
    Status st = engine.submit(reqs[static_cast<size_t>(i)], sink);
    DI_CHECK(st.is_ok(), "engine rejected a request: {}", st.to_string());
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return num_done == batch; });
  DI_CHECK(error.empty(), "engine: {}", error);
  return round;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

json run_engine_bench(const EngineBenchOptions& o) {
  DI_CHECK(o.input_len >= 1 && o.output_len >= 1, "--input-len and --output-len must be >= 1");
  DI_CHECK(o.iters >= 1 && o.warmup_iters >= 0, "--iters must be >= 1, --warmup-iters >= 0");
  DI_CHECK(!o.batch_sizes.empty(), "give --batch-sizes 1,8,32");
  DI_CHECK(o.kv_cache_mb >= 1, "--kv-cache-mb must be >= 1");
  EngineConfig cfg;
  cfg.model_dir = o.model_dir.empty() ? find_default_model_dir().value() : o.model_dir;
  cfg.backend = o.backend;
  cfg.block_size = o.block_size;
  cfg.kv_cache_bytes = o.kv_cache_mb << 20;
  cfg.max_batched_tokens = o.max_batched_tokens;
  cfg.max_running = *std::max_element(o.batch_sizes.begin(), o.batch_sizes.end());
  const ModelConfig model_cfg = load_model_config(cfg.model_dir).value();
  const auto t_load = Clock::now();
  auto started = Engine::start(cfg);
  DI_CHECK(started.is_ok(), "engine did not start: {}", started.status().to_string());
  std::unique_ptr<Engine> engine = std::move(started).value();
  const double load_s = std::chrono::duration<double>(Clock::now() - t_load).count();
  DI_CHECK(
      o.input_len + o.output_len <= engine->max_model_len(),
      "input {} + output {} tokens exceed the engine's max_model_len {} (raise --kv-cache-mb?)",
      o.input_len, o.output_len, engine->max_model_len());
  DI_LOG_INFO("bench engine: {} ({}) on {} loaded in {:.1f} s", cfg.model_dir,
              arch_name(model_cfg.arch), cfg.backend, load_s);

  std::mt19937_64 rng(o.seed);
  uint64_t next_id = 1;
  json points = json::array();
  for (int32_t b : o.batch_sizes) {
    DI_CHECK(b >= 1, "batch sizes must be >= 1, got {}", b);
    for (int32_t i = 0; i < o.warmup_iters; ++i) run_round(*engine, o, b, rng, next_id);
    const EngineStats before = engine->stats();
    std::vector<EngineRoundMetrics> rounds;
    for (int32_t i = 0; i < o.iters; ++i) {
      rounds.push_back(engine_round_metrics(run_round(*engine, o, b, rng, next_id)));
    }
    const EngineStats after = engine->stats();
    auto med = [&](double EngineRoundMetrics::*field) {
      std::vector<double> v;
      for (const auto& r : rounds) v.push_back(r.*field);
      return median_of(v);
    };
    json p = {{"batch_size", b},
              {"prefill_tok_s", med(&EngineRoundMetrics::prefill_tok_s)},
              {"decode_tok_s", med(&EngineRoundMetrics::decode_tok_s)},
              {"step_ms_mean", med(&EngineRoundMetrics::step_ms_mean)},
              {"step_ms_p50", med(&EngineRoundMetrics::step_ms_p50)},
              {"step_ms_p99", med(&EngineRoundMetrics::step_ms_p99)},
              {"ttft_ms_mean", med(&EngineRoundMetrics::ttft_ms_mean)},
              {"ttft_ms_p50", med(&EngineRoundMetrics::ttft_ms_p50)},
              {"ttft_ms_max", med(&EngineRoundMetrics::ttft_ms_max)},
              {"total_tok_s", med(&EngineRoundMetrics::total_tok_s)},
              {"e2e_s", med(&EngineRoundMetrics::e2e_s)},
              {"engine_steps_per_round", static_cast<double>(after.steps - before.steps) / o.iters},
              {"preemptions", after.preemptions - before.preemptions}};
    if (after.preemptions > before.preemptions) {
      DI_LOG_WARN("batch {}: {} preemptions (KV pool too small: raise --kv-cache-mb)", b,
                  after.preemptions - before.preemptions);
    }
    DI_LOG_INFO("batch {}: prefill {:.1f} tok/s, decode {:.1f} tok/s, step {:.2f} ms", b,
                p["prefill_tok_s"].get<double>(), p["decode_tok_s"].get<double>(),
                p["step_ms_p50"].get<double>());
    points.push_back(std::move(p));
  }
  json j = {{"tool", "deepinfer bench engine"},
            {"model", cfg.model_dir},
            {"arch", arch_name(model_cfg.arch)},
            {"backend", cfg.backend},
            {"input_len", o.input_len},
            {"output_len", o.output_len},
            {"iters", o.iters},
            {"warmup_iters", o.warmup_iters},
            {"block_size", o.block_size},
            {"kv_cache_mb", o.kv_cache_mb},
            {"max_batched_tokens", o.max_batched_tokens},
            {"load_s", load_s},
            {"points", points}};
  if (!o.result_json.empty()) {
    std::ofstream out(o.result_json);
    DI_CHECK(out.good(), "cannot write --result-json '{}'", o.result_json);
    out << j.dump(2) << "\n";
  }
  return j;
}

std::string format_engine_table(const json& r) {
  std::string s =
      fmt::format("{} ({}, {}): input {} / output {} tokens\n", r.at("model").get<std::string>(),
                  r.at("arch").get<std::string>(), r.at("backend").get<std::string>(),
                  r.at("input_len").get<int>(), r.at("output_len").get<int>());
  s += fmt::format("{:>6} {:>14} {:>14} {:>12} {:>12} {:>12} {:>12}\n", "batch", "prefill tok/s",
                   "decode tok/s", "step p50 ms", "step p99 ms", "TTFT p50 ms", "total tok/s");
  for (const json& p : r.at("points")) {
    s += fmt::format("{:>6} {:>14.1f} {:>14.1f} {:>12.3f} {:>12.3f} {:>12.1f} {:>12.1f}\n",
                     p.at("batch_size").get<int>(), p.at("prefill_tok_s").get<double>(),
                     p.at("decode_tok_s").get<double>(), p.at("step_ms_p50").get<double>(),
                     p.at("step_ms_p99").get<double>(), p.at("ttft_ms_p50").get<double>(),
                     p.at("total_tok_s").get<double>());
  }
  return s;
}

}  // namespace di::bench
