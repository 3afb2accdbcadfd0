#pragma once
// `deepinfer bench sweep`: `bench serve` at each of a list of concurrencies, then Pareto plots
// (gnuplot, PNG) and one combined JSON:
//
//   <out>/sweep.json                   every run's results + the Pareto front
//   <out>/run_c<N>.json                one `bench serve` result per concurrency
//   <out>/pareto.png                   output tok/s per GPU vs output tok/s per user
//   <out>/ttft_vs_throughput.png       TTFT p50 / p99 vs output tok/s per GPU
//   <out>/sweep.dat, <out>/*.gp        the plotted numbers and the gnuplot scripts (re-runnable)
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/serve_bench.h"

namespace di::bench {

struct SweepOptions {
  ServeBenchOptions base;  // dataset, endpoint, SLOs...; concurrency is set per run
  std::vector<int32_t> concurrencies;
  int32_t num_gpus = 1;                 // throughput is divided by this
  int32_t prompts_per_concurrency = 0;  // > 0: num_prompts = max(this * concurrency, base's)
  std::string output_dir = "bench-sweep";
  std::string gnuplot = "gnuplot";
  // Each run gets its own dataset seed, so prompts of one run are not cache hits in the next.
  bool vary_seed = true;
};

// Parses "1,2,4,8"; throws di::Error on anything but positive integers.
std::vector<int32_t> parse_int_list(const std::string& text);

// Indices of the points not dominated when both coordinates are maximized, sorted by x.
std::vector<size_t> pareto_front(const std::vector<std::pair<double, double>>& points);

nlohmann::json run_sweep(ServeBench& bench, const SweepOptions& options);

// Writes the data and scripts and runs gnuplot on them; returns the PNG paths. Throws di::Error
// when gnuplot fails.
std::vector<std::string> plot_sweep(const nlohmann::json& sweep, const std::string& output_dir,
                                    const std::string& gnuplot);

}  // namespace di::bench
