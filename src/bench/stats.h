#pragma once
// Summary statistics of a sample, the way serving benchmarks report them.
//
// Percentiles interpolate linearly between closest ranks (numpy's default "linear" method):
// for sorted x[0..n-1] and q in [0, 100], rank r = q/100 * (n-1), result
// x[floor(r)] + (r - floor(r)) * (x[floor(r)+1] - x[floor(r)]). vLLM's `bench serve` and AIPerf
// compute them the same way, so numbers are comparable.
#include <cstddef>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace di::bench {

// q in [0, 100]; `sorted` must be sorted ascending and non-empty.
double percentile_sorted(const std::vector<double>& sorted, double q);

struct Summary {
  size_t count = 0;  // 0: no samples; every other field is then 0
  double mean = 0;
  double std = 0;  // population standard deviation
  double min = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
  double max = 0;
};

Summary summarize(std::vector<double> values);
nlohmann::json to_json(const Summary& s);

}  // namespace di::bench
