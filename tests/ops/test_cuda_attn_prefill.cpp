// Tensor-core prefill attention (src/backend/cuda/kernels/attention_prefill_mma.cu):
//  - FragmentMath (CPU, always runs): one warp of the kernel emulated on the CPU with the index
//  math
//    of attention_prefill_mma_math.h against an independent model of ldmatrix / mma.m16n8k16, so
//    the fragment bookkeeping is checked without a GPU;
//  - DispatchRule (CPU): which batches the rule sends to the tensor-core kernel;
//  - PagedPrefill (GPU, skipped without one): the CUDA backend vs the CPU op on ragged, cached
//    (chunked prefill), mixed decode/prefill batches, head_dim 64/128, GQA 1/2/3/4/8, block sizes
//    1/16/48/64, through the Hopper warpgroup-MMA kernel (attention_prefill_wgmma.cu, default;
//    checked to have run wherever it supports the case), the mma.sync kernel's variants
//    (DEEPINFER_ATTN_PREFILL=mma) and the CUDA-core path (DEEPINFER_ATTN_PREFILL=simt).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/kernels/attention_prefill_mma_math.h"
#include "op_case.h"

#ifdef DI_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels/attention.h"
#endif

namespace di::testing {
namespace {

namespace mf = di::cuda::mma_frag;

// ---- independent model of the hardware (from the PTX ISA tables, not from the header) ----------

// A register of bf16 pairs is modelled as two floats (lo, hi).
struct Reg {
  float lo = 0, hi = 0;
};
using Lane4 = std::array<std::array<Reg, 4>, 32>;  // 4 registers per lane

// ldmatrix.x4 on a row-major matrix `m` (stride ld): lane L supplies (row, col) of row L & 7 of
// matrix L >> 3; register i of lane L gets matrix i's (L/4, 2(L%4)+e) or, transposed,
// (2(L%4)+e, L/4).
Lane4 ldmatrix_x4(const std::vector<float>& m, int ld, const int (&row)[32], const int (&col)[32],
                  bool trans) {
  Lane4 out{};
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      float v[2];
      for (int e = 0; e < 2; ++e) {
        const int r = trans ? 2 * (lane % 4) + e : lane / 4;
        const int c = trans ? lane / 4 : 2 * (lane % 4) + e;
        const int src = 8 * i + r;  // the lane that gave the address of row r of matrix i
        v[e] = m[static_cast<size_t>((row[src]) * ld + col[src] + c)];
      }
      out[static_cast<size_t>(lane)][static_cast<size_t>(i)] = Reg{v[0], v[1]};
    }
  return out;
}

// c (16x8 per warp, 4 floats per lane) += a (16x16) · b (16x8); fragments as in the PTX ISA.
void mma_16816(std::array<std::array<float, 4>, 32>& c, const std::array<std::array<Reg, 4>, 32>& a,
               const std::array<std::array<Reg, 2>, 32>& b) {
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    const auto& ra = a[static_cast<size_t>(lane)];
    A[g][2 * t] = ra[0].lo, A[g][2 * t + 1] = ra[0].hi;
    A[g + 8][2 * t] = ra[1].lo, A[g + 8][2 * t + 1] = ra[1].hi;
    A[g][2 * t + 8] = ra[2].lo, A[g][2 * t + 9] = ra[2].hi;
    A[g + 8][2 * t + 8] = ra[3].lo, A[g + 8][2 * t + 9] = ra[3].hi;
    const auto& rb = b[static_cast<size_t>(lane)];
    B[2 * t][g] = rb[0].lo, B[2 * t + 1][g] = rb[0].hi;
    B[2 * t + 8][g] = rb[1].lo, B[2 * t + 9][g] = rb[1].hi;
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int i = 0; i < 4; ++i) {
      double acc = 0;
      for (int k = 0; k < 16; ++k) acc += double{A[rows[i]][k]} * B[k][cols[i]];
      c[static_cast<size_t>(lane)][static_cast<size_t>(i)] += static_cast<float>(acc);
    }
  }
}

