#include "protocol/json_fields.h"

#include <fmt/format.h>

#include <cmath>

#include "protocol/api_error.h"

namespace di::protocol {

Json parse_body(std::string_view body) {
  Json j;
  try {
    j = Json::parse(body.begin(), body.end());
  } catch (const nlohmann::json::parse_error& e) {
    // nlohmann rejects ill-formed UTF-8 inside strings with a parse error too.
    throw_invalid(fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) {
    throw_invalid(fmt::format("the request body must be a JSON object, got {}", json_type_name(j)));
  }
  return j;
}

std::string field_path(std::string_view parent, std::string_view key) {
  if (parent.empty()) return std::string(key);
  return fmt::format("{}.{}", parent, key);
}

std::string index_path(std::string_view parent, size_t idx) { return fmt::format("{}[{}]", parent, idx); }

const char* json_type_name(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::object: return "object";
    case Json::value_t::array: return "array";
    case Json::value_t::string: return "string";
    case Json::value_t::boolean: return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float: return "number";
    default: return "value";
  }
}

const Json* find_field(const Json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

namespace {
[[noreturn]] void wrong_type(const Json& v, std::string_view expected, const std::string& path) {
  throw_invalid(fmt::format("'{}' must be {}, got {}", path, expected, json_type_name(v)), path);
}
}  // namespace

std::optional<std::string> get_string(const Json& obj, std::string_view key, std::string_view parent) {
  const Json* v = find_field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_type(*v, "a string", field_path(parent, key));
  return v->get<std::string>();
}

std::optional<bool> get_bool(const Json& obj, std::string_view key, std::string_view parent) {
  const Json* v = find_field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(*v, "a boolean", field_path(parent, key));
  return v->get<bool>();
}

std::optional<double> get_number(const Json& obj, std::string_view key, std::string_view parent) {
  const Json* v = find_field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(*v, "a number", field_path(parent, key));
  return v->get<double>();
}

std::optional<int64_t> get_integer(const Json& obj, std::string_view key, std::string_view parent) {
  const Json* v = find_field(obj, key);
  if (!v) return std::nullopt;
  const std::string path = field_path(parent, key);
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_unsigned()) {
    // Only values above INT64_MAX land here.
    throw_invalid(fmt::format("'{}' is too large: {}", path, v->dump()), path);
  }
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e18) return static_cast<int64_t>(d);
    throw_invalid(fmt::format("'{}' must be an integer, got {}", path, v->dump()), path);
  }
  wrong_type(*v, "an integer", path);
}

const Json* get_object(const Json& obj, std::string_view key, std::string_view parent) {
  const Json* v = find_field(obj, key);
  if (v && !v->is_object()) wrong_type(*v, "an object", field_path(parent, key));
  return v;
}

const Json* get_array(const Json& obj, std::string_view key, std::string_view parent) {
  const Json* v = find_field(obj, key);
  if (v && !v->is_array()) wrong_type(*v, "an array", field_path(parent, key));
  return v;
}

std::string require_string(const Json& obj, std::string_view key, std::string_view parent) {
  auto s = get_string(obj, key, parent);
  if (!s) {
    const std::string path = field_path(parent, key);
    throw_invalid(fmt::format("'{}' is required", path), path);
  }
  return *s;
}

const Json& require_array(const Json& obj, std::string_view key, std::string_view parent) {
  const Json* a = get_array(obj, key, parent);
  if (!a) {
    const std::string path = field_path(parent, key);
    throw_invalid(fmt::format("'{}' is required", path), path);
  }
  return *a;
}

std::optional<double> get_number_in(const Json& obj, std::string_view key, double lo, double hi,
                                    std::string_view parent) {
  auto v = get_number(obj, key, parent);
  if (v && !(*v >= lo && *v <= hi)) {
    const std::string path = field_path(parent, key);
    throw_invalid(fmt::format("'{}' must be between {} and {}, got {}", path, lo, hi, *v), path);
  }
  return v;
}

std::vector<std::string> get_stop_list(const Json& obj, std::string_view key, size_t max_count) {
  std::vector<std::string> out;
  const Json* v = find_field(obj, key);
  if (!v) return out;
  const std::string path(key);
  if (v->is_string()) {
    if (!v->get_ref<const std::string&>().empty()) out.push_back(v->get<std::string>());
    return out;
  }
  if (!v->is_array()) wrong_type(*v, "a string or an array of strings", path);
  if (v->size() > max_count) {
    throw_invalid(fmt::format("'{}' may hold at most {} sequences, got {}", path, max_count, v->size()), path);
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& s = (*v)[i];
    if (!s.is_string()) wrong_type(s, "a string", index_path(path, i));
    if (!s.get_ref<const std::string&>().empty()) out.push_back(s.get<std::string>());
  }
  return out;
}

}  // namespace di::protocol
