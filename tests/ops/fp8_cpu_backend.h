#pragma once
// A CPU backend that takes block-scaled FP8 weights (issue #6), for tests: every op goes to the CPU
// backend; linear() also accepts an fp8_e4m3 weight with block scales (tensor.h) and dequantizes
// it with them, optionally quantizing the activations the way the CUDA FP8 path does
// (kernels/fp8_quant.cu: e4m3, one scale amax/448 per row and 128 columns). Used by
// tests/unit/model/test_fp8_loader.cpp (loader behaviour, on the CPU) and
// tests/ops/test_cuda_fp8.cpp (the CUDA model against this emulation).
#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <unordered_map>
#include <utility>

#include "backend/backend.h"
#include "backend/profiling_backend.h"

namespace di::testing {

// The CPU backend it forwards to, owned; a base so it exists before ProfilingBackend's.
struct OwnedCpuBackend {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
};

// Forwards every op to the CPU backend (ProfilingBackend, never enabled: pure forwarding);
// linear() also accepts FP8 weights with block scales.
class Fp8CpuBackend final : private OwnedCpuBackend, public ProfilingBackend {
 public:
  explicit Fp8CpuBackend(bool accept, bool quantize_activations = false)
      : ProfilingBackend(*cpu), accept_(accept), quantize_x_(quantize_activations) {}

  std::set<std::pair<int64_t, int64_t>> fp8_shapes_seen;  // [n, k] of FP8 weights in linear()
  int64_t fp8_calls = 0;

  const char* name() const override { return "fp8-cpu"; }
  bool supports_fp8_block_linear(int64_t n, int64_t k) const override {
    return accept_ && n % 128 == 0 && k % 128 == 0;
  }
  // Composed on this backend, so that FP8 weights reach linear() below.
  void fused_linear(const FusedLinearParams& p) override { fused_linear_composed(*this, p); }
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) override {
    if (w.dtype() != DType::kFP8E4M3) return cpu->linear(x, w, bias, y);
    ++fp8_calls;
    DI_CHECK(accept_, "FP8 weight {} reached a backend that did not ask for it", w.describe());
    const Tensor* s = w.block_scales();
    DI_CHECK(s != nullptr, "FP8 weight {} without block scales", w.describe());
    const int64_t n = w.size(0), k = w.size(1);
    DI_CHECK(n % 128 == 0 && k % 128 == 0, "ineligible FP8 weight {}", w.describe());
    const int64_t ld = ((k / 128) + 3) / 4 * 4;  // rows padded to 16 bytes (tensor.h)
    DI_CHECK(
        s->dtype() == DType::kF32 && s->dim() == 2 && s->size(0) == n / 128 && s->size(1) == ld,
        "scales {} for weight {}", s->describe(), w.describe());
    for (int64_t b = 0; b < n / 128; ++b)
      for (int64_t j = k / 128; j < ld; ++j)
        DI_CHECK(s->f32()[b * ld + j] == 1.0f, "scale padding of {} is not 1", w.describe());
    fp8_shapes_seen.insert({n, k});
    auto it = dequantized_.find(w.raw());
    if (it == dequantized_.end()) {
      Tensor f = Tensor::empty({n, k}, DType::kF32);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < k; ++j)
          f.f32()[i * k + j] =
              fp8e4m3_to_f32(w.data<uint8_t>()[i * k + j]) * s->f32()[(i / 128) * ld + j / 128];
      it = dequantized_.emplace(w.raw(), f).first;
    }
    if (!quantize_x_) return cpu->linear(x, it->second, bias, y);
    // What the CUDA backend does to activations before an FP8 GEMM (kernels/fp8_quant.cu): e4m3
    // with one scale amax/448 per row and 128 columns.
    Tensor xq = Tensor::empty(x.shape(), DType::kF32);
    const int64_t rows = x.numel() / k;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < k / 128; ++g) {
        const float* src = x.f32() + r * k + g * 128;
        float amax = 0;
        for (int j = 0; j < 128; ++j) amax = std::max(amax, std::fabs(src[j]));
        amax = std::max(amax, 1e-10f);
        for (int j = 0; j < 128; ++j)
          xq.f32()[r * k + g * 128 + j] =
              fp8e4m3_to_f32(f32_to_fp8e4m3(src[j] * (448.0f / amax))) * (amax / 448.0f);
      }
    cpu->linear(xq, it->second, bias, y);
  }

 private:
  bool accept_;
  bool quantize_x_;
  std::unordered_map<const void*, Tensor> dequantized_;
};

}  // namespace di::testing
