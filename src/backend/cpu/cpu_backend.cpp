#include "backend/cpu/cpu_backend.h"

#ifdef DI_HAVE_BLAS
#include <cblas.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "core/thread_pool.h"

namespace di {
namespace {

int64_t rows_of(const Tensor& t) { return t.numel() / t.size(-1); }

void check_f32(const Tensor& t, const char* what) {
  DI_CHECK(t.dtype() == DType::kF32 && t.device() == Device::kCPU,
           "cpu backend: '{}' must be a CPU f32 tensor, got {}", what, t.describe());
}

void check_i32(const Tensor& t, const char* what) {
  DI_CHECK(t.dtype() == DType::kI32 && t.device() == Device::kCPU,
           "cpu backend: '{}' must be a CPU i32 tensor, got {}", what, t.describe());
}

// y[m, n] = x[m, :] · w[n, :] for m < M, n < N with row strides ldx, ldw, ldy (elements).
#ifdef DI_HAVE_BLAS
void gemm_xwt_strided(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
                      int64_t ldy, int64_t m, int64_t n, int64_t k) {
  if (m == 0 || n == 0) return;
  if (m == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), 1.0f, w,
                static_cast<int>(ldw), x, 1, 0.0f, y, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, x, static_cast<int>(ldx), w, static_cast<int>(ldw), 0.0f,
              y, static_cast<int>(ldy));
}
#else
// Without OpenBLAS (DI_BLAS=OFF): rows of w are split over the thread pool; each w row is reused
// for every x row while it is hot in L1/L2. Eight partial sums keep the FMA pipes busy without
// -ffast-math. Only the oracle of the GPU op tests runs this way, on small shapes.
float dot_f32(const float* a, const float* b, int64_t k) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < k; ++i) s += a[i] * b[i];
  return s;
}

void gemm_xwt_strided(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
                      int64_t ldy, int64_t m, int64_t n, int64_t k) {
  if (m == 0 || n == 0) return;
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, m * k));
  ThreadPool::global().parallel_for(n, grain, [&](int64_t nb, int64_t ne) {
    for (int64_t j = nb; j < ne; ++j)
      for (int64_t i = 0; i < m; ++i) y[i * ldy + j] = dot_f32(x + i * ldx, w + j * ldw, k);
  });
}
#endif

void gemm_xwt(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k) {
  gemm_xwt_strided(x, k, w, k, y, n, m, n, k);
}

void rms_norm_row(const float* x, const float* w, float eps, float* y, int64_t d) {
  double ss = 0.0;
  for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
  float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(d)) + eps);
  for (int64_t i = 0; i < d; ++i) y[i] = x[i] * inv * w[i];
}

inline float silu(float v) { return v / (1.0f + std::exp(-v)); }

}  // namespace

int64_t CpuBackend::available_memory_bytes() const {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    long long kb = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kb) == 1) return kb * 1024;
  }
  return -1;
}

Tensor CpuBackend::empty(const Shape& shape, DType dtype) { return Tensor::empty(shape, dtype); }
Tensor CpuBackend::zeros(const Shape& shape, DType dtype) { return Tensor::zeros(shape, dtype); }

Tensor CpuBackend::upload(const Tensor& host, DType dtype) {
  if (host.dtype() == dtype) return host.clone();
  if (dtype == DType::kF32) return host.to_f32();
  return host.to_f32().to(dtype);
}

Tensor CpuBackend::download(const Tensor& t) {
  if (t.dtype() == DType::kF32 || t.dtype() == DType::kI32) return t.clone();
  return t.to_f32();
}

void CpuBackend::embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  check_i32(ids, "ids");
  check_f32(table, "table");
  check_f32(out, "out");
  const int64_t t = ids.numel(), h = table.size(1), vocab = table.size(0);
  DI_CHECK(out.numel() == t * h, "embedding: out {} does not hold {} rows of {}", out.describe(),
           t, h);
  for (int64_t i = 0; i < t; ++i) {
    int32_t id = ids.data<int32_t>()[i];
    DI_CHECK(id >= 0 && id < vocab, "token id {} out of range [0, {})", id, vocab);
    std::memcpy(out.f32() + i * h, table.f32() + int64_t{id} * h, static_cast<size_t>(h) * 4);
  }
}

