#pragma once
// UTF-8 and Unicode helpers for the tokenizer: validation, lossy repair, code point iteration and
// canonical normalization (NFC/NFD, tables in unicode_tables.cpp).
#include <cstddef>
#include <string>
#include <string_view>

namespace di::recipe::unicode {

inline constexpr char32_t kReplacement = 0xFFFD;

// Length of the well-formed UTF-8 sequence at s[0..n) and its code point in *cp; 0 if the bytes there
// are not a complete well-formed sequence (Unicode Table 3-7: no overlongs, surrogates or > U+10FFFF).
size_t decode_one(const char* s, size_t n, char32_t* cp);

void append_utf8(std::string& out, char32_t cp);

// Bytes of the longest prefix of `s` that is well-formed UTF-8.
size_t valid_prefix_length(std::string_view s);
inline bool is_valid(std::string_view s) { return valid_prefix_length(s) == s.size(); }

// Length of the longest suffix of `s` that could still become a well-formed character when more bytes
// arrive (0..3). valid prefix + incomplete tail == s means "valid so far, waiting for bytes".
size_t incomplete_tail_length(std::string_view s);

// Replaces every maximal ill-formed subsequence with U+FFFD (the WHATWG / Python "replace" rule).
std::string repair(std::string_view s);

// Canonical composition / decomposition. The NFC fast path returns early when no code point of `s`
// can change (all of ASCII and most text): it costs one scan.
bool is_nfc_quick(std::string_view s);
std::string nfc(std::string_view s);
std::string nfd(std::string_view s);

// Unicode White_Space (Rust char::is_whitespace).
bool is_whitespace(char32_t cp);

}  // namespace di::recipe::unicode
