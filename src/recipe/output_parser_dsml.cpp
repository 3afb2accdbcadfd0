// DeepSeek V3.2 / V4 output with DSML tool calls. <think>, </think> and EOS are ids; the DSML markup is
// several tokens and is matched on decoded text:
//
//   content\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="NAME">\n
//   <｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter>\n…</｜DSML｜invoke>\n…
//   </｜DSML｜function_calls>                 (V4: tool_calls instead of function_calls; both accepted)
//
// Arguments are synthesised as JSON while the markup streams: `{"KEY": ` when a parameter name is
// complete, then the value — JSON-escaped inside quotes for string="true", raw for string="false" —
// as it arrives, `, ` between parameters and `}` (or `{}`) at </｜DSML｜invoke>. Only text that could
// still be the start of a marker is held back; newlines right before the block are dropped.
#include <array>

#include "core/error.h"
#include "recipe/deepseek_tokens.h"
#include "recipe/parser_base.h"
#include "recipe/text_util.h"

namespace di::recipe::detail {
namespace {

using namespace std::string_view_literals;

const std::string kD(deepseek::kDsml);
const std::array<std::string, 2> kBlockOpen = {"<" + kD + "function_calls>", "<" + kD + "tool_calls>"};
const std::array<std::string, 2> kBlockClose = {"</" + kD + "function_calls>", "</" + kD + "tool_calls>"};
const std::string kInvokeOpen = "<" + kD + "invoke name=\"";
const std::string kInvokeClose = "</" + kD + "invoke>";
const std::string kParamOpen = "<" + kD + "parameter name=\"";
const std::string kParamClose = "</" + kD + "parameter>";
constexpr std::string_view kNameEnd = "\">";
constexpr std::string_view kKeyEnd = "\" string=\"";

enum class Match { kNone, kPartial, kFull };

// Whether `buf` starts with `marker` (kFull), is a prefix of it (kPartial), or neither.
Match match_at_start(std::string_view buf, std::string_view marker) {
  if (buf.starts_with(marker)) return Match::kFull;
  if (marker.starts_with(buf)) return Match::kPartial;
  return Match::kNone;
}

class DsmlParser final : public ParserBase {
 public:
  DsmlParser(std::shared_ptr<const Tokenizer> tok, ParserOptions options, const DeepSeekTokens& t)
      : ParserBase(std::move(tok), std::move(options), {t.eos}), t_(t) {}

 protected:
  bool is_marker(TokenId id) const override { return id == t_.think_begin || id == t_.think_end || id == t_.dsml; }

  bool on_control(TokenId id) override {
    // ｜DSML｜ is one token of the markup, which is matched as text; inside markup the think tags are text too.
    if (id == t_.dsml || state_ != State::kContent) {
      on_text(tokenizer().id_to_token(id));
      return true;
    }
    if (id == t_.think_begin) {
      if (!in_reasoning_ && !content_emitted_ && buf_.empty()) {
        in_reasoning_ = true;
        strip_reasoning_newlines_ = true;
      }
      return true;
    }
    if (in_reasoning_) {
      in_reasoning_ = false;
      strip_content_newlines_ = true;
    }
    return true;  // an extra </think> in content is skipped
  }

  void on_text(std::string_view text) override {
    if (in_reasoning_) {
      emit_reasoning(text);
      return;
    }
    buf_ += text;
    while (step()) {
    }
  }

  void on_end() override {
    switch (state_) {
      case State::kContent: emit_content(buf_); break;
      case State::kValue: emit_value(buf_); break;  // truncated: pass on what was generated
      default: break;
    }
    buf_.clear();
  }

 private:
  enum class State { kContent, kBlock, kInvokeName, kInvokeBody, kKey, kType, kValue };