void CpuBackend::linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  check_f32(x, "x");
  check_f32(w, "w");
  check_f32(y, "y");
  const int64_t k = w.size(1), n = w.size(0), m = x.numel() / k;
  DI_CHECK(x.size(-1) == k, "linear: x {} does not match weight {}", x.describe(), w.describe());
  DI_CHECK(y.numel() == m * n, "linear: y {} is not [{}, {}]", y.describe(), m, n);
  gemm_xwt(x.f32(), w.f32(), y.f32(), m, n, k);
  if (bias != nullptr) {
    check_f32(*bias, "bias");
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) y.f32()[i * n + j] += bias->f32()[j];
  }
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y) {
  check_f32(x, "x");
  check_f32(w, "w");
  const int64_t d = x.size(-1), rows = rows_of(x);
  DI_CHECK(w.numel() == d && y.numel() == x.numel(), "rms_norm: x {} w {} y {}", x.describe(),
           w.describe(), y.describe());
  ThreadPool::global().parallel_for(rows, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) rms_norm_row(x.f32() + r * d, w.f32(), eps, y.f32() + r * d, d);
  });
}

void CpuBackend::add_rms_norm(const Tensor& x, Tensor& residual, const Tensor& w, float eps,
                              Tensor& y) {
  add(residual, x, residual);
  rms_norm(residual, w, eps, y);
}

void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  check_f32(a, "a");
  check_f32(b, "b");
  DI_CHECK(a.numel() == b.numel() && out.numel() == a.numel(), "add: {} + {} -> {}",
           a.describe(), b.describe(), out.describe());
  const float* pa = a.f32();
  const float* pb = b.f32();
  float* po = out.f32();
  for (int64_t i = 0, n = a.numel(); i < n; ++i) po[i] = pa[i] + pb[i];
}

void CpuBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  check_f32(gate_up, "gate_up");
  const int64_t two_i = gate_up.size(-1), inter = two_i / 2, rows = rows_of(gate_up);
  DI_CHECK(out.numel() == rows * inter, "silu_mul: out {} for gate_up {}", out.describe(),
           gate_up.describe());
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up.f32() + r * two_i;
    float* o = out.f32() + r * inter;
    for (int64_t i = 0; i < inter; ++i) o[i] = silu(g[i]) * g[inter + i];
  }
}

void CpuBackend::rope(Tensor& x, int32_t rot_begin, int32_t rot_dim, const Tensor& positions,
                      const Tensor& cos_sin, bool interleaved) {
  check_f32(x, "x");
  check_i32(positions, "positions");
  check_f32(cos_sin, "cos_sin");
  DI_CHECK(x.dim() == 3, "rope: x must be [T, heads, row], got {}", x.describe());
  const int64_t t = x.size(0), heads = x.size(1), row = x.size(2), half = rot_dim / 2;
  DI_CHECK(rot_dim % 2 == 0 && rot_begin + rot_dim <= row && cos_sin.size(1) == rot_dim,
           "rope: rot [{}, +{}) in rows of {} with cos_sin {}", rot_begin, rot_dim, row,
           cos_sin.describe());
  DI_CHECK(positions.numel() == t, "rope: {} positions for {} tokens", positions.numel(), t);
  for (int64_t i = 0; i < t; ++i) {
    int32_t pos = positions.data<int32_t>()[i];
    DI_CHECK(pos >= 0 && pos < cos_sin.size(0), "rope: position {} beyond the table ({})", pos,
             cos_sin.size(0));
    const float* cs = cos_sin.f32() + int64_t{pos} * rot_dim;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x.f32() + (i * heads + h) * row + rot_begin;
      for (int64_t j = 0; j < half; ++j) {
        float c = cs[j], s = cs[half + j];
        int64_t a = interleaved ? 2 * j : j, b = interleaved ? 2 * j + 1 : j + half;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x1 * c + x0 * s;
      }
    }
  }
}

void CpuBackend::copy_columns(const Tensor& src, int32_t col_begin, Tensor& dst) {
  // src is [rows, c]; dst holds rows × w values in any shape.
  const int64_t c = src.size(-1), rows = rows_of(src), w = rows ? dst.numel() / rows : 0;
  DI_CHECK(col_begin + w <= c && w * rows == dst.numel(), "copy_columns: {} [{}, +{}) -> {}",
           src.describe(), col_begin, w, dst.describe());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst.f32() + r * w, src.f32() + r * c + col_begin, static_cast<size_t>(w) * 4);
}

