#include "recipe/incremental_detokenizer.h"

#include "recipe/unicode.h"

namespace di::recipe {

IncrementalDetokenizer::IncrementalDetokenizer(std::shared_ptr<const Tokenizer> tokenizer)
    : IncrementalDetokenizer(std::move(tokenizer), Options{}) {}

IncrementalDetokenizer::IncrementalDetokenizer(std::shared_ptr<const Tokenizer> tokenizer, Options options)
    : tokenizer_(std::move(tokenizer)), options_(options) {
  DI_CHECK(tokenizer_ != nullptr, "IncrementalDetokenizer needs a tokenizer");
}

std::string IncrementalDetokenizer::push(TokenId id) { return push(std::span<const TokenId>(&id, 1)); }

std::string IncrementalDetokenizer::push(std::span<const TokenId> ids) {
  for (TokenId id : ids) {
    if (options_.skip_special && tokenizer_->is_special(id)) continue;
    held_.append(tokenizer_->token_bytes(id));
  }
  return take_complete();
}

std::string IncrementalDetokenizer::take_complete() {
  // Everything except a trailing sequence that is still a valid prefix of some character.
  size_t keep = unicode::incomplete_tail_length(held_);
  std::string_view ready(held_.data(), held_.size() - keep);
  std::string out = unicode::is_valid(ready) ? std::string(ready) : unicode::repair(ready);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out = unicode::repair(held_);
  held_.clear();
  return out;
}

}  // namespace di::recipe
