// Absorbed MLA decode on tensor cores; see mla_decode.h for the decomposition.
//
// mma.sync.m16n8k16 (bf16 in, f32 accumulate) fragment layout, g = lane / 4, t = lane % 4:
//   A (16 x 16, row-major):  a0 = A[g][2t..2t+1]   a1 = A[g+8][2t..2t+1]
//                            a2 = A[g][2t+8..+9]   a3 = A[g+8][2t+8..+9]
//   B (16 x 8, "col" = stored n-major): b0 = B[2t..2t+1][g]   b1 = B[2t+8..+9][g]
//   C (16 x 8):              c0,c1 = C[g][2t..2t+1]   c2,c3 = C[g+8][2t..2t+1]
// (lower 16 bits of each register = the lower k / column index).
//
// Shared memory rows are padded by 8 bf16 (16 bytes): with dqk_pad % 16 == 0 the row stride in
// 4-byte words is 4 mod 8, so the 8 rows x 4 columns of a fragment load hit 32 distinct banks.
//
// Napkin math (V2-Lite, 16 heads, 576/512, 32-token tile): 36 KB of latent loaded per tile, then
// 16 x 32 x (576 + 512) x 2 = 1.1 MFLOP on tensor cores (~1 us of one SM's mma at worst) — the
// kernel is bound by the latent loads, which every head of the sequence now shares.
#include <cfloat>
#include <cstdlib>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/mla_decode.h"
#include "backend/cuda/kernels/split_combine.cuh"
#include "core/env.h"

namespace di::cuda {
namespace {

constexpr int kTok = 32;       // cache entries per tile
constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kSld = kTok + 8;  // f32 score row stride
constexpr int kPld = kTok + 8;  // bf16 probability row stride
constexpr int kMaxDqk = 576;
constexpr int kMaxDv = 512;

struct MlaSmem {
  int q_off, k_off, s_off, p_off, m_off, l_off, corr_off, pos_off, total;
};

__host__ __device__ inline MlaSmem mla_smem(int rows, int dqk) {
  const int ld = pad16(dqk) + 8;
  MlaSmem s;
  int off = 0;
  s.q_off = off;
  off += rows * ld * 2;
  s.k_off = off;
  off += kTok * ld * 2;
  s.s_off = off;
  off += 2 * rows * kSld * 4;
  s.p_off = off;
  off += rows * kPld * 2;
  s.m_off = off;
  off += rows * 4;
  s.l_off = off;
  off += rows * 4;
  s.corr_off = off;
  off += rows * 4;
  s.pos_off = off;
  off += rows * 4;
  s.total = off;
  return s;
}

// Two bf16 from different rows packed into one register (lo = first).
__device__ __forceinline__ uint32_t pack2(bf16 lo, bf16 hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(lo)) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16);
}

// One warp: prefix of groups * ceil(qlen * heads_per_group / rows) over the sequences.
__global__ void mla_tile_indptr_kernel(const int32_t* qo_indptr, int32_t num_seqs,
                                       int32_t heads_per_group, int32_t groups, int32_t rows,
                                       int32_t* tile_indptr) {
  const int lane = threadIdx.x;
  if (lane == 0) tile_indptr[0] = 0;
  int32_t carry = 0;
  for (int32_t base = 0; base < num_seqs; base += 32) {
    const int32_t s = base + lane;
    int32_t v =
        s < num_seqs
            ? groups * (((qo_indptr[s + 1] - qo_indptr[s]) * heads_per_group + rows - 1) / rows)
            : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t n = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += n;
    }
    if (s < num_seqs) tile_indptr[s + 1] = carry + v;
    carry += __shfl_sync(0xffffffffu, v, 31);
  }
}

