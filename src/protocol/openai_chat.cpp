// OpenAI Chat Completions: POST /v1/chat/completions.
#include <fmt/format.h>

#include "core/error.h"
#include "protocol/api_error.h"
#include "protocol/request.h"
#include "protocol/response.h"

namespace di::protocol {
namespace {

using recipe::Message;
using recipe::Role;

Role parse_role(const std::string& s, const std::string& path) {
  if (s == "system") return Role::kSystem;
  if (s == "developer") return Role::kDeveloper;
  if (s == "user") return Role::kUser;
  if (s == "assistant") return Role::kAssistant;
  if (s == "tool") return Role::kTool;
  throw_invalid(
      fmt::format("'{}' must be one of system, developer, user, assistant, tool; got '{}'", path,
                  s),
      path);
}

std::string arguments_text(const Json& args, const std::string& path) {
  if (args.is_string()) return args.get<std::string>();
  if (args.is_object()) return dump_json(args);  // some clients send the object itself
  throw_invalid(fmt::format("'{}' must be a string of JSON", path), path);
}

Message parse_message(const Json& m, const std::string& path) {
  if (!m.is_object()) throw_invalid(fmt::format("'{}' must be an object", path), path);
  Message msg;
  msg.role = parse_role(require_string(m, "role", path), field_path(path, "role"));
  if (auto name = get_string(m, "name", path)) msg.name = *name;
  const Json* content = find_field(m, "content");
  const std::string cpath = field_path(path, "content");
  if (content) {
    // Assistant turns may carry refusal parts; they are text the model said.
    std::string text = msg.role == Role::kAssistant
                           ? detail::content_text(*content, cpath, {"text", "refusal"})
                           : detail::content_text(*content, cpath, {"text"});
    if (!text.empty()) msg.content.push_back({std::move(text)});
  }
  switch (msg.role) {
    case Role::kAssistant: {
      if (auto r = get_string(m, "reasoning_content", path)) msg.reasoning_content = *r;
      if (const Json* calls = get_array(m, "tool_calls", path)) {
        for (size_t i = 0; i < calls->size(); ++i) {
          const Json& c = (*calls)[i];
          const std::string tpath = index_path(field_path(path, "tool_calls"), i);
          if (!c.is_object()) throw_invalid(fmt::format("'{}' must be an object", tpath), tpath);
          if (auto type = get_string(c, "type", tpath); type && *type != "function") {
            throw_invalid(fmt::format("'{}.type' must be 'function'", tpath),
                          field_path(tpath, "type"));
          }
          const Json* fn = get_object(c, "function", tpath);
          const std::string fpath = field_path(tpath, "function");
          if (!fn) throw_invalid(fmt::format("'{}' is required", fpath), fpath);
          recipe::ToolCall call;
          call.id = get_string(c, "id", tpath).value_or("");
          call.name = require_string(*fn, "name", fpath);
          const Json* args = find_field(*fn, "arguments");
          call.arguments = args ? arguments_text(*args, field_path(fpath, "arguments")) : "{}";
          msg.tool_calls.push_back(std::move(call));
        }
      }
      if (!content && msg.tool_calls.empty()) {
        throw_invalid(fmt::format("'{}' needs 'content' or 'tool_calls'", path), cpath);
      }
      break;
    }
    case Role::kTool:
      msg.tool_call_id = require_string(m, "tool_call_id", path);
      if (!content) throw_invalid(fmt::format("'{}' is required", cpath), cpath);
      break;
    default:
      if (!content) throw_invalid(fmt::format("'{}' is required", cpath), cpath);
      break;
  }
  return msg;
}

std::vector<recipe::ToolDefinition> parse_tools(const Json& body) {
  std::vector<recipe::ToolDefinition> tools;
  const Json* arr = get_array(body, "tools");
  if (!arr) return tools;
  for (size_t i = 0; i < arr->size(); ++i) {
    const Json& t = (*arr)[i];
    const std::string path = index_path("tools", i);
    if (!t.is_object()) throw_invalid(fmt::format("'{}' must be an object", path), path);
    const std::string type = get_string(t, "type", path).value_or("function");
    if (type != "function") {
      throw_invalid(
          fmt::format("'{}.type' '{}' is not supported; only 'function' tools are", path, type),
          field_path(path, "type"));
    }
    const Json* fn = get_object(t, "function", path);
    const std::string fpath = field_path(path, "function");
    if (!fn) throw_invalid(fmt::format("'{}' is required", fpath), fpath);
    recipe::ToolDefinition def;
    def.name = require_string(*fn, "name", fpath);
    if (def.name.empty())
      throw_invalid(fmt::format("'{}.name' must not be empty", fpath), field_path(fpath, "name"));
    def.description = get_string(*fn, "description", fpath).value_or("");
    def.parameters =
        detail::tool_schema(find_field(*fn, "parameters"), field_path(fpath, "parameters"));
    tools.push_back(std::move(def));
  }
  return tools;
}

// tool_choice "auto" (default) or "none". "required" and a named function would need constrained
// decoding to be honoured, so they are refused rather than silently ignored.
bool parse_tool_choice(const Json& body) {
  const Json* tc = find_field(body, "tool_choice");
  if (!tc) return true;
  if (tc->is_string()) {
    const auto& s = tc->get_ref<const std::string&>();
    if (s == "auto") return true;
    if (s == "none") return false;
    if (s == "required") {
      throw_invalid(
          "tool_choice 'required' is not supported yet (it needs constrained decoding); use 'auto'",
          "tool_choice");
    }
    throw_invalid(fmt::format("'tool_choice' must be 'auto', 'none' or 'required', got '{}'", s),
                  "tool_choice");
  }
  if (tc->is_object()) {
    throw_invalid(
        "forcing a named tool is not supported yet (it needs constrained decoding); use 'auto'",
        "tool_choice");
  }
  throw_invalid("'tool_choice' must be a string or an object", "tool_choice");
}

void parse_thinking(const Json& body, recipe::ChatSettings& settings) {
  if (const Json* th = find_field(body, "thinking")) {
    if (th->is_boolean()) {
      settings.thinking = th->get<bool>();
    } else if (th->is_object()) {
      const std::string type = require_string(*th, "type", "thinking");
      if (type != "enabled" && type != "disabled") {
        throw_invalid("'thinking.type' must be 'enabled' or 'disabled'", "thinking.type");
      }
      settings.thinking = type == "enabled";
    } else {
      throw_invalid("'thinking' must be a boolean or {\"type\": \"enabled\"|\"disabled\"}",
                    "thinking");
    }
  }
  if (const Json* kw = get_object(body, "chat_template_kwargs")) {
    for (const char* key : {"thinking", "enable_thinking"}) {
      if (auto b = get_bool(*kw, key, "chat_template_kwargs")) settings.thinking = *b;
    }
  }
  if (auto effort = get_string(body, "reasoning_effort")) {
    settings.effort = detail::parse_effort(*effort, "reasoning_effort");
    if (settings.effort == recipe::ReasoningEffort::kNone) settings.thinking = false;
  }
}

recipe::ResponseFormat parse_response_format(const Json* rf, const std::string& path) {
  recipe::ResponseFormat out;
  if (!rf) return out;
  if (!rf->is_object()) throw_invalid(fmt::format("'{}' must be an object", path), path);
  const std::string type = require_string(*rf, "type", path);
  if (type == "text") return out;
  if (type == "json_object") {
    out.type = recipe::ResponseFormat::Type::kJsonObject;
    return out;
  }
  if (type == "json_schema") {
    out.type = recipe::ResponseFormat::Type::kJsonSchema;
    const Json* js = get_object(*rf, "json_schema", path);
    const std::string jpath = field_path(path, "json_schema");
    if (!js) throw_invalid(fmt::format("'{}' is required", jpath), jpath);
    out.schema = detail::tool_schema(find_field(*js, "schema"), field_path(jpath, "schema"));
    return out;
  }
  throw_invalid(
      fmt::format("'{}.type' must be text, json_object or json_schema, got '{}'", path, type),
      field_path(path, "type"));
}

void parse_n_and_logprobs(const Json& body) {
  if (auto n = get_integer(body, "n"); n && *n != 1) {
    throw_invalid(
        fmt::format("'n' must be 1 (several choices per request are not supported yet), got {}",
                    *n),
        "n");
  }
  if (auto lp = get_bool(body, "logprobs"); lp && *lp) {
    throw_invalid("'logprobs' is not supported yet", "logprobs");
  }
}

// ---- streaming ----------------------------------------------------------------------------------

class ChatEncoder final : public StreamEncoder {
 public:
  ChatEncoder(const ParsedRequest& r, const ResponseMeta& m)
      : include_usage_(r.include_usage), meta_(m) {}

