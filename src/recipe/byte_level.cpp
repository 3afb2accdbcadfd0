#include "recipe/byte_level.h"

#include <array>

#include "recipe/unicode.h"

namespace di::recipe::byte_level {
namespace {

struct Alphabet {
  std::array<char32_t, 256> to_char{};
  // Inverse for code points < 324 (the alphabet's largest code point is U+0143); -1 if not a byte.
  std::array<int16_t, 324> to_byte{};

  Alphabet() {
    to_byte.fill(-1);
    // Printable Latin-1 bytes spell themselves; the other 68 map to U+0100.. in byte order.
    auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      to_char[b] = printable(b) ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

}  // namespace

char32_t byte_to_char(uint8_t byte) { return alphabet().to_char[byte]; }

std::optional<std::string> token_to_bytes(std::string_view token) {
  const Alphabet& a = alphabet();
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    char32_t cp = 0;
    size_t len = unicode::decode_one(token.data() + i, token.size() - i, &cp);
    if (len == 0 || cp >= a.to_byte.size() || a.to_byte[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(a.to_byte[cp]));
    i += len;
  }
  return out;
}

std::string bytes_to_token(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) unicode::append_utf8(out, byte_to_char(static_cast<uint8_t>(c)));
  return out;
}

}  // namespace di::recipe::byte_level
