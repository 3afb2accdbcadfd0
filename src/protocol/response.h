#pragma once
// Turning generation output into what each API sends back: one JSON body, or a stream of SSE
// frames.
//
//   auto enc = make_stream_encoder(request, meta);
//   enc->begin(usage, out);               // role chunk / response.created / message_start
//   for each parser event: enc->event(e, out);
//   enc->end(completion, out);            // finish chunk + usage + [DONE] / response.completed /
//   message_stop
//
// `out` receives complete SSE frames only, so the server may flush it at any point. An encoder
// validates its own event order (a tool-call delta for an unknown call is a DI_CHECK failure).
#include <memory>
#include <string>

#include "protocol/api_error.h"
#include "protocol/completion.h"
#include "protocol/request.h"

namespace di::protocol {

class StreamEncoder {
 public:
  virtual ~StreamEncoder() = default;
  // The prompt's usage is known (prompt_tokens; cached_tokens may still be 0).
  virtual void begin(const Usage& usage, std::string& out) = 0;
  // A delta or a tool-call start (kFinish is ignored: end() carries the outcome).
  virtual void event(const recipe::ParserEvent& e, std::string& out) = 0;
  // The final outcome: closes open blocks/items, reports the stop reason and usage, ends the
  // stream.
  virtual void end(const Completion& c, std::string& out) = 0;
  // A failure after the stream began: the API's mid-stream error frame, then the end of the stream.
  virtual void fail(const ApiError& e, std::string& out) = 0;
};

std::unique_ptr<StreamEncoder> make_stream_encoder(const ParsedRequest& request,
                                                   const ResponseMeta& meta);

// The non-streaming response body.
std::string render_response(const ParsedRequest& request, const ResponseMeta& meta,
                            const Completion& c);

// The error body in the API's shape (Anthropic for kMessages, OpenAI otherwise).
std::string render_error(Api api, const ApiError& e);

// /v1/messages/count_tokens
std::string render_count_tokens(int64_t input_tokens);

// SSE framing.
std::string sse_data(const Json& j);                          // "data: {...}\n\n"
std::string sse_event(std::string_view type, const Json& j);  // "event: type\ndata: {...}\n\n"
std::string dump_json(const Json& j);                         // compact; never throws on bad UTF-8

// Per-API pieces (one file each).
namespace detail {
std::unique_ptr<StreamEncoder> make_chat_encoder(const ParsedRequest& r, const ResponseMeta& m);
std::unique_ptr<StreamEncoder> make_completions_encoder(const ParsedRequest& r,
                                                        const ResponseMeta& m);
std::unique_ptr<StreamEncoder> make_responses_encoder(const ParsedRequest& r,
                                                      const ResponseMeta& m);
std::unique_ptr<StreamEncoder> make_messages_encoder(const ParsedRequest& r, const ResponseMeta& m);
Json chat_body(const ParsedRequest& r, const ResponseMeta& m, const Completion& c);
Json completions_body(const ParsedRequest& r, const ResponseMeta& m, const Completion& c);
Json responses_body(const ParsedRequest& r, const ResponseMeta& m, const Completion& c);
Json messages_body(const ParsedRequest& r, const ResponseMeta& m, const Completion& c);
Json openai_usage(const Usage& u);
// The last SSE events of an OpenAI chat / completions stream: the usage chunk (an empty `choices`
// on `base`, only with stream_options.include_usage) and `data: [DONE]`.
void append_openai_stream_end(Json base, const Usage& u, bool include_usage, std::string& out);
// An error event in the OpenAI error shape, then `data: [DONE]`.
void append_openai_stream_error(const ApiError& e, std::string& out);
}  // namespace detail

}  // namespace di::protocol
