#include "protocol/response.h"

namespace di::protocol {

std::string dump_json(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string sse_data(const Json& j) { return "data: " + dump_json(j) + "\n\n"; }

std::string sse_event(std::string_view type, const Json& j) {
  std::string s = "event: ";
  s += type;
  s += "\ndata: ";
  s += dump_json(j);
  s += "\n\n";
  return s;
}

std::unique_ptr<StreamEncoder> make_stream_encoder(const ParsedRequest& request, const ResponseMeta& meta) {
  switch (request.api) {
    case Api::kChatCompletions: return detail::make_chat_encoder(request, meta);
    case Api::kCompletions: return detail::make_completions_encoder(request, meta);
    case Api::kResponses: return detail::make_responses_encoder(request, meta);
    case Api::kMessages: return detail::make_messages_encoder(request, meta);
  }
  return nullptr;
}

std::string render_response(const ParsedRequest& request, const ResponseMeta& meta, const Completion& c) {
  switch (request.api) {
    case Api::kChatCompletions: return dump_json(detail::chat_body(request, meta, c));
    case Api::kCompletions: return dump_json(detail::completions_body(request, meta, c));
    case Api::kResponses: return dump_json(detail::responses_body(request, meta, c));
    case Api::kMessages: return dump_json(detail::messages_body(request, meta, c));
  }
  return {};
}

std::string render_error(Api api, const ApiError& e) {
  return api == Api::kMessages ? anthropic_error_body(e) : openai_error_body(e);
}

std::string render_count_tokens(int64_t input_tokens) {
  return dump_json(Json{{"input_tokens", input_tokens}});
}

}  // namespace di::protocol
