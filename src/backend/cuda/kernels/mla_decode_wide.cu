// Absorbed MLA decode for batches; see mla_decode_wide.h for the decomposition.
//
// Napkin math (DeepSeek-V2-Lite, 16 heads, 576 / 512, batch 32, context 2048): 75 MB of latent
// per layer, 17.5 us at 4.3 TB/s. Per 64-entry stage a CTA reads 75 KB and runs 16 x 64 x (576 +
// 512) x 2 = 2.2 MFLOP on mma.sync (~270 m16n8k16): per warp 36 + 32 mma, 18 + 20 ldmatrix, 18
// cp.async, five barriers. The cluster kernel spent ~1,500 instructions per warp per 32 entries
// (ncu: 25.4 M for the layer) at 0.39 issued per cycle per scheduler; this one ~1,000 per warp
// per 64 entries, 44.9 us per layer (run 16).
//
// mma.sync.m16n8k16 fragments, g = lane / 4, t = lane % 4 (lower 16 bits = lower index):
//   A (16 x 16): a0 = A[g][2t..+1]  a1 = A[g+8][2t..+1]  a2 = A[g][2t+8..+9]  a3 = A[g+8][2t+8..+9]
//   B (16 x 8):  b0 = B[2t..+1][g]  b1 = B[2t+8..+9][g]
//   C (16 x 8):  c0,c1 = C[g][2t..+1]  c2,c3 = C[g+8][2t..+1]
// ldmatrix x4 with lane L giving row (L & 7) + 8 ((L >> 3) & 1), column 8 (L >> 4) of a row-major
// 16 x 16 tile yields the A fragment (matrices: rows 0-7 / 8-15 x columns 0-7 / 8-15); the same
// addressing with .trans over V (rows = entries) yields the B fragments of two n-tiles. For
// Q·Kᵀ, K's rows are the n index: lane L gives key (L & 7) + 8 (L >> 4), column 8 ((L >> 3) & 1):
// b0, b1 of two n-tiles (16 keys) for one k step.
// Shared rows are padded by 8 bf16 (16 bytes): a row stride of 4 mod 32 words, so the 8 rows of
// an ldmatrix matrix hit distinct banks.
#include <algorithm>
#include <cfloat>
#include <climits>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/mla_decode_wide.h"
#include "backend/cuda/kernels/mla_token.cuh"