void CpuBackend::write_columns(const Tensor& src, Tensor& dst, int32_t col_begin) {
  // dst is [rows, c]; src holds rows × w values in any shape.
  const int64_t c = dst.size(-1), rows = rows_of(dst), w = rows ? src.numel() / rows : 0;
  DI_CHECK(col_begin + w <= c && w * rows == src.numel(), "write_columns: {} -> {} at {}",
           src.describe(), dst.describe(), col_begin);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst.f32() + r * c + col_begin, src.f32() + r * w, static_cast<size_t>(w) * 4);
}

void CpuBackend::store_kv(const Tensor& src, Tensor& pool, const KvLayout& layout, int32_t layer,
                          int32_t entry_offset, const PagedBatch& batch) {
  check_f32(src, "src");
  check_f32(pool, "pool");
  // src holds num_tokens rows of w values in any shape.
  const int64_t t = batch.num_tokens, w = t ? src.numel() / t : 0;
  DI_CHECK(entry_offset + w <= layout.entry_size, "store_kv: [{}, +{}) beyond entry of {}",
           entry_offset, w, layout.entry_size);
  DI_CHECK(w * t == src.numel(), "store_kv: {} for {} tokens", src.describe(), t);
  const int32_t* slots = batch.slot_mapping.data<int32_t>();
  for (int64_t i = 0; i < t; ++i) {
    if (slots[i] < 0) continue;  // padding row (a graph bucket's unused sequence)
    int64_t block = slots[i] / layout.block_size, off = slots[i] % layout.block_size;
    DI_CHECK(block >= 0 && block < layout.num_blocks, "store_kv: slot {} outside the pool",
             slots[i]);
    float* dst = pool.f32() + block * layout.block_stride() + layout.layer_offset(layer) +
                 off * layout.entry_size + entry_offset;
    std::memcpy(dst, src.f32() + i * w, static_cast<size_t>(w) * 4);
  }
}

void CpuBackend::copy_blocks(Tensor& pool, const KvLayout& layout,
                             std::span<const std::pair<int32_t, int32_t>> src_dst) {
  check_f32(pool, "pool");
  const int64_t stride = layout.block_stride();
  DI_CHECK(static_cast<size_t>(pool.numel()) == layout.pool_elems(),
           "copy_blocks: pool {} does not match {} blocks of {} elements", pool.describe(),
           layout.num_blocks, stride);
  for (const auto& [src, dst] : src_dst) {
    DI_CHECK(src >= 0 && src < layout.num_blocks && dst >= 0 && dst < layout.num_blocks &&
                 src != dst,
             "copy_blocks: block {} -> {} in a pool of {}", src, dst, layout.num_blocks);
    std::memcpy(pool.f32() + dst * stride, pool.f32() + src * stride,
                static_cast<size_t>(stride) * sizeof(float));
  }
}

