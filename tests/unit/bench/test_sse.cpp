// SSE parsing (every split point of a stream gives the same events) and what a response stream
// turns into (StreamAccumulator).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "bench/openai_client.h"
#include "bench/sse_parser.h"

namespace di::bench {
namespace {

std::vector<SseEvent> parse_pieces(const std::vector<std::string>& pieces, bool finish = true) {
  std::vector<SseEvent> out;
  SseParser p([&](const SseEvent& e) { out.push_back(e); });
  for (const auto& piece : pieces) p.feed(piece);
  if (finish) p.finish();
  return out;
}

TEST(Sse, BasicEventsCommentsAndMultilineData) {
  const std::string s =
      ": keep-alive\n"
      "data: {\"a\":1}\n\n"
      "event: ping\nid: 7\ndata: x\ndata:  y\n\n"
      "retry: 100\n\n"  // no data: not dispatched
      "data\n\n";       // a bare "data" field is an empty data line
  auto ev = parse_pieces({s});
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].data, "{\"a\":1}");
  EXPECT_EQ(ev[1].event, "ping");
  EXPECT_EQ(ev[1].id, "7");
  EXPECT_EQ(ev[1].data, "x\n y");  // only one leading space is dropped
  EXPECT_EQ(ev[2].data, "");
}

TEST(Sse, EveryTwoAndThreeWaySplitGivesTheSameEvents) {
  const std::string s =
      "data: {\"choices\":[{\"text\":\"h\\u00e9llo \xe2\x82\xac\"}]}\r\n\r\n"
      "data: second\r\ndata: line\r\r"
      "data: [DONE]\n\n";
  const auto whole = parse_pieces({s});
  ASSERT_EQ(whole.size(), 3u);
  EXPECT_EQ(whole[1].data, "second\nline");
  EXPECT_EQ(whole[2].data, "[DONE]");
  for (size_t i = 0; i <= s.size(); ++i) {
    for (size_t j = i; j <= s.size(); j += 3) {
      auto ev = parse_pieces({s.substr(0, i), s.substr(i, j - i), s.substr(j)});
      ASSERT_EQ(ev.size(), whole.size()) << "split at " << i << "," << j;
      for (size_t k = 0; k < ev.size(); ++k) EXPECT_EQ(ev[k].data, whole[k].data);
    }
  }
  // Byte by byte.
  std::vector<std::string> bytes;
  for (char c : s) bytes.emplace_back(1, c);
  auto ev = parse_pieces(bytes);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].data, whole[0].data);
}

TEST(Sse, CrLfSplitAcrossPiecesIsOneLineBreak) {
  // "\r" ends one piece and "\n" starts the next: one line end, not an empty line between.
  auto ev = parse_pieces({"data: a\r", "\ndata: b\r", "\n\r", "\n"});
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].data, "a\nb");
}

TEST(Sse, FinishDispatchesAnUnterminatedLastEvent) {
  EXPECT_EQ(parse_pieces({"data: [DONE]\n"}, /*finish=*/false).size(), 0u);
  auto ev = parse_pieces({"data: [DONE]"});
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].data, "[DONE]");
}

SseEvent data(const nlohmann::json& j) {
  return SseEvent{"", j.dump(), ""};
}
SseEvent done() {
  return SseEvent{"", "[DONE]", ""};
}

TEST(StreamAccumulator, CompletionsStreamWithUsage) {
  RequestRecord r;
  r.max_tokens = 3;
  StreamAccumulator acc(r);
  acc.on_event(data({{"choices", {{{"index", 0}, {"text", ""}}}}}), 0.05);  // role-only chunk
  acc.on_event(data({{"choices", {{{"index", 0}, {"text", "Hel"}}}}}), 0.10);
  acc.on_event(data({{"choices", {{{"index", 0}, {"text", "lo"}}}}}), 0.15);
  acc.on_event(data({{"choices", {{{"index", 0}, {"text", "!"}, {"finish_reason", "length"}}}}}),
               0.20);
  acc.on_event(data({{"choices", nlohmann::json::array()},
                     {"usage",
                      {{"prompt_tokens", 42},
                       {"completion_tokens", 3},
                       {"prompt_tokens_details", {{"cached_tokens", 32}}}}}}),
               0.21);
  acc.on_event(done(), 0.22);
  acc.finish(0.23);
  EXPECT_TRUE(r.success) << r.error_type;
  EXPECT_EQ(r.output_text, "Hello!");
  EXPECT_EQ(r.chunk_times, (std::vector<double>{0.10, 0.15, 0.20}));  // empty text is no token
  EXPECT_EQ(r.finish_reason, "length");
  EXPECT_EQ(r.usage_prompt_tokens, 42);
  EXPECT_EQ(r.usage_cached_tokens, 32);
  EXPECT_EQ(r.output_tokens, 3);
  EXPECT_TRUE(r.output_tokens_from_usage);
  EXPECT_DOUBLE_EQ(r.end_s, 0.23);
}

