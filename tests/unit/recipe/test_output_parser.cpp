// Output parsers: expected events per family, and chunk-split invariance — the same ids fed whole,
// split in two at every boundary, and one id per chunk must give the same (coalesced) events.
#include <gtest/gtest.h>

#include "chat_test_util.h"
#include "recipe/output_parser.h"

namespace di::recipe {
namespace {

using testing::tokenizer_for;
using Type = ParserEvent::Type;

// A model output written as segments: control spellings become their id, the rest is encoded text.
struct Out {
  ChatFamily family;
  std::vector<Segment> segs;
  Out& t(std::string_view text) {
    segs.push_back(Segment::plain(std::string(text)));
    return *this;
  }
  Out& c(std::string_view spelling) {
    auto id = tokenizer_for(family)->token_to_id(spelling);
    if (!id) throw std::runtime_error("no token " + std::string(spelling));
    segs.push_back(Segment::control(*id));
    return *this;
  }
  // Text encoded one character at a time: a token boundary at every character boundary.
  Out& per_char(std::string_view text) {
    size_t i = 0;
    while (i < text.size()) {
      size_t len = 1;
      while (i + len < text.size() && (static_cast<unsigned char>(text[i + len]) & 0xc0) == 0x80) ++len;
      t(text.substr(i, len));
      segs.push_back(Segment::control(-1));  // boundary marker, removed by ids()
      i += len;
    }
    return *this;
  }
  std::vector<TokenId> ids() const {
    std::vector<TokenId> out;
    for (const Segment& s : segs) {
      if (s.is_control && s.id < 0) continue;
      const auto enc = encode_segments(*tokenizer_for(family), {s});
      out.insert(out.end(), enc.ids.begin(), enc.ids.end());
    }
    return out;
  }
};

std::vector<ParserEvent> run(ChatFamily family, const std::vector<TokenId>& ids, const std::vector<size_t>& cuts,
                             ParserOptions opt, FinishReason engine = FinishReason::kStop) {
  auto parser = make_output_parser(family, tokenizer_for(family), std::move(opt));
  std::vector<ParserEvent> events;
  size_t prev = 0;
  for (size_t cut : cuts) {
    parser->feed(std::span<const TokenId>(ids).subspan(prev, cut - prev), events);
    prev = cut;
  }
  parser->feed(std::span<const TokenId>(ids).subspan(prev), events);
  parser->finish(engine, events);
  for (const ParserEvent& e : events) {
    // Every delta is complete UTF-8 on its own.
    EXPECT_NO_THROW((void)nlohmann::json(e.text).dump()) << to_string(e);
  }
  return coalesce_events(events);
}

std::string dump(const std::vector<ParserEvent>& events) {
  std::string s;
  for (const ParserEvent& e : events) s += to_string(e) + "\n";
  return s;
}

// Parses whole, at every 2-way split and one id per chunk; all must agree. Returns the events.
std::vector<ParserEvent> parse_all_ways(const Out& out, ParserOptions opt = {},
                                        FinishReason engine = FinishReason::kStop) {
  const std::vector<TokenId> ids = out.ids();
  const std::vector<ParserEvent> whole = run(out.family, ids, {}, opt, engine);
  for (size_t cut = 0; cut <= ids.size(); ++cut) {
    const auto split = run(out.family, ids, {cut}, opt, engine);
    EXPECT_EQ(split, whole) << "split at " << cut << "\nsplit:\n" << dump(split) << "whole:\n" << dump(whole);
    if (split != whole) break;
  }
  std::vector<size_t> every;
  for (size_t i = 1; i < ids.size(); ++i) every.push_back(i);
  const auto singles = run(out.family, ids, every, opt, engine);
  EXPECT_EQ(singles, whole) << "one id per chunk:\n" << dump(singles) << "whole:\n" << dump(whole);
  return whole;
}

ParserEvent reasoning(std::string s) { return {Type::kReasoningDelta, std::move(s)}; }
ParserEvent content(std::string s) { return {Type::kContentDelta, std::move(s)}; }
ParserEvent start(int idx, std::string name) {
  ParserEvent e{Type::kToolCallStart};
  e.tool_index = idx;
  e.tool_call_id = "call_" + std::to_string(idx);
  e.tool_name = std::move(name);
  return e;
}
ParserEvent args(int idx, std::string s) {
  ParserEvent e{Type::kToolCallArgumentsDelta, std::move(s)};
  e.tool_index = idx;
  return e;
}
ParserEvent finish(FinishReason r) {
  ParserEvent e{Type::kFinish};
  e.finish_reason = r;
  return e;
}

ParserOptions thinking() {
  ParserOptions o;
  o.starts_in_reasoning = true;
  return o;
}

// ---- DeepSeek V3.1 ---------------------------------------------------------------------------------

TEST(DeepSeekV31Parser, ReasoningContentAndTwoToolCalls) {
  Out out{ChatFamily::kDeepSeekV31};
  out.t("让我想想 🤔 weather…").c("</think>").t("Checking 日本 and 🌍.")
      .c("<｜tool▁calls▁begin｜>").c("<｜tool▁call▁begin｜>").t("get_weather").c("<｜tool▁sep｜>")
      .t(R"({"city": "東京", "note": "a \"quoted\"\nline", "code": 123, "nested": {"a": [1, {"b": 2}]}})")
      .c("<｜tool▁call▁end｜>").c("<｜tool▁call▁begin｜>").t("get_time").c("<｜tool▁sep｜>").t("{}")
      .c("<｜tool▁call▁end｜>").c("<｜tool▁calls▁end｜>").c("<｜end▁of▁sentence｜>").t("ignored after EOS");
  const auto events = parse_all_ways(out, thinking());
  const std::vector<ParserEvent> expected = {
      reasoning("让我想想 🤔 weather…"), content("Checking 日本 and 🌍."), start(0, "get_weather"),
      args(0, R"({"city": "東京", "note": "a \"quoted\"\nline", "code": 123, "nested": {"a": [1, {"b": 2}]}})"),
      start(1, "get_time"), args(1, "{}"), finish(FinishReason::kToolCalls)};
  EXPECT_EQ(events, expected) << dump(events);
}

