// Qwen3 output: <think>, </think>, <tool_call>, </tool_call> and <|im_end|> are single tokens.
//
//   <think>\nreasoning\n</think>\n\ncontent<tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>
//
// Inside <tool_call>, the JSON prefix `{"name": "…", "arguments": ` is recognised as it streams, then
// the arguments value is passed on byte for byte until its closing bracket (a small JSON scanner tracks
// depth and strings). A call that does not start with that prefix is parsed whole at </tool_call>.
#include "core/error.h"
#include "recipe/parser_base.h"
#include "recipe/text_util.h"

namespace di::recipe::detail {
namespace {

using namespace std::string_view_literals;

// Result of matching `{"name": "<json string>", "arguments": ` at the start of a call body.
struct PrefixMatch {
  enum Kind { kNeedMore, kMatched, kMismatch } kind = kNeedMore;
  std::string name;
  size_t end = 0;  // bytes consumed when kMatched
};

PrefixMatch match_call_prefix(std::string_view s) {
  size_t i = 0;
  const auto ws = [&] {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) ++i;
  };
  // Expects literal `lit` at i; kNeedMore when s ends inside it.
  const auto lit = [&](std::string_view l) -> PrefixMatch::Kind {
    const std::string_view rest = s.substr(i);
    if (rest.size() < l.size()) return l.starts_with(rest) ? PrefixMatch::kNeedMore : PrefixMatch::kMismatch;
    if (!rest.starts_with(l)) return PrefixMatch::kMismatch;
    i += l.size();
    return PrefixMatch::kMatched;
  };
  PrefixMatch r;
  for (std::string_view l : {"{"sv, "\"name\""sv, ":"sv, "\""sv}) {
    ws();
    if (auto k = lit(l); k != PrefixMatch::kMatched) return {k, {}, 0};
  }
  const size_t name_begin = i - 1;  // the opening quote
  bool escape = false;
  for (; i < s.size(); ++i) {
    if (escape) {
      escape = false;
    } else if (s[i] == '\\') {
      escape = true;
    } else if (s[i] == '"') {
      break;
    }
  }
  if (i >= s.size()) return {};
  try {
    r.name = nlohmann::json::parse(s.substr(name_begin, i + 1 - name_begin)).get<std::string>();
  } catch (const nlohmann::json::exception&) {
    return {PrefixMatch::kMismatch, {}, 0};
  }
  ++i;
  for (std::string_view l : {","sv, "\"arguments\""sv, ":"sv}) {
    ws();
    if (auto k = lit(l); k != PrefixMatch::kMatched) return {k, {}, 0};
  }
  ws();
  if (i >= s.size()) return {};
  r.kind = PrefixMatch::kMatched;
  r.end = i;
  return r;
}

class Qwen3Parser final : public ParserBase {
 public:
  Qwen3Parser(std::shared_ptr<const Tokenizer> tok, ParserOptions options, TokenId im_end, TokenId eot,
              TokenId think_begin, TokenId think_end, TokenId call_begin, TokenId call_end)
      : ParserBase(std::move(tok), std::move(options), {im_end, eot}),
        think_begin_(think_begin), think_end_(think_end), call_begin_(call_begin), call_end_(call_end) {}

 protected:
  bool is_marker(TokenId id) const override {
    return id == think_begin_ || id == think_end_ || id == call_begin_ || id == call_end_;
  }

  bool on_control(TokenId id) override {
    if (id == think_begin_) {
      if (phase_ == Phase::kNone && !in_reasoning_ && !content_emitted_) {
        in_reasoning_ = true;
        strip_reasoning_newlines_ = true;
      }
      return true;
    }
    if (id == think_end_) {
      if (in_reasoning_) {
        in_reasoning_ = false;
        strip_content_newlines_ = true;
      }
      return true;
    }
    if (!options().parse_tool_calls) return false;
    if (id == call_begin_) {
      if (phase_ == Phase::kNone) {
        in_reasoning_ = false;
        phase_ = Phase::kPrefix;
        buf_.clear();
      }
      return true;
    }
    if (id == call_end_) {
      end_call();
      return true;
    }
    return false;
  }

