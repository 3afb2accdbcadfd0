// Paged attention on CUDA cores: one kernel for decode (split-KV) and prefill (causal tiles),
// GQA and MLA. See attention.h for the work decomposition.
//
// Per CTA and KV tile of 32 tokens: K (and V unless it lives inside K, as in MLA) is staged in
// shared memory once and used by all rows of the tile (the q heads of one kv head and, in
// prefill, several tokens); scores, online softmax (running max m, sum l) and the P·V update
// follow, with the output accumulator in shared memory.
//
// Napkin math, decode: Llama-3.1-8B, 512-token context: 32 layers x 512 x 4 KB (K+V, 8 heads x
// 128 x 2 x bf16) = 64 MB per step per sequence: 15 us at 4.3 TB/s against 3.7 ms of weights.
// MLA (V2-Lite, 16 heads, 576/512): per 32-token tile 36 KB loaded, 16 x 32 x (576 + 512) =
// 557 K FMA -> about 2.2 K FMA per thread: close to balanced on CUDA cores at 132 SMs.
// Prefill on CUDA cores is compute-bound (about 20-30 TFLOP/s expected): the tensor-core version
// is TODO(#5).
#include <atomic>
#include <cfloat>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backend/cuda/kernels/attention.h"
#include "backend/cuda/kernels/attention_tile.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gqa_decode.cuh"
#include "backend/cuda/kernels/split_combine.cuh"
#include "core/env.h"

namespace di::cuda {
namespace {

constexpr int kKvTile = 32;  // kv tokens per tile = warp width (one lane per key in softmax)
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

struct SmemLayout {
  int q_off, k_off, v_off, p_off, acc_off, ml_off, pos_off, total;
};

// Offsets in bytes; K/V rows (elements of `esz` bytes: 2 bf16, 4 f32) padded by 2 elements so
// lanes reading different rows at the same column hit different banks.
__host__ __device__ inline SmemLayout smem_layout(int rows, int dqk, int dv, bool v_in_k, int esz) {
  SmemLayout s;
  int off = 0;
  s.q_off = off;
  off += rows * dqk * 4;
  s.k_off = off;
  off += kKvTile * (dqk + 2) * esz;
  s.v_off = v_in_k ? s.k_off : off;
  if (!v_in_k) off += kKvTile * (dv + 2) * esz;
  off = (off + 15) & ~15;
  s.p_off = off;
  off += rows * kKvTile * 4;
  s.acc_off = off;
  off += rows * dv * 4;
  s.ml_off = off;
  off += rows * 3 * 4;  // m, l, correction
  s.pos_off = off;
  off += rows * 4;
  s.total = off;
  return s;
}

__global__ void tile_indptr_kernel(const int32_t* qo_indptr, int32_t num_seqs, int32_t group,
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

// The element pointers of the mode: bf16 (default) or f32 (the verification mode).
template <typename T>
__device__ __forceinline__ const T* q_of(const PagedAttentionKernelParams& p) {
  if constexpr (std::is_same_v<T, float>)
    return p.q_f32;
  else
    return p.q;
}
template <typename T>
__device__ __forceinline__ T* out_of(const PagedAttentionKernelParams& p) {
  if constexpr (std::is_same_v<T, float>)
    return p.out_f32;
  else
    return p.out;
}
template <typename T>
__device__ __forceinline__ const T* pool_of(const PagedAttentionKernelParams& p) {
  if constexpr (std::is_same_v<T, float>)
    return p.pool_f32;
  else
    return p.pool;
}
// Elements 2c and 2c + 1 of a row as floats (one 4-byte bf16x2 or one 8-byte float2 load).
__device__ __forceinline__ float2 load_pair(const bf16* row, int c) {
  return __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(row)[c]);
}
__device__ __forceinline__ float2 load_pair(const float* row, int c) {
  return reinterpret_cast<const float2*>(row)[c];
}

// Loads rows [kv0, kv0 + n) of K (or V) for kv head `kvh` into smem rows of `dim + 2` elements,
// 4 bytes per access. `n` <= kKvTile; rows >= n are left untouched (masked later).
template <typename T>
__device__ __forceinline__ void load_kv_tile(const PagedAttentionKernelParams& p, int s, int kvh,
                                             int kv0, int n, int elem_offset, int dim, T* dst) {
  constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));  // elements per 4-byte word
  const int words = dim / kPerWord;
  const int32_t* blocks = p.kv_indices + p.kv_indptr[s];
  const T* pool = pool_of<T>(p);
  for (int idx = threadIdx.x; idx < n * words; idx += kThreads) {
    const int j = idx / words, c = idx % words;
    const int kvp = kv0 + j;
    const int64_t blk = blocks[kvp / p.block_size];
    const T* entry = pool + blk * p.block_stride + p.layer_offset +
                     int64_t{kvp % p.block_size} * p.entry_size + elem_offset +
                     int64_t{kvh} * p.kv_head_stride;
    reinterpret_cast<uint32_t*>(dst + j * (dim + 2))[c] =
        reinterpret_cast<const uint32_t*>(entry)[c];
  }
}

