#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/attention.h"
#include "backend/cuda/kernels/attention_prefill_mma.h"
#include "backend/cuda/kernels/attention_prefill_wgmma.h"
#include "backend/cuda/kernels/decode_fused.h"
#include "backend/cuda/kernels/elementwise.h"
#include "backend/cuda/kernels/gemv.h"
#include "backend/cuda/kernels/head_linear.h"
#include "backend/cuda/kernels/mla_decode.h"
#include "backend/cuda/kernels/mla_decode_cluster.h"
#include "backend/cuda/kernels/mla_decode_wide.h"
#include "backend/cuda/kernels/moe.h"
#include "backend/cuda/kernels/moe_grouped.h"
#include "backend/cuda/kernels/moe_stats.h"
#include "core/env.h"
#include "core/error.h"

namespace di {
namespace cuda {
namespace {

using bf16_t = __nv_bfloat16;

constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
// Rows up to which linear / fused_linear take the small-M GEMV kernel (kernels/gemv.h): one.
// H200 A/B (docs/performance.md, 2026-11-29 evening): at 2-4 rows cuBLAS + separate elementwise
// kernels win (Llama-3.1-8B batch 2 / 4: 384 / 757 tok/s vs 346 / 464 with the GEMV).
constexpr int32_t kDefaultGemvMaxRows = 1;
// Arrival counters of the MLA cluster decode kernels (sized when the GQA fused attention, removed
// in run 46, took one per (sequence, kv head)): 64 KiB; more grows the buffer outside graph
// capture.
constexpr int64_t kInitialAttentionCounters = 16384;

void check_dev(const Tensor& t, DType dtype, const char* op, const char* what) {
  DI_CHECK(t.device() == Device::kCUDA && t.dtype() == dtype,
           "cuda {}: '{}' must be a CUDA {} tensor, got {} on {}", op, what, dtype_name(dtype),
           t.describe(), t.device() == Device::kCUDA ? "cuda" : "cpu");
}

void check_dev_any(const Tensor& t, const char* op, const char* what) {
  DI_CHECK(t.device() == Device::kCUDA, "cuda {}: '{}' must be on the CUDA device, got {} on cpu",
           op, what, t.describe());
}

int32_t elem_size_of(const Tensor& t, const char* op) {
  const size_t s = dtype_size(t.dtype());
  DI_CHECK(s == 2 || s == 4, "cuda {}: unsupported dtype {}", op, dtype_name(t.dtype()));
  return static_cast<int32_t>(s);
}

// Whether a tensor's data starts on a 16-byte boundary (the kernels' vector loads).
bool aligned16(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0;
}

// The split-KV partials in one workspace (split_combine.cuh): o [parts, rows, dv] f32 from
// partial_o, then the (max, sum) pairs [parts, rows, 2]; returns where the pairs start.
float* partial_ml_of(float* partial_o, size_t parts, size_t rows, size_t dv) {
  return partial_o + parts * rows * dv;
}

int64_t rows_of(const Tensor& t) {
  return t.size(-1) > 0 ? t.numel() / t.size(-1) : 0;
}

template <typename T>
const T* cptr(const Tensor& t) {
  return static_cast<const T*>(t.raw());
}
template <typename T>
T* mptr(const Tensor& t) {
  return static_cast<T*>(t.raw());
}

// The router kernels' parameters (kernels/moe.h) for t tokens of `logits`.
MoeRouteParams route_kernel_params(const MoeRoutingParams& r, const float* logits, int64_t t,
                                   Tensor& topk_ids, Tensor& topk_weights, const float* bias) {
  return MoeRouteParams{logits,
                        bias,
                        mptr<int32_t>(topk_ids),
                        mptr<float>(topk_weights),
                        t,
                        r.num_experts,
                        r.top_k,
                        r.num_groups,
                        r.topk_groups,
                        r.scoring == MoeRoutingParams::Scoring::kSigmoid,
                        r.group_score == MoeRoutingParams::GroupScore::kTopTwoSum,
                        r.renormalize,
                        r.renorm_eps,
                        r.scaling,
                        moe_route_on_logits(r)};
}

}  // namespace

bool cuda_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

int64_t CudaBackend::available_memory_bytes() const {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  // The allocator's cached blocks count too: it frees them and retries when cudaMalloc fails.
  return static_cast<int64_t>(free + allocator_.bytes_cached());
}

CudaBackend::CudaBackend(DType compute) : dt_(compute), f32_(compute == DType::kF32) {
  DI_CHECK(compute == DType::kBF16 || compute == DType::kF32,
           "cuda backend: compute dtype must be bf16 or f32, got {}", dtype_name(compute));
  DI_CHECK(cuda_available(), "cuda backend: no CUDA device is available");
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasCreate(&cublas_));
  CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  // An explicit workspace keeps cuBLAS from allocating inside CUDA graph capture.
  CUDA_CHECK(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes));
  CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes));
  // fp32 mode: true fp32 GEMMs, no TF32 or other reduced-precision shortcuts.
  if (f32_) CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_PEDANTIC_MATH));
  int dev = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  max_smem_optin_ = static_cast<size_t>(optin);
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, dev));
  // The A/B switches of this backend's own paths (core/env.h declares their values).
  gemv_max_rows_ =
      std::clamp(di::env::get_int("DEEPINFER_GEMV_MAX_ROWS", kDefaultGemvMaxRows), 0, kGemvMaxRows);
  if (di::env::get("DEEPINFER_ATTN_PREFILL") != nullptr) {  // wgmma | mma | simt
    attention_prefill_mma_ = !di::env::is("DEEPINFER_ATTN_PREFILL", "simt");
    attention_prefill_wgmma_ = di::env::is("DEEPINFER_ATTN_PREFILL", "wgmma");
  }
  attention_mma_warps_ = di::env::get_int("DEEPINFER_ATTN_MMA_WARPS", 4);    // 4 | 8
  attention_mma_mtiles_ = di::env::get_int("DEEPINFER_ATTN_MMA_MTILES", 1);  // 1 | 2
  // Sized up front so that a decode graph captured later never needs to grow it.
  reserve_attention_counters(kInitialAttentionCounters);
  CUDA_CHECK(cudaMalloc(&moe_route_counter_, sizeof(unsigned)));
  CUDA_CHECK(cudaMemsetAsync(moe_route_counter_, 0, sizeof(unsigned), stream_));
  CUDA_CHECK(
      cudaMalloc(&moe_route_logits_, sizeof(float) * kNormRouteMaxTokens * kMaxRouterExperts));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  host_cache_.clear();
  sampler_.reset();
  if (cublas_) cublasDestroy(cublas_);
  if (cublas_workspace_) cudaFree(cublas_workspace_);
  for (const CounterBuffer& c : retired_attention_counters_) cudaFree(c.words);
  if (attention_counters_) cudaFree(attention_counters_);
  if (moe_route_counter_) cudaFree(moe_route_counter_);
  if (moe_route_logits_) cudaFree(moe_route_logits_);
  if (stream_) cudaStreamDestroy(stream_);
}

Tensor CudaBackend::empty(const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  void* ptr = nullptr;
  std::shared_ptr<void> owner = allocator_.allocate(bytes, &ptr);
  return Tensor::view_of(ptr, shape, dtype, std::move(owner), Device::kCUDA);
}

Tensor CudaBackend::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  if (t.nbytes() > 0) CUDA_CHECK(cudaMemsetAsync(t.raw(), 0, t.nbytes(), stream_));
  return t;
}

Tensor CudaBackend::upload(const Tensor& host, DType dtype) {
  DI_CHECK(host.device() == Device::kCPU, "cuda upload: source {} is not a host tensor",
           host.describe());
  Tensor src = host;
  if (host.dtype() != dtype) {
    DI_CHECK(dtype != DType::kI32 && dtype != DType::kI64 && dtype != DType::kU8,
             "cuda upload: cannot convert {} to {}", host.describe(), dtype_name(dtype));
    src = host.to_f32().to(dtype);
  }
  Tensor dev = empty(host.shape(), dtype);
  // Pageable source: cudaMemcpyAsync returns once the bytes are staged, so `src` may go away.
  if (dev.nbytes() > 0)
    CUDA_CHECK(
        cudaMemcpyAsync(dev.raw(), src.raw(), dev.nbytes(), cudaMemcpyHostToDevice, stream_));
  return dev;
}

