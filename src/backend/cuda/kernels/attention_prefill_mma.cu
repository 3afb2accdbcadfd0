// Tensor-core prefill attention (issue #5): FlashAttention-2-style forward over the paged KV pool.
//
// Work decomposition (as the CUDA-core kernel, attention.h): the query rows of sequence s for kv
// head g are the pairs (new token i, q head of g's group), token-major, so the q heads sharing a
// kv head share every K/V tile. A CTA of kWarps warps takes kRows = 16 * kWarps such rows (warp w
// owns rows 16w .. 16w + 15) and walks the KV tiles of 64 tokens up to the last position any of
// its rows may see (fully masked tiles are never loaded); the grid is (num_kv_heads, max_tiles)
// and tiles are handed out heaviest (last rows of the last sequence) first.
//
// Per CTA: Q tile [kRows][D] and one K and one V tile [64][D] in shared memory (rows padded by 8
// elements: ldmatrix rows land in distinct banks), filled with cp.async (16 bytes, zero-fill past
// the sequence). The K load of tile j + 1 overlaps P·V of tile j and the V load of tile j overlaps
// Q·Kᵀ and the softmax of tile j (FA2's schedule). Per warp and tile, in registers: S = Q·Kᵀ (16 x
// 64, 8 n-tiles of mma.m16n8k16), the causal mask (only on tiles that cross some row's limit),
// the online softmax (running max m, sum l, per row; exp2 with the scale folded in), P rounded to
// bf16 (the C fragments of S are the A fragments of P) and O += P·V (16 x D in f32).
// Fragment layouts and the ldmatrix address math: attention_prefill_mma_math.h (CPU-tested).
#include <cfloat>
#include <climits>

#include "backend/cuda/kernels/attention_prefill_mma.h"
#include "backend/cuda/kernels/attention_tile.cuh"
#include "backend/cuda/kernels/common.cuh"

namespace di::cuda {
namespace {

constexpr int kKvTile = 64;  // kv tokens per tile

__global__ void mma_tile_indptr_kernel(const int32_t* qo_indptr, int32_t num_seqs, int32_t group,
                                       int32_t rows_per_tile, int32_t* tile_indptr) {
  if (threadIdx.x != 0) return;
  int32_t acc = 0;
  tile_indptr[0] = 0;
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int32_t rows = (qo_indptr[s + 1] - qo_indptr[s]) * group;
    acc += (rows + rows_per_tile - 1) / rows_per_tile;
    tile_indptr[s + 1] = acc;
  }
}

// K or V rows [kv0, kv0 + 64) of kv head `kvh` into dst[64][kLd] (cp.async; rows >= kv_len are
// zero-filled so that P = 0 never meets garbage V).
template <int kD, int kThreads>
__device__ __forceinline__ void load_kv_tile(const PagedAttentionKernelParams& p,
                                             const int32_t* blocks, int kv_len, int kvh, int kv0,
                                             int elem_offset, int bs_shift, bf16* dst) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row
  constexpr int kLd = kD + 8;
  static_assert(kThreads % kChunks == 0, "each thread keeps one chunk column");
  const int c = threadIdx.x % kChunks;
  const int64_t head_off = p.layer_offset + elem_offset + int64_t{kvh} * p.kv_head_stride + c * 8;
#pragma unroll
  for (int j = threadIdx.x / kChunks; j < kKvTile; j += kThreads / kChunks) {
    const int kvp = kv0 + j;
    const bf16* src = p.pool;
    int bytes = 0;
    if (kvp < kv_len) {
      const int bi = bs_shift >= 0 ? kvp >> bs_shift : kvp / p.block_size;
      const int off = bs_shift >= 0 ? kvp & (p.block_size - 1) : kvp - bi * p.block_size;
      src = p.pool + int64_t{blocks[bi]} * p.block_stride + int64_t{off} * p.entry_size + head_off;
      bytes = 16;
    }
    cp_async16(dst + j * kLd + c * 8, src, bytes);
  }
}

