// Pareto front, list parsing, the gnuplot PNGs, and the engine benchmark's derived numbers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "bench/engine_bench.h"
#include "bench/sweep.h"
#include "core/error.h"

namespace di::bench {
namespace {

TEST(Sweep, ParetoFrontMaximizesBoth) {
  // (per-user tok/s, tok/s per GPU) as a concurrency sweep gives them: per-user speed falls as
  // throughput rises; point 3 is dominated by point 2, point 5 duplicates point 4's x.
  const std::vector<std::pair<double, double>> pts = {{100, 100}, {90, 400},  {60, 900}, {50, 800},
                                                      {20, 1500}, {20, 1400}, {5, 1450}};
  const auto front = pareto_front(pts);
  EXPECT_EQ(front, (std::vector<size_t>{4, 2, 1, 0}));  // sorted by x ascending
  EXPECT_TRUE(pareto_front({}).empty());
  EXPECT_EQ(pareto_front({{1, 1}}), (std::vector<size_t>{0}));
}

TEST(Sweep, IntListParsing) {
  EXPECT_EQ(parse_int_list("1,2,4,8"), (std::vector<int32_t>{1, 2, 4, 8}));
  EXPECT_EQ(parse_int_list("16"), (std::vector<int32_t>{16}));
  EXPECT_EQ(parse_int_list(" 1, 2 "), (std::vector<int32_t>{1, 2}));
  for (const char* bad : {"", "1,,2", "0", "-1", "1,x", "2.5", "1 2"}) {
    EXPECT_THROW(parse_int_list(bad), Error) << bad;
  }
}

bool is_png(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  char magic[8] = {};
  f.read(magic, 8);
  return f.gcount() == 8 && std::string(magic, 8) == std::string("\x89PNG\r\n\x1a\n", 8) &&
         std::filesystem::file_size(p) > 2000;
}

TEST(Sweep, PlotsAreValidPngs) {
  nlohmann::json runs = nlohmann::json::array();
  const double user[] = {120, 95, 70, 40};
  const double thr[] = {120, 380, 560, 640};
  for (int i = 0; i < 4; ++i) {
    runs.push_back({{"point",
                     {{"concurrency", 1 << i},
                      {"output_tokens_per_user_s_mean", user[i]},
                      {"output_token_throughput_per_gpu", thr[i]},
                      {"ttft_ms_p50", 20.0 * (i + 1)},
                      {"ttft_ms_p99", 45.0 * (i + 1)}}}});
  }
  const nlohmann::json sweep = {{"num_gpus", 1}, {"runs", runs}};
  const auto dir = std::filesystem::temp_directory_path() / "di_bench_plot_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto pngs = plot_sweep(sweep, dir.string(), "gnuplot");
  ASSERT_EQ(pngs.size(), 2u);
  for (const auto& p : pngs) EXPECT_TRUE(is_png(p)) << p;
  std::ifstream front(dir / "pareto_front.dat");
  std::string all((std::istreambuf_iterator<char>(front)), {});
  EXPECT_NE(all.find("40 640"), std::string::npos) << all;
  // A missing gnuplot is an error, not a silent skip.
  EXPECT_THROW(plot_sweep(sweep, dir.string(), "/nonexistent/gnuplot"), Error);
  std::filesystem::remove_all(dir);
}

TEST(EngineBench, RoundMetricsFromATimeline) {
  // Two requests of 100 prompt tokens. Request 1 is prefilled one step after request 0 (at 0.2 s,
  // while request 0 already decodes at 0.3 s); from 0.2 s on, both decode one token per 0.1 s
  // step.
  EngineRound r;
  r.input_len = 100;
  r.token_times = {{0.1, 0.3, 0.4, 0.5}, {0.2, 0.3, 0.4, 0.5}};
  const EngineRoundMetrics m = engine_round_metrics(r);
  EXPECT_DOUBLE_EQ(m.prefill_tok_s, 200 / 0.2);  // every prompt done at 0.2 s
  EXPECT_NEAR(m.decode_tok_s, 6 / 0.3, 1e-9);    // 6 tokens after 0.2 s, over 0.3 s
  // Gaps that start at or after the prefill end: 2 of request 0, 3 of request 1; request 0's
  // 0.1 -> 0.3 gap spans request 1's prefill and is not a decode step.
  EXPECT_NEAR(m.step_ms_mean, 100, 1e-9);
  EXPECT_NEAR(m.step_ms_p99, 100, 1e-9);
  EXPECT_NEAR(m.ttft_ms_mean, 150, 1e-9);
  EXPECT_NEAR(m.ttft_ms_max, 200, 1e-9);
  EXPECT_NEAR(m.total_tok_s, (200 + 8) / 0.5, 1e-9);
  EXPECT_DOUBLE_EQ(m.e2e_s, 0.5);

  EngineRound one;  // a single token each: prefill only
  one.input_len = 10;
  one.token_times = {{0.05}};
  EXPECT_EQ(engine_round_metrics(one).decode_tok_s, 0);
  one.token_times = {{}};
  EXPECT_THROW(engine_round_metrics(one), Error);
}

}  // namespace
}  // namespace di::bench
