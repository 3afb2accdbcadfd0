#pragma once
// The one table of control tokens each model family adds to its base tokenizer.json.
//
// The npm DeepSeek V3 tokenizer.json (the base of the V3 family) has neither `<think>` / `</think>`
// (V3.1 hybrid thinking) nor `｜DSML｜` (the V3.2 / V4 tool-call markup marker, always followed by
// text such as "function_calls" or "invoke"). Variants are built by adding them after the current
// maximum id (DeepSeek V3: 128815, 128816, ...). Real V3.1+ checkpoints ship their own tokenizer.json
// with these ids fixed; always read ids from the tokenizer, never hard-code them.
//
// scripts/gen_tokenizer_refs.py mirrors this table to produce reference ids; keep them equal.
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "core/status.h"
#include "recipe/tokenizer.h"

namespace di::recipe {

enum class ModelFamily { kDeepSeekV3, kDeepSeekV31, kDeepSeekV32, kDeepSeekV4, kQwen3, kLlama3 };

struct ControlTokenAddition {
  std::string_view content;
  bool special;  // skipped by decode(skip_special = true)
};

// Tokens `family` adds to its base tokenizer, in id order.
std::span<const ControlTokenAddition> control_token_additions(ModelFamily family);

std::optional<ModelFamily> model_family_from_name(std::string_view name);  // "deepseek_v3_1", ...
std::string_view model_family_name(ModelFamily family);

// The base tokenizer plus the family's additions (tokens it already has are kept as they are).
Result<std::shared_ptr<const Tokenizer>> make_family_tokenizer(const Tokenizer& base, ModelFamily family);

}  // namespace di::recipe
