// OpenAI (legacy) Completions: POST /v1/completions. The prompt is raw text or token ids; no chat
// template, no output parser: every generated character is `text`.
#include <fmt/format.h>

#include <limits>

#include "protocol/api_error.h"
#include "protocol/request.h"
#include "protocol/response.h"

namespace di::protocol {
namespace {

std::vector<int32_t> parse_ids(const Json& arr, const std::string& path) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const Json& v = arr[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      throw_invalid(fmt::format("'{}' must be a non-negative token id", index_path(path, i)),
                    "prompt");
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

void parse_prompt(const Json& body, ParsedRequest& r) {
  const Json* p = find_field(body, "prompt");
  if (!p) throw_invalid("'prompt' is required", "prompt");
  const Json* one = p;
  if (p->is_array() && !p->empty() && (p->front().is_string() || p->front().is_array())) {
    // A batch of prompts: one per request here.
    if (p->size() != 1) throw_invalid("'prompt' may hold one prompt per request", "prompt");
    one = &p->front();
  }
  if (one->is_string()) {
    r.prompt_text = one->get<std::string>();
    if (r.prompt_text.empty()) throw_invalid("'prompt' must not be empty", "prompt");
  } else if (one->is_array()) {
    r.prompt_ids = parse_ids(*one, "prompt");
    r.prompt_is_ids = true;
    if (r.prompt_ids.empty()) throw_invalid("'prompt' must not be empty", "prompt");
  } else {
    throw_invalid(fmt::format("'prompt' must be a string or an array of token ids, got {}",
                              json_type_name(*one)),
                  "prompt");
  }
}

class CompletionsEncoder final : public StreamEncoder {
 public:
  CompletionsEncoder(const ParsedRequest& r, const ResponseMeta& m)
      : include_usage_(r.include_usage), meta_(m) {}

  void begin(const Usage&, std::string&) override {}

  void event(const recipe::ParserEvent& e, std::string& out) override {
    if (e.type == recipe::ParserEvent::Type::kContentDelta && !e.text.empty())
      out += chunk(e.text, nullptr);
  }

  void end(const Completion& c, std::string& out) override {
    out += chunk("", openai_finish_reason(c.stop));
    detail::append_openai_stream_end(base(), c.usage, include_usage_, out);
  }

  void fail(const ApiError& e, std::string& out) override {
    detail::append_openai_stream_error(e, out);
  }

 private:
  Json base() const {
    return Json{{"id", meta_.id},
                {"object", "text_completion"},
                {"created", meta_.created},
                {"model", meta_.model}};
  }
  std::string chunk(const std::string& text, const char* finish_reason) const {
    Json j = base();
    Json choice = {{"index", 0}, {"text", text}, {"logprobs", nullptr}};
    choice["finish_reason"] = finish_reason ? Json(finish_reason) : Json(nullptr);
    j["choices"] = Json::array({std::move(choice)});
    if (include_usage_) j["usage"] = nullptr;
    return sse_data(j);
  }

  bool include_usage_;
  ResponseMeta meta_;
};

}  // namespace

ParsedRequest parse_completions(const Json& body, const ParseLimits& limits) {
  ParsedRequest r;
  r.api = Api::kCompletions;
  r.model = detail::require_model(body);
  r.stream = get_bool(body, "stream").value_or(false);
  if (const Json* so = get_object(body, "stream_options")) {
    r.include_usage = get_bool(*so, "include_usage", "stream_options").value_or(false);
  }
  parse_prompt(body, r);
  r.parse_tool_calls = false;
  if (auto n = get_integer(body, "n"); n && *n != 1) throw_invalid("'n' must be 1", "n");
  if (auto b = get_integer(body, "best_of"); b && *b != 1)
    throw_invalid("'best_of' must be 1", "best_of");
  if (auto echo = get_bool(body, "echo"); echo && *echo)
    throw_invalid("'echo' is not supported yet", "echo");
  if (find_field(body, "suffix")) throw_invalid("'suffix' is not supported", "suffix");
  if (find_field(body, "logprobs")) throw_invalid("'logprobs' is not supported yet", "logprobs");
  // The OpenAI default for this endpoint is 16 tokens.
  r.gen.max_tokens = detail::get_max_tokens(body, "max_tokens", limits).value_or(16);
  r.gen.stop = get_stop_list(body, "stop", limits.max_stop_sequences);
  r.gen.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
  detail::parse_openai_sampling(body, r.gen.sampling);
  return r;
}

namespace detail {

std::unique_ptr<StreamEncoder> make_completions_encoder(const ParsedRequest& r,
                                                        const ResponseMeta& m) {
  return std::make_unique<CompletionsEncoder>(r, m);
}

Json completions_body(const ParsedRequest&, const ResponseMeta& m, const Completion& c) {
  Json choice = {{"index", 0},
                 {"text", c.content},
                 {"logprobs", nullptr},
                 {"finish_reason", openai_finish_reason(c.stop)}};
  Json usage = openai_usage(c.usage);
  return Json{{"id", m.id},
              {"object", "text_completion"},
              {"created", m.created},
              {"model", m.model},
              {"choices", Json::array({std::move(choice)})},
              {"usage", std::move(usage)}};
}

}  // namespace detail
}  // namespace di::protocol
