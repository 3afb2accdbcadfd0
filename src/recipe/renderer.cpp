#include "recipe/renderer.h"

#include "core/error.h"
#include "recipe/renderer_families.h"

namespace di::recipe {

const char* chat_family_name(ChatFamily family) {
  switch (family) {
    case ChatFamily::kDeepSeekV3: return "deepseek_v3";
    case ChatFamily::kDeepSeekV31: return "deepseek_v3.1";
    case ChatFamily::kDeepSeekV32: return "deepseek_v3.2";
    case ChatFamily::kDeepSeekV4: return "deepseek_v4";
    case ChatFamily::kQwen3: return "qwen3";
    case ChatFamily::kLlama3: return "llama3";
  }
  return "?";
}

ChatFamily parse_chat_family(std::string_view name) {
  for (ChatFamily f : {ChatFamily::kDeepSeekV3, ChatFamily::kDeepSeekV31, ChatFamily::kDeepSeekV32,
                       ChatFamily::kDeepSeekV4, ChatFamily::kQwen3, ChatFamily::kLlama3}) {
    if (name == chat_family_name(f)) return f;
  }
  DI_FAIL("unknown chat family '{}' (deepseek_v3, deepseek_v3.1, deepseek_v3.2, deepseek_v4, qwen3, llama3)",
          name);
}

void SegmentBuilder::text(std::string_view t) {
  if (t.empty()) return;
  if (!segments_.empty() && !segments_.back().is_control) {
    segments_.back().text.append(t);
  } else {
    segments_.push_back(Segment::plain(std::string(t)));
  }
}

EncodedPrompt encode_segments(const Tokenizer& tokenizer, const std::vector<Segment>& segments) {
  // Below this size the thread-pool hand-off costs more than it saves (~1 µs per byte-level BPE word).
  constexpr size_t kParallelBytes = 64 * 1024;
  EncodedPrompt out;
  for (const Segment& s : segments) {
    if (s.is_control) {
      out.ids.push_back(s.id);
      out.is_control.push_back(1);
      continue;
    }
    std::vector<TokenId> ids = s.text.size() >= kParallelBytes ? tokenizer.encode_ordinary_parallel(s.text)
                                                               : tokenizer.encode_ordinary(s.text);
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    out.is_control.insert(out.is_control.end(), ids.size(), 0);
  }
  return out;
}

std::string segments_to_text(const Tokenizer& tokenizer, const std::vector<Segment>& segments) {
  std::string out;
  for (const Segment& s : segments) out += s.is_control ? tokenizer.id_to_token(s.id) : s.text;
  return out;
}

TokenId require_token(const Tokenizer& tokenizer, std::string_view spelling, ChatFamily family) {
  std::optional<TokenId> id = tokenizer.token_to_id(spelling);
  DI_CHECK(id.has_value(),
           "{}: the tokenizer has no control token '{}' (for DeepSeek V3.1+ use the variant tokenizer from "
           "recipe/control_tokens.h, which adds <think>, </think> and ｜DSML｜)",
           chat_family_name(family), spelling);
  return *id;
}

std::unique_ptr<Renderer> make_renderer(ChatFamily family, std::shared_ptr<const Tokenizer> tokenizer) {
  DI_CHECK(tokenizer != nullptr, "make_renderer: null tokenizer");
  switch (family) {
    case ChatFamily::kDeepSeekV3: return detail::make_deepseek_v3_renderer(std::move(tokenizer));
    case ChatFamily::kDeepSeekV31: return detail::make_deepseek_v31_renderer(std::move(tokenizer));
    case ChatFamily::kDeepSeekV32:
    case ChatFamily::kDeepSeekV4: return detail::make_deepseek_dsml_renderer(family, std::move(tokenizer));
    case ChatFamily::kQwen3: return detail::make_qwen3_renderer(std::move(tokenizer));
    case ChatFamily::kLlama3: return detail::make_llama3_renderer(std::move(tokenizer));
  }
  DI_FAIL("unknown chat family {}", static_cast<int>(family));
}

namespace detail {

std::string joined_system_prompt(const Conversation& conv, bool include_developer) {
  std::string out;
  bool first = true;
  for (const Message& m : conv.messages) {
    if (m.role == Role::kSystem || (include_developer && m.role == Role::kDeveloper)) {
      if (!first) out += "\n\n";
      out += m.text();
      first = false;
    }
  }
  return out;
}

}  // namespace detail
}  // namespace di::recipe
