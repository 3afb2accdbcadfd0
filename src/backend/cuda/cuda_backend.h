#pragma once
// The CUDA backend: bf16 activations and KV cache, fp32 accumulation, weights in bf16.
// fp32 verification mode (make_backend("cuda-fp32"), CudaBackend(DType::kF32)): activations, KV
// and weights in f32, GEMMs in true fp32 (CUBLAS_COMPUTE_32F, no TF32), the same kernels
// instantiated for float: a tight check of the kernels' logic against the CPU reference.
// GEMMs through cuBLAS (bf16 in, fp32 compute); everything else through the kernels in kernels/
// (one POD params struct per kernel). All work goes to one stream owned by the backend; the host
// only blocks in download() and synchronize() (and moe_experts above moe_device_max_slots()
// (token, slot) pairs: the prefill path reads the per-expert counts back once).
//
//   auto be = make_backend("cuda");
//   Tensor w = be->upload(host_f32, DType::kBF16);   // weights
//   Tensor y = be->empty({m, n}, DType::kBF16);       // from the caching allocator
//   be->linear(x, w, nullptr, y);
//   Tensor host = be->download(y);                    // host f32
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_allocator.h"
#include "backend/cuda/pinned_pool.h"
#include "core/env.h"

namespace di::cuda {

// Whether a CUDA device is usable here (tests skip when not).
bool cuda_available();

class CudaSampler;                  // cuda_sampler.h
struct PagedAttentionKernelParams;  // kernels/attention.h

// Which kernel runs MLA decode batches (CudaBackend::set_mla_decode_kernel). kAuto: the wide
// kernel from mla_wide_min_tokens() decode tokens (unless DEEPINFER_BATCH_INVARIANT=1), else
// the cluster kernel.
enum class MlaDecodeKernel { kGeneric, kTile, kCluster, kWide, kAuto };

class CudaBackend final : public Backend {
 public:
  // compute: DType::kBF16 (default) or DType::kF32 (the verification mode).
  explicit CudaBackend(DType compute = DType::kBF16);
  ~CudaBackend() override;

  const char* name() const override { return f32_ ? "cuda-fp32" : "cuda"; }
  Device device() const override { return Device::kCUDA; }
  DType compute_dtype() const override { return dt_; }
  // FP8 block-scaled linear through cuBLASLt (cuda_fp8.cpp): n and k multiples of 128.
  bool supports_fp8_block_linear(int64_t n, int64_t k) const override;
  int64_t available_memory_bytes() const override;  // cudaMemGetInfo's free + cached bytes

  Tensor empty(const Shape& shape, DType dtype) override;
  Tensor zeros(const Shape& shape, DType dtype) override;
  Tensor upload(const Tensor& host, DType dtype) override;
  Tensor download(const Tensor& t) override;
  void synchronize() override;
  // Invariants at rest (synchronizes the stream; throws inside a graph capture): the decode
  // kernels' arrival counters (the MLA cluster decode kernels' and the fused router's) are zero, as
  // each kernel's last CTA leaves them, in the attention counter buffer and in every buffer it
  // outgrew (a captured graph may still use those); the attention counter buffer and its capacity
  // agree.
  void check_integrity();
  // At least n zeroed arrival counters (MLA cluster decode); false inside a graph capture
  // when the buffer would have to grow. A grown buffer's predecessor is kept until the backend
  // dies (graphs captured earlier point at it).
  bool reserve_attention_counters(int64_t n);
  // The attention counter buffers (tests): the current one first, then the outgrown ones.
  struct CounterBuffer {
    uint32_t* words;
    int64_t count;
  };
  std::vector<CounterBuffer> attention_counter_buffers() const;

