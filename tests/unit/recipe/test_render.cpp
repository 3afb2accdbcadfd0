// Renderers: exact match with HF apply_chat_template (refs_<family>.json from the GPU machine),
// hand-written goldens for the DeepSeek formats without an HF template here, and injection safety.
#include <gtest/gtest.h>

#include <set>

#include "chat_test_util.h"
#include "core/error.h"
#include "recipe/deepseek_tokens.h"
#include "recipe/limits.h"
#include "recipe/renderer.h"

namespace di::recipe {
namespace {

using testing::read_file;
using testing::source_dir;
using testing::tokenizer_for;
using ojson = nlohmann::ordered_json;

std::string render_text(ChatFamily family, const Conversation& conv) {
  auto tok = tokenizer_for(family);
  return segments_to_text(*tok, make_renderer(family, tok)->render(conv));
}

// ---- exact match with Hugging Face apply_chat_template ---------------------------------------------

std::string refs_dir() {
  const char* d = std::getenv("DI_CHAT_REFS_DIR");  // development override; CI uses the committed refs
  return d ? d : source_dir() + "/tests/fixtures/chat";
}

Conversation fixture_conversation(const ojson& c) {
  ojson j;
  j["messages"] = c["messages"];
  j["tools"] = c["tools"];
  j["thinking"] = c["thinking"];
  j["add_generation_prompt"] = c["add_generation_prompt"];
  return conversation_from_json(j);
}

bool has_tool_calls(const Conversation& conv) {
  for (const Message& m : conv.messages)
    if (!m.tool_calls.empty()) return true;
  return false;
}

class HfReference : public ::testing::TestWithParam<std::pair<ChatFamily, std::string>> {};

TEST_P(HfReference, RenderedTextAndIdsMatch) {
  const auto [family, file_family] = GetParam();
  const std::string path = refs_dir() + "/refs_" + file_family + ".json";
  const std::string refs_text = read_file(path);
  ASSERT_FALSE(refs_text.empty()) << path << " is missing: run `python3 scripts/gen_chat_template_refs.py` on the "
                                  << "GPU machine (transformers) and commit its output";
  const ojson refs = ojson::parse(refs_text);
  const ojson convs = ojson::parse(read_file(source_dir() + "/tests/fixtures/chat/conversations.json"))["conversations"];
  auto tok = tokenizer_for(family);
  auto renderer = make_renderer(family, tok);
  int num_exact = 0, num_ids = 0;
  for (const ojson& c : convs) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(file_family + "/" + name);
    ASSERT_TRUE(refs["results"].contains(name)) << "no reference for " << name << " (stale refs?)";
    const ojson& ref = refs["results"][name];
    const Conversation conv = fixture_conversation(c);
    if (family == ChatFamily::kLlama3 && (!conv.tools.empty() || has_tool_calls(conv))) {
      // The Llama 3 template silently drops tools and tool calls; we refuse instead.
      EXPECT_THROW(renderer->render(conv), di::Error);
      continue;
    }
    ASSERT_TRUE(ref.contains("text")) << "the template raised: " << ref.value("error", "");
    const std::vector<Segment> segs = renderer->render(conv);
    const std::string ours = segments_to_text(*tok, segs);
    const std::string theirs = ref["text"].get<std::string>();
    if (family == ChatFamily::kDeepSeekV3 && name == "tool_single_call") {
      // Template bug (see renderer_deepseek_v3.cpp): a single call's block is never closed there.
      const std::string close = "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>";
      const size_t at = ours.find(close);
      ASSERT_NE(at, std::string::npos);
      EXPECT_EQ(std::string(ours).erase(at, close.size()), theirs);
      EXPECT_EQ(theirs.find(close), std::string::npos);
      continue;
    }
    EXPECT_EQ(ours, theirs);
    ++num_exact;
    if (ref.contains("ids")) {
      EXPECT_EQ(encode_segments(*tok, segs).ids, ref["ids"].get<std::vector<TokenId>>());
      ++num_ids;
    }
  }
  EXPECT_GE(num_exact, 8) << "too few conversations compared";
  std::printf("[%s] %d conversations match HF text exactly, %d also by ids\n", file_family.c_str(), num_exact,
              num_ids);
}

INSTANTIATE_TEST_SUITE_P(Families, HfReference,
                         ::testing::Values(std::pair{ChatFamily::kDeepSeekV3, std::string("deepseek_v3")},
                                           std::pair{ChatFamily::kQwen3, std::string("qwen3")},
                                           std::pair{ChatFamily::kLlama3, std::string("llama3")}),
                         [](const auto& info) { return info.param.second; });

// ---- hand-written goldens (no HF template for these formats in the npm packages) --------------------

Message call_message(std::string content, std::vector<ToolCall> calls, std::optional<std::string> reasoning = {}) {
  Message m = Message::assistant(std::move(content));
  m.tool_calls = std::move(calls);
  m.reasoning_content = std::move(reasoning);
  return m;
}

TEST(DeepSeekV31, ModelCardExampleThinking) {
  Conversation conv;
  conv.messages = {Message::system("You are a helpful assistant"), Message::user("Who are you?"),
                   Message::assistant("I am DeepSeek"), Message::user("1+1=?")};
  conv.settings.thinking = true;
  EXPECT_EQ(render_text(ChatFamily::kDeepSeekV31, conv),
            "<｜begin▁of▁sentence｜>You are a helpful assistant<｜User｜>Who are you?<｜Assistant｜></think>I am "
            "DeepSeek<｜end▁of▁sentence｜><｜User｜>1+1=?<｜Assistant｜><think>");
  conv.settings.thinking = false;
  EXPECT_TRUE(render_text(ChatFamily::kDeepSeekV31, conv).ends_with("<｜User｜>1+1=?<｜Assistant｜></think>"));
  conv.settings.thinking = true;
  conv.settings.effort = ReasoningEffort::kNone;  // effort "none" turns thinking off
  EXPECT_TRUE(render_text(ChatFamily::kDeepSeekV31, conv).ends_with("<｜Assistant｜></think>"));
}

TEST(DeepSeekV31, ToolCallsAndResults) {
  Conversation conv;
  conv.messages = {Message::user("Weather?"),
                   call_message("", {{"c0", "get_weather", R"({"city": "Paris"})"}, {"c1", "get_time", R"({"tz": "CET"})"}}),
                   Message::tool("c0", "sunny"), Message::tool("c1", "12:00"), Message::assistant("Sunny at noon.")};
  EXPECT_EQ(render_text(ChatFamily::kDeepSeekV31, conv),
            "<｜begin▁of▁sentence｜><｜User｜>Weather?<｜Assistant｜></think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
            "get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>"
            "{\"tz\": \"CET\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜tool▁output▁begin｜>sunny"
            "<｜tool▁output▁end｜><｜tool▁output▁begin｜>12:00<｜tool▁output▁end｜>Sunny at noon.<｜end▁of▁sentence｜>");
}

TEST(DeepSeekV31, ToolDescriptionFollowsSystemPrompt) {
  Conversation conv;
  conv.messages = {Message::system("Be brief."), Message::user("Weather?")};
  conv.tools = {ToolDefinition::from_json_text("get_weather", "Weather now.",
                                               R"({"type": "object", "properties": {"city": {"type": "string"}}})")};
  const std::string text = render_text(ChatFamily::kDeepSeekV31, conv);
  EXPECT_TRUE(text.starts_with("<｜begin▁of▁sentence｜>Be brief.\n\n## Tools\nYou have access to the following tools:\n\n"
                               "### get_weather\nDescription: Weather now.\n\nParameters: {\"type\": \"object\", "
                               "\"properties\": {\"city\": {\"type\": \"string\"}}}\n\nIMPORTANT: ALWAYS adhere"))
      << text;
  // The format example in the tool description is template text: no control ids inside it.
  auto tok = tokenizer_for(ChatFamily::kDeepSeekV31);
  const EncodedPrompt p = encode_segments(*tok, make_renderer(ChatFamily::kDeepSeekV31, tok)->render(conv));
  const TokenId calls_begin = *tok->token_to_id("<｜tool▁calls▁begin｜>");
  for (size_t i = 0; i < p.ids.size(); ++i) EXPECT_NE(p.ids[i], calls_begin) << "at " << i;
}

const char* kDsmlCall =
    "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"metric\": true, \"x\": [1, \"日本\"]}</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n</｜DSML｜function_calls>";

TEST(DeepSeekV32, ToolCallHistoryNonThinking) {
  Conversation conv;
  conv.messages = {Message::user("Weather?"),
                   call_message("Let me check.",
                                {{"c0", "get_weather", R"({"city": "Paris", "days": 2, "opts": {"metric": true, "x": [1, "日本"]}})"}}),
                   Message::tool("c0", "sunny")};
  EXPECT_EQ(render_text(ChatFamily::kDeepSeekV32, conv),
            std::string("<｜begin▁of▁sentence｜><｜User｜>Weather?<｜Assistant｜></think>Let me check.") + kDsmlCall +
                "<｜end▁of▁sentence｜>\n\n<function_results>\n<result>sunny</result>\n</function_results>\n\n</think>");
  // ｜DSML｜ of the assistant turn is a control id, 10 times (2 block tags, 2 invoke tags, 3 × 2 parameter
  // tags), never part of a text piece.
  auto tok = tokenizer_for(ChatFamily::kDeepSeekV32);
  const TokenId dsml = *tok->token_to_id("｜DSML｜");
  const EncodedPrompt p = encode_segments(*tok, make_renderer(ChatFamily::kDeepSeekV32, tok)->render(conv));
  int num_dsml = 0;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    if (p.ids[i] == dsml) {
      EXPECT_TRUE(p.is_control[i]);
      ++num_dsml;
    }
  }
  EXPECT_EQ(num_dsml, 10);
}

