// Llama-3.1-8B-shaped benchmark of the CUDA backend, with random bf16 weights generated on the GPU
// (no checkpoint: 16 GB never touches the disk). The forward pass below issues the same backend
// ops in the same order as src/model/llama.cpp (GqaModel::forward), so it measures the model code
// path; weights are device tensors filled by CudaBackend::fill_random (uniform, never zeros).
//
// Measures, each as a ratio to its roofline (4.28 TB/s copy bandwidth, 787 TFLOP/s cuBLAS bf16):
//   decode tok/s at batch 1 / 8 / 32 / 128 / 256 with a 512-token context (CUDA graph per bucket;
//     batch 1 also eager), roofline = max(bytes / BW, FLOPs / peak), bytes = weights + KV read;
//   prefill tok/s at 512 / 4K / 32K tokens (one sequence, eager);
//   the paged attention kernel alone, 8K causal prefill, in TFLOP/s: the default path (Hopper
//     warpgroup MMA, attention_prefill_wgmma.cu; DEEPINFER_ATTN_PREFILL=mma|simt picks the
//     others), the wgmma kernel, the mma.sync kernel's variants (attention_prefill_mma.cu, 4x1 /
//     8x1 / 4x2 warps x m-tiles) and the CUDA-core kernel, for before/after ratios.
//
//   bench_cuda_llama [--layers 32] [--skip-32k] [--skip-decode] [--attention-only]
//   (--attention-only: only the attention-alone lines, one layer of KV and no weights: seconds)
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <functional>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_graph.h"
#include "bench_timing.h"
#include "core/env.h"
#include "h200_ceilings.h"

