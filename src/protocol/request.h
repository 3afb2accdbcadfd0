#pragma once
// A client request, parsed and validated, in one shape for every API: a Conversation (or a raw
// prompt for legacy Completions) plus generation settings. The server turns it into token ids and
// an EngineRequest; nothing here knows about HTTP, the tokenizer or the engine.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "protocol/json_fields.h"
#include "recipe/conversation.h"
#include "sampling/sampling_params.h"

namespace di::protocol {

enum class Api { kChatCompletions, kCompletions, kResponses, kMessages };
const char* api_name(Api api);  // "chat.completions", "completions", "responses", "messages"

struct GenerationSettings {
  sampling::SamplingParams sampling;  // temperature 1.0 unless the request says otherwise
  std::optional<int64_t> max_tokens;  // as requested; see resolve_output_budget()
  std::vector<std::string> stop;      // stop strings, matched on detokenized text by the server
  bool ignore_eos = false;            // vLLM extension: generate exactly max_tokens (load tests)
};

struct ParsedRequest {
  Api api = Api::kChatCompletions;
  std::string model;
  bool stream = false;
  bool include_usage = false;  // Chat / Completions: stream_options.include_usage

  recipe::Conversation conversation;  // every API but kCompletions
  bool parse_tool_calls = true;       // false for tool_choice "none"

  // kCompletions only: text, or token ids when prompt_is_ids.
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool prompt_is_ids = false;

  GenerationSettings gen;
  Json echo = Json::object();  // Responses: request fields the response object repeats
};

// Validation bounds that do not depend on the model.
struct ParseLimits {
  int64_t max_tokens_cap = int64_t{1} << 24;  // anything larger is a client bug, not a budget
  size_t max_stop_sequences = 16;
};

// Each throws ApiException (400) naming the offending field.
ParsedRequest parse_chat_completions(const Json& body, const ParseLimits& limits = {});
ParsedRequest parse_completions(const Json& body, const ParseLimits& limits = {});
ParsedRequest parse_responses(const Json& body, const ParseLimits& limits = {});
ParsedRequest parse_messages(const Json& body, const ParseLimits& limits = {});
// /v1/messages/count_tokens: a Messages body without max_tokens or sampling settings.
ParsedRequest parse_count_tokens(const Json& body);

// The number of tokens a request may generate, checked against the context:
//  - a prompt that fills the context is a 400 ("the prompt is N tokens; the context is M");
//  - an explicit max_tokens that does not fit next to the prompt is a 400, as OpenAI answers;
//  - without one, `default_max` clipped to what is left of the context.
int64_t resolve_output_budget(std::optional<int64_t> requested, int64_t default_max, int64_t prompt_len,
                              int64_t max_model_len);

// ---- pieces shared by the per-API parsers (request_common.cpp) ----------------------------------
namespace detail {
// "none" → kNone; minimal/low → kLow; medium; high/xhigh → kHigh; max/ultra → kMax; else 400.
recipe::ReasoningEffort parse_effort(const std::string& s, const std::string& path);
// max_tokens-like field: integer in [1, cap].
std::optional<int64_t> get_max_tokens(const Json& body, std::string_view key, const ParseLimits& limits);
// temperature/top_p/top_k/min_p/penalties/seed as OpenAI and vLLM spell them; then validate().
void parse_openai_sampling(const Json& body, sampling::SamplingParams& s);
// SamplingParams::validate() as a 400.
void validate_sampling(const sampling::SamplingParams& s);
// Text of a content value: a string, or an array of {"type": <one of text_types>, "text": ...}.
std::string content_text(const Json& content, const std::string& path,
                         std::initializer_list<std::string_view> text_types);
// A model name: required, non-empty.
std::string require_model(const Json& body);
// JSON-schema object of a tool: an object (or absent → {"type":"object","properties":{}}).
Json tool_schema(const Json* schema, const std::string& path);
}  // namespace detail

}  // namespace di::protocol
