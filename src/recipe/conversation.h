#pragma once
// The conversation model every renderer consumes: plain structs, no JSON wire format (protocol/ maps
// OpenAI Chat / Responses / Anthropic Messages onto these).
//
// Text fields hold user-controlled text verbatim. Renderers treat every byte of it as plain text, so a
// message that spells a control token ("<｜User｜>") never becomes that token (design.md §3).
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace di::recipe {

enum class Role { kSystem, kDeveloper, kUser, kAssistant, kTool };

const char* role_name(Role role);  // "system", "developer", "user", "assistant", "tool"

// kNone means "thinking off"; kMax is DeepSeek's "max" (the largest thinking budget).
enum class ReasoningEffort { kNone, kLow, kMedium, kHigh, kMax };

const char* reasoning_effort_name(ReasoningEffort effort);

struct TextPart {
  std::string text;
};

struct ToolDefinition {
  std::string name;
  std::string description;
  // JSON-schema object; key order is kept because templates print it (json.dumps order).
  nlohmann::ordered_json parameters = nlohmann::ordered_json::object();

  // Parses `parameters_json`; throws di::Error naming the tool when it is not JSON.
  static ToolDefinition from_json_text(std::string name, std::string description,
                                       std::string_view parameters_json);
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text exactly as produced by the model or the client
};

struct Message {
  Role role = Role::kUser;
  std::vector<TextPart> content;       // concatenated without separator by text()
  std::optional<std::string> reasoning_content;  // assistant only
  std::vector<ToolCall> tool_calls;    // assistant only
  std::string tool_call_id;            // tool only: the call this result answers
  std::string name;                    // optional author name (tool name for tool results)

  std::string text() const;
  bool has_text() const;  // at least one non-empty part

  static Message system(std::string text) { return make(Role::kSystem, std::move(text)); }
  static Message developer(std::string text) { return make(Role::kDeveloper, std::move(text)); }
  static Message user(std::string text) { return make(Role::kUser, std::move(text)); }
  static Message assistant(std::string text) { return make(Role::kAssistant, std::move(text)); }
  static Message tool(std::string tool_call_id, std::string text) {
    Message m = make(Role::kTool, std::move(text));
    m.tool_call_id = std::move(tool_call_id);
    return m;
  }

 private:
  static Message make(Role role, std::string text) {
    Message m;
    m.role = role;
    if (!text.empty()) m.content.push_back({std::move(text)});
    return m;
  }
};

struct ResponseFormat {
  enum class Type { kText, kJsonObject, kJsonSchema };
  Type type = Type::kText;
  nlohmann::ordered_json schema;  // kJsonSchema only
};

struct ChatSettings {
  std::optional<bool> thinking;  // nullopt: the family's default (off for DeepSeek, on for Qwen3)
  ReasoningEffort effort = ReasoningEffort::kHigh;
  ResponseFormat response_format;
  bool add_generation_prompt = true;  // end the prompt where the assistant's reply begins
};

struct Conversation {
  std::vector<Message> messages;
  std::vector<ToolDefinition> tools;
  ChatSettings settings;

  // Thinking is on when requested explicitly, or by default where `default_on`, and effort is not kNone.
  bool thinking_enabled(bool default_on) const;
};

// OpenAI-chat-shaped JSON (the shape of tests/fixtures/chat/conversations.json) → Conversation:
//   {"messages": [{"role", "content": str|null|[{"type":"text","text"}], "reasoning_content",
//                  "tool_calls": [{"id", "function": {"name", "arguments": str|object}}], "tool_call_id"}],
//    "tools": [{"type":"function","function":{"name","description","parameters"}}] | null,
//    "thinking": bool|null, "reasoning_effort": "none|low|medium|high|max",
//    "response_format": {"type": "json_schema", "json_schema": {"schema": {...}}},
//    "add_generation_prompt": bool}
// Throws di::Error with the offending field on malformed input.
Conversation conversation_from_json(const nlohmann::ordered_json& j);

}  // namespace di::recipe
