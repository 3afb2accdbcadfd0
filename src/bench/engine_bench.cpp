#include "bench/engine_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <random>

#include "backend/backend.h"
#include "core/error.h"
#include "core/logging.h"
#include "engine/generator.h"
#include "model/default_model.h"
#include "model/model.h"

namespace di::bench {

using nlohmann::json;

EngineBenchPoint engine_point(int32_t batch_size, int32_t input_len, int32_t output_len,
                              double prefill_s, double full_s) {
  DI_CHECK(prefill_s > 0 && full_s > 0, "times must be positive: prefill {} s, full {} s",
           prefill_s, full_s);
  EngineBenchPoint p;
  p.batch_size = batch_size;
  p.prefill_s = prefill_s;
  p.full_s = full_s;
  const double b = batch_size;
  p.prefill_tok_s = b * input_len / prefill_s;
  p.total_tok_s = b * (input_len + output_len) / full_s;
  if (output_len > 1) {
    // Timer noise can make the difference tiny or negative for very short outputs; clamp so the
    // derived rates stay finite (the JSON keeps both raw times).
    const double decode_s = std::max(full_s - prefill_s, 1e-9);
    p.decode_step_ms = decode_s * 1000.0 / (output_len - 1);
    p.decode_tok_s = b * (output_len - 1) / decode_s;
  }
  return p;
}

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

json run_engine_bench(const EngineBenchOptions& o) {
  DI_CHECK(o.input_len >= 1 && o.output_len >= 1, "--input-len and --output-len must be >= 1");
  DI_CHECK(o.iters >= 1 && o.warmup_iters >= 0, "--iters must be >= 1, --warmup-iters >= 0");
  DI_CHECK(!o.batch_sizes.empty(), "give --batch-sizes 1,8,32");
  const std::string model_dir = o.model_dir.empty() ? find_default_model_dir().value() : o.model_dir;
  auto backend = make_backend(o.backend);
  const auto t0 = std::chrono::steady_clock::now();
  auto model = load_model(model_dir, *backend);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t vocab = model->config().vocab_size;
  DI_CHECK(o.input_len + o.output_len <= model->config().max_position_embeddings,
           "input {} + output {} tokens exceed the model's {} positions", o.input_len,
           o.output_len, model->config().max_position_embeddings);
  DI_LOG_INFO("bench engine: {} on {} loaded in {:.1f} s", model_dir, backend->name(), load_s);

  GeneratorOptions gopts;
  gopts.block_size = o.block_size;
  gopts.prefill_chunk = o.prefill_chunk;
  Generator gen(*model, *backend, gopts);
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));

  auto make_requests = [&](int32_t batch, int32_t max_tokens) {
    std::vector<GenerateRequest> reqs(static_cast<size_t>(batch));
    for (auto& r : reqs) {
      r.prompt.resize(static_cast<size_t>(o.input_len));
      for (auto& t : r.prompt) t = token(rng);
      r.max_tokens = max_tokens;
    }
    return reqs;
  };
  auto time_run = [&](int32_t batch, int32_t max_tokens) {
    auto reqs = make_requests(batch, max_tokens);
    const auto start = std::chrono::steady_clock::now();
    auto results = gen.generate(reqs);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (const auto& r : results) {
      DI_CHECK(static_cast<int32_t>(r.output.size()) == max_tokens,
               "a request generated {} tokens instead of {}", r.output.size(), max_tokens);
    }
    return s;
  };

  json points = json::array();
  for (int32_t b : o.batch_sizes) {
    DI_CHECK(b >= 1, "batch sizes must be >= 1, got {}", b);
    for (int32_t i = 0; i < o.warmup_iters; ++i) time_run(b, o.output_len);
    std::vector<double> prefill, full;
    for (int32_t i = 0; i < o.iters; ++i) {
      prefill.push_back(time_run(b, 1));
      full.push_back(time_run(b, o.output_len));
    }
    const EngineBenchPoint p = engine_point(b, o.input_len, o.output_len, median(prefill),
                                            median(full));
    DI_LOG_INFO("batch {}: prefill {:.1f} tok/s, decode {:.1f} tok/s, step {:.2f} ms", b,
                p.prefill_tok_s, p.decode_tok_s, p.decode_step_ms);
    points.push_back({{"batch_size", b},
                      {"prefill_s", p.prefill_s},
                      {"full_s", p.full_s},
                      {"prefill_s_runs", prefill},
                      {"full_s_runs", full},
                      {"prefill_tok_s", p.prefill_tok_s},
                      {"decode_tok_s", p.decode_tok_s},
                      {"decode_step_ms", p.decode_step_ms},
                      {"total_tok_s", p.total_tok_s}});
  }
  json j = {{"tool", "deepinfer bench engine"},
            {"model", model_dir},
            {"arch", arch_name(model->config().arch)},
            {"backend", backend->name()},
            {"input_len", o.input_len},
            {"output_len", o.output_len},
            {"iters", o.iters},
            {"warmup_iters", o.warmup_iters},
            {"block_size", o.block_size},
            {"prefill_chunk", o.prefill_chunk},
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
  std::string s = fmt::format("{} ({}, {}): input {} / output {} tokens\n",
                              r.at("model").get<std::string>(), r.at("arch").get<std::string>(),
                              r.at("backend").get<std::string>(), r.at("input_len").get<int>(),
                              r.at("output_len").get<int>());
  s += fmt::format("{:>6} {:>14} {:>14} {:>14} {:>14} {:>12}\n", "batch", "prefill tok/s",
                   "decode tok/s", "step (ms)", "total tok/s", "e2e (s)");
  for (const json& p : r.at("points")) {
    s += fmt::format("{:>6} {:>14.1f} {:>14.1f} {:>14.3f} {:>14.1f} {:>12.3f}\n",
                     p.at("batch_size").get<int>(), p.at("prefill_tok_s").get<double>(),
                     p.at("decode_tok_s").get<double>(), p.at("decode_step_ms").get<double>(),
                     p.at("total_tok_s").get<double>(), p.at("full_s").get<double>());
  }
  return s;
}

}  // namespace di::bench
