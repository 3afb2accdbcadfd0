#pragma once
// The per-token body of the GQA decode attention of gqa_decode_kernel (attention.cu), and the
// sequence metadata (gqa_decode_seq) the tensor-core and cluster decode kernels read too.
//
// One CTA of TW token warps per (KV split, kv head, sequence), each in HS warps (HS = 2: W = TW *
// HS warps) that take G / HS of the heads each. The split's tokens are cut into chunks of kChunk
// (the block ids first, then every K and V row of the chunk in flight together). With TW = 4,
// token warp w runs an online softmax over chunks w, w + 4, w + 8, … in that order. With TW = 8
// (splits of at most 8 chunks), warp w (< 4) runs chunk w and warp w + 4 computes chunk w + 4's
// scores meanwhile, then takes warp w's state and applies its chunk to it token by token, as
// warp w would have: the dependent K/V loads of a 4-warp CTA run in parallel, the arithmetic is
// the same. The 4 token-warp states merge in warp order through shared memory. Each lane holds E
// consecutive dims of K, V, q (for its q heads of the kv head) and the output; q·k is a warp sum
// per head. A head's arithmetic is the same for every TW and HS, so they change the speed, not
// the bits. Output: out (one split) or the split's partials (o, m, l) in the generic kernel's
// layout (attention.h), merged by combine_split_row.
#include <cuda_bf16.h>

#include "backend/cuda/kernels/attention.h"
#include "backend/cuda/kernels/common.cuh"

namespace di::cuda {

inline constexpr int kGqaDecodeWarps = 4;
// Tokens per chunk: a chunk's block ids, then all its K and V rows, are loaded together.
template <int E>
inline constexpr int kGqaChunk = E <= 4 ? 8 : 4;

template <int E>
__device__ __forceinline__ void load_bf16_e(const bf16* src, float (&f)[E]) {
  if constexpr (E == 2) {
    const uint32_t u = *reinterpret_cast<const uint32_t*>(src);
    f[0] = __uint_as_float(u << 16);
    f[1] = __uint_as_float(u & 0xffff0000u);
  } else if constexpr (E == 4) {
    const uint2 u = *reinterpret_cast<const uint2*>(src);
    f[0] = __uint_as_float(u.x << 16);
    f[1] = __uint_as_float(u.x & 0xffff0000u);
    f[2] = __uint_as_float(u.y << 16);
    f[3] = __uint_as_float(u.y & 0xffff0000u);
  } else {
    unpack8(*reinterpret_cast<const uint4*>(src), f);
  }
}

// Shared memory of one CTA: each token warp's (acc, m, l) before the merge.
template <int E, int G>
struct GqaDecodeShared {
  float acc[kGqaDecodeWarps][G][32 * E];
  float ml[kGqaDecodeWarps][G][2];
};

// Sequence s's blocks: first index into kv_indices and cached length (0: no blocks, padding).
struct GqaDecodeSeq {
  int b0;
  int kv_len;
};
__device__ __forceinline__ GqaDecodeSeq gqa_decode_seq(const PagedAttentionKernelParams& p, int s) {
  const int b0 = p.kv_indptr[s];
  const int nblocks = p.kv_indptr[s + 1] - b0;
  return {b0, nblocks > 0 ? (nblocks - 1) * p.block_size + p.kv_last_len[s] : 0};
}

// One warp's online-softmax state for GL heads: the lane's E dims of the unnormalised output, and
// per head the running max m (-inf: no token yet) and sum l (the same on every lane).
template <int GL, int E>
struct GqaState {
  float acc[GL][E], m[GL], l[GL];
};

// q·k of one head: the lane's E products, then the warp sum.
template <int E>
__device__ __forceinline__ float gqa_score(const float (&q)[E], const float (&k)[E]) {
  float sc = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) sc = fmaf(q[e], k[e], sc);
  return warp_sum(sc);
}

// Chunk [base, min(base + kChunk, t1)) (base < t1) applied to state st, given its V rows and
// score(j, h) (computed there, or earlier): the online softmax, each score when its token comes.
// (A form with every score of the chunk first and one rescale per head, DEEPINFER_GQA_SOFTMAX=
// chunk, was opt-in from run 11 and removed in run 47: neutral or -3 %, and the tensor-core
// kernel took the decode since.)
template <int E, int GL, int kChunk, typename Score>
__device__ __forceinline__ void gqa_apply_chunk(int base, int t1, const Score& score,
                                                const float (&vf)[kChunk][E], GqaState<GL, E>& st) {
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    if (base + j >= t1) break;  // uniform over the warp
#pragma unroll
    for (int h = 0; h < GL; ++h) {
      const float sc = score(j, h);
      const float mn = fmaxf(st.m[h], sc);
      const float corr = expf(st.m[h] - mn);  // 0 on the first token (m = -inf)
      const float pe = expf(sc - mn);
      st.l[h] = st.l[h] * corr + pe;
#pragma unroll
      for (int e = 0; e < E; ++e) st.acc[h][e] = fmaf(st.acc[h][e], corr, pe * vf[j][e]);
      st.m[h] = mn;
    }
  }
}

