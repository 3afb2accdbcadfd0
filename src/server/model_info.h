#pragma once
// What the server knows about the model it serves: its names, tokenizer, chat family (renderer and
// output parser) and whether raw prompts get a BOS. Loaded once at start-up from the model directory;
// immutable and shared by every HTTP worker afterwards.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "recipe/renderer.h"
#include "recipe/tokenizer.h"

namespace di::server {

struct ServedModel {
  std::string name;                  // what /v1/models lists and responses echo
  std::vector<std::string> aliases;  // other names requests may use (the directory path as given)
  std::string dir;
  recipe::ChatFamily family = recipe::ChatFamily::kDeepSeekV3;
  std::shared_ptr<const recipe::Tokenizer> tokenizer;
  std::unique_ptr<recipe::Renderer> renderer;
  std::optional<recipe::TokenId> bos;  // prepended to /v1/completions text prompts (add_bos_token)
  int64_t created = 0;                 // Unix time the server loaded the model

  bool accepts_name(const std::string& requested) const;
};

// The chat family of a model directory: config.json `model_type` picks the architecture family;
// for DeepSeek the tokenizer's control tokens tell the generation apart (｜DSML｜ + <｜latest_reminder｜>:
// V4; ｜DSML｜: V3.2; </think>: V3.1; otherwise V3).
Result<recipe::ChatFamily> detect_chat_family(const std::string& model_dir, const recipe::Tokenizer& tokenizer);

struct ModelLoadOptions {
  std::string dir;
  std::string served_name;  // "" = the directory's base name
  std::string chat_family;  // "" = detect; else a name parse_chat_family() accepts
};

Result<std::shared_ptr<const ServedModel>> load_served_model(const ModelLoadOptions& options);

}  // namespace di::server