namespace di::cuda {
namespace {

constexpr int kRows = 16;  // heads per CTA: the m16 tile
constexpr int kMaxDqk = 576;
constexpr int kMaxDv = 512;
constexpr int kDefaultMinTokens = 16;
constexpr int kMaxChunkRounds = kMaxDqk / 8 / 4;  // 16-byte chunks of an entry per lane

// Dynamic shared memory, byte offsets: the query rows, two stage buffers of 8 · warps entries,
// P (bf16), the per-warp row maxima and (at the end) row sums, the partial-score exchange.
struct WideSmem {
  int q_off, kv_off, p_off, red_off, l_off, sx_off, total;
};
__host__ __device__ inline int p_stride(int warps) {
  return 8 * warps + 8;
}
__host__ __device__ inline WideSmem wide_smem(int warps, int dqk) {
  const int ld = pad16(dqk) + 8, tok = 8 * warps;
  WideSmem s;
  int off = 0;
  s.q_off = off;
  off += kRows * ld * 2;
  s.kv_off = off;
  off += 2 * tok * ld * 2;
  s.p_off = off;
  off += kRows * p_stride(warps) * 2;
  s.red_off = off;
  off += warps * kRows * 4;
  s.l_off = off;
  off += warps * kRows * 4;
  s.sx_off = off;  // the warps' partial scores (8 f32 per lane)
  off += warps * 32 * 8 * 4;
  s.total = (off + 15) & ~15;
  return s;
}

template <int kWarps>
__global__ void __launch_bounds__(kWarps * 32, kWarps == 4 ? 2 : 1)
    mla_wide_decode_kernel(MlaWideDecodeParams p) {
  pdl_trigger();  // the next (PDL-launched) GEMV may start loading its weights
  constexpr int kThreads = kWarps * 32;
  constexpr int kTok = 8 * kWarps;      // entries per stage: 16 keys per pair of warps
  constexpr int kGroups = 32 / kWarps;  // 16-column V groups per warp at dv = 512
  constexpr int kPld = 8 * kWarps + 8;  // P row stride (bf16)
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int last_s;
  const int t = blockIdx.x, tile = blockIdx.y, split = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;

  // 1. Sequence and context.
  const MlaTokenContext ctx = mla_token_context(p, t);
  const int kv_first = ctx.kv_first, n_kv = ctx.n_kv, old_end = ctx.old_end;
  const int own_splits = max(1, (n_kv + p.split_size - 1) / p.split_size);
  if (split >= own_splits) return;  // uniform: nothing of this token here

  const int h0 = tile * kRows, nr = min(kRows, p.num_heads - h0);
  const int kv_begin = split * p.split_size, kv_end = min(n_kv, kv_begin + p.split_size);
  const int nstages = kv_end > kv_begin ? (kv_end - kv_begin + kTok - 1) / kTok : 0;
  const int dqk = p.dqk, dv = p.dv, dpad = pad16(dqk), ld = dpad + 8, chunks = dpad / 8;
  const WideSmem L = wide_smem(kWarps, dqk);
  bf16* q_s = reinterpret_cast<bf16*>(smem + L.q_off);
  bf16* kv_s = reinterpret_cast<bf16*>(smem + L.kv_off);
  bf16* p_s = reinterpret_cast<bf16*>(smem + L.p_off);
  float* red_s = reinterpret_cast<float*>(smem + L.red_off);
  float* l_s = reinterpret_cast<float*>(smem + L.l_off);
  float4* sx_s = reinterpret_cast<float4*>(smem + L.sx_off);

  // Lane L of warp w copies entry 8 w + (L & 7) of a stage, 16-byte chunks L / 8 + 4 k (one
  // instruction of the warp: 64 contiguous bytes of each of its 8 entries). Its entry's address
  // (null past the split):
  const int bs = p.block_size, bs_shift = (bs & (bs - 1)) == 0 ? __ffs(bs) - 1 : -1;
  auto stage_ptr = [&](int i) -> const bf16* {
    const int tok = kv_begin + i * kTok + warp * 8 + (lane & 7);
    if (tok >= kv_end) return nullptr;
    const int bi = bs_shift >= 0 ? tok >> bs_shift : tok / bs;  // a shift for 2^n block sizes
    const int64_t blk = p.kv_indices[kv_first + bi];
    return p.pool + blk * p.block_stride + p.layer_offset + int64_t{tok - bi * bs} * p.entry_size;
  };
  // Stage i's entry of this lane -> buffer i % 2 when its token index is in [lo, hi); with `pad`
  // a row past the split becomes zeros (P is 0 there, but 0 x garbage could be NaN). Padding
  // columns (dqk .. dpad) are zeros.
  auto fetch = [&](int i, const bf16* mine, int lo, int hi, bool pad) {
    const int tok = kv_begin + i * kTok + warp * 8 + (lane & 7);
    const bool in = mine != nullptr && tok >= lo && tok < hi;
    if (!in && !(pad && mine == nullptr)) return;
    bf16* dst = kv_s + ((i & 1) * kTok + warp * 8 + (lane & 7)) * ld;
    if (in && chunks == 4 * kMaxChunkRounds && dqk == dpad) {  // a whole 576-wide entry
      const bf16* src = mine + 8 * (lane >> 3);
      bf16* d = dst + 8 * (lane >> 3);
#pragma unroll
      for (int k = 0; k < kMaxChunkRounds; ++k) cp_async16(d + 32 * k, src + 32 * k, 16);
      return;
    }
#pragma unroll
    for (int k = 0; k < kMaxChunkRounds; ++k) {
      const int c = (lane >> 3) + 4 * k;
      if (c < chunks) {
        const bool valid = in && c * 8 < dqk;
        cp_async16(dst + c * 8, valid ? mine + c * 8 : p.pool, valid ? 16 : 0);
      }
    }
  };

  // Before pdl_wait only what the previous kernel cannot be writing: metadata, block ids, the
  // entries of earlier steps (< old_end).
  const bf16* ptr0 = nstages > 0 ? stage_ptr(0) : nullptr;
  const bf16* ptr1 = nstages > 1 ? stage_ptr(1) : nullptr;
  if (nstages > 0) {
    fetch(0, ptr0, 0, old_end, true);
    if (nstages > 1) fetch(1, ptr1, 0, old_end, true);
    cp_async_commit();  // group 0: the old entries of stages 0 and 1
  }
  pdl_wait();
  if (nstages > 0) {
    fetch(0, ptr0, old_end, INT_MAX, false);  // this step's entries
    if (nstages > 1) fetch(1, ptr1, old_end, INT_MAX, false);
    // Query rows (head h0 + r of token t): dims [0, dq) from q, [dq, dqk) from q_rope (a chunk
    // of 8 never straddles the two); rows >= nr and the padding columns zero.
    const int dq = p.q_rope != nullptr ? p.dq : dqk;
    for (int r = warp; r < kRows; r += kWarps) {
      const int64_t qrow = int64_t{t} * p.num_heads + h0 + r;
      for (int c = lane; c < chunks; c += 32) {
        const bool valid = r < nr && c * 8 < dqk;
        const bf16* src = p.pool;
        if (valid)
          src = c * 8 < dq ? p.q + qrow * dq + c * 8 : p.q_rope + qrow * (dqk - dq) + (c * 8 - dq);
        cp_async16(q_s + r * ld + c * 8, src, valid ? 16 : 0);
      }
    }
    cp_async_commit();  // group 1: the rest of stages 0 and 1, and the query
  }

  // 2. The stages. Warp w scores keys 16 (w % G) .. + 16 of a stage (G = warps / 2 key groups)
  // over half of the k steps (w / G), with that half's query fragments held in registers from
  // stage 0 on; the two halves add their partial scores through shared memory. Every thread
  // keeps the running max of rows g and g + 8 (base 2, the same in all threads: each takes the
  // max over the key groups' maxima in order); the first half's warps keep shares of the row
  // sums (summed over the CTA at the end).
  constexpr int kKeyGroups = kWarps / 2;
  constexpr int kMaxHalf = kMaxDqk / 16 / 2;
  float acc[kGroups][2][4];
#pragma unroll
  for (int j = 0; j < kGroups; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][h][e] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
  const float sl2 = p.scale * kLog2e;
  const int nsteps = dpad / 16, half_steps = (nsteps + 1) / 2;
  const int kgrp = warp % kKeyGroups, khalf = warp / kKeyGroups;
  const int ks0 = khalf * half_steps, my_steps = khalf ? nsteps - half_steps : half_steps;
  const int frag_row = (lane & 7) + 8 * ((lane >> 3) & 1), frag_col = 8 * (lane >> 4);
  const bf16* pa = p_s + frag_row * kPld + frag_col;
  const bf16* next_ptr = nstages > 2 ? stage_ptr(2) : nullptr;
  uint32_t qf[kMaxHalf][4];  // A fragments of k steps ks0 .. ks0 + my_steps

  for (int i = 0; i < nstages; ++i) {
    // Stage i needs groups 0 and 1 (i < 2) or the group committed in iteration i - 2; the
    // newest group (iteration i - 1's: stage i + 1) may stay in flight.
    if (i == 0)
      cp_async_wait<0>();
    else
      cp_async_wait<1>();
    __syncthreads();
    if (i == 0) {
      const bf16* qa = q_s + frag_row * ld + frag_col + ks0 * 16;
#pragma unroll
      for (int j = 0; j < kMaxHalf; ++j)
        if (j < my_steps) ldsm_x4(qf[j], qa + j * 16);
    }
    const bf16* k_s = kv_s + (i & 1) * kTok * ld;
    const int n = min(kTok, kv_end - (kv_begin + i * kTok));

    // Partial S of keys 16 kgrp .. + 16 (two n-tiles) over this warp's k steps; two chains.
    float c[2][2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) c[h][nt][e] = 0.0f;
    {
      const bf16* kb =
          k_s + (16 * kgrp + (lane & 7) + 8 * (lane >> 4)) * ld + 8 * ((lane >> 3) & 1) + ks0 * 16;
      if (my_steps == kMaxHalf) {
        // The 576-wide latent: no predicates, so step j + 1's fragments load under step j's mma
        // (double-buffered by hand; with predicated steps the loads serialise behind the mma).
        uint32_t b[2][4];
        ldsm_x4(b[0], kb);
#pragma unroll
        for (int j = 0; j < kMaxHalf; ++j) {
          if (j + 1 < kMaxHalf) ldsm_x4(b[(j + 1) & 1], kb + (j + 1) * 16);
          mma_bf16_16816(c[j & 1][0], qf[j], b[j & 1][0], b[j & 1][1]);
          mma_bf16_16816(c[j & 1][1], qf[j], b[j & 1][2], b[j & 1][3]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kMaxHalf; ++j) {
          if (j < my_steps) {
            uint32_t b[4];
            ldsm_x4(b, kb + j * 16);
            mma_bf16_16816(c[j & 1][0], qf[j], b[0], b[1]);
            mma_bf16_16816(c[j & 1][1], qf[j], b[2], b[3]);
          }
        }
      }
    }
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      sx_s[(warp * 32 + lane) * 2 + nt] =
          make_float4(c[0][nt][0] + c[1][nt][0], c[0][nt][1] + c[1][nt][1],
                      c[0][nt][2] + c[1][nt][2], c[0][nt][3] + c[1][nt][3]);
    }
    __syncthreads();  // both halves' partial scores
    {
      const int other = (kgrp + kKeyGroups * (1 - khalf)) * 32 + lane;
      const int mine = warp * 32 + lane;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        // Half 0 + half 1 in that order in both warps (the same bits).
        const float4 a = sx_s[(khalf ? other : mine) * 2 + nt];
        const float4 b = sx_s[(khalf ? mine : other) * 2 + nt];
        const int key = 16 * kgrp + 8 * nt + 2 * t4;
        s[nt][0] = key < n ? (a.x + b.x) * sl2 : -INFINITY;
        s[nt][1] = key + 1 < n ? (a.y + b.y) * sl2 : -INFINITY;
        s[nt][2] = key < n ? (a.z + b.z) * sl2 : -INFINITY;
        s[nt][3] = key + 1 < n ? (a.w + b.w) * sl2 : -INFINITY;
      }
    }
    if (khalf == 0) {
      float mx_lo = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
      float mx_hi = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
#pragma unroll
      for (int o = 1; o <= 2; o <<= 1) {
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, o));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, o));
      }
      if (t4 == 0) {
        red_s[kgrp * kRows + g] = mx_lo;
        red_s[kgrp * kRows + g + 8] = mx_hi;
      }
    }
    __syncthreads();
    float st_lo = red_s[g], st_hi = red_s[g + 8];
