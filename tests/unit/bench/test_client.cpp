// The streaming client and the load generator over a real socket. The server here is a canned
// SSE responder on localhost (the network is the one thing tests may stand in for); the
// end-to-end test against `deepinfer serve` is tests/e2e/bench.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>

#include <atomic>
#include <mutex>
#include <thread>

#include "bench/arrivals.h"
#include "bench/load_runner.h"
#include "bench/openai_client.h"

namespace di::bench {
namespace {

using nlohmann::json;

class CannedServer {
 public:
  CannedServer() {
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      const json body = json::parse(req.body);
      {
        // Handlers run on the server's worker threads, several at once under load.
        std::lock_guard lock(mu_);
        last_body_ = body;
      }
      const int n = body.at("max_tokens").get<int>();
      const int now = in_flight_.fetch_add(1) + 1;
      int prev = max_in_flight_.load();
      while (now > prev && !max_in_flight_.compare_exchange_weak(prev, now)) {
      }
      res.set_chunked_content_provider(
          "text/event-stream", [this, n](size_t, httplib::DataSink& sink) {
            std::this_thread::sleep_for(std::chrono::milliseconds(60));  // "prefill"
            for (int i = 0; i < n; ++i) {
              if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
              // Split an event across two writes, mid-line.
              std::string ev = fmt::format(
                  "data: {}\n\n", json({{"choices", {{{"index", 0}, {"text", "t"}}}}}).dump());
              sink.write(ev.data(), 9);
              sink.write(ev.data() + 9, ev.size() - 9);
            }
            const std::string usage =
                fmt::format("data: {}\n\ndata: [DONE]\n\n",
                            json({{"choices", json::array()},
                                  {"usage",
                                   {{"prompt_tokens", 11},
                                    {"completion_tokens", n},
                                    {"prompt_tokens_details", {{"cached_tokens", 8}}}}}})
                                .dump());
            sink.write(usage.data(), usage.size());
            in_flight_.fetch_sub(1);
            sink.done();
            return true;
          });
    });
    server_.Post("/v1/chat/completions", [](const httplib::Request&, httplib::Response& res) {
      res.status = 503;
      res.set_content(R"({"error":{"message":"overloaded"}})", "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~CannedServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return fmt::format("http://127.0.0.1:{}", port_); }
  int max_in_flight() const { return max_in_flight_.load(); }
  json last_body() {
    std::lock_guard lock(mu_);
    return last_body_;
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<int> in_flight_{0}, max_in_flight_{0};
  std::mutex mu_;
  json last_body_;  // the latest request body, under mu_
};

// A port nobody listens on: bound by the kernel's choice, then closed.
int closed_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

Dataset small_dataset(int n, int max_tokens) {
  Dataset d;
  for (int i = 0; i < n; ++i) {
    BenchRequest r;
    r.session_idx = i;
    r.prompt = fmt::format("p{}", i);
    r.messages = json::array({{{"role", "user"}, {"content", r.prompt}}});
    r.prompt_tokens = 1;
    r.max_tokens = max_tokens;
    d.requests.push_back(r);
  }
  d.num_sessions = n;
  return d;
}

TEST(Client, StreamsTimelineAndUsageOverASocket) {
  CannedServer server;
  ClientOptions o;
  o.base_url = server.url();
  o.model = "m";
  OpenAiClient client(o, std::chrono::steady_clock::now());
  BenchRequest req = small_dataset(1, 4).requests[0];
  RequestRecord r;
  client.send(req, r);
  ASSERT_TRUE(r.success) << r.error_type << " " << r.error_message;
  const json body = server.last_body();
  EXPECT_EQ(body["prompt"], "p0");
  EXPECT_EQ(body["stream"], true);
  ASSERT_EQ(r.chunk_times.size(), 4u);
  EXPECT_GE(r.ttft_s(), 0.055);  // the 60 ms "prefill" (timer slack aside)
  for (size_t i = 1; i < 4; ++i) EXPECT_GE(r.chunk_times[i] - r.chunk_times[i - 1], 0.015);
  EXPECT_GE(r.e2e_s(), r.ttft_s() + 0.045);
  EXPECT_EQ(r.output_tokens, 4);
  EXPECT_EQ(r.usage_cached_tokens, 8);
  EXPECT_EQ(r.output_text, "tttt");
}

TEST(Client, HttpErrorsAndRefusedConnectionsAreTyped) {
  CannedServer server;
  ClientOptions o;
  o.base_url = server.url();
  o.endpoint = "/v1/chat/completions";
  RequestRecord r;
  OpenAiClient(o, std::chrono::steady_clock::now()).send(small_dataset(1, 4).requests[0], r);
  EXPECT_FALSE(r.success);
  EXPECT_EQ(r.error_type, "http_503");
  EXPECT_NE(r.error_message.find("overloaded"), std::string::npos);

  o.base_url = fmt::format("http://127.0.0.1:{}", closed_port());
  o.timeout_s = 5;  // a wrong classification must not hang the test for the default 600 s
  RequestRecord c;
  OpenAiClient(o, std::chrono::steady_clock::now()).send(small_dataset(1, 4).requests[0], c);
  EXPECT_FALSE(c.success);
  EXPECT_EQ(c.error_type, "connect");
}

TEST(LoadRunner, ConcurrencyCapIsHonouredAndEveryRequestIsRecorded) {
  CannedServer server;
  ClientOptions o;
  o.base_url = server.url();
  LoadOptions l;
  l.concurrency = 3;
  l.progress = false;
  const Dataset d = small_dataset(9, 3);
  LoadResult res = run_load(d, o, l, nullptr);
  ASSERT_EQ(res.records.size(), 9u);
  for (size_t i = 0; i < 9; ++i) {
    EXPECT_TRUE(res.records[i].success) << res.records[i].error_type;
    EXPECT_EQ(res.records[i].request_idx, static_cast<int64_t>(i));
  }
  EXPECT_LE(server.max_in_flight(), 3);
  EXPECT_GE(server.max_in_flight(), 2);
  // 3 waves of ~100 ms each.
  EXPECT_GE(res.duration_s, 0.25);
}

TEST(LoadRunner, RequestRateSpacesReleases) {
  CannedServer server;
  ClientOptions o;
  o.base_url = server.url();
  LoadOptions l;
  l.request_rate = 20;  // mean gap 50 ms
  l.seed = 3;
  l.progress = false;
  LoadResult res = run_load(small_dataset(12, 1), o, l, nullptr);
  const auto release = arrival_offsets(12, 20, 3);
  for (size_t i = 0; i < 12; ++i) {
    ASSERT_TRUE(res.records[i].success);
  }
  // Starts are never before their release times (records are in dataset order, releases in
  // start order, and with no cap the i-th start is the i-th release).
  std::vector<double> starts;
  for (const auto& r : res.records) starts.push_back(r.start_s);
  std::sort(starts.begin(), starts.end());
  for (size_t i = 0; i < 12; ++i) EXPECT_GE(starts[i] + 1e-3, release[i]);
}

}  // namespace
}  // namespace di::bench