Tensor CudaBackend::download(const Tensor& t) {
  if (t.device() == Device::kCPU) {
    return t.dtype() == DType::kF32 || t.dtype() == DType::kI32 ? t.clone() : t.to_f32();
  }
  constexpr size_t kPinnedDownloadMin = size_t{256} << 10;
  Tensor host;
  if (pinned_download_ && t.nbytes() >= kPinnedDownloadMin) {
    void* ptr = nullptr;
    std::shared_ptr<void> owner = pinned_.allocate(t.nbytes(), &ptr);
    if (owner) host = Tensor::view_of(ptr, t.shape(), t.dtype(), std::move(owner), Device::kCPU);
  }
  if (host.is_null()) host = Tensor::empty(t.shape(), t.dtype());
  if (t.nbytes() > 0)
    CUDA_CHECK(cudaMemcpyAsync(host.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (t.dtype() == DType::kF32 || t.dtype() == DType::kI32) return host;
  return host.to_f32();
}

void CudaBackend::synchronize() {
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy_to_device(const Tensor& host, Tensor& dev) {
  DI_CHECK(host.device() == Device::kCPU && dev.device() == Device::kCUDA &&
               host.dtype() == dev.dtype() && host.nbytes() <= dev.nbytes(),
           "copy_to_device: {} into {}", host.describe(), dev.describe());
  if (host.nbytes() > 0)
    CUDA_CHECK(
        cudaMemcpyAsync(dev.raw(), host.raw(), host.nbytes(), cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::fill_random(Tensor& t, uint64_t seed, float scale) {
  check_dev(t, DType::kBF16, "fill_random", "t");
  launch_fill_random(FillRandomParams{mptr<bf16_t>(t), t.numel(), seed, scale}, stream_);
  CUDA_CHECK_LAUNCH("fill_random");
}

const float* CudaBackend::device_f32(const Tensor& t, const char* what) {
  DI_CHECK(t.dtype() == DType::kF32, "cuda: '{}' must be f32, got {}", what, t.describe());
  if (t.device() == Device::kCUDA) return cptr<float>(t);
  auto it = host_cache_.find(t.raw());
  if (it == host_cache_.end() || it->second.numel() != t.numel())
    it = host_cache_.insert_or_assign(t.raw(), upload(t, DType::kF32)).first;
  return cptr<float>(it->second);
}

void CudaBackend::embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  check_dev(ids, DType::kI32, "embedding", "ids");
  check_dev_any(table, "embedding", "table");
  check_dev(out, table.dtype(), "embedding", "out");
  const int64_t t = ids.numel(), h = table.size(-1);
  DI_CHECK(out.numel() == t * h, "cuda embedding: out {} does not hold {} rows of {}",
           out.describe(), t, h);
  launch_gather_rows(GatherRowsParams{table.raw(), cptr<int32_t>(ids), out.raw(), t,
                                      table.numel() / std::max<int64_t>(h, 1), h,
                                      elem_size_of(table, "embedding")},
                     stream_);
  CUDA_CHECK_LAUNCH("gather_rows");
}

void CudaBackend::gemm_bf16(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y,
                            int64_t ldy, bool y_f32, int64_t m, int64_t n, int64_t k) {
  if (m == 0 || n == 0) return;
  // Row-major y[m, n] = x[m, k] · w[n, k]ᵀ is column-major yᵀ[n, m] = wᵀ... i.e. C = op_T(W) · X.
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t in_t = f32_ ? CUDA_R_32F : CUDA_R_16BF;
  CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n),
                            static_cast<int>(m), static_cast<int>(k), &alpha, w, in_t,
                            static_cast<int>(ldw), x, in_t, static_cast<int>(ldx), &beta, y,
                            y_f32 ? CUDA_R_32F : in_t, static_cast<int>(ldy), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  if (w.dtype() == DType::kFP8E4M3) {  // block-scaled FP8 weight (cuda_fp8.cpp)
    linear_fp8(x, w, y);
    if (bias != nullptr) {
      const int64_t n = w.size(0), m = y.numel() / std::max<int64_t>(n, 1);
      check_dev(*bias, DType::kBF16, "linear", "bias");
      DI_CHECK(bias->numel() == n, "cuda linear: bias {} for {} outputs", bias->describe(), n);
      launch_bias_add(BiasAddParams{y.raw(), y.dtype() == DType::kF32, bias->raw(), m, n, false},
                      stream_);
      CUDA_CHECK_LAUNCH("bias_add");
    }
    return;
  }
  check_dev(x, dt_, "linear", "x");
  check_dev(w, dt_, "linear", "w");
  DI_CHECK(y.device() == Device::kCUDA && (y.dtype() == dt_ || y.dtype() == DType::kF32),
           "cuda linear: 'y' must be a CUDA {} or f32 tensor, got {}", dtype_name(dt_),
           y.describe());
  DI_CHECK(w.dim() == 2, "cuda linear: weight {} is not 2-d", w.describe());
  const int64_t k = w.size(1), n = w.size(0), m = x.numel() / std::max<int64_t>(k, 1);
  DI_CHECK(x.size(-1) == k, "cuda linear: x {} does not match weight {}", x.describe(),
           w.describe());
  DI_CHECK(y.numel() == m * n, "cuda linear: y {} is not [{}, {}]", y.describe(), m, n);
  const bool y_f32 = y.dtype() == DType::kF32;
  if (bias != nullptr) {  // checked before either path reads it
    check_dev(*bias, dt_, "linear", "bias");
    DI_CHECK(bias->numel() == n, "cuda linear: bias {} for {} outputs", bias->describe(), n);
  }
  FusedLinearParams fp;
  fp.x = &x;
  fp.w = &w;
  fp.bias = bias;
  fp.y = &y;
  if (try_gemv(fp)) return;  // a few bf16 rows (gemv_max_rows_); false otherwise
  gemm_bf16(x.raw(), k, w.raw(), k, y.raw(), n, y_f32, m, n, k);
  if (bias != nullptr) {
    launch_bias_add(BiasAddParams{y.raw(), y_f32, bias->raw(), m, n, f32_}, stream_);
    CUDA_CHECK_LAUNCH("bias_add");
  }
}

bool CudaBackend::try_gemv(const FusedLinearParams& p) {
  if (f32_ || p.w->dtype() != DType::kBF16 || p.w->dim() != 2) return false;
  const Tensor& x = *p.x;
  const int64_t k = p.w->size(1), n = p.w->size(0);
  const int64_t in_cols = p.in == FusedLinearParams::In::kSiluMul ? 2 * k : k;
  if (x.size(-1) != in_cols) return false;
  const int64_t m = x.numel() / std::max<int64_t>(in_cols, 1);
  if (m < 1 || m > gemv_max_rows_ || n > INT32_MAX || k > INT32_MAX) return false;
  GemvParams g;
  g.in = static_cast<GemvIn>(static_cast<int32_t>(p.in));
  g.x = x.raw();
  g.ldx = in_cols;
  g.norm_w = p.norm_w ? p.norm_w->raw() : nullptr;
  g.eps = p.eps;
  g.w = p.w->raw();
  g.bias = p.bias ? p.bias->raw() : nullptr;
  if (p.y != nullptr) {
    const int64_t y_cols = p.silu_out ? n / 2 : n;
    if (p.y->numel() != m * y_cols ||
        (p.y->dtype() != DType::kBF16 && p.y->dtype() != DType::kF32))
      return false;
    g.y = p.y->raw();
    g.ldy = y_cols;
    g.y_f32 = p.y->dtype() == DType::kF32;
  }
  g.silu_out = p.silu_out;
  if (p.residual != nullptr) {
    if (p.residual->numel() != m * n || p.residual->dtype() != DType::kBF16) return false;
    g.residual = p.residual->raw();
    g.ldr = n;
  }
  g.m = static_cast<int32_t>(m);
  g.n = static_cast<int32_t>(n);
  g.k = static_cast<int32_t>(k);
  if (!gemv_supported(g, static_cast<int64_t>(max_smem_optin_) - 1024)) return false;
  CUDA_CHECK(launch_gemv(g, num_sms_, stream_));
  CUDA_CHECK_LAUNCH("gemv");
  return true;
}

void CudaBackend::fused_linear(const FusedLinearParams& p) {
  DI_CHECK(p.x && p.w && (p.y || p.residual), "cuda fused_linear: missing x, w or an output");
  check_dev(*p.x, dt_, "fused_linear", "x");
  if (p.w->dtype() != DType::kFP8E4M3) check_dev(*p.w, dt_, "fused_linear", "w");
  if (p.norm_w) check_dev(*p.norm_w, dt_, "fused_linear", "norm_w");
  if (p.bias) check_dev(*p.bias, dt_, "fused_linear", "bias");
  if (p.residual) {
    check_dev(*p.residual, dt_, "fused_linear", "residual");
    DI_CHECK(p.residual->raw() != p.x->raw(), "cuda fused_linear: residual must not alias x");
  }
  if (try_gemv(p)) return;
  fused_linear_composed(*this, p);
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y) {
  check_dev(x, dt_, "rms_norm", "x");
  check_dev(w, dt_, "rms_norm", "w");
  check_dev(y, dt_, "rms_norm", "y");
  const int64_t d = x.size(-1);
  DI_CHECK(w.numel() == d && y.numel() == x.numel(), "cuda rms_norm: x {} w {} y {}", x.describe(),
           w.describe(), y.describe());
  launch_rms_norm(RmsNormParams{x.raw(), nullptr, w.raw(), y.raw(), rows_of(x),
                                static_cast<int32_t>(d), eps, f32_},
                  stream_);
  CUDA_CHECK_LAUNCH("rms_norm");
}

void CudaBackend::add_rms_norm(const Tensor& x, Tensor& residual, const Tensor& w, float eps,
                               Tensor& y) {
  check_dev(x, dt_, "add_rms_norm", "x");
  check_dev(residual, dt_, "add_rms_norm", "residual");
  check_dev(w, dt_, "add_rms_norm", "w");
  check_dev(y, dt_, "add_rms_norm", "y");
  const int64_t d = x.size(-1);
  DI_CHECK(w.numel() == d && y.numel() == x.numel() && residual.numel() == x.numel(),
           "cuda add_rms_norm: x {} residual {} w {} y {}", x.describe(), residual.describe(),
           w.describe(), y.describe());
  DI_CHECK(residual.raw() != x.raw() && residual.raw() != y.raw(),
           "cuda add_rms_norm: residual must not alias x or y");
  launch_rms_norm(RmsNormParams{x.raw(), residual.raw(), w.raw(), y.raw(), rows_of(x),
                                static_cast<int32_t>(d), eps, f32_},
                  stream_);
  CUDA_CHECK_LAUNCH("add_rms_norm");
}

void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  check_dev(a, dt_, "add", "a");
  check_dev(b, dt_, "add", "b");
  check_dev(out, dt_, "add", "out");
  DI_CHECK(a.numel() == b.numel() && out.numel() == a.numel(), "cuda add: {} + {} -> {}",
           a.describe(), b.describe(), out.describe());
  launch_add(AddParams{a.raw(), b.raw(), out.raw(), a.numel(), f32_}, stream_);
  CUDA_CHECK_LAUNCH("add");
}

void CudaBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  check_dev(gate_up, dt_, "silu_mul", "gate_up");
  check_dev(out, dt_, "silu_mul", "out");
  const int64_t two_i = gate_up.size(-1), inter = two_i / 2, rows = rows_of(gate_up);
  DI_CHECK(two_i % 2 == 0 && out.numel() == rows * inter, "cuda silu_mul: out {} for gate_up {}",
           out.describe(), gate_up.describe());
  launch_silu_mul(SiluMulParams{gate_up.raw(), out.raw(), rows, static_cast<int32_t>(inter), f32_},
                  stream_);
  CUDA_CHECK_LAUNCH("silu_mul");
}

void CudaBackend::rope(Tensor& x, int32_t rot_begin, int32_t rot_dim, const Tensor& positions,
                       const Tensor& cos_sin, bool interleaved) {
  check_dev(x, dt_, "rope", "x");
  check_dev(positions, DType::kI32, "rope", "positions");
  check_dev_any(cos_sin, "rope", "cos_sin");
  DI_CHECK(cos_sin.dtype() == DType::kF32 || cos_sin.dtype() == DType::kBF16,
           "cuda rope: cos_sin must be f32 or bf16, got {}", cos_sin.describe());
  DI_CHECK(x.dim() == 3, "cuda rope: x must be [T, heads, row], got {}", x.describe());
  const int64_t t = x.size(0);
  DI_CHECK(rot_dim % 2 == 0 && rot_begin >= 0 && rot_begin + rot_dim <= x.size(2) &&
               cos_sin.size(1) == rot_dim,
           "cuda rope: rot [{}, +{}) in rows of {} with cos_sin {}", rot_begin, rot_dim, x.size(2),
           cos_sin.describe());
  DI_CHECK(positions.numel() == t, "cuda rope: {} positions for {} tokens", positions.numel(), t);
  launch_rope(
      RopeParams{x.raw(), cptr<int32_t>(positions), cos_sin.raw(), cos_sin.dtype() == DType::kF32,
                 static_cast<int32_t>(cos_sin.size(0)), t, static_cast<int32_t>(x.size(1)),
                 static_cast<int32_t>(x.size(2)), rot_begin, rot_dim, interleaved, f32_},
      stream_);
  CUDA_CHECK_LAUNCH("rope");
}

void CudaBackend::copy_columns(const Tensor& src, int32_t col_begin, Tensor& dst) {
  check_dev_any(src, "copy_columns", "src");
  check_dev(dst, src.dtype(), "copy_columns", "dst");
  const int64_t c = src.size(-1), rows = rows_of(src), w = rows ? dst.numel() / rows : 0;
  DI_CHECK(col_begin >= 0 && col_begin + w <= c && w * rows == dst.numel(),
           "cuda copy_columns: {} [{}, +{}) -> {}", src.describe(), col_begin, w, dst.describe());
  launch_copy_2d(Copy2dParams{src.raw(), dst.raw(), rows, w, c, w, col_begin, 0,
                              elem_size_of(src, "copy_columns")},
                 stream_);
  CUDA_CHECK_LAUNCH("copy_columns");
}

void CudaBackend::write_columns(const Tensor& src, Tensor& dst, int32_t col_begin) {
  check_dev_any(dst, "write_columns", "dst");
  check_dev(src, dst.dtype(), "write_columns", "src");
  const int64_t c = dst.size(-1), rows = rows_of(dst), w = rows ? src.numel() / rows : 0;
  DI_CHECK(col_begin >= 0 && col_begin + w <= c && w * rows == src.numel(),
           "cuda write_columns: {} -> {} at {}", src.describe(), dst.describe(), col_begin);
  launch_copy_2d(Copy2dParams{src.raw(), dst.raw(), rows, w, w, c, 0, col_begin,
                              elem_size_of(dst, "write_columns")},
                 stream_);
  CUDA_CHECK_LAUNCH("write_columns");
}

void CudaBackend::store_kv(const Tensor& src, Tensor& pool, const KvLayout& layout, int32_t layer,
                           int32_t entry_offset, const PagedBatch& batch) {
  check_dev(src, dt_, "store_kv", "src");
  check_dev(pool, dt_, "store_kv", "pool");
  check_dev(batch.slot_mapping, DType::kI32, "store_kv", "slot_mapping");
  const int64_t t = batch.num_tokens, w = t ? src.numel() / t : 0;
  DI_CHECK(entry_offset >= 0 && entry_offset + w <= layout.entry_size,
           "cuda store_kv: [{}, +{}) beyond entry of {}", entry_offset, w, layout.entry_size);
  DI_CHECK(w * t == src.numel(), "cuda store_kv: {} for {} tokens", src.describe(), t);
  DI_CHECK(static_cast<size_t>(pool.numel()) >= layout.pool_elems() && layer >= 0 &&
               layer < layout.num_layers,
           "cuda store_kv: pool {} too small for layout ({} blocks x {} layers x {} x {}) or "
           "layer {}",
           pool.describe(), layout.num_blocks, layout.num_layers, layout.block_size,
           layout.entry_size, layer);
  launch_store_kv(StoreKvParams{src.raw(), pool.raw(), cptr<int32_t>(batch.slot_mapping), t,
                                static_cast<int32_t>(w), layout.block_size, layout.entry_size,
                                layout.block_stride(), layout.layer_offset(layer), entry_offset,
                                layout.num_blocks, f32_},
                  stream_);
  CUDA_CHECK_LAUNCH("store_kv");
}

void CudaBackend::copy_blocks(Tensor& pool, const KvLayout& layout,
                              std::span<const std::pair<int32_t, int32_t>> src_dst) {
  check_dev(pool, dt_, "copy_blocks", "pool");
  DI_CHECK(static_cast<size_t>(pool.numel()) >= layout.pool_elems(),
           "cuda copy_blocks: pool {} too small for {} blocks of {} elements", pool.describe(),
           layout.num_blocks, layout.block_stride());
  // One device-to-device copy per block, in order, on the stream: a V2-Lite block is ~2 MiB
  // (~1 us at 4.3 TB/s), and a step copies at most n - 1 blocks per forking group.
  const size_t bytes = static_cast<size_t>(layout.block_stride()) * dtype_size(pool.dtype());
  auto* base = static_cast<char*>(pool.raw());
  for (const auto& [src, dst] : src_dst) {
    DI_CHECK(
        src >= 0 && src < layout.num_blocks && dst >= 0 && dst < layout.num_blocks && src != dst,
        "cuda copy_blocks: block {} -> {} in a pool of {}", src, dst, layout.num_blocks);
    CUDA_CHECK(cudaMemcpyAsync(base + static_cast<size_t>(dst) * bytes,
                               base + static_cast<size_t>(src) * bytes, bytes,
                               cudaMemcpyDeviceToDevice, stream_));
  }
}

namespace {

// The MLA decode kernels' common conditions: one latent head, K = V = the entry start, dv < dqk,
// few new tokens per sequence, a split query (q_rope) readable in 16-byte chunks, 16-byte
// aligned q / pool. False: the generic kernel runs.
bool mla_decode_call_ok(const PagedAttentionParams& p) {
  const PagedBatch& b = *p.batch;
  const int32_t dr = p.q_rope != nullptr ? static_cast<int32_t>(p.q_rope->size(-1)) : 0;
  const bool q_parts_ok =
      p.q_rope == nullptr || (dr % 8 == 0 && (p.head_dim_qk - dr) % 8 == 0 && aligned16(*p.q_rope));
  return q_parts_ok && b.num_tokens <= 8 * b.num_seqs &&
         mla_decode_supported(p.num_kv_heads, p.k_offset, p.v_offset, p.head_dim_qk, p.head_dim_v,
                              p.layout.entry_size) &&
         aligned16(*p.q) && aligned16(*p.pool) &&
         reinterpret_cast<uintptr_t>(p.out->raw()) % 4 == 0;
}

// The fields both MLA decode kernels read (MlaDecodeCall): the query parts, the output, the pool
// layout, the batch.
void fill_mla_call(MlaDecodeCall& k, const PagedAttentionParams& p) {
  const PagedBatch& b = *p.batch;
  const int32_t dr = p.q_rope != nullptr ? static_cast<int32_t>(p.q_rope->size(-1)) : 0;
  k.q = cptr<bf16_t>(*p.q);
  k.q_rope = p.q_rope != nullptr ? cptr<bf16_t>(*p.q_rope) : nullptr;
  k.dq = p.head_dim_qk - dr;
  k.out = mptr<bf16_t>(*p.out);
  k.pool = cptr<bf16_t>(*p.pool);
  k.block_stride = p.layout.block_stride();
  k.layer_offset = p.layout.layer_offset(p.layer);
  k.block_size = p.layout.block_size;
  k.entry_size = p.layout.entry_size;
  k.num_heads = p.num_q_heads;
  k.dqk = p.head_dim_qk;
  k.dv = p.head_dim_v;
  k.scale = p.scale;
  k.positions = cptr<int32_t>(b.positions);
  k.qo_indptr = cptr<int32_t>(b.qo_indptr);
  k.kv_indptr = cptr<int32_t>(b.kv_indptr);
  k.kv_indices = cptr<int32_t>(b.kv_indices);
  k.kv_last_len = cptr<int32_t>(b.kv_last_len);
  k.num_seqs = b.num_seqs;
  k.num_tokens = b.num_tokens;
}

// MLA decode on the tile kernel of kernels/mla_decode.cu (DEEPINFER_MLA_KERNEL=tile); false
// when the call is not of its shape. num_sms sizes the head groups (DEEPINFER_MLA_HEAD_SPLIT,
// mla_decode.h).
bool run_mla_decode(CudaBackend& be, size_t max_smem, int32_t num_sms,
                    const PagedAttentionParams& p, int32_t max_kv) {
  const PagedBatch& b = *p.batch;
  const int64_t t = b.num_tokens;
  if (!mla_decode_call_ok(p)) return false;
  const MlaDecodePlan plan =
      plan_mla_decode(b.num_seqs, b.num_tokens, max_kv, p.num_q_heads, p.head_dim_v, num_sms);
  const size_t smem = mla_decode_smem_bytes(plan.rows_per_tile, p.head_dim_qk);
  DI_CHECK(smem <= max_smem, "cuda mla_decode: needs {} B of shared memory, the device allows {}",
           smem, max_smem);
  const size_t indptr_padded = ((static_cast<size_t>(b.num_seqs) + 1) * 4 + 255) & ~size_t{255};
  Tensor ws = be.empty({static_cast<int64_t>(indptr_padded + plan.partial_bytes)}, DType::kU8);
  char* base = mptr<char>(ws);
  MlaDecodeParams k{};
  fill_mla_call(k, p);
  k.rows_per_tile = plan.rows_per_tile;
  k.head_groups = plan.head_groups;
  k.max_tiles = plan.max_tiles;
  k.tile_indptr = reinterpret_cast<int32_t*>(base);
  k.split_size = plan.split_size;
  k.num_splits = plan.num_splits;
  if (plan.num_splits > 1) {
    const size_t rows = static_cast<size_t>(t) * p.num_q_heads;
    k.partial_o = reinterpret_cast<float*>(base + indptr_padded);
    k.partial_ml = partial_ml_of(k.partial_o, static_cast<size_t>(plan.num_splits), rows,
                                 static_cast<size_t>(p.head_dim_v));
  }
  launch_mla_decode(k, be.stream());
  CUDA_CHECK_LAUNCH("mla_decode");
  return true;
}

// Attention with a split query (PagedAttentionParams::q_rope) on a kernel that reads one query
// tensor: the concatenation [q | q_rope] in a temporary (two column writes), then the usual path.
void paged_attention_concat_q(CudaBackend& be, const PagedAttentionParams& p) {
  const int64_t t = p.batch->num_tokens, dq = p.head_dim_qk - p.q_rope->size(-1);
  Tensor q = be.empty({t, p.num_q_heads, p.head_dim_qk}, p.q->dtype());
  Tensor rows = q.reshape({t * p.num_q_heads, p.head_dim_qk});
  be.write_columns(*p.q, rows, 0);
  be.write_columns(*p.q_rope, rows, static_cast<int32_t>(dq));
  PagedAttentionParams whole = p;
  whole.q = &q;
  whole.q_rope = nullptr;
  be.paged_attention(whole);
}

// The shape, dtype and layout checks of paged_attention (also run by the fused op).
void check_paged_attention(const PagedAttentionParams& p, DType dt) {
  DI_CHECK(p.q && p.out && p.pool && p.batch, "cuda paged_attention: missing q/out/pool/batch");
  check_dev(*p.q, dt, "paged_attention", "q");
  check_dev(*p.out, dt, "paged_attention", "out");
  check_dev(*p.pool, dt, "paged_attention", "pool");
  const PagedBatch& b = *p.batch;
  for (const Tensor* t : {&b.positions, &b.qo_indptr, &b.kv_indptr, &b.kv_indices, &b.kv_last_len})
    check_dev(*t, DType::kI32, "paged_attention", "batch metadata");
  DI_CHECK(p.num_kv_heads > 0 && p.num_q_heads % p.num_kv_heads == 0,
           "cuda paged_attention: {} q heads over {} kv heads", p.num_q_heads, p.num_kv_heads);
  DI_CHECK(p.head_dim_qk % 2 == 0 && p.head_dim_v % 2 == 0 && p.k_offset % 2 == 0 &&
               p.v_offset % 2 == 0 && p.kv_head_stride % 2 == 0 && p.layout.entry_size % 2 == 0,
           "cuda paged_attention: dims and offsets must be even (4-byte loads): head_dim_qk {} "
           "head_dim_v {} k_offset {} v_offset {} kv_head_stride {} entry_size {}",
           p.head_dim_qk, p.head_dim_v, p.k_offset, p.v_offset, p.kv_head_stride,
           p.layout.entry_size);
  const int64_t t = b.num_tokens;
  const int64_t dr = p.q_rope != nullptr ? p.q_rope->size(-1) : 0;  // split query (backend.h)
  if (p.q_rope != nullptr) {
    check_dev(*p.q_rope, dt, "paged_attention", "q_rope");
    DI_CHECK(dr > 0 && dr < p.head_dim_qk && p.q_rope->numel() == t * p.num_q_heads * dr,
             "cuda paged_attention: q_rope {} for {} tokens x {} heads (head_dim_qk {})",
             p.q_rope->describe(), t, p.num_q_heads, p.head_dim_qk);
  }
  DI_CHECK(p.q->numel() == t * p.num_q_heads * (p.head_dim_qk - dr) &&
               p.out->numel() == t * p.num_q_heads * p.head_dim_v,
           "cuda paged_attention: q {} / out {} for {} tokens x {} heads x ({}, {})",
           p.q->describe(), p.out->describe(), t, p.num_q_heads, p.head_dim_qk - dr, p.head_dim_v);
}

// The kernel params of a paged_attention call, without the plan and its workspace.
PagedAttentionKernelParams attention_kernel_params(const PagedAttentionParams& p, bool f32) {
  const PagedBatch& b = *p.batch;
  PagedAttentionKernelParams k{};
  if (f32) {  // the fp32 verification mode: the f32 pointers select the float kernels
    k.q_f32 = cptr<float>(*p.q);
    k.out_f32 = mptr<float>(*p.out);
    k.pool_f32 = cptr<float>(*p.pool);
  } else {
    k.q = cptr<bf16_t>(*p.q);
    k.out = mptr<bf16_t>(*p.out);
    k.pool = cptr<bf16_t>(*p.pool);
  }
  k.block_stride = p.layout.block_stride();
  k.layer_offset = p.layout.layer_offset(p.layer);
  k.block_size = p.layout.block_size;
  k.entry_size = p.layout.entry_size;
  k.k_offset = p.k_offset;
  k.v_offset = p.v_offset;
  k.kv_head_stride = p.kv_head_stride;
  k.num_q_heads = p.num_q_heads;
  k.num_kv_heads = p.num_kv_heads;
  k.head_dim_qk = p.head_dim_qk;
  k.head_dim_v = p.head_dim_v;
  k.scale = p.scale;
  k.positions = cptr<int32_t>(b.positions);
  k.qo_indptr = cptr<int32_t>(b.qo_indptr);
  k.kv_indptr = cptr<int32_t>(b.kv_indptr);
  k.kv_indices = cptr<int32_t>(b.kv_indices);
  k.kv_last_len = cptr<int32_t>(b.kv_last_len);
  k.num_seqs = b.num_seqs;
  k.num_tokens = b.num_tokens;
  return k;
}

// The shape, dtype and layout checks of qkv_rope_store (also run by the fused op).
void check_qkv_rope_store(const QkvRopeStoreParams& p, DType dt) {
  DI_CHECK(p.qkv && p.q_out && p.pool && p.cos_sin && p.batch,
           "cuda qkv_rope_store: missing qkv/q_out/pool/cos_sin/batch");
  const PagedBatch& b = *p.batch;
  check_dev(*p.qkv, dt, "qkv_rope_store", "qkv");
  check_dev(*p.q_out, dt, "qkv_rope_store", "q_out");
  check_dev(*p.pool, dt, "qkv_rope_store", "pool");
  check_dev(b.positions, DType::kI32, "qkv_rope_store", "positions");
  check_dev(b.slot_mapping, DType::kI32, "qkv_rope_store", "slot_mapping");
  check_dev_any(*p.cos_sin, "qkv_rope_store", "cos_sin");
  DI_CHECK(p.cos_sin->dtype() == DType::kF32 || p.cos_sin->dtype() == DType::kBF16,
           "cuda qkv_rope_store: cos_sin must be f32 or bf16, got {}", p.cos_sin->describe());
  DI_CHECK((p.q_norm == nullptr) == (p.k_norm == nullptr),
           "cuda qkv_rope_store: q_norm and k_norm come together");
  const int64_t t = b.num_tokens, d = p.head_dim, hq = p.num_q_heads, hkv = p.num_kv_heads;
  DI_CHECK(hq > 0 && hkv > 0 && d > 0 && d % 2 == 0 && d <= kMaxFusedHeadDim,
           "cuda qkv_rope_store: {} q heads, {} kv heads, head_dim {} (even, <= {})", hq, hkv, d,
           kMaxFusedHeadDim);
  DI_CHECK(p.qkv->numel() == t * (hq + 2 * hkv) * d && p.q_out->numel() == t * hq * d,
           "cuda qkv_rope_store: qkv {} / q_out {} for {} tokens x ({} + 2 x {}) heads x {}",
           p.qkv->describe(), p.q_out->describe(), t, hq, hkv, d);
  DI_CHECK(b.positions.numel() >= t && b.slot_mapping.numel() >= t,
           "cuda qkv_rope_store: {} positions / {} slots for {} tokens", b.positions.numel(),
           b.slot_mapping.numel(), t);
  DI_CHECK(p.cos_sin->dim() == 2 && p.cos_sin->size(1) == d,
           "cuda qkv_rope_store: cos_sin {} for head_dim {}", p.cos_sin->describe(), d);
  DI_CHECK(p.layout.entry_size == 2 * hkv * d && p.layer >= 0 && p.layer < p.layout.num_layers &&
               static_cast<size_t>(p.pool->numel()) >= p.layout.pool_elems(),
           "cuda qkv_rope_store: pool {} / entry {} / layer {} of {} for {} kv heads x {}",
           p.pool->describe(), p.layout.entry_size, p.layer, p.layout.num_layers, hkv, d);
  for (const Tensor* n : {p.q_norm, p.k_norm}) {
    if (n == nullptr) continue;
    check_dev(*n, dt, "qkv_rope_store", "q_norm/k_norm");
    DI_CHECK(n->numel() == d, "cuda qkv_rope_store: norm {} for head_dim {}", n->describe(), d);
  }
}

// The fields the rope + KV-store kernels share (QkvRopeStoreKernelParams,
// MlaRopeStoreKernelParams): the rope table, the batch's positions and slots, the pool layout.
template <typename K>
void fill_kv_write(K& k, const PagedBatch& b, const Tensor& cos_sin, const KvLayout& layout,
                   int32_t layer) {
  k.cos_sin = cos_sin.raw();
  k.cos_sin_f32 = cos_sin.dtype() == DType::kF32;
  k.max_pos = static_cast<int32_t>(cos_sin.size(0));
  k.positions = cptr<int32_t>(b.positions);
  k.slot_mapping = cptr<int32_t>(b.slot_mapping);
  k.tokens = b.num_tokens;
  k.block_size = layout.block_size;
  k.entry_size = layout.entry_size;
  k.block_stride = layout.block_stride();
  k.layer_offset = layout.layer_offset(layer);
  k.num_blocks = layout.num_blocks;
}

QkvRopeStoreKernelParams store_kernel_params(const QkvRopeStoreParams& p, bool f32) {
  const PagedBatch& b = *p.batch;
  QkvRopeStoreKernelParams k{};
  k.qkv = p.qkv->raw();
  k.q_out = p.q_out->raw();
  k.pool = p.pool->raw();
  k.q_norm = p.q_norm ? p.q_norm->raw() : nullptr;
  k.k_norm = p.k_norm ? p.k_norm->raw() : nullptr;
  fill_kv_write(k, b, *p.cos_sin, p.layout, p.layer);
  k.num_q_heads = p.num_q_heads;
  k.num_kv_heads = p.num_kv_heads;
  k.head_dim = p.head_dim;
  k.eps = p.eps;
  k.f32 = f32;
  return k;
}

// head_linear_small's parameters for x [t, heads, k] contiguous (x null: the merge kernel stages
// its own rows), w [heads, n, k], y [t, heads, n].
HeadLinearParams contiguous_head_linear(const void* x, const Tensor& w, Tensor& y, int64_t t,
                                        int64_t heads, int64_t k, int64_t n) {
  return HeadLinearParams{x,
                          w.raw(),
                          y.raw(),
                          static_cast<int32_t>(t),
                          static_cast<int32_t>(heads),
                          static_cast<int32_t>(k),
                          static_cast<int32_t>(n),
                          heads * k,
                          k};
}

// Whether the cluster kernel takes this call (either mode).
bool mla_cluster_call_ok(const PagedAttentionParams& p) {
  return mla_decode_call_ok(p) &&
         mla_cluster_decode_supported(p.num_kv_heads, p.k_offset, p.v_offset, p.head_dim_qk,
                                      p.head_dim_v, p.layout.entry_size, p.batch->num_tokens);
}

// The cluster kernel's call and plan fields (the partials and timing are the caller's).
MlaClusterDecodeParams mla_cluster_params(const PagedAttentionParams& p,
                                          const MlaClusterDecodePlan& plan, uint32_t* counters) {
  MlaClusterDecodeParams k{};
  fill_mla_call(k, p);
  k.rows_per_tile = plan.rows_per_tile;
  k.head_tiles = plan.head_tiles;
  k.split_size = plan.split_size;
  k.long_split_size = plan.long_split_size;
  k.long_split_from = plan.long_split_from;
  k.num_clusters = plan.num_clusters;
  k.counters = counters;
  return k;
}

}  // namespace

bool CudaBackend::try_mla_cluster_decode(const PagedAttentionParams& p, int32_t max_kv) {
  const PagedBatch& b = *p.batch;
  if (!mla_cluster_call_ok(p)) return false;
  const MlaClusterDecodePlan plan =
      plan_mla_cluster_decode(b.num_tokens, max_kv, p.num_q_heads, p.head_dim_qk, p.head_dim_v);
  DI_CHECK(plan.smem_bytes <= max_smem_optin_,
           "cuda mla_cluster_decode: needs {} B of shared memory, the device allows {}",
           plan.smem_bytes, max_smem_optin_);
  // Counters are sized up front for 2048 decode tokens x 1 head tile; more grows the buffer
  // outside a capture, or (inside one) the tile kernel runs this call.
  if (!reserve_attention_counters(plan.num_counters)) return false;
  MlaClusterDecodeParams k = mla_cluster_params(p, plan, attention_counters_);
  Tensor ws;  // the clusters' partial states; none with one cluster
  if (plan.num_clusters > 1) {
    ws = empty({static_cast<int64_t>(plan.partial_bytes)}, DType::kU8);
    const size_t rows = static_cast<size_t>(b.num_tokens) * p.num_q_heads;
    k.partial_o = mptr<float>(ws);
    k.partial_ml = partial_ml_of(k.partial_o, static_cast<size_t>(plan.num_clusters), rows,
                                 static_cast<size_t>(p.head_dim_v));
  }
  if (mla_timing_ != nullptr &&
      int64_t{8} * plan.num_clusters * plan.head_tiles * b.num_tokens <= mla_timing_ctas_ / 2)
    k.timing = mla_timing_;
  CUDA_CHECK(launch_mla_cluster_decode(k, stream_));
  CUDA_CHECK_LAUNCH("mla_cluster_decode");
  ++mla_cluster_calls_;
  return true;
}

// Batch-1 MLA decode with W_UV (paged_attention's head_w): the cluster kernel writes every
// split's partial state (no cluster barrier, DSMEM merge, vote or last merge: ~9 us of its ~16
// per V2-Lite layer at ctx 2048, run 22 call 2 phase timing) and mla_merge_uv merges them
// while it applies W_UV. One token only (the merge copies a row's parts per token), outside
// DEEPINFER_BATCH_INVARIANT=1 (its merge order differs from the cluster kernel's, so batch 1 and
// batch 2 differ in the last bits), up to kMlaMergeMaxParts splits (ctx 32K at 64 entries per
// split).
bool CudaBackend::try_mla_deferred_decode(const PagedAttentionParams& p, int32_t max_kv) {
  static const bool env_on = !di::env::is("DEEPINFER_MLA_DEFER", "0");
  const bool on = mla_defer_override_ >= 0 ? mla_defer_override_ != 0 : env_on;
  const PagedBatch& b = *p.batch;
  const MlaDecodeKernel mk = mla_decode_kernel_;
  if (!on || f32_ || b.num_tokens != 1 || !mla_cluster_batch_split() ||
      (mk != MlaDecodeKernel::kAuto && mk != MlaDecodeKernel::kCluster) || !mla_cluster_call_ok(p))
    return false;
  const Tensor& w = *p.head_w;
  const int64_t heads = p.num_q_heads, dv = p.head_dim_v;
  if (w.dim() != 3 || w.size(0) != heads || w.size(2) != dv || w.dtype() != dt_ || !aligned16(w) ||
      p.head_out->numel() != heads * w.size(1) || p.head_out->dtype() != dt_)
    return false;
  const int64_t n = w.size(1);
  const MlaClusterDecodePlan plan =
      plan_mla_cluster_decode(1, max_kv, p.num_q_heads, p.head_dim_qk, p.head_dim_v, true);
  if (!mla_merge_uv_supported(1, heads, dv, n, plan.num_splits) ||
      static_cast<size_t>(mla_merge_uv_smem(1, static_cast<int32_t>(dv), static_cast<int32_t>(n),
                                            plan.num_splits)) >
          max_smem_optin_ ||
      plan.smem_bytes > max_smem_optin_)
    return false;
  Tensor ws = empty({static_cast<int64_t>(plan.partial_bytes)}, DType::kU8);
  MlaClusterDecodeParams k = mla_cluster_params(p, plan, attention_counters_);  // not touched
  k.defer = mla_merge_uv_defer_layout(1, dv, n, plan.num_splits);
  k.num_splits = plan.num_splits;
  k.partial_o = mptr<float>(ws);
  k.partial_ml = partial_ml_of(k.partial_o, static_cast<size_t>(plan.num_splits),
                               static_cast<size_t>(heads), static_cast<size_t>(dv));
  if (mla_timing_ != nullptr && int64_t{plan.num_splits} * plan.head_tiles <= mla_timing_ctas_ / 2)
    k.timing = mla_timing_;
  CUDA_CHECK(launch_mla_cluster_decode(k, stream_));
  CUDA_CHECK_LAUNCH("mla_cluster_decode (deferred)");
  MlaMergeUvParams mu{};
  mu.attn = k;
  mu.uv = contiguous_head_linear(nullptr, w, *p.head_out, 1, heads, dv, n);
  // The merge's CTAs record in the timing buffer's second half (bench_cuda_model --mla-timing).
  const int64_t merge_ctas = mla_merge_uv_ctas(1, heads, dv, n, plan.num_splits);
  if (k.timing != nullptr &&
      merge_ctas * kMlaMergeTimingSlots <= mla_timing_ctas_ / 2 * kMlaTimingSlots)
    mu.timing = mla_timing_ + mla_timing_ctas_ / 2 * kMlaTimingSlots;
  CUDA_CHECK(launch_mla_merge_uv(mu, stream_));
  CUDA_CHECK_LAUNCH("mla_merge_uv");
  ++mla_cluster_calls_;
  ++mla_deferred_calls_;
  return true;
}

bool CudaBackend::try_mla_wide_decode(const PagedAttentionParams& p, int32_t max_kv) {
  const PagedBatch& b = *p.batch;
  if (!mla_decode_call_ok(p) ||
      !mla_wide_decode_supported(p.num_kv_heads, p.k_offset, p.v_offset, p.head_dim_qk,
                                 p.head_dim_v, p.layout.entry_size) ||
      p.num_q_heads > 16 * 65535)
    return false;
  const MlaWideDecodePlan plan = plan_mla_wide_decode(b.num_tokens, max_kv, p.num_q_heads,
                                                      p.head_dim_qk, p.head_dim_v, num_sms_);
  if (plan.smem_bytes > max_smem_optin_ || plan.num_splits > 65535) return false;
  // Counters as the cluster kernel's (the two never run at once on this stream).
  if (!reserve_attention_counters(plan.num_counters)) return false;
  MlaWideDecodeParams k{};
  fill_mla_call(k, p);
  k.warps = plan.warps;
  k.head_tiles = plan.head_tiles;
  k.split_size = plan.split_size;
  k.num_splits = plan.num_splits;
  k.counters = attention_counters_;
  Tensor ws;  // the splits' partial states; none with one split
  if (plan.num_splits > 1) {
    ws = empty({static_cast<int64_t>(plan.partial_bytes)}, DType::kU8);
    const size_t rows = static_cast<size_t>(b.num_tokens) * p.num_q_heads;
    k.partial_o = mptr<float>(ws);
    k.partial_ml = partial_ml_of(k.partial_o, static_cast<size_t>(plan.num_splits), rows,
                                 static_cast<size_t>(p.head_dim_v));
  }
  CUDA_CHECK(launch_mla_wide_decode(k, stream_));
  CUDA_CHECK_LAUNCH("mla_wide_decode");
  ++mla_wide_calls_;
  return true;
}

void CudaBackend::paged_attention(const PagedAttentionParams& p) {
  check_paged_attention(p, dt_);
  const PagedBatch& b = *p.batch;
  const int64_t t = b.num_tokens;
  const int32_t max_kv = attention_max_kv_override_ > 0 ? attention_max_kv_override_ : b.max_kv_len;
  if (p.head_w != nullptr) {  // attention, then the per-head projection (backend.h)
    DI_CHECK(p.head_out != nullptr, "cuda paged_attention: head_w without head_out");
    if (t > 0 && b.num_seqs > 0 && try_mla_deferred_decode(p, max_kv)) return;
    paged_attention_head_composed(*this, p);
    return;
  }
  if (t == 0 || b.num_seqs == 0) return;
  // MLA decode: kernels/mla_decode_wide.cu for batches, mla_decode_cluster.cu below them (or as
  // set_mla_decode_kernel says), else mla_decode.cu.
  const MlaDecodeKernel mk = mla_decode_kernel_;
  const bool wide =
      mk == MlaDecodeKernel::kWide ||
      (mk == MlaDecodeKernel::kAuto && t >= mla_wide_min_tokens() && mla_cluster_batch_split());
  if (!f32_ && wide && try_mla_wide_decode(p, max_kv)) return;
  const bool cluster = mk == MlaDecodeKernel::kCluster || mk == MlaDecodeKernel::kAuto ||
                       mk == MlaDecodeKernel::kWide;  // also what the wide kernel declines
  if (!f32_ && cluster && try_mla_cluster_decode(p, max_kv))
    return;
  if (!f32_ && mla_decode_kernel_ != MlaDecodeKernel::kGeneric &&
      run_mla_decode(*this, max_smem_optin_, num_sms_, p, max_kv))
    return;
  if (p.q_rope != nullptr) {  // only the MLA decode kernel reads a split query
    paged_attention_concat_q(*this, p);
    return;
  }
  const AttentionPlan plan = plan_paged_attention(b.num_seqs, b.num_tokens, max_kv, p.num_q_heads,
                                                  p.num_kv_heads, p.head_dim_qk, p.head_dim_v);
  const bool v_in_k = p.v_offset == p.k_offset && p.head_dim_v <= p.head_dim_qk;
  const size_t smem = paged_attention_smem_bytes(plan.rows_per_tile, p.head_dim_qk, p.head_dim_v,
                                                 v_in_k, f32_ ? 4 : 2);
  DI_CHECK(smem <= max_smem_optin_,
           "cuda paged_attention: no kernel for head_dim_qk {} / head_dim_v {}: needs {} B of "
           "shared memory, the device allows {}",
           p.head_dim_qk, p.head_dim_v, smem, max_smem_optin_);
  // Workspace: the tile prefix, then (several splits) the partial outputs and (max, sum) pairs.
  const size_t indptr_bytes = (static_cast<size_t>(b.num_seqs) + 1) * 4;
  const size_t indptr_padded = (indptr_bytes + 255) & ~size_t{255};
  Tensor ws = empty({static_cast<int64_t>(indptr_padded + plan.partial_bytes)}, DType::kU8);
  char* base = mptr<char>(ws);
  PagedAttentionKernelParams k = attention_kernel_params(p, f32_);
  k.num_sms = num_sms_;
  k.rows_per_tile = plan.rows_per_tile;
  k.max_tiles = plan.max_tiles;
  k.tile_indptr = reinterpret_cast<int32_t*>(base);
  k.split_size = plan.split_size;
  k.num_splits = plan.num_splits;
  // Tensor-core prefill (attention_prefill_mma.cu) for prefill-heavy batches it supports; the
  // rule is prefill_mma_wanted / prefill_mma_supported in attention_prefill_mma_math.h.
  if (!f32_ && attention_prefill_mma_ &&
      prefill_mma_wanted(b.num_seqs, b.num_tokens, plan.num_splits) &&
      prefill_mma_supported(p.head_dim_qk, p.head_dim_v, p.k_offset, p.v_offset, p.kv_head_stride,
                            p.layout.entry_size) &&
      (reinterpret_cast<uintptr_t>(k.q) | reinterpret_cast<uintptr_t>(k.out) |
       reinterpret_cast<uintptr_t>(k.pool)) %
              16 ==
          0) {
    // Hopper warpgroup-MMA kernel (attention_prefill_wgmma.cu) where it applies, else mma.sync.
    const bool wgmma = attention_prefill_wgmma_ &&
                       prefill_wgmma_supported(p.head_dim_qk, p.head_dim_v, p.k_offset,
                                               p.v_offset, p.kv_head_stride, p.layout.entry_size);
    const int32_t group = p.num_q_heads / p.num_kv_heads;
    const int32_t rows =
        wgmma ? kPrefillWgmmaRows : prefill_mma_rows(attention_mma_warps_, attention_mma_mtiles_);
    const int64_t tiles = prefill_mma_max_tiles(b.num_seqs, b.num_tokens, group, rows);
    if (tiles <= 65535) {  // grid.y
      k.rows_per_tile = rows;
      k.max_tiles = static_cast<int32_t>(tiles);
      if (wgmma) {
        launch_paged_attention_prefill_wgmma(k, stream_);
        ++prefill_wgmma_calls_;
      } else {
        launch_paged_attention_prefill_mma(k, attention_mma_warps_, attention_mma_mtiles_, stream_);
      }
      CUDA_CHECK_LAUNCH("paged_attention (prefill mma)");
      return;
    }
  }
  if (plan.num_splits > 1) {
    const size_t rows = static_cast<size_t>(t) * p.num_q_heads;
    k.partial_o = reinterpret_cast<float*>(base + indptr_padded);
    k.partial_ml = partial_ml_of(k.partial_o, static_cast<size_t>(plan.num_splits), rows,
                                 static_cast<size_t>(p.head_dim_v));
  }
  launch_paged_attention(k, stream_);
  CUDA_CHECK_LAUNCH("paged_attention");
}

void CudaBackend::qkv_rope_store(const QkvRopeStoreParams& p) {
  check_qkv_rope_store(p, dt_);
  const int64_t t = p.batch->num_tokens;
  if (t == 0) return;
  const QkvRopeStoreKernelParams k = store_kernel_params(p, f32_);
  launch_qkv_rope_store(k, stream_);
  CUDA_CHECK_LAUNCH("qkv_rope_store");
}

void CudaBackend::qkv_rope_attention(const QkvRopeStoreParams& store,
                                     const PagedAttentionParams& attn) {
  qkv_rope_attention_composed(*this, store, attn);
}

bool CudaBackend::capturing() const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream_, &status));
  return status != cudaStreamCaptureStatusNone;
}

