#include "server/model_info.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "recipe/control_tokens.h"

namespace di::server {
namespace fs = std::filesystem;

namespace {

std::optional<nlohmann::json> read_json_file(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

std::optional<recipe::ModelFamily> model_family_of(recipe::ChatFamily f) {
  switch (f) {
    case recipe::ChatFamily::kDeepSeekV3: return recipe::ModelFamily::kDeepSeekV3;
    case recipe::ChatFamily::kDeepSeekV31: return recipe::ModelFamily::kDeepSeekV31;
    case recipe::ChatFamily::kDeepSeekV32: return recipe::ModelFamily::kDeepSeekV32;
    case recipe::ChatFamily::kDeepSeekV4: return recipe::ModelFamily::kDeepSeekV4;
    case recipe::ChatFamily::kQwen3: return recipe::ModelFamily::kQwen3;
    case recipe::ChatFamily::kLlama3: return recipe::ModelFamily::kLlama3;
  }
  return std::nullopt;
}

// tokenizer_config.json: "bos_token" is a string or {"content": ...}; "add_bos_token" defaults to
// false when absent (HF's fast tokenizers add nothing unless told).
std::optional<recipe::TokenId> bos_for_raw_prompts(const fs::path& dir, const recipe::Tokenizer& tok) {
  auto cfg = read_json_file(dir / "tokenizer_config.json");
  if (!cfg || !cfg->is_object()) return std::nullopt;
  auto add = cfg->find("add_bos_token");
  if (add == cfg->end() || !add->is_boolean() || !add->get<bool>()) return std::nullopt;
  auto bos = cfg->find("bos_token");
  if (bos == cfg->end()) return std::nullopt;
  std::string spelling;
  if (bos->is_string()) spelling = bos->get<std::string>();
  else if (bos->is_object() && bos->contains("content") && (*bos)["content"].is_string()) spelling = (*bos)["content"];
  if (spelling.empty()) return std::nullopt;
  return tok.token_to_id(spelling);
}

}  // namespace

bool ServedModel::accepts_name(const std::string& requested) const {
  if (requested == name) return true;
  for (const auto& a : aliases) {
    if (requested == a) return true;
  }
  return false;
}

Result<recipe::ChatFamily> detect_chat_family(const std::string& model_dir, const recipe::Tokenizer& tokenizer) {
  auto config = read_json_file(fs::path(model_dir) / "config.json");
  if (!config) return make_status(StatusCode::kNotFound, "{}/config.json is missing or not JSON", model_dir);
  const std::string type = config->value("model_type", "");
  if (type == "qwen3" || type == "qwen3_moe") return recipe::ChatFamily::kQwen3;
  if (type == "llama") return recipe::ChatFamily::kLlama3;
  if (type.rfind("deepseek", 0) == 0) {
    const bool dsml = tokenizer.token_to_id("｜DSML｜").has_value();
    if (dsml && tokenizer.token_to_id("<｜latest_reminder｜>")) return recipe::ChatFamily::kDeepSeekV4;
    if (dsml) return recipe::ChatFamily::kDeepSeekV32;
    if (tokenizer.token_to_id("</think>")) return recipe::ChatFamily::kDeepSeekV31;
    return recipe::ChatFamily::kDeepSeekV3;
  }
  return make_status(StatusCode::kInvalidArgument,
                     "cannot tell the chat format of model_type '{}' in {}; pass --chat-family", type, model_dir);
}

Result<std::shared_ptr<const ServedModel>> load_served_model(const ModelLoadOptions& options) {
  const fs::path dir(options.dir);
  if (!fs::is_regular_file(dir / "tokenizer.json")) {
    return make_status(StatusCode::kNotFound, "{} has no tokenizer.json (the server needs the model's tokenizer)",
                       options.dir);
  }
  auto tok = recipe::Tokenizer::from_file((dir / "tokenizer.json").string());
  if (!tok.is_ok()) return tok.status();
  auto model = std::make_shared<ServedModel>();
  model->dir = options.dir;
  model->tokenizer = tok.value();
  if (options.chat_family.empty()) {
    auto family = detect_chat_family(options.dir, *model->tokenizer);
    if (!family.is_ok()) return family.status();
    model->family = family.value();
  } else {
    try {
      model->family = recipe::parse_chat_family(options.chat_family);
    } catch (const std::exception& e) {
      return make_status(StatusCode::kInvalidArgument, "--chat-family: {}", e.what());
    }
    // A family chosen by hand may need control tokens the tokenizer lacks (a V3 tokenizer served as
    // V3.1); add them the way control_tokens.h defines.
    if (auto mf = model_family_of(model->family)) {
      auto variant = recipe::make_family_tokenizer(*model->tokenizer, *mf);
      if (!variant.is_ok()) return variant.status();
      model->tokenizer = variant.value();
    }
  }
  try {
    model->renderer = recipe::make_renderer(model->family, model->tokenizer);
  } catch (const std::exception& e) {
    return make_status(StatusCode::kInvalidArgument, "{}: {}", options.dir, e.what());
  }
  model->bos = bos_for_raw_prompts(dir, *model->tokenizer);
  std::string base = fs::path(options.dir).lexically_normal().filename().string();
  if (base.empty()) base = fs::path(options.dir).lexically_normal().parent_path().filename().string();
  model->name = options.served_name.empty() ? base : options.served_name;
  model->aliases = {options.dir, base};
  model->created = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  return std::shared_ptr<const ServedModel>(std::move(model));
}

}  // namespace di::server