  void begin(const Usage&, std::string& out) override {
    out += chunk(Json{{"role", "assistant"}, {"content", ""}}, nullptr);
  }

  void event(const recipe::ParserEvent& e, std::string& out) override {
    using T = recipe::ParserEvent::Type;
    switch (e.type) {
      case T::kContentDelta:
        if (!e.text.empty()) out += chunk(Json{{"content", e.text}}, nullptr);
        break;
      case T::kReasoningDelta:
        if (!e.text.empty()) out += chunk(Json{{"reasoning_content", e.text}}, nullptr);
        break;
      case T::kToolCallStart: {
        DI_CHECK(e.tool_index == num_tool_calls_, "tool call {} out of order", e.tool_index);
        ++num_tool_calls_;
        Json call = {{"index", e.tool_index},
                     {"id", e.tool_call_id},
                     {"type", "function"},
                     {"function", {{"name", e.tool_name}, {"arguments", ""}}}};
        out += chunk(Json{{"tool_calls", Json::array({call})}}, nullptr);
        break;
      }
      case T::kToolCallArgumentsDelta: {
        DI_CHECK(e.tool_index >= 0 && e.tool_index < num_tool_calls_,
                 "arguments for unknown call {}", e.tool_index);
        if (e.text.empty()) break;
        Json call = {{"index", e.tool_index}, {"function", {{"arguments", e.text}}}};
        out += chunk(Json{{"tool_calls", Json::array({call})}}, nullptr);
        break;
      }
      case T::kFinish:
        break;
    }
  }

