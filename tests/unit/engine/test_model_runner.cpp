// ModelRunner on a real golden model: pool sizing and Backend::copy_blocks (every layer of a
// block, nothing else), and the checks that reject malformed plans.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "engine/model_runner.h"
#include "model/model.h"

namespace di {
namespace {

std::string model_dir() {
  const char* s = std::getenv("DI_SOURCE_DIR");
  return std::string(s ? s : ".") + "/tests/fixtures/golden/deepseek_v2";
}

TEST(ModelRunner, PoolIsBlockMajorAndSizedFromTheModel) {
  auto be = make_cpu_backend();
  auto model = load_model(model_dir(), *be);
  ModelRunner runner(*model, *be, 6, 4);
  const KvLayout& l = runner.layout();
  EXPECT_EQ(l.num_blocks, 6);
  EXPECT_EQ(l.block_size, 4);
  EXPECT_EQ(l.num_layers, model->config().num_hidden_layers);
  EXPECT_EQ(l.entry_size, model->kv_entry_size());
  EXPECT_EQ(static_cast<size_t>(runner.pool().numel()), l.pool_elems());
  EXPECT_EQ(kv_block_bytes(*model, *be, 4), l.block_stride() * 4);  // f32 on the CPU
}

TEST(ModelRunner, CopyBlocksCopiesEveryLayerOfABlockAndNothingElse) {
  auto be = make_cpu_backend();
  auto model = load_model(model_dir(), *be);
  ModelRunner runner(*model, *be, 6, 4);
  const KvLayout& l = runner.layout();
  Tensor pool = runner.pool();  // shares the runner's storage
  for (int64_t i = 0; i < pool.numel(); ++i) pool.f32()[i] = static_cast<float>(i);
  std::vector<BlockCopy> copies{{BlockId(2), BlockId(5)}, {BlockId(0), BlockId(3)}};
  runner.copy_blocks(copies);
  const int64_t stride = l.block_stride();
  for (int64_t b = 0; b < l.num_blocks; ++b) {
    const int64_t src = b == 5 ? 2 : b == 3 ? 0 : b;
    for (int64_t i = 0; i < stride; ++i) {
      ASSERT_EQ(pool.f32()[b * stride + i], static_cast<float>(src * stride + i))
          << "block " << b << " element " << i;
    }
  }
  std::vector<BlockCopy> outside{{BlockId(1), BlockId(6)}};
  EXPECT_THROW(runner.copy_blocks(outside), Error);
  std::vector<BlockCopy> self{{BlockId(1), BlockId(1)}};
  EXPECT_THROW(runner.copy_blocks(self), Error);
}

TEST(ModelRunner, RejectsAnEmptyOrInconsistentPlan) {
  auto be = make_cpu_backend();
  auto model = load_model(model_dir(), *be);
  ModelRunner runner(*model, *be, 4, 4);
  StepPlan empty;
  EXPECT_THROW(runner.execute(empty, {}), Error);
  StepPlan plan;
  plan.schedule.decodes.push_back({SeqId(1), 0, 1, 1});
  plan.input_ids = {5};
  plan.positions = {0};
  plan.paged = {{0, 1}, {2}, {1}, {2}, {0}};
  std::vector<int32_t> bad_row{1};
  EXPECT_THROW(runner.execute(plan, bad_row), Error);
  std::vector<int32_t> row{0};
  Tensor logits = runner.execute(plan, row);
  EXPECT_EQ(logits.numel(), model->config().vocab_size);
}

}  // namespace
}  // namespace di
