#include "recipe/control_tokens.h"

#include <array>

namespace di::recipe {
namespace {

// `<think>` is not special: R1-style outputs keep it when special tokens are skipped, and reasoning
// parsers find it by id. `｜DSML｜` is a fragment of text markup, never skipped.
constexpr std::array kThink = {ControlTokenAddition{"<think>", false}, ControlTokenAddition{"</think>", false}};
constexpr std::array kThinkDsml = {ControlTokenAddition{"<think>", false}, ControlTokenAddition{"</think>", false},
                                   ControlTokenAddition{"｜DSML｜", false}};
constexpr std::array kV4 = {ControlTokenAddition{"<think>", false}, ControlTokenAddition{"</think>", false},
                            ControlTokenAddition{"｜DSML｜", false},
                            ControlTokenAddition{"<｜latest_reminder｜>", true}};

struct FamilyInfo {
  ModelFamily family;
  std::string_view name;
  std::span<const ControlTokenAddition> additions;
};

constexpr std::array kFamilies = {
    FamilyInfo{ModelFamily::kDeepSeekV3, "deepseek_v3", {}},
    FamilyInfo{ModelFamily::kDeepSeekV31, "deepseek_v3_1", kThink},
    FamilyInfo{ModelFamily::kDeepSeekV32, "deepseek_v3_2", kThinkDsml},
    FamilyInfo{ModelFamily::kDeepSeekV4, "deepseek_v4", kV4},
    FamilyInfo{ModelFamily::kQwen3, "qwen3", {}},  // <think>, </think> are in its tokenizer.json
    FamilyInfo{ModelFamily::kLlama3, "llama3", {}},
};

const FamilyInfo& info(ModelFamily family) {
  for (const FamilyInfo& f : kFamilies) {
    if (f.family == family) return f;
  }
  DI_FAIL("unknown model family {}", static_cast<int>(family));
}

}  // namespace

std::span<const ControlTokenAddition> control_token_additions(ModelFamily family) { return info(family).additions; }

std::optional<ModelFamily> model_family_from_name(std::string_view name) {
  for (const FamilyInfo& f : kFamilies) {
    if (f.name == name) return f.family;
  }
  return std::nullopt;
}

std::string_view model_family_name(ModelFamily family) { return info(family).name; }

Result<std::shared_ptr<const Tokenizer>> make_family_tokenizer(const Tokenizer& base, ModelFamily family) {
  std::vector<AddedToken> tokens;
  for (const ControlTokenAddition& a : control_token_additions(family)) {
    AddedToken t;
    t.content = std::string(a.content);
    t.special = a.special;
    t.normalized = false;
    tokens.push_back(std::move(t));
  }
  return base.with_added_tokens(std::move(tokens));
}

}  // namespace di::recipe