void CudaBackend::check_integrity() {
  DI_CHECK(!capturing(), "CudaBackend::check_integrity: the stream is capturing a graph");
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  DI_CHECK((attention_counters_ == nullptr) == (attention_counters_cap_ == 0),
           "CudaBackend: attention counters {} with capacity {}",
           static_cast<const void*>(attention_counters_), attention_counters_cap_);
  auto all_zero = [](const unsigned* dev, int64_t n, const char* what) {
    std::vector<unsigned> host(static_cast<size_t>(n));
    CUDA_CHECK(
        cudaMemcpy(host.data(), dev, host.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < n; ++i)
      DI_CHECK(host[i] == 0, "CudaBackend: {} [{}] is {} at rest (a kernel left it armed)", what, i,
               host[i]);
  };
  // The current buffer first (when there is one), then the outgrown ones.
  const std::vector<CounterBuffer> counters = attention_counter_buffers();
  for (size_t i = 0; i < counters.size(); ++i)
    all_zero(counters[i].words, counters[i].count,
             i == 0 && attention_counters_ != nullptr ? "attention arrival counter"
                                                      : "outgrown attention arrival counter");
  all_zero(moe_route_counter_, 1, "fused router arrival counter");
}

std::vector<CudaBackend::CounterBuffer> CudaBackend::attention_counter_buffers() const {
  std::vector<CounterBuffer> v;
  if (attention_counters_ != nullptr) v.push_back({attention_counters_, attention_counters_cap_});
  v.insert(v.end(), retired_attention_counters_.begin(), retired_attention_counters_.end());
  return v;
}

bool CudaBackend::reserve_attention_counters(int64_t n) {
  if (n <= attention_counters_cap_) return true;
  if (capturing()) return false;  // no allocation inside a capture
  // The old buffer stays allocated until the backend dies: a captured graph may still use it.
  if (attention_counters_ != nullptr)
    retired_attention_counters_.push_back({attention_counters_, attention_counters_cap_});
  const int64_t cap = std::max(n, 2 * attention_counters_cap_);
  void* ptr = nullptr;
  CUDA_CHECK(cudaMalloc(&ptr, static_cast<size_t>(cap) * sizeof(uint32_t)));
  CUDA_CHECK(cudaMemsetAsync(ptr, 0, static_cast<size_t>(cap) * sizeof(uint32_t), stream_));
  attention_counters_ = static_cast<uint32_t*>(ptr);
  attention_counters_cap_ = cap;
  return true;
}

void CudaBackend::mla_rope_store(const MlaRopeStoreParams& p) {
  DI_CHECK(p.q && p.kv_a && p.q_nope && p.q_pe && p.pool && p.kv_a_norm && p.cos_sin && p.batch,
           "cuda mla_rope_store: missing q/kv_a/q_nope/q_pe/pool/kv_a_norm/cos_sin/batch");
  const PagedBatch& b = *p.batch;
  check_dev(*p.q, dt_, "mla_rope_store", "q");
  check_dev(*p.kv_a, dt_, "mla_rope_store", "kv_a");
  check_dev(*p.q_nope, dt_, "mla_rope_store", "q_nope");
  check_dev(*p.q_pe, dt_, "mla_rope_store", "q_pe");
  check_dev(*p.pool, dt_, "mla_rope_store", "pool");
  check_dev(*p.kv_a_norm, dt_, "mla_rope_store", "kv_a_norm");
  check_dev(b.positions, DType::kI32, "mla_rope_store", "positions");
  check_dev(b.slot_mapping, DType::kI32, "mla_rope_store", "slot_mapping");
  check_dev_any(*p.cos_sin, "mla_rope_store", "cos_sin");
  DI_CHECK(p.cos_sin->dtype() == DType::kF32 || p.cos_sin->dtype() == DType::kBF16,
           "cuda mla_rope_store: cos_sin must be f32 or bf16, got {}", p.cos_sin->describe());
  const int64_t t = b.num_tokens, hq = p.num_heads, dn = p.nope_dim, dr = p.rope_dim,
                lat = p.latent_dim;
  DI_CHECK(hq > 0 && dn > 0 && dr > 0 && dr % 2 == 0 && lat > 0 &&
               p.q_nope->numel() == t * hq * dn && p.q_pe->numel() == t * hq * dr &&
               p.kv_a_norm->numel() == lat,
           "cuda mla_rope_store: {} heads x ({} + {}), latent {}: q_nope {} q_pe {} kv_a_norm {}",
           hq, dn, dr, lat, p.q_nope->describe(), p.q_pe->describe(), p.kv_a_norm->describe());
  DI_CHECK(p.cos_sin->dim() == 2 && p.cos_sin->size(1) == dr,
           "cuda mla_rope_store: cos_sin {} for rope_dim {}", p.cos_sin->describe(), dr);
  DI_CHECK(lat + dr <= p.layout.entry_size && p.layer >= 0 && p.layer < p.layout.num_layers &&
               static_cast<size_t>(p.pool->numel()) >= p.layout.pool_elems(),
           "cuda mla_rope_store: pool {} / entry {} / layer {} of {} for latent {} + rope {}",
           p.pool->describe(), p.layout.entry_size, p.layer, p.layout.num_layers, lat, dr);
  DI_CHECK(b.positions.numel() >= t && b.slot_mapping.numel() >= t,
           "cuda mla_rope_store: {} positions / {} slots for {} tokens", b.positions.numel(),
           b.slot_mapping.numel(), t);
  if (t == 0) return;
  const int64_t q_ld = p.q->numel() / t, kv_ld = p.kv_a->numel() / t;
  DI_CHECK(q_ld * t == p.q->numel() && p.q_col >= 0 && p.q_col + hq * (dn + dr) <= q_ld &&
               kv_ld * t == p.kv_a->numel() && p.kv_col >= 0 && p.kv_col + lat + dr <= kv_ld,
           "cuda mla_rope_store: q {} (q part at {}, {} wide) / kv_a {} ([latent | k_pe] at {}, "
           "{} wide) for {} tokens",
           p.q->describe(), p.q_col, hq * (dn + dr), p.kv_a->describe(), p.kv_col, lat + dr, t);
  MlaRopeStoreKernelParams k{};
  k.q = p.q->raw();
  k.q_ld = q_ld;
  k.q_col = p.q_col;
  k.kv_a = p.kv_a->raw();
  k.kv_ld = kv_ld;
  k.kv_col = p.kv_col;
  k.q_nope = p.q_nope->raw();
  k.q_pe = p.q_pe->raw();
  k.pool = p.pool->raw();
  k.kv_a_norm = p.kv_a_norm->raw();
  fill_kv_write(k, b, *p.cos_sin, p.layout, p.layer);
  k.num_heads = p.num_heads;
  k.nope_dim = p.nope_dim;
  k.rope_dim = p.rope_dim;
  k.latent_dim = p.latent_dim;
  k.eps = p.eps;
  k.interleaved = p.interleaved;
  k.f32 = f32_;
  if (p.w_uk_t != nullptr) {
    DI_CHECK(p.q_lat != nullptr, "cuda mla_rope_store: w_uk_t without q_lat");
    check_dev(*p.w_uk_t, dt_, "mla_rope_store", "w_uk_t");
    check_dev(*p.q_lat, dt_, "mla_rope_store", "q_lat");
    DI_CHECK(p.w_uk_t->dim() == 3 && p.w_uk_t->size(0) == hq && p.w_uk_t->size(1) == lat &&
                 p.w_uk_t->size(2) == dn && p.q_lat->numel() == t * hq * lat,
             "cuda mla_rope_store: w_uk_t {} / q_lat {} for {} heads, latent {}, nope {}",
             p.w_uk_t->describe(), p.q_lat->describe(), hq, lat, dn);
    // One launch for both (kernels/decode_fused.h), unless off or DEEPINFER_HEAD_LINEAR=cublas
    // (whose A/B keeps W_UK on cuBLAS).
    static const bool kEnvOn = !di::env::is("DEEPINFER_MLA_FUSED_UK", "0") &&
                               !di::env::is("DEEPINFER_HEAD_LINEAR", "cublas");
    const bool on = mla_fused_uk_override_ >= 0 ? mla_fused_uk_override_ == 1 : kEnvOn;
    if (on && mla_rope_store_uk_supported(k, lat) &&
        reinterpret_cast<uintptr_t>(p.w_uk_t->raw()) % 16 == 0 &&
        reinterpret_cast<uintptr_t>(p.q_lat->raw()) % 4 == 0) {
      CUDA_CHECK(launch_mla_rope_store_uk(k, p.w_uk_t->raw(), p.q_lat->raw(),
                                          static_cast<int32_t>(lat), stream_));
      CUDA_CHECK_LAUNCH("mla_rope_store_uk");
      ++mla_fused_uk_calls_;
      return;
    }
  }
  launch_mla_rope_store(k, stream_);
  CUDA_CHECK_LAUNCH("mla_rope_store");
  if (p.w_uk_t != nullptr) head_linear(*p.q_nope, *p.w_uk_t, *p.q_lat);
}

void CudaBackend::head_linear(const Tensor& x, const Tensor& w, Tensor& y) {
  check_dev(x, dt_, "head_linear", "x");
  check_dev(w, dt_, "head_linear", "w");
  check_dev(y, dt_, "head_linear", "y");
  DI_CHECK(x.dim() == 3 && w.dim() == 3, "cuda head_linear: x {} w {}", x.describe(), w.describe());
  const int64_t t = x.size(0), heads = x.size(1), k = x.size(2), n = w.size(1);
  DI_CHECK(w.size(0) == heads && w.size(2) == k && y.numel() == t * heads * n,
           "cuda head_linear: x {} w {} y {}", x.describe(), w.describe(), y.describe());
  if (t == 0) return;
  // Few tokens (decode): kernels/head_linear.cu; DEEPINFER_HEAD_LINEAR=cublas keeps cuBLAS (A/B).
  static const bool kSmallOff = di::env::is("DEEPINFER_HEAD_LINEAR", "cublas");
  if (!f32_ && !kSmallOff && head_linear_small_supported(t, heads, k, n) &&
      static_cast<size_t>(head_linear_small_smem(static_cast<int32_t>(t),
                                                 static_cast<int32_t>(k))) <= max_smem_optin_) {
    CUDA_CHECK(launch_head_linear_small(contiguous_head_linear(x.raw(), w, y, t, heads, k, n),
                                        stream_));
    CUDA_CHECK_LAUNCH("head_linear_small");
    return;
  }
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t in_t = f32_ ? CUDA_R_32F : CUDA_R_16BF;
  // Per head h: y[:, h, :] (ld heads·n) = x[:, h, :] (ld heads·k) · w[h]ᵀ.
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(t),
      static_cast<int>(k), &alpha, w.raw(), in_t, static_cast<int>(k), n * k, x.raw(), in_t,
      static_cast<int>(heads * k), k, &beta, y.raw(), in_t, static_cast<int>(heads * n), n,
      static_cast<int>(heads), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::moe_route(const Tensor& logits, const MoeRoutingParams& p, Tensor& topk_ids,
                            Tensor& topk_weights) {
  check_dev(logits, DType::kF32, "moe_route", "logits");
  check_dev(topk_ids, DType::kI32, "moe_route", "topk_ids");
  check_dev(topk_weights, DType::kF32, "moe_route", "topk_weights");
  const int64_t t = logits.size(0), e = p.num_experts, k = p.top_k;
  DI_CHECK(logits.size(1) == e && p.num_groups > 0 && e % p.num_groups == 0 &&
               p.topk_groups <= p.num_groups && k <= e && k > 0,
           "cuda moe_route: logits {} with {} experts, {} groups (top {}), top-{}",
           logits.describe(), e, p.num_groups, p.topk_groups, k);
  DI_CHECK(e <= kMaxRouterExperts && p.num_groups <= kMaxRouterGroups,
           "cuda moe_route: {} experts / {} groups exceed the kernel's {} / {}", e, p.num_groups,
           kMaxRouterExperts, kMaxRouterGroups);
  DI_CHECK(topk_ids.numel() == t * k && topk_weights.numel() == t * k,
           "cuda moe_route: outputs {} / {} for {} tokens x top-{}", topk_ids.describe(),
           topk_weights.describe(), t, k);
  DI_CHECK(p.correction_bias == nullptr || p.correction_bias->numel() == e,
           "cuda moe_route: bias {} for {} experts", p.correction_bias->describe(), e);
  launch_moe_route(route_kernel_params(p, cptr<float>(logits), t, topk_ids, topk_weights,
                                       router_bias(p, "moe_route")),
                   stream_);
  CUDA_CHECK_LAUNCH("moe_route");
}

const float* CudaBackend::router_bias(const MoeRoutingParams& r, const char* op) {
  if (r.correction_bias == nullptr) return nullptr;
  if (r.correction_bias->device() == Device::kCPU &&
      !host_cache_.contains(r.correction_bias->raw())) {
    // The host bias is uploaded once, lazily; an upload cannot be captured in a CUDA graph.
    DI_CHECK(!capturing(),
             "cuda {}: the host correction bias is first used inside a CUDA graph capture; run "
             "one eager step (warm-up) before capturing",
             op);
  }
  return device_f32(*r.correction_bias, "correction_bias");
}

bool CudaBackend::moe_fused_enabled(bool route) const {
  // 0: neither, 1: both, 2: the router only, 3: the residual kernels only.
  static const int env = [] {
    constexpr const char* kName = "DEEPINFER_MOE_FUSED";
    if (di::env::is(kName, "0")) return 0;
    if (di::env::is(kName, "route")) return 2;
    if (di::env::is(kName, "residual")) return 3;
    return 1;
  }();
  const int mode = moe_fused_override_ >= 0 ? moe_fused_override_ : env;
  return mode == 1 || mode == (route ? 2 : 3);
}

void CudaBackend::moe_norm_route(const MoeNormRouteParams& p) {
  DI_CHECK(p.x && p.norm_w && p.gate && p.h && p.topk_ids && p.topk_weights,
           "cuda moe_norm_route: missing x, norm_w, gate or an output");
  const MoeRoutingParams& r = p.routing;
  const int64_t t = p.x->size(0), hidden = p.x->size(1), e = p.gate->size(0), k = r.top_k;
  const bool shapes_ok =
      !f32_ && p.x->dim() == 2 && p.x->dtype() == dt_ && p.norm_w->dtype() == dt_ &&
      p.gate->dtype() == dt_ && p.h->dtype() == dt_ && p.gate->dim() == 2 &&
      p.gate->size(1) == hidden && p.norm_w->numel() == hidden && p.h->numel() == t * hidden &&
      t >= 1 && t <= kNormRouteMaxTokens && t * hidden <= kNormRouteMaxElems && hidden % 8 == 0 &&
      (t == 1 || t * hidden <= moe_norm_route_max_elems_) && e == r.num_experts && e >= 1 &&
      e <= kMaxRouterExperts && k >= 1 && k <= 32 && k <= e && r.num_groups >= 1 &&
      r.num_groups <= kMaxRouterGroups && e % r.num_groups == 0 && r.topk_groups <= r.num_groups &&
      p.topk_ids->numel() == t * k && p.topk_weights->numel() == t * k &&
      p.topk_ids->dtype() == DType::kI32 && p.topk_weights->dtype() == DType::kF32 &&
      (p.logits == nullptr || (p.logits->numel() == t * e && p.logits->dtype() == DType::kF32)) &&
      // 16-byte vector accesses: x and h rows, gate rows, norm weights
      aligned16(*p.gate) && aligned16(*p.x) && aligned16(*p.h) && aligned16(*p.norm_w) &&
      (r.correction_bias == nullptr || r.correction_bias->numel() == e);
  if (!moe_fused_enabled(true) || !shapes_ok) {
    moe_norm_route_composed(*this, p);
    return;
  }
  for (const Tensor* d : {p.x, p.norm_w, p.gate, static_cast<const Tensor*>(p.h)})
    check_dev_any(*d, "moe_norm_route", "tensor");
  MoeNormRouteKernelParams q{};
  q.x = cptr<bf16_t>(*p.x);
  q.norm_w = cptr<bf16_t>(*p.norm_w);
  q.gate = cptr<bf16_t>(*p.gate);
  q.h = mptr<bf16_t>(*p.h);
  // Without a caller's logits tensor, the backend's own buffer: a scratch tensor freed here could
  // be handed to the next op (moe_residual's act) while this kernel still runs, and the shared
  // slots of the one-token gate_up kernel write act without waiting for the router.
  q.logits = p.logits != nullptr ? mptr<float>(*p.logits) : moe_route_logits_;
  q.counter = moe_route_counter_;
  q.route = route_kernel_params(r, q.logits, t, *p.topk_ids, *p.topk_weights,
                                router_bias(r, "moe_norm_route"));
  q.eps = p.eps;
  q.tokens = static_cast<int32_t>(t);
  q.hidden = static_cast<int32_t>(hidden);
  CUDA_CHECK(launch_moe_norm_route(q, stream_));
  CUDA_CHECK_LAUNCH("moe_norm_route");
  ++moe_fused_route_calls_;
}

bool CudaBackend::moe_t1_applies(const Tensor& x, const ExpertWeights& w, int64_t slots) const {
  const int64_t h = x.size(1), inter = w.gate_up.size(1) / 2;
  return x.size(0) == 1 && slots <= moe_device_max_slots_ && moe_t1_path_enabled() &&
         moe_decode_impl_from_env() != MoeDecodeImpl::kV1 && h % 8 == 0 && inter % 8 == 0 &&
         aligned16(x) && aligned16(w.gate_up) && aligned16(w.down);
}

void CudaBackend::moe_residual(const MoeResidualParams& p) {
  DI_CHECK(p.x && p.topk_ids && p.topk_weights && p.experts && p.residual,
           "cuda moe_residual: missing x, topk_ids, topk_weights, experts or residual");
  DI_CHECK((p.shared_gate_up == nullptr) == (p.shared_down == nullptr),
           "cuda moe_residual: the shared expert needs both gate_up and down");
  const ExpertWeights& w = *p.experts;
  const int64_t t = p.x->size(0), h = p.x->size(1),
                k = p.topk_ids->numel() / std::max<int64_t>(t, 1);
  const int64_t inter = w.gate_up.dim() == 3 ? w.gate_up.size(1) / 2 : 0;
  int64_t shared_slots = 0;
  bool shared_ok = true;
  if (p.shared_gate_up != nullptr) {
    const int64_t s_inter = p.shared_gate_up->size(0) / 2;
    shared_ok = inter > 0 && s_inter % inter == 0 && s_inter / inter <= 4 &&
                p.shared_gate_up->dtype() == dt_ && p.shared_down->dtype() == dt_ &&
                p.shared_gate_up->dim() == 2 && p.shared_gate_up->size(1) == h &&
                p.shared_down->dim() == 2 && p.shared_down->size(0) == h &&
                p.shared_down->size(1) == s_inter && aligned16(*p.shared_gate_up) &&
                aligned16(*p.shared_down);
    shared_slots = inter > 0 ? s_inter / inter : 0;
  }
  const bool ok = !f32_ && moe_fused_enabled(false) && shared_ok && p.x->dtype() == dt_ &&
                  p.residual->dtype() == dt_ && p.residual->numel() == h &&
                  w.gate_up.dtype() == dt_ && w.down.dtype() == dt_ && w.gate_up.dim() == 3 &&
                  w.gate_up.size(2) == h && w.down.dim() == 3 && w.down.size(1) == h &&
                  w.down.size(2) == inter && p.topk_ids->dtype() == DType::kI32 &&
                  p.topk_weights->dtype() == DType::kF32 && p.topk_weights->numel() == k &&
                  k >= 1 && w.gate_up.size(0) <= kMoeMaxExperts && moe_t1_applies(*p.x, w, k);
  if (!ok) {
    moe_residual_composed(*this, p);
    return;
  }
  Tensor act_t1 = empty({k + shared_slots, inter}, DType::kF32);
  MoeDecodeT1Params q{cptr<bf16_t>(*p.x),           cptr<bf16_t>(w.gate_up),
                      cptr<bf16_t>(w.down),         cptr<int32_t>(*p.topk_ids),
                      cptr<float>(*p.topk_weights), mptr<float>(act_t1),
                      mptr<bf16_t>(*p.residual),    static_cast<int32_t>(h),
                      static_cast<int32_t>(inter),  static_cast<int32_t>(w.gate_up.size(0)),
                      static_cast<int32_t>(k)};
  if (shared_slots > 0) {
    q.shared_gate_up = cptr<bf16_t>(*p.shared_gate_up);
    q.shared_down = cptr<bf16_t>(*p.shared_down);
    q.shared_slots = static_cast<int32_t>(shared_slots);
  }
  q.residual = cptr<bf16_t>(*p.residual);
  // The caller's norm: the shared slots recompute x from the residual and start during the
  // router (moe_grouped.h, shared_early).
  if (shared_slots > 0 && p.norm_w != nullptr && p.norm_w->dtype() == dt_ &&
      p.norm_w->numel() == h && aligned16(*p.norm_w)) {
    q.shared_early = true;
    q.norm_x = cptr<bf16_t>(*p.residual);
    q.norm_w = cptr<bf16_t>(*p.norm_w);
    q.eps = p.eps;
  }
  CUDA_CHECK(launch_moe_decode_t1(q, num_sms_, stream_));
  CUDA_CHECK_LAUNCH("moe_residual");
  ++moe_fused_residual_calls_;
}

void CudaBackend::moe_experts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                              const ExpertWeights& w, Tensor& out) {
  if (f32_) {  // the verification mode keeps the simple per-expert cuBLAS path (bf16 kernels below)
    moe_experts_f32(x, topk_ids, topk_weights, w, out);
    return;
  }
  check_dev(x, dt_, "moe_experts", "x");
  check_dev(topk_ids, DType::kI32, "moe_experts", "topk_ids");
  check_dev(topk_weights, DType::kF32, "moe_experts", "topk_weights");
  check_dev(w.gate_up, dt_, "moe_experts", "gate_up");
  check_dev(w.down, dt_, "moe_experts", "down");
  check_dev(out, dt_, "moe_experts", "out");
  const int64_t t = x.size(0), h = x.size(1), k = topk_ids.size(1);
  const int64_t num_experts = w.gate_up.size(0), two_i = w.gate_up.size(1), inter = two_i / 2;
  DI_CHECK(w.gate_up.size(2) == h && w.down.size(1) == h && w.down.size(2) == inter &&
               out.numel() == t * h && topk_ids.size(0) == t,
           "cuda moe_experts: x {} gate_up {} down {} out {} ids {}", x.describe(),
           w.gate_up.describe(), w.down.describe(), out.describe(), topk_ids.describe());
  if (t == 0) return;
  const int64_t slots = t * k;
  DI_CHECK(num_experts >= 1 && num_experts <= kMoeMaxExperts && slots < (int64_t{1} << 31) &&
               topk_weights.numel() == slots,
           "cuda moe_experts: {} experts (max {}), {} slots, weights {}", num_experts,
           kMoeMaxExperts, slots, topk_weights.describe());
  // One token (batch-1 decode), v2 kernels: no alignment, combine folded into down (moe_grouped.h).
  if (moe_t1_applies(x, w, slots)) {
    Tensor act_t1 = empty({k, inter}, DType::kF32);
    MoeDecodeT1Params q{cptr<bf16_t>(x),
                        cptr<bf16_t>(w.gate_up),
                        cptr<bf16_t>(w.down),
                        cptr<int32_t>(topk_ids),
                        cptr<float>(topk_weights),
                        mptr<float>(act_t1),
                        mptr<bf16_t>(out),
                        static_cast<int32_t>(h),
                        static_cast<int32_t>(inter),
                        static_cast<int32_t>(num_experts),
                        static_cast<int32_t>(k)};
    CUDA_CHECK(launch_moe_decode_t1(q, num_sms_, stream_));
    CUDA_CHECK_LAUNCH("moe_decode_t1");
    return;
  }
  // Device-side alignment (issue #6): rows grouped by expert ascending, slots ascending within an
  // expert. Every buffer is sized by the upper bound `slots`; nothing is read back here.
  const int64_t max_active = std::min(num_experts, slots);
  Tensor offsets = empty({num_experts + 1}, DType::kI32);
  Tensor active = empty({max_active + 1}, DType::kI32);  // [max_active] list, then the count
  Tensor row_token = empty({slots}, DType::kI32);
  Tensor slot_row = empty({slots}, DType::kI32);
  const bool vec_ok =
      h % 8 == 0 && inter % 8 == 0 && aligned16(x) && aligned16(w.gate_up) && aligned16(w.down);
  // Inside a CUDA graph capture the host read-back of the cuBLAS path is impossible: take the
  // decode kernels at any size then (correct for any rows per expert, just slower at large T).
  // Opt-in (env, moe_grouped.h): the grouped GEMM also for decode sizes at >= N rows per expert.
  const bool decode_range = slots <= moe_device_max_slots_ || (capturing() && !moe_grouped_gemm_);
  const int grouped_min_rows = moe_decode_grouped_min_rows();
  const bool decode_as_grouped =
      decode_range && grouped_min_rows > 0 && slots >= int64_t{grouped_min_rows} * num_experts;
  const bool decode = vec_ok && decode_range && !decode_as_grouped;
  const bool grouped = !decode && (moe_grouped_gemm_ || decode_as_grouped) && vec_ok;
  Tensor tile_start = grouped ? empty({num_experts + 1}, DType::kI32) : Tensor{};
  launch_moe_align(
      MoeAlignParams{cptr<int32_t>(topk_ids), slots, static_cast<int32_t>(k),
                     static_cast<int32_t>(num_experts), mptr<int32_t>(offsets),
                     mptr<int32_t>(active), mptr<int32_t>(active) + max_active,
                     mptr<int32_t>(row_token), mptr<int32_t>(slot_row), grouped ? kMoeGemmBM : 0,
                     grouped ? mptr<int32_t>(tile_start) : nullptr},
      stream_);
  CUDA_CHECK_LAUNCH("moe_align");
  Tensor y = empty({slots, h}, DType::kF32);  // expert output per row, f32
  if (grouped) {
    // Tensor-core grouped GEMMs on the device offsets: no host sync, capturable.
    const auto max_tiles = static_cast<int32_t>((slots + kMoeGemmBM - 1) / kMoeGemmBM + max_active);
    Tensor gu = empty({slots, two_i}, DType::kBF16);
    launch_moe_grouped_gemm(
        MoeGroupedGemmParams{cptr<bf16_t>(x), cptr<int32_t>(row_token), cptr<bf16_t>(w.gate_up),
                             cptr<int32_t>(offsets), cptr<int32_t>(tile_start), gu.raw(), false,
                             static_cast<int32_t>(two_i), static_cast<int32_t>(h),
                             static_cast<int32_t>(num_experts), max_tiles},
        stream_);
    CUDA_CHECK_LAUNCH("moe_grouped_gemm gate_up");
    Tensor act = empty({slots, inter}, DType::kBF16);
    silu_mul(gu, act);
    launch_moe_grouped_gemm(
        MoeGroupedGemmParams{cptr<bf16_t>(act), nullptr, cptr<bf16_t>(w.down),
                             cptr<int32_t>(offsets), cptr<int32_t>(tile_start), y.raw(), true,
                             static_cast<int32_t>(h), static_cast<int32_t>(inter),
                             static_cast<int32_t>(num_experts), max_tiles},
        stream_);
    CUDA_CHECK_LAUNCH("moe_grouped_gemm down");
  } else if (decode) {
    // Graph-capturable: grids from upper bounds, untouched experts never launched work.
    Tensor act_f32 = empty({slots, inter}, DType::kF32);
    launch_moe_decode(
        MoeDecodeParams{cptr<bf16_t>(x), cptr<bf16_t>(w.gate_up), cptr<bf16_t>(w.down),
                        cptr<int32_t>(offsets), cptr<int32_t>(active),
                        cptr<int32_t>(active) + max_active, cptr<int32_t>(row_token),
                        mptr<float>(act_f32), mptr<float>(y), static_cast<int32_t>(h),
                        static_cast<int32_t>(inter), static_cast<int32_t>(max_active),
                        static_cast<int32_t>(std::min(t, slots)),
                        static_cast<int32_t>((slots + max_active - 1) / max_active)},
        stream_);
    CUDA_CHECK_LAUNCH("moe_decode");
  } else {
    // Prefill: one read-back of the E + 1 offsets (a host sync), then cuBLAS per touched expert.
    Tensor off_host = download(offsets);
    const int32_t* off = off_host.data<int32_t>();
    if (off[num_experts] != slots) {  // skipped (negative) entries, or ids out of range
      Tensor ids_host = download(topk_ids);
      for (int64_t i = 0; i < slots; ++i) {
        const int32_t e = ids_host.data<int32_t>()[i];
        DI_CHECK(e < num_experts, "cuda moe_experts: expert id {} of {}", e, num_experts);
      }
    }
    Tensor xin = empty({slots, h}, DType::kBF16);
    if (off[num_experts] > 0) {  // the rows of skipped entries stay unused
      Tensor xin_used = xin.slice_rows(0, off[num_experts]);
      embedding(row_token.slice_rows(0, off[num_experts]), x, xin_used);
    }
    Tensor gu = empty({slots, two_i}, DType::kBF16);
    const size_t esz = 2;
    for (int64_t e = 0; e < num_experts; ++e) {
      const int64_t o = off[e], c = off[e + 1] - o;
      if (c == 0) continue;
      gemm_bf16(mptr<char>(xin) + o * h * esz, h, cptr<char>(w.gate_up) + e * two_i * h * esz, h,
                mptr<char>(gu) + o * two_i * esz, two_i, false, c, two_i, h);
    }
    Tensor act = empty({slots, inter}, DType::kBF16);
    silu_mul(gu, act);
    for (int64_t e = 0; e < num_experts; ++e) {
      const int64_t o = off[e], c = off[e + 1] - o;
      if (c == 0) continue;
      gemm_bf16(mptr<char>(act) + o * inter * esz, inter, cptr<char>(w.down) + e * h * inter * esz,
                inter, mptr<char>(y) + o * h * 4, h, true, c, h, inter);
    }
  }
  launch_moe_combine_f32(
      MoeCombineF32Params{cptr<float>(y), cptr<int32_t>(slot_row), cptr<float>(topk_weights),
                          mptr<bf16_t>(out), t, static_cast<int32_t>(k), static_cast<int32_t>(h)},
      stream_);
  CUDA_CHECK_LAUNCH("moe_combine");
}

// ---- EPLB ops (issue #8; kernels in kernels/moe_stats.cu, CPU reference in cpu_backend.cpp) ----

void CudaBackend::moe_count_experts(const Tensor& topk_ids, Tensor& counts) {
  check_dev(topk_ids, DType::kI32, "moe_count_experts", "topk_ids");
  check_dev(counts, DType::kI32, "moe_count_experts", "counts");
  DI_CHECK(counts.dim() == 1 && counts.size(0) > 0, "cuda moe_count_experts: counts {}",
           counts.describe());
  launch_moe_count_experts(MoeCountParams{cptr<int32_t>(topk_ids), mptr<int32_t>(counts),
                                          topk_ids.numel(), static_cast<int32_t>(counts.size(0))},
                           stream_);
  CUDA_CHECK(cudaGetLastError());
}

void CudaBackend::moe_map_replicas(const Tensor& topk_ids, const Tensor& replica_indptr,
                                   const Tensor& replica_slots, Tensor& phys_ids) {
  check_dev(topk_ids, DType::kI32, "moe_map_replicas", "topk_ids");
  check_dev(replica_indptr, DType::kI32, "moe_map_replicas", "replica_indptr");
  check_dev(replica_slots, DType::kI32, "moe_map_replicas", "replica_slots");
  check_dev(phys_ids, DType::kI32, "moe_map_replicas", "phys_ids");
  DI_CHECK(topk_ids.dim() == 2 && phys_ids.shape() == topk_ids.shape() &&
               replica_indptr.dim() == 1 && replica_indptr.size(0) >= 2 &&
               replica_slots.dim() == 1 &&
               (topk_ids.numel() == 0 || topk_ids.raw() != phys_ids.raw()),
           "cuda moe_map_replicas: ids {} indptr {} slots {} out {}", topk_ids.describe(),
           replica_indptr.describe(), replica_slots.describe(), phys_ids.describe());
  launch_moe_map_replicas(
      MoeMapReplicasParams{cptr<int32_t>(topk_ids), cptr<int32_t>(replica_indptr),
                           cptr<int32_t>(replica_slots), mptr<int32_t>(phys_ids), topk_ids.size(0),
                           static_cast<int32_t>(topk_ids.size(1)),
                           static_cast<int32_t>(replica_indptr.size(0) - 1),
                           static_cast<int32_t>(replica_slots.size(0))},
      stream_);
  CUDA_CHECK(cudaGetLastError());
}

void CudaBackend::copy_rows(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row,
                            int64_t rows) {
  check_dev_any(src, "copy_rows", "src");
  check_dev_any(dst, "copy_rows", "dst");
  DI_CHECK(src.dtype() == dst.dtype() && src.dim() >= 1 && dst.dim() >= 1 && src.size(0) > 0 &&
               dst.size(0) > 0 && src.numel() / src.size(0) == dst.numel() / dst.size(0),
           "cuda copy_rows: {} -> {}", src.describe(), dst.describe());
  DI_CHECK(rows >= 0 && src_row >= 0 && dst_row >= 0 && src_row + rows <= src.size(0) &&
               dst_row + rows <= dst.size(0),
           "cuda copy_rows: rows [{}, +{}) of {} -> [{}, +{}) of {}", src_row, rows, src.describe(),
           dst_row, rows, dst.describe());
  if (rows == 0) return;
  const size_t row_bytes = src.nbytes() / static_cast<size_t>(src.size(0));
  CUDA_CHECK(cudaMemcpyAsync(
      static_cast<char*>(dst.raw()) + static_cast<size_t>(dst_row) * row_bytes,
      static_cast<const char*>(src.raw()) + static_cast<size_t>(src_row) * row_bytes,
      static_cast<size_t>(rows) * row_bytes, cudaMemcpyDeviceToDevice, stream_));
}

// fp32 verification mode: routing read back to the host, then one fp32 cuBLAS GEMM per touched
// expert and an f32 combine — simple and exact in order, not graph-capturable (the mode is for
// checking kernels against the CPU, not for speed).
void CudaBackend::moe_experts_f32(const Tensor& x, const Tensor& topk_ids,
                                  const Tensor& topk_weights, const ExpertWeights& w, Tensor& out) {
  check_dev(x, dt_, "moe_experts", "x");
  check_dev(topk_ids, DType::kI32, "moe_experts", "topk_ids");
  check_dev(topk_weights, DType::kF32, "moe_experts", "topk_weights");
  check_dev(w.gate_up, dt_, "moe_experts", "gate_up");
  check_dev(w.down, dt_, "moe_experts", "down");
  check_dev(out, dt_, "moe_experts", "out");
  const int64_t t = x.size(0), h = x.size(1), k = topk_ids.size(1);
  const int64_t num_experts = w.gate_up.size(0), two_i = w.gate_up.size(1), inter = two_i / 2;
  DI_CHECK(w.gate_up.size(2) == h && w.down.size(1) == h && w.down.size(2) == inter &&
               out.numel() == t * h && topk_ids.size(0) == t,
           "cuda moe_experts: x {} gate_up {} down {} out {} ids {}", x.describe(),
           w.gate_up.describe(), w.down.describe(), out.describe(), topk_ids.describe());
  if (t == 0) return;
  Tensor ids_host = download(topk_ids);
  const int64_t slots = t * k;
  std::vector<int64_t> count(static_cast<size_t>(num_experts), 0);
  for (int64_t i = 0; i < slots; ++i) {
    const int32_t e = ids_host.data<int32_t>()[i];
    DI_CHECK(e < num_experts, "cuda moe_experts: expert id {} of {}", e, num_experts);
    if (e >= 0) ++count[static_cast<size_t>(e)];  // negative: a skipped entry
  }
  std::vector<int64_t> offset(static_cast<size_t>(num_experts) + 1, 0);
  for (int64_t e = 0; e < num_experts; ++e)
    offset[static_cast<size_t>(e) + 1] =
        offset[static_cast<size_t>(e)] + count[static_cast<size_t>(e)];
  Tensor gather_tok = Tensor::zeros({slots}, DType::kI32);  // rows past the used ones: token 0
  Tensor slot_row = Tensor::empty({slots}, DType::kI32);
  std::vector<int64_t> fill(offset.begin(), offset.end() - 1);
  for (int64_t i = 0; i < slots; ++i) {
    const int32_t id = ids_host.data<int32_t>()[i];
    if (id < 0) {
      slot_row.data<int32_t>()[i] = -1;  // the combine skips it
      continue;
    }
    const auto e = static_cast<size_t>(id);
    const int64_t row = fill[e]++;
    gather_tok.data<int32_t>()[row] = static_cast<int32_t>(i / k);
    slot_row.data<int32_t>()[i] = static_cast<int32_t>(row);
  }
  Tensor gather_dev = upload(gather_tok, DType::kI32);
  Tensor slot_row_dev = upload(slot_row, DType::kI32);
  Tensor xin = empty({slots, h}, dt_);
  embedding(gather_dev, x, xin);
  Tensor gu = empty({slots, two_i}, dt_);
  const size_t esz = dtype_size(dt_);
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t c = count[static_cast<size_t>(e)], off = offset[static_cast<size_t>(e)];
    if (c == 0) continue;
    gemm_bf16(mptr<char>(xin) + off * h * esz, h, cptr<char>(w.gate_up) + e * two_i * h * esz, h,
              mptr<char>(gu) + off * two_i * esz, two_i, false, c, two_i, h);
  }
  Tensor act = empty({slots, inter}, dt_);
  silu_mul(gu, act);
  Tensor y = empty({slots, h}, dt_);
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t c = count[static_cast<size_t>(e)], off = offset[static_cast<size_t>(e)];
    if (c == 0) continue;
    gemm_bf16(mptr<char>(act) + off * inter * esz, inter, cptr<char>(w.down) + e * h * inter * esz,
              inter, mptr<char>(y) + off * h * esz, h, false, c, h, inter);
  }
  launch_moe_combine_f32_out(
      MoeCombineF32OutParams{cptr<float>(y), cptr<int32_t>(slot_row_dev), cptr<float>(topk_weights),
                             mptr<float>(out), t, static_cast<int32_t>(k), static_cast<int32_t>(h)},
      stream_);
  CUDA_CHECK_LAUNCH("moe_combine_f32_out");
}

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend() {
  return std::make_unique<cuda::CudaBackend>();
}
std::unique_ptr<Backend> make_cuda_fp32_backend() {
  return std::make_unique<cuda::CudaBackend>(DType::kF32);
}

}  // namespace di
