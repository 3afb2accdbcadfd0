#include "bench/load_runner.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "bench/arrivals.h"
#include "bench/session_queue.h"
#include "core/error.h"

namespace di::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Redraws one line on stderr (a terminal) a few times a second, or prints a line per 10% of the
// requests when stderr is a file or pipe (CI logs).
class ProgressBar {
 public:
  ProgressBar(std::string label, size_t total, bool enabled)
      : label_(std::move(label)),
        total_(total),
        enabled_(enabled && total > 0),
        tty_(isatty(fileno(stderr)) != 0) {
    if (enabled_) thread_ = std::thread([this] { loop(); });
  }
  ~ProgressBar() { stop(); }

  void add(bool ok, int64_t output_tokens) {
    (ok ? ok_ : failed_).fetch_add(1);
    tokens_.fetch_add(output_tokens);
  }
  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    draw(/*final=*/true);
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    size_t last_decile = 0;
    while (!cv_.wait_for(lock, std::chrono::milliseconds(250), [this] { return stop_; })) {
      const size_t done = ok_.load() + failed_.load();
      if (tty_) {
        draw(false);
      } else if (done * 10 / total_ > last_decile) {
        last_decile = done * 10 / total_;
        draw(false);
      }
    }
  }
  void draw(bool final) {
    const size_t ok = ok_.load();
    const size_t failed = failed_.load();
    const size_t done = ok + failed;
    const double t = std::chrono::duration<double>(Clock::now() - start_).count();
    constexpr size_t kWidth = 30;
    const size_t filled = done * kWidth / total_;
    std::string bar(filled, '#');
    bar.resize(kWidth, '.');
    const std::string line = fmt::format(
        "{} [{}] {}/{} ok {} failed {} | {:.1f} s | {:.1f} output tok/s", label_, bar, done, total_,
        ok, failed, t, t > 0 ? static_cast<double>(tokens_.load()) / t : 0.0);
    if (tty_) {
      fmt::print(stderr, "\r{}\x1b[K{}", line, final ? "\n" : "");
    } else {
      fmt::print(stderr, "{}\n", line);
    }
    std::fflush(stderr);
  }

  std::string label_;
  size_t total_;
  bool enabled_;
  bool tty_;
  Clock::time_point start_ = Clock::now();
  std::atomic<size_t> ok_{0}, failed_{0};
  std::atomic<int64_t> tokens_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

LoadResult run_load(const Dataset& dataset, const ClientOptions& client, const LoadOptions& load,
                    const std::function<int32_t(const std::string&)>& count_tokens) {
  DI_CHECK(load.concurrency >= 0, "--concurrency must be >= 0, got {}", load.concurrency);
  DI_CHECK(load.request_rate >= 0, "--request-rate must be >= 0, got {}", load.request_rate);
  const size_t n = dataset.requests.size();
  LoadResult result;
  result.records.resize(n);
  if (n == 0) return result;

  std::vector<int32_t> session_of(n);
  for (size_t i = 0; i < n; ++i) session_of[i] = dataset.requests[i].session_idx;
  SessionQueue queue(std::move(session_of));
  const std::vector<double> release =
      arrival_offsets(static_cast<int64_t>(n), load.request_rate, load.seed, load.burstiness);
  const size_t num_workers = load.concurrency > 0
                                 ? std::min<size_t>(static_cast<size_t>(load.concurrency), n)
                                 : std::min<size_t>(n, 1024);

  const Clock::time_point origin = Clock::now();
  std::atomic<size_t> next_slot{0};
  ProgressBar progress(load.progress_label, n, load.progress);
  std::mutex error_mu;
  std::string worker_error;

  auto worker = [&] {
    try {
      OpenAiClient http(client, origin);
      while (true) {
        const size_t slot = next_slot.fetch_add(1);
        if (slot >= n) break;
        std::this_thread::sleep_until(origin + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(release[slot])));
        const std::optional<size_t> idx = queue.take();
        if (!idx) break;
        RequestRecord& rec = result.records[*idx];
        rec.request_idx = static_cast<int64_t>(*idx);
        try {
          http.send(dataset.requests[*idx], rec);
          if (rec.success && !rec.output_tokens_from_usage) {
            rec.output_tokens = count_tokens ? count_tokens(rec.output_text)
                                             : static_cast<int32_t>(rec.chunk_times.size());
          }
        } catch (const std::exception& e) {  // a session's later turns must still be released
          rec.success = false;
          rec.error_type = "client_exception";
          rec.error_message = e.what();
        }
        progress.add(rec.success, rec.output_tokens);
        queue.complete(*idx);
      }
    } catch (const std::exception& e) {
      std::lock_guard lock(error_mu);
      if (worker_error.empty()) worker_error = e.what();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(num_workers);
  for (size_t w = 0; w < num_workers; ++w) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  progress.stop();
  DI_CHECK(worker_error.empty(), "load generator failed: {}", worker_error);

  double first = INFINITY, last = 0;
  for (const RequestRecord& r : result.records) {
    first = std::min(first, r.start_s);
    last = std::max(last, r.end_s);
  }
  result.duration_s = std::max(last - first, 1e-9);
  return result;
}

}  // namespace di::bench
