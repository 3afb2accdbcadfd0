#pragma once
// `deepinfer bench serve`: one benchmark run against an OpenAI-compatible server.
//
//   tokenizer → dataset (exact prompt lengths) → warmup → scrape /metrics → load (run_load)
//   → scrape /metrics → metrics (compute_metrics) → table on stdout, JSON to --result-json
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "bench/dataset.h"
#include "bench/load_runner.h"
#include "bench/metrics.h"
#include "bench/openai_client.h"

namespace di::bench {

struct ServeBenchOptions {
  ClientOptions client;
  DatasetOptions dataset;
  LoadOptions load;
  std::string tokenizer_path;  // tokenizer.json or a directory holding one
  int32_t num_warmups = 1;     // short requests before the measured phase, not counted
  Slo slo;
  std::string metrics_path = "/metrics";  // "" = do not scrape
  std::string metrics_hit_name;           // override the prefix-cache counter names
  std::string metrics_query_name;
  std::string result_json;     // write the results here when set
  bool save_detailed = false;  // per-request timelines in the JSON
  bool print_table = true;
};

class ServeBench {
 public:
  // Loads the tokenizer (throws di::Error when it cannot).
  explicit ServeBench(const std::string& tokenizer_path);

  // Runs one benchmark; returns the results JSON (also written to options.result_json).
  nlohmann::json run(ServeBenchOptions options);

  const std::shared_ptr<const recipe::Tokenizer>& tokenizer() const { return tokenizer_; }

 private:
  std::shared_ptr<const recipe::Tokenizer> tokenizer_;
  std::string tokenizer_path_;
};

// The human-readable summary of a results JSON.
std::string format_results_table(const nlohmann::json& results);

// The tokenizer to use when none is given: the shipped demo model's (the default served model).
std::string default_tokenizer_path();

// Prefix-cache counter deltas between two /metrics pages; an {"error": ...} object when the
// counters are missing.
nlohmann::json prefix_cache_delta(const std::string& before, const std::string& after,
                                  const std::string& hit_name, const std::string& query_name);

}  // namespace di::bench
