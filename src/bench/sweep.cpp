#include "bench/sweep.h"

#include <fmt/format.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/error.h"
#include "core/logging.h"

namespace di::bench {

using nlohmann::json;

std::vector<int32_t> parse_int_list(const std::string& text) {
  std::vector<int32_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    size_t used = 0;
    long v = 0;
    try {
      v = std::stol(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DI_CHECK(!item.empty() && used == item.size() && v >= 1 && v <= 1'000'000,
             "'{}' in '{}' is not a positive integer", item, text);
    out.push_back(static_cast<int32_t>(v));
  }
  DI_CHECK(!out.empty(), "empty list '{}'", text);
  return out;
}

std::vector<size_t> pareto_front(const std::vector<std::pair<double, double>>& points) {
  std::vector<size_t> order(points.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // By x descending (ties: y descending); a point is on the front when its y beats every point
  // with a larger-or-equal x seen so far.
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (points[a].first != points[b].first) return points[a].first > points[b].first;
    return points[a].second > points[b].second;
  });
  std::vector<size_t> front;
  double best_y = -INFINITY;
  for (size_t i : order) {
    if (points[i].second > best_y) {
      front.push_back(i);
      best_y = points[i].second;
    }
  }
  std::reverse(front.begin(), front.end());
  return front;
}

namespace {

double num_or(const json& j, double fallback = 0) {
  return j.is_number() ? j.get<double>() : fallback;
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path);
  DI_CHECK(out.good(), "cannot write '{}'", path.string());
  out << text;
}

// Single quotes for gnuplot strings.
std::string gp_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

}  // namespace

json run_sweep(ServeBench& bench, const SweepOptions& o) {
  DI_CHECK(!o.concurrencies.empty(), "give --concurrency 1,2,4,...");
  DI_CHECK(o.num_gpus >= 1, "--num-gpus must be >= 1, got {}", o.num_gpus);
  std::filesystem::create_directories(o.output_dir);
  json runs = json::array();
  for (size_t i = 0; i < o.concurrencies.size(); ++i) {
    const int32_t c = o.concurrencies[i];
    ServeBenchOptions run = o.base;
    run.load.concurrency = c;
    run.load.progress_label = fmt::format("c={}", c);
    if (o.prompts_per_concurrency > 0) {
      run.dataset.num_requests = std::max<int64_t>(
          static_cast<int64_t>(o.prompts_per_concurrency) * c, run.dataset.num_requests);
    }
    if (o.vary_seed) run.dataset.seed = o.base.dataset.seed + 1000 * i;
    run.result_json =
        (std::filesystem::path(o.output_dir) / fmt::format("run_c{}.json", c)).string();
    DI_LOG_INFO("sweep: concurrency {} ({} requests)", c, run.dataset.num_requests);
    json r = bench.run(run);
    const json& m = r.at("metrics");
    json point = {
        {"concurrency", c},
        {"num_requests", m.at("num_requests")},
        {"failed", m.at("failed")},
        {"output_token_throughput", m.at("output_token_throughput")},
        {"output_token_throughput_per_gpu",
         num_or(m.at("output_token_throughput")) / static_cast<double>(o.num_gpus)},
        {"total_token_throughput_per_gpu",
         num_or(m.at("total_token_throughput")) / static_cast<double>(o.num_gpus)},
        {"output_tokens_per_user_s_mean", m.at("output_tokens_per_user_s").at("mean")},
        {"ttft_ms_p50", m.at("ttft_ms").at("p50")},
        {"ttft_ms_p99", m.at("ttft_ms").at("p99")},
        {"tpot_ms_mean", m.at("tpot_ms").at("mean")},
        {"prefix_cache_hit_rate_usage", m.at("prefix_cache_usage").at("hit_rate")},
        {"prefix_cache_hit_rate_server",
         r.at("prefix_cache_server_metrics").is_object()
             ? r.at("prefix_cache_server_metrics").value("hit_rate", json(nullptr))
             : json(nullptr)},
    };
    runs.push_back({{"point", point}, {"result", r}});
  }
  std::vector<std::pair<double, double>> pts;
  for (const json& run : runs) {
    pts.emplace_back(num_or(run["point"]["output_tokens_per_user_s_mean"]),
                     num_or(run["point"]["output_token_throughput_per_gpu"]));
  }
  json front = json::array();
  for (size_t i : pareto_front(pts)) front.push_back(o.concurrencies[i]);
  json sweep = {{"tool", "deepinfer bench sweep"},
                {"num_gpus", o.num_gpus},
                {"concurrencies", o.concurrencies},
                {"pareto_front_concurrencies", front},
                {"runs", runs}};
  sweep["plots"] = plot_sweep(sweep, o.output_dir, o.gnuplot);
  write_file(std::filesystem::path(o.output_dir) / "sweep.json", sweep.dump(2) + "\n");
  // A compact table of the sweep on stdout.
  std::cout << fmt::format("{:>6} {:>16} {:>16} {:>12} {:>12} {:>10}\n", "conc", "out tok/s/GPU",
                           "tok/s/user", "TTFT p50", "TTFT p99", "cache hit");
  for (const json& run : runs) {
    const json& p = run["point"];
    const json& hit = p["prefix_cache_hit_rate_usage"];
    std::cout << fmt::format(
        "{:>6} {:>16.1f} {:>16.1f} {:>12.1f} {:>12.1f} {:>10}\n", p["concurrency"].get<int>(),
        num_or(p["output_token_throughput_per_gpu"]), num_or(p["output_tokens_per_user_s_mean"]),
        num_or(p["ttft_ms_p50"]), num_or(p["ttft_ms_p99"]),
        hit.is_number() ? fmt::format("{:.1f}%", hit.get<double>() * 100) : std::string("n/a"));
  }
  return sweep;
}

