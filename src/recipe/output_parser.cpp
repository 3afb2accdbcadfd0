#include "recipe/output_parser.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "recipe/parser_base.h"
#include "recipe/text_util.h"

namespace di::recipe {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kToolCalls: return "tool_calls";
  }
  return "?";
}

const char* event_type_name(ParserEvent::Type type) {
  switch (type) {
    case ParserEvent::Type::kReasoningDelta: return "reasoning";
    case ParserEvent::Type::kContentDelta: return "content";
    case ParserEvent::Type::kToolCallStart: return "tool_call_start";
    case ParserEvent::Type::kToolCallArgumentsDelta: return "tool_call_arguments";
    case ParserEvent::Type::kFinish: return "finish";
  }
  return "?";
}

std::string to_string(const ParserEvent& e) {
  switch (e.type) {
    case ParserEvent::Type::kToolCallStart:
      return fmt::format("tool_call_start[{}] id={} name={}", e.tool_index, e.tool_call_id, e.tool_name);
    case ParserEvent::Type::kToolCallArgumentsDelta:
      return fmt::format("tool_call_arguments[{}] {:?}", e.tool_index, e.text);
    case ParserEvent::Type::kFinish: return fmt::format("finish {}", finish_reason_name(e.finish_reason));
    default: return fmt::format("{} {:?}", event_type_name(e.type), e.text);
  }
}

std::vector<ParserEvent> coalesce_events(const std::vector<ParserEvent>& events) {
  std::vector<ParserEvent> out;
  for (const ParserEvent& e : events) {
    const bool delta = e.type == ParserEvent::Type::kReasoningDelta || e.type == ParserEvent::Type::kContentDelta ||
                       e.type == ParserEvent::Type::kToolCallArgumentsDelta;
    if (delta && e.text.empty()) continue;
    if (delta && !out.empty() && out.back().type == e.type && out.back().tool_index == e.tool_index) {
      out.back().text += e.text;
      continue;
    }
    out.push_back(e);
  }
  return out;
}

ToolCallIdGenerator sequential_tool_call_ids(std::string prefix) {
  return [prefix = std::move(prefix)](int idx) { return prefix + std::to_string(idx); };
}

ToolCallIdGenerator seeded_tool_call_ids(uint64_t seed) {
  return [seed](int idx) {
    // SplitMix64 at position idx of the stream: a pure function of (seed, idx).
    uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (static_cast<uint64_t>(idx) + 1);
    std::string out = "call_";
    for (int word = 0; word < 2; ++word) {
      z += 0x9e3779b97f4a7c15ULL;
      uint64_t x = z;
      x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
      x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
      x ^= x >> 31;
      out += fmt::format("{:012x}", x & 0xffffffffffffULL);
    }
    return out;
  };
}

ParserOptions parser_options_for(const Renderer& renderer, const Conversation& conv) {
  ParserOptions o;
  o.starts_in_reasoning = renderer.starts_in_reasoning(conv);
  o.parse_tool_calls = true;
  return o;
}

std::unique_ptr<OutputParser> make_output_parser(ChatFamily family, std::shared_ptr<const Tokenizer> tokenizer,
                                                 ParserOptions options) {
  DI_CHECK(tokenizer != nullptr, "make_output_parser: null tokenizer");
  if (!options.tool_call_ids) options.tool_call_ids = sequential_tool_call_ids();
  switch (family) {
    case ChatFamily::kDeepSeekV3:
    case ChatFamily::kDeepSeekV31: return detail::make_deepseek_parser(family, std::move(tokenizer), std::move(options));
    case ChatFamily::kDeepSeekV32:
    case ChatFamily::kDeepSeekV4: return detail::make_dsml_parser(family, std::move(tokenizer), std::move(options));
    case ChatFamily::kQwen3: return detail::make_qwen3_parser(std::move(tokenizer), std::move(options));
    case ChatFamily::kLlama3: return detail::make_llama3_parser(std::move(tokenizer), std::move(options));
  }
  DI_FAIL("unknown chat family {}", static_cast<int>(family));
}

