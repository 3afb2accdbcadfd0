// Request parsing and validation for every API: what maps to the Conversation and the generation
// settings, and which bad inputs become 400s naming the right field.
#include <gtest/gtest.h>

#include "protocol/api_error.h"
#include "protocol/request.h"

namespace di::protocol {
namespace {

using recipe::Role;

ApiError error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ApiException& e) {
    return e.error();
  }
  ADD_FAILURE() << "expected an ApiException";
  return {};
}

Json chat_body() {
  return Json::parse(R"({"model":"m","messages":[{"role":"user","content":"hi"}]})");
}

TEST(ApiErrorTest, OpenAiAndAnthropicShapes) {
  ApiError e = ApiError::invalid_request("bad temperature", "temperature");
  Json o = Json::parse(openai_error_body(e));
  EXPECT_EQ(o["error"]["message"], "bad temperature");
  EXPECT_EQ(o["error"]["type"], "invalid_request_error");
  EXPECT_EQ(o["error"]["param"], "temperature");
  EXPECT_TRUE(o["error"]["code"].is_null());
  Json a = Json::parse(anthropic_error_body(e));
  EXPECT_EQ(a["type"], "error");
  EXPECT_EQ(a["error"]["type"], "invalid_request_error");
  EXPECT_EQ(a["error"]["message"], "bad temperature");
  EXPECT_EQ(ApiError::too_large("x").http_status, 413);
  EXPECT_STREQ(anthropic_error_type(413), "request_too_large");
  EXPECT_STREQ(anthropic_error_type(429), "rate_limit_error");
  EXPECT_STREQ(anthropic_error_type(404), "not_found_error");
  EXPECT_STREQ(anthropic_error_type(500), "api_error");
  EXPECT_STREQ(anthropic_error_type(503), "overloaded_error");
  EXPECT_EQ(Json::parse(openai_error_body(ApiError::not_found("no", "model_not_found")))["error"]["code"],
            "model_not_found");
}

TEST(ParseBodyTest, MalformedJsonInvalidUtf8AndNonObjects) {
  EXPECT_EQ(error_of([] { parse_body("{\"model\": "); }).http_status, 400);
  EXPECT_EQ(error_of([] { parse_body("[1,2]"); }).http_status, 400);
  EXPECT_EQ(error_of([] { parse_body(""); }).http_status, 400);
  // 0xC3 0x28 is an ill-formed UTF-8 sequence inside a string.
  const std::string bad = std::string("{\"model\":\"m\",\"x\":\"") + "\xC3\x28" + "\"}";
  ApiError e = error_of([&] { parse_body(bad); });
  EXPECT_EQ(e.http_status, 400);
  EXPECT_NE(e.message.find("not valid JSON"), std::string::npos);
  EXPECT_NO_THROW(parse_body(R"({"a":"\u00e9 ok"})"));
}

TEST(ChatRequestTest, MapsMessagesToolsAndSettings) {
  Json body = Json::parse(R"({
    "model": "m", "stream": true, "stream_options": {"include_usage": true},
    "messages": [
      {"role": "system", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "weather "}, {"type": "text", "text": "in Paris?"}]},
      {"role": "assistant", "content": null, "reasoning_content": "need a tool",
       "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18C"}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "max_completion_tokens": 100, "max_tokens": 5, "temperature": 0, "top_p": 0.5, "seed": 7,
    "stop": ["\n\n", "END"], "reasoning_effort": "high", "thinking": {"type": "enabled"}
  })");
  ParsedRequest r = parse_chat_completions(body);
  EXPECT_EQ(r.model, "m");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  ASSERT_EQ(r.conversation.messages.size(), 4u);
  EXPECT_EQ(r.conversation.messages[0].role, Role::kSystem);
  EXPECT_EQ(r.conversation.messages[1].text(), "weather in Paris?");
  const auto& a = r.conversation.messages[2];
  EXPECT_EQ(a.role, Role::kAssistant);
  EXPECT_EQ(a.reasoning_content.value_or(""), "need a tool");
  ASSERT_EQ(a.tool_calls.size(), 1u);
  EXPECT_EQ(a.tool_calls[0].name, "get_weather");
  EXPECT_EQ(a.tool_calls[0].arguments, "{\"city\":\"Paris\"}");
  EXPECT_EQ(r.conversation.messages[3].tool_call_id, "call_1");
  ASSERT_EQ(r.conversation.tools.size(), 1u);
  EXPECT_EQ(r.conversation.tools[0].parameters["properties"]["city"]["type"], "string");
  EXPECT_EQ(r.gen.max_tokens, 100);  // max_completion_tokens wins
  EXPECT_EQ(r.gen.sampling.temperature, 0.0f);
  EXPECT_EQ(r.gen.sampling.top_p, 0.5f);
  EXPECT_EQ(r.gen.sampling.seed, 7u);
  EXPECT_EQ(r.gen.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(r.conversation.settings.thinking, std::optional<bool>(true));
  EXPECT_EQ(r.conversation.settings.effort, recipe::ReasoningEffort::kHigh);
}

