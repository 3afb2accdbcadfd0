#pragma once
// Text of an exact token length: random tokens of the real vocabulary, decoded, then repaired
// until the tokenizer encodes the text back to exactly the length asked for. (Decoding random ids
// and re-encoding the text usually gives a different count, because BPE merges across the
// boundaries of neighbouring tokens; benchmarks that skip the repair report the wrong input
// length.)
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "recipe/tokenizer.h"

namespace di::bench {

class PromptTextBuilder {
 public:
  PromptTextBuilder(std::shared_ptr<const recipe::Tokenizer> tokenizer, uint64_t seed);

  // Text whose encode_ordinary() has exactly `num_tokens` ids. Throws di::Error if the repair
  // loop does not converge (never seen with the DeepSeek, Qwen3 and Llama-3 vocabularies).
  std::string text_of_tokens(int32_t num_tokens);

  // Tokens the tokenizer gives for `text` (encode_ordinary; parallel for long text).
  int32_t count_tokens(const std::string& text) const;

  const recipe::Tokenizer& tokenizer() const { return *tokenizer_; }
  size_t pool_size() const { return pool_.size(); }

 private:
  std::vector<recipe::TokenId> encode(const std::string& text) const;
  void append_random(std::vector<recipe::TokenId>& ids, size_t count);

  std::shared_ptr<const recipe::Tokenizer> tokenizer_;
  // Ordinary tokens whose text is valid UTF-8 and encodes back to the same single id.
  std::vector<recipe::TokenId> pool_;
  std::mt19937_64 rng_;
};

bool is_valid_utf8(const std::string& s);

}  // namespace di::bench