TEST(PrefillMma, FragmentMathMatchesPtxLayouts) {
  // The header's owner functions agree with the PTX tables used by the model above.
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    EXPECT_EQ(mf::a_row(lane, 0), g);
    EXPECT_EQ(mf::a_row(lane, 1), g + 8);
    EXPECT_EQ(mf::a_row(lane, 2), g);
    EXPECT_EQ(mf::a_row(lane, 3), g + 8);
    EXPECT_EQ(mf::a_col(lane, 0, 1), 2 * t + 1);
    EXPECT_EQ(mf::a_col(lane, 2, 0), 2 * t + 8);
    EXPECT_EQ(mf::a_col(lane, 3, 1), 2 * t + 9);
    EXPECT_EQ(mf::b_k(lane, 0, 1), 2 * t + 1);
    EXPECT_EQ(mf::b_k(lane, 1, 0), 2 * t + 8);
    EXPECT_EQ(mf::b_n(lane), g);
    EXPECT_EQ(mf::c_row(lane, 1), g);
    EXPECT_EQ(mf::c_row(lane, 2), g + 8);
    EXPECT_EQ(mf::c_col(lane, 3), 2 * t + 1);
    EXPECT_EQ(mf::ldsm_elem_row(lane, 1, false), g);
    EXPECT_EQ(mf::ldsm_elem_col(lane, 1, false), 2 * t + 1);
    EXPECT_EQ(mf::ldsm_elem_row(lane, 1, true), 2 * t + 1);
    EXPECT_EQ(mf::ldsm_elem_col(lane, 0, true), g);
  }
}

// One warp of prefill_mma_kernel on the CPU: the same loops, the same ldmatrix addresses and the
// same register bookkeeping (S n-tiles -> P A-fragments), on the hardware model above; checks
// S = Q·Kᵀ and O = P·V element by element against plain loops.
void emulate_warp(int d) {
  const int kv = 64, ld = d + 8, wrow = 16;  // warp 1 of a CTA: rows 16..31
  std::vector<float> q(static_cast<size_t>(32 * ld)), k(static_cast<size_t>(kv * ld)),
      v(static_cast<size_t>(kv * ld));
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> u(-8, 8);  // small integers: exact in bf16 and f32 sums
  for (auto* m : {&q, &k, &v})
    for (auto& x : *m) x = static_cast<float>(u(rng));
  // Q fragments.
  const int dchunks = d / 16;
  std::vector<Lane4> qf(static_cast<size_t>(dchunks));
  for (int kc = 0; kc < dchunks; ++kc) {
    int row[32], col[32];
    for (int lane = 0; lane < 32; ++lane) {
      row[lane] = wrow + mf::ldsm_q_row(lane);
      col[lane] = kc * 16 + mf::ldsm_q_col(lane);
    }
    qf[static_cast<size_t>(kc)] = ldmatrix_x4(q, ld, row, col, false);
  }
  // S = Q Kᵀ.
  std::array<std::array<std::array<float, 4>, 32>, 8> sc{};
  for (int kc = 0; kc < dchunks; ++kc)
    for (int np = 0; np < 4; ++np) {
      int row[32], col[32];
      for (int lane = 0; lane < 32; ++lane) {
        row[lane] = np * 16 + mf::ldsm_k_key(lane);
        col[lane] = kc * 16 + mf::ldsm_k_col(lane);
      }
      const Lane4 b = ldmatrix_x4(k, ld, row, col, false);
      std::array<std::array<Reg, 2>, 32> b0{}, b1{};
      for (size_t l = 0; l < 32; ++l) {
        b0[l] = {b[l][0], b[l][1]};
        b1[l] = {b[l][2], b[l][3]};
      }
      mma_16816(sc[static_cast<size_t>(2 * np)], qf[static_cast<size_t>(kc)], b0);
      mma_16816(sc[static_cast<size_t>(2 * np + 1)], qf[static_cast<size_t>(kc)], b1);
    }
  int bad = 0;
  for (int nt = 0; nt < 8; ++nt)
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 4; ++i) {
        const int r = wrow + mf::c_row(lane, i), key = nt * 8 + mf::c_col(lane, i);
        double want = 0;
        for (int j = 0; j < d; ++j)
          want += double{q[static_cast<size_t>(r * ld + j)]} * k[static_cast<size_t>(key * ld + j)];
        bad += sc[static_cast<size_t>(nt)][static_cast<size_t>(lane)][static_cast<size_t>(i)] !=
               static_cast<float>(want);
      }
  EXPECT_EQ(bad, 0) << "S = Q K^T mismatches, d " << d;
  // P: any per-element function of S (here S / 64 + 1, exact) packed as the kernel packs it.
  auto pval = [](float s) { return s / 64.0f + 1.0f; };
  std::vector<Lane4> pf(4);
  for (size_t kc = 0; kc < 4; ++kc)
    for (size_t l = 0; l < 32; ++l) {
      const auto& s0 = sc[2 * kc][l];
      const auto& s1 = sc[2 * kc + 1][l];
      pf[kc][l][0] = {pval(s0[0]), pval(s0[1])};
      pf[kc][l][1] = {pval(s0[2]), pval(s0[3])};
      pf[kc][l][2] = {pval(s1[0]), pval(s1[1])};
      pf[kc][l][3] = {pval(s1[2]), pval(s1[3])};
    }
  // O = P V.
  const int dtiles = d / 8;
  std::vector<std::array<std::array<float, 4>, 32>> o(static_cast<size_t>(dtiles));
  for (int kc = 0; kc < 4; ++kc)
    for (int dp = 0; dp < d / 16; ++dp) {
      int row[32], col[32];
      for (int lane = 0; lane < 32; ++lane) {
        row[lane] = kc * 16 + mf::ldsm_v_key(lane);
        col[lane] = dp * 16 + mf::ldsm_v_col(lane);
      }
      const Lane4 b = ldmatrix_x4(v, ld, row, col, true);
      std::array<std::array<Reg, 2>, 32> b0{}, b1{};
      for (size_t l = 0; l < 32; ++l) {
        b0[l] = {b[l][0], b[l][1]};
        b1[l] = {b[l][2], b[l][3]};
      }
      mma_16816(o[static_cast<size_t>(2 * dp)], pf[static_cast<size_t>(kc)], b0);
      mma_16816(o[static_cast<size_t>(2 * dp + 1)], pf[static_cast<size_t>(kc)], b1);
    }
  bad = 0;
  for (int dt = 0; dt < dtiles; ++dt)
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 4; ++i) {
        const int r = wrow + mf::c_row(lane, i), col = dt * 8 + mf::c_col(lane, i);
        double want = 0;
        for (int key = 0; key < kv; ++key) {
          double s = 0;
          for (int j = 0; j < d; ++j)
            s += double{q[static_cast<size_t>(r * ld + j)]} * k[static_cast<size_t>(key * ld + j)];
          want += double{pval(static_cast<float>(s))} * v[static_cast<size_t>(key * ld + col)];
        }
        const float got =
            o[static_cast<size_t>(dt)][static_cast<size_t>(lane)][static_cast<size_t>(i)];
        bad += std::fabs(got - want) > 1e-3 * std::max(1.0, std::fabs(want));
      }
  EXPECT_EQ(bad, 0) << "O = P V mismatches, d " << d;
  std::printf("[attn_prefill] fragment emulation d %d: S and O %s\n", d,
              bad == 0 ? "match" : "MISMATCH");
}