// kMt: m16 tiles of query rows (rows = 16 kMt); kNt: n8 tiles of the output per warp (warp w
// owns output tiles w, w + 8, ..., i.e. dv <= 64 kNt).
template <int kMt, int kNt>
__global__ void __launch_bounds__(kThreads, 2) mla_decode_kernel(MlaDecodeParams p) {
  pdl_trigger();  // the next (PDL-launched) GEMV may start loading its weights
  constexpr int kRows = 16 * kMt;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tile = blockIdx.x, split = blockIdx.y;
  if (tile >= p.tile_indptr[p.num_seqs]) return;
  const int s = tile_owner(p.tile_indptr, p.num_seqs, tile);
  const int heads = p.num_heads;
  // Rows of this tile: (token, head hg0 + i) of the head group, token-major; rows r of the tile
  // are the group's rows row0 + r.
  const int hpg = heads / p.head_groups;
  const int q_begin = p.qo_indptr[s];
  const int seq_rows = (p.qo_indptr[s + 1] - q_begin) * hpg;  // rows of one head group
  const int tiles_per_group = (seq_rows + kRows - 1) / kRows;
  const int local = tile - p.tile_indptr[s];
  const int hg0 = local / tiles_per_group * hpg;
  const int row0 = (local % tiles_per_group) * kRows;
  const int nr = min(kRows, seq_rows - row0);  // >= 1 for a valid tile
  const int nblocks = p.kv_indptr[s + 1] - p.kv_indptr[s];
  const int kv_len = nblocks > 0 ? (nblocks - 1) * p.block_size + p.kv_last_len[s] : 0;
  const int32_t* blocks = p.kv_indices + p.kv_indptr[s];

  const int dqk = p.dqk, dv = p.dv, dpad = pad16(dqk), ld = dpad + 8, chunks = dpad / 8;
  const MlaSmem L = mla_smem(kRows, dqk);
  bf16* q_s = reinterpret_cast<bf16*>(smem + L.q_off);
  bf16* k_s = reinterpret_cast<bf16*>(smem + L.k_off);
  float* s_s = reinterpret_cast<float*>(smem + L.s_off);
  bf16* p_s = reinterpret_cast<bf16*>(smem + L.p_off);
  float* m_s = reinterpret_cast<float*>(smem + L.m_off);
  float* l_s = reinterpret_cast<float*>(smem + L.l_off);
  float* corr_s = reinterpret_cast<float*>(smem + L.corr_off);
  int* pos_s = reinterpret_cast<int*>(smem + L.pos_off);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;

  // Query rows (token-major: row r = (token (row0 + r) / hpg, head hg0 + (row0 + r) % hpg)).
  for (int r = tid; r < kRows; r += kThreads) {
    int pos = -1;
    if (r < nr) pos = min(p.positions[q_begin + (row0 + r) / hpg], kv_len - 1);
    pos_s[r] = pos;
    m_s[r] = -FLT_MAX;
    l_s[r] = 0.0f;
    corr_s[r] = 1.0f;
  }
  // P rows >= nr are never written by the softmax (it skips them): zeros, so the P·V mma of
  // those (unstored) rows reads no stale shared memory.
  for (int i = tid; i < kRows * kPld / 2; i += kThreads) reinterpret_cast<uint32_t*>(p_s)[i] = 0u;
  // Query dims [0, dq) from q, [dq, dqk) from q_rope (a chunk of 8 never straddles the two).
  const int dq = p.q_rope != nullptr ? p.dq : dqk;
  for (int idx = tid; idx < kRows * chunks; idx += kThreads) {
    const int r = idx / chunks, c = idx % chunks;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < nr && c * 8 < dqk) {
      const int tok = q_begin + (row0 + r) / hpg, h = hg0 + (row0 + r) % hpg;
      const int64_t qrow = int64_t{tok} * heads + h;
      const bf16* src =
          c * 8 < dq ? p.q + qrow * dq + c * 8 : p.q_rope + qrow * (dqk - dq) + (c * 8 - dq);
      v = *reinterpret_cast<const uint4*>(src);
    }
    *reinterpret_cast<uint4*>(q_s + r * ld + c * 8) = v;
  }
  __syncthreads();
  int max_pos = -1;
  for (int r = 0; r < kRows; ++r) max_pos = max(max_pos, pos_s[r]);
  const int kv_begin = split * p.split_size;
  const int kv_end = min(max_pos + 1, kv_begin + p.split_size);

  float acc[kMt][kNt][4];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.0f;

  const int nsteps = dpad / 16;
  const int s_nt = warp & 3, s_half = warp >> 2;  // score work of this warp
  const int ks_begin = s_half ? nsteps / 2 : 0, ks_end = s_half ? nsteps : nsteps / 2;

  for (int kv0 = kv_begin; kv0 < kv_end; kv0 += kTok) {
    const int n = min(kTok, kv_end - kv0);
    // Stage entries [kv0, kv0 + n); rows >= n and the padding columns are zero (0 · garbage
    // could be NaN in the P·V product).
    for (int idx = tid; idx < kTok * chunks; idx += kThreads) {
      const int j = idx / chunks, c = idx % chunks;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (j < n && c * 8 < dqk) {
        const int tok = kv0 + j;
        const int64_t blk = blocks[tok / p.block_size];
        const bf16* entry = p.pool + blk * p.block_stride + p.layer_offset +
                            int64_t{tok % p.block_size} * p.entry_size;
        v = *reinterpret_cast<const uint4*>(entry + c * 8);
      }
      *reinterpret_cast<uint4*>(k_s + j * ld + c * 8) = v;
    }
    __syncthreads();

    // Scores: warp (s_nt, s_half) computes S[:, 8 s_nt .. + 8) over its half of the k steps.
    {
      float c[kMt][4];
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) c[mt][e] = 0.0f;
      const bf16* krow = k_s + (s_nt * 8 + g) * ld + 2 * t4;
      for (int ks = ks_begin; ks < ks_end; ++ks) {
        const int k0 = ks * 16;
        const uint32_t b0 = ld_u32(krow + k0), b1 = ld_u32(krow + k0 + 8);
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
          const bf16* qa = q_s + (mt * 16 + g) * ld + k0 + 2 * t4;
          const uint32_t a[4] = {ld_u32(qa), ld_u32(qa + 8 * ld), ld_u32(qa + 8),
                                 ld_u32(qa + 8 * ld + 8)};
          mma_bf16_16816(c[mt], a, b0, b1);
        }
      }
      float* sh = s_s + s_half * kRows * kSld;
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        const int r = mt * 16 + g, col = s_nt * 8 + 2 * t4;
        sh[r * kSld + col] = c[mt][0];
        sh[r * kSld + col + 1] = c[mt][1];
        sh[(r + 8) * kSld + col] = c[mt][2];
        sh[(r + 8) * kSld + col + 1] = c[mt][3];
      }
    }
    __syncthreads();

    // Online softmax, one warp per row, lane = entry (rows >= nr: no query, nothing to do).
    for (int r = warp; r < nr; r += kWarps) {
      const bool valid = lane < n && kv0 + lane <= pos_s[r];
      const float raw = s_s[r * kSld + lane] + s_s[(kRows + r) * kSld + lane];
      const float sc = valid ? raw * p.scale : -INFINITY;
      const float m_old = m_s[r];
      const float m_new = fmaxf(m_old, warp_max(sc));
      const float e = valid ? expf(sc - m_new) : 0.0f;
      const float sum = warp_sum(e);
      p_s[r * kPld + lane] = __float2bfloat16_rn(e);
      __syncwarp();  // every lane has read m_s[r] before lane 0 rewrites it (racecheck, run 16)
      if (lane == 0) {
        const float corr = expf(m_old - m_new);  // 0 on the first valid tile, 1 without change
        corr_s[r] = corr;
        l_s[r] = l_s[r] * corr + sum;
        m_s[r] = m_new;
      }
    }
    __syncthreads();

    // O = O · corr + P · V, V = the first dv columns of the staged entries.
    scale_acc_rows(acc, corr_s, g);
