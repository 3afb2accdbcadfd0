// Parsing pieces every API shares: sampling fields, max_tokens, reasoning effort, content text, and
// the output budget against the model's context.
#include <fmt/format.h>

#include <limits>

#include "protocol/api_error.h"
#include "protocol/request.h"

namespace di::protocol {

const char* api_name(Api api) {
  switch (api) {
    case Api::kChatCompletions: return "chat.completions";
    case Api::kCompletions: return "completions";
    case Api::kResponses: return "responses";
    case Api::kMessages: return "messages";
  }
  return "?";
}

int64_t resolve_output_budget(std::optional<int64_t> requested, int64_t default_max, int64_t prompt_len,
                              int64_t max_model_len) {
  if (prompt_len >= max_model_len) {
    throw_invalid(fmt::format("the prompt is {} tokens, which leaves no room to generate in this model's "
                              "context of {} tokens",
                              prompt_len, max_model_len),
                  "messages");
  }
  const int64_t room = max_model_len - prompt_len;
  if (requested) {
    if (*requested > room) {
      throw_invalid(fmt::format("this model's context is {} tokens; the prompt is {} tokens and {} were "
                                "requested for the output ({} in all). Reduce the prompt or max_tokens.",
                                max_model_len, prompt_len, *requested, prompt_len + *requested),
                    "max_tokens");
    }
    return *requested;
  }
  return std::min(default_max, room);
}

namespace detail {

recipe::ReasoningEffort parse_effort(const std::string& s, const std::string& path) {
  using E = recipe::ReasoningEffort;
  if (s == "none") return E::kNone;
  if (s == "minimal" || s == "low") return E::kLow;
  if (s == "medium") return E::kMedium;
  if (s == "high" || s == "xhigh") return E::kHigh;
  if (s == "max" || s == "ultra") return E::kMax;
  throw_invalid(fmt::format("'{}' must be one of none, minimal, low, medium, high, xhigh, max; got '{}'", path, s),
                path);
}

std::optional<int64_t> get_max_tokens(const Json& body, std::string_view key, const ParseLimits& limits) {
  auto v = get_integer(body, key);
  if (v && (*v < 1 || *v > limits.max_tokens_cap)) {
    throw_invalid(fmt::format("'{}' must be between 1 and {}, got {}", key, limits.max_tokens_cap, *v),
                  std::string(key));
  }
  return v;
}

void validate_sampling(const sampling::SamplingParams& s) {
  Status st = s.validate();
  if (!st.is_ok()) throw_invalid(st.message());
}

void parse_openai_sampling(const Json& body, sampling::SamplingParams& s) {
  if (auto t = get_number_in(body, "temperature", 0.0, 2.0)) s.temperature = static_cast<float>(*t);
  if (auto p = get_number_in(body, "top_p", 0.0, 1.0)) {
    if (*p == 0.0) throw_invalid("'top_p' must be greater than 0", "top_p");
    s.top_p = static_cast<float>(*p);
  }
  if (auto k = get_integer(body, "top_k")) {
    if (*k < -1 || *k > std::numeric_limits<int32_t>::max()) throw_invalid("'top_k' must be -1 (off) or positive", "top_k");
    s.top_k = static_cast<int32_t>(*k);
  }
  if (auto m = get_number_in(body, "min_p", 0.0, 1.0)) s.min_p = static_cast<float>(*m);
  if (auto f = get_number_in(body, "frequency_penalty", -2.0, 2.0)) s.frequency_penalty = static_cast<float>(*f);
  if (auto p = get_number_in(body, "presence_penalty", -2.0, 2.0)) s.presence_penalty = static_cast<float>(*p);
  if (auto r = get_number(body, "repetition_penalty")) {
    if (!(*r > 0.0)) throw_invalid("'repetition_penalty' must be positive", "repetition_penalty");
    s.repetition_penalty = static_cast<float>(*r);
  }
  if (auto seed = get_integer(body, "seed")) s.seed = static_cast<uint64_t>(*seed);
  validate_sampling(s);
}

std::string content_text(const Json& content, const std::string& path,
                         std::initializer_list<std::string_view> text_types) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    throw_invalid(fmt::format("'{}' must be a string or an array of content parts, got {}", path,
                              json_type_name(content)),
                  path);
  }
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    const std::string ppath = index_path(path, i);
    if (!part.is_object()) throw_invalid(fmt::format("'{}' must be an object", ppath), ppath);
    const std::string type = require_string(part, "type", ppath);
    bool ok = false;
    for (auto t : text_types) ok = ok || type == t;
    if (!ok) {
      throw_invalid(fmt::format("'{}': content parts of type '{}' are not supported (this server takes text only)",
                                ppath, type),
                    field_path(ppath, "type"));
    }
    text += require_string(part, "text", ppath);
  }
  return text;
}

std::string require_model(const Json& body) {
  std::string model = require_string(body, "model");
  if (model.empty()) throw_invalid("'model' must not be empty", "model");
  return model;
}

Json tool_schema(const Json* schema, const std::string& path) {
  if (!schema) return Json{{"type", "object"}, {"properties", Json::object()}};
  if (!schema->is_object()) {
    throw_invalid(fmt::format("'{}' must be a JSON-schema object, got {}", path, json_type_name(*schema)), path);
  }
  return *schema;
}

}  // namespace detail
}  // namespace di::protocol
