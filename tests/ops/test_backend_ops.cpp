// Every op of the CUDA backend against the CPU oracle (one OpCase per op and shape, one
// registration line each), plus GPU sampling against the CPU sampler. Skips when no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>

#include "backend/profiling_backend.h"
#include "op_case.h"
#include "sampling/sampler.h"

#ifdef DI_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_sampler.h"
#include "backend/cuda/kernels/attention.h"
#include "backend/cuda/kernels/decode_fused.h"
#include "backend/cuda/kernels/gemv.h"
#endif

namespace di::testing {
namespace {

// ---- ops ---------------------------------------------------------------------------------------

struct TestEmbedding : OpCase {
  int64_t vocab, hidden, tokens;
  TestEmbedding(int64_t v, int64_t h, int64_t t) : vocab(v), hidden(h), tokens(t) {}
  std::string name() const override {
    return "embedding_v" + std::to_string(vocab) + "_h" + std::to_string(hidden) + "_t" +
           std::to_string(tokens);
  }
  std::vector<Output> run(Backend& be) const override {
    Tensor table = act(be, host_random({vocab, hidden}, 1));
    std::vector<int32_t> ids;
    std::mt19937 rng(2);
    for (int64_t i = 0; i < tokens; ++i) ids.push_back(static_cast<int32_t>(rng() % vocab));
    ids.back() = static_cast<int32_t>(vocab - 1);
    Tensor y = be.empty({tokens, hidden}, be.compute_dtype());
    be.embedding(ints(be, ids), table, y);
    return {out(be, "out", y, Check::kExact)};
  }
};

struct TestLinear : OpCase {
  int64_t m, n, k;
  bool bias, f32_out;
  TestLinear(int64_t m_, int64_t n_, int64_t k_, bool b = false, bool f = false)
      : m(m_), n(n_), k(k_), bias(b), f32_out(f) {}
  std::string name() const override {
    return "linear_m" + std::to_string(m) + "_n" + std::to_string(n) + "_k" + std::to_string(k) +
           (bias ? "_bias" : "") + (f32_out ? "_f32out" : "");
  }
  std::vector<Output> run(Backend& be) const override {
    Tensor x = act(be, host_random({m, k}, 3));
    Tensor w = act(be, host_random({n, k}, 4, 0.05f));
    Tensor b = act(be, host_random({n}, 5));
    Tensor y = be.empty({m, n}, f32_out ? DType::kF32 : be.compute_dtype());
    be.linear(x, w, bias ? &b : nullptr, y);
    return {out(be, "y", y, Check::kBf16)};
  }
};

struct TestRmsNorm : OpCase {
  int64_t rows, d;
  bool in_place;
  TestRmsNorm(int64_t r, int64_t d_, bool ip = false) : rows(r), d(d_), in_place(ip) {}
  std::string name() const override {
    return "rms_norm_r" + std::to_string(rows) + "_d" + std::to_string(d) +
           (in_place ? "_inplace" : "");
  }
  std::vector<Output> run(Backend& be) const override {
    Tensor x = act(be, host_random({rows, d}, 6, 3.0f));
    Tensor w = act(be, host_random({d}, 7));
    if (in_place) {
      be.rms_norm(x, w, 1e-6f, x);
      return {out(be, "y", x, Check::kBf16)};
    }
    Tensor y = be.empty({rows, d}, be.compute_dtype());
    be.rms_norm(x, w, 1e-6f, y);
    return {out(be, "y", y, Check::kBf16)};
  }
};

struct TestAddRmsNorm : OpCase {
  int64_t rows, d;
  TestAddRmsNorm(int64_t r, int64_t d_) : rows(r), d(d_) {}
  std::string name() const override {
    return "add_rms_norm_r" + std::to_string(rows) + "_d" + std::to_string(d);
  }
  std::vector<Output> run(Backend& be) const override {
    Tensor x = act(be, host_random({rows, d}, 8));
    Tensor res = act(be, host_random({rows, d}, 9, 4.0f));
    Tensor w = act(be, host_random({d}, 10));
    Tensor y = be.empty({rows, d}, be.compute_dtype());
    be.add_rms_norm(x, res, w, 1e-5f, y);
    return {out(be, "y", y, Check::kBf16), out(be, "residual", res, Check::kBf16)};
  }
};

// Backend::fused_linear: norm / silu·mul prologue, bias, y and/or residual += (on CUDA the
// small-M GEMV kernel up to gemv_max_rows rows, the composed path beyond; gpu_check also runs
// these with DEEPINFER_GEMV_MAX_ROWS=8 so every templated row count is exercised).
struct TestFusedLinear : OpCase {
  using In = FusedLinearParams::In;
  int64_t m, n, k;
  In in;
  bool bias, y_f32, residual, y_too, silu_out;
  TestFusedLinear(int64_t m_, int64_t n_, int64_t k_, In in_, bool bias_, bool y_f32_,
                  bool residual_, bool y_too_ = false, bool silu_out_ = false)
      : m(m_),
        n(n_),
        k(k_),
        in(in_),
        bias(bias_),
        y_f32(y_f32_),
        residual(residual_),
        y_too(y_too_),
        silu_out(silu_out_) {}
  std::string name() const override {
    static constexpr const char* kIn[] = {"plain", "norm", "silu"};
    return "fused_linear_" + std::string(kIn[static_cast<int>(in)]) + "_m" + std::to_string(m) +
           "_n" + std::to_string(n) + "_k" + std::to_string(k) + (bias ? "_bias" : "") +
           (y_f32 ? "_f32" : "") + (residual ? (y_too ? "_res_y" : "_res") : "") +
           (silu_out ? "_silu_out" : "");
  }
  std::vector<Output> run(Backend& be) const override {
    const int64_t in_cols = in == In::kSiluMul ? 2 * k : k;
    Tensor x = act(be, host_random({m, in_cols}, 31, in == In::kRmsNorm ? 3.0f : 2.0f));
    Tensor nw = act(be, host_random({k}, 32));
    Tensor w = act(be, host_random({n, k}, 33, 1.0f / std::sqrt(static_cast<float>(k)) * 1.7f));
    Tensor b = act(be, host_random({n}, 34, 0.5f));
    Tensor res = act(be, host_random({m, n}, 35, 2.0f));
    Tensor y = be.empty({m, silu_out ? n / 2 : n}, y_f32 ? DType::kF32 : be.compute_dtype());
    FusedLinearParams p;
    p.in = in;
    p.silu_out = silu_out;
    p.x = &x;
    p.norm_w = &nw;
    p.eps = 1e-5f;
    p.w = &w;
    p.bias = bias ? &b : nullptr;
    p.y = (!residual || y_too) ? &y : nullptr;
    p.residual = residual ? &res : nullptr;
    be.fused_linear(p);
    std::vector<Output> o;
    if (p.y) o.push_back(out(be, "y", y, y_f32 ? Check::kF32 : Check::kBf16));
    if (residual) o.push_back(out(be, "residual", res, Check::kBf16));
    return o;
  }
};

struct TestAdd : OpCase {
  int64_t n;
  explicit TestAdd(int64_t n_) : n(n_) {}
  std::string name() const override { return "add_n" + std::to_string(n); }
  std::vector<Output> run(Backend& be) const override {
    Tensor a = act(be, host_random({n}, 11)), b = act(be, host_random({n}, 12));
    Tensor c = be.empty({n}, be.compute_dtype());
    be.add(a, b, c);
    be.add(c, b, c);  // aliasing out == a
    return {out(be, "out", c, Check::kBf16)};
  }
};

struct TestSiluMul : OpCase {
  int64_t rows, inter;
  TestSiluMul(int64_t r, int64_t i) : rows(r), inter(i) {}
  std::string name() const override {
    return "silu_mul_r" + std::to_string(rows) + "_i" + std::to_string(inter);
  }
  std::vector<Output> run(Backend& be) const override {
    Tensor gu = act(be, host_random({rows, 2 * inter}, 13, 4.0f));
    Tensor y = be.empty({rows, inter}, be.compute_dtype());
    be.silu_mul(gu, y);
    return {out(be, "out", y, Check::kBf16)};
  }
};

struct TestRope : OpCase {
  int64_t tokens, heads, row;
  int32_t rot_begin, rot_dim;
  bool interleaved;
  TestRope(int64_t t, int64_t h, int64_t r, int32_t b, int32_t d, bool il)
      : tokens(t), heads(h), row(r), rot_begin(b), rot_dim(d), interleaved(il) {}
  std::string name() const override {
    return "rope_t" + std::to_string(tokens) + "_h" + std::to_string(heads) + "_row" +
           std::to_string(row) + "_rot" + std::to_string(rot_begin) + "+" +
           std::to_string(rot_dim) + (interleaved ? "_interleaved" : "_half");
  }
  std::vector<Output> run(Backend& be) const override {
    const int64_t max_pos = 4096;
    Tensor cs = Tensor::empty({max_pos, rot_dim}, DType::kF32);
    for (int64_t p = 0; p < max_pos; ++p)
      for (int32_t j = 0; j < rot_dim / 2; ++j) {
        const double f = std::pow(10000.0, -2.0 * j / rot_dim) * static_cast<double>(p);
        cs.f32()[p * rot_dim + j] = static_cast<float>(std::cos(f));
        cs.f32()[p * rot_dim + rot_dim / 2 + j] = static_cast<float>(std::sin(f));
      }
    Tensor x = act(be, host_random({tokens, heads, row}, 14));
    std::vector<int32_t> pos;
    for (int64_t i = 0; i < tokens; ++i) pos.push_back(static_cast<int32_t>((i * 997) % max_pos));
    // The table in f32 on both backends: the op's own arithmetic only.
    be.rope(x, rot_begin, rot_dim, ints(be, pos), be.upload(cs, DType::kF32), interleaved);
    return {out(be, "x", x, Check::kBf16)};
  }
};

struct TestColumns : OpCase {
  int64_t rows, cols, begin, width;
  bool write;
  TestColumns(int64_t r, int64_t c, int64_t b, int64_t w, bool wr)
      : rows(r), cols(c), begin(b), width(w), write(wr) {}
  std::string name() const override {
    return std::string(write ? "write" : "copy") + "_columns_r" + std::to_string(rows) + "_c" +
           std::to_string(cols) + "_at" + std::to_string(begin) + "_w" + std::to_string(width);
  }
  std::vector<Output> run(Backend& be) const override {
    if (!write) {
      Tensor src = act(be, host_random({rows, cols}, 15));
      Tensor dst = be.empty({rows, width}, be.compute_dtype());
      be.copy_columns(src, static_cast<int32_t>(begin), dst);
      return {out(be, "dst", dst, Check::kExact)};
    }
    Tensor dst = act(be, host_random({rows, cols}, 16));
    Tensor src = act(be, host_random({rows, width}, 17));
    be.write_columns(src, dst, static_cast<int32_t>(begin));
    return {out(be, "dst", dst, Check::kExact)};
  }
};

// A paged batch over a shuffled pool: seqs = (cached tokens, new tokens) each.
struct PagedSetup {
  KvLayout layout;
  PagedBatch batch;
  std::vector<int32_t> positions, slots, qo{0}, kv_ptr{0}, kv_idx, last;
  int32_t num_tokens = 0, max_kv = 0;

