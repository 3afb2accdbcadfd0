// DeepSeek V3 and V3.1 output: every marker is a single control token, recognised by id.
//
//   V3.1: [reasoning</think>]content<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>
//   V3:   content<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>…
//
// ARGS stream as they arrive. For V3 the closing "\n```" is text, so only a suffix that could still
// become it is held back. Text after <｜tool▁calls▁end｜> is content (not dropped).
#include "core/error.h"
#include "recipe/deepseek_tokens.h"
#include "recipe/parser_base.h"
#include "recipe/text_util.h"

namespace di::recipe::detail {
namespace {

constexpr std::string_view kFenceOpen = "```json\n";
constexpr std::string_view kFenceClose = "\n```";

class DeepSeekParser final : public ParserBase {
 public:
  DeepSeekParser(ChatFamily family, std::shared_ptr<const Tokenizer> tok, ParserOptions options,
                 const DeepSeekTokens& t)
      : ParserBase(std::move(tok), std::move(options), {t.eos}), v3_(family == ChatFamily::kDeepSeekV3), t_(t) {}

 protected:
  bool is_marker(TokenId id) const override {
    return id == t_.think_begin || id == t_.think_end || id == t_.calls_begin || id == t_.calls_end ||
           id == t_.call_begin || id == t_.call_end || id == t_.sep;
  }

  bool on_control(TokenId id) override {
    if (id < 0) return false;
    if (id == t_.think_begin) {
      if (state_ == State::kText && !in_reasoning_ && !content_emitted_) {
        in_reasoning_ = true;
        strip_reasoning_newlines_ = true;
      }
      return true;  // a stray <think> elsewhere carries no text
    }
    if (id == t_.think_end) {
      if (state_ == State::kText && in_reasoning_) {
        in_reasoning_ = false;
        strip_content_newlines_ = true;
      }
      return true;  // an extra </think> in content is skipped
    }
    if (!options().parse_tool_calls) return false;
    if (id == t_.calls_begin) {
      if (state_ == State::kText) {
        in_reasoning_ = false;
        state_ = State::kBlock;
      }
      return true;
    }
    if (id == t_.call_begin) {
      if (state_ == State::kText || state_ == State::kBlock) {
        in_reasoning_ = false;
        state_ = State::kHeader;
        header_.clear();
      }
      return true;
    }
    if (id == t_.sep) {
      if (state_ != State::kHeader) return true;
      if (v3_) {
        state_ = State::kName;  // the header was the call type ("function")
        header_.clear();
      } else {
        start_tool_call(std::string(text::strip_whitespace(header_)));
        state_ = State::kArgs;
      }
      return true;
    }
    if (id == t_.call_end) {
      close_call();
      state_ = State::kBlock;
      return true;
    }
    if (id == t_.calls_end) {
      if (state_ != State::kText) close_call();
      state_ = State::kText;
      strip_content_newlines_ = true;
      return true;
    }
    return false;
  }

  void on_text(std::string_view text) override {
    switch (state_) {
      case State::kText:
        if (in_reasoning_) {
          emit_reasoning(text);
        } else {
          emit_content(text);
        }
        return;
      case State::kBlock: return;  // separators between calls
      case State::kHeader: header_ += text; return;
      case State::kName: {
        header_ += text;
        const size_t nl = header_.find('\n');
        if (nl == std::string::npos) return;
        start_tool_call(std::string(text::strip_whitespace(std::string_view(header_).substr(0, nl))));
        std::string rest = header_.substr(nl + 1);
        header_.clear();
        state_ = State::kFence;
        on_text(rest);
        return;
      }
      case State::kFence: {
        header_ += text;
        if (header_.size() < kFenceOpen.size() && kFenceOpen.starts_with(header_)) return;
        std::string rest = header_.starts_with(kFenceOpen) ? header_.substr(kFenceOpen.size()) : header_;
        header_.clear();
        state_ = State::kArgs;
        on_text(rest);
        return;
      }
      case State::kArgs:
        if (!v3_) {
          emit_arguments(text);
          return;
        }
        held_ += text;
        {
          const size_t keep =
              held_.ends_with(kFenceClose) ? kFenceClose.size() : partial_marker_suffix(held_, kFenceClose);
          emit_arguments(std::string_view(held_).substr(0, held_.size() - keep));
          held_.erase(0, held_.size() - keep);
        }
        return;
    }
  }

  void on_end() override {
    if (state_ == State::kArgs) {
      emit_arguments(held_);  // truncated inside the arguments: nothing to strip with certainty
      held_.clear();
    }
  }

 private:
  enum class State { kText, kBlock, kHeader, kName, kFence, kArgs };

  void close_call() {
    if (state_ == State::kHeader || state_ == State::kName) {
      // Malformed: no separator / no newline after the name. Still report the call.
      start_tool_call(std::string(text::strip_whitespace(header_)));
      header_.clear();
    }
    if (state_ == State::kFence) {
      emit_arguments(header_);
      header_.clear();
    }
    if (held_ != kFenceClose) emit_arguments(held_);
    held_.clear();
  }

  bool v3_;
  DeepSeekTokens t_;
  State state_ = State::kText;
  std::string header_;  // call type / name / fence being read
  std::string held_;    // V3: argument bytes that may be the closing fence
};

}  // namespace

std::unique_ptr<OutputParser> make_deepseek_parser(ChatFamily family, std::shared_ptr<const Tokenizer> tok,
                                                   ParserOptions options) {
  const DeepSeekTokens t = DeepSeekTokens::lookup(*tok, family);
  return std::make_unique<DeepSeekParser>(family, std::move(tok), std::move(options), t);
}

}  // namespace di::recipe::detail