namespace detail {

size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  const size_t max_len = std::min(text.size(), marker.size() - 1);
  for (size_t len = max_len; len > 0; --len) {
    if (text.substr(text.size() - len) == marker.substr(0, len)) return len;
  }
  return 0;
}

ParserBase::ParserBase(std::shared_ptr<const Tokenizer> tokenizer, ParserOptions options,
                       std::vector<TokenId> stop_ids)
    : tokenizer_(std::move(tokenizer)), options_(std::move(options)), stop_ids_(std::move(stop_ids)) {
  in_reasoning_ = options_.starts_in_reasoning;
  strip_reasoning_newlines_ = in_reasoning_;
}

void ParserBase::feed(std::span<const TokenId> ids, std::vector<ParserEvent>& out) {
  DI_CHECK(!finished_, "OutputParser::feed after finish");
  out_ = &out;
  for (TokenId id : ids) {
    if (stopped_) break;
    if (std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end()) {
      stopped_ = true;
      break;
    }
    if (is_marker(id)) {
      flush_text(/*final=*/true);
      if (on_control(id)) continue;
    }
    if (tokenizer_->is_special(id)) continue;  // special tokens outside the family's markers carry no text
    pending_bytes_ += tokenizer_->decode({id}, /*skip_special=*/false);
    flush_text(/*final=*/false);
  }
  out_ = nullptr;
}

void ParserBase::finish(FinishReason engine_reason, std::vector<ParserEvent>& out) {
  DI_CHECK(!finished_, "OutputParser::finish called twice");
  out_ = &out;
  flush_text(/*final=*/true);
  on_end();
  ParserEvent e;
  e.type = ParserEvent::Type::kFinish;
  e.finish_reason = engine_reason == FinishReason::kLength ? FinishReason::kLength
                    : num_tool_calls_ > 0                 ? FinishReason::kToolCalls
                                                          : FinishReason::kStop;
  out.push_back(std::move(e));
  finished_ = true;
  out_ = nullptr;
}

void ParserBase::flush_text(bool final) {
  if (pending_bytes_.empty()) return;
  const size_t n = final ? pending_bytes_.size() : text::complete_utf8_prefix(pending_bytes_);
  if (n == 0) return;
  const std::string text = text::sanitize_utf8(std::string_view(pending_bytes_).substr(0, n));
  pending_bytes_.erase(0, n);
  on_text(text);
}

void ParserBase::push(ParserEvent e) {
  DI_CHECK(out_ != nullptr, "parser event outside feed/finish");
  out_->push_back(std::move(e));
}

void ParserBase::emit_reasoning(std::string_view text) {
  if (strip_reasoning_newlines_) {
    text = text::lstrip(text, "\n");
    if (text.empty()) return;
    strip_reasoning_newlines_ = false;
  }
  if (text.empty()) return;
  ParserEvent e;
  e.type = ParserEvent::Type::kReasoningDelta;
  e.text = std::string(text);
  push(std::move(e));
}

void ParserBase::emit_content(std::string_view text) {
  if (strip_content_newlines_) {
    text = text::lstrip(text, "\n");
    if (text.empty()) return;
    strip_content_newlines_ = false;
  }
  if (text.empty()) return;
  content_emitted_ = true;
  ParserEvent e;
  e.type = ParserEvent::Type::kContentDelta;
  e.text = std::string(text);
  push(std::move(e));
}

int ParserBase::start_tool_call(std::string name) {
  const int idx = num_tool_calls_++;
  ParserEvent e;
  e.type = ParserEvent::Type::kToolCallStart;
  e.tool_index = idx;
  e.tool_call_id = options_.tool_call_ids(idx);
  e.tool_name = std::move(name);
  push(std::move(e));
  return idx;
}

void ParserBase::emit_arguments(std::string_view json_fragment) {
  if (json_fragment.empty()) return;
  DI_CHECK(num_tool_calls_ > 0, "arguments before a tool call started");
  ParserEvent e;
  e.type = ParserEvent::Type::kToolCallArgumentsDelta;
  e.tool_index = num_tool_calls_ - 1;
  e.text = std::string(json_fragment);
  push(std::move(e));
}

}  // namespace detail
}  // namespace di::recipe