std::vector<std::string> plot_sweep(const json& sweep, const std::string& output_dir,
                                    const std::string& gnuplot) {
  namespace fs = std::filesystem;
  const fs::path dir(output_dir);
  std::string dat = "# concurrency tok_s_per_user out_tok_s_per_gpu ttft_p50_ms ttft_p99_ms\n";
  std::vector<std::pair<double, double>> pts;
  for (const json& run : sweep.at("runs")) {
    const json& p = run.at("point");
    dat += fmt::format("{} {:.6g} {:.6g} {:.6g} {:.6g}\n", p.at("concurrency").get<int>(),
                       num_or(p.at("output_tokens_per_user_s_mean")),
                       num_or(p.at("output_token_throughput_per_gpu")), num_or(p.at("ttft_ms_p50")),
                       num_or(p.at("ttft_ms_p99")));
    pts.emplace_back(num_or(p.at("output_tokens_per_user_s_mean")),
                     num_or(p.at("output_token_throughput_per_gpu")));
  }
  std::string front = "# the Pareto front, by tok_s_per_user\n";
  for (size_t i : pareto_front(pts))
    front += fmt::format("{:.6g} {:.6g}\n", pts[i].first, pts[i].second);
  write_file(dir / "sweep.dat", dat);
  write_file(dir / "pareto_front.dat", front);

  const std::string gpus = fmt::format("{} GPU{}", sweep.at("num_gpus").get<int>(),
                                       sweep.at("num_gpus").get<int>() > 1 ? "s" : "");
  const fs::path pareto_png = dir / "pareto.png";
  const fs::path ttft_png = dir / "ttft_vs_throughput.png";
  const std::string common =
      "set terminal pngcairo size 900,600 font 'sans,11'\n"
      "set grid\nset key top right\nset datafile commentschars '#'\n";
  const std::string pareto_gp = fmt::format(
      "{}set output {}\n"
      "set title 'Output throughput per GPU vs per-user speed ({})'\n"
      "set xlabel 'output tokens/s per user (mean of 1/TPOT)'\n"
      "set ylabel 'output tokens/s per GPU'\n"
      "set offsets graph 0.05, graph 0.1, graph 0.1, graph 0.05\n"
      "plot {} using 2:3 with points pt 7 ps 1.5 title 'concurrency', \\\n"
      "     {} using 2:3:(sprintf('c=%d', $1)) with labels offset 1.2,0.8 notitle, \\\n"
      "     {} using 1:2 with lines lw 2 title 'Pareto front'\n",
      common, gp_quote(pareto_png.string()), gpus, gp_quote((dir / "sweep.dat").string()),
      gp_quote((dir / "sweep.dat").string()), gp_quote((dir / "pareto_front.dat").string()));
  const std::string ttft_gp = fmt::format(
      "{}set output {}\n"
      "set title 'Time to first token vs output throughput ({})'\n"
      "set xlabel 'output tokens/s per GPU'\n"
      "set ylabel 'TTFT (ms)'\n"
      "set offsets graph 0.05, graph 0.1, graph 0.1, graph 0.05\n"
      "plot {} using 3:4 with linespoints pt 7 lw 2 title 'TTFT p50', \\\n"
      "     {} using 3:5 with linespoints pt 5 lw 2 title 'TTFT p99', \\\n"
      "     {} using 3:5:(sprintf('c=%d', $1)) with labels offset 1.2,0.8 notitle\n",
      common, gp_quote(ttft_png.string()), gpus, gp_quote((dir / "sweep.dat").string()),
      gp_quote((dir / "sweep.dat").string()), gp_quote((dir / "sweep.dat").string()));
  write_file(dir / "pareto.gp", pareto_gp);
  write_file(dir / "ttft_vs_throughput.gp", ttft_gp);
  // Single-quoted shell words; a path holding a single quote is refused rather than escaped.
  DI_CHECK(gnuplot.find('\'') == std::string::npos && output_dir.find('\'') == std::string::npos,
           "paths with a single quote are not supported: '{}'", output_dir);
  for (const char* script : {"pareto.gp", "ttft_vs_throughput.gp"}) {
    const std::string cmd = fmt::format("'{}' '{}' 2>&1", gnuplot, (dir / script).string());
    const int rc = std::system(cmd.c_str());
    DI_CHECK(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0,
             "'{}' failed (exit {}); is gnuplot installed (scripts/setup_deps.sh)?", cmd,
             rc == -1 ? -1 : WEXITSTATUS(rc));
  }
  return {pareto_png.string(), ttft_png.string()};
}

}  // namespace di::bench
