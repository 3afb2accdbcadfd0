#pragma once
// Typed, validating access to request JSON. Every failure is an ApiException (400) that names the
// field by its path ("messages[1].content[0].text"), so clients see what to fix. A JSON null counts
// as absent, as the OpenAI and Anthropic APIs treat it.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace di::protocol {

using Json = nlohmann::ordered_json;

// The request body as a JSON object; malformed JSON, ill-formed UTF-8 in a string, or a top level
// that is not an object are 400s.
Json parse_body(std::string_view body);

std::string field_path(std::string_view parent, std::string_view key);  // "a.b"; "b" at the root
std::string index_path(std::string_view parent, size_t idx);            // "a[3]"

// nullptr when absent or null.
const Json* find_field(const Json& obj, std::string_view key);

std::optional<std::string> get_string(const Json& obj, std::string_view key, std::string_view parent = {});
std::optional<bool> get_bool(const Json& obj, std::string_view key, std::string_view parent = {});
std::optional<double> get_number(const Json& obj, std::string_view key, std::string_view parent = {});
// Integers only (2.0 is accepted, 2.5 is not), within int64.
std::optional<int64_t> get_integer(const Json& obj, std::string_view key, std::string_view parent = {});
const Json* get_object(const Json& obj, std::string_view key, std::string_view parent = {});
const Json* get_array(const Json& obj, std::string_view key, std::string_view parent = {});

std::string require_string(const Json& obj, std::string_view key, std::string_view parent = {});
const Json& require_array(const Json& obj, std::string_view key, std::string_view parent = {});

// A number in [lo, hi]: "temperature must be between 0 and 2, got -1".
std::optional<double> get_number_in(const Json& obj, std::string_view key, double lo, double hi,
                                    std::string_view parent = {});

// Stop sequences: a string or an array of strings (at most `max_count`); empty strings are dropped.
std::vector<std::string> get_stop_list(const Json& obj, std::string_view key, size_t max_count);

const char* json_type_name(const Json& j);  // "string", "number", "object", ...

}  // namespace di::protocol
