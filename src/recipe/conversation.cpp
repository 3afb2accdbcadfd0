#include "recipe/conversation.h"

#include "core/error.h"

namespace di::recipe {

const char* role_name(Role role) {
  switch (role) {
    case Role::kSystem: return "system";
    case Role::kDeveloper: return "developer";
    case Role::kUser: return "user";
    case Role::kAssistant: return "assistant";
    case Role::kTool: return "tool";
  }
  return "?";
}

const char* reasoning_effort_name(ReasoningEffort effort) {
  switch (effort) {
    case ReasoningEffort::kNone: return "none";
    case ReasoningEffort::kLow: return "low";
    case ReasoningEffort::kMedium: return "medium";
    case ReasoningEffort::kHigh: return "high";
    case ReasoningEffort::kMax: return "max";
  }
  return "?";
}

ToolDefinition ToolDefinition::from_json_text(std::string name, std::string description,
                                              std::string_view parameters_json) {
  ToolDefinition t;
  t.name = std::move(name);
  t.description = std::move(description);
  if (!parameters_json.empty()) {
    try {
      t.parameters = nlohmann::ordered_json::parse(parameters_json);
    } catch (const nlohmann::json::exception& e) {
      DI_FAIL("tool '{}': parameters are not valid JSON: {}", t.name, e.what());
    }
  }
  return t;
}

std::string Message::text() const {
  std::string out;
  for (const TextPart& p : content) out += p.text;
  return out;
}

bool Message::has_text() const {
  for (const TextPart& p : content)
    if (!p.text.empty()) return true;
  return false;
}

bool Conversation::thinking_enabled(bool default_on) const {
  if (settings.effort == ReasoningEffort::kNone) return false;
  return settings.thinking.value_or(default_on);
}

namespace {

using ojson = nlohmann::ordered_json;

Role parse_role(const std::string& s) {
  if (s == "system") return Role::kSystem;
  if (s == "developer") return Role::kDeveloper;
  if (s == "user") return Role::kUser;
  if (s == "assistant") return Role::kAssistant;
  if (s == "tool") return Role::kTool;
  DI_FAIL("unknown message role '{}'", s);
}

ReasoningEffort parse_effort(const std::string& s) {
  if (s == "none") return ReasoningEffort::kNone;
  if (s == "low" || s == "minimal") return ReasoningEffort::kLow;
  if (s == "medium") return ReasoningEffort::kMedium;
  if (s == "high" || s == "xhigh") return ReasoningEffort::kHigh;
  if (s == "max" || s == "ultra") return ReasoningEffort::kMax;
  DI_FAIL("unknown reasoning_effort '{}'", s);
}

std::vector<TextPart> parse_content(const ojson& c, size_t msg_idx) {
  std::vector<TextPart> parts;
  if (c.is_null()) return parts;
  if (c.is_string()) {
    parts.push_back({c.get<std::string>()});
    return parts;
  }
  DI_CHECK(c.is_array(), "messages[{}].content must be a string, null or an array of parts", msg_idx);
  for (const ojson& p : c) {
    DI_CHECK(p.is_object() && p.value("type", "") == "text" && p.contains("text") && p["text"].is_string(),
             "messages[{}].content: only text parts are supported, got {}", msg_idx, p.dump());
    parts.push_back({p["text"].get<std::string>()});
  }
  return parts;
}

}  // namespace

Conversation conversation_from_json(const ojson& j) {
  DI_CHECK(j.is_object() && j.contains("messages") && j["messages"].is_array(),
           "a conversation needs a 'messages' array");
  Conversation conv;
  size_t idx = 0;
  for (const ojson& m : j["messages"]) {
    DI_CHECK(m.is_object() && m.contains("role") && m["role"].is_string(), "messages[{}] needs a 'role'", idx);
    Message msg;
    msg.role = parse_role(m["role"].get<std::string>());
    if (m.contains("content")) msg.content = parse_content(m["content"], idx);
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
      msg.reasoning_content = m["reasoning_content"].get<std::string>();
    if (m.contains("tool_call_id") && m["tool_call_id"].is_string())
      msg.tool_call_id = m["tool_call_id"].get<std::string>();
    if (m.contains("name") && m["name"].is_string()) msg.name = m["name"].get<std::string>();
    if (m.contains("tool_calls") && m["tool_calls"].is_array()) {
      for (const ojson& c : m["tool_calls"]) {
        const ojson& f = c.contains("function") ? c["function"] : c;
        DI_CHECK(f.contains("name") && f["name"].is_string(), "messages[{}].tool_calls: a call needs a name", idx);
        ToolCall call;
        call.id = c.value("id", "");
        call.name = f["name"].get<std::string>();
        if (f.contains("arguments")) {
          const ojson& a = f["arguments"];
          call.arguments = a.is_string() ? a.get<std::string>() : a.dump();
        }
        msg.tool_calls.push_back(std::move(call));
      }
    }
    conv.messages.push_back(std::move(msg));
    ++idx;
  }
  if (j.contains("tools") && j["tools"].is_array()) {
    for (const ojson& t : j["tools"]) {
      const ojson& f = t.contains("function") ? t["function"] : t;
      DI_CHECK(f.contains("name") && f["name"].is_string(), "tools: a tool needs a name, got {}", t.dump());
      ToolDefinition def;
      def.name = f["name"].get<std::string>();
      def.description = f.value("description", "");
      if (f.contains("parameters")) {
        const ojson& p = f["parameters"];
        def.parameters = p.is_string() ? ojson::parse(p.get<std::string>()) : p;
      }
      conv.tools.push_back(std::move(def));
    }
  }
  if (j.contains("thinking") && j["thinking"].is_boolean()) conv.settings.thinking = j["thinking"].get<bool>();
  if (j.contains("reasoning_effort") && j["reasoning_effort"].is_string())
    conv.settings.effort = parse_effort(j["reasoning_effort"].get<std::string>());
  if (j.contains("add_generation_prompt") && j["add_generation_prompt"].is_boolean())
    conv.settings.add_generation_prompt = j["add_generation_prompt"].get<bool>();
  if (j.contains("response_format") && j["response_format"].is_object()) {
    const ojson& rf = j["response_format"];
    const std::string type = rf.value("type", "text");
    if (type == "json_object") {
      conv.settings.response_format.type = ResponseFormat::Type::kJsonObject;
    } else if (type == "json_schema") {
      conv.settings.response_format.type = ResponseFormat::Type::kJsonSchema;
      const ojson& js = rf.contains("json_schema") ? rf["json_schema"] : rf;
      conv.settings.response_format.schema = js.contains("schema") ? js["schema"] : js;
    } else {
      DI_CHECK(type == "text", "unknown response_format type '{}'", type);
    }
  }
  return conv;
}

}  // namespace di::recipe
