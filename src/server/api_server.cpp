#include "server/api_server.h"

#include <nlohmann/json.hpp>

#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/logging.h"
#include "protocol/api_error.h"
#include "protocol/response.h"
#include "server/prompt.h"

namespace di::server {

using protocol::Api;
using protocol::ApiError;
using protocol::ApiException;
using Clock = std::chrono::steady_clock;

namespace {

// How long a worker waits for engine events before checking that its client is still there: the
// latency of noticing a disconnect while a request is queued, and 4 wake-ups/s per waiting stream.
constexpr auto kPumpInterval = std::chrono::milliseconds(250);

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* id_prefix(Api api) {
  switch (api) {
    case Api::kChatCompletions:
      return "chatcmpl-";
    case Api::kCompletions:
      return "cmpl-";
    case Api::kResponses:
      return "resp_";
    case Api::kMessages:
      return "msg_";
  }
  return "req-";
}

Api api_of_path(const std::string& path) {
  return path.rfind("/v1/messages", 0) == 0 ? Api::kMessages : Api::kChatCompletions;
}

// One generation request in flight; released when the last copy (the stream provider's) goes away.
class InFlightSlot {
 public:
  static std::shared_ptr<InFlightSlot> try_acquire(std::atomic<int64_t>& counter, int64_t limit) {
    if (counter.fetch_add(1) >= limit) {
      counter.fetch_sub(1);
      return nullptr;
    }
    return std::shared_ptr<InFlightSlot>(new InFlightSlot(counter));
  }
  ~InFlightSlot() { counter_.fetch_sub(1); }

 private:
  explicit InFlightSlot(std::atomic<int64_t>& c) : counter_(c) {}
  std::atomic<int64_t>& counter_;
};

// How long the kernel holds a connection that has sent nothing before handing it to accept()
// anyway (TCP_DEFER_ACCEPT; the kernel rounds it to its SYN-ACK retransmit schedule); such a
// connection then has the keep-alive timeout (kKeepAliveTimeoutS) to send its request.
constexpr int kDeferAcceptS = 30;
constexpr int kKeepAliveTimeoutS = 30;

// Tunes our listening socket after cpp-httplib has bound it (it offers no hook for either):
// - The backlog: cpp-httplib listens with 5; a burst of clients then sees dropped SYNs and 1-3 s
//   retransmit delays. Linux lets listen() be called again on a listening socket to change it.
// - TCP_DEFER_ACCEPT: accept() returns a connection only once its first request bytes are there.
//   cpp-httplib 0.11 hands every accepted socket to a worker that waits for the request in
//   detail::keep_alive(): poll(10 ms) then sleep(1 ms), ~90 wake-ups/s, and hangs up without a
//   response after the keep-alive timeout. 1,000 sockets accepted at once (the load test) are 1,000
//   such loops: 187 % CPU on a 2-core machine (measured with 1,000 idle connections). That starves
//   the clients sending those requests; past a tipping point some take longer than the 30 s
//   timeout, are closed unanswered ("other side closed") and retry: the load test failed 2 of 7
//   runs here. With the kernel holding connections until they have data, a worker's first poll
//   finds its request.
void tune_listen_socket(int port, int backlog) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (dirent* ent = readdir(dir)) {
    const int fd = atoi(ent->d_name);
    if (fd <= 2) continue;
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof(addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    int bound = -1;
    if (addr.ss_family == AF_INET) bound = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    if (addr.ss_family == AF_INET6)
      bound = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    if (bound != port) continue;
    ::listen(fd, backlog);
    const int defer_s = kDeferAcceptS;
    if (setsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer_s, sizeof(defer_s)) != 0)
      DI_LOG_WARN("TCP_DEFER_ACCEPT on port {}: {}", port, std::strerror(errno));
  }
  closedir(dir);
}

// One worker per open connection: cpp-httplib serves a connection on one thread until it closes.
int num_http_threads(const ServerConfig& c) {
  return c.http_threads > 0 ? c.http_threads : c.max_concurrent_requests + 16;
}

}  // namespace

ApiServer::ApiServer(ServerConfig config, std::shared_ptr<const ServedModel> model, Engine& engine)
    : config_(std::move(config)),
      model_(std::move(model)),
      engine_(engine),
      http_(std::make_unique<httplib::Server>()) {
  const int threads = num_http_threads(config_);
  http_->new_task_queue = [threads] {
    return new httplib::ThreadPool(static_cast<size_t>(threads));
  };
  http_->set_payload_max_length(config_.max_request_bytes);
  http_->set_read_timeout(30, 0);
  http_->set_write_timeout(10, 0);
  http_->set_keep_alive_max_count(1000);
  // cpp-httplib also applies the keep-alive timeout to a new connection's *first* request; with
  // TCP_DEFER_ACCEPT (tune_listen_socket) that only matters for one that sent nothing for
  // kDeferAcceptS, and is then hung up on after this much more silence.
  http_->set_keep_alive_timeout(kKeepAliveTimeoutS);
  // cpp-httplib writes headers and body (and every SSE frame) in separate small sends; with Nagle
  // on, each waits for the peer's delayed ACK: ~40-50 ms per response and per streamed token.
  http_->set_tcp_nodelay(true);
  install_routes();
}

