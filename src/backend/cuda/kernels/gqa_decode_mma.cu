// GQA decode attention on tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate).
//
// The CUDA-core decode kernel (gqa_decode.cuh) computes each q·k as a warp sum and runs the
// online softmax token by token for each head: at 8 q heads per kv head and a batch of 32 that is
// ~180 us per layer on the H200 for 67 MB of K/V (Qwen3-30B-A3B, ctx 2048: a chain of shuffles,
// not the bytes). Here the q heads of one kv head are the rows of an m16 tile (rows >= the group
// are zero), so one mma computes 16 heads x 8 keys over 16 dims.
//
// The generic kernel's split layout, so combine_splits_kernel merges the partials. A CTA of 4
// warps takes spc consecutive KV splits of one (kv head, sequence) one after the other (spc = 1,
// 2 or 4 by the grid: the next split's K/V rows are copied while one is computed and merged;
// the fixed costs of a CTA, q and the sequence's metadata, are paid once). Warp w takes the
// 16-key sub-tiles w, w + 4, ... of a split: cp.async of their K and V rows into the warp's shared
// memory (zero past the split end), S = Q·Kᵀ (2 n-tiles, D/16 k-steps; Q's A fragments held in
// registers), scores scaled into base 2, the online softmax per row over the sub-tile (row max over
// the 4 lanes of a row), P rounded to bf16 (the C fragments of S are P's A fragments), O += P·V (V
// by ldmatrix.trans). The four warp states merge in warp order in shared memory (where a CTA
// merges several splits, with one barrier: merge_direct, run 40). Partial max m is
// written in the natural-log units of the CUDA-core kernel (base-2 max times ln 2). Not bitwise
// equal to the CUDA-core kernel (P in bf16, another summation order); chosen by the model's group
// (not by the batch), so a sequence's bits do not depend on its batch.
//
// Launched as a PDL dependent of the rope/store kernel (DEEPINFER_PDL_DECODE bit 8, run 26): the
// first token's first sub-tile of entries stored by earlier steps is copied before
// griddepcontrol.wait, so those loads overlap the store kernel (and the qkv GEMV's tail); this
// step's entries and q are read after it.
//
// (The attention prologue fused into this kernel, opt-in since run 29 and slower on the H200, was
// removed in run 46; the last commit with it is afcdc3e: docs/cuda_backend.md "Fused decode
// attention".)
//
// H200, same call (docs/performance.md, run 15): Qwen3-30B-A3B (8 heads per kv head) batch 1 /
// 32 / 256 262.4 / 1,011 / 2,393 -> 274.5 / 1,201 / 3,778 tok/s; Llama-3.1-8B (4) batch 1 / 8 /
// 32 / 64 227.8 / 1,519 / 4,862 / 7,765 -> 229.3 / 1,548 / 5,224 / 8,698.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>

#include "backend/cuda/kernels/attention.h"
#include "backend/cuda/kernels/attention_prefill_mma_math.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gqa_decode.cuh"
#include "backend/cuda/kernels/gqa_decode_mma.cuh"