#pragma unroll
    for (int w = 1; w < kKeyGroups; ++w) {
      st_lo = fmaxf(st_lo, red_s[w * kRows + g]);
      st_hi = fmaxf(st_hi, red_s[w * kRows + g + 8]);
    }
    // The stage has an entry, so the new max is finite; the first stage's correction is 0.
    const float mn_lo = fmaxf(m_lo, st_lo), mn_hi = fmaxf(m_hi, st_hi);
    const float corr_lo = fast_exp2(m_lo - mn_lo), corr_hi = fast_exp2(m_hi - mn_hi);
    m_lo = mn_lo;
    m_hi = mn_hi;
    if (khalf == 0) {
      float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int key = 16 * kgrp + 8 * nt + 2 * t4;
        const float p0 = fast_exp2(s[nt][0] - mn_lo), p1 = fast_exp2(s[nt][1] - mn_lo);
        const float p2 = fast_exp2(s[nt][2] - mn_hi), p3 = fast_exp2(s[nt][3] - mn_hi);
        *reinterpret_cast<uint32_t*>(p_s + g * kPld + key) = pack_bf16(p0, p1);
        *reinterpret_cast<uint32_t*>(p_s + (g + 8) * kPld + key) = pack_bf16(p2, p3);
        sum_lo += p0 + p1;
        sum_hi += p2 + p3;
      }
      l_lo = l_lo * corr_lo + sum_lo;
      l_hi = l_hi * corr_hi + sum_hi;
    }
    // O *= corr, unless no row of the tile saw a new max (most stages past the first few).
    if (!__all_sync(0xffffffffu, corr_lo == 1.0f && corr_hi == 1.0f)) {
#pragma unroll
      for (int j = 0; j < kGroups; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          acc[j][h][0] *= corr_lo;
          acc[j][h][1] *= corr_lo;
          acc[j][h][2] *= corr_hi;
          acc[j][h][3] *= corr_hi;
        }
    }
    __syncthreads();  // P complete

    // O += P·V: V = the first dv columns of the staged entries.
    const bf16* vb = k_s + frag_row * ld + frag_col;
    if (dv == kMaxDv) {  // every column group: all of a k step's fragments load, then the mma
#pragma unroll
      for (int ks = 0; ks < kTok / 16; ++ks) {
        uint32_t a[4], b[kGroups][4];
        ldsm_x4(a, pa + ks * 16);
#pragma unroll
        for (int j = 0; j < kGroups; ++j)
          ldsm_x4_trans(b[j], vb + ks * 16 * ld + (warp + kWarps * j) * 16);
#pragma unroll
        for (int j = 0; j < kGroups; ++j) {
          mma_bf16_16816(acc[j][0], a, b[j][0], b[j][1]);
          mma_bf16_16816(acc[j][1], a, b[j][2], b[j][3]);
        }
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < kTok / 16; ++ks) {
        uint32_t a[4];
        ldsm_x4(a, pa + ks * 16);
#pragma unroll
        for (int j = 0; j < kGroups; ++j) {
          const int col0 = (warp + kWarps * j) * 16;
          if (col0 >= dv) break;  // warp-uniform
          uint32_t b[4];
          ldsm_x4_trans(b, vb + ks * 16 * ld + col0);
          mma_bf16_16816(acc[j][0], a, b[0], b[1]);
          mma_bf16_16816(acc[j][1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // this buffer, P and the maxima are rewritten next
    if (i + 2 < nstages) fetch(i + 2, next_ptr, 0, INT_MAX, true);
    cp_async_commit();
    if (i + 3 < nstages) next_ptr = stage_ptr(i + 3);  // its block ids load under stage i + 1
  }
  cp_async_wait<0>();

  // 3. Row sums over the CTA (lanes t4 = 0 of each warp, then warps in order).
#pragma unroll
  for (int o = 1; o <= 2; o <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, o);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, o);
  }
  if (t4 == 0) {
    l_s[warp * kRows + g] = l_lo;
    l_s[warp * kRows + g + 8] = l_hi;
  }
  __syncthreads();
  float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    sum_lo += l_s[w * kRows + g];
    sum_hi += l_s[w * kRows + g + 8];
  }

  const int64_t rows_total = int64_t{p.num_tokens} * p.num_heads;
  const int64_t row0 = int64_t{t} * p.num_heads + h0;  // global row of tile row 0
  // This thread's O elements (rows g, g + 8 of the tile; 2 columns per n-tile) to `store`.
  auto for_each_out = [&](auto&& store) {
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      const int col0 = (warp + kWarps * j) * 16;
      if (col0 >= dv) break;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = col0 + 8 * h + 2 * t4;
        if (g < nr) store(g, col, acc[j][h][0], acc[j][h][1], false);
        if (g + 8 < nr) store(g + 8, col, acc[j][h][2], acc[j][h][3], true);
      }
    }
  };
  if (own_splits == 1) {
    const float inv_lo = sum_lo > 0.0f ? 1.0f / sum_lo : 0.0f;
    const float inv_hi = sum_hi > 0.0f ? 1.0f / sum_hi : 0.0f;
    for_each_out([&](int r, int col, float a, float b, bool hi) {
      const float inv = hi ? inv_hi : inv_lo;
      *reinterpret_cast<__nv_bfloat162*>(p.out + (row0 + r) * dv + col) =
          __floats2bfloat162_rn(a * inv, b * inv);
    });
    return;
  }

  // 4. Several splits: this split's partial, then the last CTA to count merges them all.
  float* po = p.partial_o + (int64_t{split} * rows_total + row0) * dv;
  for_each_out([&](int r, int col, float a, float b, bool) {
    *reinterpret_cast<float2*>(po + int64_t{r} * dv + col) = make_float2(a, b);
  });
  if (warp == 0 && t4 == 0) {
    float* ml = p.partial_ml + (int64_t{split} * rows_total + row0) * 2;
    if (g < nr) {
      ml[2 * g] = m_lo;
      ml[2 * g + 1] = sum_lo;
    }
    if (g + 8 < nr) {
      ml[2 * (g + 8)] = m_hi;
      ml[2 * (g + 8) + 1] = sum_hi;
    }
  }
  // NOTES: the barrier orders every thread's partial writes before thread 0's fence, which is
  // cumulative, and the fence before its atomic: the CTA that counts last sees every partial.
  uint32_t* counter = p.counters + int64_t{t} * p.head_tiles + tile;
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    const bool last = atomicAdd(counter, 1u) == static_cast<uint32_t>(own_splits - 1);
    if (last) __threadfence();  // acquire: the other splits' partials (read through L2)
    last_s = last;
  }
  __syncthreads();
  if (!last_s) return;

  // Weight of split s for row r: 2^(m_s - max) / sum, in the stage buffers.
  float* w_s = reinterpret_cast<float*>(kv_s);  // [nr][own_splits] (host-checked size)
  const int64_t ml_stride = rows_total * 2;
  for (int r = warp; r < nr; r += kWarps) {
    const float* ml = p.partial_ml + (row0 + r) * 2;
    float mx = -INFINITY;
    for (int sp = lane; sp < own_splits; sp += 32) mx = fmaxf(mx, __ldcg(ml + sp * ml_stride));
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int sp = lane; sp < own_splits; sp += 32) {
      const float w = fast_exp2(__ldcg(ml + sp * ml_stride) - mx);
      w_s[r * own_splits + sp] = w;
      sum += w * __ldcg(ml + sp * ml_stride + 1);
    }
    sum = warp_sum(sum);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    __syncwarp();
    for (int sp = lane; sp < own_splits; sp += 32) w_s[r * own_splits + sp] *= inv;
  }
  __syncthreads();
  // kItems float4 of the tile per thread per round, each split's loads of a round in flight
  // together (the tile is 16 x 512 f32 = 8 float4 per thread at 8 warps).
  constexpr int kItems = 8;
  const int per_row = dv / 4, items = nr * per_row;
  const int64_t split_stride = rows_total * dv;
  for (int base = 0; base < items; base += kItems * kThreads) {
    float4 o[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) o[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int sp = 0; sp < own_splits; ++sp) {
      float4 v[kItems];
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const int idx = base + k * kThreads + tid;
        const int r = idx / per_row, col = (idx % per_row) * 4;
        if (idx < items)
          v[k] = __ldcg(reinterpret_cast<const float4*>(p.partial_o + sp * split_stride +
                                                        (row0 + r) * dv + col));
      }
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const int idx = base + k * kThreads + tid;
        if (idx >= items) continue;
        const float w = w_s[(idx / per_row) * own_splits + sp];
        o[k].x += w * v[k].x;
        o[k].y += w * v[k].y;
        o[k].z += w * v[k].z;
        o[k].w += w * v[k].w;
      }
    }
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int idx = base + k * kThreads + tid;
      if (idx >= items) continue;
      const int r = idx / per_row, col = (idx % per_row) * 4;
      __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(p.out + (row0 + r) * dv + col);
      dst[0] = __floats2bfloat162_rn(o[k].x, o[k].y);
      dst[1] = __floats2bfloat162_rn(o[k].z, o[k].w);
    }
  }
  // Every split of this (token, head tile) has counted; nothing else touches the counter before
  // the kernel ends, so a plain store readies it for the next launch (and graph replay).
  if (tid == 0) *counter = 0u;
}

