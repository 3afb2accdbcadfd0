// Block-scaled FP8 linear on the CUDA backend (issue #6): DeepSeek FP8 weights stay e4m3 with
// their 128x128 f32 scales; activations are quantized per 1x128 group on the fly
// (kernels/fp8_quant.cu); one cuBLASLt matmul does the block-scaled GEMM with fp32 accumulation
// and writes bf16.
//
// Operand mapping (cuBLAS is column-major). Row-major y[m, n] = x[m, k] · w[n, k]ᵀ is computed as
// the column-major D[n, m] = op(A)[n, k] · B[k, m] with
//   A = w: the bytes of row-major [n, k] are column-major [k, n], lda = k, TRANSA = T
//          → A_SCALE_MODE = BLK128x128_32F, A scales = the checkpoint's scale_inv, row-major
//            [n/128][L4] with L4 = round_up(k/128, 4) (offset nb * L4 + kb): cuBLASLt reads the
//            k-blocks of a 128-row block contiguously, in groups padded to 4 floats (16 bytes).
//            The loader stores them that way (Tensor::block_scales, fp8_block_scale_cols).
//   B = quantized x: row-major [m, k] = column-major [k, m], ldb = k, TRANSB = N
//          → B_SCALE_MODE = VEC128_32F, B scales outer-dim-major [k/128][m] (offset kb * m + r)
//   D = y: column-major [n, m], ldd = n = row-major y [m, n]
// (the scale layouts of cuBLAS's "scaling factors layouts" section, as PyTorch's _scaled_mm
// uses them for DeepSeek-style 1x128 x 128x128 scaling). The "TN" form is the one FP8 GEMMs
// support on Hopper.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/fp8_quant.h"

namespace di::cuda {
namespace {

constexpr int64_t kFp8Block = 128;
// What the FP8 path requires of k (the 128x128 weight scales need whole blocks). Should shapes
// with k/128 not a multiple of 4 misbehave on some cuBLASLt version, raise this to 512: every k
// of DeepSeek-V3 (7168, 1536, 512, 2048, 16384, 18432) is a multiple of 512 anyway, and other
// weights then dequantize at load as before.
constexpr int64_t kFp8KAlign = 128;
// Rows of the activations per GEMM are padded to a multiple of this (1 = no padding; the padded
// rows, q = 0 and scale 1, are computed into a scratch buffer and dropped).
constexpr int64_t kFp8RowPad = 1;
constexpr int64_t kFp8RowPadRetry = 16;  // when cuBLASLt has no algorithm for the unpadded m
// cuBLASLt shares the backend's cuBLAS workspace (32 MiB, cuda_backend.cpp; same stream, so
// never concurrently) and may use up to this much of it: no allocation here, so the first FP8
// GEMM may happen inside a CUDA graph capture.
constexpr size_t kLtWorkspaceBytes = size_t{16} << 20;

template <typename T>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const T& v) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof(v)));
}

}  // namespace

struct CudaBackend::Fp8Plans {
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;  // false: cuBLASLt offered no algorithm for this shape (cached too)
  };
  cublasLtHandle_t lt = nullptr;
  std::map<std::tuple<int64_t, int64_t, int64_t>, Plan> plans;  // (m_pad, n, k), failures too

  Fp8Plans() { CUBLAS_CHECK(cublasLtCreate(&lt)); }
  ~Fp8Plans() {
    for (auto& [key, p] : plans) {
      if (p.d) cublasLtMatrixLayoutDestroy(p.d);
      if (p.b) cublasLtMatrixLayoutDestroy(p.b);
      if (p.a) cublasLtMatrixLayoutDestroy(p.a);
      if (p.op) cublasLtMatmulDescDestroy(p.op);
    }
    if (lt) cublasLtDestroy(lt);
  }
  Fp8Plans(const Fp8Plans&) = delete;
  Fp8Plans& operator=(const Fp8Plans&) = delete;

  // The descriptors and the heuristic's algorithm for one shape, created on first use; null when
  // cuBLASLt has no algorithm for it. The scale pointers are set on every call (they differ per
  // weight and per activation buffer).
  Plan* get(int64_t m_pad, int64_t n, int64_t k, const void* a_scale, const void* b_scale) {
    const auto key = std::make_tuple(m_pad, n, k);
    auto it = plans.find(key);
    if (it != plans.end()) {
      if (!it->second.ok) return nullptr;
      set_attr(it->second.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale);
      set_attr(it->second.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale);
      return &it->second;
    }
    Plan p;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    set_attr(p.op, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
    set_attr(p.op, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
    set_attr(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
             static_cast<int32_t>(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F));
    set_attr(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
             static_cast<int32_t>(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F));
    set_attr(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale);
    set_attr(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale);
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, static_cast<uint64_t>(k),
                                            static_cast<uint64_t>(n), k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, static_cast<uint64_t>(k),
                                            static_cast<uint64_t>(m_pad), k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_16BF, static_cast<uint64_t>(n),
                                            static_cast<uint64_t>(m_pad), n));
    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kLtWorkspaceBytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    p.ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (p.ok) {
      p.algo = result.algo;
    } else {
      last_error = cublasGetStatusName(st);
      cublasLtMatrixLayoutDestroy(p.d);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatmulDescDestroy(p.op);
      p = Plan{};
    }
    Plan& stored = plans.emplace(key, p).first->second;
    return stored.ok ? &stored : nullptr;
  }
  const char* last_error = "";
};

