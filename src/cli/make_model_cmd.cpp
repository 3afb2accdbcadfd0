// deepinfer make-model: writes a random-weight model in Hugging Face layout (model/make_model.h).
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>

#include "cli/command.h"
#include "core/error.h"
#include "core/logging.h"
#include "model/make_model.h"

namespace di::cli {
namespace {

struct MakeModelArgs {
  std::string arch;
  std::string preset;
  std::string out;
  uint64_t seed = 0;
  std::string dtype = "bf16";
  bool fp8 = false;
  uint64_t max_shard_mb = 4000;
  bool dry_run = false;
  bool config_only = false;
  int64_t vocab_size = 0;
  bool no_progress = false;
};

std::string presets_help() {
  std::string s = "Presets by architecture:\n";
  for (const std::string& arch : model::supported_archs()) {
    s += fmt::format("  {:<12} {}\n", arch, fmt::join(model::presets_for(arch), ", "));
  }
  s +=
      "tiny: a few hundred kB (vocab 1000, odd head counts, GQA); small: a few MB; the others have "
      "the real checkpoints' shapes (deepseek-v3-fp8-small: V3's MLA/routing/vocab in DeepSeek FP8 "
      "at hidden 2048, 6 layers + MTP, ~4.6 GB). Use --dry-run to see sizes first.";
  return s;
}

std::string format_count(int64_t n) {
  const double x = static_cast<double>(n);
  if (x >= 1e9) return fmt::format("{:.3f} B", x / 1e9);
  if (x >= 1e6) return fmt::format("{:.2f} M", x / 1e6);
  return fmt::format("{:.1f} k", x / 1e3);
}

int run_make_model(const MakeModelArgs& args) {
  model::MakeModelOptions opts;
  opts.arch = args.arch;
  opts.preset = args.preset;
  opts.out_dir = args.out;
  opts.seed = args.seed;
  opts.dtype = args.dtype == "f32" ? DType::kF32 : DType::kBF16;
  opts.fp8 = args.fp8;
  opts.max_shard_bytes = args.max_shard_mb * 1'000'000ull;
  opts.dry_run = args.dry_run;
  opts.config_only = args.config_only;
  opts.vocab_size = args.vocab_size;
  opts.progress = !args.no_progress;
  if (!opts.dry_run && args.out.empty()) {
    fmt::print(stderr, "make-model: --out DIR is required (or --dry-run)\n");
    return 2;
  }
  if (auto spec = model::model_spec(opts.arch, opts.preset); !spec.is_ok()) {
    fmt::print(stderr, "make-model: {}\n", spec.status().message());
    return 2;
  }
  model::MakeModelReport r = model::make_model(opts);
  const std::string what =
      fmt::format("{} / {}{}: {} tensors, {} params, {} in {} file(s)", args.arch, args.preset,
                  r.spec.fp8 ? " (fp8)" : "", r.num_tensors, format_count(r.num_params),
                  model::format_bytes(r.data_bytes), r.shards.size());
  if (opts.dry_run) {
    fmt::print("{} (dry run, nothing written)\n", what);
    for (const auto& s : r.shards) {
      fmt::print("  {:<36} {:>6} tensors  {:>10}\n", s.file, s.num_tensors,
                 model::format_bytes(s.data_bytes));
    }
    return 0;
  }
  if (opts.config_only) {
    fmt::print("wrote the config of {} to {} (no weights: serve --random-weights)\n", what,
               args.out);
    return 0;
  }
  fmt::print("wrote {} to {} in {:.1f} s ({}/s)\n", what, args.out, r.seconds,
             model::format_bytes(static_cast<uint64_t>(static_cast<double>(r.data_bytes) /
                                                       std::max(r.seconds, 1e-6))));
  return 0;
}

CommandRegistration reg(
    "make-model", "Write a random-weight model (HF config.json + safetensors) for tests/benchmarks",
    [](CLI::App& app) {
      auto args = std::make_shared<MakeModelArgs>();
      app.add_option("--arch", args->arch, "Architecture")
          ->required()
          ->check(CLI::IsMember(model::supported_archs()));
      app.add_option("--preset", args->preset, "Size preset (see below; depends on --arch)")
          ->required();
      app.add_option("--out", args->out,
                     "Output directory (created; earlier model files replaced)");
      app.add_option("--seed", args->seed, "Seed of the weights (same seed, same bytes)")
          ->capture_default_str();
      app.add_option("--dtype", args->dtype, "Storage type of non-FP8 tensors")
          ->check(CLI::IsMember({"bf16", "f32"}))
          ->capture_default_str();
      app.add_flag("--fp8", args->fp8,
                   "Store linear weights in DeepSeek FP8 (e4m3 + 128x128 f32 weight_scale_inv)");
      app.add_option("--max-shard-mb", args->max_shard_mb,
                     "Split into model-0000K-of-0000N.safetensors above this size (MB)")
          ->check(at_least(1))
          ->capture_default_str();
      app.add_flag("--dry-run", args->dry_run,
                   "Print tensor count, size and shards; write nothing");
      app.add_flag("--config-only", args->config_only,
                   "Write config.json and generation_config.json only (for serve "
                   "--random-weights, which makes the weights on the device)");
      app.add_option("--vocab-size", args->vocab_size,
                     "Replace the preset's vocabulary size (to match a tokenizer you have)")
          ->check(at_least(1));
      app.add_flag("--no-progress", args->no_progress, "No progress bar on stderr");
      app.footer(presets_help());
      return [args] { return run_make_model(*args); };
    });

}  // namespace
}  // namespace di::cli