TEST(ChatRequestTest, ThinkingSpellings) {
  Json b = chat_body();
  b["chat_template_kwargs"] = {{"enable_thinking", true}};
  EXPECT_EQ(parse_chat_completions(b).conversation.settings.thinking, std::optional<bool>(true));
  b = chat_body();
  b["reasoning_effort"] = "none";
  EXPECT_EQ(parse_chat_completions(b).conversation.settings.thinking, std::optional<bool>(false));
  b = chat_body();
  b["thinking"] = false;
  EXPECT_EQ(parse_chat_completions(b).conversation.settings.thinking, std::optional<bool>(false));
  b = chat_body();
  b["reasoning_effort"] = "extreme";
  EXPECT_EQ(error_of([&] { parse_chat_completions(b); }).param, "reasoning_effort");
}

TEST(ChatRequestTest, ToolChoiceNoneDropsTools) {
  Json b = chat_body();
  b["tools"] = Json::parse(R"([{"type":"function","function":{"name":"f"}}])");
  b["tool_choice"] = "none";
  ParsedRequest r = parse_chat_completions(b);
  EXPECT_FALSE(r.parse_tool_calls);
  EXPECT_TRUE(r.conversation.tools.empty());
  b["tool_choice"] = "required";
  EXPECT_EQ(error_of([&] { parse_chat_completions(b); }).param, "tool_choice");
}

struct BadCase {
  const char* name;
  const char* patch;  // merged into a valid body
  const char* param;  // expected `param` ("" = any)
};

TEST(ChatRequestTest, BadInputsAre400sNamingTheField) {
  const BadCase cases[] = {
      {"empty messages", R"({"messages": []})", "messages"},
      {"messages not array", R"({"messages": "hi"})", "messages"},
      {"no model", R"({"model": null})", "model"},
      {"model not string", R"({"model": 3})", "model"},
      {"empty model", R"({"model": ""})", "model"},
      {"bad role", R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role"},
      {"content wrong type", R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {"user without content", R"({"messages": [{"role": "user"}]})", "messages[0].content"},
      {"image part", R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})",
       "messages[0].content[0].type"},
      {"tool without id", R"({"messages": [{"role": "tool", "content": "x"}]})", "messages[0].tool_call_id"},
      {"negative max_tokens", R"({"max_tokens": -1})", "max_tokens"},
      {"zero max_tokens", R"({"max_tokens": 0})", "max_tokens"},
      {"huge max_tokens", R"({"max_tokens": 100000000000})", "max_tokens"},
      {"fractional max_tokens", R"({"max_tokens": 2.5})", "max_tokens"},
      {"string max_tokens", R"({"max_tokens": "10"})", "max_tokens"},
      {"negative temperature", R"({"temperature": -0.5})", "temperature"},
      {"temperature too high", R"({"temperature": 3})", "temperature"},
      {"temperature string", R"({"temperature": "hot"})", "temperature"},
      {"top_p zero", R"({"top_p": 0})", "top_p"},
      {"presence_penalty", R"({"presence_penalty": 5})", "presence_penalty"},
      {"n=2", R"({"n": 2})", "n"},
      {"stream not bool", R"({"stream": "yes"})", "stream"},
      {"stop wrong type", R"({"stop": 5})", "stop"},
      {"too many stops", R"({"stop": ["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]})", "stop"},
      {"tool not function", R"({"tools": [{"type": "web_search"}]})", "tools[0].type"},
      {"tool without name", R"({"tools": [{"type": "function", "function": {}}]})", "tools[0].function.name"},
      {"tool params not object", R"({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]})",
       "tools[0].function.parameters"},
  };
  for (const auto& c : cases) {
    Json b = chat_body();
    b.merge_patch(Json::parse(c.patch));
    if (std::string(c.name) == "no model") b.erase("model");
    ApiError e = error_of([&] { parse_chat_completions(b); });
    EXPECT_EQ(e.http_status, 400) << c.name;
    if (*c.param) {
      EXPECT_EQ(e.param, c.param) << c.name << ": " << e.message;
    }
    EXPECT_FALSE(e.message.empty()) << c.name;
  }
}