void CpuBackend::paged_attention(const PagedAttentionParams& p) {
  if (p.head_w != nullptr) {  // attention, then the per-head projection (backend.h)
    paged_attention_head_composed(*this, p);
    return;
  }
  check_f32(*p.q, "q");
  check_f32(*p.out, "out");
  check_f32(*p.pool, "pool");
  const PagedBatch& b = *p.batch;
  const KvLayout& L = p.layout;
  DI_CHECK(p.num_q_heads % p.num_kv_heads == 0, "attention: {} q heads over {} kv heads",
           p.num_q_heads, p.num_kv_heads);
  // The query of (t, h) is q's row, then (if given) q_rope's row: dims [0, dq) and [dq, dqk).
  const int64_t dr = p.q_rope != nullptr ? p.q_rope->size(-1) : 0, dq = p.head_dim_qk - dr;
  if (p.q_rope != nullptr) check_f32(*p.q_rope, "q_rope");
  DI_CHECK(
      dq >= 0 && p.q->numel() == int64_t{b.num_tokens} * p.num_q_heads * dq &&
          (p.q_rope == nullptr || p.q_rope->numel() == int64_t{b.num_tokens} * p.num_q_heads * dr),
      "attention: q {} / q_rope {} for {} tokens x {} heads x {}", p.q->describe(),
      p.q_rope ? p.q_rope->describe() : std::string("none"), b.num_tokens, p.num_q_heads,
      p.head_dim_qk);
  const int32_t group = p.num_q_heads / p.num_kv_heads;
  const int32_t* qo = b.qo_indptr.data<int32_t>();
  const int32_t* kv_ptr = b.kv_indptr.data<int32_t>();
  const int32_t* kv_idx = b.kv_indices.data<int32_t>();
  const int32_t* last = b.kv_last_len.data<int32_t>();
  const int32_t* pos = b.positions.data<int32_t>();
  const float* pool = p.pool->f32();
  const int64_t dqk = p.head_dim_qk, dv = p.head_dim_v;

  // Sequence of each token, so the work can be split over (token, head) pairs.
  std::vector<int32_t> seq_of(static_cast<size_t>(b.num_tokens));
  for (int32_t s = 0; s < b.num_seqs; ++s)
    for (int32_t i = qo[s]; i < qo[s + 1]; ++i) seq_of[static_cast<size_t>(i)] = s;

  const int64_t work = int64_t{b.num_tokens} * p.num_q_heads;
  ThreadPool::global().parallel_for(work, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<double> acc(static_cast<size_t>(dv));
    for (int64_t w = begin; w < end; ++w) {
      const int64_t tok = w / p.num_q_heads, h = w % p.num_q_heads, kvh = h / group;
      const int32_t s = seq_of[static_cast<size_t>(tok)];
      const int32_t nblocks = kv_ptr[s + 1] - kv_ptr[s];
      float* o = p.out->f32() + (tok * p.num_q_heads + h) * dv;
      if (nblocks == 0) {  // a padding sequence: attends to nothing (as the CUDA kernels)
        std::fill(o, o + dv, 0.0f);
        continue;
      }
      const int64_t kv_len = int64_t{nblocks - 1} * L.block_size + last[s];
      const int64_t upto = pos[tok] + 1;  // causal: cache positions [0, pos]
      DI_CHECK(upto <= kv_len, "attention: token at position {} but only {} cached", pos[tok],
               kv_len);
      const float* q = p.q->f32() + (tok * p.num_q_heads + h) * dq;
      const float* q_rope = dr > 0 ? p.q_rope->f32() + (tok * p.num_q_heads + h) * dr : nullptr;
      scores.resize(static_cast<size_t>(upto));
      float max_score = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < upto; ++j) {
        const int64_t block = kv_idx[kv_ptr[s] + j / L.block_size];
        const float* entry = pool + block * L.block_stride() + L.layer_offset(p.layer) +
                             (j % L.block_size) * L.entry_size;
        const float* k = entry + p.k_offset + kvh * p.kv_head_stride;
        float dot = 0.0f;
        for (int64_t d = 0; d < dq; ++d) dot += q[d] * k[d];
        for (int64_t d = dq; d < dqk; ++d) dot += q_rope[d - dq] * k[d];
        scores[static_cast<size_t>(j)] = dot * p.scale;
        max_score = std::max(max_score, scores[static_cast<size_t>(j)]);
      }
      double denom = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < upto; ++j) {
        const double e = std::exp(static_cast<double>(scores[static_cast<size_t>(j)] - max_score));
        denom += e;
        const int64_t block = kv_idx[kv_ptr[s] + j / L.block_size];
        const float* entry = pool + block * L.block_stride() + L.layer_offset(p.layer) +
                             (j % L.block_size) * L.entry_size;
        const float* v = entry + p.v_offset + kvh * p.kv_head_stride;
        for (int64_t d = 0; d < dv; ++d) acc[static_cast<size_t>(d)] += e * v[d];
      }
      for (int64_t d = 0; d < dv; ++d) o[d] = static_cast<float>(acc[static_cast<size_t>(d)] / denom);
    }
  });
}

void CpuBackend::head_linear(const Tensor& x, const Tensor& w, Tensor& y) {
  check_f32(x, "x");
  check_f32(w, "w");
  const int64_t t = x.size(0), heads = x.size(1), k = x.size(2), n = w.size(1);
  DI_CHECK(w.size(0) == heads && w.size(2) == k && y.numel() == t * heads * n,
           "head_linear: x {} w {} y {}", x.describe(), w.describe(), y.describe());
  // One strided GEMM per head: y[:, h, :] = x[:, h, :] · w[h]ᵀ
  for (int64_t h = 0; h < heads; ++h)
    gemm_xwt_strided(x.f32() + h * k, heads * k, w.f32() + h * n * k, k, y.f32() + h * n,
                     heads * n, t, n, k);
}

