// The absorbed MLA decode kernels against the CPU op: CudaBackend::paged_attention dispatches
// MLA-shaped decode batches (one latent head, K = V = the entry start, dv < dqk, <= 8 new tokens
// per sequence) to the cluster kernel (kernels/mla_decode_cluster.cu, default) or the tile kernel
// (kernels/mla_decode.cu); every table case runs on both. Shapes: the real 512 + 64 latent,
// the goldens' 32 + 8 (deepseek_v2 / v3 fixtures) and 64 + 16 (demo model), and 128 + 32; heads
// 1 / 3 / 5 / 16 / 20 / 128; contexts 1, 63, 64, 65, 2048; block sizes 1 / 16 / 64; ragged batches
// with an idle sequence and several new tokens per sequence; the query whole or split into
// (q_lat, q_pe) (PagedAttentionParams::q_rope); batches of 1-4 V2-Lite-shaped sequences at contexts
// 1 / 63 / 64 / 65 / 2048 / 4100 under every head split (mla_decode.h head groups 1 / 2 / 4 / 8 /
// auto: vs the CPU and bitwise vs one group); padding sequences (no blocks, as a graph bucket
// pads); the cluster kernel at 1 / 2 / 17 clusters, bitwise alone vs in a batch and with the grid
// sized for a longer context (a graph's bucket). Skipped without a GPU, except the planners.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "op_case.h"
#ifdef DI_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels/mla_decode.h"
#include "backend/cuda/kernels/mla_decode_cluster.h"
#include "backend/cuda/kernels/mla_decode_wide.h"
#endif

namespace di {
namespace {

using namespace di::testing;

// A paged batch over a shuffled pool: seqs = (cached tokens, new tokens) each; cached = -1: a
// padding sequence (no blocks, its tokens at position 0 with slot -1, as DecodeGraph pads).
struct MlaBatch {
  KvLayout layout;
  std::vector<int32_t> positions, slots, qo{0}, kv_ptr{0}, kv_idx, last;
  int32_t num_tokens = 0, max_kv = 0;