TEST(DeepSeekV31Parser, EndOfThinkingInSameChunkAsContentAndSpelledMarkersAreText) {
  Out out{ChatFamily::kDeepSeekV31};
  // "</think>" and "<｜tool▁call▁begin｜>" spelled in text are ordinary tokens: content, not markers.
  out.t("r").c("</think>").t("\n\nsee </think> and <｜tool▁call▁begin｜>x").c("</think>").t(" end");
  const auto events = parse_all_ways(out, thinking());
  const std::vector<ParserEvent> expected = {reasoning("r"), content("see </think> and <｜tool▁call▁begin｜>x end"),
                                             finish(FinishReason::kStop)};
  EXPECT_EQ(events, expected) << dump(events);
}

TEST(DeepSeekV31Parser, LengthFinishInsideArgumentsStreamsWhatArrived) {
  Out out{ChatFamily::kDeepSeekV31};
  out.c("<｜tool▁calls▁begin｜>").c("<｜tool▁call▁begin｜>").t("f").c("<｜tool▁sep｜>").t(R"({"long": "abc)");
  const auto events = parse_all_ways(out, {}, FinishReason::kLength);
  const std::vector<ParserEvent> expected = {start(0, "f"), args(0, R"({"long": "abc)"), finish(FinishReason::kLength)};
  EXPECT_EQ(events, expected) << dump(events);
}

TEST(DeepSeekV31Parser, TextAfterToolCallsIsKept) {
  Out out{ChatFamily::kDeepSeekV31};
  out.c("<｜tool▁calls▁begin｜>").c("<｜tool▁call▁begin｜>").t("f").c("<｜tool▁sep｜>").t(R"({"a": 1})")
      .c("<｜tool▁call▁end｜>").c("<｜tool▁calls▁end｜>").t("done");
  const auto events = parse_all_ways(out);
  const std::vector<ParserEvent> expected = {start(0, "f"), args(0, R"({"a": 1})"), content("done"),
                                             finish(FinishReason::kToolCalls)};
  EXPECT_EQ(events, expected) << dump(events);
}

TEST(DeepSeekV31Parser, SeededIdsAreReproducible) {
  Out out{ChatFamily::kDeepSeekV31};
  out.c("<｜tool▁calls▁begin｜>").c("<｜tool▁call▁begin｜>").t("f").c("<｜tool▁sep｜>").t("{}").c("<｜tool▁call▁end｜>");
  ParserOptions o;
  o.tool_call_ids = seeded_tool_call_ids(42);
  const auto a = run(out.family, out.ids(), {}, o);
  const auto b = run(out.family, out.ids(), {1, 2}, o);
  ASSERT_EQ(a, b);
  EXPECT_EQ(a[0].tool_call_id.size(), 5u + 24u);
  EXPECT_TRUE(a[0].tool_call_id.starts_with("call_"));
  o.tool_call_ids = seeded_tool_call_ids(43);
  EXPECT_NE(run(out.family, out.ids(), {}, o)[0].tool_call_id, a[0].tool_call_id);
}

// ---- DeepSeek V3 (fenced JSON) -----------------------------------------------------------------------

TEST(DeepSeekV3Parser, FencedArgumentsWithoutTheFence) {
  Out out{ChatFamily::kDeepSeekV3};
  out.t("Sure.").c("<｜tool▁calls▁begin｜>").c("<｜tool▁call▁begin｜>").t("function").c("<｜tool▁sep｜>")
      .t("get_weather\n```json\n{\"code\": 123, \"s\": \"x\\n```y\"}\n```").c("<｜tool▁call▁end｜>").t("\n")
      .c("<｜tool▁call▁begin｜>").t("function").c("<｜tool▁sep｜>").per_char("f2\n```json\n{}\n```")
      .c("<｜tool▁call▁end｜>").c("<｜tool▁calls▁end｜>").c("<｜end▁of▁sentence｜>");
  const auto events = parse_all_ways(out);
  const std::vector<ParserEvent> expected = {content("Sure."), start(0, "get_weather"),
                                             args(0, "{\"code\": 123, \"s\": \"x\\n```y\"}"), start(1, "f2"),
                                             args(1, "{}"), finish(FinishReason::kToolCalls)};
  EXPECT_EQ(events, expected) << dump(events);
}

// ---- DeepSeek V3.2 / V4 DSML ---------------------------------------------------------------------------

// The shape of the deepseek-recipe stream test: CJK, a key containing `string=`, an empty key, raw JSON.
const std::string kDsmlBody =
    "<｜DSML｜invoke name=\"ship\">\n"
    "<｜DSML｜parameter name=\"shipping address\" string=\"true\">Paris\n日本 \"q\" \\ </｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\" string= mode \" string=\"false\">{\"enabled\": true}</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"count\" string=\"false\">2</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"\" string=\"true\">empty key</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"noop\">\n</｜DSML｜invoke>\n";
const std::string kDsmlArgs0 =
    R"({"shipping address": "Paris\n日本 \"q\" \\ ", " string= mode ": {"enabled": true}, "count": 2, "": "empty key"})";