int g_warps_override = 0, g_split_override = 0;

// 8 warps (64-entry stages, one CTA per SM) below kFourWarpTokens decode tokens, 4 (32-entry
// stages, two CTAs per SM) from there: V2-Lite batch 32 / 64 3,056 / 4,959 tok/s with 8 against
// 2,985 / 4,924 with 4; batch 256 14,412 against 14,772 (H200, run 16 call 4).
constexpr int kFourWarpTokens = 128;
int warps_setting(int32_t num_tokens) {
  if (g_warps_override != 0) return g_warps_override == 4 ? 4 : 8;
  static const int env = di::env::get_int("DEEPINFER_MLA_WIDE_WARPS", 0);
  if (env == 4 || env == 8) return env;
  return num_tokens >= kFourWarpTokens ? 4 : 8;
}

template <int kWarps>
cudaError_t launch_warps(const MlaWideDecodeParams& p, cudaStream_t stream) {
  auto* kernel = &mla_wide_decode_kernel<kWarps>;
  const int smem = wide_smem(kWarps, p.dqk).total;
  cudaError_t err = open_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  if (err != cudaSuccess) return err;
  return launch_pdl(kernel,
                    dim3(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(p.head_tiles),
                         static_cast<unsigned>(p.num_splits)),
                    dim3(kWarps * 32), static_cast<size_t>(smem), stream, p);
}

}  // namespace