  MlaBatch(const std::vector<std::pair<int, int>>& seqs, int32_t block_size, int32_t entry) {
    int32_t blocks = 3;
    for (auto [c, n] : seqs) blocks += c < 0 ? 0 : (c + n + block_size - 1) / block_size;
    std::vector<int32_t> perm(static_cast<size_t>(blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
    size_t next = 0;
    for (auto [c, n] : seqs) {
      if (c < 0) {
        positions.insert(positions.end(), static_cast<size_t>(n), 0);
        slots.insert(slots.end(), static_cast<size_t>(n), -1);
        num_tokens += n;
        qo.push_back(num_tokens);
        kv_ptr.push_back(static_cast<int32_t>(kv_idx.size()));
        last.push_back(0);
        continue;
      }
      const int32_t len = c + n, nb = (len + block_size - 1) / block_size;
      std::vector<int32_t> table(perm.begin() + static_cast<long>(next),
                                 perm.begin() + static_cast<long>(next + static_cast<size_t>(nb)));
      next += static_cast<size_t>(nb);
      for (int32_t p = c; p < len; ++p) {
        positions.push_back(p);
        slots.push_back(table[static_cast<size_t>(p / block_size)] * block_size + p % block_size);
      }
      num_tokens += n;
      qo.push_back(num_tokens);
      kv_idx.insert(kv_idx.end(), table.begin(), table.end());
      kv_ptr.push_back(static_cast<int32_t>(kv_idx.size()));
      last.push_back(nb > 0 ? len - (nb - 1) * block_size : 0);
      max_kv = std::max(max_kv, len);
    }
    layout = KvLayout{blocks, 2, block_size, entry};
  }
  PagedBatch make(Backend& be) const {
    PagedBatch b;
    b.positions = ints(be, positions);
    b.slot_mapping = ints(be, slots);
    b.qo_indptr = ints(be, qo);
    b.kv_indptr = ints(be, kv_ptr);
    b.kv_indices = ints(be, kv_idx.empty() ? std::vector<int32_t>{0} : kv_idx);
    b.kv_last_len = ints(be, last);
    b.num_seqs = static_cast<int32_t>(last.size());
    b.num_tokens = num_tokens;
    b.max_kv_len = max_kv;
    return b;
  }
};

struct MlaCase {
  std::string label;
  int32_t heads, latent, rope, block_size;
  std::vector<std::pair<int, int>> seqs;  // (cached, new)
  std::string name() const {
    return "mla_" + label + "_h" + std::to_string(heads) + "_" + std::to_string(latent) + "x" +
           std::to_string(rope) + "_bs" + std::to_string(block_size);
  }
};

// Runs the MLA attention of layer 1 over a random pool (identical on both backends) and returns
// out [T, heads, latent] on the host. The pool's values are seeded by the sequence lengths'
// position, so a sequence sees the same cache wherever it sits in the batch.
// split_q: the same query passed as q = its latent part [T, heads, latent] and q_rope = its rope
// part [T, heads, rope] (PagedAttentionParams::q_rope, as the DeepSeek model does).
// head_n > 0: W_UV in the op as well (PagedAttentionParams::head_w, random [heads, head_n,
// latent]); returns head_out [T, heads, head_n] instead.
Tensor run_mla(Backend& be, const MlaCase& c, uint64_t seed = 31, bool split_q = false,
               int32_t head_n = 0) {
  const int32_t dqk = c.latent + c.rope, entry = dqk;
  MlaBatch s(c.seqs, c.block_size, entry);
  PagedBatch b = s.make(be);
  Tensor pool = act(be, host_random({s.layout.num_blocks, 2, c.block_size, entry}, seed));
  const Tensor q_host = host_random({s.num_tokens, c.heads, dqk}, seed + 1);
  Tensor q_lat_host = Tensor::empty({s.num_tokens, c.heads, c.latent}, DType::kF32);
  Tensor q_pe_host = Tensor::empty({s.num_tokens, c.heads, c.rope}, DType::kF32);
  for (int64_t r = 0; r < int64_t{s.num_tokens} * c.heads; ++r) {
    const float* row = q_host.f32() + r * dqk;
    std::copy(row, row + c.latent, q_lat_host.f32() + r * c.latent);
    std::copy(row + c.latent, row + dqk, q_pe_host.f32() + r * c.rope);
  }
  Tensor q = act(be, split_q ? q_lat_host : q_host);
  Tensor q_pe = act(be, q_pe_host);
  Tensor o = be.empty({s.num_tokens, c.heads, c.latent}, be.compute_dtype());
  PagedAttentionParams p;
  p.q = &q;
  p.q_rope = split_q ? &q_pe : nullptr;
  p.out = &o;
  p.pool = &pool;
  p.layout = s.layout;
  p.layer = 1;
  p.num_q_heads = c.heads;
  p.num_kv_heads = 1;
  p.head_dim_qk = dqk;
  p.head_dim_v = c.latent;
  p.k_offset = 0;
  p.v_offset = 0;
  p.kv_head_stride = 0;
  p.scale = 1.0f / std::sqrt(static_cast<float>(dqk));
  p.batch = &b;
  Tensor w, y;
  if (head_n > 0) {
    w = act(be, host_random({c.heads, head_n, c.latent}, seed + 2));
    y = be.empty({s.num_tokens, c.heads, head_n}, be.compute_dtype());
    p.head_w = &w;
    p.head_out = &y;
  }
  be.paged_attention(p);
  return be.download(head_n > 0 ? y : o);
}

std::vector<MlaCase> cases() {
  using P = std::vector<std::pair<int, int>>;
  return {
      {"ctx1", 16, 512, 64, 64, P{{0, 1}}},
      {"ctx63_64_65", 16, 512, 64, 16, P{{62, 1}, {63, 1}, {64, 1}}},
      {"ctx65_bs1", 128, 512, 64, 1, P{{64, 1}, {0, 1}}},
      {"ctx2048", 128, 512, 64, 64, P{{2047, 1}}},
      {"ctx2048_h16_bs16", 16, 512, 64, 16, P{{2047, 1}, {100, 1}}},
      {"h1", 1, 512, 64, 1, P{{64, 1}, {0, 1}, {100, 1}}},
      {"ragged", 16, 512, 64, 16, P{{2047, 1}, {5, 1}, {20, 0}, {64, 1}, {700, 1}}},
      {"multi_token", 16, 512, 64, 64, P{{100, 3}, {0, 2}, {63, 2}}},
      {"h20_multi_token", 20, 512, 64, 16, P{{90, 2}, {1, 3}}},
      {"golden_v2", 3, 32, 8, 16, P{{10, 1}, {0, 1}, {70, 1}}},
      {"golden_v3", 5, 32, 8, 1, P{{33, 1}, {64, 2}}},
      {"golden_v3_bs64", 5, 32, 8, 64, P{{130, 1}, {0, 1}}},
      {"demo", 4, 64, 16, 64, P{{65, 1}, {3, 1}, {200, 1}}},
      {"lat128", 16, 128, 32, 16, P{{300, 1}, {1, 1}, {64, 1}}},
      {"lat256", 32, 256, 64, 64, P{{129, 1}}},
      // Batch 1-4 at the head split's sizes (V2-Lite: 16 heads; auto picks 4 groups at batch 1,
      // 2 at batch 2, 1 from 4 on at ctx 2048 on 132 SMs).
      {"b1_ctx63", 16, 512, 64, 16, P{{62, 1}}},
      {"b1_ctx64", 16, 512, 64, 64, P{{63, 1}}},
      {"b1_ctx65", 16, 512, 64, 1, P{{64, 1}}},
      {"b1_ctx2048", 16, 512, 64, 64, P{{2047, 1}}},
      {"b1_ctx4100", 16, 512, 64, 16, P{{4099, 1}}},
      {"b2_ctx1_4100", 16, 512, 64, 64, P{{0, 1}, {4099, 1}}},
      {"b3_ctx2048_63_65", 16, 512, 64, 16, P{{2047, 1}, {62, 1}, {64, 1}}},
      {"b4_ctx65_2048_1_4100", 16, 512, 64, 64, P{{64, 1}, {2047, 1}, {0, 1}, {4099, 1}}},
      {"b2_multi_token", 16, 512, 64, 16, P{{2046, 2}, {63, 3}}},
      // Cluster kernel (32-entry splits, 8 per cluster): 1 cluster up to 256 entries, 2 from
      // 257, 17 at 4100 (V2-Lite at 4K); odd lengths; padding sequences (graph buckets).
      {"cl_b1_ctx256", 16, 512, 64, 64, P{{255, 1}}},
      {"cl_b1_ctx257", 16, 512, 64, 16, P{{256, 1}}},
      {"cl_b1_ctx97_bs1", 16, 512, 64, 1, P{{96, 1}}},
      {"cl_b1_ctx2049", 16, 512, 64, 64, P{{2048, 1}}},
      {"cl_padding", 16, 512, 64, 64, P{{2047, 1}, {-1, 1}, {300, 1}, {-1, 1}}},
      {"cl_b9_odd", 16, 512, 64, 16,
       P{{0, 1}, {31, 1}, {32, 1}, {96, 1}, {255, 1}, {256, 1}, {1000, 1}, {4099, 1}, {512, 1}}},
      {"cl_h128_ctx700", 128, 512, 64, 64, P{{699, 1}, {40, 1}}},
      {"cl_h20_bs1", 20, 512, 64, 1, P{{300, 1}, {2, 1}}},
  };
}

#ifdef DI_HAVE_CUDA
Backend* gpu() {
  static std::unique_ptr<Backend> be =
      cuda::cuda_available() ? make_backend("cuda") : std::unique_ptr<Backend>();
  return be.get();
}
#endif

class MlaDecode : public ::testing::TestWithParam<MlaCase> {};

#ifdef DI_HAVE_CUDA
// The GPU backend's MLA decode kernel for the next calls; kAuto again when it goes.
struct UseMlaKernel {
  explicit UseMlaKernel(cuda::MlaDecodeKernel k) { cuda_be().set_mla_decode_kernel(k); }
  ~UseMlaKernel() { cuda_be().set_mla_decode_kernel(cuda::MlaDecodeKernel::kAuto); }
  static cuda::CudaBackend& cuda_be() { return static_cast<cuda::CudaBackend&>(*gpu()); }
};

const char* kernel_name(cuda::MlaDecodeKernel k) {
  return k == cuda::MlaDecodeKernel::kCluster ? "cluster"
         : k == cuda::MlaDecodeKernel::kWide  ? "wide"
                                              : "tile";
}
constexpr cuda::MlaDecodeKernel kKernels[] = {
    cuda::MlaDecodeKernel::kCluster, cuda::MlaDecodeKernel::kWide, cuda::MlaDecodeKernel::kTile};

TEST_P(MlaDecode, MatchesCpu) {
  Backend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device";
  const MlaCase& c = GetParam();
  auto cpu = make_cpu_backend();
  const Tensor ref = run_mla(*cpu, c);
  for (cuda::MlaDecodeKernel k : kKernels) {
    UseMlaKernel use(k);
    const int64_t calls = UseMlaKernel::cuda_be().mla_cluster_calls();
    const int64_t wcalls = UseMlaKernel::cuda_be().mla_wide_calls();
    const Tensor got = run_mla(*be, c);
    const int64_t cluster_calls = UseMlaKernel::cuda_be().mla_cluster_calls() - calls;
    const int64_t wide_calls = UseMlaKernel::cuda_be().mla_wide_calls() - wcalls;
    ASSERT_EQ(ref.numel(), got.numel());
    const Metrics m = compare(ref, got);
    const bool ok = m.diff < 1e-3 && m.mismatches == 0 &&
                    (m.n > 4096 || m.max_abs <= 2e-2 * std::max(m.max_ref, 1e-3));
    std::printf("[mla] %-7s %-44s n=%-8lld diff=%.2e max_abs=%.3e max_ref=%.3e mism=%lld %s\n",
                kernel_name(k), c.name().c_str(), static_cast<long long>(m.n), m.diff, m.max_abs,
                m.max_ref, static_cast<long long>(m.mismatches), ok ? "PASS" : "FAIL");
    std::fflush(stdout);
    EXPECT_TRUE(ok) << kernel_name(k) << " " << c.name() << ": diff " << m.diff << " max_abs "
                    << m.max_abs << " (max_ref " << m.max_ref << ") non-finite " << m.mismatches
                    << " of " << m.n;
    // The path taken: the cluster / wide kernel ran exactly when asked for.
    EXPECT_EQ(cluster_calls, k == cuda::MlaDecodeKernel::kCluster ? 1 : 0) << c.name();
    EXPECT_EQ(wide_calls, k == cuda::MlaDecodeKernel::kWide ? 1 : 0) << c.name();
  }
}

// The query in two tensors (q_lat, q_pe: what the DeepSeek model passes) gives bit-identical
// rows to the concatenated query on the GPU (the kernels stage the same values) and on the CPU.
TEST_P(MlaDecode, SplitQueryEqualsConcatenated) {
  Backend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device";
  const MlaCase& c = GetParam();
  for (cuda::MlaDecodeKernel k : kKernels) {
    UseMlaKernel use(k);
    const Tensor whole = run_mla(*be, c), split = run_mla(*be, c, 31, true);
    ASSERT_EQ(whole.numel(), split.numel());
    int64_t differ = 0;
    for (int64_t i = 0; i < whole.numel(); ++i) differ += whole.f32()[i] != split.f32()[i];
    std::printf("[mla] %-7s %-44s split_q differing=%lld of %lld %s\n", kernel_name(k),
                c.name().c_str(), static_cast<long long>(differ),
                static_cast<long long>(whole.numel()), differ == 0 ? "PASS" : "FAIL");
    std::fflush(stdout);
    EXPECT_EQ(differ, 0) << kernel_name(k) << " " << c.name()
                         << ": q + q_rope differs from the concatenated query";
  }
}
#endif

// The CPU side of every case runs (shapes accepted, finite, not all zero) even without a GPU, so
// the table itself is checked where it is built.
TEST(MlaDecodeCases, CpuReferenceRuns) {
  auto cpu = make_cpu_backend();
  for (const MlaCase& c : cases()) {
    const Tensor ref = run_mla(*cpu, c);
    double max_abs = 0.0;
    for (int64_t i = 0; i < ref.numel(); ++i) {
      ASSERT_TRUE(std::isfinite(ref.f32()[i])) << c.name();
      max_abs = std::max(max_abs, static_cast<double>(std::fabs(ref.f32()[i])));
    }
    EXPECT_GT(max_abs, 0.0) << c.name();
    const Tensor split = run_mla(*cpu, c, 31, true);
    for (int64_t i = 0; i < ref.numel(); ++i)
      ASSERT_EQ(ref.f32()[i], split.f32()[i]) << c.name() << ": split query, element " << i;
  }
}

// PagedAttentionParams::head_w on the CPU: exactly attention, then head_linear.
TEST(MlaDecodeCases, CpuHeadProjectionIsAttentionThenHeadLinear) {
  auto cpu = make_cpu_backend();
  const MlaCase c{"uv", 16, 64, 16, 16, {{40, 1}, {0, 2}, {100, 1}}};
  const Tensor got = run_mla(*cpu, c, 31, true, 24);
  const Tensor att = run_mla(*cpu, c, 31, true);
  Tensor x = act(*cpu, att), w = act(*cpu, host_random({c.heads, 24, c.latent}, 33));
  Tensor y = cpu->empty({att.size(0), c.heads, 24}, DType::kF32);
  cpu->head_linear(x, w, y);
  ASSERT_EQ(got.numel(), y.numel());
  for (int64_t i = 0; i < got.numel(); ++i) ASSERT_EQ(got.f32()[i], y.f32()[i]) << i;
}

#ifdef DI_HAVE_CUDA
INSTANTIATE_TEST_SUITE_P(Table, MlaDecode, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name(); });
#endif

#ifdef DI_HAVE_CUDA
// Every head split (1 / 2 / 4 / 8 groups, or the largest power of two dividing the heads below
// it, and auto) vs the CPU op and bitwise vs one group (the old layout), on every table case.
TEST(MlaDecodeHeadSplit, EveryGroupingMatchesCpuAndEqualsOneGroupBitwise) {
  Backend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device";
  UseMlaKernel use(cuda::MlaDecodeKernel::kTile);
  auto cpu = make_cpu_backend();
  int bad = 0, n = 0;
  for (const MlaCase& c : cases()) {
    const Tensor ref = run_mla(*cpu, c);
    cuda::set_mla_head_split_override(1);
    const Tensor one = run_mla(*be, c);
    for (int32_t split : {2, 4, 8, 0}) {
      cuda::set_mla_head_split_override(split);
      const Tensor got = run_mla(*be, c), got_split_q = run_mla(*be, c, 31, true);
      const Metrics m = compare(ref, got);
      const bool cpu_ok = m.diff < 1e-3 && m.mismatches == 0 &&
                          (m.n > 4096 || m.max_abs <= 2e-2 * std::max(m.max_ref, 1e-3));
      int64_t differ = 0;
      for (int64_t i = 0; i < one.numel(); ++i)
        differ += (one.f32()[i] != got.f32()[i]) + (one.f32()[i] != got_split_q.f32()[i]);
      ++n;
      if (!cpu_ok || differ != 0) {
        ++bad;
        std::printf(
            "[mla] head_split=%d %-44s diff=%.2e max_abs=%.3e vs_one_group_differing=%lld FAIL\n",
            split, c.name().c_str(), m.diff, m.max_abs, static_cast<long long>(differ));
      }
    }
  }
  cuda::set_mla_head_split_override(-1);
  std::printf("[mla] head_split_vs_cpu_and_one_group runs=%d failed=%d %s\n", n, bad,
              bad == 0 ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_EQ(bad, 0);
}

// The planner (host only, runs without a GPU): head groups, rows per tile and the grid bound.
TEST(MlaDecodePlan, HeadGroups) {
  struct Want {
    int32_t setting, seqs, tokens, max_kv, heads, groups, rows;
  };
  const Want want[] = {
      {0, 1, 1, 2048, 16, 4, 16},    // V2-Lite batch 1: 32 splits x 4 = 128 CTAs <= 132
      {0, 1, 1, 2049, 16, 4, 16},    // 33 splits x 4 = 132
      {0, 2, 2, 2048, 16, 2, 16},    // 2 x 32 x 2 = 128
      {0, 4, 4, 2048, 16, 1, 16},    // 4 x 32 = 128 already
      {0, 1, 1, 64, 16, 4, 16},      // one split: capped at 4
      {0, 1, 1, 4100, 16, 2, 16},    // 65 splits x 2 = 130
      {0, 1, 1, 2048, 3, 1, 16},     // odd heads: one group
      {0, 1, 1, 2048, 20, 4, 16},    // 20 = 4 x 5
      {0, 1, 1, 2048, 128, 4, 32},   // V3: 32 heads per group, 32-row tiles
      {8, 1, 1, 2048, 128, 8, 16},   // forced 8: 16 heads per group, 16-row tiles
      {8, 64, 64, 2048, 16, 8, 16},  // forced: at any batch size
      {4, 1, 1, 2048, 20, 4, 16},   {8, 1, 1, 2048, 20, 4, 16},  // 8 does not divide 20: 4
      {1, 1, 1, 2048, 16, 1, 16},                                // the old layout
      {0, 2, 5, 2048, 16, 1, 32},  // 2 + 3 new tokens: 2 x ⌈48 / 32⌉ x 32 splits > 132 at 2 groups
      {2, 2, 5, 2048, 16, 2, 16},  // per group ⌈5 / 2⌉ x 8 = 24 rows < 32: 16-row tiles
  };
  for (const Want& w : want) {
    cuda::set_mla_head_split_override(w.setting);
    const cuda::MlaDecodePlan plan =
        cuda::plan_mla_decode(w.seqs, w.tokens, w.max_kv, w.heads, 512, 132);
    EXPECT_EQ(plan.head_groups, w.groups) << "setting " << w.setting << " seqs " << w.seqs << " kv "
                                          << w.max_kv << " heads " << w.heads;
    EXPECT_EQ(plan.rows_per_tile, w.rows) << "setting " << w.setting << " heads " << w.heads;
    EXPECT_EQ(w.heads % plan.head_groups, 0);
    EXPECT_GE(int64_t{plan.max_tiles},
              (int64_t{w.tokens} * w.heads + plan.rows_per_tile - 1) / plan.rows_per_tile +
                  int64_t{w.seqs} * plan.head_groups);
  }
  cuda::set_mla_head_split_override(-1);
}

// The cluster kernel's planner (host only): 16 / 32-row head tiles, 32-entry splits in clusters
// of 8 (64-entry splits below 32 tokens for contexts beyond 1024 entries), the partial workspace
// only with several clusters.
TEST(MlaDecodePlan, Clusters) {
  struct Want {
    int32_t tokens, max_kv, heads, rows, head_tiles, clusters;
  };
  const Want want[] = {
      {1, 1, 16, 16, 1, 1},     {1, 256, 16, 16, 1, 1}, {1, 257, 16, 16, 1, 2},
      {1, 1024, 16, 16, 1, 4},   // the longest short context: 32 splits of 32
      {1, 1025, 16, 16, 1, 4},   // 17 splits of 64 (3 clusters), but a 1024 at 32 needs 4
      {1, 2112, 16, 16, 1, 5},   // V2-Lite's graph bucket for ctx 2048: 33 splits of 64
      {31, 2112, 16, 16, 1, 5},  // below 32 tokens
      {1, 4100, 128, 32, 4, 9},  // 65 splits of 64
      {3, 100, 20, 32, 1, 1},   {2, 100, 3, 16, 1, 1},
  };
  cuda::set_mla_cluster_batch_split_override(1);
  // From 32 tokens: 128-entry splits for every context (17 for 2112 entries: 3 clusters), from
  // 128 tokens 256 (9 splits: 2 clusters); unless pinned to 32 (every context, 9 clusters).
  for (const int32_t tokens : {1, 31, 32, 127, 128, 256}) {
    const cuda::MlaClusterDecodePlan big =
        cuda::plan_mla_cluster_decode(tokens, 2112, 16, 576, 512);
    const int32_t want_split = tokens >= 128 ? 256 : tokens >= 32 ? 128 : 32;
    EXPECT_EQ(big.split_size, want_split) << tokens;
    EXPECT_EQ(big.long_split_size, tokens >= 32 ? want_split : 64) << tokens;
    EXPECT_EQ(big.long_split_from, tokens >= 32 ? 0x7fffffff : 1024) << tokens;
    EXPECT_EQ(big.num_clusters, tokens >= 128 ? 2 : tokens >= 32 ? 3 : 5) << tokens;
    cuda::set_mla_cluster_batch_split_override(0);
    const cuda::MlaClusterDecodePlan pinned =
        cuda::plan_mla_cluster_decode(tokens, 2112, 16, 576, 512);
    EXPECT_EQ(pinned.split_size, 32);
    EXPECT_EQ(pinned.long_split_size, 32);
    EXPECT_EQ(pinned.num_clusters, 9);
    cuda::set_mla_cluster_batch_split_override(1);
  }
  for (const Want& w : want) {
    const cuda::MlaClusterDecodePlan plan =
        cuda::plan_mla_cluster_decode(w.tokens, w.max_kv, w.heads, 576, 512);
    EXPECT_EQ(plan.split_size, 32) << "kv " << w.max_kv;
    EXPECT_EQ(plan.long_split_size, w.max_kv > 1024 ? 64 : 32) << "kv " << w.max_kv;
    EXPECT_EQ(plan.rows_per_tile, w.rows) << "heads " << w.heads;
    EXPECT_EQ(plan.head_tiles, w.head_tiles) << "heads " << w.heads;
    EXPECT_EQ(plan.num_clusters, w.clusters) << "kv " << w.max_kv;
    EXPECT_EQ(plan.num_counters, int64_t{w.tokens} * w.head_tiles * cuda::kMlaCluster);
    EXPECT_EQ(plan.partial_bytes == 0, w.clusters == 1) << "kv " << w.max_kv;
    EXPECT_LE(plan.smem_bytes, size_t{227} << 10);
  }
  // V3's 160K entries at 32 heads per tile and the pinned split of 32: 5120 splits, 640
  // clusters; 32 x 640 f32 would not fit the stage buffers (74,752 B: the planner's bound on a
  // token's clusters), so the split grows. Unpinned, only the long split may grow: short
  // contexts keep 32.
  cuda::set_mla_cluster_batch_split_override(0);
  const cuda::MlaClusterDecodePlan big = cuda::plan_mla_cluster_decode(1, 163840, 128, 576, 512);
  cuda::set_mla_cluster_batch_split_override(1);
  EXPECT_GT(big.split_size, 32);
  EXPECT_EQ(big.long_split_size, big.split_size);
  EXPECT_LE(int64_t{32} * big.num_clusters * 4, int64_t{2} * 32 * 584 * 2);
  for (const int32_t kv : {163840, 1 << 20}) {
    const cuda::MlaClusterDecodePlan v3 = cuda::plan_mla_cluster_decode(1, kv, 128, 576, 512);
    EXPECT_EQ(v3.split_size, 32) << kv;
    EXPECT_GE(v3.long_split_size, 64) << kv;
    EXPECT_LE(int64_t{32} * v3.num_clusters * 4, int64_t{2} * 32 * 584 * 2) << kv;
  }
  cuda::set_mla_cluster_batch_split_override(-1);
}

// The deferred merge's plan (batch 1 with W_UV): the same splits as the cluster plan, one
// partial (dv + 2 f32) per split and row, no counters; in batch-invariant mode the split stays 32.
TEST(MlaDecodePlan, DeferredSplitsAndPartials) {
  // The deferred plan keeps 32-entry splits up to 4096 entries (the cluster kernel's own plan:
  // up to 1024), then 64.
  struct Want {
    int32_t max_kv, heads, splits, long_split;
  };
  for (const Want w : {Want{1, 16, 1, 32}, Want{1000, 16, 32, 32}, Want{1024, 16, 32, 32},
                       Want{1025, 16, 33, 32}, Want{2112, 16, 66, 32}, Want{4096, 16, 128, 32},
                       Want{4100, 128, 128, 64}, Want{32768, 16, 512, 64}}) {
    const cuda::MlaClusterDecodePlan d = cuda::plan_mla_cluster_decode(1, w.max_kv, w.heads, 576,
                                                                       512, true);
    const cuda::MlaClusterDecodePlan c =
        cuda::plan_mla_cluster_decode(1, w.max_kv, w.heads, 576, 512);
    EXPECT_TRUE(d.defer);
    EXPECT_EQ(d.num_splits, w.splits) << "kv " << w.max_kv;
    EXPECT_EQ(d.split_size, c.split_size);
    EXPECT_EQ(d.long_split_size, w.long_split) << "kv " << w.max_kv;
    // The same split sizes as the cluster kernel's plan outside (1024, 4096]; up to 1024 the
    // same grid. (Above 4096 a token of up to 4096 entries still takes 32-entry splits: 4100
    // sizes the grid for 4096 / 32 = 128.)
    if (w.max_kv <= 1024 || w.max_kv > 4096) {
      EXPECT_EQ(d.long_split_size, c.long_split_size);
      EXPECT_EQ(d.smem_bytes, c.smem_bytes);
    }
    if (w.max_kv <= 1024) {
      EXPECT_LE(d.num_splits, c.num_clusters * cuda::kMlaCluster);
    }
    EXPECT_EQ(d.num_counters, 0);
    EXPECT_EQ(d.partial_bytes, size_t(w.splits) * size_t(w.heads) * (512 + 2) * sizeof(float));
  }
  EXPECT_LE(cuda::plan_mla_cluster_decode(1, 32768, 16, 576, 512, true).num_splits,
            cuda::kMlaMergeMaxParts);
  EXPECT_GT(cuda::plan_mla_cluster_decode(1, 33000, 16, 576, 512, true).num_splits,
            cuda::kMlaMergeMaxParts);
  cuda::set_mla_cluster_batch_split_override(0);
  EXPECT_EQ(cuda::plan_mla_cluster_decode(1, 2112, 16, 576, 512, true).num_splits, 66);
  cuda::set_mla_cluster_batch_split_override(-1);
}
#endif

#ifdef DI_HAVE_CUDA
// The wide kernel (kernels/mla_decode_wide.cu) on batches it is chosen for (>= 16 decode tokens,
// kAuto): ragged V2-Lite-shaped batches (contexts 1 .. 2100 and 4100, incl. 2048 / 2049, a
// padding sequence, several new tokens per sequence), 128 heads (8 head tiles), the goldens' 32 + 8
// (an odd k-step count); each with 4 and 8 warps as planned, 64-entry splits (up to 65 partials
// per token merged), one split per context, and the grid sized for a graph bucket's 8192 entries
// (padding splits). All vs the CPU op.
std::vector<MlaCase> wide_cases() {
  using P = std::vector<std::pair<int, int>>;
  std::mt19937 rng(5);
  P ragged;
  for (int i = 0; i < 24; ++i) ragged.push_back({static_cast<int>(rng() % 2100), 1});
  ragged[3] = {2047, 1};
  ragged[7] = {2048, 1};
  ragged[11] = {-1, 1};  // padding (graph bucket)
  ragged[13] = {0, 1};
  ragged[20] = {4099, 1};
  P multi;
  for (int i = 0; i < 10; ++i) multi.push_back({static_cast<int>(rng() % 900), 1 + i % 3});
  P h128;
  for (int i = 0; i < 16; ++i) h128.push_back({static_cast<int>(rng() % 800), 1});
  P golden;
  for (int i = 0; i < 20; ++i) golden.push_back({static_cast<int>(rng() % 300), 1});
  return {
      {"wide_ragged24", 16, 512, 64, 64, ragged},   {"wide_ragged24_bs16", 16, 512, 64, 16, ragged},
      {"wide_multi_token", 16, 512, 64, 16, multi}, {"wide_h128", 128, 512, 64, 64, h128},
      {"wide_golden_v3", 5, 32, 8, 1, golden},
  };
}

TEST(MlaDecodeWide, BatchesMatchCpuUnderEveryLayout) {
  Backend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device";
  auto& cb = UseMlaKernel::cuda_be();
  auto cpu = make_cpu_backend();
  int bad = 0, n = 0;
  for (const MlaCase& c : wide_cases()) {
    const Tensor ref = run_mla(*cpu, c);
    // (warps, split, bucket): both kernels as planned, 64-entry splits, one split per context,
    // a graph bucket's grid.
    const int32_t layouts[][3] = {{4, 0, 0},  {8, 0, 0},    {4, 64, 0},
                                  {8, 64, 0}, {8, 8192, 0}, {8, 0, 8192}};
    for (const auto& lay : layouts) {
      const int32_t warps = lay[0], split = lay[1], bucket = lay[2];
      cuda::set_mla_wide_overrides(warps, split);
      cb.set_attention_max_kv_len(bucket);
      const int64_t calls = cb.mla_wide_calls();
      const Tensor got = run_mla(*be, c, 31, warps == 8);
      const int64_t wide_calls = cb.mla_wide_calls() - calls;
      const Metrics m = compare(ref, got);
      const bool ok = wide_calls == 1 && m.diff < 1e-3 && m.mismatches == 0 &&
                      (m.n > 4096 || m.max_abs <= 2e-2 * std::max(m.max_ref, 1e-3));
      ++n;
      bad += !ok;
      std::printf(
          "[mla] wide    %-28s warps=%d split=%-4d bucket=%-4d n=%-8lld diff=%.2e "
          "max_abs=%.3e mism=%lld wide_calls=%lld %s\n",
          c.name().c_str(), warps, split, bucket, static_cast<long long>(m.n), m.diff, m.max_abs,
          static_cast<long long>(m.mismatches), static_cast<long long>(wide_calls),
          ok ? "PASS" : "FAIL");
      std::fflush(stdout);
      EXPECT_TRUE(ok) << c.name() << " warps " << warps << " split " << split << " bucket "
                      << bucket << ": diff " << m.diff << " max_abs " << m.max_abs << " non-finite "
                      << m.mismatches << " wide calls " << wide_calls;
    }
  }
  cuda::set_mla_wide_overrides(0, 0);
  cb.set_attention_max_kv_len(0);
  std::printf("[mla] wide layouts: %d of %d PASS\n", n - bad, n);
}

// Below 16 decode tokens, and with the batch-dependent layouts off (DEEPINFER_BATCH_INVARIANT=1),
// kAuto keeps the cluster kernel.
TEST(MlaDecodeWide, AutoKeepsClusterForSmallBatchesAndInvariantMode) {
  Backend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device";
  auto& cb = UseMlaKernel::cuda_be();
  const MlaCase big = wide_cases()[0];
  const MlaCase small{"small", 16, 512, 64, 64, {{100, 1}, {2047, 1}, {5, 1}}};
  int64_t w0 = cb.mla_wide_calls(), c0 = cb.mla_cluster_calls();
  run_mla(*be, small);
  EXPECT_EQ(cb.mla_wide_calls() - w0, 0);
  EXPECT_EQ(cb.mla_cluster_calls() - c0, 1);
  cuda::set_mla_cluster_batch_split_override(0);
  w0 = cb.mla_wide_calls();
  c0 = cb.mla_cluster_calls();
  run_mla(*be, big);
  EXPECT_EQ(cb.mla_wide_calls() - w0, 0);
  EXPECT_EQ(cb.mla_cluster_calls() - c0, 1);
  cuda::set_mla_cluster_batch_split_override(-1);
  w0 = cb.mla_wide_calls();
  run_mla(*be, big);
  EXPECT_EQ(cb.mla_wide_calls() - w0, 1);
}

// The wide plan: one wave of CTAs for the longest context (V2-Lite on 132 SMs: batch 32 at 2049
// entries -> 512-entry splits, 5 per context; batch 256 -> one split), splits a multiple of the
// stage, the merge weights within the stage buffers, shared memory within the opt-in limit.
TEST(MlaDecodeWidePlan, OneWaveSplits) {
  cuda::set_mla_wide_overrides(8, 0);
  cuda::MlaWideDecodePlan p = cuda::plan_mla_wide_decode(32, 2049, 16, 576, 512, 132);
  EXPECT_EQ(p.split_size, 512);
  EXPECT_EQ(p.num_splits, 5);
  EXPECT_EQ(p.head_tiles, 1);
  EXPECT_EQ(p.num_counters, 32);
  EXPECT_GT(p.partial_bytes, size_t{0});
  EXPECT_LE(p.smem_bytes, size_t{227} << 10);
  p = cuda::plan_mla_wide_decode(256, 2049, 16, 576, 512, 132);
  EXPECT_EQ(p.split_size, 4096);
  EXPECT_EQ(p.num_splits, 1);
  EXPECT_EQ(p.partial_bytes, size_t{0});
  p = cuda::plan_mla_wide_decode(16, 700, 128, 576, 512, 132);
  EXPECT_EQ(p.head_tiles, 8);
  EXPECT_EQ(p.split_size % 64, 0);
  EXPECT_LE(int64_t{16} * 8 * p.num_splits, 2 * 132);
  cuda::set_mla_wide_overrides(4, 0);
  p = cuda::plan_mla_wide_decode(32, 2049, 16, 576, 512, 132);
  EXPECT_EQ(p.split_size % 32, 0);
  EXPECT_LE(int64_t{32} * ((2049 + p.split_size - 1) / p.split_size - 1), 2 * 132);
  EXPECT_LE(2 * p.smem_bytes, size_t{227} << 10);
  // 160K entries: the merge's 16 weights per split fit the stage buffers.
  p = cuda::plan_mla_wide_decode(16, 163840, 16, 576, 512, 132);
  EXPECT_LE(int64_t{16} * p.num_splits * 4, int64_t{2} * 32 * 584 * 2);
  cuda::set_mla_wide_overrides(0, 0);
}
#endif

#ifdef DI_HAVE_CUDA
// The deferred merge (batch 1 with W_UV: the cluster kernel writes every split's partial and
// mla_merge_uv merges them while projecting) against the CPU op and against the composed
// GPU path (cluster kernel with its merges, then head_linear_small); bitwise equal to itself in a
// grid sized for a longer context (padding splits) and on a repeated call; ctx 17000 = 266 parts
// in 5 shared-memory chunks; 128 heads (4 head tiles: added in run 22 after its last GPU run).
// Past kMlaMergeMaxParts splits (ctx 33000: 516 of 64 entries) the
// composed path runs.
TEST(MlaDecodeDeferred, MergeInsideTheProjectionMatchesCpuAndComposed) {
  Backend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device";
  auto& cb = UseMlaKernel::cuda_be();
  auto cpu = make_cpu_backend();
  using P = std::vector<std::pair<int, int>>;
  const std::vector<MlaCase> defer_cases{
      {"d_ctx1", 16, 512, 64, 64, P{{0, 1}}},
      {"d_ctx97", 16, 512, 64, 1, P{{96, 1}}},
      {"d_ctx257", 16, 512, 64, 16, P{{256, 1}}},
      {"d_ctx1100", 16, 512, 64, 64, P{{1099, 1}}},
      {"d_ctx2049", 16, 512, 64, 64, P{{2048, 1}}},
      {"d_ctx3000_bs16", 16, 512, 64, 16, P{{2999, 1}}},
      {"d_h20_ctx700", 20, 512, 64, 16, P{{699, 1}}},
      {"d_h128_ctx700", 128, 512, 64, 64, P{{699, 1}}},  // V3's heads: 4 tiles of 32 rows
      {"d_lat128", 16, 128, 32, 16, P{{300, 1}}},
      {"d_ctx4100", 16, 512, 64, 16, P{{4099, 1}}},
      {"d_ctx2049_n64", 16, 512, 64, 64, P{{2048, 1}}},
      {"d_ctx17000", 16, 512, 64, 64, P{{16999, 1}}},
      {"d_ctx33000", 16, 512, 64, 64, P{{32999, 1}}},
  };
  for (const MlaCase& c : defer_cases) {
    // W_UV's output columns per head: V2-Lite's v_head_dim 128, or 64.
    const int32_t kN =
        c.label.size() > 4 && c.label.substr(c.label.size() - 4) == "_n64" ? 64 : 128;
    const int32_t ctx = c.seqs[0].first + c.seqs[0].second;
    const int32_t splits =
        cuda::plan_mla_cluster_decode(1, ctx, c.heads, c.latent + c.rope, c.latent, true)
            .num_splits;
    const bool expect_defer = splits <= cuda::kMlaMergeMaxParts;
    const Tensor ref = run_mla(*cpu, c, 31, true, kN);
    const int64_t d0 = cb.mla_deferred_calls();
    const Tensor def = run_mla(*be, c, 31, true, kN);
    const int64_t deferred = cb.mla_deferred_calls() - d0;
    // More splits in the grid (3600 entries: 57, still deferred; never below the context).
    cb.set_attention_max_kv_len(std::max(3600, c.seqs[0].first + c.seqs[0].second + 64));
    const Tensor padded = run_mla(*be, c, 31, true, kN);
    cb.set_attention_max_kv_len(0);
    const Tensor again = run_mla(*be, c, 31, true, kN);
    // The merge kernels (16 columns per CTA; the wide one, parts by bulk copies; the k-split
    // cluster): the same bits.
    std::vector<Tensor> kernels;
    for (const cuda::MlaMergeKernel kind :
         {cuda::MlaMergeKernel::kV1, cuda::MlaMergeKernel::kWideBulk,
          cuda::MlaMergeKernel::kSplit}) {
      cuda::set_mla_merge_override(kind);
      kernels.push_back(run_mla(*be, c, 31, true, kN));
    }
    cuda::set_mla_merge_override(cuda::MlaMergeKernel::kAuto);
    cb.set_mla_defer(0);
    const Tensor composed = run_mla(*be, c, 31, true, kN);
    cb.set_mla_defer(-1);
    ASSERT_EQ(ref.numel(), def.numel());
    const Metrics m = compare(ref, def), mc = compare(composed, def);
    int64_t differ = 0, kernels_differ = 0;
    for (int64_t i = 0; i < def.numel(); ++i) {
      differ += (def.f32()[i] != padded.f32()[i]) + (def.f32()[i] != again.f32()[i]);
      for (const Tensor& k : kernels) kernels_differ += def.f32()[i] != k.f32()[i];
    }
    const bool ok = m.diff < 1e-3 && m.mismatches == 0 && mc.diff < 1e-3 && mc.mismatches == 0 &&
                    differ == 0 && kernels_differ == 0 && deferred == (expect_defer ? 1 : 0);
    std::printf(
        "[mla] deferred %-22s n=%-6lld w_uv_n=%d splits=%d vs_cpu diff=%.2e "
        "vs_composed diff=%.2e max_abs=%.3e deferred=%lld padded/again differing=%lld "
        "merge kernels differing=%lld %s\n",
        c.name().c_str(), static_cast<long long>(m.n), kN, splits, m.diff, mc.diff, mc.max_abs,
        static_cast<long long>(deferred), static_cast<long long>(differ),
        static_cast<long long>(kernels_differ), ok ? "PASS" : "FAIL");
    std::fflush(stdout);
    EXPECT_LT(m.diff, 1e-3) << c.name();
    EXPECT_EQ(m.mismatches, 0) << c.name();
    EXPECT_LT(mc.diff, 1e-3) << c.name();
    EXPECT_EQ(mc.mismatches, 0) << c.name();
    EXPECT_EQ(differ, 0) << c.name() << ": not bitwise equal with grid padding / repeated";
    EXPECT_EQ(kernels_differ, 0) << c.name() << ": the merge kernels differ";
    EXPECT_EQ(deferred, expect_defer ? 1 : 0) << c.name();
  }
}

// Batch invariance: a sequence's rows are bit-identical alone and inside a ragged batch (fixed
// split size; per-row arithmetic independent of the other rows of a tile). One pool, one q row
// set: batch 1 = sequence A; batch 4 = A (same blocks, same q rows) + three others.
TEST(MlaDecodeInvariance, SameRowsAloneAndInABatch) {
  Backend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "no CUDA device";
  const int32_t heads = 16, latent = 512, dqk = 576, bs = 64, nblocks = 64;
  const KvLayout layout{nblocks, 2, bs, dqk};
  Tensor pool = act(*be, host_random({nblocks, 2, bs, dqk}, 77));
  Tensor q_all = host_random({4, heads, dqk}, 78);
  // Sequence lengths (kv incl. the new token) and block tables (disjoint, non-contiguous).
  const std::vector<int32_t> lens{701, 2048, 6, 65};
  std::vector<std::vector<int32_t>> tables(4);
  int32_t next = 0;
  for (size_t s = 0; s < 4; ++s)
    for (int32_t b = 0; b < (lens[s] + bs - 1) / bs; ++b)
      tables[s].push_back((next++ * 7) % nblocks);
  // Sequences [first, first + nseq) as one batch.
  auto run_from = [&](size_t first, size_t nseq) {
    std::vector<int32_t> pos, slots, qo{0}, kv_ptr{0}, kv_idx, last;
    int32_t max_kv = 0;
    for (size_t s = first; s < first + nseq; ++s) {
      const int32_t p = lens[s] - 1;
      pos.push_back(p);
      slots.push_back(tables[s][static_cast<size_t>(p / bs)] * bs + p % bs);
      qo.push_back(static_cast<int32_t>(s - first + 1));
      kv_idx.insert(kv_idx.end(), tables[s].begin(), tables[s].end());
      kv_ptr.push_back(static_cast<int32_t>(kv_idx.size()));
      last.push_back(lens[s] - (static_cast<int32_t>(tables[s].size()) - 1) * bs);
      max_kv = std::max(max_kv, lens[s]);
    }
    PagedBatch b;
    b.positions = ints(*be, pos);
    b.slot_mapping = ints(*be, slots);
    b.qo_indptr = ints(*be, qo);
    b.kv_indptr = ints(*be, kv_ptr);
    b.kv_indices = ints(*be, kv_idx);
    b.kv_last_len = ints(*be, last);
    b.num_seqs = static_cast<int32_t>(nseq);
    b.num_tokens = static_cast<int32_t>(nseq);
    b.max_kv_len = max_kv;
    Tensor q = act(
        *be,
        q_all.slice_rows(static_cast<int64_t>(first), static_cast<int64_t>(first + nseq)).clone());
    Tensor o = be->empty({static_cast<int64_t>(nseq), heads, latent}, be->compute_dtype());
    PagedAttentionParams p;
    p.q = &q;
    p.out = &o;
    p.pool = &pool;
    p.layout = layout;
    p.layer = 1;
    p.num_q_heads = heads;
    p.num_kv_heads = 1;
    p.head_dim_qk = dqk;
    p.head_dim_v = latent;
    p.scale = 1.0f / 24.0f;
    p.batch = &b;
    be->paged_attention(p);
    return be->download(o);
  };
  auto run = [&](size_t nseq) { return run_from(0, nseq); };
  // x's elements against y's from element `offset` on.
  auto count_differ = [](const Tensor& x, const Tensor& y, int64_t offset = 0) {
    int64_t differ = 0;
    for (int64_t i = 0; i < x.numel(); ++i) differ += x.f32()[i] != y.f32()[offset + i];
    return differ;
  };
  // The cluster kernel: batch 1, batch 4, the grid sized for a graph bucket's 8192-entry context
  // (padding clusters) and a second identical call (the arrival counters were reset).
  {
    auto& cb = UseMlaKernel::cuda_be();
    const int64_t calls = cb.mla_cluster_calls();
    const Tensor a = run(1), b = run(4);
    cb.set_attention_max_kv_len(8192);
    const Tensor c = run(1), d = run(4);
    cb.set_attention_max_kv_len(0);
    const Tensor e = run(1);
    const int64_t differ =
        count_differ(a, b) + count_differ(a, c) + count_differ(a, d) + count_differ(a, e);
    std::printf("[mla] batch_invariance kernel=cluster differing=%lld of %lld %s\n",
                static_cast<long long>(differ), static_cast<long long>(a.numel()),
                differ == 0 ? "PASS" : "FAIL");
    EXPECT_EQ(differ, 0) << "cluster kernel: sequence A's rows differ between batch 1 / batch 4 / "
                            "a grid for 8192 entries / a repeated call";
    // Sequence B (2048 entries: the long-context split) alone, alone in the 8192-entry grid, and
    // as the second row of the batch of 4 (whose grid A's short context also shapes).
    const int64_t row = int64_t{heads} * latent;
    const Tensor b1 = run_from(1, 1);
    cb.set_attention_max_kv_len(8192);
    const Tensor b8k = run_from(1, 1);
    cb.set_attention_max_kv_len(0);
    const int64_t differ_b =
        count_differ(b1, b, row) + count_differ(b1, d, row) + count_differ(b1, b8k);
    std::printf("[mla] batch_invariance kernel=cluster long_context differing=%lld of %lld %s\n",
                static_cast<long long>(differ_b), static_cast<long long>(b1.numel()),
                differ_b == 0 ? "PASS" : "FAIL");
    EXPECT_EQ(differ_b, 0) << "cluster kernel: sequence B's rows differ between alone / batch 4 / "
                              "a grid for 8192 entries";
    EXPECT_EQ(cb.mla_cluster_calls() - calls, 7);
  }
  UseMlaKernel use(cuda::MlaDecodeKernel::kTile);
  // Under the auto head split batch 1 and batch 4 use different head groups (4 and 1 on 132
  // SMs); also with the groups forced to 1 and to 4 at both batch sizes.
  const Tensor ref = [&] {
    cuda::set_mla_head_split_override(1);
    return run(1);
  }();
  for (int32_t split : {0, 1, 4}) {
    cuda::set_mla_head_split_override(split);
    const Tensor a = run(1), b = run(4);
    int64_t differ = 0;
    for (int64_t i = 0; i < a.numel(); ++i)
      differ += (a.f32()[i] != b.f32()[i]) + (a.f32()[i] != ref.f32()[i]);
    std::printf("[mla] batch_invariance kernel=tile head_split=%d differing=%lld of %lld %s\n",
                split,
                static_cast<long long>(differ), static_cast<long long>(a.numel()),
                differ == 0 ? "PASS" : "FAIL");
    EXPECT_EQ(differ, 0) << "sequence A's rows differ between batch 1 and batch 4 (head split "
                         << split << ") or from batch 1 with one head group";
  }
  cuda::set_mla_head_split_override(-1);
}

#endif

}  // namespace
}  // namespace di
