#pragma once
// Parser for the Prometheus text exposition format (what a server's /metrics returns), enough to
// read counters before and after a benchmark:
//
//   # HELP name text
//   # TYPE name counter
//   name{label="value",other="a \"quoted\" \\ value\n"} 1234.5 [timestamp_ms]
//
// Values may be NaN, +Inf, -Inf. Names may contain ':' (vLLM's "vllm:prefix_cache_hits_total").
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace di::bench {

struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct PromText {
  std::vector<PromSample> samples;
  std::map<std::string, std::string> types;  // from "# TYPE" lines

  // Sum over every sample called `name` (all label sets); nullopt if there is none.
  std::optional<double> sum(std::string_view name) const;
};

// A malformed sample line is an error that names the line number.
Result<PromText> parse_prometheus_text(std::string_view text);

// Prefix-cache counters found in a /metrics page: tokens served from the cache and tokens looked
// up. Known names (first match wins) cover deepinfer, vLLM and SGLang; `hit_name`/`query_name`
// override them.
struct PrefixCacheCounters {
  std::string hit_metric;
  std::string query_metric;
  double hit_tokens = 0;
  double query_tokens = 0;
};
std::optional<PrefixCacheCounters> find_prefix_cache_counters(const PromText& text,
                                                              const std::string& hit_name = "",
                                                              const std::string& query_name = "");

}  // namespace di::bench
