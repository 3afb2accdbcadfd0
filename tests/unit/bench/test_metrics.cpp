// Metric math on synthetic timelines: percentiles, TTFT / TPOT / ITL / E2EL definitions,
// throughput, goodput, cache hit rate from usage.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>

#include "bench/metrics.h"
#include "bench/stats.h"
#include "core/error.h"

namespace di::bench {
namespace {

TEST(Stats, PercentileInterpolatesBetweenClosestRanks) {
  const std::vector<double> v = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 100), 4.0);
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 50), 2.5);   // rank 1.5
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 90), 3.7);   // rank 2.7
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 99), 3.97);  // rank 2.97
  EXPECT_DOUBLE_EQ(percentile_sorted({7.0}, 99), 7.0);
  EXPECT_THROW(percentile_sorted({}, 50), Error);
  EXPECT_THROW(percentile_sorted(v, 101), Error);
}

TEST(Stats, SummaryOfOneToHundred) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);  // unsorted input
  const Summary s = summarize(v);
  EXPECT_EQ(s.count, 100u);
  EXPECT_DOUBLE_EQ(s.mean, 50.5);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 100);
  EXPECT_DOUBLE_EQ(s.p50, 50.5);
  EXPECT_NEAR(s.p90, 90.1, 1e-9);
  EXPECT_NEAR(s.p99, 99.01, 1e-9);
  EXPECT_NEAR(s.std, std::sqrt((100.0 * 100.0 - 1) / 12.0), 1e-9);  // discrete uniform
  EXPECT_EQ(summarize({}).count, 0u);
}

// start at `start`; chunks at the given times; end at `end`; usage reports `out` tokens.
RequestRecord timeline(double start, std::vector<double> chunks, double end, int32_t out,
                       int32_t in = 100) {
  RequestRecord r;
  r.start_s = start;
  r.chunk_times = std::move(chunks);
  r.end_s = end;
  r.output_tokens = out;
  r.output_tokens_from_usage = true;
  r.usage_prompt_tokens = in;
  r.success = true;
  return r;
}

TEST(Metrics, TtftTpotItlE2elDefinitions) {
  // Request A: sent at 0, first chunk at 0.2, then 4 more chunks 0.1 apart, done at 0.6.
  // 5 tokens: TPOT = (0.6 - 0.2) / 4 = 0.1 s; ITLs are the 4 gaps of 0.1 s.
  // Request B: sent at 1, one chunk carrying 3 tokens (spec decoding / stream interval) at 1.5,
  // a second chunk carrying 2 more at 2.0, done at 2.0. TPOT = (1.0 - 0.5) / 4 = 0.125 s, but its
  // only ITL is the single 0.5 s gap between chunks: ITL counts chunks, TPOT counts tokens.
  std::vector<RequestRecord> rs = {timeline(0.0, {0.2, 0.3, 0.4, 0.5, 0.6}, 0.6, 5),
                                   timeline(1.0, {1.5, 2.0}, 2.0, 5)};
  const ServingMetrics m = compute_metrics(rs, 2.0, Slo{});
  EXPECT_EQ(m.num_completed, 2);
  EXPECT_EQ(m.ttft_ms.count, 2u);
  EXPECT_NEAR(m.ttft_ms.mean, (200.0 + 500.0) / 2, 1e-9);
  EXPECT_NEAR(m.ttft_ms.min, 200.0, 1e-9);
  EXPECT_NEAR(m.e2el_ms.mean, (600.0 + 1000.0) / 2, 1e-9);
  ASSERT_EQ(m.tpot_ms.count, 2u);
  EXPECT_NEAR(m.tpot_ms.min, 100.0, 1e-9);
  EXPECT_NEAR(m.tpot_ms.max, 125.0, 1e-9);
  ASSERT_EQ(m.itl_ms.count, 5u);  // 4 gaps from A + 1 from B, pooled
  EXPECT_NEAR(m.itl_ms.p50, 100.0, 1e-9);
  EXPECT_NEAR(m.itl_ms.max, 500.0, 1e-9);
  EXPECT_NEAR(m.itl_ms.mean, (4 * 100.0 + 500.0) / 5, 1e-9);
  // Per-user speed is 1 / TPOT of each request: 10 and 8 tok/s.
  EXPECT_NEAR(m.output_tokens_per_user_s.mean, 9.0, 1e-9);
  // Throughputs over the 2 s duration.
  EXPECT_NEAR(m.request_throughput, 1.0, 1e-12);
  EXPECT_NEAR(m.output_token_throughput, 5.0, 1e-12);
  EXPECT_NEAR(m.input_token_throughput, 100.0, 1e-12);
  EXPECT_NEAR(m.total_token_throughput, 105.0, 1e-12);
  EXPECT_NEAR(m.mean_concurrency, (0.6 + 1.0) / 2.0, 1e-12);
}