TEST(PrefillMma, WarpEmulationD64) {
  emulate_warp(64);
}
TEST(PrefillMma, WarpEmulationD128) {
  emulate_warp(128);
}

TEST(PrefillMma, DispatchRule) {
  using di::cuda::prefill_mma_supported;
  using di::cuda::prefill_mma_wanted;
  EXPECT_TRUE(prefill_mma_supported(128, 128, 0, 1024, 128, 2048));
  EXPECT_TRUE(prefill_mma_supported(64, 64, 0, 128, 64, 256));
  EXPECT_FALSE(prefill_mma_supported(576, 512, 0, 0, 0, 576));  // MLA
  EXPECT_FALSE(prefill_mma_supported(96, 96, 0, 96, 96, 192));
  EXPECT_FALSE(prefill_mma_supported(128, 128, 4, 1028, 128, 2056));  // 8-byte aligned only
  EXPECT_TRUE(prefill_mma_wanted(1, 8192, 1));
  EXPECT_TRUE(prefill_mma_wanted(4, 5, 1));
  EXPECT_FALSE(prefill_mma_wanted(8, 8, 1));   // decode
  EXPECT_FALSE(prefill_mma_wanted(2, 10, 4));  // decode-like, split KV
  EXPECT_EQ(di::cuda::prefill_mma_max_tiles(2, 100, 4, 64), (400 + 63) / 64 + 2);
  EXPECT_EQ(di::cuda::prefill_mma_rows(4, 1), 64);
  EXPECT_EQ(di::cuda::prefill_mma_rows(8, 1), 128);
  EXPECT_EQ(di::cuda::prefill_mma_rows(4, 2), 128);
  using di::cuda::prefill_wgmma_supported;
  EXPECT_TRUE(prefill_wgmma_supported(128, 128, 0, 1024, 128, 2048));  // Llama-3 8B
  EXPECT_FALSE(prefill_wgmma_supported(64, 64, 0, 128, 64, 256));      // head dim 64: mma.sync
  EXPECT_FALSE(prefill_wgmma_supported(128, 64, 0, 1024, 128, 2048));
  EXPECT_FALSE(prefill_wgmma_supported(128, 128, 4, 1028, 128, 2056));  // 8-byte aligned only
}