TEST(OutputBudgetTest, ChecksThePromptAndMaxTokensAgainstTheContext) {
  EXPECT_EQ(resolve_output_budget(std::nullopt, 8192, 100, 4096), 3996);  // default clipped
  EXPECT_EQ(resolve_output_budget(std::nullopt, 16, 100, 4096), 16);
  EXPECT_EQ(resolve_output_budget(50, 8192, 100, 4096), 50);
  EXPECT_EQ(resolve_output_budget(3996, 8192, 100, 4096), 3996);  // exactly fills the context
  EXPECT_EQ(error_of([] { resolve_output_budget(3997, 8192, 100, 4096); }).param, "max_tokens");
  ApiError e = error_of([] { resolve_output_budget(std::nullopt, 16, 4096, 4096); });
  EXPECT_EQ(e.http_status, 400);
  EXPECT_NE(e.message.find("4096"), std::string::npos);
  EXPECT_EQ(error_of([] { resolve_output_budget(1, 16, 5000, 4096); }).http_status, 400);
}

TEST(CompletionsRequestTest, PromptForms) {
  ParsedRequest r = parse_completions(Json::parse(R"({"model":"m","prompt":"def f():"})"));
  EXPECT_EQ(r.prompt_text, "def f():");
  EXPECT_FALSE(r.prompt_is_ids);
  EXPECT_EQ(r.gen.max_tokens, 16);  // the endpoint's documented default
  r = parse_completions(Json::parse(R"({"model":"m","prompt":["one"],"max_tokens":3})"));
  EXPECT_EQ(r.prompt_text, "one");
  EXPECT_EQ(r.gen.max_tokens, 3);
  r = parse_completions(Json::parse(R"({"model":"m","prompt":[1,2,3]})"));
  EXPECT_TRUE(r.prompt_is_ids);
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  r = parse_completions(Json::parse(R"({"model":"m","prompt":[[4,5]]})"));
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{4, 5}));
  for (const char* bad : {R"({"model":"m"})", R"({"model":"m","prompt":""})", R"({"model":"m","prompt":[]})",
                          R"({"model":"m","prompt":["a","b"]})", R"({"model":"m","prompt":[1,-2]})",
                          R"({"model":"m","prompt":{"x":1}})", R"({"model":"m","prompt":"x","echo":true})",
                          R"({"model":"m","prompt":"x","max_tokens":-3})"}) {
    EXPECT_EQ(error_of([&] { parse_completions(Json::parse(bad)); }).http_status, 400) << bad;
  }
}

TEST(ResponsesRequestTest, InputItemsBecomeAConversation) {
  Json body = Json::parse(R"({
    "model": "m", "instructions": "be brief", "max_output_tokens": 64, "reasoning": {"effort": "low"},
    "input": [
      {"role": "user", "content": "weather?"},
      {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "use tool"}]},
      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]}
    ],
    "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
  })");
  ParsedRequest r = parse_responses(body);
  const auto& msgs = r.conversation.messages;
  ASSERT_EQ(msgs.size(), 5u);
  EXPECT_EQ(msgs[0].role, Role::kSystem);
  EXPECT_EQ(msgs[1].text(), "weather?");
  EXPECT_EQ(msgs[2].role, Role::kAssistant);
  EXPECT_EQ(msgs[2].reasoning_content.value_or(""), "use tool");
  ASSERT_EQ(msgs[2].tool_calls.size(), 1u);
  EXPECT_EQ(msgs[2].tool_calls[0].id, "call_1");
  EXPECT_EQ(msgs[3].role, Role::kTool);
  EXPECT_EQ(msgs[3].text(), "18C");
  EXPECT_EQ(msgs[4].text(), "thanks");
  EXPECT_EQ(r.conversation.tools.size(), 1u);
  EXPECT_EQ(r.gen.max_tokens, 64);
  EXPECT_EQ(r.conversation.settings.thinking, std::optional<bool>(true));
  EXPECT_EQ(r.echo["instructions"], "be brief");
  EXPECT_EQ(r.echo["max_output_tokens"], 64);

  r = parse_responses(Json::parse(R"({"model":"m","input":"hello","reasoning":{"effort":"none"}})"));
  ASSERT_EQ(r.conversation.messages.size(), 1u);
  EXPECT_EQ(r.conversation.settings.thinking, std::optional<bool>(false));
}

