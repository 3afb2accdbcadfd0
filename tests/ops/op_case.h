#pragma once
// The op-test table (llama.cpp test-backend-ops style): an OpCase builds its inputs from a fixed
// seed, runs one op on a backend and returns its outputs as host tensors; the driver runs it on
// the CPU oracle and on the backend under test and compares with the metric the case asks for.
//
// Inputs are rounded to bf16 on the host first, so both backends see identical values and the
// comparison measures only the op's own arithmetic.
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "tensor/dtype.h"

namespace di::testing {

enum class Check {
  kExact,  // bit-equal after download (copies, gathers, KV stores)
  kBf16,   // diff = 1 - 2Σxy / Σ(x² + y²) < 1e-3, plus max|x-y| <= 2e-2 · max|ref| (small outputs)
  kIds,    // integer outputs equal
  kF32,    // NMSE <= 1e-7 … relaxed to 1e-5 for f32 outputs of bf16 inputs
};

struct Output {
  std::string name;
  Tensor value;  // host f32 or i32
  Check check;
};

struct OpCase {
  virtual ~OpCase() = default;
  virtual std::string name() const = 0;
  virtual std::vector<Output> run(Backend& be) const = 0;
};

// ---- input helpers -----------------------------------------------------------------------------

inline float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

inline Tensor host_random(const Shape& shape, uint64_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = round_bf16(u(rng));
  return t;
}

inline Tensor host_i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  for (size_t i = 0; i < v.size(); ++i) t.data<int32_t>()[i] = v[i];
  return t;
}

// An activation / weight on `be` in its compute dtype.
inline Tensor act(Backend& be, const Tensor& host) { return be.upload(host, be.compute_dtype()); }
inline Tensor ints(Backend& be, const std::vector<int32_t>& v) {
  return be.upload(host_i32(v), DType::kI32);
}
inline Output out(Backend& be, std::string name, const Tensor& t, Check check) {
  return Output{std::move(name), be.download(t), check};
}

// ---- the routers of the MoE models the tests stand in for ------------------------------------

// Qwen3-30B-A3B: softmax, top-8 of 128, renormalised.
inline MoeRoutingParams qwen3_moe_routing() {
  MoeRoutingParams r;
  r.num_experts = 128;
  r.top_k = 8;
  r.renormalize = true;
  r.renorm_eps = 1e-20f;
  return r;
}
// DeepSeek-V2-Lite: softmax, top-6 of 64, greedy.
inline MoeRoutingParams v2_lite_routing() {
  MoeRoutingParams r;
  r.num_experts = 64;
  r.top_k = 6;
  return r;
}
// DeepSeek-V3: sigmoid (+ correction bias), 8 groups scored by their top-two sum, the best 4
// eligible, top-8 of 256, renormalised, scaled by 2.5.
inline MoeRoutingParams deepseek_v3_routing() {
  MoeRoutingParams r;
  r.scoring = MoeRoutingParams::Scoring::kSigmoid;
  r.group_score = MoeRoutingParams::GroupScore::kTopTwoSum;
  r.num_experts = 256;
  r.top_k = 8;
  r.num_groups = 8;
  r.topk_groups = 4;
  r.renormalize = true;
  r.renorm_eps = 1e-20f;
  r.scaling = 2.5f;
  return r;
}

// ---- metrics -----------------------------------------------------------------------------------

struct Metrics {
  double diff = 0.0;     // 1 - 2Σxy / Σ(x² + y²)
  double nmse = 0.0;     // Σ(x - y)² / Σx²
  double max_abs = 0.0;  // max |x - y|
  double max_ref = 0.0;  // max |x|
  int64_t mismatches = 0;  // exact / ids: differing elements; else non-finite outputs
  int64_t n = 0;
};

inline Metrics compare(const Tensor& ref, const Tensor& got) {
  Metrics m;
  m.n = ref.numel();
  if (ref.dtype() == DType::kI32) {
    for (int64_t i = 0; i < m.n; ++i) m.mismatches += ref.data<int32_t>()[i] != got.data<int32_t>()[i];
    return m;
  }
  double sxy = 0, sxx = 0, syy = 0, se = 0;
  for (int64_t i = 0; i < m.n; ++i) {
    const double x = ref.f32()[i], y = got.f32()[i];
    if (!std::isfinite(y) && std::isfinite(x)) ++m.mismatches;
    sxy += x * y;
    sxx += x * x;
    syy += y * y;
    se += (x - y) * (x - y);
    m.max_abs = std::max(m.max_abs, std::fabs(x - y));
    m.max_ref = std::max(m.max_ref, std::fabs(x));
  }
  m.diff = (sxx + syy) > 0 ? 1.0 - 2.0 * sxy / (sxx + syy) : 0.0;
  m.nmse = sxx > 0 ? se / sxx : se;
  return m;
}

}  // namespace di::testing