  void embedding(const Tensor& ids, const Tensor& table, Tensor& out) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y) override;
  void add_rms_norm(const Tensor& x, Tensor& residual, const Tensor& w, float eps,
                    Tensor& y) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void silu_mul(const Tensor& gate_up, Tensor& out) override;
  void rope(Tensor& x, int32_t rot_begin, int32_t rot_dim, const Tensor& positions,
            const Tensor& cos_sin, bool interleaved) override;
  void copy_columns(const Tensor& src, int32_t col_begin, Tensor& dst) override;
  void write_columns(const Tensor& src, Tensor& dst, int32_t col_begin) override;
  void store_kv(const Tensor& src, Tensor& pool, const KvLayout& layout, int32_t layer,
                int32_t entry_offset, const PagedBatch& batch) override;
  void copy_blocks(Tensor& pool, const KvLayout& layout,
                   std::span<const std::pair<int32_t, int32_t>> src_dst) override;
  void paged_attention(const PagedAttentionParams& p) override;
  void qkv_rope_store(const QkvRopeStoreParams& p) override;
  // qkv_rope_store + paged_attention (the composition). The two fused kernels measured for it
  // were slower on the H200 and were removed in run 46 (docs/cuda_backend.md "Fused decode
  // attention": run 10's CUDA-core kernel, Llama-3.1-8B 205.7 -> 191.4 tok/s; run 29's
  // tensor-core form, Qwen3-30B-A3B batch 1 353.2 -> 348.5, batch 32 -2.9 %).
  void qkv_rope_attention(const QkvRopeStoreParams& store,
                          const PagedAttentionParams& attn) override;
  // One small-M kernel (kernels/gemv.h) for m <= gemv_max_rows() bf16 rows; else the composed
  // path (cuBLAS + elementwise kernels).
  void fused_linear(const FusedLinearParams& p) override;
  // With w_uk_t (the absorbed query), one kernel for both where launch_mla_rope_store_uk applies
  // (kernels/decode_fused.h), unless DEEPINFER_MLA_FUSED_UK=0; else mla_rope_store, head_linear.
  void mla_rope_store(const MlaRopeStoreParams& p) override;
  // Tests: 1 / 0 force the one-kernel absorbed query on / off, -1 = the env.
  void set_mla_fused_uk_override(int v) { mla_fused_uk_override_ = v; }
  int64_t mla_fused_uk_calls() const { return mla_fused_uk_calls_; }
  void head_linear(const Tensor& x, const Tensor& w, Tensor& y) override;
  void moe_route(const Tensor& logits, const MoeRoutingParams& p, Tensor& topk_ids,
                 Tensor& topk_weights) override;
  void moe_experts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                   const ExpertWeights& w, Tensor& out) override;
  // A decode step of one token (or a few: set_moe_norm_route_max_elems): one kernel
  // (kernels/moe.h); else, or
  // with DEEPINFER_MOE_FUSED=0 | residual, the composed ops.
  void moe_norm_route(const MoeNormRouteParams& p) override;
  // One token (batch-1 decode): the one-token expert kernels with the shared expert as extra
  // slots and the residual add in down's store (kernels/moe_grouped.h); else, or with
  // DEEPINFER_MOE_FUSED=0 | route, the composed ops.
  void moe_residual(const MoeResidualParams& p) override;
  // Calls of moe_norm_route / moe_residual that ran the fused kernels (tests check the path).
  int64_t moe_fused_route_calls() const { return moe_fused_route_calls_; }
  int64_t moe_fused_residual_calls() const { return moe_fused_residual_calls_; }
  // The fused router takes one token always and more while tokens · hidden <= this (default
  // 4096: measured faster than the composed ops at 1-2 tokens of hidden 2048 and at 1 of 7168,
  // slower at 4 of 2048 and 2 of 7168; run 17). Tests raise it to the kernel's limit.
  void set_moe_norm_route_max_elems(int64_t n) { moe_norm_route_max_elems_ = n; }
  // Tests, benchmarks: 1 = both fused MoE paths where they apply, 0 = composed, 2 = the router
  // only, 3 = the residual kernels only, -1 = the env (DEEPINFER_MOE_FUSED=1|0|route|residual).
  void set_moe_fused(int on) { moe_fused_override_ = on; }
  void moe_count_experts(const Tensor& topk_ids, Tensor& counts) override;
  void moe_map_replicas(const Tensor& topk_ids, const Tensor& replica_indptr,
                        const Tensor& replica_slots, Tensor& phys_ids) override;
  void copy_rows(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row,
                 int64_t rows) override;

  // fill_random for bf16 tensors (false for others: the caller fills on the host).
  bool fill_uniform(Tensor& t, uint64_t seed, float scale) override {
    if (t.dtype() != DType::kBF16 || t.device() != Device::kCUDA) return false;
    fill_random(t, seed, scale);
    return true;
  }
  // The GPU sampler (cuda_sampler.cpp, kernels/sampling.h); its buffers live until the backend.
  bool can_sample_on_device() const override { return true; }
  std::vector<int32_t> sample_on_device(const Tensor& logits,
                                        std::span<const DeviceSampleRow> rows) override;
  // Captures a cuda::DecodeGraph (cuda_graph.cpp) after one eager warm-up step.
  std::unique_ptr<DecodeStepGraph> make_decode_graph(DecodeForward forward, int32_t bucket,
                                                     int32_t max_blocks_per_seq,
                                                     int32_t block_size) override;

  // ---- CUDA-only helpers (tests, benchmarks, graphs) ----
  cudaStream_t stream() const { return stream_; }
  CudaAllocator& allocator() { return allocator_; }
  // Copies a host tensor into an existing device tensor of the same dtype and size, on the stream
  // (the metadata update before a CUDA graph replay). The host memory must stay valid until the
  // stream reaches the copy (synchronize(), or pinned memory kept alive).
  void copy_to_device(const Tensor& host, Tensor& dev);
  // Fills a bf16 device tensor with uniform(-scale, scale) values from a counter hash of `seed`.
  // (bf16 only, also in the fp32 mode.)
  void fill_random(Tensor& t, uint64_t seed, float scale);
  // Forces the attention kernel's KV split count for the next calls (0 = planner's choice); a
  // CUDA-graph bucket captures with the largest context it will serve.
  void set_attention_max_kv_len(int32_t max_kv_len) { attention_max_kv_override_ = max_kv_len; }
  // moe_experts runs the device-only (graph-capturable) decode kernels when T * top_k <= this,
  // else the prefill path (device alignment, one read-back of the counts, cuBLAS per expert).
  void set_moe_device_max_slots(int64_t slots) { moe_device_max_slots_ = slots; }
  int64_t moe_device_max_slots() const { return moe_device_max_slots_; }
  // Above that threshold: true = the tensor-core grouped GEMM on device offsets (no host sync,
  // capturable), false = one read-back of the counts + cuBLAS per expert (the default until the
  // grouped kernel has passed test_cuda_moe on a GPU).
  void set_moe_grouped_gemm(bool on) { moe_grouped_gemm_ = on; }
  // Prefill attention on tensor cores (attention_prefill_mma.cu; default, env
  // DEEPINFER_ATTN_PREFILL=wgmma|mma|simt) or on the CUDA-core kernel for every batch. Variant of
  // the tensor-core kernel: warps per CTA 4 (default) or 8 (env DEEPINFER_ATTN_MMA_WARPS), 16-row
  // m-tiles per warp 1 (default) or 2 (4 warps x 32 rows; env DEEPINFER_ATTN_MMA_MTILES).
  void set_attention_prefill_mma(bool on, int warps = 4, int m_tiles = 1) {
    attention_prefill_mma_ = on;
    attention_mma_warps_ = warps == 8 ? 8 : 4;
    attention_mma_mtiles_ = m_tiles == 2 ? 2 : 1;
  }
  bool attention_prefill_mma() const { return attention_prefill_mma_; }
  // With tensor cores on: the Hopper warpgroup-MMA kernel (attention_prefill_wgmma.cu) for the
  // batches it supports (prefill_wgmma_supported), the mma.sync kernel for the rest (default on;
  // DEEPINFER_ATTN_PREFILL=mma turns it off). Calls that ran it: tests check the path was taken.
  void set_attention_prefill_wgmma(bool on) { attention_prefill_wgmma_ = on; }
  bool attention_prefill_wgmma() const { return attention_prefill_wgmma_; }
  int64_t prefill_wgmma_calls() const { return prefill_wgmma_calls_; }
  // fused_linear (and linear) take the small-M GEMV kernel for up to this many rows (0 = never;
  // env DEEPINFER_GEMV_MAX_ROWS, default kDefaultGemvMaxRows).
  void set_gemv_max_rows(int32_t rows) { gemv_max_rows_ = rows; }
  int32_t gemv_max_rows() const { return gemv_max_rows_; }
  // MLA decode batches (paged_attention with one latent head; bf16 mode): by batch size (kAuto,
  // default) the wide kernel (kernels/mla_decode_wide.h) or the cluster kernel
  // (kernels/mla_decode_cluster.h); or one of them always (env DEEPINFER_MLA_KERNEL=wide |
  // cluster), the tile kernel + combine (kernels/mla_decode.h; =tile) or the generic paged
  // attention (=0). A kernel that cannot take a batch passes it to the next in that order.
  void set_mla_decode_kernel(MlaDecodeKernel k) { mla_decode_kernel_ = k; }
  MlaDecodeKernel mla_decode_kernel() const { return mla_decode_kernel_; }
  // Calls of paged_attention that ran the cluster / wide kernel (tests check the path taken).
  int64_t mla_cluster_calls() const { return mla_cluster_calls_; }
  // Launches of the deferred MLA merge (paged_attention with head_w at batch 1: the cluster
  // kernel without merge, then mla_merge_uv); set_mla_defer: 1 / 0 forces it on / off (when
  // it applies), -1 back to DEEPINFER_MLA_DEFER (default on; 0 off).
  int64_t mla_deferred_calls() const { return mla_deferred_calls_; }
  void set_mla_defer(int on) { mla_defer_override_ = on; }
  // Benchmarks: the cluster kernel launches from now on (graph captures included) record phase
  // timestamps into `buf` (device memory, kMlaTimingSlots words per CTA, kernels/
  // mla_decode_cluster.h) when their grid has at most `ctas` / 2 CTAs, the deferred merge's CTAs
  // (kMlaMergeTimingSlots words each) into the second half; null turns it off.
  void set_mla_timing(unsigned long long* buf, int64_t ctas) {
    mla_timing_ = buf;
    mla_timing_ctas_ = ctas;
  }
  int64_t mla_wide_calls() const { return mla_wide_calls_; }

 private:
  // x and w in the compute dtype; y f32 or the compute dtype. (Named for its origin: in the fp32
  // mode the inputs are f32 and the GEMM is true fp32.)
  void gemm_bf16(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy,
                 bool y_f32, int64_t m, int64_t n, int64_t k);
  const float* device_f32(const Tensor& t, const char* what);
  void moe_experts_f32(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                       const ExpertWeights& w, Tensor& out);
  // y = x · dequant(w)ᵀ for an FP8 weight with block scales (cuda_fp8.cpp).
  void linear_fp8(const Tensor& x, const Tensor& w, Tensor& y);
  struct Fp8Plans;  // cuBLASLt handle + per-shape descriptors and heuristics (cuda_fp8.cpp)
  std::shared_ptr<Fp8Plans> fp8_plans_;

  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* cublas_workspace_ = nullptr;
  CudaAllocator allocator_;
  // Page-locked destinations for downloads of at least kPinnedDownloadMin bytes (the logits);
  // DEEPINFER_PINNED_DOWNLOAD=0 downloads into fresh pageable memory instead (A/B).
  PinnedHostPool pinned_{size_t{1} << 30};
  bool pinned_download_ = !di::env::is("DEEPINFER_PINNED_DOWNLOAD", "0");
  std::shared_ptr<CudaSampler> sampler_;  // after allocator_: its tensors go back to it first
  int32_t attention_max_kv_override_ = 0;
  int32_t gemv_max_rows_ = 0;  // set in the constructor
  int32_t num_sms_ = 0;
  // The small-M kernel when it takes these shapes (bf16, m <= gemv_max_rows_): true if launched.
  bool try_gemv(const FusedLinearParams& p);
  // The cluster MLA decode kernel when it takes the call: true if launched.
  bool try_mla_cluster_decode(const PagedAttentionParams& p, int32_t max_kv);
  bool try_mla_deferred_decode(const PagedAttentionParams& p, int32_t max_kv);
  bool try_mla_wide_decode(const PagedAttentionParams& p, int32_t max_kv);
  uint32_t* attention_counters_ = nullptr;  // all zero between kernels (the kernel resets them)
  int64_t attention_counters_cap_ = 0;
  MlaDecodeKernel mla_decode_kernel_ = [] {
    constexpr const char* kName = "DEEPINFER_MLA_KERNEL";
    if (di::env::is(kName, "0")) return MlaDecodeKernel::kGeneric;
    if (di::env::is(kName, "tile")) return MlaDecodeKernel::kTile;
    if (di::env::is(kName, "cluster")) return MlaDecodeKernel::kCluster;
    if (di::env::is(kName, "wide")) return MlaDecodeKernel::kWide;
    return MlaDecodeKernel::kAuto;
  }();
  int64_t mla_cluster_calls_ = 0;
  int64_t mla_deferred_calls_ = 0;
  int mla_defer_override_ = -1;
  unsigned long long* mla_timing_ = nullptr;
  int64_t mla_timing_ctas_ = 0;
  int64_t mla_wide_calls_ = 0;
  std::vector<CounterBuffer> retired_attention_counters_;  // outgrown, kept for captured graphs
  DType dt_ = DType::kBF16;                            // compute dtype: activations, weights, KV
  bool f32_ = false;                                   // dt_ == kF32
  size_t max_smem_optin_ = 0;
  int64_t moe_device_max_slots_ = 2048;
  // The router's correction bias on the device (a host bias is uploaded on first use, which must
  // not be inside a graph capture), or null.
  const float* router_bias(const MoeRoutingParams& r, const char* op);
  bool moe_fused_enabled(bool route) const;  // moe_norm_route (true) / moe_residual (false)
  // Whether one token's experts take the one-token kernels (launch_moe_decode_t1): x [1, H], the
  // weights' shapes already checked, `slots` = top_k (the routed slots).
  bool moe_t1_applies(const Tensor& x, const ExpertWeights& w, int64_t slots) const;
  // Whether the backend's stream is capturing a CUDA graph.
  bool capturing() const;
  int moe_fused_override_ = -1;
  int mla_fused_uk_override_ = -1;
  int64_t mla_fused_uk_calls_ = 0;
  int64_t moe_norm_route_max_elems_ = 4096;
  int64_t moe_fused_route_calls_ = 0;
  int64_t moe_fused_residual_calls_ = 0;
  unsigned* moe_route_counter_ = nullptr;  // the fused router's arrival counter (zero at rest)
  float* moe_route_logits_ = nullptr;      // the fused router's logits when the caller passes none
  bool moe_grouped_gemm_ = false;
  bool attention_prefill_mma_ = true;
  bool attention_prefill_wgmma_ = true;
  int64_t prefill_wgmma_calls_ = 0;
  int attention_mma_warps_ = 4;
  int attention_mma_mtiles_ = 1;
  // Host f32 tensors the model hands to ops (e.g. the V3 router bias), uploaded once.
  std::unordered_map<const void*, Tensor> host_cache_;
};

}  // namespace di::cuda
