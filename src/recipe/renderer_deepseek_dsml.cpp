// DeepSeek V3.2 and V4: DSML tool calls (after the official encoders' format, encoding_dsv32 / dsv4).
//
//   <｜begin▁of▁sentence｜>{system}\n\n{tools prompt}\n\n{response format}
//   <｜User｜>{user}<｜Assistant｜>{<think> after the last user turn in thinking mode, else </think>}
//   {reasoning</think> (last turn, thinking mode)}{content}\n\n<｜DSML｜function_calls>\n
//       <｜DSML｜invoke name="{name}">\n
//       <｜DSML｜parameter name="{key}" string="true">{raw string}</｜DSML｜parameter>\n     (string values)
//       <｜DSML｜parameter name="{key}" string="false">{json}</｜DSML｜parameter>            (everything else)
//       </｜DSML｜invoke>\n…</｜DSML｜function_calls><｜end▁of▁sentence｜>
//   V3.2 tool results: \n\n<function_results>\n<result>{r1}</result>\n<result>{r2}</result>\n</function_results>\n\n
//       then <think> (thinking, after the last user turn) or </think>
//   V4 tool results: merged into the next user turn as <tool_result>{r}</tool_result> blocks joined by
//       "\n\n"; V4 names the block <｜DSML｜tool_calls>.
//
// Control ids: BOS, EOS, <｜User｜>, <｜Assistant｜>, <think>, </think>, and ｜DSML｜ inside the tool-call
// markup of assistant turns (the model emits it as one token). The tools prompt is template text, so
// its example markup is plain text. The tools prompt wording is ours (it starts like the official one);
// TODO(#recipe): V4's max-effort prompt prefix and the official tools-prompt text are not rendered.
// Developer messages count as system messages.
#include "core/error.h"
#include "recipe/deepseek_tokens.h"
#include "recipe/renderer_families.h"
#include "recipe/text_util.h"

namespace di::recipe::detail {
namespace {

class DeepSeekDsmlRenderer final : public Renderer {
 public:
  DeepSeekDsmlRenderer(ChatFamily family, std::shared_ptr<const Tokenizer> tok)
      : family_(family), tok_(std::move(tok)), t_(DeepSeekTokens::lookup(*tok_, family)),
        block_(family == ChatFamily::kDeepSeekV4 ? "tool_calls" : "function_calls") {}

  ChatFamily family() const override { return family_; }
  std::vector<TokenId> stop_token_ids() const override { return {t_.eos}; }

  bool starts_in_reasoning(const Conversation& conv) const override {
    if (!conv.thinking_enabled(false) || !conv.settings.add_generation_prompt || conv.messages.empty())
      return false;
    const Role last = conv.messages.back().role;
    return last == Role::kUser || last == Role::kTool;
  }

  std::vector<Segment> render(const Conversation& conv) const override {
    const bool v4 = family_ == ChatFamily::kDeepSeekV4;
    const bool thinking = conv.thinking_enabled(false);
    size_t last_user_idx = conv.messages.size();
    for (size_t i = 0; i < conv.messages.size(); ++i)
      if (conv.messages[i].role == Role::kUser) last_user_idx = i;
    const auto after_last_user = [&](size_t i) { return last_user_idx == conv.messages.size() || i > last_user_idx; };

    SegmentBuilder b;
    b.control(t_.bos);
    b.text(system_text(conv));
    // `think`: this turn is the one being generated (or replayed after the last user message).
    const auto open_turn = [&](bool think) {
      b.control(t_.assistant);
      b.control(thinking && think ? t_.think_begin : t_.think_end);
    };
    for (size_t i = 0; i < conv.messages.size(); ++i) {
      const Message& m = conv.messages[i];
      switch (m.role) {
        case Role::kSystem:
        case Role::kDeveloper: break;
        case Role::kUser:
          b.control(t_.user);
          b.text(m.text());
          open_turn(i == last_user_idx);
          break;
        case Role::kAssistant:
          if (thinking && after_last_user(i)) {
            b.text(m.reasoning_content.value_or(""));
            b.control(t_.think_end);
          }
          b.text(m.text());
          if (!m.tool_calls.empty()) render_tool_calls(b, m.tool_calls);
          b.control(t_.eos);
          break;
        case Role::kTool: {
          // A run of tool messages is rendered as one block.
          size_t end = i;
          while (end < conv.messages.size() && conv.messages[end].role == Role::kTool) ++end;
          if (v4) {
            b.control(t_.user);
            for (size_t k = i; k < end; ++k) {
              if (k > i) b.text("\n\n");
              b.text("<tool_result>" + conv.messages[k].text() + "</tool_result>");
            }
            if (end < conv.messages.size() && conv.messages[end].role == Role::kUser) {
              b.text("\n\n" + conv.messages[end].text());
              ++end;
            }
            open_turn(end - 1 >= last_user_idx || last_user_idx == conv.messages.size());
          } else {
            b.text("\n\n<function_results>");
            for (size_t k = i; k < end; ++k) b.text("\n<result>" + conv.messages[k].text() + "</result>");
            b.text("\n</function_results>\n\n");
            b.control(thinking && after_last_user(i) ? t_.think_begin : t_.think_end);
          }
          i = end - 1;
          break;
        }
      }
    }
    return b.take();
  }