template <int kRows, typename T>
__global__ void __launch_bounds__(kThreads) paged_attention_kernel(PagedAttentionKernelParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int kvh = blockIdx.y, split = blockIdx.z;
  const int tile = blockIdx.x;
  if (tile >= p.tile_indptr[p.num_seqs]) return;
  const AttnTile at = attn_tile(p, tile, kRows);
  const int s = at.s, group = at.group, q_begin = at.q_begin, row0 = at.row0, nr = at.nr;
  const int kv_len = at.kv_len;

  const int dqk = p.head_dim_qk, dv = p.head_dim_v;
  const bool v_in_k = p.v_offset == p.k_offset && dv <= dqk;
  const SmemLayout L = smem_layout(kRows, dqk, dv, v_in_k, static_cast<int>(sizeof(T)));
  float* q_s = reinterpret_cast<float*>(smem + L.q_off);
  T* k_s = reinterpret_cast<T*>(smem + L.k_off);
  T* v_s = reinterpret_cast<T*>(smem + L.v_off);
  const T* q_g = q_of<T>(p);
  T* out_g = out_of<T>(p);
  const int v_ld = v_in_k ? dqk + 2 : dv + 2;
  float* p_s = reinterpret_cast<float*>(smem + L.p_off);
  float* acc_s = reinterpret_cast<float*>(smem + L.acc_off);
  float* m_s = reinterpret_cast<float*>(smem + L.ml_off);
  float* l_s = m_s + kRows;
  float* corr_s = l_s + kRows;
  int* pos_s = reinterpret_cast<int*>(smem + L.pos_off);

  // Rows: token-major (token, head of the group). pos_s = last visible cache position, -1 = none.
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    int pos = -1;
    if (r < nr) {
      const int tok = q_begin + (row0 + r) / group;
      pos = min(p.positions[tok], kv_len - 1);
    }
    pos_s[r] = pos;
    m_s[r] = -FLT_MAX;
    l_s[r] = 0.0f;
  }
  for (int idx = threadIdx.x; idx < kRows * dqk; idx += kThreads) {
    const int r = idx / dqk, d = idx % dqk;
    float v = 0.0f;
    if (r < nr) {
      const int tok = q_begin + (row0 + r) / group, h = kvh * group + (row0 + r) % group;
      v = to_f32(q_g[(int64_t{tok} * p.num_q_heads + h) * dqk + d]) * p.scale;
    }
    q_s[idx] = v;
  }
  for (int idx = threadIdx.x; idx < kRows * dv; idx += kThreads) acc_s[idx] = 0.0f;
  __syncthreads();
  int max_pos = -1;
  for (int r = 0; r < nr; ++r) max_pos = max(max_pos, pos_s[r]);
  const int kv_begin = split * p.split_size;
  const int kv_end = min(max_pos + 1, kv_begin + p.split_size);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int kv0 = kv_begin; kv0 < kv_end; kv0 += kKvTile) {
    const int n = min(kKvTile, kv_end - kv0);
    load_kv_tile(p, s, kvh, kv0, n, p.k_offset, dqk, k_s);
    if (!v_in_k) load_kv_tile(p, s, kvh, kv0, n, p.v_offset, dv, v_s);
    __syncthreads();
    // Scores: lane = key j, warp w takes rows w, w + 8, ...; one K word feeds kRows/8 rows.
    {
      constexpr int kRowsPerWarp = kRows / kWarps;
      float dot[kRowsPerWarp];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) dot[i] = 0.0f;
      if (lane < n && warp < nr) {
        const T* krow = k_s + lane * (dqk + 2);
        for (int c = 0; c < dqk / 2; ++c) {
          const float2 kf = load_pair(krow, c);
#pragma unroll
          for (int i = 0; i < kRowsPerWarp; ++i) {
            const float2 qf = reinterpret_cast<const float2*>(q_s + (warp + i * kWarps) * dqk)[c];
            dot[i] = fmaf(qf.x, kf.x, fmaf(qf.y, kf.y, dot[i]));
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const int r = warp + i * kWarps;
        const bool valid = lane < n && r < nr && kv0 + lane <= pos_s[r];
        p_s[r * kKvTile + lane] = valid ? dot[i] : -INFINITY;
      }
    }
    __syncthreads();
    // Online softmax, one warp per row.
    for (int r = warp; r < nr; r += kWarps) {
      const float sc = p_s[r * kKvTile + lane];
      const float m_old = m_s[r];
      const float m_new = fmaxf(m_old, warp_max(sc));
      const float e = sc == -INFINITY ? 0.0f : expf(sc - m_new);
      const float sum = warp_sum(e);
      p_s[r * kKvTile + lane] = e;
      __syncwarp();  // every lane has read m_s[r] before lane 0 overwrites it (racecheck, run 15)
      if (lane == 0) {
        const float corr = expf(m_old - m_new);  // m_old = -FLT_MAX on the first tile: 0
        corr_s[r] = corr;
        l_s[r] = l_s[r] * corr + sum;
        m_s[r] = m_new;
      }
    }
    __syncthreads();
    // acc[r, d] = acc[r, d] * corr[r] + sum_j p[r, j] v[j, d]; two dims per thread item.
    for (int idx = threadIdx.x; idx < nr * (dv / 2); idx += kThreads) {
      const int r = idx / (dv / 2), c = idx % (dv / 2);
      float2 a = reinterpret_cast<float2*>(acc_s + r * dv)[c];
      const float corr = corr_s[r];
      a.x *= corr;
      a.y *= corr;
      const float* pr = p_s + r * kKvTile;
      for (int j = 0; j < n; ++j) {
        const float2 vf = load_pair(v_s + j * v_ld, c);
        a.x = fmaf(pr[j], vf.x, a.x);
        a.y = fmaf(pr[j], vf.y, a.y);
      }
      reinterpret_cast<float2*>(acc_s + r * dv)[c] = a;
    }
    __syncthreads();
  }

  // Write out: normalised output (one split) or the partial state (several).
  for (int idx = threadIdx.x; idx < nr * dv; idx += kThreads) {
    const int r = idx / dv, d = idx % dv;
    const int tok = q_begin + (row0 + r) / group, h = kvh * group + (row0 + r) % group;
    const int64_t grow = int64_t{tok} * p.num_q_heads + h;
    if (p.num_splits == 1) {
      const float l = l_s[r];
      out_g[grow * dv + d] = from_f32<T>(l > 0.0f ? acc_s[idx] / l : 0.0f);
    } else {
      const int64_t prow = int64_t{split} * p.num_tokens * p.num_q_heads + grow;
      p.partial_o[prow * dv + d] = acc_s[idx];
      if (d == 0) {
        p.partial_ml[prow * 2] = l_s[r] > 0.0f ? m_s[r] : -INFINITY;
        p.partial_ml[prow * 2 + 1] = l_s[r];
      }
    }
  }
}

