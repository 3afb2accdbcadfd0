#include "bench/serve_bench.h"

#include <fmt/format.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <iostream>

#include "bench/prometheus.h"
#include "core/error.h"
#include "core/logging.h"
#include "model/default_model.h"

namespace di::bench {

using nlohmann::json;

std::string default_tokenizer_path() {
  auto dir = find_default_model_dir();
  DI_CHECK(dir.is_ok(), "no --tokenizer given and no default model found: {}",
           dir.status().message());
  return dir.value();
}

json prefix_cache_delta(const std::string& before, const std::string& after,
                        const std::string& hit_name, const std::string& query_name) {
  auto b = parse_prometheus_text(before);
  auto a = parse_prometheus_text(after);
  if (!b.is_ok()) return {{"error", b.status().message()}};
  if (!a.is_ok()) return {{"error", a.status().message()}};
  auto cb = find_prefix_cache_counters(b.value(), hit_name, query_name);
  auto ca = find_prefix_cache_counters(a.value(), hit_name, query_name);
  if (!cb || !ca || cb->hit_metric != ca->hit_metric) {
    return {{"error", "no prefix-cache counters found in the metrics page"}};
  }
  const double hits = ca->hit_tokens - cb->hit_tokens;
  const double queries = ca->query_tokens - cb->query_tokens;
  json j = {{"hit_metric", ca->hit_metric},
            {"query_metric", ca->query_metric},
            {"hit_tokens", hits},
            {"query_tokens", queries}};
  j["hit_rate"] = queries > 0 ? json(hits / queries) : json(nullptr);
  return j;
}

namespace {

std::string iso_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The first model a server lists, for runs without --model.
std::string first_served_model(const std::string& base_url) {
  auto body = http_get(base_url, "/v1/models");
  DI_CHECK(body.is_ok(), "no --model given and {}", body.status().message());
  json j = json::parse(body.value(), nullptr, /*allow_exceptions=*/false);
  DI_CHECK(j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
               j["data"][0].contains("id"),
           "no --model given and /v1/models lists no model");
  return j["data"][0]["id"].get<std::string>();
}

json record_json(const RequestRecord& r) {
  json j = {{"request_idx", r.request_idx},
            {"session", r.session_idx},
            {"turn", r.turn_idx},
            {"success", r.success},
            {"start_s", r.start_s},
            {"end_s", r.end_s},
            {"dataset_prompt_tokens", r.dataset_prompt_tokens},
            {"usage_prompt_tokens", r.usage_prompt_tokens},
            {"usage_cached_tokens", r.usage_cached_tokens},
            {"output_tokens", r.output_tokens},
            {"max_tokens", r.max_tokens},
            {"finish_reason", r.finish_reason},
            {"chunk_times", r.chunk_times}};
  if (!r.success) {
    j["error_type"] = r.error_type;
    j["error_message"] = r.error_message;
  }
  return j;
}

}  // namespace

ServeBench::ServeBench(const std::string& tokenizer_path)
    : tokenizer_path_(tokenizer_path.empty() ? default_tokenizer_path() : tokenizer_path) {
  auto tok = recipe::Tokenizer::from_file(tokenizer_path_);
  DI_CHECK(tok.is_ok(), "cannot load tokenizer '{}': {}", tokenizer_path_, tok.status().message());
  tokenizer_ = tok.value();
}

json ServeBench::run(ServeBenchOptions o) {
  if (o.client.model.empty()) o.client.model = first_served_model(o.client.base_url);
  o.dataset.format = format_of_endpoint(o.client.endpoint);

  PromptTextBuilder text(tokenizer_, o.dataset.seed);
  const auto t_build = std::chrono::steady_clock::now();
  const Dataset dataset = build_dataset(o.dataset, text);
  DI_LOG_INFO("dataset {}: {} requests in {} sessions, built in {:.1f} s", dataset.name,
              dataset.requests.size(), dataset.num_sessions,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t_build).count());
  if (dataset.num_length_checked > 0 && dataset.num_exact_length != dataset.num_length_checked) {
    DI_LOG_WARN("{} of {} prompts re-tokenize to a length other than asked for (see the JSON)",
                dataset.num_length_checked - dataset.num_exact_length, dataset.num_length_checked);
  }
  auto count_tokens = [this](const std::string& s) {
    return static_cast<int32_t>(tokenizer_->encode_ordinary(s).size());
  };

