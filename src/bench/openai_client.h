#pragma once
// Streaming client for OpenAI-compatible endpoints (/v1/completions, /v1/chat/completions).
//
// The request asks for a stream with usage ("stream_options": {"include_usage": true}) so the
// last chunk carries usage.prompt_tokens, completion_tokens and
// prompt_tokens_details.cached_tokens; and for "ignore_eos": true (a vLLM / SGLang / deepinfer
// extension; other servers ignore or reject it, see --no-ignore-eos) so outputs run to max_tokens.
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "bench/dataset.h"
#include "bench/request_record.h"
#include "bench/sse_parser.h"
#include "core/status.h"

namespace di::bench {

struct ClientOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";
  std::string model;
  std::string api_key;  // sent as "Authorization: Bearer ..." when set
  bool ignore_eos = true;
  double temperature = 0.0;
  nlohmann::json extra_body = nlohmann::json::object();  // merged into every request body
  double timeout_s = 600;  // per read; a stalled stream fails as "timeout"
};

// The message-list format for chat endpoints, the single-prompt one otherwise.
PromptFormat format_of_endpoint(const std::string& endpoint);

nlohmann::json build_request_body(const BenchRequest& request, const ClientOptions& options);

// Turns the events of one streamed response into a RequestRecord's timeline and usage. Separate
// from the socket so that it can be driven by synthetic timelines in tests.
class StreamAccumulator {
 public:
  explicit StreamAccumulator(RequestRecord& record) : record_(record) {}

  // One SSE event that arrived at time `t_s` (seconds, the record's clock).
  void on_event(const SseEvent& event, double t_s);
  // The stream ended at `t_s`; decides success. Call once, after the last event.
  void finish(double t_s);

 private:
  void fail(std::string type, std::string message);

  RequestRecord& record_;
  bool done_ = false;  // "[DONE]" seen
  bool failed_ = false;
};

// One connection (keep-alive) to the server; use one per thread.
class OpenAiClient {
 public:
  using Clock = std::chrono::steady_clock;
  OpenAiClient(ClientOptions options, Clock::time_point origin);
  ~OpenAiClient();

  // Sends `request`, streams the answer and fills `record` (times relative to `origin`).
  // Never throws for network or server errors: they end up in record.error_type.
  void send(const BenchRequest& request, RequestRecord& record);

 private:
  double now_s() const;

  ClientOptions options_;
  Clock::time_point origin_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// GET base_url + path; the body on HTTP 200.
Result<std::string> http_get(const std::string& base_url, const std::string& path,
                             double timeout_s = 10);

}  // namespace di::bench