bool mla_wide_decode_supported(int32_t num_kv_heads, int32_t k_offset, int32_t v_offset,
                               int32_t dqk, int32_t dv, int32_t entry_size) {
  return num_kv_heads == 1 && k_offset == 0 && v_offset == 0 && dv > 0 && dv % 16 == 0 &&
         dv <= kMaxDv && dv <= dqk && dqk % 8 == 0 && dqk <= kMaxDqk && entry_size % 8 == 0 &&
         entry_size >= dqk;
}

int32_t mla_wide_min_tokens() {
  static const int32_t v = [] {
    const int n = di::env::get_int("DEEPINFER_MLA_WIDE_MIN_TOKENS", kDefaultMinTokens);
    return n > 0 ? n : kDefaultMinTokens;
  }();
  return v;
}

void set_mla_wide_overrides(int32_t warps, int32_t split) {
  g_warps_override = warps;
  g_split_override = split;
}

MlaWideDecodePlan plan_mla_wide_decode(int32_t num_tokens, int32_t max_kv_len, int32_t num_heads,
                                       int32_t dqk, int32_t dv, int32_t num_sms) {
  static const int32_t kSplitEnvValue = di::env::get_int("DEEPINFER_MLA_WIDE_SPLIT", 0);
  const int32_t kSplitEnv = g_split_override > 0 ? g_split_override : kSplitEnvValue;
  MlaWideDecodePlan plan;
  plan.warps = warps_setting(num_tokens);
  const int64_t tok = 8 * plan.warps, ctas_per_sm = plan.warps == 4 ? 2 : 1;
  plan.head_tiles = (num_heads + kRows - 1) / kRows;
  const int64_t kv = max_kv_len > 0 ? max_kv_len : 1;
  const int64_t stages = (kv + tok - 1) / tok;
  int64_t split;
  if (kSplitEnv > 0) {
    split = (kSplitEnv + tok - 1) / tok * tok;
  } else {
    // The fewest stages per CTA with the longest context's CTAs in one wave.
    const int64_t slots = int64_t{num_sms > 0 ? num_sms : 132} * ctas_per_sm;
    const int64_t work = stages * num_tokens * plan.head_tiles;
    split = std::max<int64_t>(1, (work + slots - 1) / slots) * tok;
  }
  // The last CTA's merge keeps one weight per (row, split) in the stage buffers.
  const int64_t kv_bytes = 2 * tok * (pad16(dqk) + 8) * 2;
  while (kRows * ((kv + split - 1) / split) * 4 > kv_bytes) split *= 2;
  plan.split_size = static_cast<int32_t>(split);
  plan.num_splits = static_cast<int32_t>((kv + split - 1) / split);
  plan.num_counters = int64_t{num_tokens} * plan.head_tiles;
  if (plan.num_splits > 1) {
    const size_t rows = static_cast<size_t>(num_tokens) * num_heads;
    plan.partial_bytes =
        static_cast<size_t>(plan.num_splits) * rows * (static_cast<size_t>(dv) + 2) * sizeof(float);
  }
  plan.smem_bytes = static_cast<size_t>(wide_smem(plan.warps, dqk).total);
  return plan;
}

cudaError_t launch_mla_wide_decode(const MlaWideDecodeParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0 || p.num_seqs == 0) return cudaSuccess;
  return p.warps == 4 ? launch_warps<4>(p, stream) : launch_warps<8>(p, stream);
}

}  // namespace di::cuda
