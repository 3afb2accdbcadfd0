#pragma once
// Serving metrics from the client's request records (docs/benchmarking.md defines each one):
//
//   TTFT  first output chunk - request start                         per request
//   E2EL  last byte of the response - request start                  per request
//   TPOT  (E2EL - TTFT) / (output_tokens - 1); excludes the first    per request with >= 2 tokens
//         token, so it is the mean decode time per token a user saw
//   ITL   gap between consecutive chunks that carried output text    per gap, pooled over requests
//   per-user output tok/s = 1 / TPOT                                 per request
//   throughputs = totals over successful requests / benchmark duration
//   goodput = successful requests meeting every SLO / duration
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "bench/request_record.h"
#include "bench/stats.h"

namespace di::bench {

// Service-level objectives in milliseconds, from "--goodput ttft:500 tpot:50 e2el:10000".
struct Slo {
  std::optional<double> ttft_ms;
  std::optional<double> tpot_ms;
  std::optional<double> e2el_ms;
  bool empty() const { return !ttft_ms && !tpot_ms && !e2el_ms; }
};

// Parses "name:ms" items (ttft, tpot, e2el); throws di::Error naming the bad item.
Slo parse_slo(const std::vector<std::string>& items);
bool meets_slo(const RequestRecord& r, const Slo& slo);

struct ServingMetrics {
  int64_t num_requests = 0;
  int64_t num_completed = 0;
  int64_t num_failed = 0;
  std::map<std::string, int64_t> errors_by_type;
  double duration_s = 0;

  int64_t total_input_tokens = 0;
  int64_t total_output_tokens = 0;
  int64_t max_output_tokens = 0;       // largest single response
  double request_throughput = 0;       // req/s
  double input_token_throughput = 0;   // tok/s
  double output_token_throughput = 0;  // tok/s
  double total_token_throughput = 0;   // (input + output) tok/s
  // Little's law: sum of E2EL / duration, the mean number of requests in flight.
  double mean_concurrency = 0;

  Summary ttft_ms;
  Summary tpot_ms;
  Summary itl_ms;
  Summary e2el_ms;
  Summary output_tokens_per_user_s;  // 1000 / TPOT_ms per request
  Summary input_tokens;              // per request, as counted for the throughputs
  Summary output_tokens;

  bool has_slo = false;
  int64_t num_good = 0;
  double goodput = 0;  // req/s meeting all SLOs

  // Prefix cache, from usage.prompt_tokens_details.cached_tokens over the requests that reported
  // it; nullopt when none did.
  int64_t usage_cached_tokens = 0;
  int64_t usage_prompt_tokens_with_cache_info = 0;
  std::optional<double> usage_cache_hit_rate;
};

// `duration_s` is the wall time of the measured phase (first request start to last response end).
ServingMetrics compute_metrics(const std::vector<RequestRecord>& records, double duration_s,
                               const Slo& slo);
nlohmann::json to_json(const ServingMetrics& m);

}  // namespace di::bench