void CpuBackend::moe_route(const Tensor& logits, const MoeRoutingParams& p, Tensor& topk_ids,
                           Tensor& topk_weights) {
  check_f32(logits, "router logits");
  const int64_t t = logits.size(0), e = p.num_experts, k = p.top_k;
  DI_CHECK(logits.size(1) == e && e % p.num_groups == 0 && p.topk_groups <= p.num_groups &&
               k <= e,
           "moe_route: logits {} with {} experts, {} groups (top {}), top-{}", logits.describe(),
           e, p.num_groups, p.topk_groups, k);
  const int64_t per_group = e / p.num_groups;
  std::vector<float> score(static_cast<size_t>(e)), choice(static_cast<size_t>(e));
  std::vector<float> group_score(static_cast<size_t>(p.num_groups));
  std::vector<int32_t> order(static_cast<size_t>(std::max<int64_t>(e, p.num_groups)));
  const bool on_logits = moe_route_on_logits(p);
  for (int64_t r = 0; r < t; ++r) {
    const float* l = logits.f32() + r * e;
    if (on_logits) {  // selection on the logits (backend.h)
      std::iota(order.begin(), order.begin() + e, 0);
      std::stable_sort(order.begin(), order.begin() + e,
                       [&](int32_t a, int32_t b2) { return l[a] > l[b2]; });
      const float mx = l[order[0]];
      double sum = 0.0;  // renormalised: over the k slots in slot order; else over all E
      if (p.renormalize) {
        for (int64_t j = 0; j < k; ++j)
          sum += std::exp(static_cast<double>(l[order[static_cast<size_t>(j)]] - mx));
      } else {
        sum = moe_softmax_denominator(l, e, mx);
      }
      for (int64_t j = 0; j < k; ++j) {
        const int32_t id = order[static_cast<size_t>(j)];
        const float wgt = static_cast<float>(std::exp(static_cast<double>(l[id] - mx)) / sum);
        topk_ids.data<int32_t>()[r * k + j] = id;
        topk_weights.f32()[r * k + j] = wgt * p.scaling;
      }
      continue;
    }
    if (p.scoring == MoeRoutingParams::Scoring::kSoftmax) {
      const float mx = *std::max_element(l, l + e);
      const double sum = moe_softmax_denominator(l, e, mx);
      for (int64_t i = 0; i < e; ++i)
        score[static_cast<size_t>(i)] = static_cast<float>(std::exp(static_cast<double>(l[i] - mx)) / sum);
    } else {
      for (int64_t i = 0; i < e; ++i) score[static_cast<size_t>(i)] = 1.0f / (1.0f + std::exp(-l[i]));
    }
    for (int64_t i = 0; i < e; ++i)
      choice[static_cast<size_t>(i)] =
          score[static_cast<size_t>(i)] + (p.correction_bias ? p.correction_bias->f32()[i] : 0.0f);
    if (p.num_groups > 1 && p.topk_groups < p.num_groups) {
      for (int64_t g = 0; g < p.num_groups; ++g) {
        const float* c = choice.data() + g * per_group;
        if (p.group_score == MoeRoutingParams::GroupScore::kMax) {
          group_score[static_cast<size_t>(g)] = *std::max_element(c, c + per_group);
        } else {
          float a = -INFINITY, b2 = -INFINITY;
          for (int64_t i = 0; i < per_group; ++i) {
            if (c[i] > a) {
              b2 = a;
              a = c[i];
            } else if (c[i] > b2) {
              b2 = c[i];
            }
          }
          group_score[static_cast<size_t>(g)] = per_group > 1 ? a + b2 : a;
        }
      }
      std::iota(order.begin(), order.begin() + p.num_groups, 0);
      std::stable_sort(order.begin(), order.begin() + p.num_groups, [&](int32_t a, int32_t b2) {
        return group_score[static_cast<size_t>(a)] > group_score[static_cast<size_t>(b2)];
      });
      // Experts outside the chosen groups get a choice score of 0 (as the reference does).
      std::vector<char> keep(static_cast<size_t>(p.num_groups), 0);
      for (int32_t g = 0; g < p.topk_groups; ++g) keep[static_cast<size_t>(order[static_cast<size_t>(g)])] = 1;
      for (int64_t i = 0; i < e; ++i)
        if (!keep[static_cast<size_t>(i / per_group)]) choice[static_cast<size_t>(i)] = 0.0f;
    }
    std::iota(order.begin(), order.begin() + e, 0);
    std::stable_sort(order.begin(), order.begin() + e, [&](int32_t a, int32_t b2) {
      return choice[static_cast<size_t>(a)] > choice[static_cast<size_t>(b2)];
    });
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += score[static_cast<size_t>(order[static_cast<size_t>(j)])];
    for (int64_t j = 0; j < k; ++j) {
      int32_t id = order[static_cast<size_t>(j)];
      float wgt = score[static_cast<size_t>(id)];
      if (p.renormalize) wgt /= (sum + p.renorm_eps);
      topk_ids.data<int32_t>()[r * k + j] = id;
      topk_weights.f32()[r * k + j] = wgt * p.scaling;
    }
  }
}