TEST(DeepSeekV32, ThinkingKeepsReasoningAfterLastUser) {
  Conversation conv;
  conv.settings.thinking = true;
  conv.messages = {Message::system("sys"), Message::user("old"), call_message("old answer", {}, "old reasoning"),
                   Message::user("Weather?"), call_message("", {{"c0", "get_weather", R"({"city": "Paris"})"}}, "need tool"),
                   Message::tool("c0", "sunny")};
  EXPECT_EQ(render_text(ChatFamily::kDeepSeekV32, conv),
            "<｜begin▁of▁sentence｜>sys<｜User｜>old<｜Assistant｜></think>old answer<｜end▁of▁sentence｜>"
            "<｜User｜>Weather?<｜Assistant｜><think>need tool</think>\n\n<｜DSML｜function_calls>\n"
            "<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Paris"
            "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls><｜end▁of▁sentence｜>\n\n"
            "<function_results>\n<result>sunny</result>\n</function_results>\n\n<think>");
  auto tok = tokenizer_for(ChatFamily::kDeepSeekV32);
  EXPECT_TRUE(make_renderer(ChatFamily::kDeepSeekV32, tok)->starts_in_reasoning(conv));
}

TEST(DeepSeekV32, ResponseFormatAndToolsInSystem) {
  Conversation conv;
  conv.messages = {Message::system("sys"), Message::user("hi")};
  conv.tools = {ToolDefinition::from_json_text("f", "d", R"({"type": "object"})")};
  conv.settings.response_format.type = ResponseFormat::Type::kJsonSchema;
  conv.settings.response_format.schema = ojson::parse(R"({"type": "object", "required": ["a"]})");
  const std::string text = render_text(ChatFamily::kDeepSeekV32, conv);
  EXPECT_TRUE(text.starts_with("<｜begin▁of▁sentence｜>sys\n\n## Tools\nYou have access to a set of tools you can use to "
                               "answer the user's question.\n"));
  EXPECT_NE(text.find("{\"name\": \"f\", \"description\": \"d\", \"parameters\": {\"type\": \"object\"}}"),
            std::string::npos);
  EXPECT_TRUE(text.ends_with("\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
                             "{\"type\": \"object\", \"required\": [\"a\"]}<｜User｜>hi<｜Assistant｜></think>"))
      << text;
}