namespace di {
namespace {

using di::bench::kCopyBw;
using di::bench::kPeakFlops;

struct Shape8B {
  int64_t hidden = 4096, inter = 14336, layers = 32, hq = 32, hkv = 8, d = 128, vocab = 128256;
  int64_t qkv_rows() const { return (hq + 2 * hkv) * d; }
  // Parameters read per decode step (embedding: only the gathered rows, ignored).
  double step_weight_params() const {
    const double per_layer = static_cast<double>(qkv_rows() * hidden + hidden * hq * d +
                                                 2 * inter * hidden + hidden * inter + 2 * hidden);
    return per_layer * static_cast<double>(layers) + static_cast<double>(vocab * hidden + hidden);
  }
};

struct Layer {
  Tensor input_norm, post_norm, qkv, o_proj, gate_up, down;
};

struct Weights {
  Tensor embed, norm, lm_head, cos_sin;
  std::vector<Layer> layers;
};

Tensor random_bf16(cuda::CudaBackend& be, const Shape& s, uint64_t seed, float scale) {
  Tensor t = be.empty(s, DType::kBF16);
  be.fill_random(t, seed, scale);
  return t;
}

Weights make_weights(cuda::CudaBackend& be, const Shape8B& m, int64_t max_ctx) {
  Weights w;
  uint64_t seed = 1;
  w.embed = random_bf16(be, {m.vocab, m.hidden}, seed++, 1.0f);
  w.norm = random_bf16(be, {m.hidden}, seed++, 1.0f);
  w.lm_head = random_bf16(be, {m.vocab, m.hidden}, seed++, 0.02f);
  for (int64_t l = 0; l < m.layers; ++l) {
    Layer L;
    L.input_norm = random_bf16(be, {m.hidden}, seed++, 1.0f);
    L.post_norm = random_bf16(be, {m.hidden}, seed++, 1.0f);
    L.qkv = random_bf16(be, {m.qkv_rows(), m.hidden}, seed++, 0.02f);
    L.o_proj = random_bf16(be, {m.hidden, m.hq * m.d}, seed++, 0.02f);
    L.gate_up = random_bf16(be, {2 * m.inter, m.hidden}, seed++, 0.02f);
    L.down = random_bf16(be, {m.hidden, m.inter}, seed++, 0.02f);
    w.layers.push_back(std::move(L));
  }
  Tensor cs = Tensor::empty({max_ctx, m.d}, DType::kF32);
  for (int64_t p = 0; p < max_ctx; ++p)
    for (int64_t j = 0; j < m.d / 2; ++j) {
      const double f = std::pow(500000.0, -2.0 * static_cast<double>(j) / static_cast<double>(m.d)) * static_cast<double>(p);
      cs.f32()[p * m.d + j] = static_cast<float>(std::cos(f));
      cs.f32()[p * m.d + m.d / 2 + j] = static_cast<float>(std::sin(f));
    }
  w.cos_sin = be.upload(cs, DType::kBF16);
  return w;
}

// The op sequence of GqaModel::forward (src/model/llama.cpp) for Llama (no q/k norm, no bias).
Tensor forward(cuda::CudaBackend& be, const Shape8B& m, const Weights& W, const Tensor& ids,
               const PagedBatch& batch, Tensor& pool, const Tensor& logit_rows) {
  const DType dt = DType::kBF16;
  const int64_t t = ids.numel(), hidden = m.hidden, d = m.d, hq = m.hq, hkv = m.hkv;
  const float eps = 1e-5f;
  const KvLayout layout{static_cast<int32_t>(pool.size(0)), static_cast<int32_t>(m.layers),
                        static_cast<int32_t>(pool.size(2)), static_cast<int32_t>(2 * hkv * d)};
  Tensor x = be.empty({t, hidden}, dt);
  be.embedding(ids, W.embed, x);
  Tensor h = be.empty({t, hidden}, dt), qkv = be.empty({t, (hq + 2 * hkv) * d}, dt);
  Tensor q = be.empty({t, hq, d}, dt);
  Tensor attn = be.empty({t, hq, d}, dt), o = be.empty({t, hidden}, dt);
  Tensor gu = be.empty({t, 2 * m.inter}, dt), act = be.empty({t, m.inter}, dt);
  be.rms_norm(x, W.layers[0].input_norm, eps, h);
  for (size_t l = 0; l < W.layers.size(); ++l) {
    const Layer& L = W.layers[l];
    be.linear(h, L.qkv, nullptr, qkv);
    QkvRopeStoreParams qp;  // split, rope, store: one kernel (as in llama.cpp)
    qp.qkv = &qkv;
    qp.q_out = &q;
    qp.pool = &pool;
    qp.layout = layout;
    qp.layer = static_cast<int32_t>(l);
    qp.num_q_heads = static_cast<int32_t>(hq);
    qp.num_kv_heads = static_cast<int32_t>(hkv);
    qp.head_dim = static_cast<int32_t>(d);
    qp.eps = eps;
    qp.cos_sin = &W.cos_sin;
    qp.batch = &batch;
    be.qkv_rope_store(qp);
    PagedAttentionParams ap;
    ap.q = &q;
    ap.out = &attn;
    ap.pool = &pool;
    ap.layout = layout;
    ap.layer = static_cast<int32_t>(l);
    ap.num_q_heads = static_cast<int32_t>(hq);
    ap.num_kv_heads = static_cast<int32_t>(hkv);
    ap.head_dim_qk = ap.head_dim_v = static_cast<int32_t>(d);
    ap.k_offset = 0;
    ap.v_offset = static_cast<int32_t>(hkv * d);
    ap.kv_head_stride = static_cast<int32_t>(d);
    ap.scale = 1.0f / std::sqrt(static_cast<float>(d));
    ap.batch = &batch;
    be.paged_attention(ap);
    be.linear(attn.reshape({t, hq * d}), L.o_proj, nullptr, o);
    be.add_rms_norm(o, x, L.post_norm, eps, h);
    be.linear(h, L.gate_up, nullptr, gu);
    be.silu_mul(gu, act);
    be.linear(act, L.down, nullptr, o);
    const Tensor& next = l + 1 < W.layers.size() ? W.layers[l + 1].input_norm : W.norm;
    be.add_rms_norm(o, x, next, eps, h);
  }
  const int64_t r = logit_rows.numel();
  Tensor picked = be.empty({r, hidden}, dt);
  be.embedding(logit_rows, x, picked);
  be.rms_norm(picked, W.norm, eps, picked);
  Tensor logits = be.empty({r, m.vocab}, DType::kF32);
  be.linear(picked, W.lm_head, nullptr, logits);
  return logits;
}

Tensor host_i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

}  // namespace
}  // namespace di

