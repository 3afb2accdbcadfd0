// Anthropic Messages: POST /v1/messages and /v1/messages/count_tokens.
//
// Content blocks in the order the model produces them: thinking → text → tool_use ...; streaming
// opens a block at its first delta (content_block_start) and closes it (content_block_stop) when
// another kind begins or generation ends. Usage follows Anthropic's split: input_tokens counts the
// prompt tokens that were *not* read from the cache, cache_read_input_tokens those that were.
#include <fmt/format.h>

#include "core/error.h"
#include "protocol/api_error.h"
#include "protocol/request.h"
#include "protocol/response.h"

namespace di::protocol {
namespace {

using recipe::Message;
using recipe::Role;

std::string system_text(const Json& body) {
  const Json* sys = find_field(body, "system");
  if (!sys) return {};
  return detail::content_text(*sys, "system", {"text"});
}

void parse_user_blocks(const Json& content, const std::string& path, recipe::Conversation& conv) {
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& b = content[i];
    const std::string bpath = index_path(path, i);
    if (!b.is_object()) throw_invalid(fmt::format("'{}' must be an object", bpath), bpath);
    const std::string type = require_string(b, "type", bpath);
    if (type == "text") {
      text += require_string(b, "text", bpath);
    } else if (type == "tool_result") {
      const std::string id = require_string(b, "tool_use_id", bpath);
      const Json* c = find_field(b, "content");
      std::string result = c ? detail::content_text(*c, field_path(bpath, "content"), {"text"}) : "";
      if (get_bool(b, "is_error", bpath).value_or(false)) result = "Error: " + result;
      conv.messages.push_back(Message::tool(id, std::move(result)));
    } else {
      throw_invalid(fmt::format("'{}': content blocks of type '{}' are not supported in user turns", bpath, type),
                    field_path(bpath, "type"));
    }
  }
  if (!text.empty()) conv.messages.push_back(Message::user(std::move(text)));
}

Message parse_assistant_blocks(const Json& content, const std::string& path) {
  Message m;
  m.role = Role::kAssistant;
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& b = content[i];
    const std::string bpath = index_path(path, i);
    if (!b.is_object()) throw_invalid(fmt::format("'{}' must be an object", bpath), bpath);
    const std::string type = require_string(b, "type", bpath);
    if (type == "text") {
      text += require_string(b, "text", bpath);
    } else if (type == "thinking") {
      m.reasoning_content = m.reasoning_content.value_or("") + require_string(b, "thinking", bpath);
    } else if (type == "redacted_thinking") {
      // Opaque to us: nothing to render.
    } else if (type == "tool_use") {
      recipe::ToolCall call;
      call.id = require_string(b, "id", bpath);
      call.name = require_string(b, "name", bpath);
      const Json* input = find_field(b, "input");
      if (input && !input->is_object()) {
        throw_invalid(fmt::format("'{}.input' must be an object", bpath), field_path(bpath, "input"));
      }
      call.arguments = input ? dump_json(*input) : "{}";
      m.tool_calls.push_back(std::move(call));
    } else {
      throw_invalid(fmt::format("'{}': content blocks of type '{}' are not supported in assistant turns", bpath, type),
                    field_path(bpath, "type"));
    }
  }
  if (!text.empty()) m.content.push_back({std::move(text)});
  return m;
}

void parse_messages_array(const Json& body, recipe::Conversation& conv) {
  const Json& messages = require_array(body, "messages");
  if (messages.empty()) throw_invalid("'messages' must hold at least one message", "messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string path = index_path("messages", i);
    if (!m.is_object()) throw_invalid(fmt::format("'{}' must be an object", path), path);
    const std::string role = require_string(m, "role", path);
    const Json* content = find_field(m, "content");
    const std::string cpath = field_path(path, "content");
    if (!content) throw_invalid(fmt::format("'{}' is required", cpath), cpath);
    if (role != "user" && role != "assistant") {
      throw_invalid(fmt::format("'{}.role' must be 'user' or 'assistant', got '{}' (the system prompt goes in "
                                "the top-level 'system' field)",
                                path, role),
                    field_path(path, "role"));
    }
    if (content->is_string()) {
      conv.messages.push_back(role == "user" ? Message::user(content->get<std::string>())
                                             : Message::assistant(content->get<std::string>()));
    } else if (content->is_array()) {
      if (role == "user") {
        parse_user_blocks(*content, cpath, conv);
      } else {
        conv.messages.push_back(parse_assistant_blocks(*content, cpath));
      }
    } else {
      throw_invalid(fmt::format("'{}' must be a string or an array of content blocks", cpath), cpath);
    }
  }
}