// ---- GPU: the backend vs the CPU op
// ---------------------------------------------------------------
#ifdef DI_HAVE_CUDA

struct Case {
  std::string label;
  int32_t hq, hkv, d, block_size;
  std::vector<std::pair<int, int>> seqs;  // (cached, new)
};

std::vector<Case> cases() {
  using P = std::vector<std::pair<int, int>>;
  return {
      {"ragged_gqa4", 32, 8, 128, 64, P{{0, 300}, {5, 17}, {64, 100}, {130, 64}}},
      {"ragged_gqa8", 32, 4, 128, 16, P{{130, 100}, {0, 64}, {5, 1}, {64, 17}}},
      {"ragged_mha", 8, 8, 128, 1, P{{0, 100}, {64, 17}, {5, 64}}},
      {"ragged_gqa4", 16, 4, 64, 1, P{{130, 17}, {0, 300}}},
      {"ragged_gqa8", 8, 1, 64, 64, P{{0, 64}, {5, 100}, {130, 1}, {64, 300}}},
      {"ragged_mha", 4, 4, 64, 16, P{{0, 17}, {5, 300}, {64, 1}}},
      {"mixed_decode_prefill", 32, 8, 128, 16,
       P{{0, 300}, {130, 1}, {64, 1}, {5, 1}, {0, 1}, {200, 1}, {17, 40}}},
      {"mixed_empty_seqs", 16, 2, 64, 64, P{{20, 0}, {0, 77}, {300, 1}, {5, 0}, {64, 130}}},
      {"long_1030", 8, 2, 128, 64, P{{0, 1030}}},
      {"chunk_after_1000", 16, 2, 128, 16, P{{1000, 64}}},
      {"tiny_2tok", 4, 1, 64, 16, P{{3, 2}}},
      // Aimed at the wgmma kernel (d 128, 128-row CTAs, 128-key tiles, 2 pipeline stages):
      // group 3 (tiles end mid-token), a block size that is no power of two, chunked prefill
      // over block size 1, many short sequences, and long walks that wrap the stages often.
      {"wg_gqa3_odd", 12, 4, 128, 16, P{{0, 333}, {77, 129}, {1, 1}, {0, 2}}},
      {"wg_gqa2_bs48", 8, 4, 128, 48, P{{100, 257}, {0, 5}, {300, 60}}},
      {"wg_chunked_bs1", 16, 2, 128, 1, P{{513, 200}, {250, 3}, {127, 129}}},
      {"wg_many_seqs", 32, 8, 128, 64,
       P{{0, 1}, {0, 2}, {3, 31}, {0, 127}, {128, 128}, {0, 129}, {1000, 40}, {64, 0}}},
      {"wg_long_gqa4", 8, 2, 128, 16, P{{0, 1500}, {700, 301}}},
  };
}