void CpuBackend::moe_experts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                             const ExpertWeights& w, Tensor& out) {
  check_f32(x, "x");
  const int64_t t = x.size(0), h = x.size(1), k = topk_ids.size(1);
  const int64_t num_experts = w.gate_up.size(0), two_i = w.gate_up.size(1), inter = two_i / 2;
  DI_CHECK(w.gate_up.size(2) == h && w.down.size(1) == h && w.down.size(2) == inter,
           "moe_experts: x {} gate_up {} down {}", x.describe(), w.gate_up.describe(),
           w.down.describe());
  std::memset(out.f32(), 0, out.nbytes());
  // Group the (token, slot) pairs by expert, then one GEMM pair per touched expert.
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(num_experts));
  for (int64_t i = 0; i < t * k; ++i) {
    int32_t e = topk_ids.data<int32_t>()[i];
    DI_CHECK(e < num_experts, "moe_experts: expert id {} of {}", e, num_experts);
    if (e < 0) continue;  // skipped entry
    rows[static_cast<size_t>(e)].push_back(i);
  }
  std::vector<float> xin, gu, act, y;
  for (int64_t e = 0; e < num_experts; ++e) {
    const auto& r = rows[static_cast<size_t>(e)];
    if (r.empty()) continue;
    const int64_t m = static_cast<int64_t>(r.size());
    xin.resize(static_cast<size_t>(m * h));
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(xin.data() + i * h, x.f32() + (r[static_cast<size_t>(i)] / k) * h,
                  static_cast<size_t>(h) * 4);
    gu.resize(static_cast<size_t>(m * two_i));
    gemm_xwt(xin.data(), w.gate_up.f32() + e * two_i * h, gu.data(), m, two_i, h);
    act.resize(static_cast<size_t>(m * inter));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < inter; ++j)
        act[static_cast<size_t>(i * inter + j)] =
            silu(gu[static_cast<size_t>(i * two_i + j)]) * gu[static_cast<size_t>(i * two_i + inter + j)];
    y.resize(static_cast<size_t>(m * h));
    gemm_xwt(act.data(), w.down.f32() + e * h * inter, y.data(), m, h, inter);
    for (int64_t i = 0; i < m; ++i) {
      const int64_t slot = r[static_cast<size_t>(i)];
      const float wgt = topk_weights.f32()[slot];
      float* o = out.f32() + (slot / k) * h;
      for (int64_t j = 0; j < h; ++j) o[j] += wgt * y[static_cast<size_t>(i * h + j)];
    }
  }
}

// ---- EPLB ops (issue #8) ----

void CpuBackend::moe_count_experts(const Tensor& topk_ids, Tensor& counts) {
  DI_CHECK(topk_ids.dtype() == DType::kI32 && counts.dtype() == DType::kI32 && counts.dim() == 1,
           "moe_count_experts: ids {} counts {}", topk_ids.describe(), counts.describe());
  const int64_t e = counts.size(0);
  const int32_t* ids = topk_ids.data<int32_t>();
  int32_t* c = counts.data<int32_t>();
  for (int64_t i = 0; i < topk_ids.numel(); ++i) {
    DI_CHECK(ids[i] < e, "moe_count_experts: expert id {} of {}", ids[i], e);
  }
  for (int64_t i = 0; i < topk_ids.numel(); ++i) {
    if (ids[i] >= 0) ++c[ids[i]];
  }
}

