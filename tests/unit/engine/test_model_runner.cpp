// ModelRunner on a real golden model: pool sizing and Backend::copy_blocks (every layer of a
// block, nothing else), the checks that reject malformed plans, and the decode-graph path
// (bucket choice, padding) against eager steps on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/decode_step.h"
#include "backend/profiling_backend.h"
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

// The CPU backend with a make_decode_graph that "captures" by remembering the forward and
// "replays" it eagerly on the metadata cuda::DecodeGraph replays with (pad_decode_step: bucket
// rows; unused rows: slot -1, no blocks). So ModelRunner's graph path — bucket and context-bucket
// choice, DecodeStepInputs, the padded batch, the row slice of the logits — runs in CI.
class ReplayingCpuBackend final : public ProfilingBackend {
 public:
  explicit ReplayingCpuBackend(Backend& cpu) : ProfilingBackend(cpu), cpu_(cpu) {}
  std::vector<std::pair<int32_t, int32_t>> captures;  // (bucket, max blocks per sequence)

  std::unique_ptr<DecodeStepGraph> make_decode_graph(DecodeForward forward, int32_t bucket,
                                                     int32_t max_blocks,
                                                     int32_t block_size) override {
    captures.emplace_back(bucket, max_blocks);
    return std::make_unique<Replay>(cpu_, std::move(forward), bucket, max_blocks, block_size);
  }

 private:
  struct Replay final : DecodeStepGraph {
    Replay(Backend& be, DecodeForward f, int32_t bucket, int32_t max_blocks, int32_t bs)
        : be_(be), f_(std::move(f)), bucket_(bucket), max_blocks_(max_blocks), bs_(bs) {}
    int32_t bucket() const override { return bucket_; }
    int32_t max_blocks_per_seq() const override { return max_blocks_; }
    const Tensor& run(const DecodeStepInputs& in) override {
      EXPECT_LE(static_cast<int32_t>(in.token_ids.size()), bucket_);
      const PaddedDecodeStep step = pad_decode_step(in, bucket_, max_blocks_, bs_);
      auto up = [&](const Tensor& t) { return be_.upload(t, DType::kI32); };
      PagedBatch b;
      b.positions = up(step.positions);
      b.slot_mapping = up(step.slots);
      b.qo_indptr = up(step.qo_indptr);
      b.kv_indptr = up(step.kv_indptr);
      b.kv_indices = up(step.kv_indices);
      b.kv_last_len = up(step.kv_last_len);
      b.num_seqs = bucket_;
      b.num_tokens = bucket_;
      b.max_kv_len = max_blocks_ * bs_;
      logits_ = f_(up(step.ids), b, up(step.rows));
      return logits_;
    }
    Backend& be_;
    DecodeForward f_;
    int32_t bucket_, max_blocks_, bs_;
    Tensor logits_;
  };
  Backend& cpu_;
};

// One step of `seqs` (decode: one token at `len`; prefill: tokens [0, len)), sequence i owning
// blocks [i * per_seq, (i + 1) * per_seq) of a pool of block size bs.
StepPlan make_step(const std::vector<int32_t>& lens, bool prefill, int32_t bs, int32_t per_seq,
                   int32_t vocab) {
  StepPlan plan;
  plan.paged.indptr = {0};
  for (size_t i = 0; i < lens.size(); ++i) {
    const int32_t len = lens[i];
    const int32_t first = prefill ? 0 : len, end = prefill ? len : len + 1;
    ScheduledSeq e{SeqId(static_cast<uint64_t>(i + 1)), first, end - first, 1};
    (prefill ? plan.schedule.prefills : plan.schedule.decodes).push_back(e);
    for (int32_t p = first; p < end; ++p) {
      plan.input_ids.push_back(static_cast<int32_t>((p * 31 + 7 * i + 1) % vocab));
      plan.positions.push_back(p);
      plan.paged.slot_block_ids.push_back(static_cast<int32_t>(i) * per_seq + p / bs);
      plan.paged.slot_offsets.push_back(p % bs);
    }
    const int32_t nb = (end + bs - 1) / bs;
    for (int32_t b = 0; b < nb; ++b)
      plan.paged.indices.push_back(static_cast<int32_t>(i) * per_seq + b);
    plan.paged.indptr.push_back(static_cast<int32_t>(plan.paged.indices.size()));
    plan.paged.last_len.push_back(end - (nb - 1) * bs);
  }
  return plan;
}