// Merges the splits of every (token, q head) row (split_combine.cuh).
template <typename T, int kPre = 0, bool kWarp = false>
__global__ void __launch_bounds__(128) combine_splits_kernel(PagedAttentionKernelParams p) {
  DI_TRACE_SCOPE(kTraceCombineSplits, 0);
  combine_split_row<T, kPre, kWarp>(p.partial_o, p.partial_ml,
                                    int64_t{p.num_tokens} * p.num_q_heads, p.num_splits,
                                    p.head_dim_v, blockIdx.x, out_of<T>(p));
}

// ---- decode: one CTA per (KV split, kv head, sequence), bf16, GQA (separate K and V) ----------
// The body is gqa_decode_token (gqa_decode.cuh).
// The split layout and the partials are the generic kernel's, so combine_splits_kernel merges
// them. Tokens per sequence: any (usually one; a causal limit per token).
// Resident CTAs the decode kernel is compiled for: four 4-warp CTAs per SM for groups of up to 4
// heads (at most 128 registers: the full grids of Llama-3.1-8B), one 8-token-warp CTA, else the
// compiler's choice.
template <int G, int HS, int TW>
inline constexpr int kGqaMinBlocks = TW == 8 ? 1 : (HS == 1 && G <= 4 ? 4 : 0);

