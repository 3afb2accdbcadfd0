// KV-cache correctness on every golden model: prefill of N tokens then decode equals a full
// recompute, for N in {1, 63, 64, 65, 200}; chunked prefill equals whole prefill; a request
// alone equals the same request in a batch; block size 1 and 16 equal 64.
#include <nlohmann/json.hpp>

#include <fstream>
#include <random>

#include "backend/backend.h"
#include "engine/generator.h"
#include "golden_util.h"
#include "model/model.h"

namespace di {
namespace {

using testing::golden_model_dirs;
using testing::max_rel_error;

constexpr double kTol = 1e-4;

std::unique_ptr<Model> load_fixture_model(const std::string& dir, Backend& be) {
  std::ifstream g(dir + "/golden.json");
  auto golden = nlohmann::json::parse(g);
  return load_model(testing::golden_model_path(dir, golden.value("model_dir", "")), be);
}

std::vector<int32_t> random_prompt(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = dist(rng);
  return p;
}

// Logits at the last position of `tokens`, computed from scratch in one prefill.
std::vector<float> recompute_last_logits(Model& model, Backend& be, const std::vector<int32_t>& tokens) {
  Generator gen(model, be, GeneratorOptions{});
  GenerateRequest r;
  r.prompt = tokens;
  r.max_tokens = 0;
  return gen.generate({r}).at(0).last_prompt_logits;
}

class KvCache : public ::testing::TestWithParam<std::string> {};

TEST_P(KvCache, DecodeEqualsFullRecompute) {
  auto be = make_cpu_backend();
  auto model = load_fixture_model(GetParam(), *be);
  const int64_t vocab = model->config().vocab_size;
  for (int64_t n : {1, 63, 64, 65, 200}) {
    const int32_t steps = 4;
    GenerateRequest r;
    r.prompt = random_prompt(n, vocab, static_cast<uint32_t>(n));
    r.max_tokens = steps;
    GeneratorOptions o;
    o.keep_step_logits = true;
    Generator gen(*model, *be, o);
    auto res = gen.generate({r}).at(0);
    ASSERT_EQ(res.step_logits.size(), static_cast<size_t>(steps));
    std::vector<int32_t> seq = r.prompt;
    for (int32_t s = 0; s < steps; ++s) {
      auto full = recompute_last_logits(*model, *be, seq);
      EXPECT_LE(max_rel_error(full, res.step_logits[static_cast<size_t>(s)]), kTol)
          << GetParam() << ": N=" << n << " decode step " << s;
      seq.push_back(res.output[static_cast<size_t>(s)]);
    }
  }
}

TEST_P(KvCache, ChunkedPrefillAndBlockSizesEqualWhole) {
  auto be = make_cpu_backend();
  auto model = load_fixture_model(GetParam(), *be);
  GenerateRequest r;
  r.prompt = random_prompt(150, model->config().vocab_size, 7);
  r.max_tokens = 6;
  GeneratorOptions whole;
  auto ref = Generator(*model, *be, whole).generate({r}).at(0);
  for (auto [chunk, block] : {std::pair{13, 64}, std::pair{64, 64}, std::pair{0, 1}, std::pair{29, 16}}) {
    GeneratorOptions o;
    o.prefill_chunk = chunk;
    o.block_size = block;
    auto got = Generator(*model, *be, o).generate({r}).at(0);
    EXPECT_LE(max_rel_error(ref.last_prompt_logits, got.last_prompt_logits), kTol)
        << GetParam() << " chunk " << chunk << " block " << block;
    EXPECT_EQ(ref.output, got.output) << GetParam() << " chunk " << chunk << " block " << block;
  }
}

TEST_P(KvCache, AloneEqualsInBatch) {
  auto be = make_cpu_backend();
  auto model = load_fixture_model(GetParam(), *be);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    GenerateRequest r;
    r.prompt = random_prompt(5 + 23 * i, model->config().vocab_size, 100 + static_cast<uint32_t>(i));
    r.max_tokens = 5;
    reqs.push_back(r);
  }
  auto batched = Generator(*model, *be, GeneratorOptions{}).generate(reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto alone = Generator(*model, *be, GeneratorOptions{}).generate({reqs[i]}).at(0);
    EXPECT_EQ(alone.output, batched[i].output) << GetParam() << " request " << i;
    EXPECT_LE(max_rel_error(alone.last_prompt_logits, batched[i].last_prompt_logits), kTol);
  }
}

std::string name_of(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = std::filesystem::path(info.param).filename().string();
  for (auto& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KvCache, ::testing::ValuesIn(golden_model_dirs()), name_of);

}  // namespace
}  // namespace di
