#include "backend/profiling_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iterator>

namespace di {
namespace {

std::string dims(const Tensor& t) {
  std::string s;
  for (int64_t i = 0; i < t.dim(); ++i)
    fmt::format_to(std::back_inserter(s), "{}{}", i ? "x" : "", t.size(i));
  return s;
}

}  // namespace

template <typename K, typename F>
void ProfilingBackend::timed(K&& key_of, F&& op) {
  timed(key_of, op, op);
}

template <typename K, typename F, typename D>
void ProfilingBackend::timed(K&& key_of, F&& op, D&& dup_op) {
  if (!enabled_) {  // pure forwarding: no key is built on this path unless duplicating
    op();
    if (!dup_.empty() && key_of().find(dup_) != std::string::npos) {
      ++dup_count_;
      dup_op();
    }
    return;
  }
  const std::string key = key_of();
  inner_.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  op();
  inner_.synchronize();
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  OpStat& s = stats_[key];
  s.key = key;
  ++s.calls;
  s.total_us += us;
}

std::vector<ProfilingBackend::OpStat> ProfilingBackend::stats() const {
  std::vector<OpStat> out;
  for (const auto& [key, s] : stats_) out.push_back(s);
  std::sort(out.begin(), out.end(),
            [](const OpStat& a, const OpStat& b) { return a.total_us > b.total_us; });
  return out;
}

double ProfilingBackend::total_us() const {
  double t = 0.0;
  for (const auto& [key, s] : stats_) t += s.total_us;
  return t;
}

std::string ProfilingBackend::table(size_t top) const {
  const double total = std::max(total_us(), 1e-9);
  std::string out;
  const auto all = stats();
  for (size_t i = 0; i < all.size() && i < top; ++i) {
    const OpStat& s = all[i];
    out += fmt::format("{:10.1f} us {:5.1f}% {:5d}x  {}\n", s.total_us, 100.0 * s.total_us / total,
                       s.calls, s.key);
  }
  out += fmt::format("{:10.1f} us total over {} op kinds\n", total, all.size());
  return out;
}

void ProfilingBackend::embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  timed([&] { return std::string("embedding " + dims(out)); },
        [&] { inner_.embedding(ids, table, out); });
}
void ProfilingBackend::linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  timed(
      [&] {
        return std::string(fmt::format("linear [{}]·[{}]ᵀ{}{}", dims(x), dims(w),
                                       w.dtype() == DType::kFP8E4M3 ? " fp8" : "",
                                       y.dtype() == DType::kF32 ? " ->f32" : ""));
      },
      [&] { inner_.linear(x, w, bias, y); });
}
void ProfilingBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y) {
  timed([&] { return std::string("rms_norm " + dims(x)); }, [&] { inner_.rms_norm(x, w, eps, y); });
}
void ProfilingBackend::add_rms_norm(const Tensor& x, Tensor& residual, const Tensor& w, float eps,
                                    Tensor& y) {
  timed([&] { return std::string("add_rms_norm " + dims(x)); },
        [&] { inner_.add_rms_norm(x, residual, w, eps, y); });
}
void ProfilingBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  timed([&] { return std::string("add " + dims(out)); }, [&] { inner_.add(a, b, out); });
}
void ProfilingBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  timed([&] { return std::string("silu_mul " + dims(out)); },
        [&] { inner_.silu_mul(gate_up, out); });
}
void ProfilingBackend::rope(Tensor& x, int32_t rot_begin, int32_t rot_dim, const Tensor& positions,
                            const Tensor& cos_sin, bool interleaved) {
  timed([&] { return std::string("rope " + dims(x)); },
        [&] { inner_.rope(x, rot_begin, rot_dim, positions, cos_sin, interleaved); });
}
void ProfilingBackend::copy_columns(const Tensor& src, int32_t col_begin, Tensor& dst) {
  timed([&] { return std::string("copy_columns " + dims(dst)); },
        [&] { inner_.copy_columns(src, col_begin, dst); });
}
void ProfilingBackend::write_columns(const Tensor& src, Tensor& dst, int32_t col_begin) {
  timed([&] { return std::string("write_columns " + dims(src)); },
        [&] { inner_.write_columns(src, dst, col_begin); });
}
void ProfilingBackend::store_kv(const Tensor& src, Tensor& pool, const KvLayout& layout,
                                int32_t layer, int32_t entry_offset, const PagedBatch& batch) {
  timed([&] { return std::string("store_kv " + dims(src)); },
        [&] { inner_.store_kv(src, pool, layout, layer, entry_offset, batch); });
}
void ProfilingBackend::copy_blocks(Tensor& pool, const KvLayout& layout,
                                   std::span<const std::pair<int32_t, int32_t>> src_dst) {
  timed([&] { return std::string("copy_blocks"); },
        [&] { inner_.copy_blocks(pool, layout, src_dst); });
}
void ProfilingBackend::paged_attention(const PagedAttentionParams& p) {
  timed(
      [&] {
        std::string key = fmt::format("paged_attention T={} S={} heads {}/{} d {}/{}",
                                      p.batch->num_tokens, p.batch->num_seqs, p.num_q_heads,
                                      p.num_kv_heads, p.head_dim_qk, p.head_dim_v);
        // With the per-head projection inside (MLA's W_UV): the key names it, so a pattern
        // for head_linear still finds that work.
        if (p.head_w != nullptr) key += fmt::format(" + head_linear [{}]", dims(*p.head_w));
        return key;
      },
      [&] { inner_.paged_attention(p); });
}
void ProfilingBackend::qkv_rope_store(const QkvRopeStoreParams& p) {
  timed([&] { return std::string("qkv_rope_store " + dims(*p.qkv)); },
        [&] { inner_.qkv_rope_store(p); });
}
void ProfilingBackend::qkv_rope_attention(const QkvRopeStoreParams& store,
                                          const PagedAttentionParams& attn) {
  timed(
      [&] {
        return fmt::format("qkv_rope_attention T={} S={} heads {}/{} d {}", attn.batch->num_tokens,
                           attn.batch->num_seqs, attn.num_q_heads, attn.num_kv_heads,
                           attn.head_dim_qk);
      },
      [&] { inner_.qkv_rope_attention(store, attn); });
}
void ProfilingBackend::fused_linear(const FusedLinearParams& p) {
  timed(
      [&] {
        static constexpr const char* kIn[] = {"", "rms_norm·", "silu_mul·"};
        return fmt::format("fused_linear {}[{}]·[{}]ᵀ{}{}", kIn[static_cast<int>(p.in)], dims(*p.x),
                           dims(*p.w), p.silu_out ? " →silu_mul" : "",
                           p.residual ? " +=residual" : "");
      },
      [&] { inner_.fused_linear(p); },
      [&] {  // into a scratch y: the residual must not be added twice
        FusedLinearParams q = p;
        Tensor y = inner_.empty({p.x->size(0), p.silu_out ? p.w->size(0) / 2 : p.w->size(0)},
                                p.y != nullptr ? p.y->dtype() : inner_.compute_dtype());
        q.y = &y;
        q.residual = nullptr;
        inner_.fused_linear(q);
      });
}
void ProfilingBackend::mla_rope_store(const MlaRopeStoreParams& p) {
  timed(
      [&] {
        return std::string(fmt::format("mla_rope_store T={} heads {} d {}+{} latent {}{}",
                                       p.batch->num_tokens, p.num_heads, p.nope_dim, p.rope_dim,
                                       p.latent_dim, p.w_uk_t != nullptr ? " +W_UK" : ""));
      },
      [&] { inner_.mla_rope_store(p); });
}
void ProfilingBackend::head_linear(const Tensor& x, const Tensor& w, Tensor& y) {
  timed([&] { return std::string(fmt::format("head_linear [{}]·[{}]", dims(x), dims(w))); },
        [&] { inner_.head_linear(x, w, y); });
}
void ProfilingBackend::moe_route(const Tensor& logits, const MoeRoutingParams& p, Tensor& topk_ids,
                                 Tensor& topk_weights) {
  timed([&] { return std::string("moe_route " + dims(logits)); },
        [&] { inner_.moe_route(logits, p, topk_ids, topk_weights); });
}
void ProfilingBackend::moe_experts(const Tensor& x, const Tensor& topk_ids,
                                   const Tensor& topk_weights, const ExpertWeights& w,
                                   Tensor& out) {
  timed(
      [&] {
        return std::string(fmt::format("moe_experts x [{}] k {} experts [{}]", dims(x),
                                       topk_ids.size(1), dims(w.gate_up)));
      },
      [&] { inner_.moe_experts(x, topk_ids, topk_weights, w, out); });
}
void ProfilingBackend::moe_norm_route(const MoeNormRouteParams& p) {
  timed(
      [&] {
        return std::string(
            fmt::format("moe_norm_route x [{}] gate [{}]", dims(*p.x), dims(*p.gate)));
      },
      [&] { inner_.moe_norm_route(p); });
}
void ProfilingBackend::moe_residual(const MoeResidualParams& p) {
  timed(
      [&] {
        return std::string(fmt::format("moe_residual x [{}] k {} experts [{}]{}", dims(*p.x),
                                       p.topk_ids->size(1), dims(p.experts->gate_up),
                                       p.shared_gate_up ? " + shared" : ""));
      },
      [&] { inner_.moe_residual(p); },
      [&] {  // into a scratch residual
        MoeResidualParams q = p;
        Tensor r = inner_.empty(p.residual->shape(), p.residual->dtype());
        q.residual = &r;
        inner_.moe_residual(q);
      });
}
void ProfilingBackend::moe_count_experts(const Tensor& topk_ids, Tensor& counts) {
  timed([&] { return std::string("moe_count_experts"); },
        [&] { inner_.moe_count_experts(topk_ids, counts); });
}
void ProfilingBackend::moe_map_replicas(const Tensor& topk_ids, const Tensor& replica_indptr,
                                        const Tensor& replica_slots, Tensor& phys_ids) {
  timed([&] { return std::string("moe_map_replicas"); },
        [&] { inner_.moe_map_replicas(topk_ids, replica_indptr, replica_slots, phys_ids); });
}
void ProfilingBackend::copy_rows(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row,
                                 int64_t rows) {
  timed([&] { return std::string("copy_rows"); },
        [&] { inner_.copy_rows(src, src_row, dst, dst_row, rows); });
}
std::vector<int32_t> ProfilingBackend::sample_on_device(const Tensor& logits,
                                                        std::span<const DeviceSampleRow> rows) {
  std::vector<int32_t> tokens;
  timed([&] { return "sample_on_device " + dims(logits); },
        [&] { tokens = inner_.sample_on_device(logits, rows); });
  return tokens;
}

}  // namespace di
