#include "bench/prompt_text.h"

#include <algorithm>

#include "core/error.h"

namespace di::bench {

bool is_valid_utf8(const std::string& s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
      return false;
    }
    i += len;
  }
  return true;
}

PromptTextBuilder::PromptTextBuilder(std::shared_ptr<const recipe::Tokenizer> tokenizer,
                                     uint64_t seed)
    : tokenizer_(std::move(tokenizer)), rng_(seed) {
  DI_CHECK(tokenizer_ != nullptr, "PromptTextBuilder needs a tokenizer");
  const int32_t vocab = tokenizer_->vocab_size();
  // At most ~16k candidates spread over the vocabulary: enough variety, cheap to check (one
  // encode of a short string each). The pool does not depend on the seed.
  const int32_t stride = std::max(1, vocab / 16384);
  for (int32_t id = 0; id < vocab; id += stride) {
    if (tokenizer_->is_special(id) || tokenizer_->id_to_token(id).empty()) continue;
    const std::string text = tokenizer_->decode({id});
    if (text.empty() || !is_valid_utf8(text)) continue;
    if (text.find('\0') != std::string::npos) continue;
    const auto re = tokenizer_->encode_ordinary(text);
    if (re.size() == 1 && re[0] == id) pool_.push_back(id);
  }
  DI_CHECK(pool_.size() >= 16, "tokenizer has only {} round-trip tokens; cannot build prompts",
           pool_.size());
}

std::vector<recipe::TokenId> PromptTextBuilder::encode(const std::string& text) const {
  return text.size() > 16384 ? tokenizer_->encode_ordinary_parallel(text)
                             : tokenizer_->encode_ordinary(text);
}

int32_t PromptTextBuilder::count_tokens(const std::string& text) const {
  return static_cast<int32_t>(encode(text).size());
}

void PromptTextBuilder::append_random(std::vector<recipe::TokenId>& ids, size_t count) {
  std::uniform_int_distribution<size_t> pick(0, pool_.size() - 1);
  for (size_t i = 0; i < count; ++i) ids.push_back(pool_[pick(rng_)]);
}

std::string PromptTextBuilder::text_of_tokens(int32_t num_tokens) {
  DI_CHECK(num_tokens >= 0, "token count must be >= 0, got {}", num_tokens);
  if (num_tokens == 0) return "";
  const auto n = static_cast<size_t>(num_tokens);
  std::vector<recipe::TokenId> ids;
  ids.reserve(n + 8);
  append_random(ids, n);
  // Each round re-encodes the text and fixes the count at the tail: too many ids → cut to n (and
  // back off to a UTF-8 boundary); too few → append random tokens. Only the last few tokens ever
  // change, so this converges in a handful of rounds.
  for (int round = 0; round < 64; ++round) {
    std::string text = tokenizer_->decode(ids);
    std::vector<recipe::TokenId> re = encode(text);
    if (re.size() == n) return text;
    if (re.size() > n) {
      re.resize(n);
      while (!re.empty() && !is_valid_utf8(tokenizer_->decode(re))) re.pop_back();
    }
    ids = std::move(re);
    if (ids.size() < n) append_random(ids, n - ids.size());
  }
  DI_FAIL("could not build a text of exactly {} tokens in 64 rounds", num_tokens);
}

}  // namespace di::bench