  if (o.num_warmups > 0) {
    // Short random prompts of their own seed: they wake the server up without putting the
    // measured prompts into its prefix cache.
    DatasetOptions w;
    w.name = "random";
    w.format = o.dataset.format;
    w.num_requests = o.num_warmups;
    w.input_len = 64;
    w.output_len = 8;
    w.seed = o.dataset.seed + 0x5eed;
    PromptTextBuilder wtext(tokenizer_, w.seed);
    LoadOptions wl;
    wl.concurrency = o.load.concurrency > 0 ? std::min(o.load.concurrency, o.num_warmups) : 0;
    wl.progress = false;
    LoadResult warm = run_load(build_dataset(w, wtext), o.client, wl, count_tokens);
    int64_t ok = 0;
    for (const RequestRecord& r : warm.records) ok += r.success ? 1 : 0;
    DI_CHECK(ok > 0, "all {} warmup requests to {}{} failed; first error: {}: {}", o.num_warmups,
             o.client.base_url, o.client.endpoint, warm.records[0].error_type,
             warm.records[0].error_message.substr(0, 500));
  }

  std::optional<std::string> metrics_before;
  if (!o.metrics_path.empty()) {
    auto m = http_get(o.client.base_url, o.metrics_path);
    if (m.is_ok()) metrics_before = m.value();
  }
  LoadResult load = run_load(dataset, o.client, o.load, count_tokens);
  json cache_server;
  if (!o.metrics_path.empty()) {
    auto after = http_get(o.client.base_url, o.metrics_path);
    if (!metrics_before) {
      cache_server = {{"error", "could not read " + o.metrics_path + " before the run"}};
    } else if (!after.is_ok()) {
      cache_server = {{"error", after.status().message()}};
    } else {
      cache_server = prefix_cache_delta(*metrics_before, after.value(), o.metrics_hit_name,
                                        o.metrics_query_name);
    }
  }

  const ServingMetrics m = compute_metrics(load.records, load.duration_s, o.slo);
  int64_t from_usage = 0;
  for (const RequestRecord& r : load.records) from_usage += r.output_tokens_from_usage ? 1 : 0;

  json j;
  j["tool"] = "deepinfer bench serve";
  j["date"] = iso_now();
  j["base_url"] = o.client.base_url;
  j["endpoint"] = o.client.endpoint;
  j["model"] = o.client.model;
  j["tokenizer"] = tokenizer_path_;
  j["ignore_eos"] = o.client.ignore_eos;
  j["load"] = {{"concurrency", o.load.concurrency},
               {"request_rate", o.load.request_rate > 0 ? json(o.load.request_rate) : json("inf")},
               {"burstiness", o.load.burstiness},
               {"seed", o.load.seed},
               {"num_warmups", o.num_warmups}};
  j["dataset"] = dataset.describe();
  if (!o.slo.empty()) {
    json slo = json::object();
    if (o.slo.ttft_ms) slo["ttft_ms"] = *o.slo.ttft_ms;
    if (o.slo.tpot_ms) slo["tpot_ms"] = *o.slo.tpot_ms;
    if (o.slo.e2el_ms) slo["e2el_ms"] = *o.slo.e2el_ms;
    j["slo"] = slo;
  }
  j["metrics"] = to_json(m);
  j["metrics"]["output_tokens_from_usage"] = from_usage;
  j["prefix_cache_server_metrics"] = o.metrics_path.empty() ? json(nullptr) : cache_server;
  if (o.save_detailed) {
    json reqs = json::array();
    for (const RequestRecord& r : load.records) reqs.push_back(record_json(r));
    j["requests"] = std::move(reqs);
  } else {
    // The first few failures, so a broken run explains itself without --save-detailed.
    json failures = json::array();
    for (const RequestRecord& r : load.records) {
      if (!r.success && failures.size() < 5) {
        failures.push_back({{"request_idx", r.request_idx},
                            {"error_type", r.error_type},
                            {"error_message", r.error_message.substr(0, 500)}});
      }
    }
    if (!failures.empty()) j["first_failures"] = failures;
  }
  if (o.print_table) std::cout << format_results_table(j) << std::flush;
  if (!o.result_json.empty()) {
    std::ofstream out(o.result_json);
    DI_CHECK(out.good(), "cannot write --result-json '{}'", o.result_json);
    out << j.dump(2) << "\n";
  }
  return j;
}

