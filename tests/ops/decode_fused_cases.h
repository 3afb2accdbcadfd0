#pragma once
// Op cases of the fused decode ops (issue #5), included by test_backend_ops.cpp after its own
// cases (needs OpCase, PagedSetup). Registered in all_cases() by add_decode_fused_cases().
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace di::testing {
namespace {

// Backend::qkv_rope_store vs the CPU's composition: ragged batch (incl. an empty sequence and a
// 64-token prefill), block sizes 1 / 16 / 64, with and without the Qwen3 q/k norms.
struct TestQkvRopeStore : OpCase {
  int32_t block_size, hq, hkv, d;
  bool norm;
  TestQkvRopeStore(int32_t bs, int32_t q, int32_t kv, int32_t dim, bool n)
      : block_size(bs), hq(q), hkv(kv), d(dim), norm(n) {}
  std::string name() const override {
    return "qkv_rope_store_bs" + std::to_string(block_size) + "_hq" + std::to_string(hq) + "_hkv" +
           std::to_string(hkv) + "_d" + std::to_string(d) + (norm ? "_qknorm" : "");
  }
  std::vector<Output> run(Backend& be) const override {
    const int32_t entry = 2 * hkv * d, layers = 3, max_pos = 300;
    PagedSetup s({{0, 37}, {50, 3}, {7, 1}, {0, 0}, {200, 64}}, block_size, layers, entry);
    PagedBatch b = s.make(be);
    Tensor pool = act(be, host_random({s.layout.num_blocks, layers, block_size, entry}, 31));
    Tensor qkv = act(be, host_random({s.num_tokens, (hq + 2 * hkv) * d}, 32, 2.0f));
    Tensor qn = act(be, host_random({d}, 33));
    Tensor kn = act(be, host_random({d}, 34));
    Tensor cs_host = Tensor::empty({max_pos, d}, DType::kF32);
    for (int32_t p = 0; p < max_pos; ++p)
      for (int32_t j = 0; j < d / 2; ++j) {
        const double a = p * std::pow(10000.0, -2.0 * j / d);
        cs_host.f32()[p * d + j] = static_cast<float>(std::cos(a));
        cs_host.f32()[p * d + d / 2 + j] = static_cast<float>(std::sin(a));
      }
    Tensor cos_sin = be.upload(cs_host, DType::kF32);
    Tensor q = be.empty({s.num_tokens, hq, d}, be.compute_dtype());
    QkvRopeStoreParams p;
    p.qkv = &qkv;
    p.q_out = &q;
    p.pool = &pool;
    p.layout = s.layout;
    p.layer = 1;
    p.num_q_heads = hq;
    p.num_kv_heads = hkv;
    p.head_dim = d;
    p.q_norm = norm ? &qn : nullptr;
    p.k_norm = norm ? &kn : nullptr;
    p.eps = 1e-6f;
    p.cos_sin = &cos_sin;
    p.batch = &b;
    be.qkv_rope_store(p);
    return {out(be, "q", q, Check::kBf16), out(be, "pool", pool, Check::kBf16)};
  }
};

// Backend::mla_rope_store (fused on CUDA) vs the CPU's composition. Where the inputs live:
//   kFused:    one [T, hq·(dn+dr) + lat + dr] buffer (the concatenated q_proj | kv_a GEMM)
//   kSeparate: q [T, hq, dn+dr] and kv_a [T, lat + dr], contiguous (q_b's output, a kv_a GEMM)
//   kOffsets:  one buffer [T, 3 + lat + dr + hq·(dn+dr) + 1], kv_a at column 3, q after it
// Batches: T = 1 / 3 / 33 new tokens over block sizes 1 / 16 / 64; T > 1 ends with a padding row
// (slot -1, a sequence without blocks) that must write no KV. Outputs: q_nope (a copy: exact),
// q_pe, the new tokens' pool entries, and the rest of the pool (untouched: exact); with `absorb`
// also q_lat = head_linear(q_nope, w_uk_t) (one kernel with the rest on CUDA where it applies).
struct TestMlaRopeStore : OpCase {
  enum class Src { kFused, kSeparate, kOffsets };
  int32_t block_size, hq, dn, dr, lat, num_new;
  bool interleaved;
  Src src;
  bool absorb;
  TestMlaRopeStore(int32_t bs, int32_t q, int32_t nope, int32_t rope, int32_t latent, int32_t t,
                   bool il, Src where, bool with_uk = false)
      : block_size(bs),
        hq(q),
        dn(nope),
        dr(rope),
        lat(latent),
        num_new(t),
        interleaved(il),
        src(where),
        absorb(with_uk) {}
  std::string name() const override {
    const char* where = src == Src::kFused      ? "fused"
                        : src == Src::kSeparate ? "separate"
                                                : "offsets";
    return "mla_rope_store_bs" + std::to_string(block_size) + "_hq" + std::to_string(hq) + "_d" +
           std::to_string(dn) + "+" + std::to_string(dr) + "_lat" + std::to_string(lat) + "_t" +
           std::to_string(num_new) + (interleaved ? "_interleaved" : "_half") + "_" + where +
           (absorb ? "_uk" : "");
  }
  std::vector<Output> run(Backend& be) const override {
    const int32_t entry = lat + dr, layers = 3, max_pos = 300, dqk = dn + dr;
    using P = std::vector<std::pair<int, int>>;
    const P seqs = num_new == 1   ? P{{40, 1}}
                   : num_new == 3 ? P{{40, 1}, {7, 1}}
                                  : P{{0, 30}, {63, 2}};
    PagedSetup s(seqs, block_size, layers, entry);
    if (num_new > 1) {  // a padding row: a graph bucket's unused sequence
      s.positions.push_back(0);
      s.slots.push_back(-1);
      ++s.num_tokens;
      s.qo.push_back(s.num_tokens);
      s.kv_ptr.push_back(s.kv_ptr.back());
      s.last.push_back(0);
    }
    DI_CHECK(s.num_tokens == num_new, "mla_rope_store case: {} tokens, want {}", s.num_tokens,
             num_new);
    PagedBatch b = s.make(be);
    const int64_t t = s.num_tokens, qw = int64_t{hq} * dqk;
    Tensor pool = act(be, host_random({s.layout.num_blocks, layers, block_size, entry}, 41));
    Tensor norm = act(be, host_random({lat}, 42));
    Tensor cs_host = Tensor::empty({max_pos, dr}, DType::kF32);
    for (int32_t p = 0; p < max_pos; ++p)
      for (int32_t j = 0; j < dr / 2; ++j) {
        const double a = p * std::pow(10000.0, -2.0 * j / dr);
        cs_host.f32()[p * dr + j] = static_cast<float>(std::cos(a));
        cs_host.f32()[p * dr + dr / 2 + j] = static_cast<float>(std::sin(a));
      }
    Tensor cos_sin = be.upload(cs_host, DType::kF32);
    Tensor buf, q, kv;
    MlaRopeStoreParams p;
    if (src == Src::kSeparate) {
      q = act(be, host_random({t, hq, dqk}, 43, 2.0f));
      kv = act(be, host_random({t, entry}, 44, 2.0f));
      p.q = &q;
      p.kv_a = &kv;
    } else {
      const int64_t width = src == Src::kFused ? qw + entry : 3 + entry + qw + 1;
      buf = act(be, host_random({t, width}, 45, 2.0f));
      p.q = &buf;
      p.kv_a = &buf;
      p.q_col = static_cast<int32_t>(src == Src::kFused ? 0 : 3 + entry);
      p.kv_col = static_cast<int32_t>(src == Src::kFused ? qw : 3);
    }
    Tensor q_nope = be.empty({t, hq, dn}, be.compute_dtype());
    Tensor q_pe = be.empty({t, hq, dr}, be.compute_dtype());
    p.q_nope = &q_nope;
    p.q_pe = &q_pe;
    p.pool = &pool;
    p.layout = s.layout;
    p.layer = 1;
    p.num_heads = hq;
    p.nope_dim = dn;
    p.rope_dim = dr;
    p.latent_dim = lat;
    p.kv_a_norm = &norm;
    p.eps = 1e-6f;
    p.cos_sin = &cos_sin;
    p.interleaved = interleaved;
    p.batch = &b;
    Tensor w_uk, q_lat;
    if (absorb) {
      w_uk = act(be, host_random({hq, lat, dn}, 46, 0.2f));
      q_lat = be.empty({t, hq, lat}, be.compute_dtype());
      p.w_uk_t = &w_uk;
      p.q_lat = &q_lat;
    }
    be.mla_rope_store(p);
    // The new tokens' entries apart from the rest of the pool (which must be untouched).
    Tensor rest = be.download(pool);
    int64_t stored = 0;
    for (int32_t slot : s.slots) stored += slot >= 0;
    Tensor entries = Tensor::empty({stored, entry}, DType::kF32);
    int64_t row = 0;
    for (int32_t slot : s.slots) {
      if (slot < 0) continue;
      float* e = rest.f32() + (slot / block_size) * s.layout.block_stride() +
                 s.layout.layer_offset(1) + int64_t{slot % block_size} * entry;
      std::copy(e, e + entry, entries.f32() + row++ * entry);
      std::fill(e, e + entry, 0.0f);
    }
    std::vector<Output> outs = {
        out(be, "q_nope", q_nope, Check::kExact), out(be, "q_pe", q_pe, Check::kBf16),
        Output{"entries", entries, Check::kBf16}, Output{"pool_rest", rest, Check::kExact}};
    if (absorb) outs.push_back(out(be, "q_lat", q_lat, Check::kBf16));
    return outs;
  }
};

// The inputs of one qkv_rope_attention call on sequences of the given contexts (one new token
// each at the context's last position; `padding` appends a graph bucket's unused row), built in
// place (the params point at the tensors). new_qkv: a new QKV GEMM output (seed by call).
struct QkvAttentionInputs {
  static constexpr int32_t kLayers = 2, kLayer = 1;
  int32_t entry;
  PagedSetup s;
  PagedBatch b;
  Tensor pool, qn, kn, cos_sin, q, o, qkv;
  QkvRopeStoreParams sp;
  PagedAttentionParams ap;
  int32_t hq, hkv, d;

  static std::vector<std::pair<int, int>> seqs_of(const std::vector<int32_t>& ctx) {
    std::vector<std::pair<int, int>> seqs;
    for (int32_t len : ctx) seqs.emplace_back(len - 1, 1);
    return seqs;
  }
  QkvAttentionInputs(Backend& be, int32_t q_heads, int32_t kv_heads, int32_t dim, int32_t bs,
                     bool norm, bool padding, const std::vector<int32_t>& ctx)
      : entry(2 * kv_heads * dim),
        s(seqs_of(ctx), bs, kLayers, 2 * kv_heads * dim),
        hq(q_heads),
        hkv(kv_heads),
        d(dim) {
    int32_t max_pos = 1;
    for (int32_t len : ctx) max_pos = std::max(max_pos, len + 1);
    if (padding) {
      s.positions.push_back(0);
      s.slots.push_back(-1);
      ++s.num_tokens;
      s.qo.push_back(s.num_tokens);
      s.kv_ptr.push_back(s.kv_ptr.back());
      s.last.push_back(0);
    }
    b = s.make(be);
    const int64_t t = s.num_tokens;
    pool = act(be, host_random({s.layout.num_blocks, kLayers, bs, entry}, 71));
    qn = act(be, host_random({d}, 72));
    kn = act(be, host_random({d}, 73));
    Tensor cs_host = Tensor::empty({max_pos, d}, DType::kF32);
    for (int32_t p = 0; p < max_pos; ++p)
      for (int32_t j = 0; j < d / 2; ++j) {
        const double a = p * std::pow(500000.0, -2.0 * j / d);
        cs_host.f32()[p * d + j] = static_cast<float>(std::cos(a));
        cs_host.f32()[p * d + d / 2 + j] = static_cast<float>(std::sin(a));
      }
    cos_sin = be.upload(cs_host, DType::kF32);
    q = be.empty({t, hq, d}, be.compute_dtype());
    Tensor sevens = Tensor::empty({t, hq, d}, DType::kF32);
    std::fill(sevens.f32(), sevens.f32() + sevens.numel(), 7.0f);
    o = act(be, sevens);
    sp.qkv = &qkv;
    sp.q_out = &q;
    sp.pool = &pool;
    sp.layout = s.layout;
    sp.layer = kLayer;
    sp.num_q_heads = hq;
    sp.num_kv_heads = hkv;
    sp.head_dim = d;
    sp.q_norm = norm ? &qn : nullptr;
    sp.k_norm = norm ? &kn : nullptr;
    sp.eps = 1e-6f;
    sp.cos_sin = &cos_sin;
    sp.batch = &b;
    ap.q = &q;
    ap.out = &o;
    ap.pool = &pool;
    ap.layout = s.layout;
    ap.layer = kLayer;
    ap.num_q_heads = hq;
    ap.num_kv_heads = hkv;
    ap.head_dim_qk = ap.head_dim_v = d;
    ap.k_offset = 0;
    ap.v_offset = hkv * d;
    ap.kv_head_stride = d;
    ap.scale = 1.0f / std::sqrt(static_cast<float>(d));
    ap.batch = &b;
  }
  QkvAttentionInputs(const QkvAttentionInputs&) = delete;
  QkvAttentionInputs& operator=(const QkvAttentionInputs&) = delete;

  // Scale 2: scores of a few units, so the softmax is neither flat nor one-hot.
  void new_qkv(Backend& be, int32_t call) {
    qkv = act(be, host_random({s.num_tokens, (hq + 2 * hkv) * d}, 74 + static_cast<uint64_t>(call),
                              2.0f));
  }
  // The new tokens' pool entries of the layer (Bf16 check), then the rest of the pool (exact).
  void pool_outputs(Backend& be, std::vector<Output>& outs) const {
    Tensor rest = be.download(pool);
    int64_t stored = 0;
    for (int32_t slot : s.slots) stored += slot >= 0;
    Tensor entries = Tensor::empty({stored, entry}, DType::kF32);
    int64_t row = 0;
    for (int32_t slot : s.slots) {
      if (slot < 0) continue;
      float* e = rest.f32() + (slot / s.layout.block_size) * s.layout.block_stride() +
                 s.layout.layer_offset(kLayer) + int64_t{slot % s.layout.block_size} * entry;
      std::copy(e, e + entry, entries.f32() + row++ * entry);
      std::fill(e, e + entry, 0.0f);
    }
    outs.push_back(Output{"entries", entries, Check::kBf16});
    outs.push_back(Output{"pool_rest", rest, Check::kExact});
  }
};

// Backend::qkv_rope_attention (one kernel on CUDA for decode batches) vs the CPU's composition
// (qkv_rope_store, then paged_attention). Each sequence has one new token at position ctx - 1
// (cached ctx - 1 tokens); `padding` appends a graph bucket's unused row (slot -1, no blocks,
// output zero). `calls` > 1 repeats the op on the same buffers with a new qkv each time (the
// last call's output and K/V must be complete: on CUDA that needs the split counters reset).
// Outputs: the attention output (pre-filled with 7s, so an unwritten row fails), the new tokens'
// pool entries of the layer, and the rest of the pool (untouched: exact).
struct TestQkvRopeAttention : OpCase {
  std::string label;
  int32_t hq, hkv, d, block_size;
  bool norm, padding;
  std::vector<int32_t> ctx;
  int32_t calls;
  TestQkvRopeAttention(std::string l, int32_t q, int32_t kv, int32_t dim, int32_t bs, bool n,
                       std::vector<int32_t> lens, bool pad = false, int32_t num_calls = 1)
      : label(std::move(l)),
        hq(q),
        hkv(kv),
        d(dim),
        block_size(bs),
        norm(n),
        padding(pad),
        ctx(std::move(lens)),
        calls(num_calls) {}
  std::string name() const override {
    std::string n = "qkv_rope_attention_" + label + "_hq" + std::to_string(hq) + "_hkv" +
                    std::to_string(hkv) + "_d" + std::to_string(d) + "_bs" +
                    std::to_string(block_size) + (norm ? "_qknorm" : "") + "_ctx";
    for (size_t i = 0; i < ctx.size(); ++i) {
      if (i > 0) n += "-";
      n += std::to_string(ctx[i]);
    }
    if (padding) n += "_pad";
    if (calls > 1) n += "_x" + std::to_string(calls);
    return n;
  }
  std::vector<Output> run(Backend& be) const override {
    QkvAttentionInputs in(be, hq, hkv, d, block_size, norm, padding, ctx);
    for (int32_t call = 0; call < calls; ++call) {
      in.new_qkv(be, call);
      be.qkv_rope_attention(in.sp, in.ap);
    }
    std::vector<Output> outs{out(be, "out", in.o, Check::kBf16)};
    in.pool_outputs(be, outs);
    return outs;
  }
};

// A GQA layer's attention segment as the model issues it (qkv_rope_attention, then o_proj of
// `hidden` rows into a random residual through fused_linear) on TestQkvRopeAttention's inputs.
// Outputs: the residual, the new K/V and the rest of the pool.
struct TestAttentionOProj : OpCase {
  std::string label;
  int32_t hq, hkv, d, block_size, hidden;
  bool norm;
  std::vector<int32_t> ctx;
  int32_t calls;
  TestAttentionOProj(std::string l, int32_t q, int32_t kv, int32_t dim, int32_t bs, int32_t h,
                     bool n, std::vector<int32_t> lens, int32_t num_calls = 1)
      : label(std::move(l)),
        hq(q),
        hkv(kv),
        d(dim),
        block_size(bs),
        hidden(h),
        norm(n),
        ctx(std::move(lens)),
        calls(num_calls) {}
  std::string name() const override {
    std::string n = "attention_o_proj_" + label + "_hq" + std::to_string(hq) + "_hkv" +
                    std::to_string(hkv) + "_d" + std::to_string(d) + "_hidden" +
                    std::to_string(hidden) + "_ctx";
    for (size_t i = 0; i < ctx.size(); ++i) {
      if (i > 0) n += "-";
      n += std::to_string(ctx[i]);
    }
    if (calls > 1) n += "_x" + std::to_string(calls);
    return n;
  }
  std::vector<Output> run(Backend& be) const override {
    QkvAttentionInputs in(be, hq, hkv, d, block_size, norm, false, ctx);
    const int64_t t = in.s.num_tokens, k = int64_t{hq} * d;
    // W_o scaled so that x's update is of x's size (attention values are O(1)).
    Tensor w_o = act(be, host_random({hidden, k}, 81, 1.0f / std::sqrt(static_cast<float>(k))));
    Tensor x = act(be, host_random({t, hidden}, 82));
    for (int32_t call = 0; call < calls; ++call) {
      in.new_qkv(be, call);
      be.qkv_rope_attention(in.sp, in.ap);
      const Tensor a = in.o.reshape({t, k});
      FusedLinearParams p;
      p.x = &a;
      p.w = &w_o;
      p.residual = &x;
      be.fused_linear(p);
    }
    std::vector<Output> outs{out(be, "x", x, Check::kBf16)};
    in.pool_outputs(be, outs);
    return outs;
  }
};

// Contexts around the split size (64): 1 split, a second split holding only the new token, 32
// splits; ragged batches mix them (empty trailing splits) and end with a padding row.
void add_qkv_rope_attention_cases(std::vector<std::shared_ptr<OpCase>>& c) {
  using V = std::vector<int32_t>;
  auto add = [&](TestQkvRopeAttention* x) { c.emplace_back(x); };
  // Llama-3.1-8B heads (32 / 8, head dim 128), batch 1.
  for (int32_t len : {1, 5, 63, 64, 65, 513, 2000})
    add(new TestQkvRopeAttention("llama", 32, 8, 128, 16, false, V{len}));
  // Ragged batches (3-7 sequences + padding) over block sizes 1 / 16 / 64.
  const V ragged{65, 1, 2000, 64, 5, 513};
  for (int32_t bs : {1, 16, 64})
    add(new TestQkvRopeAttention("llama_ragged", 32, 8, 128, bs, false, ragged, true));
  // Groups 1 / 2 / 4 / 8 / 16, head dims 64 / 128, with and without the Qwen3 q/k norms.
  add(new TestQkvRopeAttention("g1", 8, 8, 128, 16, false, V{63, 130, 7}, true));
  add(new TestQkvRopeAttention("g2", 8, 4, 64, 64, true, V{200, 1, 64, 65}, true));
  add(new TestQkvRopeAttention("g4", 8, 2, 64, 1, false, V{97, 2000, 3}));
  add(new TestQkvRopeAttention("g8", 32, 4, 128, 16, true, V{511, 1, 2000}, true));
  add(new TestQkvRopeAttention("g1_d64", 4, 4, 64, 16, true, V{65, 5, 1000}));
  add(new TestQkvRopeAttention("qwen3", 32, 8, 128, 16, true, V{513}));
  add(new TestQkvRopeAttention("g16", 32, 2, 128, 16, true, V{2049, 3, 130}, true));
  add(new TestQkvRopeAttention("d256", 8, 4, 256, 64, true, V{300, 64}, true));
  add(new TestQkvRopeAttention("qwen3_ragged", 32, 8, 128, 64, true, ragged, true));
  // Three calls on the same buffers: the split counters must be back at zero after each.
  add(new TestQkvRopeAttention("repeat", 32, 8, 128, 16, false, V{2000, 64, 300}, true, 3));
  add(new TestQkvRopeAttention("repeat", 8, 2, 64, 16, true, V{700}, false, 3));
}

// attention, then o_proj: Qwen3-30B-A3B's heads and hidden size at 1 / 2 / 33 / 65 splits (one
// token), three calls on the same buffers; a ragged batch, Llama-3.1-8B's shape and a small model.
void add_attention_o_proj_cases(std::vector<std::shared_ptr<OpCase>>& c) {
  using V = std::vector<int32_t>;
  for (int32_t len : {5, 65, 2049, 4100})
    c.emplace_back(new TestAttentionOProj("qwen3moe", 32, 4, 128, 16, 2048, true, V{len}));
  c.emplace_back(new TestAttentionOProj("repeat", 32, 4, 128, 16, 2048, true, V{700}, 3));
  c.emplace_back(new TestAttentionOProj("ragged", 32, 4, 128, 16, 2048, true, V{700, 65, 3}));
  c.emplace_back(new TestAttentionOProj("llama", 32, 8, 128, 16, 4096, false, V{513}));
  c.emplace_back(new TestAttentionOProj("small", 4, 2, 64, 16, 256, true, V{300}));
}

void add_decode_fused_cases(std::vector<std::shared_ptr<OpCase>>& c) {
  c.emplace_back(new TestQkvRopeStore(16, 32, 8, 128, false));  // Llama-3.1-8B heads
  c.emplace_back(new TestQkvRopeStore(1, 3, 1, 16, true));      // the qwen3 golden
  c.emplace_back(new TestQkvRopeStore(64, 4, 2, 256, true));
  c.emplace_back(new TestQkvRopeStore(16, 5, 1, 64, false));
  using Src = TestMlaRopeStore::Src;
  // DeepSeek-V2-Lite's MLA dims (hq 16, 128 + 64, latent 512), interleaved rope as the model.
  for (int32_t bs : {1, 16, 64})
    for (int32_t t : {1, 3, 33})
      c.emplace_back(new TestMlaRopeStore(bs, 16, 128, 64, 512, t, true, Src::kFused));
  c.emplace_back(new TestMlaRopeStore(16, 16, 128, 64, 512, 33, false, Src::kFused));
  c.emplace_back(new TestMlaRopeStore(64, 16, 128, 64, 512, 3, true, Src::kSeparate));
  c.emplace_back(new TestMlaRopeStore(16, 128, 128, 64, 512, 3, true, Src::kSeparate));  // V3 heads
  // The goldens' dims (3 heads, 16 + 8, latent 32) and odd ones (9 heads: a partial CTA of heads).
  c.emplace_back(new TestMlaRopeStore(16, 3, 16, 8, 32, 33, true, Src::kFused));
  c.emplace_back(new TestMlaRopeStore(1, 9, 7, 6, 33, 3, false, Src::kOffsets));
  c.emplace_back(new TestMlaRopeStore(64, 5, 24, 10, 47, 33, true, Src::kOffsets));
  c.emplace_back(new TestMlaRopeStore(16, 5, 24, 10, 47, 1, false, Src::kSeparate));
  // With the absorbed query (W_UK): V2-Lite at 1 / 3 / 33 tokens, V3's 128 heads, the goldens'
  // dims; odd dims (nope 7, latent 47) and a q part at column 3 + entry (rows not 16-byte
  // aligned) take the two-kernel path on CUDA.
  for (int32_t t : {1, 3, 33})
    c.emplace_back(new TestMlaRopeStore(16, 16, 128, 64, 512, t, true, Src::kFused, true));
  c.emplace_back(new TestMlaRopeStore(64, 128, 128, 64, 512, 3, true, Src::kSeparate, true));
  c.emplace_back(new TestMlaRopeStore(16, 3, 16, 8, 32, 33, true, Src::kFused, true));
  c.emplace_back(new TestMlaRopeStore(1, 9, 7, 6, 33, 3, false, Src::kOffsets, true));
  c.emplace_back(new TestMlaRopeStore(64, 5, 24, 10, 48, 3, true, Src::kOffsets, true));
  add_qkv_rope_attention_cases(c);
  add_attention_o_proj_cases(c);
}

}  // namespace
}  // namespace di::testing