template <int E, int G, int HS, int TW>
__global__ void __launch_bounds__(TW* HS * 32, kGqaMinBlocks<G, HS, TW>)
    gqa_decode_kernel(PagedAttentionKernelParams p) {
  pdl_trigger();  // the next (PDL-launched) kernel may start loading its weights
  pdl_wait();     // launched as a PDL dependent (launch_decode): nothing read before this
  constexpr int D = 32 * E, GL = G / HS, W = TW * HS;
  __shared__ GqaDecodeShared<E, G> sh;
  const int split = blockIdx.x, kvh = blockIdx.y, s = blockIdx.z;
  const int lane = threadIdx.x & 31;
  const int h0 = (static_cast<int>(threadIdx.x >> 5) / TW) * GL;  // this warp's heads
  const GqaDecodeSeq seq = gqa_decode_seq(p, s);
  for (int i = p.qo_indptr[s]; i < p.qo_indptr[s + 1]; ++i) {
    float q[GL][E];
#pragma unroll
    for (int h = 0; h < GL; ++h) {
      load_bf16_e<E>(p.q + (int64_t{i} * p.num_q_heads + kvh * G + h0 + h) * D + lane * E, q[h]);
#pragma unroll
      for (int e = 0; e < E; ++e) q[h][e] *= p.scale;
    }
    gqa_decode_token<E, G, W, HS>(p, split, kvh, seq, i, q, sh);
  }
}

template <int E, int HS, int TW>
bool launch_decode_eh(const PagedAttentionKernelParams& p, int group, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.num_splits), static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>(p.num_seqs));
  constexpr int kThreadsHs = TW * HS * 32;
  switch (group) {
    case 1:
      if constexpr (HS != 1) return false;
      (void)launch_decode(kPdlGqaDecode, gqa_decode_kernel<E, 1, 1, TW>, grid, kThreadsHs, 0,
                          stream, p);
      return true;
    case 2:
      (void)launch_decode(kPdlGqaDecode, gqa_decode_kernel<E, 2, HS, TW>, grid, kThreadsHs, 0,
                          stream, p);
      return true;
    case 4:
      (void)launch_decode(kPdlGqaDecode, gqa_decode_kernel<E, 4, HS, TW>, grid, kThreadsHs, 0,
                          stream, p);
      return true;
    case 8:
      (void)launch_decode(kPdlGqaDecode, gqa_decode_kernel<E, 8, HS, TW>, grid, kThreadsHs, 0,
                          stream, p);
      return true;
    default:
      return false;
  }
}

// 0: by the grid (below), else forced (DEEPINFER_GQA_HEAD_SPLIT = 1|2, DEEPINFER_GQA_TOKEN_WARPS =
// 4|8; tests compare the layouts bitwise).
EnvSetting g_head_split{"DEEPINFER_GQA_HEAD_SPLIT", 0};
EnvSetting g_token_warps{"DEEPINFER_GQA_TOKEN_WARPS", 0};

template <int E>
bool launch_decode_e(const PagedAttentionKernelParams& p, int group, cudaStream_t stream) {
  int hs = g_head_split.load();
  int tw = g_token_warps.load();
  // Measured on the H200 (docs/cuda_backend.md "GQA decode attention", run 14):
  // - HS = 2 (twice the warps, each with half of the kv head's q heads: half the per-token chain
  //   of warp sums and exps) on grids of at most one CTA per SM, which leave warp slots free
  //   (Qwen3-30B-A3B batch 1: 242.8 -> 264.1 tok/s), and for 8 q heads per kv head on any grid
  //   (half the registers per thread, 244 -> 128: Qwen3 batch 32 955 -> 1,010 tok/s);
  // - TW = 8 token warps on such small grids when each warp then has two heads (Llama-3.1-8B
  //   batch 1: 223.6 -> 225.8 tok/s); with four heads per warp the handed-over chain is longer
  //   than the loads it overlaps (Qwen3 batch 1: 263.7 -> 256.1).
  const int64_t ctas = int64_t{p.num_splits} * p.num_kv_heads * p.num_seqs;
  const bool small_grid = ctas <= p.num_sms;
  if (hs != 1 && hs != 2) hs = small_grid || group >= 8 ? 2 : 1;
  if (group < 2) hs = 1;
  if (tw != 4 && tw != 8) tw = small_grid && group / hs == 2 ? 8 : 4;
  // Eight token warps reproduce four's arithmetic when each of the four has at most two chunks.
  if (p.split_size > 8 * kGqaChunk<E>) tw = 4;
  if (tw == 8) {
    if constexpr (E <= 4) {
      return hs == 2 ? launch_decode_eh<E, 2, 8>(p, group, stream)
                     : launch_decode_eh<E, 1, 8>(p, group, stream);
    }
  }
  return hs == 2 ? launch_decode_eh<E, 2, 4>(p, group, stream)
                 : launch_decode_eh<E, 1, 4>(p, group, stream);
}

