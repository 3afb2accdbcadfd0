#pragma once
// Byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json`.
//
// Two encoding modes (design.md §3, "Protocol safety"):
//   encode_ordinary(text)     base vocabulary only: text that spells a control token such as
//                             "<｜User｜>" yields ordinary tokens, never the control id.
//   encode_with_special(text) also matches added tokens (with their lstrip/rstrip flags).
//
// Text that is not valid UTF-8 is repaired first: each ill-formed sequence becomes U+FFFD.
//
// Thread-safe after construction: all methods are const.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace di::recipe {

using TokenId = int32_t;

struct AddedToken {
  TokenId id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool single_word = false;
};

class Tokenizer {
 public:
  // Loads tokenizer.json (a file path, or a directory holding one).
  static Result<std::shared_ptr<const Tokenizer>> from_file(const std::string& path);
  static Result<std::shared_ptr<const Tokenizer>> from_json(std::string_view json_text);
  virtual ~Tokenizer() = default;

  virtual std::vector<TokenId> encode_ordinary(std::string_view text) const = 0;
  virtual std::vector<TokenId> encode_with_special(std::string_view text) const = 0;
  // Splits long text into independent pieces and encodes them on the thread pool; the ids are
  // exactly those of encode_ordinary.
  virtual std::vector<TokenId> encode_ordinary_parallel(std::string_view text) const = 0;
  // The same with an explicit number of chunks (>= 1), even for short text: the chunks' cut points
  // move with `num_chunks`, which is how tests exercise many seams.
  virtual std::vector<TokenId> encode_ordinary_parallel(std::string_view text, int num_chunks) const = 0;

  // Bytes of the decoded ids (may end inside a UTF-8 character; see IncrementalDetokenizer).
  virtual std::string decode(const std::vector<TokenId>& ids, bool skip_special = false) const = 0;
  virtual std::string id_to_token(TokenId id) const = 0;  // the vocabulary string, "" if unknown
  virtual std::optional<TokenId> token_to_id(std::string_view token) const = 0;
  virtual bool is_special(TokenId id) const = 0;
  virtual const std::vector<AddedToken>& added_tokens() const = 0;
  virtual int32_t vocab_size() const = 0;  // max id + 1, added tokens included

  // The bytes one id decodes to ("" for an unknown id); what decode() concatenates.
  virtual std::string_view token_bytes(TokenId id) const = 0;
  // A tokenizer that also matches `tokens` (control-token variants, control_tokens.h). A token with
  // id < 0 gets the next id after the current maximum; one whose content is already an added token
  // keeps it; one spelled like a vocabulary entry takes that entry's id (as HF `add_tokens` does).
  // Shares the vocabulary and merges with this tokenizer.
  virtual Result<std::shared_ptr<const Tokenizer>> with_added_tokens(std::vector<AddedToken> tokens) const = 0;
};

}  // namespace di::recipe