#pragma unroll
    for (int ks = 0; ks < kTok / 16; ++ks) {
      const int k0 = ks * 16;
      uint32_t a[kMt][4];
      load_a_frags(a, p_s, kPld, k0, g, t4);
      const bf16* v0 = k_s + (k0 + 2 * t4) * ld;  // entries k0 + 2t, +1, +8, +9
#pragma unroll
      for (int j = 0; j < kNt; ++j) {
        const int col0 = (warp + kWarps * j) * 8;
        if (col0 >= dv) break;  // warp-uniform
        const int col = col0 + g;
        const uint32_t b0 = pack2(v0[col], v0[ld + col]);
        const uint32_t b1 = pack2(v0[8 * ld + col], v0[9 * ld + col]);
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) mma_bf16_16816(acc[mt][j], a[mt], b0, b1);
      }
    }
    __syncthreads();  // k_s, s_s, p_s, corr_s are rewritten by the next tile
  }

  // Write out: normalised rows (one split) or the partial state.
  const int64_t rows_total = int64_t{p.num_tokens} * heads;
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 16 + g + 8 * half;
      if (r >= nr) continue;
      const int64_t grow = int64_t{q_begin + (row0 + r) / hpg} * heads + hg0 + (row0 + r) % hpg;
      const float l = l_s[r];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
      for (int j = 0; j < kNt; ++j) {
        const int col = (warp + kWarps * j) * 8 + 2 * t4;
        if (col >= dv) break;
        const float x = acc[mt][j][2 * half], y = acc[mt][j][2 * half + 1];
        if (p.num_splits == 1) {
          *reinterpret_cast<__nv_bfloat162*>(p.out + grow * dv + col) =
              __floats2bfloat162_rn(x * inv, y * inv);
        } else {
          const int64_t prow = int64_t{split} * rows_total + grow;
          *reinterpret_cast<float2*>(p.partial_o + prow * dv + col) = make_float2(x, y);
        }
      }
    }
  }
  if (p.num_splits > 1) {
    for (int r = tid; r < nr; r += kThreads) {
      const int64_t grow = int64_t{q_begin + (row0 + r) / hpg} * heads + hg0 + (row0 + r) % hpg;
      const int64_t prow = int64_t{split} * rows_total + grow;
      p.partial_ml[prow * 2] = l_s[r] > 0.0f ? m_s[r] : -INFINITY;
      p.partial_ml[prow * 2 + 1] = l_s[r];
    }
  }
}

