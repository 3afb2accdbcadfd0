// Block-scaled FP8 linear on the CUDA backend (issue #6) against the CPU reference, and a
// DeepSeek-V3-shaped FP8 model on both backends. Skips without a GPU.
//
// Op test. The weight is e4m3 with one f32 scale per 128x128 block (scales vary by orders of
// magnitude between blocks, and activations between 1x128 groups, so a wrong scale layout or
// operand mapping cannot pass). The reference is the fp32 GEMM of the bf16 activations with the
// dequantized weight, exactly what the CPU backend computes for the FP8 model. The only
// approximation on the GPU is the 1x128 e4m3 quantization of the activations: e4m3 keeps 3
// mantissa bits, so round-to-nearest errs by at most 2^-4 relative for normal values and by at
// most half the smallest subnormal step, 2^-10, times the group's scale s (= amax/448) below
// that. Hence, for every output element,
//   |y_gpu - y_ref| <= Σ_k |w_jk| · (2^-4 |x_ik| + 2^-10 s_i,k/128) + 2^-8 |y_ref| + 1e-6
// (the 2^-8 term: bf16 output rounding, 2^-9, with slack for fp32 accumulation order).
// That bound is asserted per element; the normalized error ||y_gpu - y_ref|| / ||y_ref|| is
// expected near 2-3% for random data (rms rounding error of e4m3 over a binade) and asserted
// <= 5%.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../integration/golden_util.h"
#include "backend/backend.h"
#include "engine/generator.h"
#include "fp8_cpu_backend.h"
#include "model/make_model.h"
#include "model/model.h"

#ifdef DI_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace di {
namespace {

bool gpu_present(std::string* why) {
#ifdef DI_HAVE_CUDA
  if (cuda::cuda_available()) return true;
  *why = "no CUDA device visible";
#else
  *why = "built without CUDA";
#endif
  return false;
}

struct Fp8Weight {
  Tensor q;      // [n, k] e4m3 (host)
  Tensor scale;  // [n/128, k/128] f32 (host)
  Tensor deq;    // [n, k] f32 (host), q * scale
};

// Random weight quantized the DeepSeek way (amax/448 per 128x128 block); the blocks' magnitudes
// spread over 1e-3 .. 1e1 so that each scale matters.
Fp8Weight make_weight(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> expo(-3.0f, 1.0f);
  const int64_t nb = n / 128, kb = k / 128;
  Fp8Weight w{Tensor::empty({n, k}, DType::kFP8E4M3), Tensor::empty({nb, kb}, DType::kF32),
              Tensor::empty({n, k}, DType::kF32)};
  std::vector<float> mag(static_cast<size_t>(nb * kb));
  for (auto& v : mag) v = std::pow(10.0f, expo(rng));
  std::vector<float> f(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j)
      f[static_cast<size_t>(i * k + j)] =
          normal(rng) * mag[static_cast<size_t>((i / 128) * kb + j / 128)] / std::sqrt(float(k));
  for (int64_t bi = 0; bi < nb; ++bi)
    for (int64_t bj = 0; bj < kb; ++bj) {
      float amax = 0;
      for (int64_t i = bi * 128; i < bi * 128 + 128; ++i)
        for (int64_t j = bj * 128; j < bj * 128 + 128; ++j)
          amax = std::max(amax, std::fabs(f[static_cast<size_t>(i * k + j)]));
      const float s = std::max(amax, 1e-12f) / 448.0f;
      w.scale.f32()[bi * kb + bj] = s;
      for (int64_t i = bi * 128; i < bi * 128 + 128; ++i)
        for (int64_t j = bj * 128; j < bj * 128 + 128; ++j) {
          const uint8_t q = f32_to_fp8e4m3(f[static_cast<size_t>(i * k + j)] / s);
          w.q.data<uint8_t>()[i * k + j] = q;
          w.deq.f32()[i * k + j] = fp8e4m3_to_f32(q) * s;
        }
    }
  return w;
}

// The scales as the backend takes them (tensor.h, block_scales()): rows padded to
// fp8_block_scale_cols(k) floats with 1.0.
Tensor padded_scales(const Tensor& scale, int64_t k) {
  const int64_t rows = scale.size(0), kb = scale.size(1), ld = fp8_block_scale_cols(k);
  Tensor p = Tensor::empty({rows, ld}, DType::kF32);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < ld; ++j) p.f32()[r * ld + j] = j < kb ? scale.f32()[r * kb + j] : 1.0f;
  return p;
}