  void end(const Completion& c, std::string& out) override {
    out += chunk(Json::object(), openai_finish_reason(c.stop));
    detail::append_openai_stream_end(base(), c.usage, include_usage_, out);
  }

  void fail(const ApiError& e, std::string& out) override {
    detail::append_openai_stream_error(e, out);
  }

 private:
  Json base() const {
    return Json{{"id", meta_.id},
                {"object", "chat.completion.chunk"},
                {"created", meta_.created},
                {"model", meta_.model}};
  }
  std::string chunk(Json delta, const char* finish_reason) const {
    Json j = base();
    Json choice = {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}};
    choice["finish_reason"] = finish_reason ? Json(finish_reason) : Json(nullptr);
    j["choices"] = Json::array({std::move(choice)});
    if (include_usage_) j["usage"] = nullptr;  // "all other chunks ... with a null value"
    return sse_data(j);
  }

  bool include_usage_;
  ResponseMeta meta_;
  int num_tool_calls_ = 0;
};

}  // namespace

ParsedRequest parse_chat_completions(const Json& body, const ParseLimits& limits) {
  ParsedRequest r;
  r.api = Api::kChatCompletions;
  r.model = detail::require_model(body);
  r.stream = get_bool(body, "stream").value_or(false);
  if (const Json* so = get_object(body, "stream_options")) {
    r.include_usage = get_bool(*so, "include_usage", "stream_options").value_or(false);
  }
  const Json& messages = require_array(body, "messages");
  if (messages.empty()) throw_invalid("'messages' must hold at least one message", "messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    r.conversation.messages.push_back(parse_message(messages[i], index_path("messages", i)));
  }
  r.conversation.tools = parse_tools(body);
  r.parse_tool_calls = parse_tool_choice(body);
  if (!r.parse_tool_calls) r.conversation.tools.clear();
  parse_thinking(body, r.conversation.settings);
  r.conversation.settings.response_format =
      parse_response_format(find_field(body, "response_format"), "response_format");
  parse_n_and_logprobs(body);
  // max_completion_tokens supersedes the deprecated max_tokens.
  r.gen.max_tokens = detail::get_max_tokens(body, "max_completion_tokens", limits);
  if (!r.gen.max_tokens) r.gen.max_tokens = detail::get_max_tokens(body, "max_tokens", limits);
  r.gen.stop = get_stop_list(body, "stop", limits.max_stop_sequences);
  r.gen.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
  detail::parse_openai_sampling(body, r.gen.sampling);
  return r;
}

namespace detail {

Json openai_usage(const Usage& u) {
  return Json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
              {"completion_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}},
              // DeepSeek's spelling of the same numbers.
              {"prompt_cache_hit_tokens", u.cached_tokens},
              {"prompt_cache_miss_tokens", u.prompt_tokens - u.cached_tokens}};
}

void append_openai_stream_end(Json base, const Usage& u, bool include_usage, std::string& out) {
  if (include_usage) {
    base["choices"] = Json::array();
    base["usage"] = openai_usage(u);
    out += sse_data(base);
  }
  out += "data: [DONE]\n\n";
}

void append_openai_stream_error(const ApiError& e, std::string& out) {
  out += "data: " + openai_error_body(e) + "\n\n";
  out += "data: [DONE]\n\n";
}

std::unique_ptr<StreamEncoder> make_chat_encoder(const ParsedRequest& r, const ResponseMeta& m) {
  return std::make_unique<ChatEncoder>(r, m);
}

Json chat_body(const ParsedRequest&, const ResponseMeta& m, const Completion& c) {
  Json message = {{"role", "assistant"}};
  message["content"] =
      (c.content.empty() && !c.tool_calls.empty()) ? Json(nullptr) : Json(c.content);
  if (!c.reasoning.empty()) message["reasoning_content"] = c.reasoning;
  if (!c.tool_calls.empty()) {
    Json calls = Json::array();
    for (const auto& tc : c.tool_calls) {
      calls.push_back({{"id", tc.id},
                       {"type", "function"},
                       {"function", {{"name", tc.name}, {"arguments", tc.arguments}}}});
    }
    message["tool_calls"] = std::move(calls);
  }
  Json choice = {{"index", 0},
                 {"message", std::move(message)},
                 {"logprobs", nullptr},
                 {"finish_reason", openai_finish_reason(c.stop)}};
  return Json{{"id", m.id},
              {"object", "chat.completion"},
              {"created", m.created},
              {"model", m.model},
              {"choices", Json::array({std::move(choice)})},
              {"usage", openai_usage(c.usage)}};
}

}  // namespace detail
}  // namespace di::protocol