// Merges the splits of every (token, head) row (split_combine.cuh).
__global__ void __launch_bounds__(128) mla_combine_kernel(MlaDecodeParams p) {
  DI_TRACE_SCOPE(kTraceCombineSplits, 1);  // combine_split_row records its wait
  combine_split_row<bf16>(p.partial_o, p.partial_ml, int64_t{p.num_tokens} * p.num_heads,
                          p.num_splits, p.dv, blockIdx.x, p.out);
}

template <int kMt, int kNt>
void launch_mt_nt(const MlaDecodeParams& p, cudaStream_t stream) {
  const int smem = mla_smem(16 * kMt, p.dqk).total;
  open_dynamic_smem(reinterpret_cast<const void*>(&mla_decode_kernel<kMt, kNt>), smem);
  const dim3 grid(static_cast<unsigned>(p.max_tiles), static_cast<unsigned>(p.num_splits));
  mla_decode_kernel<kMt, kNt><<<grid, kThreads, smem, stream>>>(p);
}

template <int kMt>
void launch_mt(const MlaDecodeParams& p, cudaStream_t stream) {
  if (p.dv <= 64)
    launch_mt_nt<kMt, 1>(p, stream);
  else if (p.dv <= 128)
    launch_mt_nt<kMt, 2>(p, stream);
  else if (p.dv <= 256)
    launch_mt_nt<kMt, 4>(p, stream);
  else
    launch_mt_nt<kMt, 8>(p, stream);
}

}  // namespace

bool mla_decode_supported(int32_t num_kv_heads, int32_t k_offset, int32_t v_offset, int32_t dqk,
                          int32_t dv, int32_t entry_size) {
  return num_kv_heads == 1 && k_offset == 0 && v_offset == 0 && dv > 0 && dv < dqk &&
         dqk % 8 == 0 && dv % 8 == 0 && dqk <= kMaxDqk && dv <= kMaxDv && entry_size % 8 == 0 &&
         entry_size >= dqk;
}

namespace {
int32_t g_head_split_override = -1;
}  // namespace