  void on_text(std::string_view text) override {
    switch (phase_) {
      case Phase::kNone:
        if (in_reasoning_) {
          emit_reasoning(text);
        } else {
          emit_content(text);
        }
        return;
      case Phase::kPrefix: {
        buf_ += text;
        PrefixMatch m = match_call_prefix(buf_);
        if (m.kind == PrefixMatch::kNeedMore) return;
        if (m.kind == PrefixMatch::kMismatch) {
          phase_ = Phase::kWhole;
          return;
        }
        start_tool_call(std::move(m.name));
        std::string rest = buf_.substr(m.end);
        buf_.clear();
        phase_ = Phase::kArgs;
        depth_ = 0;
        in_string_ = escape_ = false;
        on_text(rest);
        return;
      }
      case Phase::kWhole: buf_ += text; return;
      case Phase::kArgs: scan_arguments(text); return;
      case Phase::kTail: return;  // the closing "}\n" of the call object
    }
  }

  void on_end() override {
    if (phase_ == Phase::kPrefix || phase_ == Phase::kWhole) {
      emit_content(buf_);  // a call that never got a name: keep the text
      buf_.clear();
    }
  }

 private:
  enum class Phase { kNone, kPrefix, kWhole, kArgs, kTail };

  // Emits the arguments value up to (and including) its final closing bracket.
  void scan_arguments(std::string_view text) {
    size_t i = 0;
    bool done = false;
    for (; i < text.size() && !done; ++i) {
      const char c = text[i];
      if (in_string_) {
        if (escape_) {
          escape_ = false;
        } else if (c == '\\') {
          escape_ = true;
        } else if (c == '"') {
          in_string_ = false;
        }
        continue;
      }
      if (c == '"') {
        in_string_ = true;
      } else if (c == '{' || c == '[') {
        ++depth_;
      } else if (c == '}' || c == ']') {
        if (depth_ == 0) {  // closes the call object: a scalar value ended before it
          done = true;
          break;
        }
        done = --depth_ == 0;
      } else if (c == ',' && depth_ == 0) {
        done = true;
        break;
      }
    }
    emit_arguments(text.substr(0, i));
    if (done) phase_ = Phase::kTail;
  }

  void end_call() {
    if (phase_ == Phase::kPrefix || phase_ == Phase::kWhole) {
      // Not in the streaming shape: parse the whole body.
      try {
        const auto j = nlohmann::ordered_json::parse(buf_);
        const std::string name = j.at("name").get<std::string>();
        start_tool_call(name);
        const auto& args = j.contains("arguments") ? j["arguments"] : j.value("parameters", nlohmann::ordered_json::object());
        emit_arguments(args.is_string() ? args.get<std::string>() : text::python_json_dumps(args));
      } catch (const nlohmann::json::exception&) {
        emit_content(buf_);  // not a tool call after all: pass the text on
      }
    }
    buf_.clear();
    if (phase_ != Phase::kNone) strip_content_newlines_ = true;
    phase_ = Phase::kNone;
  }

  TokenId think_begin_, think_end_, call_begin_, call_end_;
  Phase phase_ = Phase::kNone;
  std::string buf_;
  int depth_ = 0;
  bool in_string_ = false, escape_ = false;
};

}  // namespace

std::unique_ptr<OutputParser> make_qwen3_parser(std::shared_ptr<const Tokenizer> tok, ParserOptions options) {
  const auto req = [&](std::string_view s) { return require_token(*tok, s, ChatFamily::kQwen3); };
  const TokenId im_end = req("<|im_end|>"), eot = req("<|endoftext|>"), tb = req("<think>"), te = req("</think>"),
                cb = req("<tool_call>"), ce = req("</tool_call>");
  return std::make_unique<Qwen3Parser>(std::move(tok), std::move(options), im_end, eot, tb, te, cb, ce);
}

// Llama 3: plain content until <|eot_id|> / <|eom_id|> / <|end_of_text|>; no reasoning, no tool format.
namespace {
class Llama3Parser final : public ParserBase {
 public:
  Llama3Parser(std::shared_ptr<const Tokenizer> tok, ParserOptions options, std::vector<TokenId> stops)
      : ParserBase(std::move(tok), std::move(options), std::move(stops)) {}

 protected:
  bool is_marker(TokenId) const override { return false; }
  bool on_control(TokenId) override { return false; }
  void on_text(std::string_view text) override { emit_content(text); }
  void on_end() override {}
};
}  // namespace

std::unique_ptr<OutputParser> make_llama3_parser(std::shared_ptr<const Tokenizer> tok, ParserOptions options) {
  std::vector<TokenId> stops = {require_token(*tok, "<|eot_id|>", ChatFamily::kLlama3),
                                require_token(*tok, "<|end_of_text|>", ChatFamily::kLlama3)};
  if (auto eom = tok->token_to_id("<|eom_id|>")) stops.push_back(*eom);
  options.starts_in_reasoning = false;
  return std::make_unique<Llama3Parser>(std::move(tok), std::move(options), std::move(stops));
}

}  // namespace di::recipe::detail
