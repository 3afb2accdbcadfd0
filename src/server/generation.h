#pragma once
// One request's life after validation, on the HTTP worker that owns it:
//
//   submit ──► engine thread ──sink──► EventChannel ──pump()──► output parser / detokenizer
//                                                                 │ content through StopChecker
//                                                                 ▼ (stop string → engine.finish)
//                                                 CompletionBuilder (+ StreamEncoder → SSE frames)
//
// The sink only queues (it runs on the engine thread and must not block); everything else runs on
// the worker in pump(). A Generation destroyed before the engine finished it aborts the request,
// so a vanished client never leaves KV blocks behind.
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "protocol/completion.h"
#include "protocol/request.h"
#include "protocol/response.h"
#include "recipe/incremental_detokenizer.h"
#include "recipe/output_parser.h"
#include "scheduler/stop_checker.h"
#include "server/metrics.h"
#include "server/model_info.h"

namespace di::server {

// Engine thread → worker. push() never blocks for long (one short lock).
class EventChannel {
 public:
  void push(const TokenEvent& e);
  // Moves queued events into `out`; waits up to `timeout` when none are queued.
  void pop_all(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<TokenEvent> queue_;
};

// A validated request turned into engine input.
struct PreparedRequest {
  protocol::ParsedRequest request;
  std::vector<int32_t> prompt;
  int64_t max_tokens = 0;
  std::chrono::steady_clock::time_point arrival;
};

class Generation {
 public:
  Generation(std::shared_ptr<const ServedModel> model, Engine& engine, ServerMetrics& metrics,
             PreparedRequest prepared, protocol::ResponseMeta meta);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // Queues the request in the engine; an error status means nothing was queued.
  Status submit();
  // Handles the engine events that arrive within `timeout`; streaming frames are appended to `out`
  // (the first call also appends the stream's opening frames). Returns true once finished.
  bool pump(std::chrono::milliseconds timeout, std::string& out);
  // The client went away: abort in the engine; later events are dropped.
  void abort_for_disconnect();

  bool done() const { return done_; }
  const std::optional<protocol::ApiError>& error() const { return error_; }
  const protocol::Completion& completion() const { return builder_.completion(); }
  const protocol::ParsedRequest& request() const { return prepared_.request; }
  const protocol::ResponseMeta& meta() const { return meta_; }

 private:
  void handle(const TokenEvent& e, std::string& out);
  void feed_token(int32_t token, std::string& out);
  void on_parser_event(const recipe::ParserEvent& e, std::string& out);
  void emit(const recipe::ParserEvent& e, std::string& out);
  void flush_stop_checker(std::string& out);
  void finalize(const TokenEvent& e, std::string& out);
  void fail(protocol::ApiError err, std::string& out);

  std::shared_ptr<const ServedModel> model_;
  Engine& engine_;
  ServerMetrics& metrics_;
  PreparedRequest prepared_;
  protocol::ResponseMeta meta_;
  RequestId id_;
  std::shared_ptr<EventChannel> channel_ = std::make_shared<EventChannel>();

  std::unique_ptr<recipe::OutputParser> parser_;         // chat-shaped APIs
  std::unique_ptr<recipe::IncrementalDetokenizer> detok_; // /v1/completions
  StopChecker stop_checker_;
  std::string content_seen_;  // content text given to the stop checker (to name the matched string)
  std::unique_ptr<protocol::StreamEncoder> encoder_;      // streaming only
  protocol::CompletionBuilder builder_;
  std::vector<recipe::ParserEvent> scratch_;
  std::vector<TokenEvent> events_;

  bool submitted_ = false;
  bool begun_ = false;
  bool done_ = false;
  bool aborted_ = false;
  bool stop_matched_ = false;
  bool in_reasoning_ = false;  // the last text event was reasoning (counts reasoning tokens)
  int64_t num_tokens_ = 0;
  int64_t num_reasoning_tokens_ = 0;
  std::chrono::steady_clock::time_point first_token_at_;
  std::chrono::steady_clock::time_point last_token_at_;
  std::optional<protocol::ApiError> error_;
};

}  // namespace di::server