void CpuBackend::moe_map_replicas(const Tensor& topk_ids, const Tensor& replica_indptr,
                                  const Tensor& replica_slots, Tensor& phys_ids) {
  DI_CHECK(topk_ids.dtype() == DType::kI32 && phys_ids.dtype() == DType::kI32 &&
               replica_indptr.dtype() == DType::kI32 && replica_slots.dtype() == DType::kI32 &&
               topk_ids.dim() == 2 && phys_ids.shape() == topk_ids.shape() &&
               replica_indptr.dim() == 1 && replica_indptr.size(0) >= 2 &&
               replica_slots.dim() == 1 &&
               (topk_ids.numel() == 0 || topk_ids.raw() != phys_ids.raw()),
           "moe_map_replicas: ids {} indptr {} slots {} out {}", topk_ids.describe(),
           replica_indptr.describe(), replica_slots.describe(), phys_ids.describe());
  const int64_t t = topk_ids.size(0), k = topk_ids.size(1);
  const int64_t e = replica_indptr.size(0) - 1, s = replica_slots.size(0);
  const int32_t* ids = topk_ids.data<int32_t>();
  const int32_t* indptr = replica_indptr.data<int32_t>();
  const int32_t* slots = replica_slots.data<int32_t>();
  int32_t* out = phys_ids.data<int32_t>();
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t id = ids[r * k + j];
      DI_CHECK(id >= 0 && id < e, "moe_map_replicas: expert id {} of {}", id, e);
      const int32_t begin = indptr[id], n = indptr[id + 1] - begin;
      DI_CHECK(n > 0 && begin >= 0 && begin + n <= s,
               "moe_map_replicas: expert {} has replicas [{}, {}) of {}", id, begin, begin + n, s);
      out[r * k + j] = slots[begin + r % n];
    }
  }
}

void CpuBackend::copy_rows(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row,
                           int64_t rows) {
  DI_CHECK(src.dtype() == dst.dtype() && src.dim() >= 1 && dst.dim() >= 1 && src.size(0) > 0 &&
               dst.size(0) > 0 && src.numel() / src.size(0) == dst.numel() / dst.size(0),
           "copy_rows: {} -> {}", src.describe(), dst.describe());
  DI_CHECK(rows >= 0 && src_row >= 0 && dst_row >= 0 && src_row + rows <= src.size(0) &&
               dst_row + rows <= dst.size(0),
           "copy_rows: rows [{}, +{}) of {} -> [{}, +{}) of {}", src_row, rows, src.describe(),
           dst_row, rows, dst.describe());
  if (rows == 0) return;
  const size_t row_bytes = src.nbytes() / static_cast<size_t>(src.size(0));
  std::memmove(static_cast<char*>(dst.raw()) + static_cast<size_t>(dst_row) * row_bytes,
               static_cast<const char*>(src.raw()) + static_cast<size_t>(src_row) * row_bytes,
               static_cast<size_t>(rows) * row_bytes);
}

void qkv_rope_store_composed(Backend& be, const QkvRopeStoreParams& p) {
  DI_CHECK(p.qkv && p.q_out && p.pool && p.cos_sin && p.batch,
           "qkv_rope_store: missing qkv/q_out/pool/cos_sin/batch");
  DI_CHECK((p.q_norm == nullptr) == (p.k_norm == nullptr),
           "qkv_rope_store: q_norm and k_norm come together");
  const int64_t t = p.batch->num_tokens, d = p.head_dim, hq = p.num_q_heads, hkv = p.num_kv_heads;
  DI_CHECK(p.qkv->numel() == t * (hq + 2 * hkv) * d && p.q_out->numel() == t * hq * d,
           "qkv_rope_store: qkv {} / q_out {} for {} tokens x ({} + 2 x {}) heads x {}",
           p.qkv->describe(), p.q_out->describe(), t, hq, hkv, d);
  const Tensor qkv = p.qkv->reshape({t, (hq + 2 * hkv) * d});
  Tensor q = p.q_out->reshape({t, hq, d});
  Tensor k = be.empty({t, hkv, d}, p.qkv->dtype());
  Tensor v = be.empty({t, hkv * d}, p.qkv->dtype());
  be.copy_columns(qkv, 0, q);
  be.copy_columns(qkv, static_cast<int32_t>(hq * d), k);
  be.copy_columns(qkv, static_cast<int32_t>((hq + hkv) * d), v);
  if (p.q_norm != nullptr) {
    be.rms_norm(q, *p.q_norm, p.eps, q);
    be.rms_norm(k, *p.k_norm, p.eps, k);
  }
  be.rope(q, 0, static_cast<int32_t>(d), p.batch->positions, *p.cos_sin, false);
  be.rope(k, 0, static_cast<int32_t>(d), p.batch->positions, *p.cos_sin, false);
  be.store_kv(k, *p.pool, p.layout, p.layer, 0, *p.batch);
  be.store_kv(v, *p.pool, p.layout, p.layer, static_cast<int32_t>(hkv * d), *p.batch);
}

