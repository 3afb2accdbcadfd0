// DeepSeek V3.1 (hybrid thinking), after the model card and the official template's rules:
//
//   <｜begin▁of▁sentence｜>{system prompts joined by "\n\n"}{tool description}
//   <｜User｜>{user}<｜Assistant｜></think>{content}<｜end▁of▁sentence｜>            history turn (both modes)
//   <｜User｜>{user}<｜Assistant｜></think>{content}<｜tool▁calls▁begin｜>
//       <｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>…<｜tool▁calls▁end｜><｜end▁of▁sentence｜>
//   <｜tool▁output▁begin｜>{result}<｜tool▁output▁end｜>                       per tool message, no wrapper
//   {answer after tool results}<｜end▁of▁sentence｜>                            no <｜Assistant｜> prefix
//   generation prompt after a user turn: <｜Assistant｜><think> (thinking) or <｜Assistant｜></think>
//
// Reasoning of earlier turns is dropped; "</think>" stays in every turn. Content of a history turn is
// rendered as given (the official template cuts it at the first literal "</think>", which corrupts
// content that mentions the tag; our Message keeps reasoning in its own field instead).
// The tool description follows the model card ("## Tools" … "### {name}" / Description / Parameters).
#include "core/error.h"
#include "recipe/deepseek_tokens.h"
#include "recipe/renderer_families.h"
#include "recipe/text_util.h"

namespace di::recipe::detail {
namespace {

class DeepSeekV31Renderer final : public Renderer {
 public:
  explicit DeepSeekV31Renderer(std::shared_ptr<const Tokenizer> tok)
      : tok_(std::move(tok)), t_(DeepSeekTokens::lookup(*tok_, ChatFamily::kDeepSeekV31)) {}

  ChatFamily family() const override { return ChatFamily::kDeepSeekV31; }
  std::vector<TokenId> stop_token_ids() const override { return {t_.eos}; }

  bool starts_in_reasoning(const Conversation& conv) const override {
    return conv.thinking_enabled(false) && conv.settings.add_generation_prompt && !conv.messages.empty() &&
           conv.messages.back().role == Role::kUser;
  }

  std::vector<Segment> render(const Conversation& conv) const override {
    SegmentBuilder b;
    b.control(t_.bos);
    const std::string system = joined_system_prompt(conv, /*include_developer=*/true);
    b.text(system);
    if (!conv.tools.empty()) b.text((system.empty() ? "" : "\n\n") + tool_description(conv));
    Role prev = Role::kSystem;
    for (const Message& m : conv.messages) {
      switch (m.role) {
        case Role::kSystem:
        case Role::kDeveloper: continue;
        case Role::kUser:
          b.control(t_.user);
          b.text(m.text());
          break;
        case Role::kAssistant:
          if (prev != Role::kTool) {
            b.control(t_.assistant);
            b.control(t_.think_end);
          }
          b.text(m.text());
          if (!m.tool_calls.empty()) {
            b.control(t_.calls_begin);
            for (const ToolCall& c : m.tool_calls) {
              b.control(t_.call_begin);
              b.text(c.name);
              b.control(t_.sep);
              b.text(c.arguments);
              b.control(t_.call_end);
            }
            b.control(t_.calls_end);
          }
          b.control(t_.eos);
          break;
        case Role::kTool:
          b.control(t_.output_begin);
          b.text(m.text());
          b.control(t_.output_end);
          break;
      }
      prev = m.role;
    }
    if (conv.settings.add_generation_prompt && prev == Role::kUser) {
      b.control(t_.assistant);
      b.control(conv.thinking_enabled(false) ? t_.think_begin : t_.think_end);
    }
    return b.take();
  }

 private:
  static std::string tool_description(const Conversation& conv) {
    std::string out = "## Tools\nYou have access to the following tools:\n";
    for (const ToolDefinition& t : conv.tools) {
      out += "\n### " + t.name + "\nDescription: " + t.description + "\n\nParameters: " +
             text::python_json_dumps(t.parameters) + "\n";
    }
    out += "\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n";
    out += std::string(deepseek::kCallsBegin) + std::string(deepseek::kCallBegin) + "tool_call_name" +
           std::string(deepseek::kToolSep) + "tool_call_arguments" + std::string(deepseek::kCallEnd) +
           "{{additional_tool_calls}}" + std::string(deepseek::kCallsEnd) + "\n\n";
    out += "Where:\n- `tool_call_name` must be an exact match to one of the available tools\n"
           "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
           "- For multiple tool calls, chain them directly without separators or spaces\n";
    return out;
  }

  std::shared_ptr<const Tokenizer> tok_;
  DeepSeekTokens t_;
};

}  // namespace

std::unique_ptr<Renderer> make_deepseek_v31_renderer(std::shared_ptr<const Tokenizer> tokenizer) {
  return std::make_unique<DeepSeekV31Renderer>(std::move(tokenizer));
}

}  // namespace di::recipe::detail
