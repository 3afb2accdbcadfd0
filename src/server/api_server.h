#pragma once
// The HTTP front of `deepinfer serve` (cpp-httplib, one worker thread per connection):
//
//   POST /v1/chat/completions  /v1/completions  /v1/responses  /v1/messages
//   /v1/messages/count_tokens GET  /v1/models  /health  /metrics
//
// Limits: bodies above max_request_bytes are 413, generation requests beyond
// max_concurrent_requests are 429 (both in the protocol's error shape). shutdown() refuses new work
// with 503, lets in-flight requests finish within the grace period, then stops listening.
#include <atomic>
#include <memory>
#include <string>

#include "core/status.h"
#include "server/generation.h"
#include "server/metrics.h"
#include "server/model_info.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace di::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                       // 0 = any free port (bind() says which)
  size_t max_request_bytes = 32u << 20;  // larger bodies: 413
  int max_concurrent_requests = 512;     // generation requests in flight; more: 429
  int http_threads = 0;                  // 0 = max_concurrent_requests + 16 (one per open stream)
  int listen_backlog = 1024;  // at least http_threads; cpp-httplib's own is 5, too few for bursts
  int shutdown_grace_ms = 30000;         // how long shutdown() waits for in-flight requests
  protocol::ParseLimits parse_limits;
};

class ApiServer {
 public:
  ApiServer(ServerConfig config, std::shared_ptr<const ServedModel> model, Engine& engine);
  ~ApiServer();

  // Binds the listening socket; returns the port.
  Result<int> bind();
  // Serves until shutdown() (from another thread, e.g. the signal watcher).
  void run();
  void shutdown();

  ServerMetrics& metrics() { return metrics_; }

 private:
  void install_routes();
  void handle_generate(protocol::Api api, const httplib::Request& req, httplib::Response& res);
  void handle_count_tokens(const httplib::Request& req, httplib::Response& res);
  void reply_error(protocol::Api api, const std::string& route, const protocol::ApiError& e,
                   httplib::Response& res);
  void check_model(protocol::Api api, const std::string& requested) const;

  ServerConfig config_;
  std::shared_ptr<const ServedModel> model_;
  Engine& engine_;
  ServerMetrics metrics_;
  std::unique_ptr<httplib::Server> http_;
  std::atomic<bool> shutting_down_{false};
  std::atomic<bool> run_started_{false};
  std::atomic<bool> run_returned_{false};
};

}  // namespace di::server