ApiServer::~ApiServer() = default;

Result<int> ApiServer::bind() {
  int port = config_.port;
  if (port == 0) {
    port = http_->bind_to_any_port(config_.host);
    if (port <= 0)
      return make_status(StatusCode::kUnavailable, "cannot bind {}:<any port>", config_.host);
  } else if (!http_->bind_to_port(config_.host, port)) {
    return make_status(StatusCode::kUnavailable,
                       "cannot bind {}:{} (in use, or not an address of this machine)",
                       config_.host, port);
  }
  // Connections deferred until their request arrives wait in the SYN queue, which the backlog also
  // bounds; past it the kernel answers with SYN cookies, and those connections are accepted at
  // once, without their request (2,000 load-test clients: 975 such). Room for one per worker.
  tune_listen_socket(port, std::max(config_.listen_backlog, num_http_threads(config_)));
  return port;
}

void ApiServer::run() {
  run_started_ = true;
  if (!shutting_down_.load()) http_->listen_after_bind();
  run_returned_ = true;
}

void ApiServer::shutdown() {
  if (shutting_down_.exchange(true)) return;
  const auto deadline = Clock::now() + std::chrono::milliseconds(config_.shutdown_grace_ms);
  while (metrics_.active_requests().load() > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (metrics_.active_requests().load() > 0) {
    DI_LOG_WARN("shutdown: {} requests still running after the grace period; stopping anyway",
                metrics_.active_requests().load());
  }
  // cpp-httplib's stop() is a no-op until listen_after_bind() has set up (it creates the worker
  // pool first, which takes a while with a thousand threads), so repeat it until run() has
  // returned.
  while (run_started_.load() && !run_returned_.load()) {
    http_->stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void ApiServer::reply_error(Api api, const std::string& route, const ApiError& e,
                            httplib::Response& res) {
  res.status = e.http_status;
  res.set_content(protocol::render_error(api, e), "application/json");
  metrics_.count_response(route, e.http_status);
}

void ApiServer::check_model(Api api, const std::string& requested) const {
  if (model_->accepts_name(requested)) return;
  std::string msg = fmt::format("the model '{}' does not exist; this server serves '{}'", requested,
                                model_->name);
  throw ApiException(
      ApiError::not_found(std::move(msg), api == Api::kMessages ? "" : "model_not_found"));
}

void ApiServer::install_routes() {
  // Bodies over the limit are refused before they are read, in the protocol's shape.
  http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.has_header("Content-Length")) {
      const uint64_t len =
          std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10);
      if (len > config_.max_request_bytes) {
        reply_error(
            api_of_path(req.path), req.path,
            ApiError::too_large(fmt::format("the request body is {} bytes; the limit is {} bytes",
                                            len, config_.max_request_bytes)),
            res);
        res.set_header("Connection", "close");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // One worker thread serves one connection for as long as it stays open, so idle keep-alive
  // connections (client pools, scrapers) would hold workers and delay shutdown by the keep-alive
  // timeout. Every response closes its connection; a new request costs one local TCP handshake.
  http_->set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
    res.set_header("Connection", "close");
  });
  http_->set_exception_handler(
      [this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        DI_LOG_ERROR("{} {}: {}", req.method, req.path, what);
        reply_error(api_of_path(req.path), req.path, ApiError::internal(what), res);
      });
  http_->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler already wrote an error body
    const char* what = res.status == 404   ? "no such route"
                       : res.status == 405 ? "method not allowed"
                                           : "request failed";
    ApiError e{res.status, fmt::format("{} {}: {}", req.method, req.path, what), {}, {}};
    if (res.status == 413) e = ApiError::too_large("the request body is too large");
    res.set_content(protocol::render_error(api_of_path(req.path), e), "application/json");
  });

  http_->Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) {
    handle_generate(Api::kChatCompletions, q, r);
  });
  http_->Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) {
    handle_generate(Api::kCompletions, q, r);
  });
  http_->Post("/v1/responses", [this](const httplib::Request& q, httplib::Response& r) {
    handle_generate(Api::kResponses, q, r);
  });
  http_->Post("/v1/messages", [this](const httplib::Request& q, httplib::Response& r) {
    handle_generate(Api::kMessages, q, r);
  });
  http_->Post("/v1/messages/count_tokens", [this](const httplib::Request& q, httplib::Response& r) {
    handle_count_tokens(q, r);
  });
  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    protocol::Json m = {{"id", model_->name},
                        {"object", "model"},
                        {"created", model_->created},
                        {"owned_by", "deepinfer"},
                        {"max_model_len", engine_.max_model_len()}};
    res.set_content(protocol::dump_json(
                        protocol::Json{{"object", "list"}, {"data", protocol::Json::array({m})}}),
                    "application/json");
    metrics_.count_response("/v1/models", 200);
  });
  // GET /health?integrity=1 also recomputes every scheduler / KV-cache invariant from scratch
  // (Engine::check_integrity) and answers 500 with the violated invariant when one fails.
  http_->Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
    if (const std::string fatal = engine_.fatal_error(); !fatal.empty()) {
      res.status = 503;  // a router takes this engine out; serve exits for a restart
      res.set_content(nlohmann::json{{"status", "error"}, {"error", fatal}}.dump(),
                      "application/json");
      return;
    }
    const bool ok = !shutting_down_.load();
    if (ok && req.get_param_value("integrity") == "1") {
      try {
        engine_.check_integrity();
        res.set_content(R"({"status":"ok","integrity":"ok"})", "application/json");
      } catch (const std::exception& e) {
        res.status = 500;
        res.set_content(nlohmann::json{{"status", "error"}, {"integrity", e.what()}}.dump(),
                        "application/json");
      }
      return;
    }
    res.status = ok ? 200 : 503;
    res.set_content(ok ? R"({"status":"ok"})" : R"({"status":"shutting_down"})",
                    "application/json");
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.render(engine_.stats()), "text/plain; version=0.0.4");
  });
}

