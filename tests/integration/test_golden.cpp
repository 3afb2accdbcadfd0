// Golden tests: tiny random-weight models of every architecture, with logits and greedy
// continuations produced by Hugging Face transformers (scripts/gen_goldens.py) — our CPU backend
// must match within 1e-4 relative (fp32) and produce identical greedy tokens.
#include <nlohmann/json.hpp>

#include <fstream>

#include "backend/backend.h"
#include "engine/generator.h"
#include "golden_util.h"
#include "model/model.h"

namespace di {
namespace {

using testing::golden_model_dirs;
using testing::max_rel_error;

constexpr double kLogitTolerance = 1e-4;

TEST(Golden, FixturesCoverEveryArchitecture) {
  std::set<std::string> archs;
  for (const auto& dir : golden_model_dirs()) {
    std::ifstream g(dir + "/golden.json");
    auto golden = nlohmann::json::parse(g);
    std::ifstream f(testing::golden_model_path(dir, golden.value("model_dir", "")) + "/config.json");
    auto j = nlohmann::json::parse(f);
    archs.insert(j["architectures"][0].get<std::string>());
  }
  for (const char* a : {"LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
                        "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"})
    EXPECT_TRUE(archs.count(a)) << "no golden fixture for " << a
                                << " under tests/fixtures/golden (run scripts/gen_goldens.py)";
}

class GoldenModel : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenModel, LogitsAndGreedyMatchTransformers) {
  const std::string dir = GetParam();
  std::ifstream f(dir + "/golden.json");
  auto golden = nlohmann::json::parse(f);
  auto backend = make_cpu_backend();
  auto model = load_model(testing::golden_model_path(dir, golden.value("model_dir", "")), *backend);
  const auto prompts = golden["prompts"].get<std::vector<std::vector<int32_t>>>();
  const auto logits = golden["last_logits"].get<std::vector<std::vector<float>>>();
  const auto greedy = golden["greedy"].get<std::vector<std::vector<int32_t>>>();
  ASSERT_EQ(prompts.size(), logits.size());
  ASSERT_EQ(prompts.size(), greedy.size());
  ASSERT_FALSE(prompts.empty());

  // All prompts in one batch: also checks that batching does not change anyone's result.
  std::vector<GenerateRequest> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateRequest r;
    r.prompt = prompts[i];
    r.max_tokens = static_cast<int32_t>(greedy[i].size());
    reqs.push_back(r);
  }
  Generator gen(*model, *backend, GeneratorOptions{});
  auto results = gen.generate(reqs);
  double worst = 0.0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    double err = max_rel_error(logits[i], results[i].last_prompt_logits);
    worst = std::max(worst, err);
    EXPECT_LE(err, kLogitTolerance) << dir << " prompt " << i << " (" << prompts[i].size()
                                    << " tokens): last-position logits differ";
    EXPECT_EQ(results[i].output, greedy[i]) << dir << " prompt " << i << ": greedy continuation";
  }
  std::printf("%s: max relative logit error vs HF %.2e\n", dir.c_str(), worst);
  RecordProperty("max_rel_error", std::to_string(worst));
}

std::string name_of(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = std::filesystem::path(info.param).filename().string();
  for (auto& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenModel, ::testing::ValuesIn(golden_model_dirs()), name_of);

}  // namespace
}  // namespace di
