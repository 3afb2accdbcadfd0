#include "bench/prometheus.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>

namespace di::bench {

std::optional<double> PromText::sum(std::string_view name) const {
  std::optional<double> total;
  for (const PromSample& s : samples) {
    if (s.name == name) total = total.value_or(0.0) + s.value;
  }
  return total;
}

namespace {

bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
bool is_name_char(char c) {
  return is_name_start(c) || (c >= '0' && c <= '9');
}

void skip_blanks(std::string_view s, size_t& i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
}

std::optional<double> parse_value(std::string_view tok) {
  if (tok == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (tok == "+Inf" || tok == "Inf") return std::numeric_limits<double>::infinity();
  if (tok == "-Inf") return -std::numeric_limits<double>::infinity();
  std::string buf(tok);
  char* end = nullptr;
  const double v = std::strtod(buf.c_str(), &end);
  if (buf.empty() || end != buf.c_str() + buf.size()) return std::nullopt;
  return v;
}

// One sample line; returns an error message or "".
std::string parse_sample(std::string_view line, PromSample& out) {
  size_t i = 0;
  if (i >= line.size() || !is_name_start(line[i])) return "expected a metric name";
  while (i < line.size() && is_name_char(line[i])) ++i;
  out.name = std::string(line.substr(0, i));
  skip_blanks(line, i);
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (true) {
      skip_blanks(line, i);
      if (i < line.size() && line[i] == '}') {
        ++i;
        break;
      }
      const size_t name_start = i;
      if (i >= line.size() || !is_name_start(line[i])) return "expected a label name";
      while (i < line.size() && is_name_char(line[i])) ++i;
      std::string label(line.substr(name_start, i - name_start));
      skip_blanks(line, i);
      if (i >= line.size() || line[i] != '=') return "expected '=' after label " + label;
      ++i;
      skip_blanks(line, i);
      if (i >= line.size() || line[i] != '"') return "expected '\"' to open the value of " + label;
      ++i;
      std::string value;
      bool closed = false;
      while (i < line.size()) {
        const char c = line[i++];
        if (c == '"') {
          closed = true;
          break;
        }
        if (c == '\\' && i < line.size()) {
          const char e = line[i++];
          value.push_back(e == 'n' ? '\n' : e);  // \\ -> \, \" -> ", \n -> newline
        } else {
          value.push_back(c);
        }
      }
      if (!closed) return "unterminated value of label " + label;
      out.labels[label] = std::move(value);
      skip_blanks(line, i);
      if (i < line.size() && line[i] == ',') ++i;
    }
  }
  skip_blanks(line, i);
  size_t value_end = i;
  while (value_end < line.size() && line[value_end] != ' ' && line[value_end] != '\t') ++value_end;
  if (value_end == i) return "missing value";
  auto v = parse_value(line.substr(i, value_end - i));
  if (!v) return "bad value '" + std::string(line.substr(i, value_end - i)) + "'";
  out.value = *v;
  i = value_end;
  skip_blanks(line, i);
  if (i < line.size() && line[i] != '#') {  // optional timestamp, then possibly an exemplar
    size_t ts_end = i;
    while (ts_end < line.size() && line[ts_end] != ' ' && line[ts_end] != '\t') ++ts_end;
    if (!parse_value(line.substr(i, ts_end - i))) return "bad timestamp";
    i = ts_end;
    skip_blanks(line, i);
    if (i < line.size() && line[i] != '#') return "unexpected text after the timestamp";
  }
  return "";
}

}  // namespace

Result<PromText> parse_prometheus_text(std::string_view text) {
  PromText out;
  size_t line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    size_t i = 0;
    skip_blanks(line, i);
    line.remove_prefix(i);
    if (line.empty()) continue;
    if (line.front() == '#') {
      // "# TYPE name kind"; HELP and other comments carry nothing we need.
      constexpr std::string_view kType = "# TYPE ";
      if (line.substr(0, kType.size()) == kType) {
        std::string_view rest = line.substr(kType.size());
        const size_t sp = rest.find(' ');
        if (sp != std::string_view::npos) {
          out.types[std::string(rest.substr(0, sp))] = std::string(rest.substr(sp + 1));
        }
      }
      continue;
    }
    PromSample sample;
    if (std::string err = parse_sample(line, sample); !err.empty()) {
      return make_status(StatusCode::kInvalidArgument, "metrics line {}: {}: '{}'", line_no, err,
                         line);
    }
    out.samples.push_back(std::move(sample));
  }
  return out;
}

std::optional<PrefixCacheCounters> find_prefix_cache_counters(const PromText& text,
                                                              const std::string& hit_name,
                                                              const std::string& query_name) {
  // (hit tokens, looked-up tokens): both in tokens, both monotonic counters.
  static const std::pair<const char*, const char*> kKnown[] = {
      {"deepinfer_prefix_cache_hit_tokens_total", "deepinfer_engine_prompt_tokens_total"},
      {"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"},
      {"vllm:prefix_cache_hits", "vllm:prefix_cache_queries"},
      {"sglang:cached_tokens_total", "sglang:prompt_tokens_total"},
  };
  auto try_pair = [&](const std::string& hit,
                      const std::string& query) -> std::optional<PrefixCacheCounters> {
    auto h = text.sum(hit);
    auto q = text.sum(query);
    if (!h || !q) return std::nullopt;
    return PrefixCacheCounters{hit, query, *h, *q};
  };
  if (!hit_name.empty() || !query_name.empty()) return try_pair(hit_name, query_name);
  for (const auto& [hit, query] : kKnown) {
    if (auto c = try_pair(hit, query)) return c;
  }
  return std::nullopt;
}

}  // namespace di::bench