template <int kD, int kWarps, int kMT>
__global__ void __launch_bounds__(kWarps * 32) prefill_mma_kernel(PagedAttentionKernelParams p) {
  constexpr int kThreads = kWarps * 32;
  constexpr int kWarpRows = 16 * kMT;  // kMT m-tiles of 16 rows per warp
  constexpr int kRows = kWarps * kWarpRows;
  constexpr int kLd = kD + 8;  // smem row stride (elements): 16 B pad, conflict-free ldmatrix
  constexpr int kChunks = kD / 8;
  constexpr int kDTiles = kD / 8;    // 8-wide n-tiles of O
  constexpr int kDChunks = kD / 16;  // 16-wide k-chunks of Q·Kᵀ
  constexpr int kKTiles = kKvTile / 8;
  constexpr bool kQInRegs = kMT == 1;  // else Q fragments are re-read from smem (registers)
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* k_s = q_s + kRows * kLd;
  bf16* v_s = k_s + kKvTile * kLd;
  __shared__ int pos_s[kRows];
  __shared__ int range_s[2];  // min, max visible position over the CTA's valid rows

  const int kvh = blockIdx.x;
  const int tile = prefill_tile_of_cta(p);
  if (tile < 0) return;
  const AttnTile at = attn_tile(p, tile, kRows);
  const int group = at.group, q_begin = at.q_begin, row0 = at.row0, nr = at.nr;
  const int kv_len = at.kv_len;
  const int32_t* blocks = at.blocks;
  const int bs_shift = (p.block_size & (p.block_size - 1)) == 0 ? __ffs(p.block_size) - 1 : -1;

  // Row positions (-1: no row / nothing visible) and the Q tile (zero rows past nr).
  if (threadIdx.x == 0) {
    range_s[0] = INT_MAX;
    range_s[1] = -1;
  }
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    int pos = -1;
    if (r < nr) pos = min(p.positions[q_begin + (row0 + r) / group], kv_len - 1);
    pos_s[r] = pos;
  }
  for (int idx = threadIdx.x; idx < kRows * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    const bf16* src = p.q;
    int bytes = 0;
    if (r < nr) {
      const int tok = q_begin + (row0 + r) / group, h = kvh * group + (row0 + r) % group;
      src = p.q + (int64_t{tok} * p.num_q_heads + h) * kD + c * 8;
      bytes = 16;
    }
    cp_async16(q_s + r * kLd + c * 8, src, bytes);
  }
  __syncthreads();  // pos_s, range_s init
  for (int r = threadIdx.x; r < nr; r += kThreads) {
    atomicMin(&range_s[0], pos_s[r]);
    atomicMax(&range_s[1], pos_s[r]);
  }
  __syncthreads();
  const int min_pos = range_s[0], max_pos = range_s[1];
  const int n_tiles = max_pos >= 0 ? max_pos / kKvTile + 1 : 0;
  if (n_tiles > 0) load_kv_tile<kD, kThreads>(p, blocks, kv_len, kvh, 0, p.k_offset, bs_shift, k_s);
  cp_async_commit();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wrow = warp * kWarpRows;  // first CTA row of this warp; m-tile mt: + 16 mt
  const int quad_row = lane >> 2, quad_col = (lane & 3) * 2;
  int pos_r[kMT][2];  // rows of c0/c1 (quad_row) and c2/c3 (quad_row + 8) per m-tile
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    pos_r[mt][0] = pos_s[wrow + 16 * mt + quad_row];
    pos_r[mt][1] = pos_s[wrow + 16 * mt + quad_row + 8];
  }
  const float sl2 = p.scale * kLog2e;

  float o[kMT][kDTiles][4];
  float m_run[kMT][2], l_run[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int i = 0; i < kDTiles; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.0f;
    m_run[mt][0] = m_run[mt][1] = -INFINITY;
    l_run[mt][0] = l_run[mt][1] = 0.0f;
  }

  cp_async_wait<0>();
  __syncthreads();
  // One m-tile: Q fragments stay in registers for the whole KV walk.
  uint32_t qf[kQInRegs ? kDChunks : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int kc = 0; kc < kDChunks; ++kc)
      ldsm_x4(qf[kc], q_s + (wrow + mma_frag::ldsm_q_row(lane)) * kLd + kc * 16 +
                          mma_frag::ldsm_q_col(lane));
  }

  for (int it = 0; it < n_tiles; ++it) {
    const int kv0 = it * kKvTile;
    cp_async_wait<0>();  // K tile `it` landed (this thread's copies) ...
    __syncthreads();      // ... everyone's; and every warp is done with the previous P·V (V free)
    load_kv_tile<kD, kThreads>(p, blocks, kv_len, kvh, kv0, p.v_offset, bs_shift, v_s);
    cp_async_commit();

    // S = Q · Kᵀ, 16 x 64 per m-tile; each K fragment feeds every m-tile of the warp.
    float sc[kMT][kKTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int i = 0; i < kKTiles; ++i)
        sc[mt][i][0] = sc[mt][i][1] = sc[mt][i][2] = sc[mt][i][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < kDChunks; ++kc) {
      uint32_t qa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if constexpr (kQInRegs) {
#pragma unroll
          for (int i = 0; i < 4; ++i) qa[mt][i] = qf[kc][i];
        } else {
          ldsm_x4(qa[mt], q_s + (wrow + 16 * mt + mma_frag::ldsm_q_row(lane)) * kLd + kc * 16 +
                              mma_frag::ldsm_q_col(lane));
        }
      }
#pragma unroll
      for (int np = 0; np < kKTiles / 2; ++np) {
        uint32_t b[4];
        ldsm_x4(b, k_s + (np * 16 + mma_frag::ldsm_k_key(lane)) * kLd + kc * 16 +
                       mma_frag::ldsm_k_col(lane));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_bf16_16816(sc[mt][2 * np], qa[mt], b[0], b[1]);
          mma_bf16_16816(sc[mt][2 * np + 1], qa[mt], b[2], b[3]);
        }
      }
    }
    // Causal / length mask, only where some row of the CTA cannot see the whole tile.
    if (kv0 + kKvTile - 1 > min_pos) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kKTiles; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int key = kv0 + nt * 8 + quad_col + (i & 1);
            if (key > pos_r[mt][i >> 1]) sc[mt][nt][i] = -INFINITY;
          }
    }
    // Online softmax; rh 0 = row quad_row (c0, c1), rh 1 = row quad_row + 8 (c2, c3). The four
    // lanes of a quad hold one row's 64 scores between them.
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int rh = 0; rh < 2; ++rh) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kKTiles; ++nt)
          mx = fmaxf(mx, fmaxf(sc[mt][nt][2 * rh], sc[mt][nt][2 * rh + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run[mt][rh], mx);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;        // nothing visible yet: p = 0
        const float corr = fast_exp2((m_run[mt][rh] - m_use) * sl2);  // m_run = -inf: 0
        const float ms = m_use * sl2;
        m_run[mt][rh] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kKTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pv = fast_exp2(fmaf(sc[mt][nt][2 * rh + e], sl2, -ms));
            sc[mt][nt][2 * rh + e] = pv;
            sum += pv;
          }
        l_run[mt][rh] = l_run[mt][rh] * corr + sum;  // per-lane partial; quad-reduced at the end
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          o[mt][dt][2 * rh] *= corr;
          o[mt][dt][2 * rh + 1] *= corr;
        }
      }
    }
    // P (bf16) as A fragments: 16-key chunk kc = S n-tiles 2kc (a0, a1) and 2kc + 1 (a2, a3).
    uint32_t pf[kMT][kKvTile / 16][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int kc = 0; kc < kKvTile / 16; ++kc) {
        pf[mt][kc][0] = pack_bf16(sc[mt][2 * kc][0], sc[mt][2 * kc][1]);
        pf[mt][kc][1] = pack_bf16(sc[mt][2 * kc][2], sc[mt][2 * kc][3]);
        pf[mt][kc][2] = pack_bf16(sc[mt][2 * kc + 1][0], sc[mt][2 * kc + 1][1]);
        pf[mt][kc][3] = pack_bf16(sc[mt][2 * kc + 1][2], sc[mt][2 * kc + 1][3]);
      }

    cp_async_wait<0>();  // V tile `it` landed ...
    __syncthreads();      // ... everyone's; every warp is done with Q·Kᵀ (K free)
    if (it + 1 < n_tiles)
      load_kv_tile<kD, kThreads>(p, blocks, kv_len, kvh, kv0 + kKvTile, p.k_offset, bs_shift, k_s);
    cp_async_commit();

    // O += P · V; each V fragment feeds every m-tile of the warp.
