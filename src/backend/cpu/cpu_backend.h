#pragma once
// The CPU reference backend: fp32 everywhere, GEMMs through OpenBLAS, loops on the thread pool.
#include "backend/backend.h"

namespace di {

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  Device device() const override { return Device::kCPU; }
  DType compute_dtype() const override { return DType::kF32; }
  int64_t available_memory_bytes() const override;  // MemAvailable of /proc/meminfo

  Tensor empty(const Shape& shape, DType dtype) override;
  Tensor zeros(const Shape& shape, DType dtype) override;
  Tensor upload(const Tensor& host, DType dtype) override;
  Tensor download(const Tensor& t) override;
  void synchronize() override {}

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
  void qkv_rope_store(const QkvRopeStoreParams& p) override { qkv_rope_store_composed(*this, p); }
  void qkv_rope_attention(const QkvRopeStoreParams& store,
                          const PagedAttentionParams& attn) override {
    qkv_rope_attention_composed(*this, store, attn);
  }
  void fused_linear(const FusedLinearParams& p) override { fused_linear_composed(*this, p); }
  void mla_rope_store(const MlaRopeStoreParams& p) override { mla_rope_store_composed(*this, p); }
  void head_linear(const Tensor& x, const Tensor& w, Tensor& y) override;
  void moe_route(const Tensor& logits, const MoeRoutingParams& p, Tensor& topk_ids,
                 Tensor& topk_weights) override;
  void moe_experts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                   const ExpertWeights& w, Tensor& out) override;
  void moe_norm_route(const MoeNormRouteParams& p) override { moe_norm_route_composed(*this, p); }
  void moe_residual(const MoeResidualParams& p) override { moe_residual_composed(*this, p); }
  void moe_count_experts(const Tensor& topk_ids, Tensor& counts) override;
  void moe_map_replicas(const Tensor& topk_ids, const Tensor& replica_indptr,
                        const Tensor& replica_slots, Tensor& phys_ids) override;
  void copy_rows(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row,
                 int64_t rows) override;
};

}  // namespace di