TEST(DeepSeekV4, ToolResultsMergeIntoUserTurn) {
  Conversation conv;
  conv.messages = {Message::user("Weather?"), call_message("", {{"c0", "get_weather", R"({"city": "Paris"})"}}),
                   Message::tool("c0", "sunny"), Message::tool("c1", "windy"), Message::user("thanks")};
  EXPECT_EQ(render_text(ChatFamily::kDeepSeekV4, conv),
            "<｜begin▁of▁sentence｜><｜User｜>Weather?<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n"
            "<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Paris"
            "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜>"
            "<tool_result>sunny</tool_result>\n\n<tool_result>windy</tool_result>\n\nthanks<｜Assistant｜></think>");
}

TEST(Renderer, BadToolArgumentsAreAnErrorNotACrash) {
  Conversation conv;
  conv.messages = {Message::user("x"), call_message("", {{"c0", "f", "{not json"}})};
  auto tok = tokenizer_for(ChatFamily::kDeepSeekV32);
  EXPECT_THROW(make_renderer(ChatFamily::kDeepSeekV32, tok)->render(conv), di::Error);
}

TEST(Renderer, MissingControlTokenIsAClearError) {
  auto plain = tokenizer_for(ChatFamily::kDeepSeekV3);  // no <think> in the V3 vocabulary
  try {
    make_renderer(ChatFamily::kDeepSeekV31, plain);
    FAIL() << "expected an error";
  } catch (const di::Error& e) {
    EXPECT_NE(std::string(e.what()).find("<think>"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_renderer(ChatFamily::kQwen3, plain), di::Error);
}

// ---- injection: text that spells a control token stays ordinary text --------------------------------

class Injection : public ::testing::TestWithParam<ChatFamily> {};

TEST_P(Injection, SpelledControlTokensEncodeToOrdinaryTokens) {
  const ChatFamily family = GetParam();
  auto tok = tokenizer_for(family);
  auto renderer = make_renderer(family, tok);
  std::set<TokenId> control_ids;
  std::string all;  // every added token's spelling, adjacent and separated
  for (const AddedToken& t : tok->added_tokens()) {
    control_ids.insert(t.id);
    if (t.content.find("place▁holder") != std::string::npos || t.content.find("reserved") != std::string::npos)
      continue;
    all += t.content + " x" + t.content;
  }
  ASSERT_FALSE(all.empty());
  Conversation conv;
  conv.messages = {Message::system("S" + all), Message::user("U" + all), Message::assistant("A" + all),
                   Message::user(all)};
  if (family != ChatFamily::kLlama3) {
    ojson args;
    args[all] = all;  // a key and a value that spell every control token
    conv.messages.insert(conv.messages.begin() + 3, call_message("", {{"c0", "f", args.dump()}}, "R" + all));
    conv.messages.insert(conv.messages.begin() + 4, Message::tool("c0", "T" + all));
    conv.tools = {ToolDefinition::from_json_text("f", "D" + all, R"({"type": "object"})")};
  }
  const std::vector<Segment> segs = renderer->render(conv);
  const EncodedPrompt p = encode_segments(*tok, segs);
  ASSERT_EQ(p.ids.size(), p.is_control.size());
  size_t num_control_segments = 0;
  for (const Segment& s : segs) num_control_segments += s.is_control;
  size_t num_control_positions = 0;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    if (p.is_control[i]) {
      ++num_control_positions;
      EXPECT_TRUE(control_ids.count(p.ids[i])) << "position " << i;
    } else {
      EXPECT_FALSE(control_ids.count(p.ids[i])) << "control id " << p.ids[i] << " (" << tok->id_to_token(p.ids[i])
                                                << ") at text position " << i;
    }
  }
  EXPECT_EQ(num_control_positions, num_control_segments);
  // Text survives: decoding the ids gives back the rendered text.
  EXPECT_EQ(tok->decode(p.ids), segments_to_text(*tok, segs));
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, Injection,
                         ::testing::Values(ChatFamily::kDeepSeekV3, ChatFamily::kDeepSeekV31, ChatFamily::kDeepSeekV32,
                                           ChatFamily::kDeepSeekV4, ChatFamily::kQwen3, ChatFamily::kLlama3),
                         [](const auto& info) {
                           std::string n = chat_family_name(info.param);
                           for (char& c : n)
                             if (c == '.') c = '_';
                           return n;
                         });

// ---- max_tokens defaults ------------------------------------------------------------------------------

TEST(Limits, MaxTokensDefaults) {
  EXPECT_EQ(resolve_max_tokens(std::nullopt, false, ReasoningEffort::kHigh), 8192);
  EXPECT_EQ(resolve_max_tokens(std::nullopt, true, ReasoningEffort::kHigh), 65536);
  EXPECT_EQ(resolve_max_tokens(std::nullopt, true, ReasoningEffort::kLow), 65536);
  EXPECT_EQ(resolve_max_tokens(std::nullopt, true, ReasoningEffort::kMax), 131072);
  EXPECT_EQ(resolve_max_tokens(std::nullopt, true, ReasoningEffort::kNone), 8192);
  EXPECT_EQ(resolve_max_tokens(std::nullopt, false, ReasoningEffort::kMax), 8192);
  EXPECT_EQ(resolve_max_tokens(100, true, ReasoningEffort::kMax), 100);
  EXPECT_THROW(resolve_max_tokens(0, false, ReasoningEffort::kHigh), di::Error);
}

}  // namespace
}  // namespace di::recipe