#pragma unroll
    for (int kc = 0; kc < kKvTile / 16; ++kc) {
#pragma unroll
      for (int dp = 0; dp < kD / 16; ++dp) {
        uint32_t b[4];
        ldsm_x4_trans(b, v_s + (kc * 16 + mma_frag::ldsm_v_key(lane)) * kLd + dp * 16 +
                             mma_frag::ldsm_v_col(lane));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_bf16_16816(o[mt][2 * dp], pf[mt][kc], b[0], b[1]);
          mma_bf16_16816(o[mt][2 * dp + 1], pf[mt][kc], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();  // no copy may still be in flight when the CTA exits

  // Normalise and write rows quad_row and quad_row + 8 of each m-tile of this warp.
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      float l = l_run[mt][rh];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int r = wrow + 16 * mt + quad_row + 8 * rh;
      if (r >= nr) continue;
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const int tok = q_begin + (row0 + r) / group, h = kvh * group + (row0 + r) % group;
      bf16* dst = p.out + (int64_t{tok} * p.num_q_heads + h) * kD + quad_col;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
        *reinterpret_cast<uint32_t*>(dst + dt * 8) =
            pack_bf16(o[mt][dt][2 * rh] * inv, o[mt][dt][2 * rh + 1] * inv);
    }
  }
}