  // Consumes what it can from buf_; returns true when it made progress and should run again.
  bool step() {
    switch (state_) {
      case State::kContent: return step_content();
      case State::kBlock: {
        skip_whitespace();
        if (buf_.empty()) return false;
        if (consume(kInvokeOpen)) {
          state_ = State::kInvokeName;
          return true;
        }
        for (const std::string& m : kBlockClose) {
          if (consume(m)) {
            state_ = State::kContent;
            strip_content_newlines_ = true;
            return true;
          }
        }
        if (could_become({kInvokeOpen, kBlockClose[0], kBlockClose[1]})) return false;
        return bail_out_to_content();
      }
      case State::kInvokeName: {
        const size_t p = buf_.find(kNameEnd);
        if (p == std::string::npos) return false;
        start_tool_call(buf_.substr(0, p));
        buf_.erase(0, p + kNameEnd.size());
        num_params_ = 0;
        state_ = State::kInvokeBody;
        return true;
      }
      case State::kInvokeBody: {
        skip_whitespace();
        if (buf_.empty()) return false;
        if (consume(kParamOpen)) {
          state_ = State::kKey;
          return true;
        }
        if (consume(kInvokeClose)) {
          emit_arguments(num_params_ == 0 ? "{}" : "}");
          state_ = State::kBlock;
          return true;
        }
        if (could_become({kParamOpen, kInvokeClose})) return false;
        emit_arguments(num_params_ == 0 ? "{}" : "}");
        return bail_out_to_content();
      }
      case State::kKey: {
        const size_t p = buf_.find(kKeyEnd);
        if (p == std::string::npos) return false;
        std::string frag = num_params_++ == 0 ? "{\"" : ", \"";
        text::append_json_escaped(frag, std::string_view(buf_).substr(0, p));
        frag += "\": ";
        emit_arguments(frag);
        buf_.erase(0, p + kKeyEnd.size());
        state_ = State::kType;
        return true;
      }
      case State::kType: {
        const size_t p = buf_.find(kNameEnd);
        if (p == std::string::npos) return false;
        value_is_string_ = buf_.compare(0, p, "false") != 0;
        value_has_text_ = false;
        if (value_is_string_) emit_arguments("\"");
        buf_.erase(0, p + kNameEnd.size());
        state_ = State::kValue;
        return true;
      }
      case State::kValue: {
        const size_t p = buf_.find(kParamClose);
        if (p == std::string::npos) {
          const size_t keep = partial_marker_suffix(buf_, kParamClose);
          emit_value(std::string_view(buf_).substr(0, buf_.size() - keep));
          buf_.erase(0, buf_.size() - keep);
          return false;
        }
        emit_value(std::string_view(buf_).substr(0, p));
        if (value_is_string_) {
          emit_arguments("\"");
        } else if (!value_has_text_) {
          emit_arguments("null");
        }
        buf_.erase(0, p + kParamClose.size());
        state_ = State::kInvokeBody;
        return true;
      }
    }
    return false;
  }

  bool step_content() {
    if (!options().parse_tool_calls) {
      emit_content(buf_);
      buf_.clear();
      return false;
    }
    // Earliest position where a block opener starts or may start.
    size_t cut = buf_.size();
    bool full = false;
    size_t full_len = 0;
    for (const std::string& m : kBlockOpen) {
      const size_t p = buf_.find(m);
      if (p != std::string::npos && p < cut) {
        cut = p;
        full = true;
        full_len = m.size();
      }
    }
    if (!full) {
      for (const std::string& m : kBlockOpen) {
        const size_t keep = partial_marker_suffix(buf_, m);
        if (keep > 0) cut = std::min(cut, buf_.size() - keep);
      }
    }
    // Newlines right before a (possible) block are held: they are dropped if the block comes.
    const size_t text_end = text::rstrip(std::string_view(buf_).substr(0, cut), "\n").size();
    emit_content(std::string_view(buf_).substr(0, text_end));
    if (full) {
      buf_.erase(0, cut + full_len);
      state_ = State::kBlock;
      return true;
    }
    buf_.erase(0, text_end);
    return false;
  }

  void emit_value(std::string_view v) {
    if (v.empty()) return;
    if (value_is_string_) {
      std::string esc;
      text::append_json_escaped(esc, v);
      emit_arguments(esc);
    } else {
      if (!text::strip_whitespace(v).empty()) value_has_text_ = true;
      emit_arguments(v);
    }
  }

  void skip_whitespace() { buf_.erase(0, buf_.size() - text::lstrip(buf_, " \n\r\t").size()); }

  bool consume(std::string_view marker) {
    if (match_at_start(buf_, marker) != Match::kFull) return false;
    buf_.erase(0, marker.size());
    return true;
  }

  bool could_become(std::initializer_list<std::string_view> markers) const {
    for (std::string_view m : markers)
      if (match_at_start(buf_, m) == Match::kPartial) return true;
    return false;
  }

  // Malformed markup: the reference format is not followed, so what remains is passed on as content
  // rather than dropped.
  bool bail_out_to_content() {
    state_ = State::kContent;
    return true;
  }

  DeepSeekTokens t_;
  State state_ = State::kContent;
  std::string buf_;  // decoded text not yet consumed by the state machine
  int num_params_ = 0;
  bool value_is_string_ = true;
  bool value_has_text_ = false;
};

}  // namespace

std::unique_ptr<OutputParser> make_dsml_parser(ChatFamily family, std::shared_ptr<const Tokenizer> tok,
                                               ParserOptions options) {
  const DeepSeekTokens t = DeepSeekTokens::lookup(*tok, family);
  return std::make_unique<DsmlParser>(std::move(tok), std::move(options), t);
}

}  // namespace di::recipe::detail
