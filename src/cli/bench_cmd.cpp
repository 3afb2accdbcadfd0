// deepinfer bench serve | sweep | engine (docs/benchmarking.md).
#include <nlohmann/json.hpp>

#include <csignal>
#include <iostream>
#include <memory>

#include "bench/engine_bench.h"
#include "bench/serve_bench.h"
#include "bench/sweep.h"
#include "cli/command.h"
#include "core/error.h"

namespace di::cli {
namespace {

using bench::ServeBenchOptions;

// Options of one `bench serve` run, shared by `bench sweep`. The strings are parsed in finish().
struct ServeArgs {
  ServeBenchOptions o;
  std::vector<std::string> goodput;
  std::string extra_body;
  bool no_ignore_eos = false;
  bool no_progress = false;

  ServeBenchOptions finish() const {
    ServeBenchOptions r = o;
    r.slo = bench::parse_slo(goodput);
    if (!extra_body.empty()) {
      r.client.extra_body = nlohmann::json::parse(extra_body, nullptr, /*allow_exceptions=*/false);
      DI_CHECK(r.client.extra_body.is_object(), "--extra-body must be a JSON object, got '{}'",
               extra_body);
    }
    r.client.ignore_eos = !no_ignore_eos;
    r.load.progress = !no_progress;
    r.load.seed = r.dataset.seed;
    return r;
  }
};

void add_serve_options(CLI::App& app, ServeArgs& a) {
  ServeBenchOptions& o = a.o;
  app.add_option("--base-url", o.client.base_url, "Server address")->capture_default_str();
  app.add_option("--endpoint", o.client.endpoint,
                 "/v1/completions (prompt) or /v1/chat/completions (messages)")
      ->capture_default_str();
  app.add_option("--model", o.client.model, "Model name to send (default: first of /v1/models)");
  app.add_option("--tokenizer", o.tokenizer_path,
                 "tokenizer.json or a model directory (default: the shipped demo model's)");
  app.add_option("--api-key", o.client.api_key, "Sent as Authorization: Bearer KEY");
  app.add_option("--dataset", o.dataset.name, "random | multiturn | agent | jsonl")
      ->check(CLI::IsMember({"random", "multiturn", "agent", "jsonl"}))
      ->capture_default_str();
  app.add_option("--dataset-path", o.dataset.path, "jsonl: the file");
  app.add_option("--num-prompts", o.dataset.num_requests,
                 "Requests to send (multiturn/agent: turns, over all sessions)")
      ->capture_default_str();
  app.add_option("--input-len", o.dataset.input_len, "random: prompt tokens")
      ->capture_default_str();
  app.add_option("--output-len", o.dataset.output_len,
                 "max_tokens of each request (and the synthetic assistant turns' length)")
      ->capture_default_str();
  app.add_option("--range-ratio", o.dataset.range_ratio,
                 "random: lengths uniform in [len*(1-r), len*(1+r)]")
      ->capture_default_str();
  app.add_option("--shared-prefix-len", o.dataset.shared_prefix_len,
                 "random: tokens of a prefix shared by every prompt")
      ->capture_default_str();
  app.add_option("--turns", o.dataset.turns, "multiturn/agent: turns per session (default 4 / 8)");
  app.add_option(
      "--context-len", o.dataset.context_len,
      "multiturn/agent: tokens of the first turn's system context (default 512 / 16384)");
  app.add_option("--turn-len", o.dataset.turn_len,
                 "multiturn/agent: new tokens per turn (default 128 / 1024, agent varies +-50%)");
  app.add_option("--request-rate", o.load.request_rate,
                 "Poisson arrivals per second (0 = all at once)")
      ->capture_default_str();
  app.add_option("--burstiness", o.load.burstiness,
                 "Gamma shape of inter-arrival gaps (1 = Poisson)")
      ->capture_default_str();
  app.add_option("--seed", o.dataset.seed, "Seed of prompts and arrivals")->capture_default_str();
  app.add_option("--num-warmups", o.num_warmups, "Short unmeasured requests first")
      ->capture_default_str();
  app.add_option("--goodput", a.goodput, "SLOs in ms: ttft:500 tpot:50 e2el:10000");
  app.add_flag("--no-ignore-eos", a.no_ignore_eos, "Do not send \"ignore_eos\": true");
  app.add_option("--temperature", o.client.temperature, "Sampling temperature")
      ->capture_default_str();
  app.add_option("--extra-body", a.extra_body, "JSON object merged into every request body");
  app.add_option("--timeout", o.client.timeout_s, "Seconds a stream may stall before failing")
      ->capture_default_str();
  app.add_option("--metrics-path", o.metrics_path,
                 "Prometheus page scraped before/after for the prefix-cache hit rate (\"\" = off)")
      ->capture_default_str();
  app.add_option("--metrics-hit-counter", o.metrics_hit_name,
                 "Counter of prefix-cache hit tokens (default: known deepinfer/vLLM/SGLang names)");
  app.add_option("--metrics-query-counter", o.metrics_query_name,
                 "Counter of prompt tokens looked up in the prefix cache");
  app.add_flag("--save-detailed", o.save_detailed, "Per-request timelines in the result JSON");
  app.add_flag("--no-progress", a.no_progress, "No progress bar on stderr");
}

struct SweepArgs {
  ServeArgs serve;
  std::string concurrency = "1,2,4,8,16,32,64";
  bench::SweepOptions sweep;
};

CommandRegistration reg(
    "bench", "Benchmarks: serve (load generator), sweep (Pareto plots), engine", [](CLI::App& app) {
      app.require_subcommand(1);
      auto serve = std::make_shared<ServeArgs>();
      auto sweep = std::make_shared<SweepArgs>();
      auto engine = std::make_shared<bench::EngineBenchOptions>();
      auto engine_batches = std::make_shared<std::string>("1,8,32");

      CLI::App* s = app.add_subcommand(
          "serve",
          "Load an OpenAI-compatible server (streaming) and report TTFT/TPOT/ITL/E2EL, "
          "throughput, goodput and prefix-cache hits");
      add_serve_options(*s, *serve);
      s->add_option("--concurrency", serve->o.load.concurrency,
                    "Requests in flight at most (0 = no cap)")
          ->capture_default_str();
      s->add_option("--result-json", serve->o.result_json, "Write the results here");

      CLI::App* w = app.add_subcommand(
          "sweep", "bench serve over a list of concurrencies; Pareto PNGs (gnuplot) and one JSON");
      add_serve_options(*w, sweep->serve);
      w->add_option("--concurrency", sweep->concurrency, "Comma-separated concurrencies")
          ->capture_default_str();
      w->add_option("--num-gpus", sweep->sweep.num_gpus, "Divide throughput by this")
          ->capture_default_str();
      w->add_option("--prompts-per-concurrency", sweep->sweep.prompts_per_concurrency,
                    "num_prompts = max(this x concurrency, --num-prompts) (0 = --num-prompts)")
          ->capture_default_str();
      w->add_option("--output-dir", sweep->sweep.output_dir, "sweep.json, run_c*.json, *.png")
          ->capture_default_str();
      w->add_option("--gnuplot", sweep->sweep.gnuplot, "gnuplot executable")->capture_default_str();
      w->add_flag(
          "!--same-seed", sweep->sweep.vary_seed,
          "Same prompts at every concurrency (later runs then hit the cache of earlier ones)");

      CLI::App* e = app.add_subcommand(
          "engine",
          "Offline engine throughput/latency (no HTTP): prefill tok/s, decode tok/s, step ms");
      e->add_option("--model", engine->model_dir,
                    "Model directory (default: the shipped demo model)");
      e->add_option("--backend", engine->backend, "cpu or cuda")->capture_default_str();
      e->add_option("--input-len", engine->input_len, "Prompt tokens per request")
          ->capture_default_str();
      e->add_option("--output-len", engine->output_len, "New tokens per request")
          ->capture_default_str();
      e->add_option("--batch-sizes", *engine_batches, "Comma-separated batch sizes")
          ->capture_default_str();
      e->add_option("--iters", engine->iters, "Timed rounds per batch size (median)")
          ->capture_default_str();
      e->add_option("--warmup-iters", engine->warmup_iters, "Untimed rounds first")
          ->capture_default_str();
      e->add_option("--block-size", engine->block_size, "KV block size")
          ->check(at_least(1))
          ->capture_default_str();
      e->add_option("--kv-cache-mb", engine->kv_cache_mb, "KV cache pool size in MiB")
          ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
          ->capture_default_str();
      e->add_option("--max-batched-tokens", engine->max_batched_tokens,
                    "Tokens per engine step (chunked prefill budget)")
          ->capture_default_str();
      e->add_option("--seed", engine->seed, "Seed of the prompt ids")->capture_default_str();
      e->add_option("--result-json", engine->result_json, "Write the results here");

      return [=]() -> int {
        std::signal(SIGPIPE, SIG_IGN);  // a server closing a stream must not kill the client
        if (s->parsed()) {
          const ServeBenchOptions o = serve->finish();
          bench::ServeBench b(o.tokenizer_path);
          nlohmann::json r = b.run(o);
          return r["metrics"]["completed"].get<int64_t>() > 0 ? 0 : 1;
        }
        if (w->parsed()) {
          bench::SweepOptions so = sweep->sweep;
          so.base = sweep->serve.finish();
          so.concurrencies = bench::parse_int_list(sweep->concurrency);
          bench::ServeBench b(so.base.tokenizer_path);
          bench::run_sweep(b, so);
          return 0;
        }
        bench::EngineBenchOptions eo = *engine;
        eo.batch_sizes = bench::parse_int_list(*engine_batches);
        std::cout << bench::format_engine_table(bench::run_engine_bench(eo));
        return 0;
      };
    });

}  // namespace
}  // namespace di::cli
