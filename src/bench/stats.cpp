#include "bench/stats.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace di::bench {

double percentile_sorted(const std::vector<double>& sorted, double q) {
  DI_CHECK(!sorted.empty(), "percentile of an empty sample");
  DI_CHECK(q >= 0.0 && q <= 100.0, "percentile {} is outside [0, 100]", q);
  const double rank = q / 100.0 * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + frac * (sorted[hi] - sorted[lo]);
}

Summary summarize(std::vector<double> values) {
  Summary s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.count = values.size();
  const double n = static_cast<double>(values.size());
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / n;
  double ss = 0;
  for (double v : values) ss += (v - s.mean) * (v - s.mean);
  s.std = std::sqrt(ss / n);
  s.min = values.front();
  s.max = values.back();
  s.p50 = percentile_sorted(values, 50);
  s.p90 = percentile_sorted(values, 90);
  s.p99 = percentile_sorted(values, 99);
  return s;
}

nlohmann::json to_json(const Summary& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"std", s.std}, {"min", s.min},
          {"p50", s.p50},     {"p90", s.p90},   {"p99", s.p99}, {"max", s.max}};
}

}  // namespace di::bench
