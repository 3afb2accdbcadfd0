#include "server/metrics.h"

#include <fmt/format.h>

namespace di::server {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_micros_.fetch_add(static_cast<uint64_t>(std::max(0.0, value) * 1e6),
                        std::memory_order_relaxed);
}

void Histogram::render(const std::string& name, const std::string& help, std::string& out) const {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i].load(std::memory_order_relaxed);
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  cumulative += counts_.back().load(std::memory_order_relaxed);
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, cumulative);
  out += fmt::format("{}_sum {}\n", name,
                     static_cast<double>(sum_micros_.load(std::memory_order_relaxed)) / 1e6);
  out += fmt::format("{}_count {}\n", name, cumulative);
}

namespace {
std::vector<double> latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
}
int64_t now_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

ServerMetrics::ServerMetrics()
    : ttft_(latency_buckets()), tpot_(latency_buckets()), e2e_(latency_buckets()) {}

void ServerMetrics::count_response(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(responses_mu_);
  ++responses_[{route, status}];
}

void ServerMetrics::add_generated_tokens(int64_t n) {
  generated_tokens_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
  const int64_t sec = now_seconds();
  std::lock_guard<std::mutex> lock(rate_mu_);
  auto& slot = per_second_[static_cast<size_t>(sec % static_cast<int64_t>(per_second_.size()))];
  if (slot.first != sec) slot = {sec, 0};
  slot.second += static_cast<uint64_t>(n);
}

// Tokens generated over the last kRateWindow complete seconds, per second.
double ServerMetrics::tokens_per_second() const {
  const int64_t sec = now_seconds();
  std::lock_guard<std::mutex> lock(rate_mu_);
  uint64_t total = 0;
  for (const auto& [s, n] : per_second_) {
    if (s < sec && s >= sec - kRateWindow) total += n;
  }
  return static_cast<double>(total) / kRateWindow;
}