template <int kD, int kWarps, int kMT>
void launch_cfg(const PagedAttentionKernelParams& p, cudaStream_t stream) {
  constexpr int smem = (kWarps * 16 * kMT + 2 * kKvTile) * (kD + 8) * 2;
  open_dynamic_smem(reinterpret_cast<const void*>(&prefill_mma_kernel<kD, kWarps, kMT>), smem);
  const dim3 grid(static_cast<unsigned>(p.num_kv_heads), static_cast<unsigned>(p.max_tiles));
  prefill_mma_kernel<kD, kWarps, kMT><<<grid, kWarps * 32, smem, stream>>>(p);
}

template <int kD>
void launch_dim(const PagedAttentionKernelParams& p, int warps, int m_tiles, cudaStream_t stream) {
  if (m_tiles == 2)
    launch_cfg<kD, 4, 2>(p, stream);
  else if (warps == 8)
    launch_cfg<kD, 8, 1>(p, stream);
  else
    launch_cfg<kD, 4, 1>(p, stream);
}

}  // namespace

void launch_prefill_tile_indptr(const int32_t* qo_indptr, int32_t num_seqs, int32_t group,
                                int32_t rows_per_tile, int32_t* tile_indptr, cudaStream_t stream) {
  mma_tile_indptr_kernel<<<1, 32, 0, stream>>>(qo_indptr, num_seqs, group, rows_per_tile,
                                               tile_indptr);
}

void launch_paged_attention_prefill_mma(const PagedAttentionKernelParams& p, int warps, int m_tiles,
                                        cudaStream_t stream) {
  if (p.num_tokens == 0 || p.num_seqs == 0) return;
  const int group = p.num_q_heads / p.num_kv_heads;
  launch_prefill_tile_indptr(p.qo_indptr, p.num_seqs, group, prefill_mma_rows(warps, m_tiles),
                             p.tile_indptr, stream);
  if (p.head_dim_qk == 128)
    launch_dim<128>(p, warps, m_tiles, stream);
  else
    launch_dim<64>(p, warps, m_tiles, stream);
}

}  // namespace di::cuda