namespace di::cuda {
namespace {

using gqa_mma::kLn2;
using gqa_mma::kSub;
using gqa_mma::quad_sum;
constexpr int kWarps = 4;

template <int D, int G, int B>
struct GqaMmaShared {
  bf16 kv[B][kWarps][2][kSub][D + 8];  // [buffer][warp]: K rows, then V rows (16-byte row pad)
  float o[kWarps][G][D];               // the merge: each warp's unnormalised rows (q heads) of O
  float m[kWarps][G];                  // base-2 running max (-inf: no key)
  float l[kWarps][G];
  float cw[kWarps][G];  // the merge's weight of each warp's rows, and per row
  float mm[G];          // the max over the warps and the summed l
  float ll[G];
};

// CTA (x, kvh, s): splits x·spc .. x·spc + spc - 1 of kv head kvh of sequence s, one after the
// other; each warp's first sub-tile of the next split is copied (second buffer) while the current
// split is computed and merged. A split's arithmetic does not depend on spc (same sub-tiles per
// warp, same merge order), so neither do its bits.
// B: K/V buffers per warp (2 when spc > 1, else 1: less shared memory, more CTAs per SM).
// WM: the warps' merge with one barrier (merge_direct below; bitwise the three-barrier merge).
template <int D, int G, int B, bool WM>
__global__ void __launch_bounds__(kWarps * 32, 3)
    gqa_decode_mma_kernel(PagedAttentionKernelParams p, int spc) {
  DI_TRACE_SCOPE(kTraceGqaDecodeMma, 0);
  // The next (PDL-launched) kernel may start: the split combine, whose own start launches o_proj
  // and its 16.8 MB of early weight loads (Qwen3-30B-A3B). Before this kernel's wait those loads
  // sit in front of the rope/store kernel's and this kernel's reads after their waits (a
  // dependent's first read waits for what every SM has in flight: bench_cuda_xread), so by
  // default after the wait (run 42: Qwen3-30B-A3B batch 1 +2.0 %).
  const bool late_trigger = p.late_trigger != 0;
  if (!late_trigger) pdl_trigger();
  static_assert(G >= 1 && G <= 16, "the q heads of a kv head are the rows of one m16 tile");
  constexpr int kHalves = G > 8 ? 2 : 1;  // rows g (and g + 8) of a lane that are real heads
  constexpr int kKSteps = D / 16;
  constexpr int kDTiles = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sh = *reinterpret_cast<GqaMmaShared<D, G, B>*>(smem_raw);
  const int split0 = blockIdx.x * spc, kvh = blockIdx.y, s = blockIdx.z;
  const int nsp = B == 1 ? 1 : min(spc, p.num_splits - split0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const GqaDecodeSeq seq = gqa_decode_seq(p, s);
  const float c2 = p.scale * kLog2e;
  const bf16* layer_base = p.pool + p.layer_offset + int64_t{kvh} * p.kv_head_stride;
  const int64_t rows = int64_t{p.num_tokens} * p.num_q_heads;
  // gqa_mma::copy_subtile into this warp's part of buffer `buf`.
  auto copy_sub = [&](int base, int t1, int buf, int lo, int hi, bool zero_tail) {
    gqa_mma::copy_subtile<D>(p, seq.b0, layer_base, &sh.kv[buf][warp][0][0][0],
                             &sh.kv[buf][warp][1][0][0], base, t1, lo, hi, zero_tail, lane);
  };
  auto first_base = [&](int sp) { return sp * p.split_size + warp * kSub; };
  // Token i attends keys [0, limit_of(i)); split sp's part of them ends at split_end(sp, limit).
  auto limit_of = [&](int i) { return min(seq.kv_len, p.positions[i] + 1); };
  auto split_end = [&](int sp, int limit) { return min(limit, sp * p.split_size + p.split_size); };
  constexpr int kAll = 0x7fffffff;
  // Launched as a PDL dependent (launch_decode) of the store kernel: before pdl_wait only what
  // that kernel (and any still running before it) cannot be writing — the batch metadata, the
  // block ids and the first token's first sub-tile of entries stored by earlier steps
  // (positions < old_end) — so that these loads overlap the store. This step's entries and q
  // come after the wait.
  const int i0 = p.qo_indptr[s], i1 = p.qo_indptr[s + 1];
  const int old_end = seq.kv_len - (i1 - i0);
  if (i0 < i1) copy_sub(first_base(split0), split_end(split0, limit_of(i0)), 0, 0, old_end, true);
  cp_async_commit();  // (maybe empty) the first token's old entries
  pdl_wait();
  DI_TRACE_WAITED();
  if (late_trigger) pdl_trigger();
  // The merge with one barrier (WM): every warp stores its rows of O and its (m, l) per row, then
  // warp w merges d-tiles [w·kQ, w·kQ + kQ) of every row. Each lane of row h computes the merge
  // weights that thread h of the block merge computes (the same max, exps and warp-order sums,
  // per lane instead of once per row) and sums each element in warp order as the block merge
  // does: the same bits, with one __syncthreads where the block merge has three (and none before
  // a CTA's first merge).
  auto merge_direct = [&](bool barrier_first, int i, int sp, const float(&o)[kDTiles][4],
                          const float(&m)[2], const float(&l)[2]) {
    constexpr int kQ = kDTiles / kWarps;  // d-tiles per warp
    static_assert(kDTiles % kWarps == 0, "whole d-tiles per warp");
    if (barrier_first) __syncthreads();  // the previous merge's reads are done
#pragma unroll
    for (int r = 0; r < kHalves; ++r) {
      const int h = g + 8 * r;
      const float lr = quad_sum(l[r]);
      if (h < G) {
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt)
          *reinterpret_cast<float2*>(&sh.o[warp][h][dt * 8 + 2 * t4]) =
              make_float2(o[dt][2 * r], o[dt][2 * r + 1]);
        if (t4 == 0) {
          sh.m[warp][h] = m[r];
          sh.l[warp][h] = lr;
        }
      }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kHalves; ++r) {
      const int h = g + 8 * r;
      if (h >= G) continue;
      float mw[kWarps], cw[kWarps];
#pragma unroll
      for (int w = 0; w < kWarps; ++w) mw[w] = sh.m[w][h];
      float mm = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) mm = fmaxf(mm, mw[w]);
      float ll = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        cw[w] = 0.0f;
        if (mm != -INFINITY && mw[w] != -INFINITY) {
          cw[w] = fast_exp2(mw[w] - mm);
          ll += cw[w] * sh.l[w][h];
        }
      }
      const int64_t row = int64_t{i} * p.num_q_heads + int64_t{kvh} * G + h;
#pragma unroll 1
      for (int q = 0; q < kQ; ++q) {  // rolled: this code runs cold once per layer
        const int d = (warp * kQ + q) * 8 + 2 * t4;
        float ov[2] = {0.0f, 0.0f};
        if (mm != -INFINITY) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
#pragma unroll
            for (int w = 0; w < kWarps; ++w) {
              if (mw[w] == -INFINITY) continue;
              ov[e] += cw[w] * sh.o[w][h][d + e];
            }
          }
        }
        if (p.num_splits == 1) {
          *reinterpret_cast<__nv_bfloat162*>(p.out + row * D + d) =
              __halves2bfloat162(__float2bfloat16_rn(ll > 0.0f ? ov[0] / ll : 0.0f),
                                 __float2bfloat16_rn(ll > 0.0f ? ov[1] / ll : 0.0f));
        } else {
          *reinterpret_cast<float2*>(p.partial_o + (sp * rows + row) * D + d) =
              make_float2(ov[0], ov[1]);
          if (d == 0) {
            p.partial_ml[(sp * rows + row) * 2] = mm == -INFINITY ? -INFINITY : mm * kLn2;
            p.partial_ml[(sp * rows + row) * 2 + 1] = ll;
          }
        }
      }
    }
  };
  for (int i = i0; i < i1; ++i) {
    const int limit = limit_of(i);
    auto split_t1 = [&](int sp) { return split_end(sp, limit); };
    if (i == i0)
      copy_sub(first_base(split0), split_t1(split0), 0, old_end, kAll, false);
    else
      copy_sub(first_base(split0), split_t1(split0), 0, 0, kAll, true);
    cp_async_commit();
    // Q's A fragments (gqa_mma::load_q_frags).
    uint32_t qa[kKSteps][2 * kHalves];
    {
      const bf16* q0 = p.q + (int64_t{i} * p.num_q_heads + int64_t{kvh} * G) * D;
      gqa_mma::load_q_frags<D, G>(q0, lane, qa);
    }
    for (int n = 0; n < nsp; ++n) {
      const int sp = split0 + n, buf = n & (B - 1);
      if (n + 1 < nsp)
        copy_sub(first_base(sp + 1), split_t1(sp + 1), (n + 1) & (B - 1), 0, kAll, true);
      cp_async_commit();  // one group per iteration (maybe empty): the wait below stays exact
      cp_async_wait<1>();
      __syncwarp();
      const int t0 = sp * p.split_size, t1 = split_t1(sp);
      const bf16* k_s = &sh.kv[buf][warp][0][0][0];
      const bf16* v_s = &sh.kv[buf][warp][1][0][0];
      float o[kDTiles][4];
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
      float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g, g + 8 (base 2)
      for (int base = t0 + warp * kSub; base < t1; base += kWarps * kSub) {
        if (base != t0 + warp * kSub) {  // splits longer than 64 keys: later sub-tiles in place
          copy_sub(base, t1, buf, 0, kAll, true);
          cp_async_commit();
          cp_async_wait<0>();
          __syncwarp();
        }
        gqa_mma::attend_subtile<D, G>(qa, k_s, v_s, base, t1, c2, lane, o, m, l,
                                      n == 0 && i == i0 && base == t0 + warp * kSub);
      }
      if constexpr (WM) {
        merge_direct(n > 0 || i != i0, i, sp, o, m, l);
        continue;
      }
      // Merge the 4 warps (warp order); write the split's partial or, with one split, the output.
      __syncthreads();  // the previous split's merge reads are done
#pragma unroll
      for (int r = 0; r < kHalves; ++r) {
        const int h = g + 8 * r;
        const float lr = quad_sum(l[r]);
        if (h < G) {
#pragma unroll
          for (int dt = 0; dt < kDTiles; ++dt) {
            sh.o[warp][h][dt * 8 + 2 * t4] = o[dt][2 * r];
            sh.o[warp][h][dt * 8 + 2 * t4 + 1] = o[dt][2 * r + 1];
          }
          if (t4 == 0) {
            sh.m[warp][h] = m[r];
            sh.l[warp][h] = lr;
          }
        }
      }
      __syncthreads();
      // The merge weights once per row (thread h), not once per element: same exps, same sums in
      // warp order (same bits); per element only the four fmas remain after the wait.
      if (threadIdx.x < G) {
        const int h = threadIdx.x;
        float mm = -INFINITY;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) mm = fmaxf(mm, sh.m[w][h]);
        float ll = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          const float mw = sh.m[w][h];
          float cw = 0.0f;
          if (mm != -INFINITY && mw != -INFINITY) {
            cw = fast_exp2(mw - mm);
            ll += cw * sh.l[w][h];
          }
          sh.cw[w][h] = cw;
        }
        sh.mm[h] = mm;
        sh.ll[h] = ll;
      }
      __syncthreads();
      for (int idx = threadIdx.x; idx < G * D; idx += kWarps * 32) {
        const int h = idx / D, d = idx % D;
        const float mm = sh.mm[h], ll = sh.ll[h];
        float ov = 0.0f;
        if (mm != -INFINITY) {
#pragma unroll
          for (int w = 0; w < kWarps; ++w) {
            if (sh.m[w][h] == -INFINITY) continue;
            ov += sh.cw[w][h] * sh.o[w][h][d];
          }
        }
        const int64_t row = int64_t{i} * p.num_q_heads + int64_t{kvh} * G + h;
        if (p.num_splits == 1) {
          p.out[row * D + d] = __float2bfloat16_rn(ll > 0.0f ? ov / ll : 0.0f);
        } else {
          p.partial_o[(sp * rows + row) * D + d] = ov;
          if (d == 0) {
            p.partial_ml[(sp * rows + row) * 2] = mm == -INFINITY ? -INFINITY : mm * kLn2;
            p.partial_ml[(sp * rows + row) * 2 + 1] = ll;
          }
        }
      }
    }
    cp_async_wait<0>();
    // Buffers and the merge area are reused by the next token (WM: each warp refills only its own
    // buffers, and merge_direct's first barrier orders the merge area).
    if constexpr (!WM) __syncthreads();
  }
}

