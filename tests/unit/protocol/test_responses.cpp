// Output → wire: SSE frames and bodies for every API, fed scripted output-parser events (the same
// events the server gets from recipe/ parsers), so tool calls and thinking are covered even though a
// tiny random model never emits them. Each streaming test reassembles the stream the way the official
// clients do and compares it with the non-streaming body.
#include <gtest/gtest.h>

#include "protocol/response.h"
#include "unit/protocol/sse_util.h"

namespace di::protocol {
namespace {

using recipe::ParserEvent;
using T = ParserEvent::Type;
using testing::Frame;
using testing::parse_sse;

ParserEvent text_event(T type, std::string text) {
  ParserEvent e;
  e.type = type;
  e.text = std::move(text);
  return e;
}
ParserEvent tool_start(int idx, std::string id, std::string name) {
  ParserEvent e;
  e.type = T::kToolCallStart;
  e.tool_index = idx;
  e.tool_call_id = std::move(id);
  e.tool_name = std::move(name);
  return e;
}
ParserEvent tool_args(int idx, std::string text) {
  ParserEvent e = text_event(T::kToolCallArgumentsDelta, std::move(text));
  e.tool_index = idx;
  return e;
}

// Reasoning, content, then two tool calls; `split` cuts every delta into pieces of that many characters
// (0 = as is), to check that the chunking of the same output does not change what clients assemble.
std::vector<ParserEvent> script(size_t split = 0) {
  std::vector<ParserEvent> base = {
      text_event(T::kReasoningDelta, "Let me "), text_event(T::kReasoningDelta, "think"),
      text_event(T::kContentDelta, "Hi"),        text_event(T::kContentDelta, " there, 日本"),
      tool_start(0, "call_a", "get_weather"),   tool_args(0, "{\"city\":"),
      tool_args(0, "\"Paris\"}"),                tool_start(1, "call_b", "noop"),
      tool_args(1, "{}")};
  if (split == 0) return base;
  std::vector<ParserEvent> out;
  for (const auto& e : base) {
    if (e.type == T::kToolCallStart) {
      out.push_back(e);
      continue;
    }
    // Pieces of `split` characters: parsers emit complete UTF-8 only (recipe/output_parser.h).
    size_t i = 0;
    while (i < e.text.size()) {
      size_t j = i;
      for (size_t n = 0; n < split && j < e.text.size(); ++n) {
        ++j;
        while (j < e.text.size() && (static_cast<unsigned char>(e.text[j]) & 0xC0) == 0x80) ++j;
      }
      ParserEvent piece = e;
      piece.text = e.text.substr(i, j - i);
      out.push_back(piece);
      i = j;
    }
  }
  return out;
}

Completion completion_of(const std::vector<ParserEvent>& events, StopCause stop) {
  CompletionBuilder b;
  for (const auto& e : events) b.add(e);
  Completion c = b.completion();
  c.stop = stop;
  c.usage = {9, 4, 12, 3};
  return c;
}

ParsedRequest request_for(Api api, bool include_usage = true) {
  ParsedRequest r;
  r.api = api;
  r.model = "m";
  r.stream = true;
  r.include_usage = include_usage;
  r.echo = Json{{"instructions", nullptr}, {"max_output_tokens", 64}};
  return r;
}

std::string run_stream(const ParsedRequest& r, const std::vector<ParserEvent>& events, const Completion& c) {
  auto enc = make_stream_encoder(r, ResponseMeta{"id-1", 1700000000, "m"});
  std::string out;
  enc->begin(Usage{9, 0, 0, 0}, out);
  for (const auto& e : events) enc->event(e, out);
  enc->end(c, out);
  return out;
}

// ---- Chat Completions ----------------------------------------------------------------------------

struct ChatAssembled {
  std::string content, reasoning, finish_reason;
  Json tool_calls = Json::array();
  Json usage;
};

ChatAssembled assemble_chat(const std::vector<Frame>& frames) {
  ChatAssembled a;
  EXPECT_GE(frames.size(), 3u);
  EXPECT_EQ(frames.back().data, "[DONE]");
  const Json& first = frames.front().json;
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  for (size_t i = 0; i + 1 < frames.size(); ++i) {
    const Json& j = frames[i].json;
    EXPECT_EQ(j["id"], "id-1");
    EXPECT_EQ(j["object"], "chat.completion.chunk");
    EXPECT_EQ(j["created"], 1700000000);
    EXPECT_EQ(j["model"], "m");
    if (j["choices"].empty()) {
      a.usage = j["usage"];
      EXPECT_EQ(i + 2, frames.size()) << "the usage chunk comes last, right before [DONE]";
      continue;
    }
    EXPECT_TRUE(j.contains("usage") && j["usage"].is_null()) << "other chunks carry usage: null";
    const Json& ch = j["choices"][0];
    const Json& d = ch["delta"];
    if (d.contains("content")) a.content += d["content"].get<std::string>();
    if (d.contains("reasoning_content")) a.reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("tool_calls")) {
      for (const Json& tc : d["tool_calls"]) {
        const size_t idx = tc["index"];
        if (tc.contains("id")) {
          EXPECT_EQ(idx, a.tool_calls.size()) << "a call's first delta has its id, type and name";
          EXPECT_EQ(tc["type"], "function");
          a.tool_calls.push_back({{"id", tc["id"]}, {"name", tc["function"]["name"]},
                                  {"arguments", tc["function"]["arguments"]}});
        } else {
          EXPECT_LT(idx, a.tool_calls.size());
          EXPECT_FALSE(tc["function"].contains("name"));
          a.tool_calls[idx]["arguments"] = a.tool_calls[idx]["arguments"].get<std::string>() +
                                           tc["function"]["arguments"].get<std::string>();
        }
      }
    }
    if (!ch["finish_reason"].is_null()) a.finish_reason = ch["finish_reason"];
  }
  return a;
}

TEST(ChatStreamTest, ChunksAsTheOfficialClientExpects) {
  const auto events = script();
  const Completion c = completion_of(events, StopCause::kToolCalls);
  const auto frames = parse_sse(run_stream(request_for(Api::kChatCompletions), events, c));
  ChatAssembled a = assemble_chat(frames);
  EXPECT_EQ(a.reasoning, "Let me think");
  EXPECT_EQ(a.content, "Hi there, 日本");
  ASSERT_EQ(a.tool_calls.size(), 2u);
  EXPECT_EQ(a.tool_calls[0]["id"], "call_a");
  EXPECT_EQ(a.tool_calls[0]["name"], "get_weather");
  EXPECT_EQ(a.tool_calls[0]["arguments"], "{\"city\":\"Paris\"}");
  EXPECT_EQ(a.tool_calls[1]["arguments"], "{}");
  EXPECT_EQ(a.finish_reason, "tool_calls");
  EXPECT_EQ(a.usage["prompt_tokens"], 9);
  EXPECT_EQ(a.usage["completion_tokens"], 12);
  EXPECT_EQ(a.usage["total_tokens"], 21);
  EXPECT_EQ(a.usage["prompt_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(a.usage["completion_tokens_details"]["reasoning_tokens"], 3);
}

TEST(ChatStreamTest, WithoutIncludeUsageThereIsNoUsageChunk) {
  const auto events = script();
  const auto frames = parse_sse(run_stream(request_for(Api::kChatCompletions, false), events,
                                           completion_of(events, StopCause::kEndTurn)));
  for (size_t i = 0; i + 1 < frames.size(); ++i) {
    EXPECT_FALSE(frames[i].json.contains("usage"));
    EXPECT_EQ(frames[i].json["choices"].size(), 1u);
  }
  EXPECT_EQ(frames[frames.size() - 2].json["choices"][0]["finish_reason"], "stop");
}

TEST(ChatStreamTest, StreamEqualsBodyForEveryChunking) {
  for (size_t split : {0, 1, 2, 3, 7}) {
    const auto events = script(split);
    const Completion c = completion_of(events, StopCause::kToolCalls);
    ChatAssembled a = assemble_chat(parse_sse(run_stream(request_for(Api::kChatCompletions), events, c)));
    const Json body = Json::parse(render_response(request_for(Api::kChatCompletions), {"id-1", 1700000000, "m"}, c));
    const Json& msg = body["choices"][0]["message"];
    EXPECT_EQ(body["object"], "chat.completion");
    EXPECT_EQ(msg["role"], "assistant");
    EXPECT_EQ(msg["content"], a.content) << split;
    EXPECT_EQ(msg["reasoning_content"], a.reasoning) << split;
    ASSERT_EQ(msg["tool_calls"].size(), a.tool_calls.size());
    for (size_t i = 0; i < a.tool_calls.size(); ++i) {
      EXPECT_EQ(msg["tool_calls"][i]["id"], a.tool_calls[i]["id"]);
      EXPECT_EQ(msg["tool_calls"][i]["type"], "function");
      EXPECT_EQ(msg["tool_calls"][i]["function"]["name"], a.tool_calls[i]["name"]);
      EXPECT_EQ(msg["tool_calls"][i]["function"]["arguments"], a.tool_calls[i]["arguments"]);
    }
    EXPECT_EQ(body["choices"][0]["finish_reason"], a.finish_reason);
    EXPECT_EQ(body["usage"], a.usage);
  }
}

TEST(ChatBodyTest, ContentIsNullOnlyBesideToolCalls) {
  Completion c;
  c.usage = {3, 0, 0, 0};
  Json body = Json::parse(render_response(request_for(Api::kChatCompletions), {"x", 1, "m"}, c));
  EXPECT_EQ(body["choices"][0]["message"]["content"], "");
  EXPECT_FALSE(body["choices"][0]["message"].contains("tool_calls"));
  EXPECT_FALSE(body["choices"][0]["message"].contains("reasoning_content"));
  c.tool_calls.push_back({"call_1", "f", "{}"});
  c.stop = StopCause::kToolCalls;
  body = Json::parse(render_response(request_for(Api::kChatCompletions), {"x", 1, "m"}, c));
  EXPECT_TRUE(body["choices"][0]["message"]["content"].is_null());
  c.stop = StopCause::kLength;
  body = Json::parse(render_response(request_for(Api::kChatCompletions), {"x", 1, "m"}, c));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  c.stop = StopCause::kStopSequence;
  body = Json::parse(render_response(request_for(Api::kChatCompletions), {"x", 1, "m"}, c));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
}

TEST(ChatStreamTest, MidStreamErrorIsAnErrorObjectThenDone) {
  auto enc = make_stream_encoder(request_for(Api::kChatCompletions), {"x", 1, "m"});
  std::string out;
  enc->begin({}, out);
  enc->fail(ApiError::internal("boom"), out);
  auto frames = parse_sse(out);
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[1].json["error"]["message"], "boom");
  EXPECT_EQ(frames[1].json["error"]["type"], "server_error");
  EXPECT_EQ(frames[2].data, "[DONE]");
}

// ---- Completions -----------------------------------------------------------------------------

TEST(CompletionsStreamTest, TextChunksThenFinishUsageDone) {
  std::vector<ParserEvent> events = {text_event(T::kContentDelta, "def "), text_event(T::kContentDelta, "f():")};
  const Completion c = completion_of(events, StopCause::kLength);
  auto frames = parse_sse(run_stream(request_for(Api::kCompletions), events, c));
  ASSERT_EQ(frames.size(), 5u);
  std::string text;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(frames[i].json["object"], "text_completion");
    text += frames[i].json["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, "def f():");
  EXPECT_EQ(frames[2].json["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(frames[3].json["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(frames[4].data, "[DONE]");
  Json body = Json::parse(render_response(request_for(Api::kCompletions), {"cmpl-1", 1, "m"}, c));
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], text);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
}

// ---- Responses ---------------------------------------------------------------------------------

// Replays events the way openai-node's ResponseStream does: every delta must address an item that
// exists (`missing output at index N`) and content that was added.
Json assemble_responses(const std::vector<Frame>& frames) {
  Json snapshot;
  int64_t seq = 0;
  for (const Frame& f : frames) {
    const Json& j = f.json;
    EXPECT_EQ(f.event, j["type"]) << "the event: line names the type";
    EXPECT_EQ(j["sequence_number"], seq++) << f.data;
    const std::string type = j["type"];
    if (type == "response.created") {
      EXPECT_TRUE(snapshot.is_null());
      snapshot = j["response"];
      EXPECT_EQ(snapshot["status"], "in_progress");
      continue;
    }
    EXPECT_FALSE(snapshot.is_null()) << "response.created comes first";
    if (type == "response.output_item.added") {
      EXPECT_EQ(j["output_index"], snapshot["output"].size());
      snapshot["output"].push_back(j["item"]);
    } else if (type == "response.content_part.added") {
      Json& item = snapshot["output"].at(j["output_index"].get<size_t>());
      EXPECT_EQ(item["id"], j["item_id"]);
      item["content"].push_back(j["part"]);
    } else if (type == "response.output_text.delta" || type == "response.reasoning_text.delta") {
      Json& item = snapshot["output"].at(j["output_index"].get<size_t>());
      EXPECT_EQ(item["id"], j["item_id"]);
      Json& part = item["content"].at(j["content_index"].get<size_t>());
      EXPECT_EQ(part["type"], type == "response.output_text.delta" ? "output_text" : "reasoning_text");
      part["text"] = part["text"].get<std::string>() + j["delta"].get<std::string>();
    } else if (type == "response.function_call_arguments.delta") {
      Json& item = snapshot["output"].at(j["output_index"].get<size_t>());
      EXPECT_EQ(item["type"], "function_call");
      item["arguments"] = item["arguments"].get<std::string>() + j["delta"].get<std::string>();
    } else if (type == "response.output_item.done") {
      Json& item = snapshot["output"].at(j["output_index"].get<size_t>());
      // The done item equals what the deltas built (modulo status).
      Json built = item;
      Json done = j["item"];
      built.erase("status");
      done.erase("status");
      if (done["type"] == "message") {
        for (auto& p : done["content"]) p.erase("logprobs");
        for (auto& p : built["content"]) p.erase("logprobs");
      }
      EXPECT_EQ(built, done);
      item = j["item"];
    } else if (type == "response.completed" || type == "response.incomplete") {
      EXPECT_EQ(j["response"]["output"], snapshot["output"]);
      snapshot = j["response"];
      EXPECT_EQ(&f, &frames.back()) << "the terminal event is last";
    }
  }
  return snapshot;
}

TEST(ResponsesStreamTest, ItemsAndDeltasInOrder) {
  for (size_t split : {0, 1, 4}) {
    const auto events = script(split);
    const Completion c = completion_of(events, StopCause::kToolCalls);
    const auto frames = parse_sse(run_stream(request_for(Api::kResponses), events, c));
    EXPECT_EQ(frames[0].event, "response.created");
    EXPECT_EQ(frames[1].event, "response.in_progress");
    Json resp = assemble_responses(frames);
    EXPECT_EQ(resp["status"], "completed");
    EXPECT_EQ(resp["id"], "id-1");
    EXPECT_EQ(resp["object"], "response");
    const Json& out = resp["output"];
    ASSERT_EQ(out.size(), 4u);
    EXPECT_EQ(out[0]["type"], "reasoning");
    EXPECT_EQ(out[0]["content"][0]["text"], "Let me think");
    EXPECT_EQ(out[1]["type"], "message");
    EXPECT_EQ(out[1]["content"][0]["text"], "Hi there, 日本");
    EXPECT_EQ(out[2]["type"], "function_call");
    EXPECT_EQ(out[2]["call_id"], "call_a");
    EXPECT_EQ(out[2]["name"], "get_weather");
    EXPECT_EQ(out[2]["arguments"], "{\"city\":\"Paris\"}");
    EXPECT_EQ(out[3]["arguments"], "{}");
    EXPECT_EQ(resp["usage"]["input_tokens"], 9);
    EXPECT_EQ(resp["usage"]["input_tokens_details"]["cached_tokens"], 4);
    EXPECT_EQ(resp["usage"]["output_tokens_details"]["reasoning_tokens"], 3);
    EXPECT_EQ(resp["usage"]["total_tokens"], 21);
    EXPECT_EQ(resp["max_output_tokens"], 64);

    // The non-streaming body has the same items (ids differ: they are minted per response).
    Json body = Json::parse(render_response(request_for(Api::kResponses), {"id-1", 1700000000, "m"}, c));
    ASSERT_EQ(body["output"].size(), out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      Json a = out[i], b = body["output"][i];
      a.erase("id");
      b.erase("id");
      EXPECT_EQ(a, b) << i;
    }
    EXPECT_EQ(body["usage"], resp["usage"]);
  }
}

TEST(ResponsesStreamTest, LengthEndsIncomplete) {
  std::vector<ParserEvent> events = {text_event(T::kContentDelta, "abc")};
  const Completion c = completion_of(events, StopCause::kLength);
  const auto frames = parse_sse(run_stream(request_for(Api::kResponses), events, c));
  EXPECT_EQ(frames.back().event, "response.incomplete");
  Json resp = assemble_responses(frames);
  EXPECT_EQ(resp["status"], "incomplete");
  EXPECT_EQ(resp["incomplete_details"]["reason"], "max_output_tokens");
  Json body = Json::parse(render_response(request_for(Api::kResponses), {"r", 1, "m"}, c));
  EXPECT_EQ(body["status"], "incomplete");
}

TEST(ResponsesStreamTest, FailureEmitsErrorThenFailed) {
  auto enc = make_stream_encoder(request_for(Api::kResponses), {"r", 1, "m"});
  std::string out;
  enc->begin({}, out);
  enc->event(text_event(T::kContentDelta, "a"), out);
  enc->fail(ApiError::internal("boom"), out);
  auto frames = parse_sse(out);
  EXPECT_EQ(frames[frames.size() - 2].event, "error");
  EXPECT_EQ(frames.back().event, "response.failed");
  EXPECT_EQ(frames.back().json["response"]["status"], "failed");
  // The open message item was closed before the error.
  bool closed = false;
  for (const auto& f : frames) closed = closed || f.event == "response.output_item.done";
  EXPECT_TRUE(closed);
}

// ---- Anthropic Messages ------------------------------------------------------------------------

// Replays events like @anthropic-ai/sdk's MessageStream (which throws on a wrong order).
Json assemble_messages(const std::vector<Frame>& frames) {
  Json msg;
  int open = -1;
  for (const Frame& f : frames) {
    const Json& j = f.json;
    EXPECT_EQ(f.event, j["type"]);
    const std::string type = j["type"];
    if (type == "message_start") {
      EXPECT_TRUE(msg.is_null());
      msg = j["message"];
      continue;
    }
    EXPECT_FALSE(msg.is_null()) << type << " before message_start";
    if (type == "content_block_start") {
      EXPECT_EQ(open, -1) << "a block started while another is open";
      EXPECT_EQ(j["index"], msg["content"].size());
      open = j["index"];
      Json block = j["content_block"];
      if (block["type"] == "tool_use") block["partial"] = "";
      msg["content"].push_back(block);
    } else if (type == "content_block_delta") {
      EXPECT_EQ(j["index"], open);
      Json& block = msg["content"].at(j["index"].get<size_t>());
      const Json& d = j["delta"];
      if (d["type"] == "text_delta") {
        EXPECT_EQ(block["type"], "text");
        block["text"] = block["text"].get<std::string>() + d["text"].get<std::string>();
      } else if (d["type"] == "thinking_delta") {
        EXPECT_EQ(block["type"], "thinking");
        block["thinking"] = block["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      } else if (d["type"] == "input_json_delta") {
        EXPECT_EQ(block["type"], "tool_use");
        block["partial"] = block["partial"].get<std::string>() + d["partial_json"].get<std::string>();
      } else {
        ADD_FAILURE() << "unknown delta " << d.dump();
      }
    } else if (type == "content_block_stop") {
      EXPECT_EQ(j["index"], open);
      Json& block = msg["content"].at(j["index"].get<size_t>());
      if (block["type"] == "tool_use") {
        block["input"] = Json::parse(block["partial"].get<std::string>());
        block.erase("partial");
      }
      open = -1;
    } else if (type == "message_delta") {
      EXPECT_EQ(open, -1);
      msg["stop_reason"] = j["delta"]["stop_reason"];
      msg["stop_sequence"] = j["delta"]["stop_sequence"];
      for (auto it = j["usage"].begin(); it != j["usage"].end(); ++it) msg["usage"][it.key()] = it.value();
    } else if (type == "message_stop") {
      EXPECT_EQ(&f, &frames.back());
    } else {
      EXPECT_EQ(type, "ping");
    }
  }
  return msg;
}

TEST(MessagesStreamTest, BlocksInOrderAndStreamEqualsBody) {
  for (size_t split : {0, 1, 3}) {
    const auto events = script(split);
    const Completion c = completion_of(events, StopCause::kToolCalls);
    ParsedRequest r = request_for(Api::kMessages);
    const auto frames = parse_sse(run_stream(r, events, c));
    EXPECT_EQ(frames.front().event, "message_start");
    EXPECT_EQ(frames.back().event, "message_stop");
    Json msg = assemble_messages(frames);
    EXPECT_EQ(msg["id"], "id-1");
    EXPECT_EQ(msg["role"], "assistant");
    ASSERT_EQ(msg["content"].size(), 4u);
    EXPECT_EQ(msg["content"][0]["type"], "thinking");
    EXPECT_EQ(msg["content"][0]["thinking"], "Let me think");
    EXPECT_EQ(msg["content"][1]["text"], "Hi there, 日本");
    EXPECT_EQ(msg["content"][2]["type"], "tool_use");
    EXPECT_EQ(msg["content"][2]["id"], "call_a");
    EXPECT_EQ(msg["content"][2]["input"], Json::parse(R"({"city":"Paris"})"));
    EXPECT_EQ(msg["content"][3]["input"], Json::object());
    EXPECT_EQ(msg["stop_reason"], "tool_use");
    EXPECT_TRUE(msg["stop_sequence"].is_null());
    EXPECT_EQ(msg["usage"]["input_tokens"], 5);  // 9 prompt tokens, 4 of them from the cache
    EXPECT_EQ(msg["usage"]["cache_read_input_tokens"], 4);
    EXPECT_EQ(msg["usage"]["output_tokens"], 12);

    Json body = Json::parse(render_response(r, {"id-1", 1, "m"}, c));
    EXPECT_EQ(body["type"], "message");
    EXPECT_EQ(body["content"], msg["content"]);
    EXPECT_EQ(body["stop_reason"], msg["stop_reason"]);
    EXPECT_EQ(body["usage"], msg["usage"]);
  }
}

TEST(MessagesStreamTest, StopReasons) {
  std::vector<ParserEvent> events = {text_event(T::kContentDelta, "abc")};
  ParsedRequest r = request_for(Api::kMessages);
  Completion c = completion_of(events, StopCause::kStopSequence);
  c.stop_sequence = "###";
  Json msg = assemble_messages(parse_sse(run_stream(r, events, c)));
  EXPECT_EQ(msg["stop_reason"], "stop_sequence");
  EXPECT_EQ(msg["stop_sequence"], "###");
  EXPECT_EQ(Json::parse(render_response(r, {"x", 1, "m"}, c))["stop_sequence"], "###");
  c.stop = StopCause::kLength;
  EXPECT_EQ(Json::parse(render_response(r, {"x", 1, "m"}, c))["stop_reason"], "max_tokens");
  c.stop = StopCause::kEndTurn;
  Json body = Json::parse(render_response(r, {"x", 1, "m"}, c));
  EXPECT_EQ(body["stop_reason"], "end_turn");
  EXPECT_TRUE(body["stop_sequence"].is_null());
}

TEST(MessagesStreamTest, MidStreamErrorEvent) {
  auto enc = make_stream_encoder(request_for(Api::kMessages), {"x", 1, "m"});
  std::string out;
  enc->begin({}, out);
  enc->fail(ApiError::unavailable("Overloaded"), out);
  auto frames = parse_sse(out);
  EXPECT_EQ(frames.back().event, "error");
  EXPECT_EQ(frames.back().json["error"]["type"], "overloaded_error");
}

TEST(MessagesBodyTest, InvalidToolArgumentsBecomeAnEmptyObject) {
  Completion c;
  c.tool_calls.push_back({"toolu_1", "f", "{not json"});
  c.stop = StopCause::kToolCalls;
  Json body = Json::parse(render_response(request_for(Api::kMessages), {"x", 1, "m"}, c));
  EXPECT_EQ(body["content"][0]["input"], Json::object());
  EXPECT_EQ(render_count_tokens(42), R"({"input_tokens":42})");
}

TEST(StopCauseTest, ParserReasonAndStopStrings) {
  EXPECT_EQ(stop_cause(recipe::FinishReason::kStop, false), StopCause::kEndTurn);
  EXPECT_EQ(stop_cause(recipe::FinishReason::kStop, true), StopCause::kStopSequence);
  EXPECT_EQ(stop_cause(recipe::FinishReason::kLength, false), StopCause::kLength);
  EXPECT_EQ(stop_cause(recipe::FinishReason::kToolCalls, false), StopCause::kToolCalls);
  EXPECT_STREQ(openai_finish_reason(StopCause::kToolCalls), "tool_calls");
  EXPECT_STREQ(anthropic_stop_reason(StopCause::kToolCalls), "tool_use");
  EXPECT_STREQ(anthropic_stop_reason(StopCause::kLength), "max_tokens");
}

}  // namespace
}  // namespace di::protocol
