#include <gtest/gtest.h>

#include <cmath>

#include "bench/prometheus.h"
#include "bench/serve_bench.h"

namespace di::bench {
namespace {

TEST(Prometheus, ParsesSamplesLabelsEscapesAndSpecialValues) {
  const std::string text =
      "# HELP deepinfer_prompt_tokens_total Prompt tokens.\n"
      "# TYPE deepinfer_prompt_tokens_total counter\n"
      "deepinfer_prompt_tokens_total{model=\"demo\"} 1200\n"
      "deepinfer_prompt_tokens_total{model=\"other\",path=\"a \\\"b\\\" \\\\ c\\nd\"} 34 "
      "1700000000000\n"
      "vllm:prefix_cache_hits_total{engine=\"0\"} 5.5e2\r\n"
      "   \n"
      "gauge_nan NaN\n"
      "gauge_inf +Inf\n"
      "gauge_neg -Inf\n"
      "with_exemplar_total 3 # {trace_id=\"x\"} 1\n"
      "no_labels{} 1\n"
      "# EOF\n";
  auto r = parse_prometheus_text(text);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const PromText& p = r.value();
  ASSERT_EQ(p.samples.size(), 8u);
  EXPECT_EQ(p.types.at("deepinfer_prompt_tokens_total"), "counter");
  EXPECT_EQ(p.samples[0].labels.at("model"), "demo");
  EXPECT_EQ(p.samples[1].labels.at("path"), "a \"b\" \\ c\nd");
  EXPECT_DOUBLE_EQ(p.samples[1].value, 34);
  EXPECT_EQ(p.samples[2].name, "vllm:prefix_cache_hits_total");
  EXPECT_DOUBLE_EQ(p.samples[2].value, 550);
  EXPECT_TRUE(std::isnan(p.samples[3].value));
  EXPECT_TRUE(std::isinf(p.samples[4].value) && p.samples[4].value > 0);
  EXPECT_TRUE(std::isinf(p.samples[5].value) && p.samples[5].value < 0);
  EXPECT_DOUBLE_EQ(p.samples[6].value, 3);
  EXPECT_TRUE(p.samples[7].labels.empty());
  EXPECT_DOUBLE_EQ(*p.sum("deepinfer_prompt_tokens_total"), 1234);
  EXPECT_FALSE(p.sum("missing").has_value());
}

TEST(Prometheus, MalformedLinesAreErrorsWithLineNumbers) {
  for (const char* bad : {"metric{a=\"1\" 2\n", "metric{a=1} 2\n", "metric\n", "metric abc\n",
                          "metric{a=\"unterminated} 1\n", "1metric 2\n", "metric 1 2 3\n"}) {
    auto r = parse_prometheus_text(std::string("ok_metric 1\n") + bad);
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_NE(r.status().message().find("line 2"), std::string::npos) << r.status().message();
  }
}

TEST(Prometheus, PrefixCacheCountersAndDeltas) {
  const std::string before =
      "vllm:prefix_cache_queries_total{engine=\"0\"} 1000\n"
      "vllm:prefix_cache_hits_total{engine=\"0\"} 100\n";
  const std::string after =
      "vllm:prefix_cache_queries_total{engine=\"0\"} 3000\n"
      "vllm:prefix_cache_hits_total{engine=\"0\"} 1600\n";
  auto c = find_prefix_cache_counters(parse_prometheus_text(after).value());
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->hit_metric, "vllm:prefix_cache_hits_total");
  EXPECT_DOUBLE_EQ(c->query_tokens, 3000);
  auto d = prefix_cache_delta(before, after, "", "");
  EXPECT_DOUBLE_EQ(d["hit_tokens"].get<double>(), 1500);
  EXPECT_DOUBLE_EQ(d["query_tokens"].get<double>(), 2000);
  EXPECT_DOUBLE_EQ(d["hit_rate"].get<double>(), 0.75);

  // deepinfer's own names (src/server/metrics.cpp).
  auto ours = find_prefix_cache_counters(
      parse_prometheus_text("deepinfer_engine_prompt_tokens_total 400\n"
                            "deepinfer_prefix_cache_hit_tokens_total 128\n")
          .value());
  ASSERT_TRUE(ours.has_value());
  EXPECT_DOUBLE_EQ(ours->hit_tokens / ours->query_tokens, 0.32);

  // Explicit names override the known ones.
  const std::string custom = "my_hits 5\nmy_lookups 10\n";
  auto e = prefix_cache_delta("my_hits 1\nmy_lookups 2\n", custom, "my_hits", "my_lookups");
  EXPECT_DOUBLE_EQ(e["hit_rate"].get<double>(), 0.5);
  EXPECT_TRUE(prefix_cache_delta(custom, custom, "", "").contains("error"));
  EXPECT_TRUE(prefix_cache_delta("bad{", custom, "", "").contains("error"));
  EXPECT_TRUE(prefix_cache_delta(before, before, "", "")["hit_rate"].is_null());  // no traffic
}

}  // namespace
}  // namespace di::bench