struct Setup {
  KvLayout layout;
  std::vector<int32_t> positions, slots, qo{0}, kv_ptr{0}, kv_idx, last;
  int32_t num_tokens = 0, max_kv = 0;
  Setup(const std::vector<std::pair<int, int>>& seqs, int32_t block_size, int32_t layers,
        int32_t entry) {
    int32_t blocks = 3;
    for (auto [c, n] : seqs) blocks += (c + n + block_size - 1) / block_size;
    std::vector<int32_t> perm(static_cast<size_t>(blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(33));
    size_t next = 0;
    for (auto [c, n] : seqs) {
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
    layout = KvLayout{blocks, layers, block_size, entry};
  }
};

// Runs the case on `be`; returns the output as a host f32 tensor.
Tensor run_case(Backend& be, const Case& c) {
  const int32_t entry = 2 * c.hkv * c.d, layers = 2, layer = 1;
  Setup s(c.seqs, c.block_size, layers, entry);
  PagedBatch b;
  b.positions = ints(be, s.positions);
  b.slot_mapping = ints(be, s.slots);
  b.qo_indptr = ints(be, s.qo);
  b.kv_indptr = ints(be, s.kv_ptr);
  b.kv_indices = ints(be, s.kv_idx);
  b.kv_last_len = ints(be, s.last);
  b.num_seqs = static_cast<int32_t>(s.last.size());
  b.num_tokens = s.num_tokens;
  b.max_kv_len = s.max_kv;
  Tensor pool = act(be, host_random({s.layout.num_blocks, layers, c.block_size, entry}, 61));
  Tensor q = act(be, host_random({s.num_tokens, c.hq, c.d}, 62));
  Tensor o = be.empty({s.num_tokens, c.hq, c.d}, be.compute_dtype());
  PagedAttentionParams p;
  p.q = &q;
  p.out = &o;
  p.pool = &pool;
  p.layout = s.layout;
  p.layer = layer;
  p.num_q_heads = c.hq;
  p.num_kv_heads = c.hkv;
  p.head_dim_qk = p.head_dim_v = c.d;
  p.k_offset = 0;
  p.v_offset = c.hkv * c.d;
  p.kv_head_stride = c.d;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  p.batch = &b;
  be.paged_attention(p);
  return be.download(o);
}

TEST(PrefillMma, PagedPrefillMatchesCpu) {
  if (!cuda::cuda_available()) GTEST_SKIP() << "no CUDA device visible";
  cuda::CudaBackend gpu;
  auto cpu = make_cpu_backend();
  int failures = 0;
  for (const Case& c : cases()) {
    const Tensor ref = run_case(*cpu, c);
    int32_t tokens = 0;
    for (auto [cached, n] : c.seqs) tokens += n;
    int32_t max_kv = 0;
    for (auto [cached, n] : c.seqs) max_kv = std::max(max_kv, cached + n);
    const auto plan = cuda::plan_paged_attention(static_cast<int32_t>(c.seqs.size()), tokens,
                                                 max_kv, c.hq, c.hkv, c.d, c.d);
    const bool routed =
        cuda::prefill_mma_wanted(static_cast<int32_t>(c.seqs.size()), tokens, plan.num_splits);
    const bool wgmma_supported =
        routed && cuda::prefill_wgmma_supported(c.d, c.d, 0, c.hkv * c.d, c.d, 2 * c.hkv * c.d);
    // Paths: the wgmma kernel (default), mma.sync 4x1, 8x1, 4x2 (warps x m-tiles per warp),
    // then CUDA cores.
    struct Path {
      const char* name;
      bool mma, wgmma;
      int warps, mtiles;
    };
    const Path paths[] = {{"wgmma", true, true, 4, 1},
                          {"mma", true, false, 4, 1},
                          {"mma", true, false, 8, 1},
                          {"mma", true, false, 4, 2},
                          {"simt", false, false, 4, 1}};
    for (const Path& path : paths) {
      gpu.set_attention_prefill_mma(path.mma, path.warps, path.mtiles);
      gpu.set_attention_prefill_wgmma(path.wgmma);
      const int64_t calls_before = gpu.prefill_wgmma_calls();
      const Tensor got = run_case(gpu, c);
      gpu.synchronize();
      const bool ran_wgmma = gpu.prefill_wgmma_calls() > calls_before;
      // The wgmma path must take every case it supports (no silent fallback), and only those.
      const bool path_ok = ran_wgmma == (path.wgmma && wgmma_supported);
      const Metrics m = compare(ref, got);
      const bool ok = path_ok && m.diff < 1e-3 && m.mismatches == 0 &&
                      (m.n > 4096 || m.max_abs <= 2e-2 * std::max(m.max_ref, 1e-3));
      failures += !ok;
      std::printf(
          "[attn_prefill] %-22s hq %2d hkv %d d %3d bs %2d path=%-5s cfg=%dx%d routed_mma=%d "
          "ran_wgmma=%d n=%-8lld diff=%.2e max_abs=%.3e max_ref=%.3e mism=%lld %s\n",
          c.label.c_str(), c.hq, c.hkv, c.d, c.block_size, path.name, path.warps, path.mtiles,
          path.mma && routed ? 1 : 0, ran_wgmma ? 1 : 0, static_cast<long long>(m.n), m.diff,
          m.max_abs, m.max_ref, static_cast<long long>(m.mismatches), ok ? "PASS" : "FAIL");
      std::fflush(stdout);
      EXPECT_TRUE(ok) << c.label << " d " << c.d << " bs " << c.block_size << " " << path.name
                      << " cfg " << path.warps << "x" << path.mtiles << " ran_wgmma " << ran_wgmma;
    }
  }
  gpu.set_attention_prefill_mma(true);
  gpu.set_attention_prefill_wgmma(true);
  std::printf("[attn_prefill] summary: %d failures\n", failures);
}
#else
TEST(PrefillMma, PagedPrefillMatchesCpu) {
  GTEST_SKIP() << "built without CUDA";
}
#endif

}  // namespace
}  // namespace di::testing