int main(int argc, char** argv) {
  if (!di::env::report_environment("bench_cuda_llama")) return 2;  // core/env.h
  using namespace di;
  Shape8B m;
  bool skip_32k = false, skip_decode = false, attention_only = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--layers") && i + 1 < argc) m.layers = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--skip-32k")) skip_32k = true;
    if (!std::strcmp(argv[i], "--attention-only")) attention_only = true;
    if (!std::strcmp(argv[i], "--skip-decode")) skip_decode = true;
  }
  if (attention_only) m.layers = 1;
  if (!cuda::cuda_available()) {
    std::printf("[bench] skipped: no CUDA device\n");
    return 0;
  }
  try {
    cuda::CudaBackend be;
    const int32_t block_size = 64, ctx = 512;
    const int64_t max_ctx = 32768 + 64;
    const auto t0 = std::chrono::steady_clock::now();
    Weights W = attention_only ? Weights{} : make_weights(be, m, max_ctx);
    const int32_t blocks_per_seq = (ctx + 1 + block_size - 1) / block_size;  // 9
    const int32_t max_batch = 256;
    const int32_t num_blocks = std::max(max_batch * blocks_per_seq, static_cast<int32_t>(max_ctx / block_size) + 1);
    const int64_t entry = 2 * m.hkv * m.d;
    Tensor pool = be.empty({num_blocks, m.layers, block_size, entry}, DType::kBF16);
    be.fill_random(pool, 999, 1.0f);
    be.synchronize();
    std::printf("[bench] setup: %.1f GB weights+KV generated in %.1f s, layers %lld\n",
                static_cast<double>(be.allocator().bytes_in_use()) / 1e9,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                static_cast<long long>(m.layers));
    std::fflush(stdout);
    const double wbytes = 2.0 * m.step_weight_params();
    const double kv_token_bytes = 2.0 * static_cast<double>(entry * m.layers);

    // ---- decode ----
    for (int32_t batch : {1, 8, 32, 128, 256}) {
      if (attention_only || skip_decode) break;
      auto fwd = [&](const Tensor& ids, const PagedBatch& b, const Tensor& rows) {
        return forward(be, m, W, ids, b, pool, rows);
      };
      cuda::DecodeGraph graph(be, fwd, batch, blocks_per_seq, block_size);
      cuda::DecodeStepInputs in;
      in.block_size = block_size;
      for (int32_t s = 0; s < batch; ++s) {
        std::vector<int32_t> table;
        for (int32_t b = 0; b < blocks_per_seq; ++b) table.push_back(s * blocks_per_seq + b);
        in.token_ids.push_back((s * 7919) % static_cast<int32_t>(m.vocab));
        in.positions.push_back(ctx);
        in.slots.push_back(table[ctx / block_size] * block_size + ctx % block_size);
        in.block_tables.push_back(table);
      }
      graph.capture();
      graph.run(in);
      const double ms = bench::median_event_ms(be, 2, batch <= 32 ? 20 : 10, [&] { graph.replay(); });
      const double bytes = wbytes + batch * (ctx + 1) * kv_token_bytes;
      const double flops = 2.0 * m.step_weight_params() * batch +
                           4.0 * batch * (ctx + 1) * static_cast<double>(m.hq * m.d * m.layers);
      const double roof_ms = 1e3 * std::max(bytes / kCopyBw, flops / kPeakFlops);
      std::printf("[bench] decode batch %3d ctx %d (graph): %8.3f ms/step %9.1f tok/s  roofline %.3f ms "
                  "(%s-bound) -> %5.1f%% of roofline\n",
                  batch, ctx, ms, 1e3 * batch / ms, roof_ms,
                  bytes / kCopyBw > flops / kPeakFlops ? "bytes" : "flops", 100.0 * roof_ms / ms);
      if (batch == 1) {
        const double eager = bench::median_event_ms(be, 1, 5, [&] { graph.run_eager(in); });
        std::printf("[bench] decode batch   1 ctx %d (eager): %8.3f ms/step %9.1f tok/s -> %5.1f%% of "
                    "roofline (target >= 85%%, 225 tok/s)\n",
                    ctx, eager, 1e3 / eager, 100.0 * roof_ms / eager);
      }
      std::fflush(stdout);
    }

    // ---- prefill (one sequence, eager); 32K runs last (slowest, after the attention line) ----
    auto prefill = [&](int32_t tokens) {
      std::vector<int32_t> ids, pos, slots;
      const int32_t nb = (tokens + block_size - 1) / block_size;
      for (int32_t p = 0; p < tokens; ++p) {
        ids.push_back((p * 31) % static_cast<int32_t>(m.vocab));
        pos.push_back(p);
        slots.push_back(p);  // blocks 0..nb-1 in order
      }
      std::vector<int32_t> blocks(static_cast<size_t>(nb));
      std::iota(blocks.begin(), blocks.end(), 0);
      PagedBatch b;
      b.positions = be.upload(host_i32(pos), DType::kI32);
      b.slot_mapping = be.upload(host_i32(slots), DType::kI32);
      b.qo_indptr = be.upload(host_i32({0, tokens}), DType::kI32);
      b.kv_indptr = be.upload(host_i32({0, nb}), DType::kI32);
      b.kv_indices = be.upload(host_i32(blocks), DType::kI32);
      b.kv_last_len = be.upload(host_i32({tokens - (nb - 1) * block_size}), DType::kI32);
      b.num_seqs = 1;
      b.num_tokens = tokens;
      b.max_kv_len = tokens;
      Tensor ids_d = be.upload(host_i32(ids), DType::kI32);
      Tensor rows = be.upload(host_i32({tokens - 1}), DType::kI32);
      const int warm = tokens <= 4096 ? 1 : 0, reps = tokens <= 512 ? 5 : (tokens <= 4096 ? 2 : 1);
      const double ms = bench::median_event_ms(be, warm, reps, [&] { forward(be, m, W, ids_d, b, pool, rows); });
      const double flops = 2.0 * (m.step_weight_params() - static_cast<double>(m.vocab * m.hidden)) * tokens +
                           2.0 * m.vocab * m.hidden +
                           4.0 * static_cast<double>(m.hq * m.d * m.layers) * tokens * (tokens + 1) / 2.0;
      const double roof_ms = 1e3 * flops / kPeakFlops;
      std::printf("[bench] prefill %5d tokens: %9.2f ms %9.0f tok/s  %6.1f TFLOP/s  roofline %.2f ms -> "
                  "%5.1f%% of 787 TFLOP/s (attention %s)\n",
                  tokens, ms, 1e3 * tokens / ms, flops / ms / 1e9, roof_ms, 100.0 * roof_ms / ms,
                  !be.attention_prefill_mma() ? "simt" : be.attention_prefill_wgmma() ? "wgmma" : "mma");
      std::fflush(stdout);
    };
    if (!attention_only) {
      prefill(512);
      prefill(4096);
      // before/after (issue #5): the same 4K prefill with attention on mma.sync, then CUDA cores
      const bool wgmma_on = be.attention_prefill_wgmma();
      be.set_attention_prefill_wgmma(false);
      prefill(4096);
      be.set_attention_prefill_wgmma(wgmma_on);
      const bool mma_on = be.attention_prefill_mma();
      be.set_attention_prefill_mma(false);
      prefill(4096);
      be.set_attention_prefill_mma(mma_on);
    }

    // ---- attention kernel alone: 8K causal prefill, Llama heads ----
    {
      const int32_t tokens = 8192, nb = tokens / block_size;
      std::vector<int32_t> pos, blocks(static_cast<size_t>(nb));
      for (int32_t p = 0; p < tokens; ++p) pos.push_back(p);
      std::iota(blocks.begin(), blocks.end(), 0);
      PagedBatch b;
      b.positions = be.upload(host_i32(pos), DType::kI32);
      b.slot_mapping = b.positions;
      b.qo_indptr = be.upload(host_i32({0, tokens}), DType::kI32);
      b.kv_indptr = be.upload(host_i32({0, nb}), DType::kI32);
      b.kv_indices = be.upload(host_i32(blocks), DType::kI32);
      b.kv_last_len = be.upload(host_i32({block_size}), DType::kI32);
      b.num_seqs = 1;
      b.num_tokens = tokens;
      b.max_kv_len = tokens;
      Tensor q = random_bf16(be, {tokens, m.hq, m.d}, 4242, 1.0f);
      Tensor o = be.empty({tokens, m.hq, m.d}, DType::kBF16);
      const KvLayout layout{num_blocks, static_cast<int32_t>(m.layers), block_size, static_cast<int32_t>(entry)};
      PagedAttentionParams ap;
      ap.q = &q;
      ap.out = &o;
      ap.pool = &pool;
      ap.layout = layout;
      ap.layer = 0;
      ap.num_q_heads = static_cast<int32_t>(m.hq);
      ap.num_kv_heads = static_cast<int32_t>(m.hkv);
      ap.head_dim_qk = ap.head_dim_v = static_cast<int32_t>(m.d);
      ap.v_offset = static_cast<int32_t>(m.hkv * m.d);
      ap.kv_head_stride = static_cast<int32_t>(m.d);
      ap.scale = 1.0f / std::sqrt(static_cast<float>(m.d));
      ap.batch = &b;
      const double ms = bench::median_event_ms(be, 1, 3, [&] { be.paged_attention(ap); });
      const double flops = 4.0 * static_cast<double>(m.hq * m.d) * tokens * (tokens + 1) / 2.0;
      std::printf("[bench] attention prefill 8K causal (32 q / 8 kv heads, d 128): %8.2f ms %6.1f TFLOP/s "
                  "-> %5.1f%% of 787 TFLOP/s (path %s)\n",
                  ms, flops / ms / 1e9, 100.0 * flops / ms / 1e9 / 787.0,
                  !be.attention_prefill_mma() ? "simt" : be.attention_prefill_wgmma() ? "wgmma" : "mma");
      // Before/after (issue #5): the wgmma kernel, the mma.sync variants (warps x m-tiles per
      // warp; its default is 4x1) and the CUDA-core kernel.
      const bool mma_on = be.attention_prefill_mma(), wgmma_on = be.attention_prefill_wgmma();
      be.set_attention_prefill_mma(true);
      be.set_attention_prefill_wgmma(true);
      const int64_t calls = be.prefill_wgmma_calls();
      const double ms_wg = bench::median_event_ms(be, 1, 5, [&] { be.paged_attention(ap); });
      std::printf("[bench] attention prefill 8K causal wgmma (warpgroup MMA, 128 rows x 128 keys): %8.2f ms "
                  "%6.1f TFLOP/s -> %5.1f%% of 787 (target >= 50%%)%s\n",
                  ms_wg, flops / ms_wg / 1e9, 100.0 * flops / ms_wg / 1e9 / 787.0,
                  be.prefill_wgmma_calls() > calls ? "" : " [NOT RUN: fell back]");
      be.set_attention_prefill_wgmma(false);
      for (auto [warps, mtiles] : {std::pair{4, 1}, std::pair{8, 1}, std::pair{4, 2}}) {
        be.set_attention_prefill_mma(true, warps, mtiles);
        const double msv = bench::median_event_ms(be, 1, 3, [&] { be.paged_attention(ap); });
        std::printf("[bench] attention prefill 8K causal mma %dx%d (warps x m-tiles, %d rows): %8.2f ms "
                    "%6.1f TFLOP/s -> %5.1f%% of 787\n",
                    warps, mtiles, warps * mtiles * 16, msv, flops / msv / 1e9, 100.0 * flops / msv / 1e9 / 787.0);
      }
      be.set_attention_prefill_mma(false);
      const double ms_simt = bench::median_event_ms(be, 1, 3, [&] { be.paged_attention(ap); });
      be.set_attention_prefill_mma(mma_on);
      be.set_attention_prefill_wgmma(wgmma_on);
      std::printf("[bench] attention prefill 8K causal simt (CUDA cores): %8.2f ms %6.1f TFLOP/s -> %5.1f%% of "
                  "787; speedup %.1fx (default path vs simt)\n",
                  ms_simt, flops / ms_simt / 1e9, 100.0 * flops / ms_simt / 1e9 / 787.0, ms_simt / ms);
    }
    if (!skip_32k && !attention_only) prefill(32768);
    be.synchronize();
  } catch (const std::exception& e) {
    std::printf("[bench] error: %s\n", e.what());
    return 1;
  }
  return 0;
}
