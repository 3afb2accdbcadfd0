// Backend::mla_rope_store and PagedAttentionParams::q_rope on the CPU reference backend: the
// composed op gives bit-identical results to the op sequence DeepSeek's attention ran before it
// existed (copy_columns, rope, rms_norm, store_kv, write_columns), and the split query gives the
// same attention rows as the concatenated one. The CUDA versions are checked against these in
// tests/ops (test_backend_ops: mla_rope_store_*, *_qrope*; test_cuda_mla).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"

namespace di {
namespace {

struct Dims {
  int32_t hq, dn, dr, lat, block_size;
  bool interleaved;
};

Tensor random_f32(const Shape& shape, uint64_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = u(rng);
  return t;
}

Tensor i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  for (size_t i = 0; i < v.size(); ++i) t.data<int32_t>()[i] = v[i];
  return t;
}

Tensor cos_sin_table(int32_t max_pos, int32_t dr) {
  Tensor cs = Tensor::empty({max_pos, dr}, DType::kF32);
  for (int32_t p = 0; p < max_pos; ++p)
    for (int32_t j = 0; j < dr / 2; ++j) {
      const double a = p * std::pow(10000.0, -2.0 * j / dr);
      cs.f32()[p * dr + j] = static_cast<float>(std::cos(a));
      cs.f32()[p * dr + dr / 2 + j] = static_cast<float>(std::sin(a));
    }
  return cs;
}

// Two sequences (3 cached + 2 new, 9 cached + 1 new) and a padding row (slot -1, no blocks).
struct Batch {
  KvLayout layout;
  PagedBatch b;
  std::vector<int32_t> slots;
  explicit Batch(int32_t block_size, int32_t entry) {
    const int32_t nb0 = (5 + block_size - 1) / block_size, nb1 = (10 + block_size - 1) / block_size;
    std::vector<int32_t> table0, table1, indices;
    for (int32_t i = 0; i < nb0; ++i) table0.push_back(2 * i + 1);  // odd blocks
    for (int32_t i = 0; i < nb1; ++i) table1.push_back(2 * i);      // even blocks
    layout = KvLayout{2 * std::max(nb0, nb1) + 1, 2, block_size, entry};
    auto slot = [&](const std::vector<int32_t>& t, int32_t p) {
      return t[static_cast<size_t>(p / block_size)] * block_size + p % block_size;
    };
    const std::vector<int32_t> positions{3, 4, 9, 0};
    slots = {slot(table0, 3), slot(table0, 4), slot(table1, 9), -1};
    indices = table0;
    indices.insert(indices.end(), table1.begin(), table1.end());
    b.positions = i32(positions);
    b.slot_mapping = i32(slots);
    b.qo_indptr = i32({0, 2, 3, 4});
    b.kv_indptr = i32({0, nb0, nb0 + nb1, nb0 + nb1});
    b.kv_indices = i32(indices);
    b.kv_last_len = i32({5 - (nb0 - 1) * block_size, 10 - (nb1 - 1) * block_size, 0});
    b.num_seqs = 3;
    b.num_tokens = 4;
    b.max_kv_len = 10;
  }
};

void expect_bit_equal(const Tensor& a, const Tensor& b, const char* what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  int64_t differ = 0;
  for (int64_t i = 0; i < a.numel(); ++i) differ += a.f32()[i] != b.f32()[i];
  EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << a.numel() << " values differ";
}

class MlaRopeStoreCpu : public ::testing::TestWithParam<Dims> {};

TEST_P(MlaRopeStoreCpu, ComposedEqualsTheOldOpSequence) {
  const Dims d = GetParam();
  auto be = make_cpu_backend();
  const int32_t dqk = d.dn + d.dr, entry = d.lat + d.dr;
  const int64_t qw = int64_t{d.hq} * dqk;
  Batch bt(d.block_size, entry);
  const PagedBatch& b = bt.b;
  const int64_t t = b.num_tokens;
  // The fused projection output [T, q | latent | k_pe], the norm weight, rope table, pool.
  const Tensor proj = random_f32({t, qw + entry}, 1, 2.0f);
  const Tensor norm = random_f32({d.lat}, 2);
  const Tensor cos_sin = cos_sin_table(64, d.dr);
  const Tensor pool0 = random_f32({bt.layout.num_blocks, 2, d.block_size, entry}, 3);

  // Before: the sequence of deepseek_v3.cpp's attention() (q from its own GEMM, kv_a from another).
  Tensor pool_old = pool0.clone();
  Tensor q = Tensor::empty({t, d.hq, dqk}, DType::kF32);
  be->copy_columns(proj, 0, q);
  be->rope(q, d.dn, d.dr, b.positions, cos_sin, d.interleaved);
  Tensor kv = Tensor::empty({t, entry}, DType::kF32);
  be->copy_columns(proj, static_cast<int32_t>(qw), kv);
  Tensor latent = Tensor::empty({t, d.lat}, DType::kF32);
  be->copy_columns(kv, 0, latent);
  be->rms_norm(latent, norm, 1e-6f, latent);
  Tensor k_pe = Tensor::empty({t, 1, d.dr}, DType::kF32);
  be->copy_columns(kv, d.lat, k_pe);
  be->rope(k_pe, 0, d.dr, b.positions, cos_sin, d.interleaved);
  be->store_kv(latent, pool_old, bt.layout, 1, 0, b);
  be->store_kv(k_pe, pool_old, bt.layout, 1, d.lat, b);
  const Tensor q_rows = q.reshape({t * d.hq, dqk});
  Tensor q_nope_old = Tensor::empty({t * d.hq, d.dn}, DType::kF32);
  be->copy_columns(q_rows, 0, q_nope_old);
  Tensor q_pe_old = Tensor::empty({t * d.hq, d.dr}, DType::kF32);
  be->copy_columns(q_rows, d.dn, q_pe_old);

  // Now: one op on the fused output.
  Tensor pool_new = pool0.clone();
  Tensor q_nope = Tensor::empty({t, d.hq, d.dn}, DType::kF32);
  Tensor q_pe = Tensor::empty({t, d.hq, d.dr}, DType::kF32);
  MlaRopeStoreParams p;
  p.q = &proj;
  p.q_col = 0;
  p.kv_a = &proj;
  p.kv_col = static_cast<int32_t>(qw);
  p.q_nope = &q_nope;
  p.q_pe = &q_pe;
  p.pool = &pool_new;
  p.layout = bt.layout;
  p.layer = 1;
  p.num_heads = d.hq;
  p.nope_dim = d.dn;
  p.rope_dim = d.dr;
  p.latent_dim = d.lat;
  p.kv_a_norm = &norm;
  p.eps = 1e-6f;
  p.cos_sin = &cos_sin;
  p.interleaved = d.interleaved;
  p.batch = &b;
  be->mla_rope_store(p);

  expect_bit_equal(q_nope_old, q_nope, "q_nope");
  expect_bit_equal(q_pe_old, q_pe, "q_pe");
  expect_bit_equal(pool_old, pool_new, "pool");
  // The op did write the three real tokens' entries and nothing else (the padding row none).
  int64_t changed = 0;
  for (int64_t i = 0; i < pool0.numel(); ++i) changed += pool0.f32()[i] != pool_new.f32()[i];
  EXPECT_EQ(changed, 3 * entry);
  // q rows in their own tensor (the q_lora layout: q_b's output) give the same result.
  Tensor q_only = Tensor::empty({t, qw}, DType::kF32);
  be->copy_columns(proj, 0, q_only);
  Tensor pool_sep = pool0.clone();
  Tensor q_nope2 = Tensor::empty({t, d.hq, d.dn}, DType::kF32);
  Tensor q_pe2 = Tensor::empty({t, d.hq, d.dr}, DType::kF32);
  p.q = &q_only;
  p.q_nope = &q_nope2;
  p.q_pe = &q_pe2;
  p.pool = &pool_sep;
  be->mla_rope_store(p);
  expect_bit_equal(q_nope, q_nope2, "q_nope (separate q)");
  expect_bit_equal(q_pe, q_pe2, "q_pe (separate q)");
  expect_bit_equal(pool_new, pool_sep, "pool (separate q)");
}

TEST_P(MlaRopeStoreCpu, SplitQueryAttentionEqualsConcatenated) {
  const Dims d = GetParam();
  auto be = make_cpu_backend();
  const int32_t entry = d.lat + d.dr;
  Batch bt(d.block_size, entry);
  const int64_t t = bt.b.num_tokens;
  const Tensor pool = random_f32({bt.layout.num_blocks, 2, d.block_size, entry}, 4);
  const Tensor q_lat = random_f32({t, d.hq, d.lat}, 5);
  const Tensor q_pe = random_f32({t, d.hq, d.dr}, 6);
  Tensor q_full = Tensor::empty({t, d.hq, entry}, DType::kF32);
  Tensor rows = q_full.reshape({t * d.hq, entry});
  be->write_columns(q_lat, rows, 0);
  be->write_columns(q_pe, rows, d.lat);
  auto attend = [&](const Tensor& q, const Tensor* q_rope) {
    Tensor o = Tensor::empty({t, d.hq, d.lat}, DType::kF32);
    PagedAttentionParams ap;
    ap.q = &q;
    ap.q_rope = q_rope;
    ap.out = &o;
    ap.pool = &pool;
    ap.layout = bt.layout;
    ap.layer = 1;
    ap.num_q_heads = d.hq;
    ap.num_kv_heads = 1;
    ap.head_dim_qk = entry;
    ap.head_dim_v = d.lat;
    ap.scale = 0.1f;
    ap.batch = &bt.b;
    be->paged_attention(ap);
    return o;
  };
  const Tensor whole = attend(q_full, nullptr), split = attend(q_lat, &q_pe);
  expect_bit_equal(whole, split, "attention out");
  double max_abs = 0.0;
  for (int64_t i = 0; i < whole.numel(); ++i)
    max_abs = std::max(max_abs, std::fabs(double{whole.f32()[i]}));
  EXPECT_GT(max_abs, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Dims, MlaRopeStoreCpu,
                         ::testing::Values(Dims{16, 128, 64, 512, 16, true},  // V2-Lite
                                           Dims{3, 16, 8, 32, 1, true},       // the goldens
                                           Dims{5, 7, 6, 33, 4, false}),      // odd
                         [](const auto& info) {
                           const Dims& d = info.param;
                           return "hq" + std::to_string(d.hq) + "_d" + std::to_string(d.dn) + "_" +
                                  std::to_string(d.dr) + "_lat" + std::to_string(d.lat) + "_bs" +
                                  std::to_string(d.block_size) +
                                  (d.interleaved ? "_interleaved" : "_half");
                         });

}  // namespace
}  // namespace di