 private:
  std::string system_text(const Conversation& conv) const {
    std::vector<std::string> parts;
    std::string sys = joined_system_prompt(conv, /*include_developer=*/true);
    if (!sys.empty()) parts.push_back(std::move(sys));
    if (!conv.tools.empty()) parts.push_back(tools_prompt(conv));
    const ResponseFormat& rf = conv.settings.response_format;
    if (rf.type == ResponseFormat::Type::kJsonSchema) {
      parts.push_back("## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" +
                      text::python_json_dumps(rf.schema));
    } else if (rf.type == ResponseFormat::Type::kJsonObject) {
      parts.push_back("## Response Format:\n\nReply with one valid JSON object and nothing else.");
    }
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) out += (i ? "\n\n" : "") + parts[i];
    return out;
  }

  std::string tools_prompt(const Conversation& conv) const {
    const std::string d(deepseek::kDsml);
    std::string out = "## Tools\nYou have access to a set of tools you can use to answer the user's question.\n";
    out += "You can invoke functions by writing a \"<" + d + block_ + ">\" block as part of your reply:\n";
    out += "<" + d + block_ + ">\n<" + d + "invoke name=\"$FUNCTION_NAME\">\n<" + d +
           "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + d + "parameter>\n...\n</" +
           d + "invoke>\n</" + d + block_ + ">\n\n";
    out += "Write string values as they are with string=\"true\"; write numbers, booleans, arrays and objects as "
           "JSON with string=\"false\". Several invoke blocks may follow each other in one block.\n\n";
    out += "The functions, as JSON Schema:\n<functions>\n";
    for (const ToolDefinition& t : conv.tools) {
      nlohmann::ordered_json f;
      f["name"] = t.name;
      f["description"] = t.description;
      f["parameters"] = t.parameters;
      out += text::python_json_dumps(f) + "\n";
    }
    out += "</functions>";
    return out;
  }

  void render_tool_calls(SegmentBuilder& b, const std::vector<ToolCall>& calls) const {
    const auto tag = [&](std::string_view open, std::string_view rest) {
      b.text(open);
      b.control(t_.dsml);
      b.text(rest);
    };
    b.text("\n\n");
    tag("<", block_ + ">\n");
    for (size_t c = 0; c < calls.size(); ++c) {
      if (c > 0) b.text("\n");
      tag("<", "invoke name=\"" + calls[c].name + "\">\n");
      nlohmann::ordered_json args;
      try {
        args = calls[c].arguments.empty() ? nlohmann::ordered_json::object()
                                          : nlohmann::ordered_json::parse(calls[c].arguments);
      } catch (const nlohmann::json::exception& e) {
        DI_FAIL("{}: arguments of tool call '{}' are not JSON: {}", chat_family_name(family_), calls[c].name,
                e.what());
      }
      DI_CHECK(args.is_object(), "{}: arguments of tool call '{}' must be a JSON object, got {}",
               chat_family_name(family_), calls[c].name, calls[c].arguments);
      bool first = true;
      for (auto it = args.begin(); it != args.end(); ++it) {
        if (!first) b.text("\n");
        first = false;
        const bool is_string = it.value().is_string();
        tag("<", "parameter name=\"" + it.key() + "\" string=\"" + (is_string ? "true" : "false") + "\">");
        b.text(is_string ? it.value().get<std::string>() : text::python_json_dumps(it.value()));
        tag("</", "parameter>");
      }
      b.text("\n");
      tag("</", "invoke>");
    }
    b.text("\n");
    tag("</", block_ + ">");
  }

  ChatFamily family_;
  std::shared_ptr<const Tokenizer> tok_;
  DeepSeekTokens t_;
  std::string block_;
};

}  // namespace

std::unique_ptr<Renderer> make_deepseek_dsml_renderer(ChatFamily family, std::shared_ptr<const Tokenizer> tokenizer) {
  return std::make_unique<DeepSeekDsmlRenderer>(family, std::move(tokenizer));
}

}  // namespace di::recipe::detail
