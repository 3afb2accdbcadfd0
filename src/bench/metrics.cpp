#include "bench/metrics.h"

#include <nlohmann/json.hpp>

#include <charconv>

#include "core/error.h"

namespace di::bench {

Slo parse_slo(const std::vector<std::string>& items) {
  Slo slo;
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    DI_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < item.size(),
             "--goodput item '{}' is not name:milliseconds (names: ttft, tpot, e2el)", item);
    const std::string name = item.substr(0, colon);
    const std::string num = item.substr(colon + 1);
    double ms = 0;
    auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), ms);
    DI_CHECK(ec == std::errc() && ptr == num.data() + num.size() && ms > 0,
             "--goodput item '{}': '{}' is not a positive number of milliseconds", item, num);
    if (name == "ttft") {
      slo.ttft_ms = ms;
    } else if (name == "tpot") {
      slo.tpot_ms = ms;
    } else if (name == "e2el") {
      slo.e2el_ms = ms;
    } else {
      DI_FAIL("--goodput item '{}': unknown metric '{}' (use ttft, tpot or e2el)", item, name);
    }
  }
  return slo;
}

namespace {

// TPOT of one request in ms; nullopt below two output tokens (there is no decode interval).
std::optional<double> tpot_ms(const RequestRecord& r) {
  if (!r.has_first_token() || r.output_tokens < 2) return std::nullopt;
  return (r.e2e_s() - r.ttft_s()) * 1000.0 / static_cast<double>(r.output_tokens - 1);
}

}  // namespace

bool meets_slo(const RequestRecord& r, const Slo& slo) {
  if (!r.success) return false;
  if (slo.ttft_ms && (!r.has_first_token() || r.ttft_s() * 1000.0 > *slo.ttft_ms)) return false;
  if (slo.tpot_ms) {
    // A one-token answer has no decode phase; it cannot miss a TPOT target.
    if (auto t = tpot_ms(r); t && *t > *slo.tpot_ms) return false;
  }
  if (slo.e2el_ms && r.e2e_s() * 1000.0 > *slo.e2el_ms) return false;
  return true;
}

ServingMetrics compute_metrics(const std::vector<RequestRecord>& records, double duration_s,
                               const Slo& slo) {
  DI_CHECK(duration_s > 0, "benchmark duration must be positive, got {}", duration_s);
  ServingMetrics m;
  m.num_requests = static_cast<int64_t>(records.size());
  m.duration_s = duration_s;
  m.has_slo = !slo.empty();
  std::vector<double> ttft, tpot, itl, e2el, per_user, in_tok, out_tok;
  double sum_e2e = 0;
  for (const RequestRecord& r : records) {
    if (!r.success) {
      ++m.num_failed;
      ++m.errors_by_type[r.error_type.empty() ? "unknown" : r.error_type];
      continue;
    }
    ++m.num_completed;
    m.total_input_tokens += r.input_tokens();
    m.total_output_tokens += r.output_tokens;
    m.max_output_tokens = std::max<int64_t>(m.max_output_tokens, r.output_tokens);
    in_tok.push_back(r.input_tokens());
    out_tok.push_back(r.output_tokens);
    e2el.push_back(r.e2e_s() * 1000.0);
    sum_e2e += r.e2e_s();
    if (r.has_first_token()) ttft.push_back(r.ttft_s() * 1000.0);
    if (auto t = tpot_ms(r)) {
      tpot.push_back(*t);
      if (*t > 0) per_user.push_back(1000.0 / *t);
    }
    for (size_t i = 1; i < r.chunk_times.size(); ++i) {
      itl.push_back((r.chunk_times[i] - r.chunk_times[i - 1]) * 1000.0);
    }
    if (r.usage_cached_tokens >= 0 && r.usage_prompt_tokens >= 0) {
      m.usage_cached_tokens += r.usage_cached_tokens;
      m.usage_prompt_tokens_with_cache_info += r.usage_prompt_tokens;
    }
    if (m.has_slo && meets_slo(r, slo)) ++m.num_good;
  }
  m.request_throughput = static_cast<double>(m.num_completed) / duration_s;
  m.input_token_throughput = static_cast<double>(m.total_input_tokens) / duration_s;
  m.output_token_throughput = static_cast<double>(m.total_output_tokens) / duration_s;
  m.total_token_throughput =
      static_cast<double>(m.total_input_tokens + m.total_output_tokens) / duration_s;
  m.mean_concurrency = sum_e2e / duration_s;
  m.goodput = static_cast<double>(m.num_good) / duration_s;
  m.ttft_ms = summarize(std::move(ttft));
  m.tpot_ms = summarize(std::move(tpot));
  m.itl_ms = summarize(std::move(itl));
  m.e2el_ms = summarize(std::move(e2el));
  m.output_tokens_per_user_s = summarize(std::move(per_user));
  m.input_tokens = summarize(std::move(in_tok));
  m.output_tokens = summarize(std::move(out_tok));
  if (m.usage_prompt_tokens_with_cache_info > 0) {
    m.usage_cache_hit_rate = static_cast<double>(m.usage_cached_tokens) /
                             static_cast<double>(m.usage_prompt_tokens_with_cache_info);
  }
  return m;
}

nlohmann::json to_json(const ServingMetrics& m) {
  nlohmann::json j;
  j["num_requests"] = m.num_requests;
  j["completed"] = m.num_completed;
  j["failed"] = m.num_failed;
  j["errors_by_type"] = m.errors_by_type;
  j["duration_s"] = m.duration_s;
  j["total_input_tokens"] = m.total_input_tokens;
  j["total_output_tokens"] = m.total_output_tokens;
  j["request_throughput"] = m.request_throughput;
  j["input_token_throughput"] = m.input_token_throughput;
  j["output_token_throughput"] = m.output_token_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  j["mean_concurrency"] = m.mean_concurrency;
  j["ttft_ms"] = to_json(m.ttft_ms);
  j["tpot_ms"] = to_json(m.tpot_ms);
  j["itl_ms"] = to_json(m.itl_ms);
  j["e2el_ms"] = to_json(m.e2el_ms);
  j["output_tokens_per_user_s"] = to_json(m.output_tokens_per_user_s);
  j["input_tokens_per_request"] = to_json(m.input_tokens);
  j["output_tokens_per_request"] = to_json(m.output_tokens);
  if (m.has_slo) {
    j["goodput"] = {{"good_requests", m.num_good},
                    {"request_goodput", m.goodput},
                    {"fraction", m.num_requests ? static_cast<double>(m.num_good) /
                                                      static_cast<double>(m.num_requests)
                                                : 0.0}};
  }
  j["prefix_cache_usage"] = {
      {"cached_tokens", m.usage_cached_tokens},
      {"prompt_tokens", m.usage_prompt_tokens_with_cache_info},
      {"hit_rate",
       m.usage_cache_hit_rate ? nlohmann::json(*m.usage_cache_hit_rate) : nlohmann::json(nullptr)}};
  return j;
}

}  // namespace di::bench
