// OpenAI Responses: POST /v1/responses. Stateless: previous_response_id and item references need a
// response store, which this server does not keep, so they are 400s.
//
// Output items, in the order the model produces them:
//   reasoning {content: [reasoning_text]} → message {content: [output_text]} → function_call ...
// Streaming opens an item when its first delta arrives and closes it (…done events) when another
// kind of output begins or generation ends; output_index counts items, content_index is always 0.
#include <fmt/format.h>

#include "core/error.h"
#include "protocol/api_error.h"
#include "protocol/request.h"
#include "protocol/response.h"

namespace di::protocol {
namespace {

using recipe::Message;
using recipe::Role;

Message* last_assistant(recipe::Conversation& conv) {
  if (conv.messages.empty() || conv.messages.back().role != Role::kAssistant) return nullptr;
  return &conv.messages.back();
}

void parse_input(const Json& body, ParsedRequest& r) {
  auto& conv = r.conversation;
  if (auto instructions = get_string(body, "instructions")) conv.messages.push_back(Message::system(*instructions));
  const Json* input = find_field(body, "input");
  if (!input) throw_invalid("'input' is required", "input");
  if (input->is_string()) {
    conv.messages.push_back(Message::user(input->get<std::string>()));
    return;
  }
  if (!input->is_array()) throw_invalid("'input' must be a string or an array of items", "input");
  if (input->empty()) throw_invalid("'input' must hold at least one item", "input");
  std::optional<std::string> pending_reasoning;  // a reasoning item belongs to the next assistant turn
  auto take_reasoning = [&](Message& m) {
    if (pending_reasoning) m.reasoning_content = std::move(*pending_reasoning);
    pending_reasoning.reset();
  };
  for (size_t i = 0; i < input->size(); ++i) {
    const Json& item = (*input)[i];
    const std::string path = index_path("input", i);
    if (!item.is_object()) throw_invalid(fmt::format("'{}' must be an object", path), path);
    std::string type = get_string(item, "type", path).value_or("message");
    if (type == "message") {
      const std::string role = require_string(item, "role", path);
      const Json* content = find_field(item, "content");
      const std::string cpath = field_path(path, "content");
      if (!content) throw_invalid(fmt::format("'{}' is required", cpath), cpath);
      Message m;
      if (role == "user") m.role = Role::kUser;
      else if (role == "assistant") m.role = Role::kAssistant;
      else if (role == "system") m.role = Role::kSystem;
      else if (role == "developer") m.role = Role::kDeveloper;
      else throw_invalid(fmt::format("'{}.role' must be user, assistant, system or developer", path), field_path(path, "role"));
      std::string text = detail::content_text(*content, cpath, {"input_text", "output_text", "text", "refusal"});
      if (!text.empty()) m.content.push_back({std::move(text)});
      if (m.role == Role::kAssistant) take_reasoning(m);
      conv.messages.push_back(std::move(m));
    } else if (type == "function_call") {
      recipe::ToolCall call;
      call.id = require_string(item, "call_id", path);
      call.name = require_string(item, "name", path);
      call.arguments = get_string(item, "arguments", path).value_or("{}");
      Message* m = last_assistant(conv);
      if (!m) {
        conv.messages.push_back(Message::assistant(""));
        m = &conv.messages.back();
      }
      take_reasoning(*m);
      m->tool_calls.push_back(std::move(call));
    } else if (type == "function_call_output") {
      const std::string call_id = require_string(item, "call_id", path);
      const Json* output = find_field(item, "output");
      const std::string opath = field_path(path, "output");
      if (!output) throw_invalid(fmt::format("'{}' is required", opath), opath);
      conv.messages.push_back(Message::tool(call_id, detail::content_text(*output, opath, {"input_text", "output_text"})));
    } else if (type == "reasoning") {
      std::string text;
      if (const Json* content = get_array(item, "content", path)) {
        text = detail::content_text(*content, field_path(path, "content"), {"reasoning_text"});
      } else if (const Json* summary = get_array(item, "summary", path)) {
        text = detail::content_text(*summary, field_path(path, "summary"), {"summary_text"});
      }
      pending_reasoning = pending_reasoning.value_or("") + text;
    } else if (type == "item_reference") {
      throw_invalid("item references need stored responses, which this server does not keep", field_path(path, "type"));
    } else {
      throw_invalid(fmt::format("'{}.type' '{}' is not supported", path, type), field_path(path, "type"));
    }
  }
  if (conv.messages.empty()) throw_invalid("'input' holds no message", "input");
}

void parse_tools(const Json& body, ParsedRequest& r) {
  const Json* arr = get_array(body, "tools");
  if (!arr) return;
  for (size_t i = 0; i < arr->size(); ++i) {
    const Json& t = (*arr)[i];
    const std::string path = index_path("tools", i);
    if (!t.is_object()) throw_invalid(fmt::format("'{}' must be an object", path), path);
    const std::string type = require_string(t, "type", path);
    if (type != "function") {
      throw_invalid(fmt::format("'{}.type' '{}' is not supported; only 'function' tools are", path, type),
                    field_path(path, "type"));
    }
    recipe::ToolDefinition def;
    def.name = require_string(t, "name", path);
    if (def.name.empty()) throw_invalid(fmt::format("'{}.name' must not be empty", path), field_path(path, "name"));
    def.description = get_string(t, "description", path).value_or("");
    def.parameters = detail::tool_schema(find_field(t, "parameters"), field_path(path, "parameters"));
    r.conversation.tools.push_back(std::move(def));
  }
}

void parse_tool_choice(const Json& body, ParsedRequest& r) {
  const Json* tc = find_field(body, "tool_choice");
  if (!tc) return;
  if (tc->is_string() && *tc == "auto") return;
  if (tc->is_string() && *tc == "none") {
    r.parse_tool_calls = false;
    r.conversation.tools.clear();
    return;
  }
  throw_invalid("only tool_choice 'auto' and 'none' are supported (others need constrained decoding)", "tool_choice");
}

void parse_text_format(const Json& body, ParsedRequest& r) {
  const Json* text = get_object(body, "text");
  if (!text) return;
  const Json* format = get_object(*text, "format", "text");
  if (!format) return;
  const std::string type = require_string(*format, "type", "text.format");
  auto& rf = r.conversation.settings.response_format;
  if (type == "text") return;
  if (type == "json_object") {
    rf.type = recipe::ResponseFormat::Type::kJsonObject;
  } else if (type == "json_schema") {
    rf.type = recipe::ResponseFormat::Type::kJsonSchema;
    rf.schema = detail::tool_schema(find_field(*format, "schema"), "text.format.schema");
  } else {
    throw_invalid(fmt::format("'text.format.type' must be text, json_object or json_schema, got '{}'", type),
                  "text.format.type");
  }
}

Json usage_json(const Usage& u) {
  return Json{{"input_tokens", u.prompt_tokens},
              {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
              {"output_tokens", u.completion_tokens},
              {"output_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}},
              {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

// The response object; `output` and `usage` filled by the caller.
Json response_object(const Json& echo, const ResponseMeta& m, const char* status) {
  Json j = {{"id", m.id}, {"object", "response"}, {"created_at", m.created}, {"status", status},
            {"error", nullptr}, {"incomplete_details", nullptr}, {"model", m.model}, {"output", Json::array()}};
  for (auto it = echo.begin(); it != echo.end(); ++it) j[it.key()] = it.value();
  j["usage"] = nullptr;
  return j;
}

void set_outcome(Json& resp, const Completion& c) {
  if (c.stop == StopCause::kLength) {
    resp["status"] = "incomplete";
    resp["incomplete_details"] = {{"reason", "max_output_tokens"}};
  } else {
    resp["status"] = "completed";
  }
  resp["usage"] = usage_json(c.usage);
}

Json reasoning_item(const std::string& id, const std::string& text) {
  return Json{{"id", id}, {"type", "reasoning"}, {"summary", Json::array()},
              {"content", Json::array({Json{{"type", "reasoning_text"}, {"text", text}}})}};
}
Json output_text_part(const std::string& text) {
  return Json{{"type", "output_text"}, {"text", text}, {"annotations", Json::array()}, {"logprobs", Json::array()}};
}
Json message_item(const std::string& id, const std::string& text, const char* status) {
  return Json{{"id", id}, {"type", "message"}, {"status", status}, {"role", "assistant"},
              {"content", Json::array({output_text_part(text)})}};
}
Json function_call_item(const std::string& id, const recipe::ToolCall& tc, const char* status) {
  return Json{{"id", id}, {"type", "function_call"}, {"status", status}, {"arguments", tc.arguments},
              {"call_id", tc.id}, {"name", tc.name}};
}

class ResponsesEncoder final : public StreamEncoder {
 public:
  ResponsesEncoder(const ParsedRequest& r, const ResponseMeta& m) : echo_(r.echo), meta_(m) {}

  void begin(const Usage&, std::string& out) override {
    Json resp = response_object(echo_, meta_, "in_progress");
    emit(out, "response.created", Json{{"response", resp}});
    emit(out, "response.in_progress", Json{{"response", resp}});
  }

  void event(const recipe::ParserEvent& e, std::string& out) override {
    using T = recipe::ParserEvent::Type;
    switch (e.type) {
      case T::kReasoningDelta:
        if (e.text.empty()) return;
        if (open_ != Open::kReasoning) open(Open::kReasoning, out);
        text_ += e.text;
        emit(out, "response.reasoning_text.delta",
             Json{{"item_id", item_id_}, {"output_index", output_index()}, {"content_index", 0}, {"delta", e.text}});
        break;
      case T::kContentDelta:
        if (e.text.empty()) return;
        if (open_ != Open::kMessage) open(Open::kMessage, out);
        text_ += e.text;
        emit(out, "response.output_text.delta",
             Json{{"item_id", item_id_}, {"output_index", output_index()}, {"content_index", 0}, {"delta", e.text},
                  {"logprobs", Json::array()}});
        break;
      case T::kToolCallStart:
        close(out);
        call_ = {e.tool_call_id, e.tool_name, ""};
        call_index_ = e.tool_index;
        open(Open::kFunctionCall, out);
        break;
      case T::kToolCallArgumentsDelta:
        DI_CHECK(open_ == Open::kFunctionCall && e.tool_index == call_index_, "arguments for a call that is not open");
        if (e.text.empty()) return;
        call_.arguments += e.text;
        emit(out, "response.function_call_arguments.delta",
             Json{{"item_id", item_id_}, {"output_index", output_index()}, {"delta", e.text}});
        break;
      case T::kFinish: break;
    }
  }

  void end(const Completion& c, std::string& out) override {
    close(out);
    Json resp = response_object(echo_, meta_, "completed");
    resp["output"] = items_;
    set_outcome(resp, c);
    emit(out, c.stop == StopCause::kLength ? "response.incomplete" : "response.completed", Json{{"response", resp}});
  }

  void fail(const ApiError& e, std::string& out) override {
    close(out);
    emit(out, "error", Json{{"code", e.code.empty() ? Json(nullptr) : Json(e.code)}, {"message", e.message},
                            {"param", e.param.empty() ? Json(nullptr) : Json(e.param)}});
    Json resp = response_object(echo_, meta_, "failed");
    resp["output"] = items_;
    resp["error"] = {{"code", e.http_status >= 500 ? "server_error" : "invalid_prompt"}, {"message", e.message}};
    emit(out, "response.failed", Json{{"response", resp}});
  }

 private:
  enum class Open { kNone, kReasoning, kMessage, kFunctionCall };

  int output_index() const { return static_cast<int>(items_.size()); }

  void emit(std::string& out, std::string_view type, Json payload) {
    Json j = {{"type", type}, {"sequence_number", seq_++}};
    for (auto it = payload.begin(); it != payload.end(); ++it) j[it.key()] = it.value();
    out += sse_event(type, j);
  }

  void open(Open kind, std::string& out) {
    close(out);
    open_ = kind;
    text_.clear();
    switch (kind) {
      case Open::kReasoning: {
        item_id_ = random_id("rs_");
        Json item = {{"id", item_id_}, {"type", "reasoning"}, {"summary", Json::array()}, {"content", Json::array()}};
        emit(out, "response.output_item.added", Json{{"output_index", output_index()}, {"item", item}});
        emit(out, "response.content_part.added",
             Json{{"item_id", item_id_}, {"output_index", output_index()}, {"content_index", 0},
                  {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
        break;
      }
      case Open::kMessage: {
        item_id_ = random_id("msg_");
        Json item = {{"id", item_id_}, {"type", "message"}, {"status", "in_progress"}, {"role", "assistant"},
                     {"content", Json::array()}};
        emit(out, "response.output_item.added", Json{{"output_index", output_index()}, {"item", item}});
        emit(out, "response.content_part.added",
             Json{{"item_id", item_id_}, {"output_index", output_index()}, {"content_index", 0},
                  {"part", output_text_part("")}});
        break;
      }
      case Open::kFunctionCall:
        item_id_ = random_id("fc_");
        emit(out, "response.output_item.added",
             Json{{"output_index", output_index()}, {"item", function_call_item(item_id_, call_, "in_progress")}});
        break;
      case Open::kNone: break;
    }
  }

  void close(std::string& out) {
    const int idx = output_index();
    switch (open_) {
      case Open::kReasoning: {
        emit(out, "response.reasoning_text.done",
             Json{{"item_id", item_id_}, {"output_index", idx}, {"content_index", 0}, {"text", text_}});
        emit(out, "response.content_part.done",
             Json{{"item_id", item_id_}, {"output_index", idx}, {"content_index", 0},
                  {"part", {{"type", "reasoning_text"}, {"text", text_}}}});
        Json item = reasoning_item(item_id_, text_);
        emit(out, "response.output_item.done", Json{{"output_index", idx}, {"item", item}});
        items_.push_back(std::move(item));
        break;
      }
      case Open::kMessage: {
        emit(out, "response.output_text.done",
             Json{{"item_id", item_id_}, {"output_index", idx}, {"content_index", 0}, {"text", text_},
                  {"logprobs", Json::array()}});
        emit(out, "response.content_part.done",
             Json{{"item_id", item_id_}, {"output_index", idx}, {"content_index", 0}, {"part", output_text_part(text_)}});
        Json item = message_item(item_id_, text_, "completed");
        emit(out, "response.output_item.done", Json{{"output_index", idx}, {"item", item}});
        items_.push_back(std::move(item));
        break;
      }
      case Open::kFunctionCall: {
        emit(out, "response.function_call_arguments.done",
             Json{{"item_id", item_id_}, {"output_index", idx}, {"name", call_.name}, {"arguments", call_.arguments}});
        Json item = function_call_item(item_id_, call_, "completed");
        emit(out, "response.output_item.done", Json{{"output_index", idx}, {"item", item}});
        items_.push_back(std::move(item));
        break;
      }
      case Open::kNone: break;
    }
    open_ = Open::kNone;
  }

  Json echo_;
  ResponseMeta meta_;
  int64_t seq_ = 0;
  Open open_ = Open::kNone;
  std::string item_id_;
  std::string text_;
  recipe::ToolCall call_;
  int call_index_ = -1;
  Json items_ = Json::array();
};

}  // namespace

ParsedRequest parse_responses(const Json& body, const ParseLimits& limits) {
  ParsedRequest r;
  r.api = Api::kResponses;
  r.model = detail::require_model(body);
  r.stream = get_bool(body, "stream").value_or(false);
  if (get_string(body, "previous_response_id")) {
    throw_invalid("'previous_response_id' needs stored responses, which this server does not keep; send the "
                  "whole conversation in 'input'",
                  "previous_response_id");
  }
  parse_input(body, r);
  parse_tools(body, r);
  parse_tool_choice(body, r);
  parse_text_format(body, r);
  Json effort = nullptr;
  if (const Json* reasoning = get_object(body, "reasoning")) {
    if (auto e = get_string(*reasoning, "effort", "reasoning")) {
      r.conversation.settings.effort = detail::parse_effort(*e, "reasoning.effort");
      r.conversation.settings.thinking = r.conversation.settings.effort != recipe::ReasoningEffort::kNone;
      effort = *e;
    }
  }
  if (auto n = get_integer(body, "n"); n && *n != 1) throw_invalid("'n' must be 1", "n");
  r.gen.max_tokens = detail::get_max_tokens(body, "max_output_tokens", limits);
  r.gen.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
  detail::parse_openai_sampling(body, r.gen.sampling);

  // Fields the response object repeats back.
  Json& echo = r.echo;
  echo["instructions"] = find_field(body, "instructions") ? body["instructions"] : Json(nullptr);
  echo["max_output_tokens"] = r.gen.max_tokens ? Json(*r.gen.max_tokens) : Json(nullptr);
  echo["metadata"] = find_field(body, "metadata") ? body["metadata"] : Json::object();
  echo["parallel_tool_calls"] = get_bool(body, "parallel_tool_calls").value_or(true);
  echo["previous_response_id"] = nullptr;
  echo["reasoning"] = {{"effort", effort}, {"summary", nullptr}};
  echo["store"] = false;
  echo["temperature"] = r.gen.sampling.temperature;
  echo["text"] = find_field(body, "text") ? body["text"] : Json{{"format", {{"type", "text"}}}};
  echo["tool_choice"] = find_field(body, "tool_choice") ? body["tool_choice"] : Json("auto");
  echo["tools"] = find_field(body, "tools") ? body["tools"] : Json::array();
  echo["top_p"] = r.gen.sampling.top_p;
  echo["truncation"] = "disabled";
  return r;
}

namespace detail {

std::unique_ptr<StreamEncoder> make_responses_encoder(const ParsedRequest& r, const ResponseMeta& m) {
  return std::make_unique<ResponsesEncoder>(r, m);
}

Json responses_body(const ParsedRequest& r, const ResponseMeta& m, const Completion& c) {
  Json resp = response_object(r.echo, m, "completed");
  Json& output = resp["output"];
  if (!c.reasoning.empty()) output.push_back(reasoning_item(random_id("rs_"), c.reasoning));
  if (!c.content.empty() || c.tool_calls.empty()) output.push_back(message_item(random_id("msg_"), c.content, "completed"));
  for (const auto& tc : c.tool_calls) output.push_back(function_call_item(random_id("fc_"), tc, "completed"));
  set_outcome(resp, c);
  return resp;
}

}  // namespace detail
}  // namespace di::protocol