void set_mla_head_split_override(int32_t head_split) {
  g_head_split_override = head_split;
}

int32_t mla_head_split_setting() {
  if (g_head_split_override >= 0) return g_head_split_override;
  static const int32_t setting = [] {
    const int v = di::env::get_int("DEEPINFER_MLA_HEAD_SPLIT", 0);  // 0: by the batch
    if (v > 0) return v;
    return batch_invariant_env() ? 1 : 0;
  }();
  return setting;
}

MlaDecodePlan plan_mla_decode(int32_t num_seqs, int32_t num_tokens, int32_t max_kv_len,
                              int32_t num_heads, int32_t dv, int32_t num_sms) {
  MlaDecodePlan plan;
  const int64_t per_seq = num_seqs > 0 ? (int64_t{num_tokens} + num_seqs - 1) / num_seqs : 1;
  static const int32_t kSplit = [] {
    const int v = di::env::get_int("DEEPINFER_MLA_SPLIT", 0);  // 0 | 16..
    return v >= 16 ? v : 64;
  }();
  const int32_t kv = max_kv_len > 0 ? max_kv_len : 1;
  plan.split_size = 1 << 30;
  plan.num_splits = 1;
  if (kv > kSplit) {
    auto bytes = [&](int64_t sp) {
      const int64_t splits = (kv + sp - 1) / sp;
      return static_cast<size_t>(splits) * num_tokens * num_heads * (dv + 2) * 4;
    };
    int64_t split = kSplit;
    while (bytes(split) > (size_t{512} << 20) && split < kv) split *= 2;
    if (split < kv) {
      plan.split_size = static_cast<int32_t>(split);
      plan.num_splits = static_cast<int32_t>((kv + split - 1) / split);
      plan.partial_bytes = bytes(split);
    }
  }
  // Head groups: powers of two dividing the heads. Auto: while the working CTAs (per sequence
  // ⌈per_seq · heads / g / rows⌉ tiles, times splits and g) fit in one pass of the SMs, up to 4
  // (V2-Lite, 16 heads, ctx 2048: batch 1 -> 4 groups, 132 CTAs; batch 2 -> 2; batch >= 4 -> 1).
  const int32_t setting = mla_head_split_setting();
  auto ctas = [&](int64_t g) {
    const int64_t hpg = num_heads / g, rows = per_seq * hpg >= 32 ? 32 : 16;
    return num_seqs * g * ((per_seq * hpg + rows - 1) / rows) * plan.num_splits;
  };
  int32_t groups = 1;
  const int32_t cap = setting > 0 ? setting : 4;
  while (2 * groups <= cap && num_heads % (2 * groups) == 0 &&
         (setting > 0 || ctas(2 * groups) <= num_sms))
    groups *= 2;
  plan.head_groups = groups;
  const int64_t hpg = num_heads / groups;
  plan.rows_per_tile = per_seq * hpg >= 32 ? 32 : 16;
  plan.max_tiles = static_cast<int32_t>((int64_t{num_tokens} * num_heads + plan.rows_per_tile - 1) /
                                            plan.rows_per_tile +
                                        int64_t{num_seqs} * groups);
  return plan;
}

size_t mla_decode_smem_bytes(int32_t rows_per_tile, int32_t dqk) {
  return static_cast<size_t>(mla_smem(rows_per_tile, dqk).total);
}

void launch_mla_decode(const MlaDecodeParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0 || p.num_seqs == 0) return;
  mla_tile_indptr_kernel<<<1, 32, 0, stream>>>(p.qo_indptr, p.num_seqs, p.num_heads / p.head_groups,
                                               p.head_groups, p.rows_per_tile, p.tile_indptr);
  if (p.rows_per_tile == 32)
    launch_mt<2>(p, stream);
  else
    launch_mt<1>(p, stream);
  if (p.num_splits > 1)
    mla_combine_kernel<<<dim3(static_cast<unsigned>(int64_t{p.num_tokens} * p.num_heads),
                             ceil_div(p.dv, 128)),
                         128, 0, stream>>>(p);
}

}  // namespace di::cuda
