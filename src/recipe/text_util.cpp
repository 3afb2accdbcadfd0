#include "recipe/text_util.h"

#include <array>

namespace di::recipe::text {

std::string_view lstrip(std::string_view s, std::string_view chars) {
  size_t b = s.find_first_not_of(chars);
  return b == std::string_view::npos ? std::string_view() : s.substr(b);
}

std::string_view rstrip(std::string_view s, std::string_view chars) {
  size_t e = s.find_last_not_of(chars);
  return e == std::string_view::npos ? std::string_view() : s.substr(0, e + 1);
}

std::string_view strip(std::string_view s, std::string_view chars) { return rstrip(lstrip(s, chars), chars); }

namespace {

// Byte length of the whitespace character at s[i] (Python str.isspace), 0 if none.
size_t whitespace_at(std::string_view s, size_t i) {
  const auto u = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = u(i);
  if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
  if (c == 0xc2 && i + 1 < s.size() && (u(i + 1) == 0x85 || u(i + 1) == 0xa0)) return 2;
  if (i + 2 < s.size()) {
    const unsigned b1 = u(i + 1), b2 = u(i + 2);
    if (c == 0xe1 && b1 == 0x9a && b2 == 0x80) return 3;                  // U+1680
    if (c == 0xe2 && b1 == 0x80 && (b2 <= 0x8a || b2 == 0xa8 || b2 == 0xa9 || b2 == 0xaf)) return 3;
    if (c == 0xe2 && b1 == 0x81 && b2 == 0x9f) return 3;                  // U+205F
    if (c == 0xe3 && b1 == 0x80 && b2 == 0x80) return 3;                  // U+3000
  }
  return 0;
}

size_t utf8_char_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xe0) == 0xc0) return 2;
  if ((lead & 0xf0) == 0xe0) return 3;
  if ((lead & 0xf8) == 0xf0) return 4;
  return 0;  // continuation or invalid lead
}

}  // namespace

std::string_view strip_whitespace(std::string_view s) {
  size_t b = 0;
  while (b < s.size()) {
    size_t n = whitespace_at(s, b);
    if (n == 0) break;
    b += n;
  }
  size_t e = s.size();
  while (e > b) {
    // Try the 1-, 2- and 3-byte whitespace characters that could end at e.
    size_t n = 0;
    for (size_t len : {size_t{1}, size_t{2}, size_t{3}}) {
      if (e - b >= len && whitespace_at(s, e - len) == len) {
        n = len;
        break;
      }
    }
    if (n == 0) break;
    e -= n;
  }
  return s.substr(b, e - b);
}

std::vector<std::string_view> split(std::string_view s, std::string_view sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    size_t p = s.find(sep, start);
    if (p == std::string_view::npos) {
      out.push_back(s.substr(start));
      return out;
    }
    out.push_back(s.substr(start, p - start));
    start = p + sep.size();
  }
}

bool contains(std::string_view s, std::string_view needle) { return s.find(needle) != std::string_view::npos; }

void append_json_escaped(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += ch;
        }
    }
  }
}

namespace {

void dump_python(std::string& out, const nlohmann::ordered_json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        out += '"';
        append_json_escaped(out, it.key());
        out += "\": ";
        dump_python(out, it.value());
      }
      out += '}';
      return;
    }
    case nlohmann::json::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        dump_python(out, e);
      }
      out += ']';
      return;
    }
    case nlohmann::json::value_t::string:
      out += '"';
      append_json_escaped(out, v.get_ref<const std::string&>());
      out += '"';
      return;
    case nlohmann::json::value_t::boolean: out += v.get<bool>() ? "true" : "false"; return;
    case nlohmann::json::value_t::null: out += "null"; return;
    default: out += v.dump(); return;  // numbers
  }
}

}  // namespace

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  dump_python(out, value);
  return out;
}

size_t complete_utf8_prefix(std::string_view s) {
  // Only the last <= 3 bytes can belong to an incomplete character.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xc0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const size_t need = utf8_char_len(c);
    return need > back ? n - back : n;
  }
  return n;
}

std::string sanitize_utf8(std::string_view s) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = utf8_char_len(c);
    bool ok = len != 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    if (ok && len > 1) {
      // Reject overlong forms, surrogates and code points above U+10FFFF.
      uint32_t cp = c & (0xff >> (len + 1));
      for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
      static constexpr std::array<uint32_t, 5> kMin = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= kMin[len] && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    }
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
      continue;
    }
    // One U+FFFD per maximal ill-formed subpart (as Python's "replace"): a lead byte and the
    // continuation bytes that follow it, up to the length the lead announces.
    out += kReplacement;
    size_t k = 1;
    while (len > 1 && k < len && i + k < s.size() && (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80) ++k;
    i += k;
  }
  return out;
}

}  // namespace di::recipe::text
