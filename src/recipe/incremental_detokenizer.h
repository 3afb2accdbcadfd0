#pragma once
// Streaming detokenization: ids in, text out, never a broken character.
//
// Byte-level tokens can end in the middle of a UTF-8 character (an emoji is often 2-4 tokens), so
// decoding ids one at a time yields U+FFFD pairs (the classic streaming bug). This class holds back
// only an incomplete trailing sequence that more bytes could still complete; every byte it can
// judge is emitted at once. Bytes that can never become valid are emitted as U+FFFD, one per
// maximal ill-formed subsequence, exactly like a lossy decode of the whole output, so:
//
//   concat(push(...) for each id) + flush() == unicode::repair(tokenizer.decode(all ids))
//
// for any split of the ids into push calls.
#include <memory>
#include <span>
#include <string>

#include "recipe/tokenizer.h"

namespace di::recipe {

class IncrementalDetokenizer {
 public:
  struct Options {
    bool skip_special = false;  // drop ids the tokenizer marks special (BOS, EOS, <|im_end|>, ...)
  };

  explicit IncrementalDetokenizer(std::shared_ptr<const Tokenizer> tokenizer);
  IncrementalDetokenizer(std::shared_ptr<const Tokenizer> tokenizer, Options options);

  // Returns the text completed by these ids (possibly empty).
  std::string push(TokenId id);
  std::string push(std::span<const TokenId> ids);
  // Ends the stream: an incomplete trailing sequence becomes U+FFFD. The object can be reused.
  std::string flush();

  size_t held_bytes() const { return held_.size(); }

 private:
  std::string take_complete();

  std::shared_ptr<const Tokenizer> tokenizer_;
  Options options_;
  std::string held_;  // undecided bytes: at most one incomplete character (<= 3 bytes) between calls
};

}  // namespace di::recipe