// -1 (the default): the one-barrier merge where a CTA merges several splits (spc > 1; run 40,
// H200: Qwen3-30B-A3B batch 32 +1.0 %, but batch 1, one split per CTA, -0.9 %); 0 never, 1 always.
EnvSetting g_merge_warp{"DEEPINFER_GQA_MMA_MERGE_WARP", -1};
std::atomic<int64_t> g_merge_warp_launches{0};

template <int D, int G, int B, bool WM>
void launch_dgbw(const PagedAttentionKernelParams& p, int spc, cudaStream_t stream) {
  constexpr int smem = static_cast<int>(sizeof(GqaMmaShared<D, G, B>));
  auto* kernel = gqa_decode_mma_kernel<D, G, B, WM>;
  open_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  const dim3 grid(ceil_div(p.num_splits, spc), static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>(p.num_seqs));
  PagedAttentionKernelParams q = p;
  q.late_trigger = attn_late_trigger_env();
  (void)launch_decode(kPdlGqaDecodeMma, kernel, grid, dim3(kWarps * 32), smem, stream, q, spc);
}
template <int D, int G, int B>
void launch_dgb(const PagedAttentionKernelParams& p, int spc, cudaStream_t stream) {
  // merge_direct stores pairs: 4-byte bf16 pairs of out, 8-byte float pairs of partial_o.
  const int mode = g_merge_warp.load();
  const bool wm = (mode == 1 || (mode < 0 && spc > 1)) &&
                  reinterpret_cast<uintptr_t>(p.out) % 4 == 0 &&
                  reinterpret_cast<uintptr_t>(p.partial_o) % 8 == 0;
  if (wm) {
    g_merge_warp_launches.fetch_add(1, std::memory_order_relaxed);
    launch_dgbw<D, G, B, true>(p, spc, stream);
    return;
  }
  launch_dgbw<D, G, B, false>(p, spc, stream);
}
template <int D, int G>
void launch_dg(const PagedAttentionKernelParams& p, int spc, cudaStream_t stream) {
  if (spc == 1)
    launch_dgb<D, G, 1>(p, 1, stream);
  else
    launch_dgb<D, G, 2>(p, spc, stream);
}

