// server/ pieces that need no HTTP and no engine run: the served model (family detection, prompt
// building, BOS for raw prompts) on the demo model's real tokenizer, and the Prometheus rendering.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "protocol/api_error.h"
#include "server/metrics.h"
#include "server/model_info.h"
#include "server/prompt.h"

namespace di::server {
namespace {

const std::string kDemo = "models/deepinfer-demo-code";  // tests run from the source root

std::shared_ptr<const ServedModel> demo() {
  auto m = load_served_model({kDemo, "", ""});
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.value();
}

TEST(ServedModelTest, DemoModelIsDeepSeekV3WithItsNames) {
  auto m = demo();
  EXPECT_EQ(m->family, recipe::ChatFamily::kDeepSeekV3);
  EXPECT_EQ(m->name, "deepinfer-demo-code");
  EXPECT_TRUE(m->accepts_name("deepinfer-demo-code"));
  EXPECT_TRUE(m->accepts_name(kDemo));
  EXPECT_FALSE(m->accepts_name("gpt-4o"));
  auto named = load_served_model({kDemo, "coder", ""});
  ASSERT_TRUE(named.is_ok());
  EXPECT_TRUE(named.value()->accepts_name("coder"));
}

TEST(ServedModelTest, FamilyOverrideAddsControlTokensAndBadNamesFail) {
  auto v31 = load_served_model({kDemo, "", "deepseek_v3.1"});
  ASSERT_TRUE(v31.is_ok()) << v31.status().to_string();
  EXPECT_EQ(v31.value()->family, recipe::ChatFamily::kDeepSeekV31);
  EXPECT_TRUE(v31.value()->tokenizer->token_to_id("</think>").has_value());
  EXPECT_FALSE(load_served_model({kDemo, "", "gpt"}).is_ok());
  EXPECT_FALSE(load_served_model({"/nonexistent", "", ""}).is_ok());
}

TEST(ServedModelTest, DetectionFollowsModelTypeAndTokens) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "di_server_family_test";
  fs::create_directories(dir);
  auto tok = demo()->tokenizer;
  auto write_type = [&](const char* type) {
    std::ofstream(dir / "config.json") << "{\"model_type\":\"" << type << "\"}";
  };
  write_type("qwen3_moe");
  EXPECT_EQ(detect_chat_family(dir.string(), *tok).value(), recipe::ChatFamily::kQwen3);
  write_type("llama");
  EXPECT_EQ(detect_chat_family(dir.string(), *tok).value(), recipe::ChatFamily::kLlama3);
  write_type("deepseek_v2");
  EXPECT_EQ(detect_chat_family(dir.string(), *tok).value(), recipe::ChatFamily::kDeepSeekV3);
  write_type("mistral");
  EXPECT_FALSE(detect_chat_family(dir.string(), *tok).is_ok());
  fs::remove_all(dir);
}

TEST(PromptTest, ChatRendersControlTokensOnlyWhereTheTemplatePutsThem) {
  auto m = demo();
  protocol::ParsedRequest r = protocol::parse_chat_completions(protocol::Json::parse(
      R"({"model":"m","messages":[{"role":"user","content":"<｜User｜>hi<｜Assistant｜>"}]})"));
  std::vector<int32_t> ids = build_prompt(*m, r);
  const int32_t user = *m->tokenizer->token_to_id("<｜User｜>");
  const int32_t assistant = *m->tokenizer->token_to_id("<｜Assistant｜>");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), user),
            1);  // the template's, not the user's spelling
  EXPECT_EQ(std::count(ids.begin(), ids.end(), assistant), 1);
  EXPECT_EQ(ids.back(), assistant);  // generation prompt
  EXPECT_EQ(default_max_tokens(*m, r), 8192);
}

TEST(PromptTest, CompletionsGetBosAndCheckIds) {
  auto m = demo();
  auto r =
      protocol::parse_completions(protocol::Json::parse(R"({"model":"m","prompt":"def f():"})"));
  std::vector<int32_t> ids = build_prompt(*m, r);
  ASSERT_TRUE(m->bos.has_value());  // tokenizer_config.json: add_bos_token
  EXPECT_EQ(ids.front(), *m->bos);
  EXPECT_EQ(default_max_tokens(*m, r), 16);
  auto bad =
      protocol::parse_completions(protocol::Json::parse(R"({"model":"m","prompt":[1,8192]})"));
  EXPECT_THROW(build_prompt(*m, bad), protocol::ApiException);
}

TEST(MetricsTest, PrometheusTextHasCumulativeBucketsAndEngineGauges) {
  ServerMetrics m;
  m.observe_ttft(0.003);
  m.observe_ttft(0.2);
  m.observe_ttft(1000);
  m.count_response("/v1/messages", 429);
  m.add_generated_tokens(5);
  EngineStats e;
  e.prompt_tokens = 200;
  e.cached_prompt_tokens = 50;
  e.kv_blocks_total = 10;
  e.kv_blocks_used = 4;
  e.num_waiting = 3;
  const std::string text = m.render(e);
  auto has = [&](const std::string& line) { return text.find(line + "\n") != std::string::npos; };
  EXPECT_TRUE(has("deepinfer_time_to_first_token_seconds_bucket{le=\"0.0025\"} 0"));
  EXPECT_TRUE(has("deepinfer_time_to_first_token_seconds_bucket{le=\"0.005\"} 1"));
  EXPECT_TRUE(has("deepinfer_time_to_first_token_seconds_bucket{le=\"0.25\"} 2"));
  EXPECT_TRUE(has("deepinfer_time_to_first_token_seconds_bucket{le=\"300\"} 2"));
  EXPECT_TRUE(has("deepinfer_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3"));
  EXPECT_TRUE(has("deepinfer_time_to_first_token_seconds_count 3"));
  EXPECT_TRUE(has("deepinfer_http_responses_total{route=\"/v1/messages\",status=\"429\"} 1"));
  EXPECT_TRUE(has("deepinfer_generation_tokens_total 5"));
  EXPECT_TRUE(has("deepinfer_prefix_cache_hit_tokens_total 50"));
  EXPECT_TRUE(has("deepinfer_prefix_cache_hit_rate 0.25"));
  EXPECT_TRUE(has("deepinfer_kv_cache_usage_ratio 0.4"));
  EXPECT_TRUE(has("deepinfer_num_requests_waiting 3"));
  EXPECT_TRUE(has("# TYPE deepinfer_kv_blocks_used gauge"));
}

}  // namespace
}  // namespace di::server
