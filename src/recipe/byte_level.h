#pragma once
// The GPT-2 byte-level alphabet: every byte is spelled as one printable code point in the
// vocabulary ("Ġ" is the space 0x20, "Ċ" is "\n"). The tokenizer works on raw bytes internally and
// only uses this mapping to read the vocabulary and merges, and to spell ids back as tokens.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace di::recipe::byte_level {

char32_t byte_to_char(uint8_t byte);

// The bytes a vocabulary string spells, or nullopt if one of its code points is not in the alphabet
// (an added token such as "<｜User｜>"; the decoder then emits its UTF-8 as is).
std::optional<std::string> token_to_bytes(std::string_view token);

// The vocabulary spelling of raw bytes.
std::string bytes_to_token(std::string_view bytes);

}  // namespace di::recipe::byte_level