std::string format_results_table(const json& r) {
  const json& m = r.at("metrics");
  std::string s;
  auto line = [&s](const std::string& name, const std::string& value) {
    s += fmt::format("{:<42}{:>16}\n", name, value);
  };
  auto num = [](const json& v, int prec = 2) {
    return v.is_number() ? fmt::format("{:.{}f}", v.get<double>(), prec) : std::string("n/a");
  };
  s += fmt::format("{:=^58}\n", " Serving benchmark ");
  line("Endpoint", r.value("endpoint", ""));
  line("Dataset", r.at("dataset").value("name", ""));
  const json& load = r.at("load");
  line("Concurrency cap", load.at("concurrency").get<int>() > 0
                              ? std::to_string(load.at("concurrency").get<int>())
                              : std::string("none"));
  line("Request rate (req/s)", load.at("request_rate").is_string()
                                   ? load.at("request_rate").get<std::string>()
                                   : num(load.at("request_rate")));
  line("Successful / failed requests",
       fmt::format("{} / {}", m.at("completed").get<int64_t>(), m.at("failed").get<int64_t>()));
  for (const auto& [type, count] : m.at("errors_by_type").items()) {
    line("  error " + type, std::to_string(count.get<int64_t>()));
  }
  line("Duration (s)", num(m.at("duration_s")));
  line("Total input tokens", std::to_string(m.at("total_input_tokens").get<int64_t>()));
  line("Total output tokens", std::to_string(m.at("total_output_tokens").get<int64_t>()));
  line("Request throughput (req/s)", num(m.at("request_throughput")));
  line("Input token throughput (tok/s)", num(m.at("input_token_throughput")));
  line("Output token throughput (tok/s)", num(m.at("output_token_throughput")));
  line("Total token throughput (tok/s)", num(m.at("total_token_throughput")));
  line("Mean requests in flight", num(m.at("mean_concurrency")));
  if (m.contains("goodput")) {
    line("Request goodput (req/s)", num(m.at("goodput").at("request_goodput")));
    line("Requests meeting the SLOs (%)",
         num(json(m.at("goodput").at("fraction").get<double>() * 100.0), 1));
  }
  auto block = [&](const char* title, const char* key, const char* unit) {
    const json& x = m.at(key);
    s += fmt::format("{:-^58}\n", std::string(" ") + title + " ");
    for (const char* stat : {"mean", "p50", "p90", "p99"}) {
      line(fmt::format("{} {} ({})", stat, key, unit), num(x.at(stat)));
    }
  };
  block("Time to first token", "ttft_ms", "ms");
  block("Time per output token (excl. 1st)", "tpot_ms", "ms");
  block("Inter-token latency", "itl_ms", "ms");
  block("End-to-end latency", "e2el_ms", "ms");
  block("Output speed per user", "output_tokens_per_user_s", "tok/s");
  s += fmt::format("{:-^58}\n", " Prefix cache ");
  const json& pc = m.at("prefix_cache_usage");
  line("Hit rate from usage.cached_tokens (%)",
       pc.at("hit_rate").is_number() ? num(json(pc.at("hit_rate").get<double>() * 100.0), 1)
                                     : std::string("not reported"));
  const json& srv = r.value("prefix_cache_server_metrics", json(nullptr));
  if (srv.is_object()) {
    line("Hit rate from /metrics (%)", srv.contains("hit_rate") && srv.at("hit_rate").is_number()
                                           ? num(json(srv.at("hit_rate").get<double>() * 100.0), 1)
                                           : std::string("n/a"));
  }
  s += fmt::format("{:=^58}\n", "");
  return s;
}

}  // namespace di::bench