  PagedSetup(const std::vector<std::pair<int, int>>& seqs, int32_t block_size, int32_t layers,
             int32_t entry) {
    int32_t blocks = 3;
    for (auto [c, n] : seqs) blocks += (c + n + block_size - 1) / block_size;
    std::vector<int32_t> perm(static_cast<size_t>(blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(21));
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

struct TestStoreKv : OpCase {
  int32_t block_size, width, entry, offset;
  TestStoreKv(int32_t bs, int32_t w, int32_t e, int32_t off)
      : block_size(bs), width(w), entry(e), offset(off) {}
  std::string name() const override {
    return "store_kv_bs" + std::to_string(block_size) + "_w" + std::to_string(width) + "_entry" +
           std::to_string(entry) + "_at" + std::to_string(offset);
  }
  std::vector<Output> run(Backend& be) const override {
    PagedSetup s({{0, 37}, {50, 3}, {7, 1}, {0, 0}, {200, 64}}, block_size, 3, entry);
    PagedBatch b = s.make(be);
    Tensor pool = act(be, host_random({s.layout.num_blocks, 3, block_size, entry}, 22));
    Tensor src = act(be, host_random({s.num_tokens, width}, 23));
    be.store_kv(src, pool, s.layout, 1, offset, b);
    return {out(be, "pool", pool, Check::kExact)};
  }
};

struct TestCopyBlocks : OpCase {
  int32_t block_size, entry;
  TestCopyBlocks(int32_t bs, int32_t e) : block_size(bs), entry(e) {}
  std::string name() const override {
    return "copy_blocks_bs" + std::to_string(block_size) + "_entry" + std::to_string(entry);
  }
  std::vector<Output> run(Backend& be) const override {
    const KvLayout layout{6, 3, block_size, entry};
    Tensor pool = act(be, host_random({6, 3, block_size, entry}, 24));
    // In order: block 5 becomes block 2, then block 1 becomes the new block 5.
    const std::vector<std::pair<int32_t, int32_t>> copies{{2, 5}, {0, 3}, {5, 1}};
    be.copy_blocks(pool, layout, copies);
    return {out(be, "pool", pool, Check::kExact)};
  }
};

struct TestPagedAttention : OpCase {
  std::string label;
  int32_t hq, hkv, dqk, dv, block_size;
  bool mla;
  std::vector<std::pair<int, int>> seqs;  // (cached, new)
  int32_t rope_split;  // > 0: the query as q [.., dqk - rope_split] + q_rope [.., rope_split]
  TestPagedAttention(std::string l, int32_t q, int32_t kv, int32_t dk, int32_t dv_, bool m,
                     int32_t bs, std::vector<std::pair<int, int>> s, int32_t split = 0)
      : label(std::move(l)),
        hq(q),
        hkv(kv),
        dqk(dk),
        dv(dv_),
        block_size(bs),
        mla(m),
        seqs(std::move(s)),
        rope_split(split) {}
  std::string name() const override {
    return "paged_attention_" + label + "_hq" + std::to_string(hq) + "_hkv" + std::to_string(hkv) +
           "_d" + std::to_string(dqk) + "x" + std::to_string(dv) + "_bs" +
           std::to_string(block_size) +
           (rope_split > 0 ? "_qrope" + std::to_string(rope_split) : "");
  }
  std::vector<Output> run(Backend& be) const override {
    const int32_t entry = mla ? dqk : 2 * hkv * dqk;
    const int32_t layers = 2, layer = 1;
    PagedSetup s(seqs, block_size, layers, entry);
    PagedBatch b = s.make(be);
    Tensor pool = act(be, host_random({s.layout.num_blocks, layers, block_size, entry}, 31));
    // The same query values either way (seed 32), split into two tensors when asked.
    const Tensor q_host = host_random({s.num_tokens, hq, dqk}, 32);
    const int32_t dq = dqk - rope_split;
    Tensor q_main = Tensor::empty({s.num_tokens, hq, dq}, DType::kF32);
    Tensor q_rope_host = Tensor::empty({s.num_tokens, hq, std::max(rope_split, 1)}, DType::kF32);
    for (int64_t r = 0; r < int64_t{s.num_tokens} * hq; ++r)
      for (int32_t i = 0; i < dqk; ++i) {
        if (i < dq)
          q_main.f32()[r * dq + i] = q_host.f32()[r * dqk + i];
        else
          q_rope_host.f32()[r * rope_split + i - dq] = q_host.f32()[r * dqk + i];
      }
    Tensor q = act(be, rope_split > 0 ? q_main : q_host);
    Tensor q_rope = act(be, q_rope_host);
    Tensor o = be.empty({s.num_tokens, hq, dv}, be.compute_dtype());
    PagedAttentionParams p;
    p.q = &q;
    p.q_rope = rope_split > 0 ? &q_rope : nullptr;
    p.out = &o;
    p.pool = &pool;
    p.layout = s.layout;
    p.layer = layer;
    p.num_q_heads = hq;
    p.num_kv_heads = hkv;
    p.head_dim_qk = dqk;
    p.head_dim_v = dv;
    p.k_offset = 0;
    p.v_offset = mla ? 0 : hkv * dqk;
    p.kv_head_stride = mla ? 0 : dqk;
    p.scale = 1.0f / std::sqrt(static_cast<float>(dqk));
    p.batch = &b;
    be.paged_attention(p);
    return {out(be, "out", o, Check::kBf16)};
  }
};

struct TestHeadLinear : OpCase {
  int64_t t, heads, k, n;
  TestHeadLinear(int64_t t_, int64_t h, int64_t k_, int64_t n_) : t(t_), heads(h), k(k_), n(n_) {}
  std::string name() const override {
    return "head_linear_t" + std::to_string(t) + "_h" + std::to_string(heads) + "_k" +
           std::to_string(k) + "_n" + std::to_string(n);
  }
  std::vector<Output> run(Backend& be) const override {
    Tensor x = act(be, host_random({t, heads, k}, 41));
    Tensor w = act(be, host_random({heads, n, k}, 42, 0.1f));
    Tensor y = be.empty({t, heads, n}, be.compute_dtype());
    be.head_linear(x, w, y);
    return {out(be, "y", y, Check::kBf16)};
  }
};

struct TestMoeRoute : OpCase {
  std::string label;
  MoeRoutingParams p;
  int64_t tokens;
  bool bias;
  TestMoeRoute(std::string l, MoeRoutingParams p_, int64_t t, bool b)
      : label(std::move(l)), p(p_), tokens(t), bias(b) {}
  std::string name() const override { return "moe_route_" + label; }
  std::vector<Output> run(Backend& be) const override {
    Tensor logits = be.upload(host_random({tokens, p.num_experts}, 51, 3.0f), DType::kF32);
    Tensor bias_host = host_random({p.num_experts}, 52, 0.1f);  // host f32, as the model passes it
    MoeRoutingParams q = p;
    q.correction_bias = bias ? &bias_host : nullptr;
    Tensor ids = be.empty({tokens, p.top_k}, DType::kI32);
    Tensor w = be.empty({tokens, p.top_k}, DType::kF32);
    be.moe_route(logits, q, ids, w);
    return {out(be, "topk_ids", ids, Check::kIds), out(be, "topk_weights", w, Check::kF32)};
  }
};

// k distinct experts per token, drawn by shuffling 0..E-1 with `rng`.
std::vector<int32_t> random_topk_ids(int64_t tokens, int64_t experts, int64_t top_k,
                                     std::mt19937& rng) {
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> e(static_cast<size_t>(experts));
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), rng);
    ids.insert(ids.end(), e.begin(), e.begin() + top_k);
  }
  return ids;
}

struct TestMoeExperts : OpCase {
  int64_t tokens, hidden, inter, experts, top_k;
  // skip > 0: that fraction of the entries gets id -1 (skipped: padding, or another EP rank's
  // expert in the latency exchange), and the last token has every entry skipped (output 0).
  double skip;
  TestMoeExperts(int64_t t, int64_t h, int64_t i, int64_t e, int64_t k, double s = 0.0)
      : tokens(t), hidden(h), inter(i), experts(e), top_k(k), skip(s) {}
  std::string name() const override {
    return "moe_experts_t" + std::to_string(tokens) + "_h" + std::to_string(hidden) + "_i" +
           std::to_string(inter) + "_e" + std::to_string(experts) + "_k" + std::to_string(top_k) +
           (skip > 0 ? "_skip" : "");
  }
  std::vector<Output> run(Backend& be) const override {
    Tensor x = act(be, host_random({tokens, hidden}, 61));
    ExpertWeights w{act(be, host_random({experts, 2 * inter, hidden}, 62, 0.1f)),
                    act(be, host_random({experts, hidden, inter}, 63, 0.1f))};
    std::mt19937 rng(64);
    std::vector<int32_t> ids = random_topk_ids(tokens, experts, top_k, rng);
    if (skip > 0) {
      std::uniform_real_distribution<double> coin(0.0, 1.0);
      for (int32_t& id : ids) {
        if (coin(rng) < skip) id = -1;
      }
      for (int64_t j = 0; j < top_k; ++j) ids[static_cast<size_t>((tokens - 1) * top_k + j)] = -1;
    }
    Tensor idt = ints(be, ids).reshape({tokens, top_k});
    Tensor wt = be.upload(host_random({tokens, top_k}, 65), DType::kF32);
    Tensor y = be.empty({tokens, hidden}, be.compute_dtype());
    be.moe_experts(x, idt, wt, w, y);
    return {out(be, "out", y, Check::kBf16)};
  }
};

// The MoE block's router with its pre-norm (Backend::moe_norm_route): h, the routing and the
// logits. CUDA takes one kernel for one token and for a few while tokens · hidden <= 4096, else
// the composed ops; the CPU is the composed ops.
struct TestMoeNormRoute : OpCase {
  std::string label;
  MoeRoutingParams p;
  int64_t tokens, hidden;
  bool bias;
  TestMoeNormRoute(std::string l, MoeRoutingParams p_, int64_t t, int64_t h, bool b)
      : label(std::move(l)), p(p_), tokens(t), hidden(h), bias(b) {}
  std::string name() const override {
    return "moe_norm_route_" + label + "_t" + std::to_string(tokens) + "_h" +
           std::to_string(hidden);
  }
  std::vector<Output> run(Backend& be) const override {
    // The CPU normalises in f32, CUDA rounds h to bf16 first, so the logits differ by ~1e-3 of
    // a random dot product: enough to swap two experts whose logits are that close. The inputs
    // keep the logits apart instead: x[t] = b + 0.3·noise, norm weights in [0.5, 1.5], gate row
    // e = s_e·c·b + 0.0002·noise with the s_e distinct ((37·e mod E) / E - 1/2) and c = 6 /
    // (hidden · rms(b)), so h·gate_e ≈ s_e · 6 (h·b ≈ hidden · rms(b) > 0): logits within ±3,
    // 6 / E apart, where the two backends differ by ~1e-4. (The correction bias is off here:
    // test_cuda_moe checks it against the GPU's own router bitwise.)
    const int64_t e_n = p.num_experts;
    const Tensor b = host_random({hidden}, 70, 2.0f);
    Tensor xh = host_random({tokens, hidden}, 71, 0.3f);
    for (int64_t i = 0; i < xh.numel(); ++i)
      xh.f32()[i] = round_bf16(xh.f32()[i] + b.f32()[i % hidden]);
    Tensor nwh = host_random({hidden}, 72, 0.5f);
    for (int64_t i = 0; i < hidden; ++i) nwh.f32()[i] = round_bf16(nwh.f32()[i] + 1.0f);
    Tensor gh = host_random({e_n, hidden}, 73, 0.0002f);
    double b2 = 0.0;
    for (int64_t i = 0; i < hidden; ++i) b2 += double{b.f32()[i]} * b.f32()[i];
    const float c =
        static_cast<float>(6.0 / (static_cast<double>(hidden) * std::sqrt(b2 / hidden)));
    for (int64_t e = 0; e < e_n; ++e) {
      const float se = static_cast<float>((37 * e) % e_n) / static_cast<float>(e_n) - 0.5f;
      for (int64_t i = 0; i < hidden; ++i)
        gh.f32()[e * hidden + i] = round_bf16(gh.f32()[e * hidden + i] + se * c * b.f32()[i]);
    }
    Tensor x = act(be, xh);
    Tensor nw = act(be, nwh);
    Tensor gate = act(be, gh);
    Tensor bias_host = host_random({p.num_experts}, 74, 0.1f);
    MoeNormRouteParams q;
    q.x = &x;
    q.norm_w = &nw;
    q.eps = 1e-6f;
    q.gate = &gate;
    q.routing = p;
    q.routing.correction_bias = bias ? &bias_host : nullptr;
    Tensor h = be.empty({tokens, hidden}, be.compute_dtype());
    Tensor ids = be.empty({tokens, p.top_k}, DType::kI32);
    Tensor w = be.empty({tokens, p.top_k}, DType::kF32);
    Tensor logits = be.empty({tokens, p.num_experts}, DType::kF32);
    q.h = &h;
    q.topk_ids = &ids;
    q.topk_weights = &w;
    q.logits = &logits;
    be.moe_norm_route(q);
    return {out(be, "h", h, Check::kBf16), out(be, "logits", logits, Check::kBf16),
            out(be, "topk_ids", ids, Check::kIds), out(be, "topk_weights", w, Check::kBf16)};
  }
};

// A MoE block's output added to the residual (Backend::moe_residual), with and without a
// shared expert of `shared_mult` · inter columns. CUDA: the one-token kernels for one token (the
// shared expert as extra slots), else the composed ops.
struct TestMoeResidual : OpCase {
  int64_t tokens, hidden, inter, experts, top_k, shared_mult;
  TestMoeResidual(int64_t t, int64_t h, int64_t i, int64_t e, int64_t k, int64_t s)
      : tokens(t), hidden(h), inter(i), experts(e), top_k(k), shared_mult(s) {}
  std::string name() const override {
    return "moe_residual_t" + std::to_string(tokens) + "_h" + std::to_string(hidden) + "_i" +
           std::to_string(inter) + "_e" + std::to_string(experts) + "_k" + std::to_string(top_k) +
           "_shared" + std::to_string(shared_mult);
  }
  std::vector<Output> run(Backend& be) const override {
    Tensor x = act(be, host_random({tokens, hidden}, 81));
    Tensor res = act(be, host_random({tokens, hidden}, 82, 4.0f));
    ExpertWeights w{act(be, host_random({experts, 2 * inter, hidden}, 83, 0.1f)),
                    act(be, host_random({experts, hidden, inter}, 84, 0.1f))};
    const int64_t si = shared_mult * inter;
    Tensor sgu, sd;
    if (shared_mult > 0) {
      sgu = act(be, host_random({2 * si, hidden}, 85, 0.1f));
      sd = act(be, host_random({hidden, si}, 86, 0.1f));
    }
    std::mt19937 rng(87);
    const std::vector<int32_t> ids = random_topk_ids(tokens, experts, top_k, rng);
    Tensor idt = ints(be, ids).reshape({tokens, top_k});
    Tensor wt = be.upload(host_random({tokens, top_k}, 88), DType::kF32);
    be.moe_residual({.x = &x,
                     .topk_ids = &idt,
                     .topk_weights = &wt,
                     .experts = &w,
                     .shared_gate_up = shared_mult > 0 ? &sgu : nullptr,
                     .shared_down = shared_mult > 0 ? &sd : nullptr,
                     .residual = &res});
    return {out(be, "residual", res, Check::kBf16)};
  }
};

}  // namespace
}  // namespace di::testing

