// deepinfer generate: offline generation from token ids (or text, with a tokenizer).
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "backend/backend.h"
#include "cli/command.h"
#include "cli/eplb_flags.h"
#include "core/error.h"
#include "core/logging.h"
#include "engine/eplb_runtime.h"
#include "engine/generator.h"
#include "model/default_model.h"
#include "model/model.h"
#include "recipe/tokenizer.h"

#include <filesystem>

namespace di::cli {
namespace {

struct GenerateOptions {
  std::string model;
  std::string prompt_ids;
  std::string prompt;
  std::string backend = "cpu";
  int32_t max_tokens = 16;
  float temperature = 0.0f;
  int32_t top_k = -1;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  int32_t block_size = 64;
  int32_t prefill_chunk = 0;
  bool json = false;
  bool dump_logits = false;
  EplbOptions eplb;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DI_CHECK(used == item.size() && v >= 0 && v <= INT32_MAX,
             "--prompt-ids: '{}' is not a token id (expected comma-separated non-negative integers)", item);
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

int run_generate(const GenerateOptions& o) {
  DI_CHECK(o.max_tokens >= 0, "--max-tokens must be >= 0, got {}", o.max_tokens);
  DI_CHECK(o.temperature >= 0.0f, "--temperature must be >= 0, got {}", o.temperature);
  DI_CHECK(o.prompt.empty() || o.prompt_ids.empty(), "give either --prompt or --prompt-ids, not both");
  const std::string model_dir = o.model.empty() ? find_default_model_dir().value() : o.model;
  // Text prompts go through the model's own tokenizer: plain text only (a control-token spelling
  // stays text), after the model's BOS.
  std::shared_ptr<const recipe::Tokenizer> tokenizer;
  if (std::filesystem::exists(model_dir + "/tokenizer.json"))
    tokenizer = recipe::Tokenizer::from_file(model_dir + "/tokenizer.json").value();
  std::vector<int32_t> prompt;
  if (!o.prompt.empty()) {
    DI_CHECK(tokenizer != nullptr, "--prompt needs {}/tokenizer.json; use --prompt-ids instead", model_dir);
    auto cfg = load_model_config(model_dir).value();
    if (cfg.bos_token_id) prompt.push_back(static_cast<int32_t>(*cfg.bos_token_id));
    auto ids = tokenizer->encode_ordinary(o.prompt);
    prompt.insert(prompt.end(), ids.begin(), ids.end());
  } else {
    prompt = parse_ids(o.prompt_ids);
  }
  DI_CHECK(!prompt.empty(), "give a prompt with --prompt TEXT or --prompt-ids 1,2,3");
  auto backend = make_backend(o.backend);
  auto t0 = std::chrono::steady_clock::now();
  auto model = load_model(model_dir, *backend);
  auto t1 = std::chrono::steady_clock::now();
  GeneratorOptions gopts;
  gopts.block_size = o.block_size;
  gopts.prefill_chunk = o.prefill_chunk;
  std::unique_ptr<EplbRuntime> eplb;
  if (o.eplb.enabled) {
    eplb = std::make_unique<EplbRuntime>(*model, *backend, o.eplb);
    gopts.eplb = eplb.get();
  }
  Generator gen(*model, *backend, gopts);
  GenerateRequest req;
  req.prompt = prompt;
  req.max_tokens = o.max_tokens;
  req.temperature = o.temperature;
  req.top_k = o.top_k;
  req.top_p = o.top_p;
  req.min_p = o.min_p;
  req.seed = o.seed;
  auto results = gen.generate({req});
  auto t2 = std::chrono::steady_clock::now();
  if (eplb) {
    DI_LOG_INFO("EPLB: {} rebalances, {} expert copies, moe_lb {:.3f}", eplb->stats().rebalances,
                eplb->stats().experts_moved, eplb->stats().moe_lb);
  }
  const auto& r = results.at(0);
  if (o.json) {
    nlohmann::json j;
    j["prompt_ids"] = prompt;
    j["output_ids"] = r.output;
    if (o.dump_logits) j["last_prompt_logits"] = r.last_prompt_logits;
    if (tokenizer) j["text"] = tokenizer->decode(r.output);
    std::cout << j.dump() << "\n";
  } else if (tokenizer) {
    std::cout << (o.prompt.empty() ? "" : o.prompt) << tokenizer->decode(r.output) << "\n";
  } else {
    std::string s;
    for (size_t i = 0; i < r.output.size(); ++i) s += (i ? "," : "") + std::to_string(r.output[i]);
    std::cout << s << "\n";
  }
  const double load_s = std::chrono::duration<double>(t1 - t0).count();
  const double gen_s = std::chrono::duration<double>(t2 - t1).count();
  DI_LOG_INFO("loaded {} in {:.2f} s; {} prompt + {} generated tokens in {:.2f} s",
              arch_name(model->config().arch), load_s, prompt.size(), r.output.size(), gen_s);
  return 0;
}

CommandRegistration reg("generate", "Generate tokens from a model directory (offline, no server)",
                        [](CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  app.add_option("--model", o->model,
                 "Hugging Face model directory (config.json + safetensors); default: the shipped "
                 "demo model, models/deepinfer-demo-code");
  app.add_option("--prompt", o->prompt, "Prompt text, encoded with the model's tokenizer.json after its BOS");
  app.add_option("--prompt-ids", o->prompt_ids, "Prompt token ids, comma-separated: 1,2,3");
  app.add_option("--backend", o->backend, "cpu or cuda")->capture_default_str();
  app.add_option("--max-tokens", o->max_tokens, "Tokens to generate")->capture_default_str();
  app.add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-k", o->top_k, "Keep the k most likely tokens (-1 = off)")->capture_default_str();
  app.add_option("--top-p", o->top_p, "Nucleus sampling mass")->capture_default_str();
  app.add_option("--min-p", o->min_p, "Drop tokens below min_p × the top probability")->capture_default_str();
  app.add_option("--seed", o->seed, "Sampling seed")->capture_default_str();
  app.add_option("--block-size", o->block_size, "KV cache block size in tokens")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--prefill-chunk", o->prefill_chunk,
                 "Prefill in chunks of this many tokens (0 = whole)")
      ->check(at_least(0))
      ->capture_default_str();
  app.add_flag("--json", o->json, "Print {\"prompt_ids\":[...],\"output_ids\":[...]}");
  app.add_flag("--dump-logits", o->dump_logits, "With --json, add last_prompt_logits");
  add_eplb_flags(app, &o->eplb);
  return [o] { return run_generate(*o); };
});

}  // namespace
}  // namespace di::cli