TEST(StreamAccumulator, ChatDeltasIncludingReasoning) {
  RequestRecord r;
  r.max_tokens = 4;
  StreamAccumulator acc(r);
  acc.on_event(data({{"choices", {{{"delta", {{"role", "assistant"}}}}}}}), 0.1);
  acc.on_event(data({{"choices", {{{"delta", {{"reasoning_content", "think"}}}}}}}), 0.2);
  acc.on_event(data({{"choices", {{{"delta", {{"content", "ok"}}}, {"finish_reason", "stop"}}}}}),
               0.3);
  acc.on_event(done(), 0.3);
  acc.finish(0.31);
  EXPECT_TRUE(r.success);
  EXPECT_EQ(r.output_text, "thinkok");
  EXPECT_EQ(r.chunk_times.size(), 2u);
  EXPECT_FALSE(r.output_tokens_from_usage);  // the runner re-tokenizes the text then
  EXPECT_EQ(r.usage_cached_tokens, -1);
}

TEST(StreamAccumulator, ErrorsAreTyped) {
  {
    RequestRecord r;
    r.max_tokens = 2;
    StreamAccumulator acc(r);
    acc.on_event(data({{"choices", {{{"text", "a"}}}}}), 0.1);
    acc.on_event(data({{"error", {{"message", "engine overloaded"}, {"code", 503}}}}), 0.2);
    acc.on_event(done(), 0.3);
    acc.finish(0.3);
    EXPECT_FALSE(r.success);
    EXPECT_EQ(r.error_type, "stream_error");
    EXPECT_EQ(r.error_message, "engine overloaded");
  }
  {
    RequestRecord r;
    r.max_tokens = 2;
    StreamAccumulator acc(r);
    acc.on_event(SseEvent{"", "{not json", ""}, 0.1);
    acc.finish(0.2);
    EXPECT_EQ(r.error_type, "bad_json");
  }
  {
    RequestRecord r;  // cut off mid-stream: no [DONE], no finish_reason
    r.max_tokens = 2;
    StreamAccumulator acc(r);
    acc.on_event(data({{"choices", {{{"text", "a"}}}}}), 0.1);
    acc.finish(0.2);
    EXPECT_FALSE(r.success);
    EXPECT_EQ(r.error_type, "incomplete_stream");
  }
  {
    RequestRecord r;  // finished, but nothing was generated
    r.max_tokens = 2;
    StreamAccumulator acc(r);
    acc.on_event(data({{"choices", {{{"text", ""}, {"finish_reason", "stop"}}}}}), 0.1);
    acc.on_event(done(), 0.1);
    acc.finish(0.2);
    EXPECT_EQ(r.error_type, "no_output");
  }
}

TEST(RequestBody, CompletionsAndChatShapes) {
  BenchRequest req;
  req.prompt = "hello";
  req.messages = nlohmann::json::array({{{"role", "user"}, {"content", "hello"}}});
  req.max_tokens = 7;
  ClientOptions o;
  o.model = "m";
  o.endpoint = "/v1/completions";
  o.extra_body = {{"top_k", 1}};
  auto b = build_request_body(req, o);
  EXPECT_EQ(b["prompt"], "hello");
  EXPECT_FALSE(b.contains("messages"));
  EXPECT_EQ(b["max_tokens"], 7);
  EXPECT_EQ(b["stream"], true);
  EXPECT_EQ(b["stream_options"]["include_usage"], true);
  EXPECT_EQ(b["ignore_eos"], true);
  EXPECT_EQ(b["top_k"], 1);
  o.endpoint = "/v1/chat/completions";
  o.ignore_eos = false;
  b = build_request_body(req, o);
  EXPECT_EQ(b["messages"][0]["content"], "hello");
  EXPECT_FALSE(b.contains("prompt"));
  EXPECT_FALSE(b.contains("ignore_eos"));
  EXPECT_EQ(format_of_endpoint("/v1/chat/completions"), PromptFormat::kMessages);
  EXPECT_EQ(format_of_endpoint("/v1/completions"), PromptFormat::kText);
}

}  // namespace
}  // namespace di::bench