// Token i (of sequence `seq`) over split `split` for kv head kvh. q: this lane's E dims of the
// warp's G / HS q heads, already multiplied by p.scale. Every thread of the CTA calls it (it ends
// with a barrier, after which `sh` may be reused). TW = 8 needs split_size <= 8 * kChunk.
template <int E, int G, int W = kGqaDecodeWarps, int HS = 1>
__device__ __forceinline__ void gqa_decode_token(const PagedAttentionKernelParams& p, int split,
                                                 int kvh, GqaDecodeSeq seq, int i,
                                                 const float (&q)[G / HS][E],
                                                 GqaDecodeShared<E, G>& sh) {
  constexpr int D = 32 * E;
  constexpr int kChunk = kGqaChunk<E>;
  // HS warps per token warp, each with G / HS of the heads (same tokens, same order per head:
  // the bits do not depend on HS).
  constexpr int GL = G / HS, TW = W / HS, NW = kGqaDecodeWarps;
  static_assert(TW == NW || TW == 2 * NW, "4 or 8 token warps");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int tw = warp % TW, h0 = (warp / TW) * GL;
  const int w = tw % NW;  // the token warp of the 4-warp layout this warp computes for
  const int64_t rows = int64_t{p.num_tokens} * p.num_q_heads;
  const int64_t k_col = p.k_offset + int64_t{kvh} * p.kv_head_stride + lane * E;
  const int64_t v_col = p.v_offset + int64_t{kvh} * p.kv_head_stride + lane * E;
  const bf16* layer_base = p.pool + p.layer_offset;
  const int limit = min(seq.kv_len, p.positions[i] + 1);
  const int t0 = split * p.split_size;
  const int t1 = min(limit, t0 + p.split_size);
  GqaState<GL, E> st;
#pragma unroll
  for (int h = 0; h < GL; ++h) {
#pragma unroll
    for (int e = 0; e < E; ++e) st.acc[h][e] = 0.0f;
    st.m[h] = -INFINITY;
    st.l[h] = 0.0f;
  }
  // One chunk's K and V rows of this lane.
  float kf[kChunk][E], vf[kChunk][E];
  auto load_chunk = [&](int base) {
    const bf16* ent[kChunk];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const int t = min(base + j, t1 - 1);
      const int blk = p.kv_indices[seq.b0 + t / p.block_size];
      ent[j] = layer_base + blk * p.block_stride + int64_t{t % p.block_size} * p.entry_size;
    }
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      load_bf16_e<E>(ent[j] + k_col, kf[j]);
      load_bf16_e<E>(ent[j] + v_col, vf[j]);
    }
  };
  auto score_now = [&](int j, int h) { return gqa_score<E>(q[h], kf[j]); };
  auto to_slot = [&] {  // this warp's state into token warp w's merge slot
#pragma unroll
    for (int h = 0; h < GL; ++h) {
#pragma unroll
      for (int e = 0; e < E; ++e) sh.acc[w][h0 + h][lane * E + e] = st.acc[h][e];
      if (lane == 0) {
        sh.ml[w][h0 + h][0] = st.m[h];
        sh.ml[w][h0 + h][1] = st.l[h];
      }
    }
  };
  if constexpr (TW == NW) {
    // Token warp w: chunks w, w + 4, … (t0 + w * kChunk + j + c * 4 * kChunk).
    for (int base = t0 + w * kChunk; base < t1; base += NW * kChunk) {
      load_chunk(base);
      gqa_apply_chunk<E, GL, kChunk>(base, t1, score_now, vf, st);
    }
    to_slot();
  } else {
    // Warp w: chunk w. Warp w + 4: chunk w + 4's scores, then warp w's state and its tokens.
    const int base = t0 + tw * kChunk;
    float sc[kChunk][GL];
    if (base < t1) {
      load_chunk(base);
      if (tw < NW) {
        gqa_apply_chunk<E, GL, kChunk>(base, t1, score_now, vf, st);
      } else {
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
#pragma unroll
          for (int h = 0; h < GL; ++h) sc[j][h] = score_now(j, h);
        }
      }
    }
    if (tw < NW) to_slot();
    __syncthreads();
    if (tw >= NW) {
      if (base < t1) {
#pragma unroll
        for (int h = 0; h < GL; ++h) {
#pragma unroll
          for (int e = 0; e < E; ++e) st.acc[h][e] = sh.acc[w][h0 + h][lane * E + e];
          st.m[h] = sh.ml[w][h0 + h][0];
          st.l[h] = sh.ml[w][h0 + h][1];
        }
        auto score_then = [&](int j, int h) { return sc[j][h]; };
        gqa_apply_chunk<E, GL, kChunk>(base, t1, score_then, vf, st);
        __syncwarp();  // every lane has read m and l (lane 0 overwrites them)
        to_slot();
      }
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * D; idx += W * 32) {
    const int h = idx / D, d = idx % D;
    float mm = -INFINITY;
#pragma unroll
    for (int tw2 = 0; tw2 < NW; ++tw2) mm = fmaxf(mm, sh.ml[tw2][h][0]);
    float ll = 0.0f, o = 0.0f;
    if (mm != -INFINITY) {
#pragma unroll
      for (int tw2 = 0; tw2 < NW; ++tw2) {
        const float mw = sh.ml[tw2][h][0];
        if (mw == -INFINITY) continue;
        const float c = expf(mw - mm);
        ll += c * sh.ml[tw2][h][1];
        o += c * sh.acc[tw2][h][d];
      }
    }
    const int64_t row = int64_t{i} * p.num_q_heads + kvh * G + h;
    if (p.num_splits == 1) {
      p.out[row * D + d] = from_f32<bf16>(ll > 0.0f ? o / ll : 0.0f);
    } else {
      p.partial_o[(split * rows + row) * D + d] = o;
      if (d == 0) {
        p.partial_ml[(split * rows + row) * 2] = mm;
        p.partial_ml[(split * rows + row) * 2 + 1] = ll;
      }
    }
  }
  __syncthreads();  // sh is reused by the next token
}

}  // namespace di::cuda