void mla_rope_store_composed(Backend& be, const MlaRopeStoreParams& p) {
  DI_CHECK(p.q && p.kv_a && p.q_nope && p.q_pe && p.pool && p.kv_a_norm && p.cos_sin && p.batch,
           "mla_rope_store: missing q/kv_a/q_nope/q_pe/pool/kv_a_norm/cos_sin/batch");
  const int64_t t = p.batch->num_tokens, hq = p.num_heads, dn = p.nope_dim, dr = p.rope_dim,
                lat = p.latent_dim, dqk = dn + dr;
  DI_CHECK(hq > 0 && dn > 0 && dr > 0 && dr % 2 == 0 && lat > 0 &&
               p.q_nope->numel() == t * hq * dn && p.q_pe->numel() == t * hq * dr &&
               p.kv_a_norm->numel() == lat && lat + dr <= p.layout.entry_size,
           "mla_rope_store: {} heads x ({} + {}), latent {}, q_nope {} q_pe {} norm {} entry {}",
           hq, dn, dr, lat, p.q_nope->describe(), p.q_pe->describe(), p.kv_a_norm->describe(),
           p.layout.entry_size);
  if (t == 0) return;
  const int64_t q_width = p.q->numel() / t, kv_width = p.kv_a->numel() / t;
  DI_CHECK(
      q_width * t == p.q->numel() && p.q_col >= 0 && p.q_col + hq * dqk <= q_width &&
          kv_width * t == p.kv_a->numel() && p.kv_col >= 0 && p.kv_col + lat + dr <= kv_width,
      "mla_rope_store: q {} (q part at {}, {} wide) / kv_a {} ([latent | k_pe] at {}, {} wide) "
      "for {} tokens",
      p.q->describe(), p.q_col, hq * dqk, p.kv_a->describe(), p.kv_col, lat + dr, t);
  const DType dt = p.q->dtype();
  const PagedBatch& b = *p.batch;
  // q: [q_nope | q_pe] per head, rope on the q_pe part, then the two parts apart.
  Tensor q = be.empty({t, hq, dqk}, dt);
  be.copy_columns(p.q->reshape({t, q_width}), p.q_col, q);
  be.rope(q, static_cast<int32_t>(dn), static_cast<int32_t>(dr), b.positions, *p.cos_sin,
          p.interleaved);
  const Tensor q_rows = q.reshape({t * hq, dqk});
  be.copy_columns(q_rows, 0, *p.q_nope);
  be.copy_columns(q_rows, static_cast<int32_t>(dn), *p.q_pe);
  // The new tokens' cache entries: [normalised latent | roped k_pe].
  const Tensor kv = p.kv_a->reshape({t, kv_width});
  Tensor latent = be.empty({t, lat}, dt);
  be.copy_columns(kv, p.kv_col, latent);
  be.rms_norm(latent, *p.kv_a_norm, p.eps, latent);
  Tensor k_pe = be.empty({t, 1, dr}, dt);
  be.copy_columns(kv, static_cast<int32_t>(p.kv_col + lat), k_pe);
  be.rope(k_pe, 0, static_cast<int32_t>(dr), b.positions, *p.cos_sin, p.interleaved);
  be.store_kv(latent, *p.pool, p.layout, p.layer, 0, b);
  be.store_kv(k_pe, *p.pool, p.layout, p.layer, static_cast<int32_t>(lat), b);
  if (p.w_uk_t != nullptr) {
    DI_CHECK(p.q_lat != nullptr, "mla_rope_store: w_uk_t without q_lat");
    be.head_linear(*p.q_nope, *p.w_uk_t, *p.q_lat);
  }
}

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace di