TEST(ModelRunner, DecodeGraphPathEqualsEagerSteps) {
  auto cpu = make_cpu_backend();
  ReplayingCpuBackend replaying(*cpu);
  auto model = load_model(model_dir(), *cpu);
  auto model_g = load_model(model_dir(), replaying);
  constexpr int32_t bs = 4, per_seq = 80;  // 320 tokens per sequence
  const int32_t vocab = static_cast<int32_t>(model->config().vocab_size);
  std::vector<int32_t> lens{5, 17, 9};  // 3 sequences: bucket 4, one padding row
  ModelRunner eager(*model, *cpu, 3 * per_seq, bs);
  ModelRunner graphed(*model_g, replaying, 3 * per_seq, bs);
  graphed.enable_decode_graphs(8, per_seq * bs);
  auto all_rows = [](const StepPlan& p) {
    std::vector<int32_t> r(p.input_ids.size());
    for (size_t i = 0; i < r.size(); ++i) r[i] = static_cast<int32_t>(i);
    return r;
  };
  auto last_rows = [&](const StepPlan& p) {
    std::vector<int32_t> r;
    int32_t at = 0;
    for (const auto& e : p.schedule.prefills) r.push_back((at += e.num_tokens) - 1);
    return r;
  };
  const StepPlan prefill = make_step(lens, true, bs, per_seq, vocab);
  const Tensor pa = eager.execute(prefill, last_rows(prefill));
  const Tensor pb = graphed.execute_on_device(prefill, last_rows(prefill));
  EXPECT_EQ(graphed.graph_steps(), 0);  // prefill stays eager
  ASSERT_EQ(pb.dim(), 2);
  ASSERT_EQ(pb.size(0), static_cast<int64_t>(lens.size()));
  ASSERT_EQ(pa.numel(), pb.numel());
  for (int step = 0; step < 6; ++step) {
    if (step == 3) lens.pop_back();  // 2 sequences from here on: bucket 2
    const StepPlan d = make_step(lens, false, bs, per_seq, vocab);
    const Tensor a = eager.execute(d, all_rows(d));
    // Odd steps leave the logits where the forward put them (device sampling): the live rows of
    // the graph's bucket-sized buffer, not its padding rows.
    const Tensor b =
        step % 2 ? graphed.execute_on_device(d, all_rows(d)) : graphed.execute(d, all_rows(d));
    ASSERT_EQ(b.dim(), 2);
    ASSERT_EQ(b.size(0), static_cast<int64_t>(lens.size()));
    ASSERT_EQ(a.numel(), b.numel());
    ASSERT_EQ(a.numel(), static_cast<int64_t>(lens.size()) * vocab);
    double max_abs = 0.0, max_diff = 0.0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      max_abs = std::max(max_abs, static_cast<double>(std::fabs(a.f32()[i])));
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(a.f32()[i] - b.f32()[i])));
    }
    EXPECT_LE(max_diff, 1e-5 * max_abs) << "decode step " << step;  // padded rows change only M
    for (int32_t& l : lens) ++l;
  }
  EXPECT_EQ(graphed.graph_steps(), 6);
  // One capture per (batch bucket, context bucket): 3 -> 4 and 2 -> 2 sequences; contexts of at
  // most 23 tokens fit the smallest context bucket (1,024 tokens = 256 blocks of 4, capped at 80).
  const std::vector<std::pair<int32_t, int32_t>> want{{4, 80}, {2, 80}};
  EXPECT_EQ(replaying.captures, want);
}

// A DP group rank replays (or captures) a step graph only on a decode step the whole group
// agreed on (GroupDecode::bucket > 0): with bucket 0 another rank prefills, every rank takes the
// throughput exchange eagerly, and a graph would hold the other exchange (on the GPU: a hang or
// mismatched collectives). A rank's own pure decode step must then run eagerly; the agreed
// bucket and context come from the group.
TEST(ModelRunner, GroupRankUsesGraphsOnlyOnAgreedDecodeSteps) {
  auto cpu = make_cpu_backend();
  ReplayingCpuBackend replaying(*cpu);
  auto model = load_model(model_dir(), replaying);
  constexpr int32_t bs = 4, per_seq = 80;
  const int32_t vocab = static_cast<int32_t>(model->config().vocab_size);
  ModelRunner runner(*model, replaying, 2 * per_seq, bs);
  runner.enable_decode_graphs(8, per_seq * bs);
  const std::vector<int32_t> lens{6, 11};
  const StepPlan d = make_step(lens, false, bs, per_seq, vocab);
  const std::vector<int32_t> rows{0, 1};
  GroupDecode other_rank_prefills;
  other_rank_prefills.member = true;  // bucket 0
  runner.execute(d, rows, other_rank_prefills);
  EXPECT_EQ(runner.graph_steps(), 0);
  EXPECT_TRUE(replaying.captures.empty());
  GroupDecode agreed;
  agreed.member = true;
  agreed.bucket = 4;      // another rank decodes 3 or 4 sequences
  agreed.max_blocks = 3;  // within the first context bucket
  runner.execute(d, rows, agreed);
  EXPECT_EQ(runner.graph_steps(), 1);
  const std::vector<std::pair<int32_t, int32_t>> want{{4, 80}};
  EXPECT_EQ(replaying.captures, want);
  runner.execute(d, rows, GroupDecode{});  // a standalone engine: its own bucket, 2
  EXPECT_EQ(runner.graph_steps(), 2);
  EXPECT_EQ(replaying.captures.size(), 2u);
}

}  // namespace
}  // namespace di