TEST(ResponsesRequestTest, BadInputs) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"model":"m"})", "input"},
      {R"({"model":"m","input":[]})", "input"},
      {R"({"model":"m","input":5})", "input"},
      {R"({"model":"m","input":"x","previous_response_id":"resp_1"})", "previous_response_id"},
      {R"({"model":"m","input":[{"type":"item_reference","id":"x"}]})", "input[0].type"},
      {R"({"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]})",
       "input[0].content[0].type"},
      {R"({"model":"m","input":"x","tools":[{"type":"web_search"}]})", "tools[0].type"},
      {R"({"model":"m","input":"x","max_output_tokens":0})", "max_output_tokens"},
      {R"({"model":"m","input":"x","temperature":-1})", "temperature"},
  };
  for (const auto& [body, param] : cases) {
    ApiError e = error_of([&] { parse_responses(Json::parse(body)); });
    EXPECT_EQ(e.http_status, 400) << body;
    EXPECT_EQ(e.param, param) << body << ": " << e.message;
  }
}

TEST(MessagesRequestTest, BlocksBecomeAConversation) {
  Json body = Json::parse(R"({
    "model": "m", "max_tokens": 100, "system": [{"type": "text", "text": "be brief"}],
    "stop_sequences": ["###"], "temperature": 0.5, "top_k": 0,
    "thinking": {"type": "enabled", "budget_tokens": 50},
    "messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "use tool", "signature": "sig"},
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18C"}]},
        {"type": "text", "text": "thanks"}]}
    ],
    "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object"}}]
  })");
  ParsedRequest r = parse_messages(body);
  const auto& msgs = r.conversation.messages;
  ASSERT_EQ(msgs.size(), 5u);
  EXPECT_EQ(msgs[0].role, Role::kSystem);
  EXPECT_EQ(msgs[0].text(), "be brief");
  EXPECT_EQ(msgs[2].reasoning_content.value_or(""), "use tool");
  EXPECT_EQ(msgs[2].text(), "Let me check.");
  ASSERT_EQ(msgs[2].tool_calls.size(), 1u);
  EXPECT_EQ(Json::parse(msgs[2].tool_calls[0].arguments)["city"], "Paris");
  EXPECT_EQ(msgs[3].role, Role::kTool);
  EXPECT_EQ(msgs[3].tool_call_id, "toolu_1");
  EXPECT_EQ(msgs[4].text(), "thanks");
  EXPECT_EQ(r.gen.stop, (std::vector<std::string>{"###"}));
  EXPECT_EQ(r.gen.sampling.top_k, -1);
  EXPECT_EQ(r.conversation.settings.thinking, std::optional<bool>(true));
  EXPECT_EQ(parse_count_tokens(body).conversation.messages.size(), 5u);
}

TEST(MessagesRequestTest, BadInputs) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"model":"m","messages":[{"role":"user","content":"x"}]})", "max_tokens"},
      {R"({"model":"m","max_tokens":10,"messages":[]})", "messages"},
      {R"({"model":"m","max_tokens":-10,"messages":[{"role":"user","content":"x"}]})", "max_tokens"},
      {R"({"model":"m","max_tokens":10,"messages":[{"role":"system","content":"x"}]})", "messages[0].role"},
      {R"({"model":"m","max_tokens":10,"temperature":1.5,"messages":[{"role":"user","content":"x"}]})", "temperature"},
      {R"({"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]})",
       "messages[0].content[0].type"},
      {R"({"model":"m","max_tokens":10,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f"}]})",
       "tools[0].input_schema"},
      {R"({"model":"m","max_tokens":10,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"web_search_20250305","name":"w"}]})",
       "tools[0].type"},
      {R"({"model":"m","max_tokens":10,"thinking":{"type":"enabled","budget_tokens":20},"messages":[{"role":"user","content":"x"}]})",
       "thinking.budget_tokens"},
      {R"({"model":"m","max_tokens":10,"stop_sequences":"###","messages":[{"role":"user","content":"x"}]})",
       "stop_sequences"},
  };
  for (const auto& [body, param] : cases) {
    ApiError e = error_of([&] { parse_messages(Json::parse(body)); });
    EXPECT_EQ(e.http_status, 400) << body;
    EXPECT_EQ(e.param, param) << body << ": " << e.message;
  }
}

}  // namespace
}  // namespace di::protocol
