// deepinfer serve: the OpenAI- and Anthropic-compatible HTTP server over one engine in this
// process.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "cli/command.h"
#include "cli/eplb_flags.h"
#include "core/logging.h"
#include "engine/dp_expert_transport.h"
#include "server/api_server.h"

namespace di::cli {
namespace {
namespace fs = std::filesystem;

constexpr const char* kDefaultModel = "models/deepinfer-demo-code";
int g_signal_pipe[2] = {-1, -1};

struct ServeOptions {
  std::string model;
  std::string served_name;
  std::string chat_family;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string backend = "cpu";
  int64_t kv_cache_mb = 256;
  int32_t block_size = 64;
  int32_t max_model_len = 0;
  int32_t max_batched_tokens = 8192;
  int32_t max_running = 256;
  bool no_prefix_caching = false;
  bool eager = false;
  bool random_weights = false;
  int max_concurrent_requests = 512;
  int64_t max_request_mb = 32;
  int http_threads = 0;
  double shutdown_grace_s = 30;
  EplbOptions eplb;
  std::string dp_size;  // "" = one engine; N >= 1; "auto" (CUDA: the healthy GPUs)
};

// --dp-size: "" -> 0 (one engine, no group); "N" -> N ranks; "auto" -> one rank per healthy GPU
// (CUDA backends only). Fills `devices` for CUDA; returns -1 after printing an error.
int32_t parse_dp_size(const ServeOptions& o, std::vector<int32_t>* devices) {
  if (o.dp_size.empty()) return 0;
  const bool cuda = o.backend != "cpu";
  if (o.dp_size == "auto") {
    if (!cuda) {
      std::fprintf(stderr,
                   "deepinfer serve: --dp-size auto needs --backend cuda (on the CPU give "
                   "a number of rank threads)\n");
      return -1;
    }
    std::string report;
    *devices = probe_healthy_cuda_devices(&report);
    std::printf("deepinfer serve: --dp-size auto: %s\n", report.c_str());
    if (devices->empty()) {
      std::fprintf(stderr, "deepinfer serve: --dp-size auto found no healthy GPU\n");
      return -1;
    }
    std::string used;
    for (int32_t d : *devices) used += (used.empty() ? "" : ",") + std::to_string(d);
    std::printf("deepinfer serve: DP group on GPUs %s (%zu ranks)\n", used.c_str(),
                devices->size());
    return static_cast<int32_t>(devices->size());
  }
  char* end = nullptr;
  const long n = std::strtol(o.dp_size.c_str(), &end, 10);
  if (end == o.dp_size.c_str() || *end != '\0' || n < 1 || n > 1024) {
    std::fprintf(stderr, "deepinfer serve: --dp-size must be a number >= 1 or auto, got '%s'\n",
                 o.dp_size.c_str());
    return -1;
  }
  return static_cast<int32_t>(n);
}

// The default model: ./models/..., else next to the build tree (build/bin/deepinfer →
// ../../models), else in the source tree this binary was built from.
std::string find_default_model() {
  std::vector<fs::path> candidates = {fs::current_path() / kDefaultModel};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    candidates.push_back(exe.parent_path().parent_path().parent_path() / kDefaultModel);
    candidates.push_back(exe.parent_path().parent_path() / kDefaultModel);
  }
  candidates.push_back(fs::path(__FILE__).parent_path().parent_path().parent_path() /
                       kDefaultModel);
  for (const auto& c : candidates) {
    if (fs::is_regular_file(c / "config.json")) return c.lexically_normal().string();
  }
  return {};
}

int run_serve(const ServeOptions& o) {
  std::string model_dir = o.model;
  if (model_dir.empty()) {
    model_dir = find_default_model();
    if (model_dir.empty()) {
      std::fprintf(
          stderr,
          "deepinfer serve: no --model given and the default model %s was not found (looked in the "
          "current directory, next to the build tree and in the source tree). Pass --model DIR.\n",
          kDefaultModel);
      return 2;
    }
  }
  if (!fs::is_regular_file(fs::path(model_dir) / "config.json")) {
    std::fprintf(stderr, "deepinfer serve: %s is not a model directory (no config.json)\n",
                 model_dir.c_str());
    return 2;
  }

  // SIGINT/SIGTERM: the handler only writes to a pipe (async-signal-safe); a watcher thread reads
  // it and shuts down. A handler rather than sigwait, because worker threads that exist before
  // main() (thread pools) would not have the signals blocked.
  if (pipe(g_signal_pipe) != 0) {
    std::perror("deepinfer serve: pipe");
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = [](int sig) {
    const char b = static_cast<char>(sig);
    [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &b, 1);
  };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that vanished must fail a write, not kill the server

  auto model = server::load_served_model({model_dir, o.served_name, o.chat_family});
  if (!model.is_ok()) {
    std::fprintf(stderr, "deepinfer serve: %s\n", model.status().to_string().c_str());
    return 2;
  }
  EngineConfig ec;
  ec.model_dir = model_dir;
  ec.backend = o.backend;
  ec.block_size = o.block_size;
  ec.kv_cache_bytes = o.kv_cache_mb << 20;
  ec.max_model_len = o.max_model_len;
  ec.max_batched_tokens = o.max_batched_tokens;
  ec.max_running = o.max_running;
  ec.enable_prefix_caching = !o.no_prefix_caching;
  ec.decode_graphs = !o.eager;
  ec.random_weights = o.random_weights;
  ec.eplb = o.eplb;
  ec.dp_size = parse_dp_size(o, &ec.dp_devices);
  if (ec.dp_size < 0) return 2;
  auto engine = Engine::start(ec);
  if (!engine.is_ok()) {
    std::fprintf(stderr, "deepinfer serve: %s\n", engine.status().to_string().c_str());
    return 2;
  }

  server::ServerConfig sc;
  sc.host = o.host;
  sc.port = o.port;
  sc.max_concurrent_requests = o.max_concurrent_requests;
  sc.max_request_bytes = static_cast<size_t>(o.max_request_mb) << 20;
  sc.http_threads = o.http_threads;
  sc.shutdown_grace_ms = static_cast<int>(o.shutdown_grace_s * 1000);
  server::ApiServer api(sc, model.value(), *engine.value());
  auto port = api.bind();
  if (!port.is_ok()) {
    std::fprintf(stderr, "deepinfer serve: %s\n", port.status().to_string().c_str());
    return 2;
  }

  std::thread watcher([&] {
    char sig = 0;
    while (read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (sig == 0) return;  // woken by run() returning
    DI_LOG_INFO("signal {}: finishing in-flight requests (up to {} s), then stopping", int(sig),
                o.shutdown_grace_s);
    api.shutdown();
  });
  // An engine that can no longer serve (a DP group whose NCCL communicators were aborted after a
  // GPU or rank failure) stops the server with status 75 (EX_TEMPFAIL): a supervisor
  // (scripts/ep_supervise.sh --single) probes the GPUs again and restarts it on the healthy ones.
  std::atomic<bool> serving{true};
  std::atomic<int> exit_status{0};
  std::thread fatal_watch([&] {
    while (serving.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (const std::string fatal = engine.value()->fatal_error(); !fatal.empty()) {
        DI_LOG_ERROR("the engine cannot serve any more: {}; stopping with status 75 for a restart",
                     fatal);
        exit_status = 75;
        api.shutdown();
        return;
      }
    }
  });

  const auto& m = *model.value();
  std::printf("deepinfer serve: model '%s' (%s, %s) context %d tokens\n", m.name.c_str(),
              recipe::chat_family_name(m.family), model_dir.c_str(),
              engine.value()->max_model_len());
  std::printf(
      "listening on http://%s:%d  (OpenAI base URL http://%s:%d/v1, Anthropic base URL "
      "http://%s:%d)\n",
      o.host.c_str(), port.value(), o.host.c_str(), port.value(), o.host.c_str(), port.value());
  std::fflush(stdout);
  api.run();
  // run() also returns if listening failed; wake the watcher so it can be joined.
  const char zero = 0;
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &zero, 1);
  watcher.join();
  serving = false;
  fatal_watch.join();
  DI_LOG_INFO("stopped{}", exit_status.load() != 0 ? " (engine failure: status 75)" : "");
  return exit_status.load();
}

CommandRegistration reg(
    "serve", "Serve a model over HTTP (OpenAI Chat/Completions/Responses, Anthropic Messages)",
    [](CLI::App& app) {
      auto o = std::make_shared<ServeOptions>();
      app.add_option(
          "--model", o->model,
          std::string("Model directory (config.json, safetensors, tokenizer.json); default ") +
              kDefaultModel);
      app.add_option("--served-model-name", o->served_name,
                     "Name clients put in `model` (default: the directory's base name)");
      app.add_option(
          "--chat-family", o->chat_family,
          "Chat format: deepseek_v3, deepseek_v3.1, deepseek_v3.2, deepseek_v4, qwen3, llama3 "
          "(default: detected from config.json and tokenizer.json)");
      app.add_option("--host", o->host, "Address to listen on")->capture_default_str();
      app.add_option("--port", o->port, "Port to listen on (0 = any free port, printed at start)")
          ->capture_default_str();
      app.add_option("--backend", o->backend, "cpu or cuda")->capture_default_str();
      app.add_option("--kv-cache-mb", o->kv_cache_mb,
                     "KV cache pool size in MiB (per rank with --dp-size)")
          ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
          ->capture_default_str();
      app.add_option("--block-size", o->block_size, "KV cache block size in tokens")
          ->check(at_least(1))
          ->capture_default_str();
      app.add_option(
             "--max-model-len", o->max_model_len,
             "Context length (prompt + output) in tokens; 0 = min(model's, what the KV pool holds)")
          ->capture_default_str();
      app.add_option("--max-batched-tokens", o->max_batched_tokens,
                     "Tokens per engine step (chunked prefill budget)")
          ->capture_default_str();
      app.add_option("--max-running", o->max_running,
                     "Requests the engine runs at once (more wait in its queue)")
          ->capture_default_str();
      app.add_flag("--no-prefix-caching", o->no_prefix_caching,
                   "Do not reuse KV blocks of earlier prompts");
      app.add_flag("--random-weights", o->random_weights,
                   "Benchmarks: random weights from the model directory's config.json (no "
                   "safetensors needed; filled on the GPU with --backend cuda). The tokenizer "
                   "still comes from the directory");
      app.add_flag("--eager", o->eager,
                   "Run every step eagerly: no CUDA graphs for decode steps (the CUDA backend "
                   "otherwise captures one per power-of-two batch size on first use)");
      app.add_option("--max-concurrent-requests", o->max_concurrent_requests,
                     "Generation requests in flight over HTTP; more are answered 429")
          ->capture_default_str();
      app.add_option("--max-request-mb", o->max_request_mb,
                     "Largest request body in MiB; larger ones are answered 413")
          ->capture_default_str();
      app.add_option(
             "--http-threads", o->http_threads,
             "HTTP worker threads, one per open connection (0 = max-concurrent-requests + 16)")
          ->capture_default_str();
      app.add_option("--shutdown-grace-s", o->shutdown_grace_s,
                     "On SIGINT/SIGTERM, how long in-flight requests may still run")
          ->capture_default_str();
      app.add_option(
          "--dp-size", o->dp_size,
          "DP attention + expert parallelism: N engine ranks in this process (N >= 1), each with "
          "its own model copy, KV pool, scheduler and prefix cache; requests go to the least "
          "loaded rank. With a MoE model the routed experts are split over the ranks (rank r "
          "computes experts [r*ceil(E/N), (r+1)*ceil(E/N))) and every MoE layer exchanges rows "
          "between them, so the ranks step in lockstep (a rank without work runs a one-token "
          "padding step); decode CUDA graphs are off. A dense model runs N independent ranks. "
          "--backend cpu: N threads (shared-memory exchange); --backend cuda: one GPU per rank, "
          "devices 0..N-1, NCCL exchange; auto = every visible GPU that passes a context "
          "creation and a 64 MiB allocation (printed). --kv-cache-mb, --max-running and "
          "--max-batched-tokens apply per rank. With --eplb: EPLB over the N ranks (every rank "
          "holds all N*S expert slots and computes its own S; loads summed over the group). "
          "Omit for one engine");
      add_eplb_flags(app, &o->eplb);
      return [o] { return run_serve(*o); };
    });

}  // namespace
}  // namespace di::cli