template <int D>
bool launch_d(const PagedAttentionKernelParams& p, int group, int spc, cudaStream_t stream) {
  switch (group) {
    case 1:
      launch_dg<D, 1>(p, spc, stream);
      return true;
    case 2:
      launch_dg<D, 2>(p, spc, stream);
      return true;
    case 4:
      launch_dg<D, 4>(p, spc, stream);
      return true;
    case 8:
      launch_dg<D, 8>(p, spc, stream);
      return true;
    case 16:
      launch_dg<D, 16>(p, spc, stream);
      return true;
    default:
      return false;
  }
}

EnvSetting g_mma_mode{"DEEPINFER_GQA_DECODE_MMA", -1};
EnvSetting g_splits_per_cta{"DEEPINFER_GQA_MMA_SPLITS_PER_CTA", 0};

}  // namespace

void set_gqa_decode_mma_merge_warp(int on) {
  g_merge_warp.store(on);
}
int gqa_decode_mma_merge_warp() {
  return g_merge_warp.load();
}
int64_t gqa_decode_mma_merge_warp_launches() {
  return g_merge_warp_launches.load(std::memory_order_relaxed);
}

int gqa_decode_mma_splits_per_cta() {
  return g_splits_per_cta.load();
}
void set_gqa_decode_mma_splits_per_cta(int spc) {
  g_splits_per_cta.store(spc);
}

