#pragma once
// Op cases of the fused decode ops (issue #5), included by test_backend_ops.cpp after its own
// cases (needs OpCase, PagedSetup). Registered in all_cases() by add_decode_fused_cases().
#include <cmath>

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

void add_decode_fused_cases(std::vector<std::shared_ptr<OpCase>>& c) {
  c.emplace_back(new TestQkvRopeStore(16, 32, 8, 128, false));  // Llama-3.1-8B heads
  c.emplace_back(new TestQkvRopeStore(1, 3, 1, 16, true));      // the qwen3 golden
  c.emplace_back(new TestQkvRopeStore(64, 4, 2, 256, true));
  c.emplace_back(new TestQkvRopeStore(16, 5, 1, 64, false));
}

}  // namespace
}  // namespace di::testing
