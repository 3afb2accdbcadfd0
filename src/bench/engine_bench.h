#pragma once
// `deepinfer bench engine`: offline throughput and latency of the serving engine (engine/engine.h:
// the engine thread, scheduler, paged KV cache, sampler), without HTTP.
//
// For each batch size B, B requests of --input-len random token ids (no shared prefixes) and
// exactly --output-len greedy tokens each (no stop tokens) are submitted at once; the token sinks
// time-stamp every token. With t0 the submit time, first_i / last_i request i's first / last
// token:
//
//   prefill end       P = max_i first_i                 (every prompt has been prefilled)
//   prefill tok/s     = B * input_len / (P - t0)
//   decode tok/s      = tokens emitted after P / (max_i last_i - P)
//   decode step (ms)  = gaps between consecutive tokens of one request, both after P: in a
//                       pure-decode batch every step emits one token per request, so a gap is one
//                       step (mean / p50 / p99)
//   TTFT (ms)         = first_i - t0 (mean / p50 / max)
//   total tok/s       = B * (input_len + output_len) / (max_i last_i - t0)
//
// Each number is the median over --iters rounds after --warmup-iters unrecorded ones.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace di::bench {

struct EngineBenchOptions {
  std::string model_dir;  // "" = the shipped demo model
  std::string backend = "cpu";
  int32_t input_len = 512;
  int32_t output_len = 128;
  std::vector<int32_t> batch_sizes = {1};
  int32_t iters = 3;
  int32_t warmup_iters = 1;
  int32_t block_size = 64;
  int64_t kv_cache_mb = 4096;
  int32_t max_batched_tokens = 8192;  // per-step token budget (chunked prefill)
  uint64_t seed = 0;
  std::string result_json;
};

// What one round measured: token times of each request, seconds from the submit.
struct EngineRound {
  int32_t input_len = 0;
  std::vector<std::vector<double>> token_times;  // [request][token]
};

struct EngineRoundMetrics {
  double prefill_tok_s = 0;
  double decode_tok_s = 0;  // 0 when no token came after the prefill end
  double step_ms_mean = 0;
  double step_ms_p50 = 0;
  double step_ms_p99 = 0;
  double ttft_ms_mean = 0;
  double ttft_ms_p50 = 0;
  double ttft_ms_max = 0;
  double total_tok_s = 0;
  double e2e_s = 0;
};

// The numbers above from one round's timeline (separate from the engine, for tests).
EngineRoundMetrics engine_round_metrics(const EngineRound& round);

nlohmann::json run_engine_bench(const EngineBenchOptions& options);
std::string format_engine_table(const nlohmann::json& results);

}  // namespace di::bench