// bf16-exact activations whose 1x128 groups differ in magnitude (1e-2 .. 1e2).
Tensor make_activations(int64_t m, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> expo(-2.0f, 2.0f);
  Tensor x = Tensor::empty({m, k}, DType::kF32);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t g = 0; g < k / 128; ++g) {
      const float mag = std::pow(10.0f, expo(rng));
      for (int64_t j = g * 128; j < g * 128 + 128; ++j)
        x.f32()[i * k + j] = bf16_to_f32(f32_to_bf16(normal(rng) * mag));
    }
  return x;
}

#ifdef DI_HAVE_CUDA
TEST(CudaFp8Linear, MatchesCpuReferenceWithinQuantizationBound) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << "CUDA FP8 test skipped: " << why;
  auto cpu = make_cpu_backend();
  cuda::CudaBackend gpu;
  const std::vector<int64_t> ms{1, 7, 64, 300};
  const int64_t m_max = 300;
  // [n, k]: tiny, odd block counts, DeepSeek-V3's q_a_proj (1536 x 7168) and a 7168 x 2048.
  const std::vector<std::pair<int64_t, int64_t>> nks{
      {128, 128}, {256, 256}, {2176, 2176}, {1536, 7168}, {7168, 2048}};
  uint32_t seed = 11;
  for (const auto& [n, k] : nks) {
    ASSERT_TRUE(gpu.supports_fp8_block_linear(n, k)) << n << "x" << k;
    const Fp8Weight w = make_weight(n, k, seed++);
    const Tensor x = make_activations(m_max, k, seed++);
    // Reference and the bound's two sums, on the CPU backend (fp32).
    Tensor ref = cpu->empty({m_max, n}, DType::kF32);
    cpu->linear(x, w.deq, nullptr, ref);
    Tensor abs_x = Tensor::empty({m_max, k}, DType::kF32),
           grp = Tensor::empty({m_max, k}, DType::kF32);
    Tensor abs_w = Tensor::empty({n, k}, DType::kF32);
    for (int64_t i = 0; i < m_max; ++i)
      for (int64_t g = 0; g < k / 128; ++g) {
        float amax = 0;
        for (int64_t j = g * 128; j < g * 128 + 128; ++j)
          amax = std::max(amax, std::fabs(x.f32()[i * k + j]));
        for (int64_t j = g * 128; j < g * 128 + 128; ++j) {
          abs_x.f32()[i * k + j] = std::fabs(x.f32()[i * k + j]);
          grp.f32()[i * k + j] = amax / 448.0f;
        }
      }
    for (int64_t i = 0; i < n * k; ++i) abs_w.f32()[i] = std::fabs(w.deq.f32()[i]);
    Tensor sum_abs = cpu->empty({m_max, n}, DType::kF32),
           sum_sub = cpu->empty({m_max, n}, DType::kF32);
    cpu->linear(abs_x, abs_w, nullptr, sum_abs);
    cpu->linear(grp, abs_w, nullptr, sum_sub);

    Tensor wq = gpu.upload(w.q, DType::kFP8E4M3)
                    .with_block_scales(gpu.upload(padded_scales(w.scale, k), DType::kF32));
    for (int64_t m : ms) {
      Tensor xd = gpu.upload(x.slice_rows(0, m), DType::kBF16);
      Tensor yd = gpu.empty({m, n}, DType::kBF16);
      gpu.linear(xd, wq, nullptr, yd);
      Tensor y = gpu.download(yd);
      double err2 = 0, ref2 = 0, worst = 0;  // worst: max of |err| / bound
      int64_t over = 0;
      for (int64_t i = 0; i < m * n; ++i) {
        const double r = ref.f32()[i], e = std::fabs(static_cast<double>(y.f32()[i]) - r);
        const double bound = std::ldexp(sum_abs.f32()[i], -4) + std::ldexp(sum_sub.f32()[i], -10) +
                             std::ldexp(std::fabs(r), -8) + 1e-6;
        err2 += e * e;
        ref2 += r * r;
        worst = std::max(worst, e / bound);
        if (e > bound) ++over;
      }
      const double nerr = std::sqrt(err2 / std::max(ref2, 1e-30));
      std::printf(
          "[fp8] test m=%lld n=%lld k=%lld norm_err=%.4f worst_err_over_bound=%.3f over=%lld\n",
          static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k), nerr,
          worst, static_cast<long long>(over));
      std::fflush(stdout);
      EXPECT_EQ(over, 0) << "m " << m << " n " << n << " k " << k;
      EXPECT_LE(nerr, 0.05) << "m " << m << " n " << n << " k " << k;
    }
  }
}