void ApiServer::handle_count_tokens(const httplib::Request& req, httplib::Response& res) {
  try {
    protocol::ParsedRequest pr = protocol::parse_count_tokens(protocol::parse_body(req.body));
    check_model(Api::kMessages, pr.model);
    const auto ids = build_prompt(*model_, pr);
    res.set_content(protocol::render_count_tokens(static_cast<int64_t>(ids.size())),
                    "application/json");
    metrics_.count_response(req.path, 200);
  } catch (const ApiException& e) {
    reply_error(Api::kMessages, req.path, e.error(), res);
  }
}

void ApiServer::handle_generate(Api api, const httplib::Request& req, httplib::Response& res) {
  const auto arrival = Clock::now();
  const std::string route = req.path;
  try {
    if (shutting_down_.load())
      throw ApiException(ApiError::unavailable("the server is shutting down"));
    protocol::Json body = protocol::parse_body(req.body);
    PreparedRequest prep;
    prep.arrival = arrival;
    switch (api) {
      case Api::kChatCompletions:
        prep.request = protocol::parse_chat_completions(body, config_.parse_limits);
        break;
      case Api::kCompletions:
        prep.request = protocol::parse_completions(body, config_.parse_limits);
        break;
      case Api::kResponses:
        prep.request = protocol::parse_responses(body, config_.parse_limits);
        break;
      case Api::kMessages:
        prep.request = protocol::parse_messages(body, config_.parse_limits);
        break;
    }
    check_model(api, prep.request.model);
    prep.prompt = build_prompt(*model_, prep.request);
    prep.max_tokens = protocol::resolve_output_budget(
        prep.request.gen.max_tokens, default_max_tokens(*model_, prep.request),
        static_cast<int64_t>(prep.prompt.size()), engine_.max_model_len());
    auto slot =
        InFlightSlot::try_acquire(metrics_.active_requests(), config_.max_concurrent_requests);
    if (!slot) {
      throw ApiException(
          ApiError::rate_limited(fmt::format("too many concurrent requests (limit {}); retry later",
                                             config_.max_concurrent_requests)));
    }
    const bool stream = prep.request.stream;
    protocol::ResponseMeta meta{protocol::random_id(id_prefix(api)), unix_now(),
                                prep.request.model};
    auto gen =
        std::make_shared<Generation>(model_, engine_, metrics_, std::move(prep), std::move(meta));
    if (Status st = gen->submit(); !st.is_ok()) {
      if (st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kOutOfRange) {
        throw ApiException(ApiError::invalid_request(st.message()));
      }
      if (st.code() == StatusCode::kResourceExhausted)
        throw ApiException(ApiError::rate_limited(st.message()));
      throw ApiException(ApiError::unavailable(st.message()));
    }
    // Both modes answer through a chunked provider: it is the one place cpp-httplib lets us notice
    // a client that went away (is_writable / a failing write) and abort its request. A
    // non-streaming body is written once, when generation ends.
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Request-Id", gen->meta().id);
    res.set_chunked_content_provider(
        stream ? "text/event-stream" : "application/json",
        [gen, stream](size_t, httplib::DataSink& sink) {
          std::string out;
          const bool finished = gen->pump(kPumpInterval, out);
          if (stream && !out.empty()) {
            if (!sink.write(out.data(), out.size())) {
              gen->abort_for_disconnect();
              return false;
            }
          } else if (!sink.is_writable()) {
            gen->abort_for_disconnect();
            return false;
          }
          if (finished) {
            if (!stream) {
              const std::string body =
                  gen->error()
                      ? protocol::render_error(gen->request().api, *gen->error())
                      : protocol::render_response(gen->request(), gen->meta(), gen->completion());
              if (!sink.write(body.data(), body.size())) return false;
            }
            sink.done();
          }
          return true;
        },
        [this, gen, slot, route](bool success) {
          if (!success) gen->abort_for_disconnect();
          metrics_.count_response(route,
                                  success ? (gen->error() ? gen->error()->http_status : 200) : 499);
        });
  } catch (const ApiException& e) {
    reply_error(api, route, e.error(), res);
  }
}

}  // namespace di::server
