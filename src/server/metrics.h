#pragma once
// Server-side metrics, rendered as Prometheus text at /metrics together with the engine's stats.
// Counters and histograms are updated by HTTP workers (lock-free atomics); rendering reads a
// snapshot that may be a few updates stale, which Prometheus tolerates.
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace di::server {

// Cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // "# TYPE name histogram" block with _bucket{le=...}, _sum, _count.
  void render(const std::string& name, const std::string& help, std::string& out) const;

 private:
  std::vector<double> bounds_;
  std::vector<std::atomic<uint64_t>> counts_;  // per bucket (non-cumulative), last = +Inf
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_micros_{0};
};

class ServerMetrics {
 public:
  ServerMetrics();

  void count_response(const std::string& route, int status);
  void count_disconnect() { client_disconnects_.fetch_add(1, std::memory_order_relaxed); }
  void observe_ttft(double s) { ttft_.observe(s); }
  void observe_tpot(double s) { tpot_.observe(s); }
  void observe_e2e(double s) { e2e_.observe(s); }
  void add_prompt_tokens(int64_t n) { prompt_tokens_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed); }
  void add_cached_tokens(int64_t n) { cached_tokens_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed); }
  void add_generated_tokens(int64_t n);
  std::atomic<int64_t>& active_requests() { return active_requests_; }

  // Prometheus text exposition (version 0.0.4).
  std::string render(const EngineStats& engine) const;

 private:
  double tokens_per_second() const;

  std::mutex responses_mu_;
  std::map<std::pair<std::string, int>, uint64_t> responses_;  // (route, status) → count
  mutable std::mutex rate_mu_;
  // Generated tokens per whole second of the last kRateWindow seconds (a ring keyed by second).
  static constexpr int kRateWindow = 10;
  mutable std::array<std::pair<int64_t, uint64_t>, kRateWindow + 1> per_second_{};

  std::atomic<uint64_t> client_disconnects_{0};
  std::atomic<uint64_t> prompt_tokens_{0};
  std::atomic<uint64_t> cached_tokens_{0};
  std::atomic<uint64_t> generated_tokens_{0};
  std::atomic<int64_t> active_requests_{0};
  Histogram ttft_;
  Histogram tpot_;
  Histogram e2e_;
};

}  // namespace di::server