TEST(CudaFp8Linear, RejectsIneligibleShapes) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << "CUDA FP8 test skipped: " << why;
  cuda::CudaBackend gpu;
  EXPECT_FALSE(gpu.supports_fp8_block_linear(96, 256));
  EXPECT_FALSE(gpu.supports_fp8_block_linear(256, 96));
  EXPECT_TRUE(gpu.supports_fp8_block_linear(256, 7168));
}

// deepseek_v3 "small" with FP8 linears (make-model, into a temp dir): on the CUDA backend o_proj,
// the dense MLP's gate_up and down run as block-scaled FP8 GEMMs; the other linears (row counts
// not multiples of 128) and the experts are dequantized to bf16 at load. Two CPU references:
//  - the CPU backend (dequantized weights, fp32 activations) — the "CPU and GPU agree":
//    tolerance 0.15 of max|ref| on the last-prompt logits. The activation quantization alone moves
//    this model's logits by 0.062 (emulated on the CPU, test_fp8_loader), bf16 activations by up to
//    0.03 (test_cuda_golden's tolerance); 0.15 leaves room for their interaction.
//  - the CPU backend with the CUDA path's activation quantization emulated (fp8_cpu_backend.h):
//    only bf16 effects remain (bf16 activations, and the e4m3 roundings they flip): tolerance 0.06.
//    A wrong scale layout or operand mapping gives errors of order 1 against either.
// Greedy tokens are reported; the first one must agree when the reference's top-2 margin is far
// above the logit error.
TEST(CudaFp8Model, DeepseekV3SmallFp8MatchesCpu) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << "CUDA FP8 model test skipped: " << why;
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("di_fp8_model_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  model::MakeModelOptions o;
  o.arch = "deepseek_v3";
  o.preset = "small";
  o.out_dir = dir;
  o.seed = 5;
  o.fp8 = true;
  o.progress = false;
  model::make_model(o);
  auto cpu = make_cpu_backend();
  testing::Fp8CpuBackend emu(true, true);
  auto gpu = make_backend("cuda");
  auto cpu_model = load_model(dir.string(), *cpu);
  auto emu_model = load_model(dir.string(), emu);
  auto gpu_model = load_model(dir.string(), *gpu);
  std::vector<GenerateRequest> reqs(2);
  reqs[0].prompt = {1, 17, 300, 5, 42, 1000, 7, 99, 3};
  reqs[1].prompt = {2, 2040, 64, 128, 900};
  for (auto& r : reqs) r.max_tokens = 6;
  GeneratorOptions opts;
  opts.block_size = 16;
  Generator cg(*cpu_model, *cpu, opts), eg(*emu_model, emu, opts), gg(*gpu_model, *gpu, opts);
  const auto got = gg.generate(reqs);
  const std::vector<std::pair<const char*, std::vector<GenerateResult>>> refs{
      {"cpu", cg.generate(reqs)}, {"cpu+emulated-act-quant", eg.generate(reqs)}};
  EXPECT_GT(emu.fp8_calls, 0);
  for (const auto& [what, ref] : refs) {
    const double tol = std::string(what) == "cpu" ? 0.15 : 0.06;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const double err =
          testing::max_rel_error(ref[i].last_prompt_logits, got[i].last_prompt_logits);
      std::vector<float> l = ref[i].last_prompt_logits;
      std::partial_sort(l.begin(), l.begin() + 2, l.end(), std::greater<float>());
      float max_abs = 0;
      for (float v : ref[i].last_prompt_logits) max_abs = std::max(max_abs, std::fabs(v));
      size_t same = 0;
      while (same < ref[i].output.size() && same < got[i].output.size() &&
             ref[i].output[same] == got[i].output[same])
        ++same;
      std::printf(
          "[fp8] model deepseek_v3-small-fp8 vs %s prompt %zu: logits max_rel_err=%.3e "
          "(tol %.2f) greedy %zu/%zu tokens agree%s\n",
          what, i, err, tol, same, ref[i].output.size(),
          same == ref[i].output.size() ? "" : " (flip)");
      std::fflush(stdout);
      EXPECT_LE(err, tol) << what << " prompt " << i;
      if ((l[0] - l[1]) > 4.0 * err * max_abs) {
        EXPECT_GE(same, 1u) << what << " prompt " << i << ": first greedy token differs although "
                            << "the margin " << (l[0] - l[1]) << " is far above the logit error";
      }
    }
  }
  cpu_model.reset();
  emu_model.reset();
  gpu_model.reset();
  fs::remove_all(dir);
}
#endif

}  // namespace
}  // namespace di