TEST(Metrics, SingleTokenOutputHasNoTpotButHasTtft) {
  std::vector<RequestRecord> rs = {timeline(0.0, {0.3}, 0.31, 1)};
  const ServingMetrics m = compute_metrics(rs, 1.0, Slo{});
  EXPECT_EQ(m.ttft_ms.count, 1u);
  EXPECT_EQ(m.tpot_ms.count, 0u);
  EXPECT_EQ(m.itl_ms.count, 0u);
  EXPECT_EQ(m.output_tokens_per_user_s.count, 0u);
}

TEST(Metrics, FailuresAreCountedByTypeAndExcludedFromLatencies) {
  std::vector<RequestRecord> rs = {timeline(0.0, {0.1, 0.2}, 0.2, 2)};
  RequestRecord bad;
  bad.success = false;
  bad.error_type = "http_503";
  bad.start_s = 0;
  bad.end_s = 5;  // a slow failure must not show up in E2EL
  rs.push_back(bad);
  rs.push_back(bad);
  bad.error_type = "timeout";
  rs.push_back(bad);
  const ServingMetrics m = compute_metrics(rs, 1.0, Slo{});
  EXPECT_EQ(m.num_requests, 4);
  EXPECT_EQ(m.num_completed, 1);
  EXPECT_EQ(m.num_failed, 3);
  EXPECT_EQ(m.errors_by_type.at("http_503"), 2);
  EXPECT_EQ(m.errors_by_type.at("timeout"), 1);
  EXPECT_EQ(m.e2el_ms.count, 1u);
  EXPECT_NEAR(m.e2el_ms.max, 200.0, 1e-9);
}

TEST(Metrics, GoodputCountsRequestsMeetingEverySlo) {
  const Slo slo = parse_slo({"ttft:250", "tpot:110"});
  ASSERT_TRUE(slo.ttft_ms && slo.tpot_ms && !slo.e2el_ms);
  std::vector<RequestRecord> rs = {
      timeline(0, {0.2, 0.3, 0.4}, 0.4, 3),  // TTFT 200, TPOT 100: good
      timeline(0, {0.3, 0.4, 0.5}, 0.5, 3),  // TTFT 300: misses ttft
      timeline(0, {0.1, 0.3, 0.5}, 0.5, 3),  // TPOT 200: misses tpot
      timeline(0, {0.25}, 0.25, 1),          // TTFT 250 (inclusive), no TPOT: good
  };
  const ServingMetrics m = compute_metrics(rs, 2.0, slo);
  EXPECT_TRUE(m.has_slo);
  EXPECT_EQ(m.num_good, 2);
  EXPECT_DOUBLE_EQ(m.goodput, 1.0);
  const nlohmann::json j = to_json(m);
  EXPECT_DOUBLE_EQ(j["goodput"]["fraction"].get<double>(), 0.5);

  EXPECT_FALSE(meets_slo(timeline(0, {0.1}, 20.0, 1), parse_slo({"e2el:10000"})));
  EXPECT_TRUE(meets_slo(timeline(0, {0.1}, 9.0, 1), parse_slo({"e2el:10000"})));
}

TEST(Metrics, SloParsingRejectsBadItems) {
  EXPECT_THROW(parse_slo({"ttft"}), Error);
  EXPECT_THROW(parse_slo({"ttft:"}), Error);
  EXPECT_THROW(parse_slo({"ttft:abc"}), Error);
  EXPECT_THROW(parse_slo({"ttft:-5"}), Error);
  EXPECT_THROW(parse_slo({"latency:5"}), Error);
  EXPECT_DOUBLE_EQ(*parse_slo({"e2el:1.5"}).e2el_ms, 1.5);
}

TEST(Metrics, CacheHitRateFromUsageOnlyOverReportingRequests) {
  auto a = timeline(0, {0.1, 0.2}, 0.2, 2, /*in=*/1000);
  a.usage_cached_tokens = 768;
  auto b = timeline(0, {0.1, 0.2}, 0.2, 2, /*in=*/1000);
  b.usage_cached_tokens = 0;
  auto c = timeline(0, {0.1, 0.2}, 0.2, 2, /*in=*/5000);  // no prompt_tokens_details
  const ServingMetrics m = compute_metrics({a, b, c}, 1.0, Slo{});
  ASSERT_TRUE(m.usage_cache_hit_rate.has_value());
  EXPECT_DOUBLE_EQ(*m.usage_cache_hit_rate, 768.0 / 2000.0);
  EXPECT_FALSE(compute_metrics({c}, 1.0, Slo{}).usage_cache_hit_rate.has_value());
}

TEST(Metrics, InputTokensPreferServerUsage) {
  auto a = timeline(0, {0.1}, 0.1, 1, /*in=*/120);  // server counts the chat template too
  a.dataset_prompt_tokens = 100;
  auto b = timeline(0, {0.1}, 0.1, 1);
  b.usage_prompt_tokens = -1;
  b.dataset_prompt_tokens = 50;
  const ServingMetrics m = compute_metrics({a, b}, 1.0, Slo{});
  EXPECT_EQ(m.total_input_tokens, 170);
}

}  // namespace
}  // namespace di::bench
