// Block-scaled FP8 GEMM (issue #6) against bf16 cuBLAS, same shapes, same run. The FP8 time is the
// whole CudaBackend::linear call on an FP8 weight: the 1x128 activation quantization kernel plus
// the cuBLASLt block-scaled matmul.
// The quantization kernel is also timed alone. Weights are random e4m3 bytes with random block
// scales (no checkpoint); activations are random bf16 from CudaBackend::fill_random.
//
//   bench_cuda_fp8        prints one "[fp8] ..." line per shape
#include <cuda_runtime.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels/fp8_quant.h"
#include "core/cuda_check.h"

namespace di {
namespace {

struct Case {
  int64_t m, n, k;
  const char* what;
};

// Mean milliseconds per call of fn over `iters` calls after `warmup` calls, timed with events.
template <typename Fn>
double time_ms(cuda::CudaBackend& be, Fn&& fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  CUDA_CHECK(cudaEventRecord(a, be.stream()));
  for (int i = 0; i < iters; ++i) fn();
  CUDA_CHECK(cudaEventRecord(b, be.stream()));
  CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  return static_cast<double>(ms) / iters;
}

void run_case(cuda::CudaBackend& be, const Case& c) {
  std::mt19937 rng(static_cast<uint32_t>(c.n * 31 + c.k));
  // e4m3 bytes with the exponent field below 15 and any sign/mantissa: finite, never NaN.
  Tensor wq_host = Tensor::empty({c.n, c.k}, DType::kFP8E4M3);
  for (int64_t i = 0; i < c.n * c.k; ++i)
    wq_host.data<uint8_t>()[i] = static_cast<uint8_t>(rng() & 0xF7u);
  Tensor ws_host = Tensor::empty({c.n / 128, di::fp8_block_scale_cols(c.k)}, DType::kF32);
  for (int64_t i = 0; i < ws_host.numel(); ++i)
    ws_host.f32()[i] = 1e-3f * (1.0f + static_cast<float>(rng() % 100) / 100.0f);
  Tensor wq =
      be.upload(wq_host, DType::kFP8E4M3).with_block_scales(be.upload(ws_host, DType::kF32));
  Tensor wb = be.empty({c.n, c.k}, DType::kBF16);
  be.fill_random(wb, 7, 0.05f);
  Tensor x = be.empty({c.m, c.k}, DType::kBF16);
  be.fill_random(x, 9, 1.0f);
  Tensor y = be.empty({c.m, c.n}, DType::kBF16);
  const int64_t m_pad = c.m;
  Tensor xq = be.empty({m_pad, c.k}, DType::kFP8E4M3);
  Tensor xs = be.empty({c.k / 128, m_pad}, DType::kF32);
  const double flops =
      2.0 * static_cast<double>(c.m) * static_cast<double>(c.n) * static_cast<double>(c.k);
  const int iters = flops > 1e11 ? 20 : 50;
  const double fp8_ms = time_ms(
      be, [&] { be.linear(x, wq, nullptr, y); }, 3, iters);
  const double bf16_ms = time_ms(
      be, [&] { be.linear(x, wb, nullptr, y); }, 3, iters);
  const cuda::Fp8QuantParams qp{static_cast<const __nv_bfloat16*>(x.raw()),
                                static_cast<uint8_t*>(xq.raw()),
                                static_cast<float*>(xs.raw()),
                                c.m,
                                m_pad,
                                static_cast<int32_t>(c.k)};
  const double quant_ms = time_ms(
      be, [&] { cuda::launch_fp8_quant_1x128(qp, be.stream()); }, 3, iters);
  CUDA_CHECK(cudaGetLastError());
  // Bytes the FP8 call must move: weight (1 B) + its scales, x (2 B) read, y (2 B) written.
  const double fp8_bytes = static_cast<double>(c.n * c.k) + static_cast<double>(c.m * c.k) * 2 +
                           static_cast<double>(c.m * c.n) * 2;
  std::printf(
      "[fp8] %-10s m=%-5lld n=%-5lld k=%-5lld fp8_us=%9.2f fp8_tflops=%8.1f fp8_gbps=%7.0f "
      "quant_us=%7.2f bf16_us=%9.2f bf16_tflops=%7.1f speedup=%5.2f\n",
      c.what, static_cast<long long>(c.m), static_cast<long long>(c.n), static_cast<long long>(c.k),
      fp8_ms * 1e3, flops / (fp8_ms * 1e-3) / 1e12, fp8_bytes / (fp8_ms * 1e-3) / 1e9,
      quant_ms * 1e3, bf16_ms * 1e3, flops / (bf16_ms * 1e-3) / 1e12, bf16_ms / fp8_ms);
  std::fflush(stdout);
}

}  // namespace
}  // namespace di

int main() {
  using di::Case;
  if (!di::cuda::cuda_available()) {
    std::printf("[fp8] skipped: no CUDA device\n");
    return 0;
  }
  di::cuda::CudaBackend be;
  const std::vector<Case> cases{
      {4096, 4096, 4096, "square"},  {1, 7168, 2048, "o/down"},  {64, 7168, 2048, "o/down"},
      {4096, 7168, 2048, "o/down"},  {1, 1536, 7168, "q_a"},     {64, 1536, 7168, "q_a"},
      {4096, 1536, 7168, "q_a"},     {1, 24576, 1536, "q_b"},    {64, 24576, 1536, "q_b"},
      {4096, 24576, 1536, "q_b"},    {1, 36864, 7168, "ffn_gu"}, {64, 36864, 7168, "ffn_gu"},
      {4096, 36864, 7168, "ffn_gu"},
  };
  int failed = 0;
  for (const Case& c : cases) {
    try {
      di::run_case(be, c);
    } catch (const std::exception& e) {
      std::printf("[fp8] %-10s m=%lld n=%lld k=%lld FAILED: %s\n", c.what,
                  static_cast<long long>(c.m), static_cast<long long>(c.n),
                  static_cast<long long>(c.k), e.what());
      std::fflush(stdout);
      ++failed;
    }
  }
  return failed == 0 ? 0 : 1;
}