#include "decode_fused_cases.h"  // issue #5: fused decode ops

namespace di::testing {
namespace {

// ---- the table ---------------------------------------------------------------------------------

std::vector<std::shared_ptr<OpCase>> all_cases() {
  using P = std::vector<std::pair<int, int>>;
  std::vector<std::shared_ptr<OpCase>> c;
  auto add = [&](OpCase* x) { c.emplace_back(x); };
  add(new TestEmbedding(32001, 256, 37));
  add(new TestEmbedding(1000, 4096, 3));
  add(new TestLinear(1, 4096, 4096));
  add(new TestLinear(33, 1000, 512));
  add(new TestLinear(128, 1024, 1024));
  add(new TestLinear(5, 96, 128, true));
  add(new TestLinear(3, 32001, 128, false, true));
  add(new TestLinear(7, 64, 2048, false, true));  // router logits
  add(new TestRmsNorm(7, 4096));
  add(new TestRmsNorm(31, 576, true));
  add(new TestRmsNorm(3, 4095));
  add(new TestAddRmsNorm(9, 4096));
  add(new TestAddRmsNorm(1, 7168));
  add(new TestAdd(10001));
  {
    using In = FusedLinearParams::In;
    add(new TestFusedLinear(1, 6144, 4096, In::kRmsNorm, false, false, false));  // Llama qkv
    add(new TestFusedLinear(1, 4096, 4096, In::kNone, false, false, true));      // o_proj += x
    add(new TestFusedLinear(1, 4096, 14336, In::kSiluMul, false, false, true));  // down += x
    add(new TestFusedLinear(4, 4096, 14336, In::kSiluMul, false, false, true));
    add(new TestFusedLinear(1, 4096, 14336, In::kNone, false, false, true));        // down += h
    add(new TestFusedLinear(2, 1152, 4096, In::kRmsNorm, true, false, false));      // qkv bias
    add(new TestFusedLinear(3, 1000, 520, In::kRmsNorm, true, false, true, true));  // k % 256 != 0
    add(new TestFusedLinear(8, 576, 2048, In::kNone, false, false, false));
    add(new TestFusedLinear(5, 64, 2048, In::kNone, false, true, false));  // router, f32
    add(new TestFusedLinear(7, 37, 64, In::kSiluMul, false, false, false));
    add(new TestFusedLinear(6, 300, 128, In::kRmsNorm, false, false, true, true));
    add(new TestFusedLinear(1, 32001, 256, In::kRmsNorm, false, true, false));  // lm_head
    add(new TestFusedLinear(9, 300, 128, In::kRmsNorm, true, false, true));     // > 8 rows
    // silu·mul as the epilogue (y = silu(r[:, :n/2]) · r[:, n/2:]): Llama gate_up, odd shapes,
    // the ring (m = 1, 2) and register paths, k split over warps (small n), > 8 rows (composed).
    add(new TestFusedLinear(1, 28672, 4096, In::kRmsNorm, false, false, false, false, true));
    add(new TestFusedLinear(1, 2816, 2048, In::kNone, false, false, false, false, true));
    add(new TestFusedLinear(2, 1000, 520, In::kRmsNorm, false, false, false, false, true));
    add(new TestFusedLinear(3, 74, 64, In::kNone, false, false, false, false, true));
    add(new TestFusedLinear(8, 2816, 2048, In::kRmsNorm, false, false, false, false, true));
    add(new TestFusedLinear(1, 16, 4096, In::kRmsNorm, false, false, false, false, true));
    add(new TestFusedLinear(12, 300, 128, In::kNone, false, false, false, false, true));
    add(new TestFusedLinear(2, 50, 100, In::kNone, true, false, true));  // k % 8 != 0
    // One row at the MoE models' attention projections (qkv / q|kv_a with the norm, o_proj += x)
    // and odd shapes (bias with y and the residual, the silu·mul prologue into f32 y).
    add(new TestFusedLinear(1, 5120, 2048, In::kRmsNorm, false, false, false));  // Qwen3 qkv
    add(new TestFusedLinear(1, 2048, 4096, In::kNone, false, false, true));      // Qwen3 o
    add(new TestFusedLinear(1, 3648, 2048, In::kRmsNorm, false, false, false));  // V2-Lite q|kv_a
    add(new TestFusedLinear(1, 2048, 2048, In::kNone, false, false, true));      // V2-Lite o
    add(new TestFusedLinear(1, 1003, 520, In::kRmsNorm, true, false, true, true));
    add(new TestFusedLinear(1, 777, 2056, In::kSiluMul, false, true, false));
  }
  add(new TestSiluMul(13, 1408));
  add(new TestSiluMul(1, 14336));
  add(new TestRope(17, 8, 128, 0, 128, false));
  add(new TestRope(17, 16, 192, 128, 64, true));
  add(new TestRope(5, 1, 64, 0, 64, true));
  add(new TestColumns(19, 6144, 4096, 1024, false));
  add(new TestColumns(19, 576, 512, 64, false));
  add(new TestColumns(16, 576, 0, 512, true));
  add(new TestColumns(16, 576, 512, 64, true));
  add(new TestStoreKv(16, 1024, 2048, 1024));
  add(new TestStoreKv(1, 512, 576, 0));
  add(new TestStoreKv(64, 64, 576, 512));
  add(new TestCopyBlocks(64, 576));
  add(new TestCopyBlocks(1, 2048));
  // GQA decode (one new token per sequence), ragged contexts incl. kv_len 97 and a long one.
  add(new TestPagedAttention("gqa_decode", 32, 8, 128, 128, false, 16,
                             P{{96, 1}, {0, 1}, {299, 1}, {1023, 1}}));
  add(new TestPagedAttention("gqa_decode_split", 32, 8, 128, 128, false, 64,
                             P{{2999, 1}, {600, 1}}));
  add(new TestPagedAttention("gqa_decode_bs1", 8, 2, 64, 64, false, 1, P{{96, 1}, {40, 1}}));
  // The decode kernel's other instantiations: group 8 (Qwen3-30B-A3B), head dim 256, group 1.
  add(new TestPagedAttention("gqa_decode_g8", 32, 4, 128, 128, false, 16,
                             P{{511, 1}, {0, 1}, {2047, 1}}));
  // Qwen3-30B-A3B at batch 1, ctx 2048: 32 splits x 4 kv heads, the batch-1 grid of one CTA per SM.
  add(new TestPagedAttention("gqa_decode_g8_bs1", 32, 4, 128, 128, false, 16, P{{2047, 1}}));
  // Shapes added for run 44's cluster decode kernel (removed in run 48), kept for the split
  // kernel and the combine: a long context (4,000 keys), a few short ones with a context on a
  // sub-tile edge next to a sequence without a new token, group 16 at head dim 64.
  add(new TestPagedAttention("gqa_decode_g8_4000", 32, 4, 128, 128, false, 16, P{{4000, 1}}));
  add(new TestPagedAttention("gqa_decode_g8_short", 32, 4, 128, 128, false, 16,
                             P{{100, 1}, {255, 1}, {20, 0}, {16, 1}}));
  add(new TestPagedAttention("gqa_decode_g16_d64", 32, 2, 64, 64, false, 64, P{{1199, 1}}));
  add(new TestPagedAttention("gqa_decode_d256", 8, 4, 256, 256, false, 64, P{{300, 1}, {64, 1}}));
  add(new TestPagedAttention("mha_decode", 4, 4, 128, 128, false, 16,
                             P{{70, 1}, {5, 1}, {129, 1}}));
  // The tensor-core decode kernel's groups (default from 4 q heads per kv head): group 16, head
  // dim 64, and a batch of 33 with a sequence without a new token and contexts around the
  // 16-key sub-tiles and 64-key splits.
  add(new TestPagedAttention("gqa_decode_g16", 32, 2, 128, 128, false, 16,
                             P{{700, 1}, {1, 1}, {64, 1}}));
  add(new TestPagedAttention("gqa_decode_g8_d64", 16, 2, 64, 64, false, 64,
                             P{{130, 1}, {2500, 1}, {15, 1}}));
  // More splits than the combine kernel preloads (kPreLoaded = 64): 5000 keys = 79 splits of 64.
  add(new TestPagedAttention("gqa_decode_g8_79splits", 32, 4, 128, 128, false, 64,
                             P{{4999, 1}, {100, 1}}));
  {
    P many;
    for (int i = 0; i < 33; ++i)
      many.push_back({(i * 97) % 301 + (i == 5 ? 1500 : 0), i == 7 ? 0 : 1});
    add(new TestPagedAttention("gqa_decode_g8_b33", 32, 4, 128, 128, false, 16, many));
  }
  // GQA prefill: ragged, with cached prefixes, an empty sequence (no new tokens), block sizes
  // 1/16/64.
  add(new TestPagedAttention("gqa_prefill", 32, 8, 128, 128, false, 64,
                             P{{0, 97}, {60, 5}, {33, 1}, {20, 0}, {0, 130}}));
  add(new TestPagedAttention("gqa_prefill_bs16", 16, 4, 128, 128, false, 16, P{{0, 97}, {17, 40}}));
  add(new TestPagedAttention("gqa_prefill_bs1", 8, 2, 64, 64, false, 1, P{{0, 33}, {9, 12}}));
  add(new TestPagedAttention("mha_prefill", 4, 4, 64, 64, false, 16, P{{0, 70}}));
  // MLA: one kv head, K = [latent 512 | rope 64], V = the latent.
  add(new TestPagedAttention("mla_decode", 16, 1, 576, 512, true, 64,
                             P{{96, 1}, {512, 1}, {0, 1}}));
  add(new TestPagedAttention("mla_decode_split", 128, 1, 576, 512, true, 64, P{{1500, 1}}));
  add(new TestPagedAttention("mla_prefill", 16, 1, 576, 512, true, 16, P{{0, 40}, {93, 7}}));
  add(new TestPagedAttention("mla_prefill_bs1", 8, 1, 576, 512, true, 1, P{{0, 20}, {5, 3}}));
  // MLA with the query in two parts (q_lat, q_pe): the decode kernel reads both; prefill, GQA and
  // the fp32 mode concatenate them first. Same CPU numbers as the cases above.
  add(new TestPagedAttention("mla_decode", 16, 1, 576, 512, true, 64, P{{96, 1}, {512, 1}, {0, 1}},
                             64));
  add(new TestPagedAttention("mla_decode_split", 128, 1, 576, 512, true, 16, P{{1500, 1}, {3, 2}},
                             64));
  add(new TestPagedAttention("mla_decode_golden", 3, 1, 40, 32, true, 1, P{{10, 1}, {70, 1}}, 8));
  add(new TestPagedAttention("mla_prefill", 16, 1, 576, 512, true, 16, P{{0, 40}, {93, 7}}, 64));
  add(new TestPagedAttention("gqa_decode_bs1", 8, 2, 64, 64, false, 1, P{{96, 1}, {40, 1}}, 16));
  add(new TestHeadLinear(7, 16, 128, 512));
  add(new TestHeadLinear(5, 16, 512, 128));
  add(new TestHeadLinear(1, 128, 128, 512));
  // The few-token kernel (kernels/head_linear.cu, t <= 64) at V2-Lite's shapes and batch sizes,
  // odd k steps and padded columns (k 40 / 24), n not a multiple of the CTA's 32 columns, and
  // t = 65 (cuBLAS again).
  add(new TestHeadLinear(1, 16, 128, 512));
  add(new TestHeadLinear(1, 16, 512, 128));
  add(new TestHeadLinear(32, 16, 128, 512));
  add(new TestHeadLinear(32, 16, 512, 128));
  add(new TestHeadLinear(64, 16, 512, 128));
  add(new TestHeadLinear(17, 3, 40, 24));
  add(new TestHeadLinear(2, 5, 24, 40));
  add(new TestHeadLinear(65, 16, 128, 512));
  {
    MoeRoutingParams p = v2_lite_routing();
    add(new TestMoeRoute("softmax_e64_k6", p, 33, false));
    p.num_groups = 8;
    p.topk_groups = 3;
    add(new TestMoeRoute("softmax_grouped_e64_g8_top3", p, 33, false));
    const MoeRoutingParams v3 = deepseek_v3_routing();
    add(new TestMoeRoute("sigmoid_bias_v3_e256_k8", v3, 65, true));
  }
  add(new TestMoeExperts(19, 256, 128, 8, 2));
  add(new TestMoeExperts(3, 1024, 512, 16, 6));
  add(new TestMoeExperts(64, 512, 256, 16, 4));
  // Skipped (-1) entries: batch-1 kernels, decode kernels, and a size past the decode range.
  add(new TestMoeExperts(1, 1024, 512, 16, 6, 0.4));
  add(new TestMoeExperts(2, 1024, 512, 16, 6, 0.4));
  add(new TestMoeExperts(19, 256, 128, 8, 2, 0.5));
  add(new TestMoeExperts(64, 512, 256, 16, 4, 0.3));
  add(new TestMoeExperts(700, 256, 128, 64, 8, 0.6));
  {
    // Qwen3-30B-A3B's router (softmax, renormalised top-8 of 128), V2-Lite's (softmax, top-6 of
    // 64, scaled), DeepSeek-V3's (sigmoid + bias, 8 groups, top-2-sum group score): one-kernel
    // sizes (1 token; 2 × 2048) and the composed ops (4, 5 tokens of 2048; 2-3 of 7168).
    const MoeRoutingParams qwen = qwen3_moe_routing();
    add(new TestMoeNormRoute("qwen3", qwen, 1, 2048, false));
    add(new TestMoeNormRoute("qwen3", qwen, 4, 2048, false));
    add(new TestMoeNormRoute("qwen3", qwen, 5, 2048, false));
    const MoeRoutingParams v2 = v2_lite_routing();
    add(new TestMoeNormRoute("v2lite", v2, 1, 2048, false));
    add(new TestMoeNormRoute("v2lite", v2, 3, 1024, false));
    add(new TestMoeNormRoute("v2lite", v2, 2, 264, false));
    const MoeRoutingParams v3 = deepseek_v3_routing();
    add(new TestMoeNormRoute("v3", v3, 1, 7168, false));
    add(new TestMoeNormRoute("v3", v3, 2, 7168, false));
    add(new TestMoeNormRoute("v3", v3, 3, 7168, false));
  }
  add(new TestMoeResidual(1, 2048, 768, 16, 8, 0));  // Qwen3-30B-A3B's shapes, fewer experts
  add(new TestMoeResidual(1, 2048, 1408, 8, 6, 2));  // V2-Lite: two shared slots
  add(new TestMoeResidual(1, 1024, 512, 8, 3, 1));   // one shared slot, odd top-k
  add(new TestMoeResidual(1, 1024, 512, 8, 2, 3));   // three shared slots (> the routed ones)
  add(new TestMoeResidual(3, 1024, 512, 8, 2, 2));   // composed (3 tokens)
  add(new TestMoeResidual(1, 1024, 256, 8, 2, 0));
  add_decode_fused_cases(c);
  return c;
}

// ---- driver ------------------------------------------------------------------------------------

std::unique_ptr<Backend> make_test_backend(std::string* why) {
#ifdef DI_HAVE_CUDA
  if (!cuda::cuda_available()) {
    *why = "no CUDA device visible";
    return nullptr;
  }
  return make_backend("cuda");
#else
  *why = "built without CUDA";
  return nullptr;
#endif
}

Backend* gpu() {
  static std::string why;
  static std::unique_ptr<Backend> be = make_test_backend(&why);
  return be.get();
}

std::string skip_reason() {
  std::string why;
  if (gpu() == nullptr) make_test_backend(&why);
  return why;
}

// The CPU oracle's outputs per case, computed once and shared by the bf16 and fp32 suites.
const std::vector<Output>& cpu_reference(const OpCase& c) {
  static std::map<std::string, std::vector<Output>> cache;
  auto it = cache.find(c.name());
  if (it == cache.end()) {
    auto cpu = make_cpu_backend();
    it = cache.emplace(c.name(), c.run(*cpu)).first;
  }
  return it->second;
}

class BackendOps : public ::testing::TestWithParam<std::shared_ptr<OpCase>> {};

// Compares one case's outputs with the CPU oracle's under the case's checks (printing one line
// per output, tagged); false when any output is off.
bool matches_cpu(const OpCase& c, const std::vector<Output>& got, const char* tag) {
  const std::vector<Output>& ref = cpu_reference(c);
  EXPECT_EQ(ref.size(), got.size());
  if (ref.size() != got.size()) return false;
  bool all_ok = true;
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(ref[i].value.numel(), got[i].value.numel()) << ref[i].name;
    if (ref[i].value.numel() != got[i].value.numel()) return false;
    const Metrics m = compare(ref[i].value, got[i].value);
    bool ok = true;
    switch (ref[i].check) {
      case Check::kExact:
        ok = m.max_abs == 0.0 && m.mismatches == 0;
        break;
      case Check::kIds:
        ok = m.mismatches == 0;
        break;
      case Check::kF32:
        ok = m.nmse <= 1e-5 && m.mismatches == 0;
        break;
      case Check::kBf16:
        ok = m.diff < 1e-3 && m.mismatches == 0 &&
             (m.n > 4096 || m.max_abs <= 2e-2 * std::max(m.max_ref, 1e-3));
        break;
    }
    std::printf(
        "[op]%s %-60s %-12s n=%-9lld diff=%.2e nmse=%.2e max_abs=%.3e max_ref=%.3e mism=%lld %s\n",
        tag, c.name().c_str(), ref[i].name.c_str(), static_cast<long long>(m.n), m.diff, m.nmse,
        m.max_abs, m.max_ref, static_cast<long long>(m.mismatches), ok ? "PASS" : "FAIL");
    std::fflush(stdout);
    EXPECT_TRUE(ok) << c.name() << tag << " output '" << ref[i].name << "': diff " << m.diff
                    << " nmse " << m.nmse << " max_abs " << m.max_abs << " (max_ref " << m.max_ref
                    << ") mismatches " << m.mismatches << " of " << m.n;
    all_ok = all_ok && ok;
  }
  return all_ok;
}

TEST_P(BackendOps, MatchesCpu) {
  Backend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "CUDA op tests skipped: " << skip_reason();
  const OpCase& c = *GetParam();
  matches_cpu(c, c.run(*be), "");
}

std::string case_name(const ::testing::TestParamInfo<std::shared_ptr<OpCase>>& info) {
  std::string n = info.param->name();
  for (auto& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Table, BackendOps, ::testing::ValuesIn(all_cases()), case_name);

// ---- the fp32 verification mode (issue #5)
// --------------------------------------------------------- Every case of the table again on
// make_backend("cuda-fp32"): f32 activations, weights, KV and true fp32 GEMMs against the fp32 CPU
// oracle. Tolerance: exact stays exact; everything else NMSE <= 1e-9 and max |diff| <= 1e-4 * max
// |ref| (summation order and expf/rsqrtf ulps only).

std::unique_ptr<Backend> make_test_backend_fp32() {
#ifdef DI_HAVE_CUDA
  if (!cuda::cuda_available()) return nullptr;
  return make_backend("cuda-fp32");
#else
  return nullptr;
#endif
}

Backend* gpu_fp32() {
  static std::unique_ptr<Backend> be = make_test_backend_fp32();
  return be.get();
}

class BackendOpsFp32 : public ::testing::TestWithParam<std::shared_ptr<OpCase>> {};

TEST_P(BackendOpsFp32, MatchesCpuTightly) {
  Backend* be = gpu_fp32();
  if (be == nullptr) GTEST_SKIP() << "CUDA fp32 op tests skipped: " << skip_reason();
  const OpCase& c = *GetParam();
  const std::vector<Output>& ref = cpu_reference(c);
  const std::vector<Output> got = c.run(*be);
  ASSERT_EQ(ref.size(), got.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(ref[i].value.numel(), got[i].value.numel()) << ref[i].name;
    const Metrics m = compare(ref[i].value, got[i].value);
    bool ok = true;
    if (ref[i].check == Check::kExact)
      ok = m.max_abs == 0.0 && m.mismatches == 0;
    else if (ref[i].check == Check::kIds)
      ok = m.mismatches == 0;
    else
      ok = m.nmse <= 1e-9 && m.mismatches == 0 && m.max_abs <= 1e-4 * std::max(m.max_ref, 1e-3);
    std::printf("[op-fp32] %-60s %-12s n=%-9lld nmse=%.2e max_abs=%.3e max_ref=%.3e mism=%lld %s\n",
                c.name().c_str(), ref[i].name.c_str(), static_cast<long long>(m.n), m.nmse,
                m.max_abs, m.max_ref, static_cast<long long>(m.mismatches), ok ? "PASS" : "FAIL");
    std::fflush(stdout);
    EXPECT_TRUE(ok) << c.name() << " output '" << ref[i].name << "' (fp32 mode): nmse " << m.nmse
                    << " max_abs " << m.max_abs << " (max_ref " << m.max_ref << ") mismatches "
                    << m.mismatches << " of " << m.n;
  }
}

INSTANTIATE_TEST_SUITE_P(Table, BackendOpsFp32, ::testing::ValuesIn(all_cases()), case_name);

// The CPU side of the MLA prologue and split-query cases runs everywhere (shapes accepted, outputs
// finite and not all zero), so the table is checked where it is built, without a GPU.
TEST(BackendOpsTable, MlaCpuReferencesRun) {
  int64_t checked = 0;
  for (const auto& c : all_cases()) {
    const std::string n = c->name();
    if (n.find("mla_rope_store") == std::string::npos && n.find("qrope") == std::string::npos)
      continue;
    for (const Output& o : cpu_reference(*c)) {
      double max_abs = 0.0;
      for (int64_t i = 0; i < o.value.numel(); ++i) {
        ASSERT_TRUE(std::isfinite(o.value.f32()[i])) << n << " " << o.name;
        max_abs = std::max(max_abs, static_cast<double>(std::fabs(o.value.f32()[i])));
      }
      EXPECT_GT(max_abs, 0.0) << n << " " << o.name;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 28);
}

// The fused CUDA mla_rope_store against the same backend's composition of its other ops
// (mla_rope_store_composed): copies and the untouched pool bit-equal, roped / normalised values
// within one bf16 ulp (the composed rms_norm reduces over another thread count). The absorbed
// query (q_lat) is bit-equal to the head_linear op on q_nope, and the one-kernel path must have
// run for the cases it supports (V2-Lite / V3 heads, the goldens' dims: 5 cases).
class ComposedMlaBackend final : public ProfilingBackend {
 public:
  explicit ComposedMlaBackend(Backend& inner) : ProfilingBackend(inner) {}
  void mla_rope_store(const MlaRopeStoreParams& p) override { mla_rope_store_composed(*this, p); }
};

TEST(FusedMlaRopeStore, MatchesComposedOnGpu) {
  Backend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "CUDA op tests skipped: " << skip_reason();
  ComposedMlaBackend composed(*be);
  int64_t checked = 0;
#ifdef DI_HAVE_CUDA
  auto& cb = static_cast<cuda::CudaBackend&>(*be);
  cb.set_mla_fused_uk_override(1);
  const int64_t uk_calls0 = cb.mla_fused_uk_calls();
#endif
  for (const auto& c : all_cases()) {
    if (c->name().find("mla_rope_store") == std::string::npos) continue;
    const std::vector<Output> fused = c->run(*be), ref = c->run(composed);
    ASSERT_EQ(fused.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      int64_t bad = 0;
      for (int64_t j = 0; j < ref[i].value.numel(); ++j) {
        const float x = ref[i].value.f32()[j], y = fused[i].value.f32()[j];
        const float tol = ref[i].check == Check::kExact || ref[i].name == "q_lat"
                              ? 0.0f
                              : std::ldexp(std::max(std::fabs(x), std::fabs(y)), -7);
        bad += !(std::fabs(x - y) <= tol);
      }
      std::printf("[op] %-60s %-12s fused_vs_composed_bad=%lld of %lld %s\n", c->name().c_str(),
                  ref[i].name.c_str(), static_cast<long long>(bad),
                  static_cast<long long>(ref[i].value.numel()), bad == 0 ? "PASS" : "FAIL");
      EXPECT_EQ(bad, 0) << c->name() << " output '" << ref[i].name << "'";
    }
    ++checked;
  }
  EXPECT_EQ(checked, 23);
#ifdef DI_HAVE_CUDA
  EXPECT_EQ(cb.mla_fused_uk_calls() - uk_calls0, 5);
  cb.set_mla_fused_uk_override(-1);
#endif
}

// The CPU references of the fused attention cases run (shapes accepted, outputs finite, the
// attention output written everywhere but the padding row, which is zero), without a GPU.
TEST(BackendOpsTable, QkvRopeAttentionCpuReferencesRun) {
  int64_t checked = 0;
  for (const auto& c : all_cases()) {
    const auto* a = dynamic_cast<const TestQkvRopeAttention*>(c.get());
    if (a == nullptr) continue;
    const std::vector<Output>& ref = cpu_reference(*c);
    ASSERT_EQ(ref.size(), 3u) << c->name();
    for (const Output& o : ref)
      for (int64_t i = 0; i < o.value.numel(); ++i)
        ASSERT_TRUE(std::isfinite(o.value.f32()[i])) << c->name() << " " << o.name;
    const Tensor& out = ref[0].value;
    const int64_t row = int64_t{a->hq} * a->d, rows = out.numel() / row;
    for (int64_t r = 0; r < rows; ++r) {
      const bool pad = a->padding && r == rows - 1;
      double max_abs = 0.0;
      for (int64_t i = 0; i < row; ++i) {
        const float v = out.f32()[r * row + i];
        EXPECT_NE(v, 7.0f) << c->name() << " token " << r << ": output not written";
        max_abs = std::max(max_abs, static_cast<double>(std::fabs(v)));
      }
      if (pad)
        EXPECT_EQ(max_abs, 0.0) << c->name() << ": padding row";
      else
        EXPECT_GT(max_abs, 0.0) << c->name() << " token " << r;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 21);
}

// The CPU references of the attention_o_proj cases (one call each) against the definition: the
// residual plus W_o times the attention output of qkv_rope_attention on the same inputs, the
// product summed in double here and rounded to bf16 as the projection's output (one bf16 step of
// slack for the CPU's own summation order), then the add rounded to bf16. Runs without a GPU.
TEST(BackendOpsTable, AttentionOProjCpuReferenceIsResidualPlusProjection) {
  auto cpu = make_cpu_backend();
  int64_t checked = 0;
  for (const auto& c : all_cases()) {
    const auto* a = dynamic_cast<const TestAttentionOProj*>(c.get());
    if (a == nullptr || a->calls != 1) continue;
    const std::vector<Output>& ref = cpu_reference(*c);
    ASSERT_EQ(ref.size(), 3u) << c->name();
    ASSERT_EQ(ref[0].name, "x");
    QkvAttentionInputs in(*cpu, a->hq, a->hkv, a->d, a->block_size, a->norm, false, a->ctx);
    in.new_qkv(*cpu, 0);
    cpu->qkv_rope_attention(in.sp, in.ap);
    const Tensor o = cpu->download(in.o);
    const int64_t t = in.s.num_tokens, k = int64_t{a->hq} * a->d;
    const Tensor w = host_random({a->hidden, k}, 81, 1.0f / std::sqrt(static_cast<float>(k)));
    const Tensor x0 = host_random({t, a->hidden}, 82);
    auto bf16 = [](double v) { return static_cast<double>(round_bf16(static_cast<float>(v))); };
    int64_t bad = 0;
    for (int64_t i = 0; i < t; ++i)
      for (int64_t r = 0; r < a->hidden; ++r) {
        double y = 0.0;
        for (int64_t j = 0; j < k; ++j)
          y += static_cast<double>(bf16(w.f32()[r * k + j])) * o.f32()[i * k + j];
        const double want = bf16(bf16(x0.f32()[i * a->hidden + r]) + bf16(y));
        const double got = ref[0].value.f32()[i * a->hidden + r];
        // One bf16 step of y (the CPU's order may round y the other way), then of the sum.
        const double tol = std::ldexp(std::fabs(y) + std::fabs(want), -8) + 1e-6;
        bad += !(std::fabs(got - want) <= tol);
      }
    EXPECT_EQ(bad, 0) << c->name() << ": residual elements off the definition";
    ++checked;
  }
  EXPECT_EQ(checked, 7);  // every case but the three-call one
}

// ---- sampling on the GPU vs the CPU sampler
// ------------------------------------------------------

// Elements of two outputs of the same case whose values differ at all (bitwise comparisons).
[[maybe_unused]] int64_t bits_differ(const Output& a, const Output& b) {  // CUDA tests only
  EXPECT_EQ(a.value.numel(), b.value.numel()) << a.name;
  int64_t bad = 0;
  for (int64_t j = 0; j < std::min(a.value.numel(), b.value.numel()); ++j)
    bad += a.value.f32()[j] != b.value.f32()[j];
  return bad;
}

// The one-row GEMV with the items loaded before its wait bulk-copied into shared memory (the
// policy takes it for weights of at least 64 MB) against the same kernel loading them into
// registers: every m = 1 fused_linear case of the table, bit for bit, and the bulk path ran (the
// cp.async ring, which the policy picks for some shapes and which comes first, is switched off).
TEST(FusedLinearGemv, BulkCopiedItemsBitEqualToRegisters) {
#ifdef DI_HAVE_CUDA
  Backend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "CUDA op tests skipped: " << skip_reason();
  const int saved = cuda::gemv_bulk(), saved_ring = cuda::gemv_ring_stages();
  cuda::set_gemv_ring_stages(0);
  int64_t cases = 0;
  for (const auto& c : all_cases()) {
    const auto* f = dynamic_cast<const TestFusedLinear*>(c.get());
    if (f == nullptr || f->m != 1) continue;
    cuda::set_gemv_bulk(0);
    const std::vector<Output> regs = c->run(*be);
    cuda::set_gemv_bulk(1);
    const int64_t before = cuda::gemv_bulk_launches();
    const std::vector<Output> bulk = c->run(*be);
    const int64_t launches = cuda::gemv_bulk_launches() - before;
    EXPECT_EQ(launches, 1) << c->name() << ": bulk launches";
    ASSERT_EQ(regs.size(), bulk.size());
    for (size_t i = 0; i < regs.size(); ++i) {
      const int64_t bad = bits_differ(regs[i], bulk[i]);
      std::printf(
          "[op] %-60s %-10s bulk_vs_registers_bits_differ=%lld of %lld (bulk launches %lld) %s\n",
          c->name().c_str(), regs[i].name.c_str(), static_cast<long long>(bad),
          static_cast<long long>(regs[i].value.numel()), static_cast<long long>(launches),
          bad == 0 && launches == 1 ? "PASS" : "FAIL");
      EXPECT_EQ(bad, 0) << c->name() << " output '" << regs[i].name << "'";
    }
    ++cases;
  }
  cuda::set_gemv_bulk(saved);
  cuda::set_gemv_ring_stages(saved_ring);
  EXPECT_EQ(cases, 14);  // the m = 1 fused_linear rows of the table
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

#ifdef DI_HAVE_CUDA
// Every case `pick` selects, run with set_on(0) and then set_on(1): the outputs bit-equal, each
// line printed with `what`; returns the cases run and how many of them launched the switched
// kernel (`launches` counts its launches). The switch is left off (callers restore it).
struct SwitchRuns {
  int64_t cases = 0, took = 0;
};
SwitchRuns run_switch_bitwise(Backend& be, const char* what,
                              const std::function<bool(const OpCase&)>& pick,
                              const std::function<void(int)>& set_on,
                              const std::function<int64_t()>& launches) {
  SwitchRuns runs;
  for (const auto& c : all_cases()) {
    if (!pick(*c)) continue;
    set_on(0);
    const std::vector<Output> off = c->run(be);
    set_on(1);
    const int64_t before = launches();
    const std::vector<Output> on = c->run(be);
    const int64_t n = launches() - before;
    set_on(0);
    runs.took += n > 0;
    EXPECT_EQ(off.size(), on.size()) << c->name();
    for (size_t i = 0; i < std::min(off.size(), on.size()); ++i) {
      const int64_t bad = bits_differ(off[i], on[i]);
      std::printf("[op] %-60s %-8s %s_bits_differ=%lld of %lld (launches %lld) %s\n",
                  c->name().c_str(), off[i].name.c_str(), what, static_cast<long long>(bad),
                  static_cast<long long>(off[i].value.numel()), static_cast<long long>(n),
                  bad == 0 ? "PASS" : "FAIL");
      EXPECT_EQ(bad, 0) << c->name() << " output '" << off[i].name << "'";
    }
    ++runs.cases;
  }
  return runs;
}
#endif

// The one-row norm GEMV with its second item requested before the wait on odd SMs only (the
// policy for Qwen3-30B-A3B's qkv projection since run 42) against both items before the wait on
// every SM: every one-row rms_norm fused_linear case of the table, bit for bit, and the register
// path's cases took it.
TEST(GemvEarly, OddSmSecondItemBitEqualToBothEarly) {
#ifdef DI_HAVE_CUDA
  Backend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "CUDA op tests skipped: " << skip_reason();
  const int saved = cuda::gemv_early();
  const SwitchRuns runs = run_switch_bitwise(
      *be, "odd_sm_second_item",
      [](const OpCase& c) {
        const auto* f = dynamic_cast<const TestFusedLinear*>(&c);
        return f != nullptr && f->m == 1 && f->in == FusedLinearParams::In::kRmsNorm;
      },
      cuda::set_gemv_early, cuda::gemv_early_launches);
  cuda::set_gemv_early(saved);
  EXPECT_GE(runs.cases, 5);
  EXPECT_GE(runs.took, 3) << "the register path's one-row norm cases take it";
  std::printf("[op] GEMV odd-SM second item: %lld cases, %lld took it\n",
              static_cast<long long>(runs.cases), static_cast<long long>(runs.took));
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// The split combine without barriers (few rows, at most 64 splits: combine_split_row_warp)
// against the block merge it replaces: every GQA attention case of the table, bit for bit, and
// the warp merge ran for some (the decode cases with 2-64 splits).
TEST(SplitCombine, WarpMergeBitEqualToBlockMerge) {
#ifdef DI_HAVE_CUDA
  Backend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "CUDA op tests skipped: " << skip_reason();
  const int saved = cuda::split_combine_warp();
  const SwitchRuns runs = run_switch_bitwise(
      *be, "warp_vs_block_merge",
      [](const OpCase& c) {
        const auto* a = dynamic_cast<const TestPagedAttention*>(&c);
        return a != nullptr && !a->mla;
      },
      cuda::set_split_combine_warp, cuda::split_combine_warp_launches);
  cuda::set_split_combine_warp(saved);
  EXPECT_GT(runs.cases, 0);
  EXPECT_GT(runs.took, 0) << "no case took the warp merge";
  std::printf("[op] split combine warp merge: %lld cases, %lld took it\n",
              static_cast<long long>(runs.cases), static_cast<long long>(runs.took));
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// The tensor-core GQA decode kernel's one-barrier merge of its 4 warps (merge_direct) against the
// block merge: every GQA attention case of the table, with the kernel taking every group (mode 1:
// groups 1 and 2 too, i.e. rows past the group and both row halves at group 16) and 1, 2 and 4
// splits per CTA (the second K/V buffer, the merge run once per split), bit for bit, and the
// merge ran for some.
TEST(GqaDecodeMma, OneBarrierMergeBitEqualToBlockMerge) {
#ifdef DI_HAVE_CUDA
  Backend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "CUDA op tests skipped: " << skip_reason();
  const int saved = cuda::gqa_decode_mma_merge_warp();
  const int saved_mode = cuda::gqa_decode_mma_mode();
  const int saved_spc = cuda::gqa_decode_mma_splits_per_cta();
  cuda::set_gqa_decode_mma_mode(1);
  SwitchRuns all;
  for (const int spc : {1, 2, 4}) {
    cuda::set_gqa_decode_mma_splits_per_cta(spc);
    const std::string what = "mma_merge_warp_spc" + std::to_string(spc);
    const SwitchRuns runs = run_switch_bitwise(
        *be, what.c_str(),
        [](const OpCase& c) {
          const auto* a = dynamic_cast<const TestPagedAttention*>(&c);
          return a != nullptr && !a->mla;
        },
        cuda::set_gqa_decode_mma_merge_warp, cuda::gqa_decode_mma_merge_warp_launches);
    all.cases += runs.cases;
    all.took += runs.took;
  }
  cuda::set_gqa_decode_mma_splits_per_cta(saved_spc);
  cuda::set_gqa_decode_mma_mode(saved_mode);
  cuda::set_gqa_decode_mma_merge_warp(saved);
  EXPECT_GT(all.cases, 0);
  EXPECT_GT(all.took, 0) << "no case took the one-barrier merge";
  std::printf("[op] gqa mma one-barrier merge: %lld case runs, %lld took it\n",
              static_cast<long long>(all.cases), static_cast<long long>(all.took));
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// The rope/store kernel with one warp per head row (the default since run 39) against the CTA per
// row: every qkv_rope_store and qkv_rope_attention case of the table (the attention cases store
// through it on the composed path), bit for bit, and the warp kernel ran for some.
TEST(QkvRopeStoreWarp, BitEqualToCtaPerRow) {
#ifdef DI_HAVE_CUDA
  Backend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "CUDA op tests skipped: " << skip_reason();
  const int saved = cuda::qkv_rope_store_warp();
  const SwitchRuns runs = run_switch_bitwise(
      *be, "warp_vs_cta_rope_store",
      [](const OpCase& c) {
        return dynamic_cast<const TestQkvRopeStore*>(&c) != nullptr ||
               dynamic_cast<const TestQkvRopeAttention*>(&c) != nullptr;
      },
      cuda::set_qkv_rope_store_warp, cuda::qkv_rope_store_warp_launches);
  cuda::set_qkv_rope_store_warp(saved);
  EXPECT_GT(runs.cases, 0);
  EXPECT_GT(runs.took, 0) << "no case took the warp kernel";
  std::printf("[op] rope/store warp kernel: %lld cases, %lld took it\n",
              static_cast<long long>(runs.cases), static_cast<long long>(runs.took));
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// The GQA decode kernel's warp layouts: 4 or 8 token warps (TW) times 1 or 2 warps per head group
// (HS), chosen by the grid and the group. Every layout runs the same online softmax per token
// warp of the 4-warp layout and merges in the same order, so every output must be bit-equal to
// the 4-warp layout's (a speed choice must not change a sequence's logits, or batch invariance
// would break).
TEST(GqaDecodeLayout, EveryLayoutBitEqualToFourWarps) {
#ifdef DI_HAVE_CUDA
  Backend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "CUDA op tests skipped: " << skip_reason();
  const int saved_hs = cuda::gqa_decode_head_split();
  const int saved_tw = cuda::gqa_decode_token_warps();
  const int saved_mma = cuda::gqa_decode_mma_mode();
  cuda::set_gqa_decode_mma_mode(0);  // the CUDA-core kernel's layouts, every group
  int64_t checked = 0;
  for (const auto& c : all_cases()) {
    const auto* a = dynamic_cast<const TestPagedAttention*>(c.get());
    if (a == nullptr || a->mla) continue;
    cuda::set_gqa_decode_head_split(1);
    cuda::set_gqa_decode_token_warps(4);
    const std::vector<Output> ref = c->run(*be);
    for (const auto& [hs, tw] : {std::pair{2, 4}, std::pair{1, 8}, std::pair{2, 8}}) {
      if (hs == 2 && a->hq / a->hkv < 2) continue;
      cuda::set_gqa_decode_head_split(hs);
      cuda::set_gqa_decode_token_warps(tw);
      const std::vector<Output> got = c->run(*be);
      ASSERT_EQ(ref.size(), got.size());
      for (size_t i = 0; i < ref.size(); ++i) {
        const int64_t bad = bits_differ(ref[i], got[i]);
        std::printf("[op] %-60s %-8s hs%d_tw%d_vs_hs1_tw4_bits_differ=%lld of %lld %s\n",
                    c->name().c_str(), ref[i].name.c_str(), hs, tw, static_cast<long long>(bad),
                    static_cast<long long>(ref[i].value.numel()), bad == 0 ? "PASS" : "FAIL");
        EXPECT_EQ(bad, 0) << c->name() << " output '" << ref[i].name << "' hs " << hs << " tw "
                          << tw;
      }
    }
    ++checked;
  }
  cuda::set_gqa_decode_head_split(saved_hs);
  cuda::set_gqa_decode_token_warps(saved_tw);
  cuda::set_gqa_decode_mma_mode(saved_mma);
  EXPECT_GE(checked, 8);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// The GQA decode kernels against the CPU on every GQA attention case of the table: the tensor-core
// kernel forced on for every group it supports (mode 1; the default takes it from 4 q heads per
// kv head) and forced off (mode 0: the CUDA-core kernel, also for the groups the default gives
// to the tensor cores). Checks that the tensor-core kernel ran where it should.
TEST(GqaDecodeMma, EveryGroupMatchesCpuOnAndOff) {
#ifdef DI_HAVE_CUDA
  Backend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "CUDA op tests skipped: " << skip_reason();
  const int saved = cuda::gqa_decode_mma_mode();
  int64_t on_cases = 0;
  for (const auto& c : all_cases()) {
    const auto* a = dynamic_cast<const TestPagedAttention*>(c.get());
    if (a == nullptr || a->mla) continue;
    for (const int mode : {1, 0}) {
      cuda::set_gqa_decode_mma_mode(mode);
      const bool takes = cuda::gqa_decode_mma_for(a->hq / a->hkv, a->dqk);
      EXPECT_EQ(takes, mode == 1 && (a->dqk == 64 || a->dqk == 128)) << c->name();
      on_cases += takes ? 1 : 0;
      cuda::set_gqa_decode_mma_splits_per_cta(1);
      const std::vector<Output> one = c->run(*be);
      matches_cpu(*c, one, mode == 1 ? " mma=on " : " mma=off");
      if (!takes) continue;
      // Several KV splits per CTA (the next one's K/V copied during the current one): same bits.
      for (const int spc : {2, 3, 8}) {
        cuda::set_gqa_decode_mma_splits_per_cta(spc);
        const std::vector<Output> got = c->run(*be);
        ASSERT_EQ(one.size(), got.size());
        for (size_t o = 0; o < one.size(); ++o) {
          const int64_t bad = bits_differ(one[o], got[o]);
          std::printf("[op] %-60s spc%d_vs_spc1_bits_differ=%lld %s\n", c->name().c_str(), spc,
                      static_cast<long long>(bad), bad == 0 ? "PASS" : "FAIL");
          EXPECT_EQ(bad, 0) << c->name() << " splits per CTA " << spc;
        }
      }
    }
    cuda::set_gqa_decode_mma_splits_per_cta(0);
  }
  cuda::set_gqa_decode_mma_mode(-1);
  EXPECT_TRUE(cuda::gqa_decode_mma_for(8, 128));
  EXPECT_TRUE(cuda::gqa_decode_mma_for(16, 64));
  EXPECT_TRUE(cuda::gqa_decode_mma_for(4, 128));
  EXPECT_FALSE(cuda::gqa_decode_mma_for(2, 128));
  EXPECT_FALSE(cuda::gqa_decode_mma_for(8, 256));
  cuda::set_gqa_decode_mma_mode(saved);
  EXPECT_GE(on_cases, 10);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuSampling, SameTokenAsCpuSampler) {
#ifdef DI_HAVE_CUDA
  Backend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "GPU sampling test skipped: " << skip_reason();
  const int64_t vocab = 32001;
  std::vector<sampling::SamplingParams> params;
  std::vector<int64_t> positions;
  auto row = [&](float t, int32_t k, float p, float mp, uint64_t seed, int64_t pos) {
    sampling::SamplingParams s;
    s.temperature = t;
    s.top_k = k;
    s.top_p = p;
    s.min_p = mp;
    s.seed = seed;
    params.push_back(s);
    positions.push_back(pos);
  };
  for (int i = 0; i < 8; ++i) {
    row(0.0f, -1, 1.0f, 0.0f, 1, i);              // greedy
    row(1.0f, -1, 1.0f, 0.0f, 7 + i, 100 + i);    // plain
    row(0.7f, 50, 1.0f, 0.0f, 99, 3 * i);         // top-k
    row(0.9f, -1, 0.9f, 0.0f, 1234 + i, i);       // top-p
    row(1.3f, -1, 1.0f, 0.05f, 5, 1000 + i);      // min-p (pre-filter path)
    row(0.8f, 40, 0.95f, 0.02f, 42 + i, 17 * i);  // all filters
  }
  const auto rows = static_cast<int64_t>(params.size());
  // Peaky logits with exact ties (ids ordered) so canonical tie-breaking matters.
  Tensor logits = Tensor::empty({rows, vocab}, DType::kF32);
  std::mt19937_64 rng(77);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (int64_t r = 0; r < rows; ++r) {
    float* l = logits.f32() + r * vocab;
    for (int64_t v = 0; v < vocab; ++v) l[v] = std::round(nd(rng) * 8.0f) / 8.0f;
    l[(r * 131) % vocab] = 9.5f;
    l[(r * 131 + 7) % vocab] = 9.5f;  // a tie for the top: the lower id wins greedy
    if (r % 5 == 0) l[3] = -INFINITY;
  }
  auto& cb = static_cast<cuda::CudaBackend&>(*be);
  const std::vector<int32_t> got =
      cuda::sample_on_gpu(cb, cb.upload(logits, DType::kF32), params, positions);
  int mismatches = 0;
  for (int64_t r = 0; r < rows; ++r) {
    std::span<const float> l(logits.f32() + r * vocab, static_cast<size_t>(vocab));
    const int32_t want = sampling::sample_token(l, params[static_cast<size_t>(r)],
                                                positions[static_cast<size_t>(r)], {}, {});
    if (want != got[static_cast<size_t>(r)]) {
      ++mismatches;
      std::printf("[sample] row %lld: cpu %d gpu %d\n", static_cast<long long>(r), want,
                  got[static_cast<size_t>(r)]);
    }
  }
  std::printf("[op] %-60s rows=%lld mismatches=%d %s\n", "gpu_sampling_vs_cpu_v32001",
              static_cast<long long>(rows), mismatches, mismatches == 0 ? "PASS" : "FAIL");
  EXPECT_EQ(mismatches, 0);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

#ifdef DI_HAVE_CUDA
// The CPU sampler's token for row r of host logits [rows, vocab] under a device sampling row
// (throws where the CPU sampler does: every logit -inf or NaN).
int32_t cpu_sample_row(const Tensor& host_logits, int64_t r, const DeviceSampleRow& d) {
  sampling::SamplingParams p;
  p.temperature = d.temperature;
  p.top_k = d.top_k;
  p.top_p = d.top_p;
  p.min_p = d.min_p;
  p.seed = d.seed;
  const int64_t vocab = host_logits.size(1);
  std::span<const float> l(host_logits.f32() + r * vocab, static_cast<size_t>(vocab));
  return sampling::sample_token(l, p, d.position, {}, {});
}
#endif

// All-greedy batches take the argmax kernel instead of the sort (launch_argmax_rows): the CPU's
// argmax on rows built to trip it — ties for the top (the lower id wins), the top at the first and
// the last id, NaN everywhere but one finite value, NaN before the top, -0 and +0 as the top
// (they tie: the first of either), +inf, every logit -inf or NaN (-1), a one-column vocabulary —
// then random rows at 1, 3 and 64 rows of a 129,280 vocabulary, and a mixed batch after it
// (the sort path, sharing the sampler's buffers).
TEST(GpuSampling, GreedyArgmaxPathSameAsCpu) {
#ifdef DI_HAVE_CUDA
  Backend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "GPU sampling test skipped: " << skip_reason();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  int mismatches = 0;
  auto run = [&](const Tensor& logits, const std::vector<DeviceSampleRow>& rows, const char* what) {
    const std::vector<int32_t> got = be->sample_on_device(be->upload(logits, DType::kF32), rows);
    ASSERT_EQ(got.size(), rows.size());
    for (size_t r = 0; r < rows.size(); ++r) {
      int32_t want = -1;
      try {
        want = cpu_sample_row(logits, static_cast<int64_t>(r), rows[r]);
      } catch (const std::exception&) {
        want = -1;  // the CPU throws where every logit is -inf or NaN; the GPU answers -1
      }
      if (want != got[r]) {
        ++mismatches;
        std::printf("[sample] %s row %zu: cpu %d gpu %d\n", what, r, want, got[r]);
      }
    }
  };
  const DeviceSampleRow greedy{0.0f, -1, 1.0f, 0.0f, 1, 0};
  {
    const int64_t vocab = 4099;
    std::vector<std::vector<float>> rows;
    auto base = [&] { return std::vector<float>(static_cast<size_t>(vocab), -3.0f); };
    std::vector<float> r = base();
    r[100] = 5.0f, r[2000] = 5.0f, r[4000] = 5.0f;  // three-way tie: 100
    rows.push_back(r);
    r = base(), r[0] = 1.0f;  // first id
    rows.push_back(r);
    r = base(), r[vocab - 1] = 1.0f;  // last id
    rows.push_back(r);
    r = std::vector<float>(static_cast<size_t>(vocab), nan), r[1234] = -7.0f;  // only one finite
    rows.push_back(r);
    r = base(), r[5] = nan, r[6] = 2.0f, r[7] = nan;  // NaN before the top
    rows.push_back(r);
    r = std::vector<float>(static_cast<size_t>(vocab), -inf), r[900] = 0.0f, r[30] = -0.0f;
    rows.push_back(r);                         // -0 at 30 and +0 at 900 tie: 30
    r = base(), r[3000] = inf, r[10] = 1e30f;  // +inf wins
    rows.push_back(r);
    r = std::vector<float>(static_cast<size_t>(vocab), -inf);
    for (int64_t v = 0; v < vocab; v += 3) r[static_cast<size_t>(v)] = nan;  // nothing usable
    rows.push_back(r);
    Tensor logits = Tensor::empty({static_cast<int64_t>(rows.size()), vocab}, DType::kF32);
    for (size_t i = 0; i < rows.size(); ++i) {
      std::copy(rows[i].begin(), rows[i].end(), logits.f32() + static_cast<int64_t>(i) * vocab);
    }
    run(logits, std::vector<DeviceSampleRow>(rows.size(), greedy), "edge");
    Tensor one = Tensor::empty({2, 1}, DType::kF32);
    one.f32()[0] = -1.0f;
    one.f32()[1] = nan;
    run(one, std::vector<DeviceSampleRow>(2, greedy), "vocab1");
  }
  const int64_t vocab = 129280;
  std::mt19937_64 rng(8);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (const int64_t rows : {1, 3, 64}) {
    Tensor logits = Tensor::empty({rows, vocab}, DType::kF32);
    for (int64_t i = 0; i < logits.numel(); ++i) logits.f32()[i] = std::round(nd(rng) * 4) / 4;
    run(logits, std::vector<DeviceSampleRow>(static_cast<size_t>(rows), greedy), "random");
  }
  Tensor mixed = Tensor::empty({4, vocab}, DType::kF32);
  for (int64_t i = 0; i < mixed.numel(); ++i) mixed.f32()[i] = nd(rng);
  std::vector<DeviceSampleRow> mixed_rows(4, greedy);
  mixed_rows[2] = DeviceSampleRow{0.8f, 40, 0.95f, 0.0f, 3, 9};
  run(mixed, mixed_rows, "mixed");
  std::printf("[op] %-60s mismatches=%d %s\n", "gpu_sampling_greedy_argmax", mismatches,
              mismatches == 0 ? "PASS" : "FAIL");
  EXPECT_EQ(mismatches, 0);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// Backend::sample_on_device as the engine calls it: the sampler keeps its buffers between calls,
// so calls of 40, 3 (rows of a larger buffer, as a graph step's logits are), 1 (all -inf: -1)
// and 40 rows again must each give the CPU sampler's tokens.
TEST(GpuSampling, BuffersReusedAcrossBatchSizes) {
#ifdef DI_HAVE_CUDA
  Backend* be = gpu();
  if (be == nullptr) GTEST_SKIP() << "GPU sampling test skipped: " << skip_reason();
  ASSERT_TRUE(be->can_sample_on_device());
  const int64_t vocab = 129280, rows = 40;
  std::vector<DeviceSampleRow> params;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t kind = static_cast<int32_t>(r % 4);
    params.push_back(DeviceSampleRow{kind == 0 ? 0.0f : 0.5f + 0.25f * static_cast<float>(kind),
                                     kind == 1 ? 30 : -1, kind == 2 ? 0.9f : 1.0f,
                                     kind == 3 ? 0.05f : 0.0f, static_cast<uint64_t>(11 + r),
                                     40 + 3 * r});
  }
  Tensor logits = Tensor::empty({rows, vocab}, DType::kF32);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int64_t i = 0; i < logits.numel(); ++i) logits.f32()[i] = nd(rng);
  const Tensor dev = be->upload(logits, DType::kF32);
  int mismatches = 0;
  auto check = [&](int64_t begin, int64_t end) {
    const std::span<const DeviceSampleRow> part(params.data() + begin,
                                                static_cast<size_t>(end - begin));
    const std::vector<int32_t> got = be->sample_on_device(dev.slice_rows(begin, end), part);
    ASSERT_EQ(got.size(), part.size());
    for (int64_t r = begin; r < end; ++r) {
      const int32_t want = cpu_sample_row(logits, r, params[static_cast<size_t>(r)]);
      if (want != got[static_cast<size_t>(r - begin)]) {
        ++mismatches;
        std::printf("[sample] rows [%lld, %lld) row %lld: cpu %d gpu %d\n",
                    static_cast<long long>(begin), static_cast<long long>(end),
                    static_cast<long long>(r), want, got[static_cast<size_t>(r - begin)]);
      }
    }
  };
  check(0, rows);
  check(17, 20);
  Tensor masked = Tensor::empty({1, vocab}, DType::kF32);
  for (int64_t v = 0; v < vocab; ++v) masked.f32()[v] = v % 2 ? -INFINITY : NAN;
  const std::vector<int32_t> none =
      be->sample_on_device(be->upload(masked, DType::kF32), std::span(params.data(), 1));
  EXPECT_EQ(none, std::vector<int32_t>{-1});
  check(0, rows);
  std::printf("[op] %-60s mismatches=%d %s\n", "gpu_sampling_reused_buffers_v129280", mismatches,
              mismatches == 0 ? "PASS" : "FAIL");
  EXPECT_EQ(mismatches, 0);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

}  // namespace
}  // namespace di::testing
