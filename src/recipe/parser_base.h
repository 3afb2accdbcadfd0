#pragma once
// Shared machinery of the per-family output parsers (internal; use make_output_parser()).
//
// Ids are processed one at a time whatever the chunking, and every decision depends only on the ids
// seen so far — which is what makes the events chunk-split invariant.
#include <string>
#include <string_view>
#include <vector>

#include "recipe/output_parser.h"

namespace di::recipe::detail {

class ParserBase : public OutputParser {
 public:
  void feed(std::span<const TokenId> ids, std::vector<ParserEvent>& out) final;
  void finish(FinishReason engine_reason, std::vector<ParserEvent>& out) final;
  bool stopped() const final { return stopped_; }

 protected:
  ParserBase(std::shared_ptr<const Tokenizer> tokenizer, ParserOptions options, std::vector<TokenId> stop_ids);

  // A control id of the family: return true when it was consumed as a marker. Text already decoded
  // has been delivered (flush_text) before this is called.
  virtual bool on_control(TokenId id) = 0;
  // Complete UTF-8 text of ordinary tokens, in order.
  virtual void on_text(std::string_view text) = 0;
  // End of output: flush whatever is held back.
  virtual void on_end() = 0;
  // Ids this family treats as markers (checked before decoding).
  virtual bool is_marker(TokenId id) const = 0;

  void emit_reasoning(std::string_view text);
  // Content; leading newlines are dropped while `strip_content_newlines_` is set (after </think>, after
  // a tool call), so the same output gives the same content however it is chunked.
  void emit_content(std::string_view text);
  int start_tool_call(std::string name);  // returns the tool index
  void emit_arguments(std::string_view json_fragment);

  bool in_reasoning_ = false;
  bool strip_reasoning_newlines_ = false;
  bool strip_content_newlines_ = false;
  bool content_emitted_ = false;  // any non-empty content delta so far
  int num_tool_calls_ = 0;
  const ParserOptions& options() const { return options_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  void flush_text(bool final);
  void push(ParserEvent e);

  std::shared_ptr<const Tokenizer> tokenizer_;
  ParserOptions options_;
  std::vector<TokenId> stop_ids_;
  std::string pending_bytes_;  // decoded bytes not yet delivered (an incomplete UTF-8 character)
  bool stopped_ = false;
  bool finished_ = false;
  std::vector<ParserEvent>* out_ = nullptr;
};

// Longest suffix of `text` that is a proper prefix of `marker` (what must be held back).
size_t partial_marker_suffix(std::string_view text, std::string_view marker);

std::unique_ptr<OutputParser> make_deepseek_parser(ChatFamily family, std::shared_ptr<const Tokenizer> tok,
                                                   ParserOptions options);
std::unique_ptr<OutputParser> make_dsml_parser(ChatFamily family, std::shared_ptr<const Tokenizer> tok,
                                               ParserOptions options);
std::unique_ptr<OutputParser> make_qwen3_parser(std::shared_ptr<const Tokenizer> tok, ParserOptions options);
std::unique_ptr<OutputParser> make_llama3_parser(std::shared_ptr<const Tokenizer> tok, ParserOptions options);

}  // namespace di::recipe::detail