bool launch_gqa_decode(const PagedAttentionKernelParams& p, cudaStream_t stream) {
  if (!gqa_decode_supported(p)) return false;
  const int e = p.head_dim_qk / 32, group = p.num_q_heads / p.num_kv_heads;
  if (e == 2) return launch_decode_e<2>(p, group, stream);
  if (e == 4) return launch_decode_e<4>(p, group, stream);
  return launch_decode_e<8>(p, group, stream);
}

template <int kRows, typename T>
void launch_rows(const PagedAttentionKernelParams& p, cudaStream_t stream) {
  const bool v_in_k = p.v_offset == p.k_offset && p.head_dim_v <= p.head_dim_qk;
  const int smem =
      smem_layout(kRows, p.head_dim_qk, p.head_dim_v, v_in_k, static_cast<int>(sizeof(T))).total;
  open_dynamic_smem(reinterpret_cast<const void*>(&paged_attention_kernel<kRows, T>), smem);
  dim3 grid(static_cast<unsigned>(p.max_tiles), static_cast<unsigned>(p.num_kv_heads),
            static_cast<unsigned>(p.num_splits));
  paged_attention_kernel<kRows, T><<<grid, kThreads, smem, stream>>>(p);
}

}  // namespace

int gqa_decode_head_split() {
  return g_head_split.load();
}
void set_gqa_decode_head_split(int hs) {
  g_head_split.store(hs);
}
int gqa_decode_token_warps() {
  return g_token_warps.load();
}
void set_gqa_decode_token_warps(int tw) {
  g_token_warps.store(tw);
}

bool gqa_decode_enabled() {
  // DEEPINFER_ATTN_DECODE=generic: the A/B switch
  static const bool on = !di::env::is("DEEPINFER_ATTN_DECODE", "generic");
  return on;
}

bool gqa_decode_shape_ok(const PagedAttentionKernelParams& p) {
  if (p.pool_f32 != nullptr || p.num_tokens > p.num_seqs || p.num_seqs > 65535) return false;
  if (p.num_kv_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0) return false;
  return p.head_dim_qk == p.head_dim_v && p.v_offset != p.k_offset;
}

bool gqa_decode_supported(const PagedAttentionKernelParams& p) {
  if (!gqa_decode_shape_ok(p)) return false;
  const int d = p.head_dim_qk, e = d / 32;
  if (d != 64 && d != 128 && d != 256) return false;
  if ((p.k_offset | p.v_offset | p.kv_head_stride | p.entry_size) % e != 0) return false;
  const int group = p.num_q_heads / p.num_kv_heads;
  return group == 1 || group == 2 || group == 4 || group == 8;
}

AttentionPlan plan_paged_attention(int32_t num_seqs, int32_t num_tokens, int32_t max_kv_len,
                                   int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim_qk,
                                   int32_t head_dim_v) {
  AttentionPlan plan;
  const int64_t group = num_kv_heads > 0 ? num_q_heads / num_kv_heads : 1;
  // Many rows per (sequence, kv head): 64-row tiles reuse each K/V tile 4x more (prefill).
  const int64_t rows_per_seq = num_seqs > 0 ? int64_t{num_tokens} * group / num_seqs : 0;
  plan.rows_per_tile = (rows_per_seq >= 64 && head_dim_qk <= 256 && head_dim_v <= 256) ? 64 : 16;
  plan.max_tiles = static_cast<int32_t>(
      (int64_t{num_tokens} * group + plan.rows_per_tile - 1) / plan.rows_per_tile + num_seqs);
  const int32_t kv = max_kv_len > 0 ? max_kv_len : 1;
  // Split the KV only for decode-like batches (few new tokens per sequence), with a fixed split
  // size of 64 tokens (doubled while the workspace would exceed 512 MB): 64 beat 128 and 256 at
  // batch 1-8 on the H200 (docs/performance.md), at a 3-10% cost at batch 128-256.
  plan.split_size = 1 << 30;  // one split covers any context
  plan.num_splits = 1;
  // DEEPINFER_ATTN_SPLIT overrides the split size (a fixed value keeps batch invariance).
  static const int32_t kSplit = [] {
    const int v = di::env::get_int("DEEPINFER_ATTN_SPLIT", 0);  // 0 | 16..
    return v >= 16 ? v : 64;
  }();
  if (num_tokens <= 8 * num_seqs && kv > kSplit) {
    int32_t split = kSplit;
    auto bytes = [&](int32_t sp) {
      const int64_t splits = (kv + sp - 1) / sp;
      return static_cast<size_t>(splits) * num_tokens * num_q_heads * (head_dim_v + 2) * 4;
    };
    while (bytes(split) > (size_t{512} << 20) && split < kv) split *= 2;
    if (split < kv) {
      plan.split_size = split;
      plan.num_splits = (kv + split - 1) / split;
      plan.partial_bytes = bytes(split);
    }
  }
  return plan;
}

