#pragma once
// A compiled PCRE2 pattern (UTF + Unicode properties + JIT) for the pre-tokenizer splits.
//
// Patterns in tokenizer.json are written for Oniguruma, which HF `tokenizers` uses. PCRE2 agrees on
// the syntax these files use, with one difference that matters: PCRE2's `\s` also matches U+180E, so
// `\s` and `\S` are rewritten to the Unicode White_Space set that Oniguruma uses.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

namespace di::recipe {

class Regex {
 public:
  // `literal`: the pattern is a plain string (a Split with {"String": ...}).
  static Result<Regex> compile(std::string_view pattern, bool literal = false);

  // Finds the leftmost match that starts in [start, max_start] in `subject` (the whole subject is
  // visible to lookaheads). Subject must be valid UTF-8 and `start` a character boundary.
  bool find(std::string_view subject, size_t start, size_t* match_begin, size_t* match_end,
            size_t max_start = std::string_view::npos) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
  std::string pattern_;
};

// Oniguruma-compatible rewrite of `\s` / `\S` (exposed for tests).
std::string translate_onig_pattern(std::string_view pattern);

}  // namespace di::recipe