void parse_tools(const Json& body, ParsedRequest& r) {
  const Json* arr = get_array(body, "tools");
  if (!arr) return;
  for (size_t i = 0; i < arr->size(); ++i) {
    const Json& t = (*arr)[i];
    const std::string path = index_path("tools", i);
    if (!t.is_object()) throw_invalid(fmt::format("'{}' must be an object", path), path);
    if (auto type = get_string(t, "type", path); type && *type != "custom") {
      throw_invalid(fmt::format("'{}': server tools ('{}') are not supported; define client tools with "
                                "name, description and input_schema",
                                path, *type),
                    field_path(path, "type"));
    }
    recipe::ToolDefinition def;
    def.name = require_string(t, "name", path);
    if (def.name.empty()) throw_invalid(fmt::format("'{}.name' must not be empty", path), field_path(path, "name"));
    def.description = get_string(t, "description", path).value_or("");
    const Json* schema = find_field(t, "input_schema");
    if (!schema) throw_invalid(fmt::format("'{}.input_schema' is required", path), field_path(path, "input_schema"));
    def.parameters = detail::tool_schema(schema, field_path(path, "input_schema"));
    r.conversation.tools.push_back(std::move(def));
  }
  if (const Json* tc = get_object(body, "tool_choice")) {
    const std::string type = require_string(*tc, "type", "tool_choice");
    if (type == "none") {
      r.parse_tool_calls = false;
      r.conversation.tools.clear();
    } else if (type != "auto") {
      throw_invalid(fmt::format("tool_choice '{}' is not supported yet (it needs constrained decoding); use 'auto'", type),
                    "tool_choice.type");
    }
  }
}

void parse_thinking(const Json& body, recipe::ChatSettings& settings, std::optional<int64_t> max_tokens) {
  if (const Json* th = get_object(body, "thinking")) {
    const std::string type = require_string(*th, "type", "thinking");
    if (type == "enabled") {
      settings.thinking = true;
      if (auto budget = get_integer(*th, "budget_tokens", "thinking")) {
        if (*budget < 1) throw_invalid("'thinking.budget_tokens' must be positive", "thinking.budget_tokens");
        if (max_tokens && *budget >= *max_tokens) {
          throw_invalid("'thinking.budget_tokens' must be less than 'max_tokens'", "thinking.budget_tokens");
        }
      }
    } else if (type == "disabled") {
      settings.thinking = false;
    } else if (type == "adaptive") {
      settings.thinking = true;
    } else {
      throw_invalid("'thinking.type' must be 'enabled', 'disabled' or 'adaptive'", "thinking.type");
    }
  }
  if (const Json* oc = get_object(body, "output_config")) {
    if (auto effort = get_string(*oc, "effort", "output_config")) {
      settings.effort = detail::parse_effort(*effort, "output_config.effort");
    }
  }
}

ParsedRequest parse_common(const Json& body) {
  ParsedRequest r;
  r.api = Api::kMessages;
  r.model = detail::require_model(body);
  if (std::string sys = system_text(body); !sys.empty()) r.conversation.messages.push_back(Message::system(std::move(sys)));
  parse_messages_array(body, r.conversation);
  parse_tools(body, r);
  return r;
}

Json usage_json(const Usage& u) {
  return Json{{"input_tokens", u.prompt_tokens - u.cached_tokens},
              {"cache_creation_input_tokens", 0},
              {"cache_read_input_tokens", u.cached_tokens},
              {"output_tokens", u.completion_tokens}};
}

class MessagesEncoder final : public StreamEncoder {
 public:
  explicit MessagesEncoder(const ResponseMeta& m) : meta_(m) {}

  void begin(const Usage& usage, std::string& out) override {
    Json message = {{"id", meta_.id}, {"type", "message"}, {"role", "assistant"}, {"model", meta_.model},
                    {"content", Json::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                    {"usage", usage_json(usage)}};
    emit(out, "message_start", Json{{"message", std::move(message)}});
    emit(out, "ping", Json::object());
  }

  void event(const recipe::ParserEvent& e, std::string& out) override {
    using T = recipe::ParserEvent::Type;
    switch (e.type) {
      case T::kReasoningDelta:
        if (e.text.empty()) return;
        if (open_ != Open::kThinking) start(Open::kThinking, Json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}, out);
        delta(Json{{"type", "thinking_delta"}, {"thinking", e.text}}, out);
        break;
      case T::kContentDelta:
        if (e.text.empty()) return;
        if (open_ != Open::kText) start(Open::kText, Json{{"type", "text"}, {"text", ""}}, out);
        delta(Json{{"type", "text_delta"}, {"text", e.text}}, out);
        break;
      case T::kToolCallStart:
        start(Open::kToolUse,
              Json{{"type", "tool_use"}, {"id", e.tool_call_id}, {"name", e.tool_name}, {"input", Json::object()}}, out);
        tool_index_ = e.tool_index;
        break;
      case T::kToolCallArgumentsDelta:
        DI_CHECK(open_ == Open::kToolUse && e.tool_index == tool_index_, "arguments for a tool_use that is not open");
        if (e.text.empty()) return;
        delta(Json{{"type", "input_json_delta"}, {"partial_json", e.text}}, out);
        break;
      case T::kFinish: break;
    }
  }

