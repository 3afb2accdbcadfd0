#pragma once
// ProfilingBackend: a Backend that forwards every op to another one and, while enabled, times
// each op on its own — the inner backend is synchronized before and after the op, so the time is
// the op's device time plus one launch — and sums the times per op and shape. For finding where
// a decode step goes (bench_cuda_model --profile); never for serving.
//
//   ProfilingBackend prof(cuda_backend);
//   auto model = make_random_model(config, prof, random, opts);   // the model calls prof
//   prof.set_enabled(true);  model->forward(...);  prof.set_enabled(false);
//   std::fputs(prof.table(25).c_str(), stdout);
//
// Disabled, it only forwards (no synchronization), so a CUDA graph can capture through it. Tests
// derive from it to replace one op of a real backend (e.g. make_decode_graph on the CPU).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace di {

class ProfilingBackend : public Backend {
 public:
  explicit ProfilingBackend(Backend& inner) : inner_(inner) {}

  void set_enabled(bool on) { enabled_ = on; }
  void reset() { stats_.clear(); }
  // Duplicate mode (bench_cuda_model --dup PATTERN), while disabled: each op whose key (as in the
  // table) contains `pattern` is issued twice, the second time into scratch outputs where the op
  // accumulates (fused_linear's residual, moe_residual's residual), so a captured step grows by
  // the op's cost inside the graph, launch gaps and overlap with its neighbours included — what
  // ncu's serialized per-kernel times cannot show. dup_count() counts the duplicated calls since
  // the pattern was set. The duplicates' outputs are garbage: for timing only. "" turns it off.
  void set_duplicate(std::string pattern) {
    dup_ = std::move(pattern);
    dup_count_ = 0;
  }
  int64_t dup_count() const { return dup_count_; }
  struct OpStat {
    std::string key;  // op name and shape
    int64_t calls = 0;
    double total_us = 0.0;
  };
  // Largest total first.
  std::vector<OpStat> stats() const;
  double total_us() const;
  // One line per op key, the `top` largest: "  <total us> <share %> <calls>  <key>".
  std::string table(size_t top) const;

  const char* name() const override { return inner_.name(); }
  Device device() const override { return inner_.device(); }
  DType compute_dtype() const override { return inner_.compute_dtype(); }
  bool supports_fp8_block_linear(int64_t n, int64_t k) const override {
    return inner_.supports_fp8_block_linear(n, k);
  }
  int64_t available_memory_bytes() const override { return inner_.available_memory_bytes(); }
  Tensor empty(const Shape& shape, DType dtype) override { return inner_.empty(shape, dtype); }
  Tensor zeros(const Shape& shape, DType dtype) override { return inner_.zeros(shape, dtype); }
  Tensor upload(const Tensor& host, DType dtype) override { return inner_.upload(host, dtype); }
  Tensor download(const Tensor& t) override { return inner_.download(t); }
  void synchronize() override { inner_.synchronize(); }

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
  void qkv_rope_attention(const QkvRopeStoreParams& store,
                          const PagedAttentionParams& attn) override;
  void fused_linear(const FusedLinearParams& p) override;
  void mla_rope_store(const MlaRopeStoreParams& p) override;
  void head_linear(const Tensor& x, const Tensor& w, Tensor& y) override;
  void moe_route(const Tensor& logits, const MoeRoutingParams& p, Tensor& topk_ids,
                 Tensor& topk_weights) override;
  void moe_experts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                   const ExpertWeights& w, Tensor& out) override;
  void moe_norm_route(const MoeNormRouteParams& p) override;
  void moe_residual(const MoeResidualParams& p) override;
  void moe_count_experts(const Tensor& topk_ids, Tensor& counts) override;
  void moe_map_replicas(const Tensor& topk_ids, const Tensor& replica_indptr,
                        const Tensor& replica_slots, Tensor& phys_ids) override;
  void copy_rows(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row,
                 int64_t rows) override;
  bool fill_uniform(Tensor& t, uint64_t seed, float scale) override {
    return inner_.fill_uniform(t, seed, scale);
  }
  bool can_sample_on_device() const override { return inner_.can_sample_on_device(); }
  std::vector<int32_t> sample_on_device(const Tensor& logits,
                                        std::span<const DeviceSampleRow> rows) override;
  std::unique_ptr<DecodeStepGraph> make_decode_graph(DecodeForward forward, int32_t bucket,
                                                     int32_t max_blocks_per_seq,
                                                     int32_t block_size) override {
    return inner_.make_decode_graph(std::move(forward), bucket, max_blocks_per_seq, block_size);
  }

 private:
  // Runs op; when enabled, times it under the key key_of() returns (built only then).
  template <typename K, typename F>
  void timed(K&& key_of, F&& op);
  template <typename K, typename F, typename D>
  void timed(K&& key_of, F&& op, D&& dup_op);

  Backend& inner_;
  bool enabled_ = false;
  std::string dup_;
  int64_t dup_count_ = 0;
  std::map<std::string, OpStat> stats_;
};

}  // namespace di