bool CudaBackend::supports_fp8_block_linear(int64_t n, int64_t k) const {
  return !f32_ && n > 0 && k > 0 && n % kFp8Block == 0 && k % kFp8KAlign == 0 && k % kFp8Block == 0;
}

void CudaBackend::linear_fp8(const Tensor& x, const Tensor& w, Tensor& y) {
  DI_CHECK(x.device() == Device::kCUDA && x.dtype() == DType::kBF16,
           "cuda linear (fp8): x must be a CUDA bf16 tensor, got {}", x.describe());
  DI_CHECK(w.device() == Device::kCUDA && w.dim() == 2 && w.block_scales() != nullptr,
           "cuda linear (fp8): weight {} must be a 2-d CUDA fp8_e4m3 tensor with block scales",
           w.describe());
  DI_CHECK(y.device() == Device::kCUDA && y.dtype() == DType::kBF16,
           "cuda linear (fp8): y must be a CUDA bf16 tensor, got {} (an FP8 weight cannot feed an "
           "f32 output)",
           y.describe());
  const int64_t n = w.size(0), k = w.size(1);
  const int64_t m = x.numel() / std::max<int64_t>(k, 1);
  DI_CHECK(supports_fp8_block_linear(n, k),
           "cuda linear (fp8): weight {} is not [n, k] with n, k "
           "multiples of 128",
           w.describe());
  DI_CHECK(x.size(-1) == k, "cuda linear (fp8): x {} does not match weight {}", x.describe(),
           w.describe());
  DI_CHECK(y.numel() == m * n, "cuda linear (fp8): y {} is not [{}, {}]", y.describe(), m, n);
  const Tensor& ws = *w.block_scales();
  DI_CHECK(ws.device() == Device::kCUDA && ws.dtype() == DType::kF32 && ws.dim() == 2 &&
               ws.size(0) == n / kFp8Block && ws.size(1) == fp8_block_scale_cols(k),
           "cuda linear (fp8): block scales {} for weight {} (want f32 [{}, {}] on the device)",
           ws.describe(), w.describe(), n / kFp8Block, fp8_block_scale_cols(k));
  if (m == 0) return;
  // Rows as given; should cuBLASLt offer no algorithm for that m (small or odd counts), padded to
  // a multiple of 16 (the buffers are sized for that from the start, so the plan lookup can use
  // the real scale pointers).
  const int64_t m_first = (m + kFp8RowPad - 1) / kFp8RowPad * kFp8RowPad;
  const int64_t m_second = (m + kFp8RowPadRetry - 1) / kFp8RowPadRetry * kFp8RowPadRetry;
  const int64_t m_alloc = std::max(m_first, m_second);
  Tensor xq = empty({m_alloc, k}, DType::kFP8E4M3);
  Tensor xs = empty({k / kFp8Block, m_alloc}, DType::kF32);
  if (!fp8_plans_) fp8_plans_ = std::make_shared<Fp8Plans>();
  int64_t m_pad = m_first;
  Fp8Plans::Plan* plan = fp8_plans_->get(m_pad, n, k, ws.raw(), xs.raw());
  if (plan == nullptr && m_second != m_first) {
    m_pad = m_second;
    plan = fp8_plans_->get(m_pad, n, k, ws.raw(), xs.raw());
  }
  DI_CHECK(plan != nullptr,
           "cuda linear (fp8): cuBLASLt has no block-scaled FP8 algorithm for m {} (also tried "
           "{}), n {}, k {}: {}",
           m_first, m_second, n, k, fp8_plans_->last_error);
  launch_fp8_quant_1x128(
      Fp8QuantParams{static_cast<const __nv_bfloat16*>(x.raw()), static_cast<uint8_t*>(xq.raw()),
                     static_cast<float*>(xs.raw()), m, m_pad, static_cast<int32_t>(k)},
      stream_);
  CUDA_CHECK_LAUNCH("fp8_quant_1x128");
  Tensor scratch;
  void* d = y.raw();
  // Padded rows, or a y view that is not 16-byte aligned (cuBLASLt's FP8 kernels want aligned
  // pointers): compute into a scratch buffer and copy the m real rows out.
  const bool via_scratch = m_pad != m || reinterpret_cast<uintptr_t>(y.raw()) % 16 != 0;
  if (via_scratch) {
    scratch = empty({m_pad, n}, DType::kBF16);
    d = scratch.raw();
  }
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(fp8_plans_->lt, plan->op, &alpha, w.raw(), plan->a, xq.raw(), plan->b,
                              &beta, d, plan->d, d, plan->d, &plan->algo, cublas_workspace_,
                              kLtWorkspaceBytes, stream_));
  if (via_scratch) {
    // Row-major: the first m rows of [m_pad, n] are one contiguous prefix.
    CUDA_CHECK(cudaMemcpyAsync(y.raw(), d, static_cast<size_t>(m * n) * 2, cudaMemcpyDeviceToDevice,
                               stream_));
  }
}

}  // namespace di::cuda