  void end(const Completion& c, std::string& out) override {
    stop(out);
    Json d = {{"stop_reason", anthropic_stop_reason(c.stop)},
              {"stop_sequence", c.stop == StopCause::kStopSequence ? Json(c.stop_sequence) : Json(nullptr)}};
    emit(out, "message_delta", Json{{"delta", std::move(d)}, {"usage", usage_json(c.usage)}});
    emit(out, "message_stop", Json::object());
  }

  void fail(const ApiError& e, std::string& out) override {
    out += sse_event("error", Json::parse(anthropic_error_body(e)));
  }

 private:
  enum class Open { kNone, kThinking, kText, kToolUse };

  void emit(std::string& out, std::string_view type, Json payload) {
    Json j = {{"type", type}};
    for (auto it = payload.begin(); it != payload.end(); ++it) j[it.key()] = it.value();
    out += sse_event(type, j);
  }
  void start(Open kind, Json block, std::string& out) {
    stop(out);
    open_ = kind;
    emit(out, "content_block_start", Json{{"index", index_}, {"content_block", std::move(block)}});
  }
  void delta(Json d, std::string& out) {
    emit(out, "content_block_delta", Json{{"index", index_}, {"delta", std::move(d)}});
  }
  void stop(std::string& out) {
    if (open_ == Open::kNone) return;
    emit(out, "content_block_stop", Json{{"index", index_}});
    ++index_;
    open_ = Open::kNone;
  }

  ResponseMeta meta_;
  Open open_ = Open::kNone;
  int index_ = 0;
  int tool_index_ = -1;
};

}  // namespace

ParsedRequest parse_messages(const Json& body, const ParseLimits& limits) {
  // max_tokens is required by the Messages API.
  auto max_tokens = detail::get_max_tokens(body, "max_tokens", limits);
  if (!max_tokens) throw_invalid("'max_tokens' is required", "max_tokens");
  ParsedRequest r = parse_common(body);
  r.gen.max_tokens = max_tokens;
  r.stream = get_bool(body, "stream").value_or(false);
  parse_thinking(body, r.conversation.settings, max_tokens);
  if (const Json* seqs = get_array(body, "stop_sequences")) {
    if (seqs->size() > limits.max_stop_sequences) {
      throw_invalid(fmt::format("'stop_sequences' may hold at most {} sequences", limits.max_stop_sequences),
                    "stop_sequences");
    }
    r.gen.stop = get_stop_list(body, "stop_sequences", limits.max_stop_sequences);
  }
  auto& s = r.gen.sampling;
  if (auto t = get_number_in(body, "temperature", 0.0, 1.0)) s.temperature = static_cast<float>(*t);
  if (auto p = get_number_in(body, "top_p", 0.0, 1.0)) {
    if (*p == 0.0) throw_invalid("'top_p' must be greater than 0", "top_p");
    s.top_p = static_cast<float>(*p);
  }
  if (auto k = get_integer(body, "top_k")) {
    if (*k < 0 || *k > (int64_t{1} << 30)) throw_invalid("'top_k' must be a non-negative integer", "top_k");
    s.top_k = *k == 0 ? -1 : static_cast<int32_t>(*k);
  }
  r.gen.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
  detail::validate_sampling(s);
  return r;
}

ParsedRequest parse_count_tokens(const Json& body) {
  ParsedRequest r = parse_common(body);
  parse_thinking(body, r.conversation.settings, std::nullopt);
  return r;
}

namespace detail {

std::unique_ptr<StreamEncoder> make_messages_encoder(const ParsedRequest&, const ResponseMeta& m) {
  return std::make_unique<MessagesEncoder>(m);
}

Json messages_body(const ParsedRequest&, const ResponseMeta& m, const Completion& c) {
  Json content = Json::array();
  if (!c.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", c.reasoning}, {"signature", ""}});
  if (!c.content.empty()) content.push_back({{"type", "text"}, {"text", c.content}});
  for (const auto& tc : c.tool_calls) {
    // The model's arguments should be a JSON object; anything else is passed on as {} rather than
    // breaking the response (the streamed form carries the raw text in input_json_delta).
    Json input = Json::parse(tc.arguments, nullptr, /*allow_exceptions=*/false);
    if (!input.is_object()) input = Json::object();
    content.push_back({{"type", "tool_use"}, {"id", tc.id}, {"name", tc.name}, {"input", std::move(input)}});
  }
  return Json{{"id", m.id},
              {"type", "message"},
              {"role", "assistant"},
              {"model", m.model},
              {"content", std::move(content)},
              {"stop_reason", anthropic_stop_reason(c.stop)},
              {"stop_sequence", c.stop == StopCause::kStopSequence ? Json(c.stop_sequence) : Json(nullptr)},
              {"usage", usage_json(c.usage)}};
}

}  // namespace detail
}  // namespace di::protocol
