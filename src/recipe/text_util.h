#pragma once
// String helpers with Python/Jinja semantics, so renderers reproduce chat templates byte for byte.
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace di::recipe::text {

// str.strip(chars) / lstrip / rstrip for an ASCII set of characters.
std::string_view strip(std::string_view s, std::string_view chars);
std::string_view lstrip(std::string_view s, std::string_view chars);
std::string_view rstrip(std::string_view s, std::string_view chars);
// str.strip() with no argument: Unicode whitespace (as Python's str.isspace), used by Jinja's `trim`.
std::string_view strip_whitespace(std::string_view s);
// str.split(sep): all pieces.
std::vector<std::string_view> split(std::string_view s, std::string_view sep);
bool contains(std::string_view s, std::string_view needle);

// json.dumps(value, ensure_ascii=False): ", " and ": " separators, insertion order kept.
std::string python_json_dumps(const nlohmann::ordered_json& value);
// json.dumps(str, ensure_ascii=False) without the surrounding quotes.
void append_json_escaped(std::string& out, std::string_view s);

// Length of the longest prefix of `s` that is complete, valid-or-replaceable UTF-8: bytes of a
// trailing character that is still incomplete are excluded.
size_t complete_utf8_prefix(std::string_view s);

}  // namespace di::recipe::text

namespace di::recipe::text {
// Replaces every invalid UTF-8 sequence by U+FFFD (input is assumed complete, see above).
std::string sanitize_utf8(std::string_view s);
}  // namespace di::recipe::text