int gqa_decode_mma_mode() {
  return g_mma_mode.load();
}
void set_gqa_decode_mma_mode(int mode) {
  g_mma_mode.store(mode);
}

bool gqa_decode_mma_for(int group, int head_dim) {
  const int mode = gqa_decode_mma_mode();
  if (mode == 0 || (head_dim != 64 && head_dim != 128)) return false;
  if (group != 1 && group != 2 && group != 4 && group != 8 && group != 16) return false;
  return mode == 1 || group >= 4;
}

namespace {

// The layout checks and the splits per CTA of a launch; 0 when the kernel does not take it.
int mma_splits_per_cta(const PagedAttentionKernelParams& p) {
  if (!gqa_decode_shape_ok(p)) return 0;
  const int group = p.num_q_heads / p.num_kv_heads;
  if (!gqa_decode_mma_for(group, p.head_dim_qk)) return 0;
  // 16-byte K / V rows (cp.async) and 4-byte q pairs.
  if ((p.k_offset | p.v_offset | p.kv_head_stride | p.entry_size) % 8 != 0) return 0;
  if (p.block_stride % 8 != 0 || p.layer_offset % 8 != 0 ||
      reinterpret_cast<uintptr_t>(p.pool) % 16 != 0)
    return 0;
  // Splits per CTA: 4 (or 2) while the grid keeps at least 3 waves of 2 CTAs per SM, else 1;
  // forced by set_gqa_decode_mma_splits_per_cta / DEEPINFER_GQA_MMA_SPLITS_PER_CTA (1..8).
  int spc = gqa_decode_mma_splits_per_cta();
  if (spc < 1 || spc > 8) {
    const int64_t units = int64_t{p.num_splits} * p.num_kv_heads * p.num_seqs;
    const int64_t min_ctas = int64_t{3} * 2 * (p.num_sms > 0 ? p.num_sms : 132);
    spc = units / 4 >= min_ctas ? 4 : units / 2 >= min_ctas ? 2 : 1;
  }
  return std::max(1, std::min(spc, p.num_splits));
}

}  // namespace

bool gqa_decode_mma_takes(const PagedAttentionKernelParams& p) {
  return mma_splits_per_cta(p) != 0 && reinterpret_cast<uintptr_t>(p.q) % 4 == 0;
}

bool launch_gqa_decode_mma(const PagedAttentionKernelParams& p, cudaStream_t stream) {
  if (!gqa_decode_mma_takes(p)) return false;
  const int spc = mma_splits_per_cta(p);
  const int group = p.num_q_heads / p.num_kv_heads;
  return p.head_dim_qk == 64 ? launch_d<64>(p, group, spc, stream)
                             : launch_d<128>(p, group, spc, stream);
}

}  // namespace di::cuda