std::string ServerMetrics::render(const EngineStats& e) const {
  std::string out;
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
  };
  auto gauge = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
  };
  out +=
      "# HELP deepinfer_http_responses_total HTTP responses by route and status code.\n"
      "# TYPE deepinfer_http_responses_total counter\n";
  {
    std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(responses_mu_));
    for (const auto& [key, n] : responses_) {
      out += fmt::format("deepinfer_http_responses_total{{route=\"{}\",status=\"{}\"}} {}\n",
                         key.first, key.second, n);
    }
  }
  counter("deepinfer_client_disconnects_total", "Requests aborted because the client went away.",
          client_disconnects_.load());
  gauge("deepinfer_requests_in_flight", "Generation requests being served by HTTP workers.",
        static_cast<double>(active_requests_.load()));
  counter("deepinfer_prompt_tokens_total", "Prompt tokens of finished requests.",
          prompt_tokens_.load());
  counter("deepinfer_generation_tokens_total", "Generated tokens streamed to clients.",
          generated_tokens_.load());
  gauge("deepinfer_generation_tokens_per_second", "Generated tokens per second over the last 10 s.",
        tokens_per_second());
  ttft_.render("deepinfer_time_to_first_token_seconds", "Request arrival to first generated token.",
               out);
  tpot_.render("deepinfer_time_per_output_token_seconds",
               "Mean time between generated tokens of a request.", out);
  e2e_.render("deepinfer_e2e_request_latency_seconds",
              "Request arrival to last byte of the response.", out);

  counter("deepinfer_engine_requests_finished_total", "Requests the engine finished.",
          e.requests_finished);
  counter("deepinfer_engine_requests_aborted_total", "Requests the engine aborted.",
          e.requests_aborted);
  counter("deepinfer_engine_prompt_tokens_total", "Prompt tokens the engine admitted.",
          e.prompt_tokens);
  counter("deepinfer_prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache.",
          e.cached_prompt_tokens);
  gauge("deepinfer_prefix_cache_hit_rate", "Prefix-cache hit tokens / prompt tokens since start.",
        e.prompt_tokens
            ? static_cast<double>(e.cached_prompt_tokens) / static_cast<double>(e.prompt_tokens)
            : 0.0);
  counter("deepinfer_engine_generation_tokens_total", "Tokens the engine generated.",
          e.generated_tokens);
  counter("deepinfer_engine_preemptions_total",
          "Requests preempted (recomputed later) for KV space.", e.preemptions);
  counter("deepinfer_engine_steps_total", "Engine steps.", e.steps);
  counter("deepinfer_engine_graph_steps_total",
          "Decode steps replayed from a captured step graph (CUDA graphs).", e.graph_steps);
  counter("deepinfer_engine_device_sample_steps_total",
          "Steps whose tokens were sampled on the device (GPU sampler) instead of the host.",
          e.device_sample_steps);
  counter("deepinfer_engine_forward_microseconds_total",
          "Engine-thread time in model forwards, up to the logits ready for the sampler (sum "
          "over ranks).",
          e.forward_us);
  counter("deepinfer_engine_graph_forward_microseconds_total",
          "The part of the forward time spent in steps replayed from step graphs (sum over ranks).",
          e.graph_forward_us);
  counter("deepinfer_engine_sample_microseconds_total",
          "Engine-thread time sampling tokens from the logits, on the host or the device (sum "
          "over ranks).",
          e.sample_us);
  counter("deepinfer_engine_group_wait_microseconds_total",
          "Time DP group ranks waited at the per-step barriers (sum over ranks).", e.group_wait_us);
  gauge("deepinfer_num_requests_waiting", "Requests queued in the engine (queue depth).",
        e.num_waiting);
  gauge("deepinfer_num_requests_running", "Requests the engine is running.", e.num_running);
  gauge("deepinfer_kv_blocks_total", "KV cache blocks in the pool.", e.kv_blocks_total);
  gauge("deepinfer_kv_blocks_used", "KV cache blocks held by requests.", e.kv_blocks_used);
  gauge("deepinfer_kv_blocks_cached", "Free KV blocks that still hold a reusable prefix.",
        e.kv_blocks_cached);
  gauge("deepinfer_kv_cache_usage_ratio", "Held KV blocks / total blocks.",
        e.kv_blocks_total ? static_cast<double>(e.kv_blocks_used) / e.kv_blocks_total : 0.0);
  if (e.dp_size > 0) {  // `serve --dp-size` (issue #8): the sums above, and per rank
    gauge("deepinfer_dp_size", "Engine ranks of the DP attention + EP group.", e.dp_size);
    counter("deepinfer_engine_padding_steps_total",
            "One-token forwards of ranks without work while another rank stepped (lockstep).",
            e.padding_steps);
    auto per_rank = [&](const char* name, const char* help, auto field) {
      out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n", name, help, name);
      for (size_t r = 0; r < e.dp_ranks.size(); ++r) {
        out += fmt::format("{}{{rank=\"{}\"}} {}\n", name, r, field(e.dp_ranks[r]));
      }
    };
    per_rank("deepinfer_dp_rank_requests_running", "Running requests on each DP rank.",
             [](const EngineStats::RankLoad& l) { return l.num_running; });
    per_rank("deepinfer_dp_rank_requests_waiting", "Queued requests on each DP rank.",
             [](const EngineStats::RankLoad& l) { return l.num_waiting; });
    per_rank("deepinfer_dp_rank_kv_blocks_used", "KV blocks held on each DP rank.",
             [](const EngineStats::RankLoad& l) { return l.kv_blocks_used; });
  }
  if (e.eplb_enabled) {  // EPLB (issue #8), only when `serve --eplb` runs a MoE model
    counter("deepinfer_eplb_rebalances_total", "Expert placements applied by EPLB.",
            e.eplb_rebalances);
    gauge("deepinfer_moe_lb",
          "Expected max/mean rank load of the MoE layers' expert placement (mean over layers).",
          e.moe_lb);
  }
  return out;
}

}  // namespace di::server