// Writes DSML text with ｜DSML｜ as its control id (how the model emits it) and the rest as text.
Out& dsml(Out& out, const std::string& text, bool per_char) {
  size_t i = 0;
  while (i < text.size()) {
    const size_t p = text.find("｜DSML｜", i);
    const std::string piece = text.substr(i, p == std::string::npos ? std::string::npos : p - i);
    if (per_char) {
      out.per_char(piece);
    } else {
      out.t(piece);
    }
    if (p == std::string::npos) break;
    out.c("｜DSML｜");
    i = p + std::string("｜DSML｜").size();
  }
  return out;
}

class DsmlParser : public ::testing::TestWithParam<bool> {};

TEST_P(DsmlParser, StreamsArgumentsAsJsonAtEverySplit) {
  const bool per_char = GetParam();  // also a token boundary at every character of the markup
  for (ChatFamily family : {ChatFamily::kDeepSeekV32, ChatFamily::kDeepSeekV4}) {
    SCOPED_TRACE(chat_family_name(family));
    const std::string block = family == ChatFamily::kDeepSeekV4 ? "tool_calls" : "function_calls";
    Out out{family};
    out.t("思考 🤔").c("</think>").t("I'll ship it.");
    dsml(out, "\n\n<｜DSML｜" + block + ">\n" + kDsmlBody + "</｜DSML｜" + block + ">", per_char);
    out.c("<｜end▁of▁sentence｜>");
    const auto events = parse_all_ways(out, thinking());
    const std::vector<ParserEvent> expected = {reasoning("思考 🤔"),       content("I'll ship it."),
                                               start(0, "ship"),           args(0, kDsmlArgs0),
                                               start(1, "noop"),           args(1, "{}"),
                                               finish(FinishReason::kToolCalls)};
    EXPECT_EQ(events, expected) << dump(events);
    ASSERT_FALSE(events.size() < 4);
    EXPECT_TRUE(nlohmann::json::accept(events[3].text)) << events[3].text;
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenization, DsmlParser, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "PerCharTokens" : "BpeTokens"; });