size_t paged_attention_smem_bytes(int32_t rows_per_tile, int32_t head_dim_qk, int32_t head_dim_v,
                                  bool v_in_k, int32_t elem_size) {
  return static_cast<size_t>(
      smem_layout(rows_per_tile, head_dim_qk, head_dim_v, v_in_k, elem_size).total);
}

// On by default since run 39 (Qwen3-30B-A3B batch 1 +0.7 % alone, docs/performance.md):
// combine_split_row_warp where it applies; DEEPINFER_COMBINE_WARP=0 (or set_split_combine_warp(0))
// takes the block merge.
static EnvSetting g_combine_warp{"DEEPINFER_COMBINE_WARP", 1};
static std::atomic<int64_t> g_combine_warp_launches{0};
void set_split_combine_warp(int on) {
  g_combine_warp.store(on);
}
int split_combine_warp() {
  return g_combine_warp.load();
}
int64_t split_combine_warp_launches() {
  return g_combine_warp_launches.load(std::memory_order_relaxed);
}

void launch_split_combine(const PagedAttentionKernelParams& p, cudaStream_t stream) {
  if (p.num_splits <= 1) return;
  const auto rows = static_cast<unsigned>(int64_t{p.num_tokens} * p.num_q_heads);
  // Few rows: the o values requested with the (max, sum) loads (split_combine.cuh); at most 64
  // splits: the same merge without barriers (combine_split_row_warp; 128 threads per CTA).
  const bool few = rows <= kCombinePreloadMaxRows;
  const bool warp = few && p.num_splits <= kPreLoaded && g_combine_warp.load() != 0;
  if (warp) g_combine_warp_launches.fetch_add(1, std::memory_order_relaxed);
  (void)launch_decode(kPdlSplitCombine,
                      warp  ? combine_splits_kernel<bf16, kPreLoaded, true>
                      : few ? combine_splits_kernel<bf16, kPreLoaded>
                            : combine_splits_kernel<bf16>,
                      dim3(rows, ceil_div(p.head_dim_v, 128)), dim3(128), 0, stream, p);
}

void launch_paged_attention(const PagedAttentionKernelParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0 || p.num_seqs == 0) return;
  const int group = p.num_q_heads / p.num_kv_heads;
  const bool f32 = p.pool_f32 != nullptr;
  if (gqa_decode_enabled() && (launch_gqa_decode_mma(p, stream) || launch_gqa_decode(p, stream))) {
    launch_split_combine(p, stream);
    return;
  }
  tile_indptr_kernel<<<1, 32, 0, stream>>>(p.qo_indptr, p.num_seqs, group, p.rows_per_tile,
                                           p.tile_indptr);
  if (p.rows_per_tile == 64)
    f32 ? launch_rows<64, float>(p, stream) : launch_rows<64, bf16>(p, stream);
  else
    f32 ? launch_rows<16, float>(p, stream) : launch_rows<16, bf16>(p, stream);
  if (p.num_splits > 1) {
    const auto rows = static_cast<unsigned>(int64_t{p.num_tokens} * p.num_q_heads);
    if (f32)
      combine_splits_kernel<float><<<dim3(rows, ceil_div(p.head_dim_v, 128)), 128, 0, stream>>>(p);
    else
      combine_splits_kernel<bf16><<<dim3(rows, ceil_div(p.head_dim_v, 128)), 128, 0, stream>>>(p);
  }
}

}  // namespace di::cuda
