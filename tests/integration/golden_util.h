#pragma once
// Helpers for the golden-model tests: locate fixtures and compare logits.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace di::testing {

inline std::string source_dir() {
  const char* s = std::getenv("DI_SOURCE_DIR");
  return s ? s : ".";
}

// The golden fixture directory tests/fixtures/golden/<name>.
inline std::string fixture(const std::string& name) {
  return source_dir() + "/tests/fixtures/golden/" + name;
}

// n token ids uniform in [0, vocab) from a fixed seed (prompts for the engine tests).
inline std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = dist(rng);
  return p;
}

// Every directory under tests/fixtures/golden holding a golden.json.
inline std::vector<std::string> golden_model_dirs() {
  std::vector<std::string> dirs;
  const auto root = std::filesystem::path(source_dir()) / "tests/fixtures/golden";
  if (!std::filesystem::exists(root)) return dirs;
  for (const auto& e : std::filesystem::directory_iterator(root))
    if (std::filesystem::exists(e.path() / "golden.json")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// The model a golden fixture describes: its "model_dir" (relative to the source root) when the
// weights live elsewhere (the shipped demo model), else the fixture directory itself.
inline std::string golden_model_path(const std::string& fixture_dir, const std::string& model_dir_field) {
  if (model_dir_field.empty()) return fixture_dir;
  return (std::filesystem::path(source_dir()) / model_dir_field).string();
}

// max |a - b| / max |a|: the relative error of a logit vector.
inline double max_rel_error(const std::vector<float>& ref, const std::vector<float>& got) {
  double max_ref = 0.0, max_diff = 0.0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    max_ref = std::max(max_ref, static_cast<double>(std::fabs(ref[i])));
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(ref[i] - got[i])));
  }
  return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}

}  // namespace di::testing