TEST(DsmlParserText, LookalikeMarkupAndTrailingNewlinesAreContent) {
  Out out{ChatFamily::kDeepSeekV32};
  dsml(out, "a <｜DSML｜func x\n\n", /*per_char=*/true);
  out.t("<｜DSML not markup\n");
  const auto events = parse_all_ways(out);
  const std::vector<ParserEvent> expected = {content("a <｜DSML｜func x\n\n<｜DSML not markup\n"),
                                             finish(FinishReason::kStop)};
  EXPECT_EQ(events, expected) << dump(events);
}

TEST(DsmlParserText, StringFalseEmptyValueBecomesNull) {
  Out out{ChatFamily::kDeepSeekV32};
  dsml(out,
       "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"false\">"
       "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
       false);
  const auto events = parse_all_ways(out);
  const std::vector<ParserEvent> expected = {start(0, "f"), args(0, R"({"x": null})"), finish(FinishReason::kToolCalls)};
  EXPECT_EQ(events, expected) << dump(events);
}

// ---- Qwen3 -------------------------------------------------------------------------------------------

TEST(Qwen3Parser, ThinkContentAndStreamedToolCalls) {
  Out out{ChatFamily::kQwen3};
  out.c("<think>").t("\nHmm, 天气 🌦\n").c("</think>").t("\n\nLet me look.\n")
      .c("<tool_call>").t("\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich \\\"}\", \"n\": [1, {}]}}\n")
      .c("</tool_call>").t("\n").c("<tool_call>").t("\n{\"arguments\": {}, \"name\": \"late_name\"}\n")
      .c("</tool_call>").c("<|im_end|>");
  const auto events = parse_all_ways(out);
  const std::vector<ParserEvent> expected = {reasoning("Hmm, 天气 🌦\n"),
                                             content("Let me look.\n"),
                                             start(0, "get_weather"),
                                             args(0, R"({"city": "Zürich \"}", "n": [1, {}]})"),
                                             start(1, "late_name"),
                                             args(1, "{}"),
                                             finish(FinishReason::kToolCalls)};
  EXPECT_EQ(events, expected) << dump(events);
}

TEST(Qwen3Parser, ThinkingOffIsPlainContent) {
  Out out{ChatFamily::kQwen3};
  out.t("Just 👍🏽 text <think> spelled").c("<|im_end|>");
  const auto events = parse_all_ways(out);
  const std::vector<ParserEvent> expected = {content("Just 👍🏽 text <think> spelled"), finish(FinishReason::kStop)};
  EXPECT_EQ(events, expected) << dump(events);
}

// ---- Llama 3 -------------------------------------------------------------------------------------------

TEST(Llama3Parser, ContentUntilEndOfTurn) {
  Out out{ChatFamily::kLlama3};
  out.t("Bonjour 🇫🇷 <|eot_id|> spelled").c("<|eot_id|>").t("after");
  const auto events = parse_all_ways(out, {}, FinishReason::kStop);
  const std::vector<ParserEvent> expected = {content("Bonjour 🇫🇷 <|eot_id|> spelled"), finish(FinishReason::kStop)};
  EXPECT_EQ(events, expected) << dump(events);
}

TEST(OutputParser, IncompleteUtf8AtLengthBecomesReplacementCharacter) {
  // The first bytes of an emoji without the rest: held back while streaming, U+FFFD at the end.
  auto tok = tokenizer_for(ChatFamily::kLlama3);
  const std::vector<TokenId> emoji = tok->encode_ordinary("🌍");
  ASSERT_GE(emoji.size(), 2u) << "needs an emoji spread over several byte-level tokens";
  auto parser = make_output_parser(ChatFamily::kLlama3, tok);
  std::vector<ParserEvent> events;
  parser->feed(std::span<const TokenId>(emoji).first(1), events);
  EXPECT_TRUE(events.empty());
  parser->finish(FinishReason::kLength, events);
  const auto c = coalesce_events(events);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].text, "\xEF\xBF\xBD");
  EXPECT_EQ(c[1].finish_reason, FinishReason::kLength);
}

}  // namespace
}  // namespace di::recipe
