// Absorbed MLA decode with the split merge in the kernel (thread-block clusters); see
// mla_decode_cluster.h for the decomposition.
//
// Napkin math (DeepSeek-V2-Lite, 16 heads, 576 / 512, batch 1, context 2048): 2.36 MB of latent
// per layer, ~0.6 us at 4.3 TB/s; 65 splits of 32 entries -> 9 clusters of 8 CTAs, each CTA
// fetching 37 KB of latent + 18 KB of query (~0.4 us at ~130 GB/s per SM). The time is the
// chain of dependent steps: metadata -> block ids -> latent -> one stage of mma / softmax ->
// cluster merge (8 x 4 KB of DSMEM per CTA) -> partial write + atomic -> the last cluster's
// merge (9 x 4 KB per CTA). 16 x 32 x (576 + 512) x 2 = 1.1 MFLOP of mma per CTA is noise.
// Measured: 15.2 us per layer (ncu), the tile kernel's three launches 28.1 us.
//
// mma.sync.m16n8k16 fragments, g = lane / 4, t = lane % 4 (lower 16 bits = lower index):
//   A (16 x 16): a0 = A[g][2t..+1]  a1 = A[g+8][2t..+1]  a2 = A[g][2t+8..+9]  a3 = A[g+8][2t+8..+9]
//   B (16 x 8):  b0 = B[2t..+1][g]  b1 = B[2t+8..+9][g]
//   C (16 x 8):  c0,c1 = C[g][2t..+1]  c2,c3 = C[g+8][2t..+1]
// Shared rows are padded by 8 bf16 (16 bytes): the row stride in words is 4 mod 8 (576 + 8 =
// 584 bf16 = 292 words), so fragment loads and ldmatrix rows hit distinct banks.
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cstdlib>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/head_linear.cuh"
#include "backend/cuda/kernels/mla_decode_cluster.h"
#include "backend/cuda/kernels/mla_token.cuh"
#include "core/env.h"

namespace di::cuda {
namespace {

constexpr int kTok = 32;       // cache entries per stage
constexpr int kStages = 2;     // stage buffers of a split longer than one stage
constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kSld = kTok + 8;  // f32 score row stride
constexpr int kPld = kTok + 8;  // bf16 probability row stride
constexpr int kMaxDqk = 576;
constexpr int kMaxDv = 512;
constexpr int kDefaultSplit = 32;
// From 32 decode tokens on, 128-entry splits (a quarter of the CTAs and partials), from 128 on
// 256: V2-Lite batch 32 / 256 2,696 / 8,107 -> 2,820 / 9,480 tok/s at 128 (batch 1 would lose:
// 357.7 -> 326.4), batch 256 9,420 -> 10,133 at 256 (batch 8 / 32 -2.3 / -0.5 %), H200, run 15.
constexpr int kLargeBatchTokens = 32;
constexpr int kLargeBatchSplit = 128;
constexpr int kHugeBatchTokens = 128;
constexpr int kHugeBatchSplit = 256;
// Below 32 tokens, a token whose context is longer than 1024 entries takes 64-entry splits (two
// stages per CTA, half the clusters and partials): V2-Lite batch 1 at ctx 2048 416.0 -> 428.5 /
// 426.1 tok/s, ctx 8192 386.9 -> 396.2, batch 4 752.9 -> 758.7, batch 8 flat, with every token
// at 64 (DEEPINFER_MLA_CLUSTER_SPLIT=64, H200 run 18 calls 7-8); at ctx 512 that lost (441.9 ->
// 433.0), so shorter contexts keep 32. Chosen per token from its own context, not the launch's
// longest, so that a sequence's bits do not depend on its batch or the graph's context bucket.
constexpr int kLongContextEntries = 1024;
constexpr int kLongContextSplit = 64;
// The deferred merge (batch 1) keeps 32-entry splits up to 4096 entries: with the k-split merge
// the parts of a split cost little more to merge, and twice the CTAs read the context (V2-Lite
// ctx 2048, H200 run 24: 491.8 / 492.9 tok/s at 64 -> 493.9 / 493.9 at 32).
constexpr int kDeferLongContextEntries = 4096;
static_assert(kMlaCluster == 8, "the column slices and weight rows assume 8 CTAs per cluster");

__host__ __device__ inline int align16(int b) {
  return (b + 15) & ~15;
}

// Stage buffers: one when a split is one stage (the default 32: 63 KB of shared memory at 16 x
// 576, 3 CTAs per SM), else two (fetched ahead).
__host__ __device__ inline int stage_buffers(int split) {
  return split <= kTok ? 1 : kStages;
}

// Dynamic shared memory, byte offsets. `kv` holds the latent stages; after the last stage it
// holds the CTA's partial O (rows x dv f32, read by the cluster).
struct ClusterSmem {
  int q_off, kv_off, kv_bytes, s_off, p_off, m_off, l_off, corr_off, blk_off, total;
};

__host__ __device__ inline ClusterSmem cluster_smem(int rows, int dqk, int dv, int split) {
  const int ld = pad16(dqk) + 8;
  ClusterSmem s;
  int off = 0;
  s.q_off = off;
  off += align16(rows * ld * 2);
  s.kv_off = off;
  const int stages = stage_buffers(split) * kTok * ld * 2, o_bytes = rows * dv * 4;
  s.kv_bytes = align16(stages > o_bytes ? stages : o_bytes);
  off += s.kv_bytes;
  s.s_off = off;
  off += 2 * rows * kSld * 4;
  s.p_off = off;
  off += align16(rows * kPld * 2);
  s.m_off = off;
  off += rows * 4;
  s.l_off = off;
  off += rows * 4;
  s.corr_off = off;
  off += rows * 4;
  s.blk_off = off;  // block ids of the split: at most split / block_size + 2
  off += (split + 2) * 4;
  s.total = align16(off);
  return s;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronous; zero-filled (nothing read) when !valid.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}

// A merged row's `vec` (4 or 1) columns o · inv to the bf16 output.
__device__ __forceinline__ void store_out(bf16* dst, const float (&o)[4], float inv, int vec) {
  if (vec == 4) {
    reinterpret_cast<__nv_bfloat162*>(dst)[0] = __floats2bfloat162_rn(o[0] * inv, o[1] * inv);
    reinterpret_cast<__nv_bfloat162*>(dst)[1] = __floats2bfloat162_rn(o[2] * inv, o[3] * inv);
  } else {
    dst[0] = __float2bfloat16_rn(o[0] * inv);
  }
}

__device__ __forceinline__ float ld_cluster(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float4 ld_cluster4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// kMt: m16 tiles of heads (rows = 16 kMt); kNt: n8 output tiles per warp (warp w owns tiles w,
// w + 8, ...: dv <= 64 kNt).
// kMinBlocks: CTAs per SM the registers must allow (2: <= 128 per thread, 3: <= 80).
// The merges' fold of N partial states (max m_j, sum l_j, O v_j) under the running max mx:
// w_j = e^(m_j - mx) (0 where m_j is -inf: no entries), sum += w_j l_j, o += w_j v_j, j in order.
template <int N>
__device__ __forceinline__ void add_weighted(const float (&m)[N], const float (&l)[N],
                                             const float4 (&v)[N], float mx, float& sum,
                                             float (&o)[4]) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float w = m[j] == -INFINITY ? 0.0f : expf(m[j] - mx);
    sum += w * l[j];
    o[0] += w * v[j].x;
    o[1] += w * v[j].y;
    o[2] += w * v[j].z;
    o[3] += w * v[j].w;
  }
}

template <int kMt, int kNt, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    mla_cluster_decode_kernel(MlaClusterDecodeParams p) {
  DI_TRACE_SCOPE(kTraceMlaClusterDecode, 0);
  // The next (PDL-launched) kernel may start: the merge, whose start launches o_proj and its
  // early weight loads; after this kernel's wait by default, so that they do not sit in front of
  // the prologue's and this kernel's reads (run 42: V2-Lite batch 1 +1.7 %; see the GQA kernel).
  const bool late_trigger = p.late_trigger != 0;
  if (!late_trigger) pdl_trigger();
  // Phase timing (MlaClusterDecodeParams::timing; a warp-uniform test of a kernel parameter).
  const long long t_start = clock64();
  unsigned long long* const tm =
      p.timing == nullptr || threadIdx.x != 0
          ? nullptr
          : p.timing + ((int64_t{blockIdx.z} * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) *
                           kMlaTimingSlots;
  if (tm != nullptr) tm[0] = globaltimer_ns();
  auto mark = [&](int i) {
    if (tm == nullptr) return;
    tm[2 + i] = static_cast<unsigned long long>(clock64() - t_start);
    if (i == kMlaEnd) tm[1] = globaltimer_ns();
  };
  constexpr int kRows = 16 * kMt;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int last_s;
  const int split = blockIdx.x, tile = blockIdx.y, t = blockIdx.z;
  const int rank = split % kMlaCluster, cluster_idx = split / kMlaCluster;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;

  // 1. Sequence and context.
  const MlaTokenContext ctx = mla_token_context(p, t);
  const int kv_first = ctx.kv_first, n_kv = ctx.n_kv, old_end = ctx.old_end;
  const int split_size = n_kv > p.long_split_from ? p.long_split_size : p.split_size;
  const int own_splits = (n_kv + split_size - 1) / split_size;
  const int own_clusters = max(1, (own_splits + kMlaCluster - 1) / kMlaCluster);
  const int h0 = tile * kRows, nr = min(kRows, p.num_heads - h0);
  const int64_t rows_total = int64_t{p.num_tokens} * p.num_heads;
  const int64_t row0 = int64_t{t} * p.num_heads + h0;  // global row of tile row 0
  // Past the token's own splits (deferred: mla_merge_uv never reads them) or clusters (the
  // whole cluster leaves: same token, same inputs).
  if (p.defer ? split >= own_splits : cluster_idx >= own_clusters) {
    mark(kMlaEnd);
    return;
  }

  const int kv_begin = split * split_size, kv_end = min(n_kv, kv_begin + split_size);
  const int nstages = kv_end > kv_begin ? (kv_end - kv_begin + kTok - 1) / kTok : 0;

  const int dqk = p.dqk, dv = p.dv, dpad = pad16(dqk), ld = dpad + 8, chunks = dpad / 8;
  const ClusterSmem L = cluster_smem(kRows, dqk, dv, p.long_split_size);  // the launch's layout
  bf16* q_s = reinterpret_cast<bf16*>(smem + L.q_off);
  bf16* kv_s = reinterpret_cast<bf16*>(smem + L.kv_off);
  float* s_s = reinterpret_cast<float*>(smem + L.s_off);
  bf16* p_s = reinterpret_cast<bf16*>(smem + L.p_off);
  float* m_s = reinterpret_cast<float*>(smem + L.m_off);
  float* l_s = reinterpret_cast<float*>(smem + L.l_off);
  float* corr_s = reinterpret_cast<float*>(smem + L.corr_off);
  int* blk_s = reinterpret_cast<int*>(smem + L.blk_off);

  for (int r = tid; r < kRows; r += kThreads) {
    m_s[r] = -FLT_MAX;
    l_s[r] = 0.0f;
    corr_s[r] = 1.0f;
  }
  float acc[kMt][kNt][4];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.0f;

  const int first_blk = kv_begin / p.block_size, nbuf = stage_buffers(split_size);
  // Stage i -> buffer i % nbuf: its entries in [lo, hi) (the split's are [kv0, kv0 + n)); with
  // `pad` also the rows >= n as zeros, like the padding columns (P is 0 there, but 0 x garbage
  // could be NaN in the P·V product). A warp per entry, lanes over its 16-byte chunks: the
  // address arithmetic is per entry (4 per thread), not per chunk (two integer divisions per
  // chunk cost more issue slots than the copies: ncu, 29 Nov).
  auto fetch_stage = [&](int i, int lo, int hi, bool pad) {
    bf16* dst = kv_s + (i % nbuf) * kTok * ld;
    const int kv0 = kv_begin + i * kTok, n = min(kTok, kv_end - kv0);
#pragma unroll
    for (int j = warp; j < kTok; j += kWarps) {
      const int tok = kv0 + j;
      const bool in = j < n && tok >= lo && tok < hi;
      if (!in && !(pad && j >= n)) continue;  // warp-uniform
      const bf16* entry = p.pool;
      if (in) {
        const int64_t blk = blk_s[tok / p.block_size - first_blk];
        entry = p.pool + blk * p.block_stride + p.layer_offset +
                int64_t{tok % p.block_size} * p.entry_size;
      }
      for (int c = lane; c < chunks; c += 32) {
        const bool valid = in && c * 8 < dqk;
        cp_async16(dst + j * ld + c * 8, valid ? entry + c * 8 : p.pool, valid);
      }
    }
  };

  // Launched as a PDL dependent of the previous kernel (the query's producer): before pdl_wait
  // it reads only what that kernel cannot be writing: the batch metadata, the block ids and the
  // cache entries of earlier steps (< old_end); it writes nothing.
  constexpr int kAll = 0x7fffffff;
  if (nstages > 0) {
    for (int r = tid; r < kRows * kPld / 2; r += kThreads) reinterpret_cast<uint32_t*>(p_s)[r] = 0u;
    const int nblk = (kv_end - 1) / p.block_size - first_blk + 1;
    for (int i = tid; i < nblk; i += kThreads) blk_s[i] = p.kv_indices[kv_first + first_blk + i];
    __syncthreads();
    fetch_stage(0, 0, old_end, true);
    cp_async_commit();  // group 0: stage 0's old entries
    if (nstages > 1) fetch_stage(1, 0, old_end, true);
  }
  mark(kMlaPreWait);
  pdl_wait();
  DI_TRACE_WAITED();
  if (late_trigger) pdl_trigger();
  mark(kMlaWaited);
  if (nstages > 0) {
    fetch_stage(0, old_end, kAll, false);  // this step's entries
    if (nstages > 1) fetch_stage(1, old_end, kAll, false);
    // Query rows (head h0 + r of token t), dims [0, dq) from q and [dq, dqk) from q_rope (a
    // chunk of 8 never straddles the two); rows >= nr and the padding columns zero.
    const int dq = p.q_rope != nullptr ? p.dq : dqk;
#pragma unroll
    for (int r = warp; r < kRows; r += kWarps) {
      const int64_t qrow = int64_t{t} * p.num_heads + h0 + r;
      for (int c = lane; c < chunks; c += 32) {
        const bool valid = r < nr && c * 8 < dqk;
        const bf16* src = p.pool;
        if (valid)
          src = c * 8 < dq ? p.q + qrow * dq + c * 8 : p.q_rope + qrow * (dqk - dq) + (c * 8 - dq);
        cp_async16(q_s + r * ld + c * 8, src, valid);
      }
    }
    cp_async_commit();  // group 1: the rest of stages 0 and 1, and the query
  }

  const int nsteps = dpad / 16;
  const int s_nt = warp & 3, s_half = warp >> 2;  // score work of this warp
  const int ks_begin = s_half ? nsteps / 2 : 0, ks_end = s_half ? nsteps : nsteps / 2;

  // 2. The stages: stage 0 needs groups 0 and 1 (the query); before iteration i >= 1, i + 2
  // groups are committed, and all but the newest complete stage i.
  for (int i = 0; i < nstages; ++i) {
    if (i == 0)
      cp_async_wait<0>();
    else
      cp_async_wait<1>();
    __syncthreads();
    if (i == 0) mark(kMlaStage0);
    const bf16* k_s = kv_s + (i % nbuf) * kTok * ld;
    const int kv0 = kv_begin + i * kTok, n = min(kTok, kv_end - kv0);

    // Scores: warp (s_nt, s_half) computes S[:, 8 s_nt .. + 8) over its half of the k steps.
    // Two accumulator chains (even / odd k steps) halve the dependent mma latency.
    {
      float c[2][kMt][4];
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) c[h][mt][e] = 0.0f;
      // ldmatrix.x4, lane L giving a row of matrix L / 8: the query's A fragments of one k step
      // (matrices rows 0-7 / 8-15 x k 0-7 / 8-15 = a0..a3), the entries' B fragments of two
      // (k 0-7, 8-15 of step ks, then of ks + 1 = b0, b1, b0, b1): the same fragments and mma
      // order as 32-bit loads, in 3 instead of 12 loads per step pair.
      const bf16* qa = q_s + ((lane & 7) + 8 * ((lane >> 3) & 1)) * ld + 8 * (lane >> 4);
      const bf16* kb = k_s + (s_nt * 8 + (lane & 7)) * ld + 8 * (lane >> 3);
      int ks = ks_begin;
      for (; ks + 1 < ks_end; ks += 2) {
        uint32_t b[4];
        ldsm_x4(b, kb + ks * 16);
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
          uint32_t a0[4], a1[4];
          ldsm_x4(a0, qa + mt * 16 * ld + ks * 16);
          ldsm_x4(a1, qa + mt * 16 * ld + ks * 16 + 16);
          mma_bf16_16816(c[0][mt], a0, b[0], b[1]);
          mma_bf16_16816(c[1][mt], a1, b[2], b[3]);
        }
      }
      if (ks < ks_end) {  // an odd count: the last step on chain 0
        const bf16* krow = k_s + (s_nt * 8 + g) * ld + 2 * t4 + ks * 16;
        const uint32_t b0 = ld_u32(krow), b1 = ld_u32(krow + 8);
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
          uint32_t a[4];
          ldsm_x4(a, qa + mt * 16 * ld + ks * 16);
          mma_bf16_16816(c[0][mt], a, b0, b1);
        }
      }
      float* sh = s_s + s_half * kRows * kSld;
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        const int r = mt * 16 + g, col = s_nt * 8 + 2 * t4;
        sh[r * kSld + col] = c[0][mt][0] + c[1][mt][0];
        sh[r * kSld + col + 1] = c[0][mt][1] + c[1][mt][1];
        sh[(r + 8) * kSld + col] = c[0][mt][2] + c[1][mt][2];
        sh[(r + 8) * kSld + col + 1] = c[0][mt][3] + c[1][mt][3];
      }
    }
    __syncthreads();
    if (i == 0) mark(kMlaScores0);

    // Online softmax, lane = entry; warp w takes rows w, w + 8, ... together (their shuffles
    // interleave). Rows >= nr have no query: their P stays 0, their (max, sum) unchanged.
    {
      constexpr int kRw = kRows / kWarps;
      float sc[kRw], mx[kRw], sum[kRw];
#pragma unroll
      for (int k = 0; k < kRw; ++k) {
        const int r = warp + k * kWarps;
        const bool valid = lane < n && r < nr;
        const float raw = s_s[r * kSld + lane] + s_s[(kRows + r) * kSld + lane];
        sc[k] = valid ? raw * p.scale : -INFINITY;
        mx[k] = sc[k];
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int k = 0; k < kRw; ++k) mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], o));
#pragma unroll
      for (int k = 0; k < kRw; ++k) {
        const int r = warp + k * kWarps;
        mx[k] = fmaxf(m_s[r], mx[k]);  // m_new
        sum[k] = sc[k] == -INFINITY ? 0.0f : expf(sc[k] - mx[k]);
        p_s[r * kPld + lane] = __float2bfloat16_rn(sum[k]);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int k = 0; k < kRw; ++k) sum[k] += __shfl_xor_sync(0xffffffffu, sum[k], o);
      if (lane == 0) {
#pragma unroll
        for (int k = 0; k < kRw; ++k) {
          const int r = warp + k * kWarps;
          const float corr = expf(m_s[r] - mx[k]);  // 0 on the first stage, 1 without change
          corr_s[r] = corr;
          l_s[r] = l_s[r] * corr + sum[k];
          m_s[r] = mx[k];
        }
      }
    }
    __syncthreads();
    if (i == 0) mark(kMlaSoftmax0);

    // O = O · corr + P · V, V = the first dv columns of the staged entries.
    scale_acc_rows(acc, corr_s, g);
    {
      // A: P's fragments of both k steps (ldmatrix.x4 as the scores' query); B: one
      // ldmatrix.x4.trans per n tile, lane L giving entry row L (b0, b1 of step 0, then of step
      // 1). Per accumulator the mma order is step 0, step 1, as before.
      static_assert(kTok == 32, "two k steps of P · V per stage");
      uint32_t a[2][kMt][4];
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt)
          ldsm_x4(a[kk][mt], p_s + (mt * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * kPld +
                                 8 * (lane >> 4) + kk * 16);
#pragma unroll
      for (int j = 0; j < kNt; ++j) {
        const int col0 = (warp + kWarps * j) * 8;
        if (col0 >= dv) break;  // warp-uniform
        uint32_t b[4];
        ldsm_x4_trans(b, k_s + lane * ld + col0);
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
          mma_bf16_16816(acc[mt][j], a[0][mt], b[0], b[1]);
          mma_bf16_16816(acc[mt][j], a[1][mt], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // this buffer, s_s, p_s and corr_s are rewritten next
    if (i + nbuf < nstages) fetch_stage(i + nbuf, 0, kAll, true);
    cp_async_commit();
  }
  cp_async_wait<0>();
  mark(kMlaStages);

  // This CTA's O (unnormalised, rows < `rows`) from the accumulator fragments into o [row][dv].
  // at(r, col): where row r's columns col, col + 1 go.
  auto write_o_at = [&](auto at, int rows) {
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mt * 16 + g + 8 * half;
        if (r >= rows) continue;
#pragma unroll
        for (int j = 0; j < kNt; ++j) {
          const int col = (warp + kWarps * j) * 8 + 2 * t4;
          if (col >= dv) break;
          *reinterpret_cast<float2*>(at(r, col)) =
              make_float2(acc[mt][j][2 * half], acc[mt][j][2 * half + 1]);
        }
      }
    }
  };
  auto write_o = [&](float* o, int rows) {
    write_o_at([&](int r, int col) { return o + r * dv + col; }, rows);
  };

  if (p.defer) {  // this split's unnormalised O and (max, sum) per row, for the consumer
    if (p.defer == 2) {  // [row][quarter][split][dv / 4]
      const int kq = dv / 4;
      write_o_at(
          [&](int r, int col) {
            return p.partial_o +
                   (((row0 + r) * 4 + col / kq) * p.num_splits + split) * int64_t{kq} + col % kq;
          },
          nr);
    } else {
      write_o(p.partial_o + (split * rows_total + row0) * dv, nr);
    }
    if (tid < nr) {
      const float l = l_s[tid];
      *reinterpret_cast<float2*>(p.partial_ml + (split * rows_total + row0 + tid) * 2) =
          make_float2(l > 0.0f ? m_s[tid] : -INFINITY, l);
    }
    mark(kMlaEnd);
    return;
  }

  // 3. The cluster's merge. This CTA's state: O (unnormalised) over the stage buffers, the
  // running max (-inf: nothing attended) and sum.
  float* o_s = reinterpret_cast<float*>(kv_s);
  write_o(o_s, kRows);
  for (int r = tid; r < kRows; r += kThreads)
    if (!(l_s[r] > 0.0f)) m_s[r] = -INFINITY;
  cluster_arrive();  // release: this CTA's o_s / m_s / l_s
  cluster_wait();
  mark(kMlaCluster1);

  // This CTA's columns [col0, col0 + cs) of every row, 4 at a time when cs allows (V2-Lite: 16
  // rows x 64 columns = one float4 of each of the 8 CTAs per thread). A thread loads its row's
  // (max, sum) and its columns' O from all 8 CTAs in one round of DSMEM loads and weighs them
  // itself (the same arithmetic as a per-row pass, without its round trip and block barrier).
  const int cs = dv / kMlaCluster, col0 = rank * cs;
  const int vec = cs % 4 == 0 ? 4 : 1, per_row = cs / vec;
  for (int idx = tid; idx < nr * per_row; idx += kThreads) {
    const int r = idx / per_row, col = col0 + (idx % per_row) * vec;
    float m[kMlaCluster], l[kMlaCluster];
    float4 v[kMlaCluster];
#pragma unroll
    for (int c = 0; c < kMlaCluster; ++c) {
      m[c] = ld_cluster(cluster_addr(m_s + r, c));
      l[c] = ld_cluster(cluster_addr(l_s + r, c));
      const uint32_t oa = cluster_addr(o_s + r * dv + col, c);
      v[c] = vec == 4 ? ld_cluster4(oa) : make_float4(ld_cluster(oa), 0.0f, 0.0f, 0.0f);
    }
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < kMlaCluster; ++c) mx = fmaxf(mx, m[c]);
    float sum = 0.0f, o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    add_weighted(m, l, v, mx, sum, o);
    if (own_clusters == 1) {
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      store_out(p.out + (row0 + r) * dv + col, o, inv, vec);
    } else {
      float* dst = p.partial_o + (cluster_idx * rows_total + row0 + r) * dv + col;
      if (vec == 4)
        *reinterpret_cast<float4*>(dst) = make_float4(o[0], o[1], o[2], o[3]);
      else
        dst[0] = o[0];
      if (idx % per_row == 0) {  // the row's (max, sum) of this cluster, for the last merge
        float* ml = p.partial_ml + ((cluster_idx * rows_total + row0 + r) * kMlaCluster + rank) * 2;
        *reinterpret_cast<float2*>(ml) = make_float2(sum > 0.0f ? mx : -INFINITY, sum);
      }
    }
  }
  cluster_arrive_relaxed();  // done reading the other CTAs' shared memory
  mark(kMlaMerged);

  // 4. Several clusters: the last to arrive for (token, head tile, column slice) merges.
  // NOTES: the barrier orders every thread's partial writes before thread 0's fence, which is
  // cumulative, and the fence before its atomic (the release pattern of cooperative groups' grid
  // sync): the CTA that counts last sees every partial of its column slice.
  uint32_t* counter =
      p.counters + (int64_t{t} * p.head_tiles + tile) * kMlaCluster + static_cast<int64_t>(rank);
  if (own_clusters > 1) {
    __syncthreads();
    if (tid == 0) {
      __threadfence();
      const bool last = atomicAdd(counter, 1u) == static_cast<uint32_t>(own_clusters - 1);
      if (last) __threadfence();  // acquire: the other clusters' partials (read through L2)
      last_s = last;
    }
    __syncthreads();
  }
  cluster_wait();  // nobody reads this CTA's shared memory any more: reuse it, or exit
  mark(kMlaVoted);
  if (own_clusters == 1 || !last_s) {
    mark(kMlaEnd);
    return;
  }

  // The last cluster's merge, per (row, 4 columns) thread and online over the clusters in
  // cluster order: each batch of kMerge clusters' (max, sum) and O is loaded at once (one round
  // of L2 loads per batch, no block-wide step), then folded in with a running max. Batches of 6:
  // V2-Lite at ctx 2048 has 5 clusters; 8 spilled 52 bytes at 80 registers (ptxas, sm_90a).
  constexpr int kMerge = 6;
  const int64_t cl_o = rows_total * dv, cl_ml = rows_total * kMlaCluster * 2;
  for (int idx = tid; idx < nr * per_row; idx += kThreads) {
    const int r = idx / per_row, col = col0 + (idx % per_row) * vec;
    const float* po = p.partial_o + (row0 + r) * dv + col;
    const float* ml = p.partial_ml + ((row0 + r) * kMlaCluster + rank) * 2;
    float mx = -INFINITY, sum = 0.0f, o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int c0 = 0; c0 < own_clusters; c0 += kMerge) {
      float m[kMerge], l[kMerge];
      float4 v[kMerge];
#pragma unroll
      for (int j = 0; j < kMerge; ++j) {
        const int cl = min(c0 + j, own_clusters - 1);  // past the last: loaded, not used
        const float2 e = __ldcg(reinterpret_cast<const float2*>(ml + cl * cl_ml));
        m[j] = c0 + j < own_clusters ? e.x : -INFINITY;
        l[j] = e.y;
        v[j] = vec == 4 ? __ldcg(reinterpret_cast<const float4*>(po + cl * cl_o))
                        : make_float4(__ldcg(po + cl * cl_o), 0.0f, 0.0f, 0.0f);
      }
      float bm = mx;
#pragma unroll
      for (int j = 0; j < kMerge; ++j) bm = fmaxf(bm, m[j]);
      if (bm == -INFINITY) continue;  // nothing attended so far
      const float a = expf(mx - bm);  // 0 on the first batch with a score
      sum *= a;
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] *= a;
      add_weighted(m, l, v, bm, sum, o);
      mx = bm;
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    store_out(p.out + (row0 + r) * dv + col, o, inv, vec);
  }
  // Every cluster of this token has counted; nothing else touches the counter before the kernel
  // ends, so a plain store readies it for the next launch (and graph replay).
  if (tid == 0) *counter = 0u;
  mark(kMlaEnd);
}

// ---- the deferred merge's consumer: W_UV of the merged rows (mla_decode_cluster.h) ----
// Shared memory past head_linear_smem_bytes: a chunk of parts [chunk][dv] f32, the weights
// [parts], the token's own part count [tokens], block-reduction scratch.
__host__ __device__ inline int merge_scratch_offset(int t, int k) {
  return (head_linear_smem_bytes(t, k) + 15) & ~15;
}
__host__ __device__ inline int merge_chunk(int parts) {
  return parts < kMlaMergeChunk ? parts : kMlaMergeChunk;
}

// The merge kernels' phase-timing slots of this CTA (thread 0 only; null when off).
__device__ inline unsigned long long* merge_timing(const MlaMergeUvParams& mp) {
  if (mp.timing == nullptr || threadIdx.x != 0) return nullptr;
  return mp.timing + (int64_t{blockIdx.y} * gridDim.x + blockIdx.x) * kMlaMergeTimingSlots;
}

// Each token's own parts, as the cluster kernel split its context (the batch metadata is no
// kernel's output: read before the wait), by threads tid, tid + nthreads, ...
__device__ inline void merge_own_parts(const MlaClusterDecodeParams& a, int tokens, int tid,
                                       int nthreads, int* own_s) {
  for (int r = tid; r < tokens; r += nthreads) {
    const int n_kv = mla_token_context(a, r).n_kv;
    const int split = n_kv > a.long_split_from ? a.long_split_size : a.split_size;
    own_s[r] = min((n_kv + split - 1) / split, a.num_splits);
  }
}

// The merges' (max, sum) pass over a row's `own` parts, part s on thread s mod 128 (the CTA's
// first 4 warps, the reducers): merge_ml_load brings the pairs into registers (one L2 round
// trip) and folds this thread's max; merge_ml_weights then takes the block's max, writes the
// weights w_s = e^(m_s - M) and returns 1 / Σ_s w_s l_s (per-thread sums in part order, the warp
// tree, the 4 warp sums in order). Every thread of the CTA calls merge_ml_weights (three
// barriers); red_s holds 4 floats.
struct MergeMl {
  float2 e[kMlaMergeMaxParts / kHeadLinearThreads];
  float mx = -INFINITY;
};
__device__ inline void merge_ml_load(const float* ml, int own, int64_t part_stride, int tid,
                                     MergeMl& m) {
#pragma unroll
  for (int i = 0; i < kMlaMergeMaxParts / kHeadLinearThreads; ++i) {
    const int s = tid + i * kHeadLinearThreads;
    m.e[i] = s < own ? __ldcg(reinterpret_cast<const float2*>(ml + s * part_stride))
                     : make_float2(-INFINITY, 0.0f);
    m.mx = fmaxf(m.mx, m.e[i].x);
  }
}
__device__ inline float merge_ml_weights(MergeMl& m, int own, int tid, float* red_s, float* w_s,
                                         unsigned long long* tm) {
  constexpr int kWarpsM = kHeadLinearThreads / 32;
  const int lane = tid & 31, warp = tid >> 5;
  const bool reducer = tid < kHeadLinearThreads;  // warp-uniform
  if (reducer) {
    const float mx = warp_max(m.mx);
    if (lane == 0) red_s[warp] = mx;
  }
  __syncthreads();
  if (tm != nullptr) tm[2] = globaltimer_ns();
  float sum = 0.0f;
  if (reducer) {
    float mx = red_s[0];
#pragma unroll
    for (int w = 1; w < kWarpsM; ++w) mx = fmaxf(mx, red_s[w]);
#pragma unroll
    for (int i = 0; i < kMlaMergeMaxParts / kHeadLinearThreads; ++i) {
      const int s = tid + i * kHeadLinearThreads;
      const float w = m.e[i].x == -INFINITY ? 0.0f : expf(m.e[i].x - mx);
      if (s < own) w_s[s] = w;
      sum += w * m.e[i].y;
    }
    sum = warp_sum(sum);
  }
  __syncthreads();  // the reducers have read red_s's maxima
  if (reducer && lane == 0) red_s[warp] = sum;
  __syncthreads();
  if (tm != nullptr) tm[3] = globaltimer_ns();
  float total = red_s[0];
#pragma unroll
  for (int w = 1; w < kWarpsM; ++w) total += red_s[w];
  return total > 0.0f ? 1.0f / total : 0.0f;
}

__global__ void __launch_bounds__(kHeadLinearThreads) mla_merge_uv_kernel(MlaMergeUvParams mp) {
  pdl_trigger();
  unsigned long long* const tm = merge_timing(mp);
  if (tm != nullptr) tm[0] = globaltimer_ns();
  extern __shared__ __align__(16) unsigned char smem[];
  const MlaClusterDecodeParams& a = mp.attn;
  const HeadLinearParams& p = mp.uv;
  const int col0 = static_cast<int>(blockIdx.x) * kHeadLinearCols, h = static_cast<int>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x);
  const int k = p.k, q4 = k / 4, parts = a.num_splits, chunk = merge_chunk(parts);
  head_linear_load_w(p, col0, h, smem);
  const HeadLinearSmem m = head_linear_smem(p, smem);
  float* o_s = reinterpret_cast<float*>(smem + merge_scratch_offset(p.t, k));  // [chunk][k]
  float* w_s = o_s + chunk * k;                                                 // [parts]
  int* own_s = reinterpret_cast<int*>(w_s + parts);                             // [t]
  float* red_s = reinterpret_cast<float*>(own_s + p.t);                         // [4]
  // Zero token rows: rows past t and columns past k stay zero (the mma's padding).
  for (int i = tid; i < m.tpad * m.ld / 8; i += kHeadLinearThreads)
    reinterpret_cast<uint4*>(m.x_s)[i] = make_uint4(0, 0, 0, 0);
  merge_own_parts(a, p.t, tid, kHeadLinearThreads, own_s);
  const int64_t rows_total = int64_t{p.t} * p.heads;
  pdl_wait();  // the partials are the previous kernel's
  if (tm != nullptr) tm[1] = globaltimer_ns();
  __syncthreads();
  for (int r = 0; r < p.t; ++r) {
    const int own = own_s[r];
    const int64_t row = int64_t{r} * p.heads + h;
    auto copy_chunk = [&](int s0) {
      for (int s = s0; s < min(own, s0 + chunk); ++s) {
        const float* src = a.partial_o + (s * rows_total + row) * k;
        for (int c = tid; c < q4; c += kHeadLinearThreads)
          cp_async16(o_s + (s - s0) * k + c * 4, src + c * 4, 16);
      }
      cp_async_commit();
    };
    copy_chunk(0);
    // The weights and the normaliser (part s on thread s mod 128).
    MergeMl ml;
    merge_ml_load(a.partial_ml + row * 2, own, rows_total * 2, tid, ml);
    const float inv = merge_ml_weights(ml, own, tid, red_s, w_s, r == 0 ? tm : nullptr);
    // O: the parts in split order, a chunk at a time (the next chunk after this one's sums).
    float4 acc[kHeadLinearMaxK / 4 / kHeadLinearThreads];
#pragma unroll
    for (int i = 0; i < kHeadLinearMaxK / 4 / kHeadLinearThreads; ++i)
      acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s0 = 0; s0 < own; s0 += chunk) {
      if (s0 > 0) copy_chunk(s0);
      cp_async_wait<0>();
      __syncthreads();
      if (tm != nullptr && r == 0 && s0 == 0) tm[4] = globaltimer_ns();
      const int s1 = min(own, s0 + chunk);
#pragma unroll
      for (int i = 0; i < kHeadLinearMaxK / 4 / kHeadLinearThreads; ++i) {
        const int c = tid + i * kHeadLinearThreads;
        if (c >= q4) break;
#pragma unroll 4
        for (int s = s0; s < s1; ++s) {
          const float w = w_s[s];
          if (w == 0.0f) continue;  // a part too far below the max (or empty): adds nothing
          const float4 v = *reinterpret_cast<const float4*>(o_s + (s - s0) * k + c * 4);
          acc[i].x = fmaf(w, v.x, acc[i].x);
          acc[i].y = fmaf(w, v.y, acc[i].y);
          acc[i].z = fmaf(w, v.z, acc[i].z);
          acc[i].w = fmaf(w, v.w, acc[i].w);
        }
      }
      __syncthreads();  // o_s is the next chunk's
    }
#pragma unroll
    for (int i = 0; i < kHeadLinearMaxK / 4 / kHeadLinearThreads; ++i) {
      const int c = tid + i * kHeadLinearThreads;
      if (c >= q4) break;
      __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(m.x_s + r * m.ld + c * 4);
      dst[0] = __floats2bfloat162_rn(acc[i].x * inv, acc[i].y * inv);
      dst[1] = __floats2bfloat162_rn(acc[i].z * inv, acc[i].w * inv);
    }
    cp_async_wait<0>();  // own == 0: the (empty) chunk group
    __syncthreads();     // x_s row r complete; red_s / w_s are the next token's
  }
  if (tm != nullptr) tm[5] = globaltimer_ns();
  head_linear_finish(p, col0, h, smem, true);
  if (tm != nullptr) tm[kMlaMergeTimingSlots - 1] = globaltimer_ns();
}

// The deferred merge with G = kMergeGroups (4) groups of W_UV columns per CTA (grid:
// ceil(n / 16 G), heads): the CTA merges a row once for all its groups, so each head's parts
// cross L2 n / 16 G times instead of n / 16 (V2-Lite, ctx 2048: mla_merge_uv_kernel's 8 CTAs per
// head read the same 33 x 2 KB of O each, 8.6 MB per layer, and took ~4.8 us from
// griddepcontrol.wait to the first (max); H200 run 23 phase timing). Thread c < k owns latent
// column c. The parts' O rows come into shared memory by bulk copies: thread 0 arms an mbarrier
// and issues one 2 KB copy per part, chunks of kBulkChunk parts, the first while the (max, sum)
// reduce (run 23; loads straight into registers, DEEPINFER_MLA_MERGE=wide4reg, measured 0.5-1 %
// slower and were removed in run 47). The arithmetic is
// mla_merge_uv_kernel's: the (max, sum) of part s on thread s mod 128 (the first 4 warps,
// registers), the same tree and warp order; O per column in split order with fmaf, skipping zero
// weights; one bf16 rounding. The groups share the merged row (x_s) and keep their own weight rows
// and partial sums.
constexpr int kBulkChunk = 48;
constexpr int kMergeGroups = 4;

// The bulk rounds of a row's `own` parts (the wide and k-split merges): parts [s0, s0 + chunk)
// arrive in o_s ([chunk][ld] f32) on `bar` — the caller issued the first round, issue(s0) arms
// the barrier and copies the next ones —, and thread tid < cols folds its column in split order
// (fmaf, zero weights skipped). tm0: the first round's timing mark, or null.
template <class Issue>
__device__ __forceinline__ float merge_bulk_rounds(int own, int chunk, int cols, int ld,
                                                   const float* w_s, const float* o_s,
                                                   uint64_t* bar, uint32_t& phase,
                                                   const Issue& issue, unsigned long long* tm0) {
  const int tid = static_cast<int>(threadIdx.x);
  float acc = 0.0f;
  for (int s0 = 0; s0 < own; s0 += chunk) {
    if (s0 > 0) {
      __syncthreads();  // o_s read by everyone
      issue(s0);
    }
    mbar_wait(bar, phase);
    phase ^= 1u;
    if (tid < cols) {
      const int n = min(chunk, own - s0);
      for (int j = 0; j < n; ++j) {
        const float w = w_s[s0 + j];
        if (w != 0.0f) acc = fmaf(w, o_s[j * ld + tid], acc);  // zero: far below the max
      }
    }
    if (tm0 != nullptr && s0 == 0) *tm0 = globaltimer_ns();
  }
  return acc;
}
constexpr int kMergeThreads = kMergeGroups * kHeadLinearThreads;

struct WideMergeSmem {
  int x_off, part_off, w_off, own_off, red_off, o_off, bar_off, total;
};
__host__ __device__ inline WideMergeSmem wide_merge_smem(int t, int k, int parts, int groups) {
  const int ld = pad16(k) + 8, tpad = pad16(t);
  WideMergeSmem L;
  L.x_off = groups * kHeadLinearCols * ld * 2;
  L.part_off = align16(L.x_off + tpad * ld * 2);
  L.w_off = L.part_off + groups * kHeadLinearWarps * tpad * kHeadLinearCols * 4;
  L.own_off = L.w_off + parts * 4;
  L.red_off = L.own_off + t * 4;
  L.o_off = align16(L.red_off + kHeadLinearWarps * 4);
  L.bar_off = L.o_off + (parts < kBulkChunk ? parts : kBulkChunk) * k * 4;
  L.total = L.bar_off + 8;
  return L;
}

__global__ void __launch_bounds__(kMergeThreads) mla_merge_uv_wide_kernel(MlaMergeUvParams mp) {
  pdl_trigger();
  unsigned long long* const tm = merge_timing(mp);
  if (tm != nullptr) tm[0] = globaltimer_ns();
  extern __shared__ __align__(16) unsigned char smem[];
  const MlaClusterDecodeParams& a = mp.attn;
  const HeadLinearParams& p = mp.uv;
  const int tid = static_cast<int>(threadIdx.x);
  const int group = tid / kHeadLinearThreads, h = static_cast<int>(blockIdx.y);
  const int col0 = (static_cast<int>(blockIdx.x) * kMergeGroups + group) * kHeadLinearCols;
  const int k = p.k, parts = a.num_splits;
  const WideMergeSmem L = wide_merge_smem(p.t, k, parts, kMergeGroups);
  HeadLinearSmem m;
  m.ld = pad16(k) + 8;
  m.tpad = pad16(p.t);
  m.w_s = reinterpret_cast<bf16*>(smem) + group * kHeadLinearCols * m.ld;
  m.x_s = reinterpret_cast<bf16*>(smem + L.x_off);
  m.part_s = reinterpret_cast<float*>(smem + L.part_off) +
             group * kHeadLinearWarps * m.tpad * kHeadLinearCols;
  float* w_s = reinterpret_cast<float*>(smem + L.w_off);
  int* own_s = reinterpret_cast<int*>(smem + L.own_off);
  float* red_s = reinterpret_cast<float*>(smem + L.red_off);
  float* o_s = reinterpret_cast<float*>(smem + L.o_off);  // [chunk][k]
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + L.bar_off);
  // The groups' weight rows (columns past n load zeros).
  head_linear_load_w(p, col0, h, m);
  for (int i = tid; i < m.tpad * m.ld / 8; i += kMergeThreads)
    reinterpret_cast<uint4*>(m.x_s)[i] = make_uint4(0, 0, 0, 0);
  merge_own_parts(a, p.t, tid, kMergeThreads, own_s);
  if (tid == 0) {
    mbar_init(bar, 1);
    fence_mbar_init();
  }
  const int64_t rows_total = int64_t{p.t} * p.heads;
  const int64_t part_stride = rows_total * k;  // floats between a row's consecutive parts
  uint32_t phase = 0;                          // the barrier's next parity
  pdl_wait();                                  // the partials are the previous kernel's
  if (tm != nullptr) tm[1] = globaltimer_ns();
  __syncthreads();
  for (int r = 0; r < p.t; ++r) {
    const int own = own_s[r];
    const int64_t row = int64_t{r} * p.heads + h;
    // Parts [s0, s0 + chunk) of this row into o_s (thread 0; the CTA has finished reading o_s: a
    // barrier since).
    auto issue_bulk = [&](int s0) {
      const int n = min(kBulkChunk, own - s0);
      if (tid != 0 || n <= 0) return;
      fence_proxy_async();
      mbar_expect_tx(bar, static_cast<uint32_t>(n * k * 4));
      for (int j = 0; j < n; ++j)
        bulk_copy_g2s(o_s + j * k, a.partial_o + (s0 + j) * part_stride + row * k,
                      static_cast<uint32_t>(k * 4), bar);
    };
    issue_bulk(0);
    MergeMl ml;  // (max, sum): the first 4 warps
    if (tid < kHeadLinearThreads)
      merge_ml_load(a.partial_ml + row * 2, own, rows_total * 2, tid, ml);
    const float inv = merge_ml_weights(ml, own, tid, red_s, w_s, r == 0 ? tm : nullptr);
    const float acc = merge_bulk_rounds(own, kBulkChunk, k, k, w_s, o_s, bar, phase, issue_bulk,
                                        tm != nullptr && r == 0 ? tm + 4 : nullptr);
    if (tid < k) m.x_s[r * m.ld + tid] = __float2bfloat16_rn(acc * inv);
    __syncthreads();  // x_s row r complete; red_s / w_s / o_s are the next token's
  }
  if (tm != nullptr) tm[5] = globaltimer_ns();
  head_linear_finish(p, col0, h, m, true);
  if (tm != nullptr) tm[kMlaMergeTimingSlots - 1] = globaltimer_ns();
}

// The deferred merge split over k (run 24): a cluster of kHeadLinearWarps (4) CTAs per head
// (grid: 4, heads; k % 64 == 0). CTA q takes head_linear's warp q's k steps, latent columns
// [q k / 4, (q + 1) k / 4): the cluster kernel wrote them for all of a row's parts as one
// contiguous block (MlaClusterDecodeParams::defer 2), which comes into shared memory as one bulk
// copy per chunk of kSplitChunk parts (V2-Lite, ctx 2048, split 32: 65 parts x 512 B; one copy
// per part cost ~2 us of TMA issue, H200 run 24 phase timing), issued by a thread outside the
// (max, sum) reducers. The CTA merges those columns and multiplies them by the same columns of
// W_UV for all n outputs (warp w: column tiles w, w + 8, ...; the mma sequence of
// head_linear_finish's warp q); the cluster then sums the four partials in rank order through
// distributed shared memory, as head_linear sums its warps' partials in warp order. So every SM
// pulls a quarter of a head's parts and of its W_UV, and the bits are the other merge kernels'
// (the (max, sum) pass and the per-column sums are theirs; CudaMla deferred tests).
constexpr int kSplitWarps = 8;
constexpr int kSplitThreads = kSplitWarps * 32;  // >= k / 4 for k <= kHeadLinearMaxK
constexpr int kSplitChunk = 64;                  // parts per bulk chunk
constexpr int kSplitRanks = kHeadLinearWarps;    // CTAs per head: a cluster
constexpr int kSplitMaxSmem = 160 * 1024;        // else the wide kernel

struct SplitMergeSmem {
  int ld, kq_max, x_off, part_off, wt_off, own_off, red_off, o_off, bar_off, recv_off, total;
};
// Weights [npad][ld] bf16 (W_UV rows, this CTA's columns), token rows [tpad][ld] bf16, partial
// sums [tpad][npad] f32, part weights [parts], own part counts [t], reduction scratch, the parts'
// quarter rows [chunk][kq_max] f32, the mbarrier, and at one token the ranks' sums [ranks][npad]
// f32 (rank 0's, pushed there by the others; none for more tokens, which pull them).
__host__ __device__ inline SplitMergeSmem split_merge_smem(int t, int k, int n, int parts) {
  SplitMergeSmem L;
  const int nsteps = pad16(k) / 16, tpad = pad16(t), npad = pad16(n);
  L.kq_max = 16 * ((nsteps + kSplitRanks - 1) / kSplitRanks);
  L.ld = L.kq_max + 8;
  L.x_off = npad * L.ld * 2;
  L.part_off = align16(L.x_off + tpad * L.ld * 2);
  L.wt_off = L.part_off + tpad * npad * 4;
  L.own_off = L.wt_off + parts * 4;
  L.red_off = L.own_off + t * 4;
  L.o_off = align16(L.red_off + kHeadLinearWarps * 4);
  L.bar_off = L.o_off + (parts < kSplitChunk ? parts : kSplitChunk) * L.kq_max * 4;
  L.recv_off = align16(L.bar_off + 8);
  L.total = L.recv_off + (t == 1 ? kSplitRanks * npad * 4 : 0);
  return L;
}

__device__ __forceinline__ float2 ld_cluster2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n"
               : "=f"(v.x), "=f"(v.y)
               : "r"(addr)
               : "memory");
  return v;
}

__global__ void __launch_bounds__(kSplitThreads) mla_merge_uv_split_kernel(MlaMergeUvParams mp) {
  DI_TRACE_SCOPE(kTraceMlaMergeUv, 0);
  pdl_trigger();
  unsigned long long* const tm = merge_timing(mp);
  if (tm != nullptr) tm[0] = globaltimer_ns();
  extern __shared__ __align__(16) unsigned char smem[];
  const MlaClusterDecodeParams& a = mp.attn;
  const HeadLinearParams& p = mp.uv;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int q = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);  // q: the rank
  const int k = p.k, n = p.n, parts = a.num_splits;
  const SplitMergeSmem L = split_merge_smem(p.t, k, n, parts);
  int s0, s1;
  head_linear_warp_steps(p, q, s0, s1);
  const int steps = s1 - s0, c0 = 16 * s0;
  const int kq = 16 * steps;  // this CTA's latent columns: k / 4 (k % 64 == 0)
  const int ld = L.ld, tpad = pad16(p.t), npad = pad16(n);
  bf16* w_s = reinterpret_cast<bf16*>(smem);
  bf16* x_s = reinterpret_cast<bf16*>(smem + L.x_off);
  float* part_s = reinterpret_cast<float*>(smem + L.part_off);
  float* wt_s = reinterpret_cast<float*>(smem + L.wt_off);
  int* own_s = reinterpret_cast<int*>(smem + L.own_off);
  float* red_s = reinterpret_cast<float*>(smem + L.red_off);
  float* o_s = reinterpret_cast<float*>(smem + L.o_off);
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + L.bar_off);
  // W_UV rows r < n of head h, columns [c0, c0 + 16 steps) (past k or n: zeros), by every thread.
  const bf16* wh = static_cast<const bf16*>(p.w) + int64_t{h} * n * k;
  const int cpr = 2 * steps;  // 16-byte chunks per row
  for (int i = tid; i < npad * cpr; i += kSplitThreads) {
    const int r = i / cpr, c = c0 + 8 * (i % cpr);
    const bool valid = r < n && c < k;
    cp_async16(w_s + r * ld + (c - c0), valid ? wh + int64_t{r} * k + c : p.w, valid ? 16 : 0);
  }
  cp_async_commit();
  for (int i = tid; i < tpad * ld / 8; i += kSplitThreads)
    reinterpret_cast<uint4*>(x_s)[i] = make_uint4(0, 0, 0, 0);
  merge_own_parts(a, p.t, tid, kSplitThreads, own_s);
  if (tid == 0) {
    mbar_init(bar, 1);
    fence_mbar_init();
  }
  const int64_t rows_total = int64_t{p.t} * p.heads;
  uint32_t phase = 0;  // the barrier's next parity
  pdl_wait();          // the partials are the previous kernel's
  DI_TRACE_WAITED();
  if (tm != nullptr) tm[1] = globaltimer_ns();
  __syncthreads();
  for (int r = 0; r < p.t; ++r) {
    const int own = own_s[r];
    const int64_t row = int64_t{r} * p.heads + h;
    // This row's quarter: [parts][kq] contiguous (the cluster kernel's defer == 2 layout).
    const float* src = a.partial_o + (row * kSplitRanks + q) * parts * int64_t{kq};
    // Parts [sc, sc + chunk) of this row's columns into o_s: one bulk copy by thread
    // kHeadLinearThreads, not a reducer (the CTA has finished reading o_s: a barrier since).
    auto issue = [&](int sc) {
      const int cnt = min(kSplitChunk, own - sc);
      if (tid != kHeadLinearThreads || cnt <= 0) return;
      fence_proxy_async();
      mbar_expect_tx(bar, static_cast<uint32_t>(cnt * kq * 4));
      bulk_copy_g2s(o_s, src + sc * int64_t{kq}, static_cast<uint32_t>(cnt * kq * 4), bar);
    };
    issue(0);
    MergeMl ml;  // (max, sum): the first 4 warps
    if (tid < kHeadLinearThreads)
      merge_ml_load(a.partial_ml + row * 2, own, rows_total * 2, tid, ml);
    const float inv = merge_ml_weights(ml, own, tid, red_s, wt_s, r == 0 ? tm : nullptr);
    const float acc = merge_bulk_rounds(own, kSplitChunk, kq, kq, wt_s, o_s, bar, phase, issue,
                                        tm != nullptr && r == 0 ? tm + 4 : nullptr);
    if (tid < kq) x_s[r * ld + tid] = __float2bfloat16_rn(acc * inv);
    __syncthreads();  // x_s row r complete; red_s / wt_s / o_s are the next token's
  }
  if (tm != nullptr) tm[5] = globaltimer_ns();
  cp_async_wait<0>();
  __syncthreads();  // every thread's weight copies landed
  // This CTA's k steps for all n columns: warp w takes column tiles w, w + 8, ... (16 each).
  constexpr int kMaxMt = kHeadLinearMaxTokens / 16;
  const int mtiles = tpad / 16;
  const int g = lane >> 2, t4 = lane & 3;
  for (int ct = warp; ct < npad / 16; ct += kSplitWarps) {
    float acc[kMaxMt][2][4];
    head_linear_mma(acc, w_s + ct * 16 * ld, x_s, ld, 0, steps, mtiles, lane);
#pragma unroll
    for (int mt = 0; mt < kMaxMt; ++mt) {
      if (mt >= mtiles) break;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int r = mt * 16 + g, c = ct * 16 + nt * 8 + 2 * t4;
        *reinterpret_cast<float2*>(part_s + r * npad + c) =
            make_float2(acc[mt][nt][0], acc[mt][nt][1]);
        *reinterpret_cast<float2*>(part_s + (r + 8) * npad + c) =
            make_float2(acc[mt][nt][2], acc[mt][nt][3]);
      }
    }
  }
  if (tm != nullptr) tm[6] = globaltimer_ns();
  // A column pair's kSplitRanks partial sums (load(rank): a float2) added in rank order (head
  // linear's warp order), rounded once to bf16: the pushed sums from this CTA's memory or the
  // peers' partials over DSMEM.
  auto rank_sum = [](auto load) {
    float v0 = 0.0f, v1 = 0.0f;
#pragma unroll
    for (int rank = 0; rank < kSplitRanks; ++rank) {
      const float2 v = load(rank);
      v0 += v.x;
      v1 += v.y;
    }
    return __floats2bfloat162_rn(v0, v1);
  };
  if (mp.push && p.t == 1) {
    // One token: every rank stores its n sums into rank 0's recv rows before the one cluster
    // barrier; rank 0 then adds them in rank order from its own shared memory (the sums below,
    // the same bits) and no CTA reads a peer's memory after the barrier, so none waits at a
    // second one before it exits (run 43).
    float* recv_s = reinterpret_cast<float*>(smem + L.recv_off);
    __syncthreads();  // part_s row 0 complete (every warp's column tiles)
    for (int c = tid; c < n; c += kSplitThreads)
      st_cluster_f32(cluster_addr(recv_s + q * npad + c, 0), part_s[c]);
    cluster_arrive();  // release: the pushed sums
    cluster_wait();
    if (tm != nullptr) tm[7] = globaltimer_ns();
    if (q != 0) return;
    bf16* y = static_cast<bf16*>(p.y);
    for (int i = tid; i < n / 2; i += kSplitThreads) {
      const int c = 2 * i;
      *reinterpret_cast<__nv_bfloat162*>(y + int64_t{h} * n + c) = rank_sum(
          [&](int rank) { return *reinterpret_cast<const float2*>(recv_s + rank * npad + c); });
    }
    if (tm != nullptr) tm[8] = tm[kMlaMergeTimingSlots - 1] = globaltimer_ns();
    return;
  }
  cluster_arrive();  // release: this CTA's partials
  cluster_wait();
  if (tm != nullptr) tm[7] = globaltimer_ns();
  // The four partials in rank order (rank_sum); the cluster's CTAs take interleaved column pairs.
  bf16* y = static_cast<bf16*>(p.y);
  const int64_t ldy = int64_t{p.heads} * n;
  const int pairs = n / 2;
  for (int i = q * kSplitThreads + tid; i < p.t * pairs; i += kSplitRanks * kSplitThreads) {
    const int r = i / pairs, c = 2 * (i % pairs);
    *reinterpret_cast<__nv_bfloat162*>(y + r * ldy + int64_t{h} * n + c) =
        rank_sum([&](int rank) { return ld_cluster2(cluster_addr(part_s + r * npad + c, rank)); });
  }
  if (tm != nullptr) tm[8] = globaltimer_ns();
  cluster_arrive_relaxed();  // the peers' reads of this CTA's partials are done before it exits
  cluster_wait();
  if (tm != nullptr) tm[kMlaMergeTimingSlots - 1] = globaltimer_ns();
}

// DEEPINFER_MLA_CLUSTER_MIN_BLOCKS=2|3 (read once; default 3): the register budget of the
// 16-row kernel (the 32-row one needs 2 for its shared memory anyway).
int min_blocks_setting() {
  static const int v = di::env::get_int("DEEPINFER_MLA_CLUSTER_MIN_BLOCKS", 3);  // 2 | 3
  return v;
}

template <int kMt, int kNt, int kMinBlocks>
cudaError_t launch_variant(const MlaClusterDecodeParams& p, cudaStream_t stream) {
  auto* kernel = &mla_cluster_decode_kernel<kMt, kNt, kMinBlocks>;
  const int smem = cluster_smem(16 * kMt, p.dqk, p.dv, p.long_split_size).total;
  cudaError_t err = open_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(p.defer ? p.num_splits : p.num_clusters * kMlaCluster),
                  static_cast<unsigned>(p.head_tiles), static_cast<unsigned>(p.num_tokens));
  // The deferred mode never touches another CTA's shared memory: no clusters.
  MlaClusterDecodeParams q = p;
  q.late_trigger = attn_late_trigger_env();
  return launch_cluster_pdl(p.defer ? 0 : kMlaCluster, kernel, grid, dim3(kThreads),
                            static_cast<size_t>(smem), stream, q);
}

template <int kMt, int kNt>
cudaError_t launch_mt_nt(const MlaClusterDecodeParams& p, cudaStream_t stream) {
  if constexpr (kMt == 1) {
    if (min_blocks_setting() == 3) return launch_variant<kMt, kNt, 3>(p, stream);
  }
  return launch_variant<kMt, kNt, 2>(p, stream);
}

template <int kMt>
cudaError_t launch_mt(const MlaClusterDecodeParams& p, cudaStream_t stream) {
  if (p.dv <= 64) return launch_mt_nt<kMt, 1>(p, stream);
  if (p.dv <= 128) return launch_mt_nt<kMt, 2>(p, stream);
  if (p.dv <= 256) return launch_mt_nt<kMt, 4>(p, stream);
  return launch_mt_nt<kMt, 8>(p, stream);
}

}  // namespace

bool mla_cluster_decode_supported(int32_t num_kv_heads, int32_t k_offset, int32_t v_offset,
                                  int32_t dqk, int32_t dv, int32_t entry_size, int32_t num_tokens) {
  return num_kv_heads == 1 && k_offset == 0 && v_offset == 0 && dv > 0 && dv < dqk &&
         dqk % 8 == 0 && dv % 8 == 0 && dqk <= kMaxDqk && dv <= kMaxDv && entry_size % 8 == 0 &&
         entry_size >= dqk && num_tokens <= 65535;
}

namespace {
int g_batch_split_override = -1;
}  // namespace

bool mla_cluster_batch_split() {
  if (g_batch_split_override >= 0) return g_batch_split_override != 0;
  return !batch_invariant_env();
}
void set_mla_cluster_batch_split_override(int on) {
  g_batch_split_override = on;
}

MlaClusterDecodePlan plan_mla_cluster_decode(int32_t num_tokens, int32_t max_kv_len,
                                             int32_t num_heads, int32_t dqk, int32_t dv,
                                             bool defer) {
  static const int32_t kSplitEnv = di::env::get_int("DEEPINFER_MLA_CLUSTER_SPLIT", 0);  // 0 | 16..
  const bool by_batch = kSplitEnv == 0 && mla_cluster_batch_split();
  const bool small_batch = by_batch && num_tokens < kLargeBatchTokens;
  const int32_t kSplit = kSplitEnv > 0                                 ? kSplitEnv
                         : by_batch && num_tokens >= kHugeBatchTokens  ? kHugeBatchSplit
                         : by_batch && num_tokens >= kLargeBatchTokens ? kLargeBatchSplit
                                                                       : kDefaultSplit;
  MlaClusterDecodePlan plan;
  plan.rows_per_tile = num_heads <= 16 ? 16 : 32;
  plan.head_tiles = (num_heads + plan.rows_per_tile - 1) / plan.rows_per_tile;
  const int64_t kv = max_kv_len > 0 ? max_kv_len : 1;
  // The long split only when some token may need it (its shared-memory layout has two stages).
  const int64_t long_from = defer ? kDeferLongContextEntries : kLongContextEntries;
  const bool long_ctx = small_batch && kv > long_from;
  int64_t split = kSplit, long_split = long_ctx ? kLongContextSplit : kSplit;
  auto clusters = [&](int64_t n, int64_t sp) {
    return ((n + sp - 1) / sp + kMlaCluster - 1) / kMlaCluster;
  };
  // The most clusters any token of the launch needs: one with a context of up to long_from
  // (kLongContextEntries; deferred: kDeferLongContextEntries) at `split`, or the longest at
  // `long_split`.
  auto grid_clusters = [&] {
    const int64_t short_kv = small_batch ? std::min<int64_t>(kv, long_from) : kv;
    const int64_t c = clusters(short_kv, split);
    return long_ctx ? std::max(c, clusters(kv, long_split)) : c;
  };
  // Very long contexts: the split doubles while the clusters' weights (one f32 per row and
  // cluster) would not fit the stage buffers, which bounds the clusters (and partials) of a token
  // (~150K entries at 32 heads; the rule of the last merge's former shared-memory weights, kept so
  // that plans do not change). Small batches grow only the long split (contexts up to long_from
  // need at most 16 clusters at 32), so a short context's split never depends on its batch.
  while (plan.rows_per_tile * grid_clusters() * 4 >
         cluster_smem(plan.rows_per_tile, dqk, dv, static_cast<int>(long_split)).kv_bytes) {
    if (!small_batch) split *= 2;
    long_split *= 2;
  }
  plan.split_size = static_cast<int32_t>(split);
  plan.long_split_size = static_cast<int32_t>(long_split);
  plan.long_split_from = small_batch ? static_cast<int32_t>(long_from) : 0x7fffffff;
  plan.num_clusters = static_cast<int32_t>(grid_clusters());
  plan.num_counters = int64_t{num_tokens} * plan.head_tiles * kMlaCluster;
  if (defer) {  // a partial per split of the grid: the most splits any token may need
    auto splits = [](int64_t n, int64_t sp) { return (n + sp - 1) / sp; };
    const int64_t short_kv = small_batch ? std::min<int64_t>(kv, long_from) : kv;
    const int64_t n = std::max(splits(short_kv, split), long_ctx ? splits(kv, long_split) : 0);
    plan.defer = true;
    plan.num_splits = static_cast<int32_t>(n);
    plan.num_counters = 0;
    plan.partial_bytes = static_cast<size_t>(n) * static_cast<size_t>(num_tokens) *
                         static_cast<size_t>(num_heads) * (static_cast<size_t>(dv) + 2) *
                         sizeof(float);
  } else if (plan.num_clusters > 1) {
    const size_t rows = static_cast<size_t>(num_tokens) * num_heads;
    plan.partial_bytes = static_cast<size_t>(plan.num_clusters) * rows *
                         (static_cast<size_t>(dv) + 2 * kMlaCluster) * sizeof(float);
  }
  plan.smem_bytes =
      static_cast<size_t>(cluster_smem(plan.rows_per_tile, dqk, dv, plan.long_split_size).total);
  return plan;
}

cudaError_t launch_mla_cluster_decode(const MlaClusterDecodeParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0 || p.num_seqs == 0) return cudaSuccess;
  return p.rows_per_tile == 32 ? launch_mt<2>(p, stream) : launch_mt<1>(p, stream);
}

namespace {

std::atomic<int> g_merge_override{-1};

// The merge kernel: DEEPINFER_MLA_MERGE = v1 (mla_merge_uv_kernel, 16 W_UV columns per CTA),
// wide (the wide kernel, 4 groups of 16 columns per CTA, parts by bulk copies), split (the
// k-split cluster kernel); unset: by the grid's parts (kAuto). History (V2-Lite batch 1, ctx 2048,
// H200): v1 -> wide with registers 452.0 -> 468.7 tok/s (run 23 call 4; 8 groups per CTA: 453.0),
// registers -> bulk 487.6 / 488.2 / 489.6
// -> 492.0 / 489.9 / 491.2 (run 23 call 7).
MlaMergeKernel merge_env() {
  static const MlaMergeKernel env = [] {
    constexpr const char* kName = "DEEPINFER_MLA_MERGE";
    if (di::env::is(kName, "v1")) return MlaMergeKernel::kV1;
    if (di::env::is(kName, "wide")) return MlaMergeKernel::kWideBulk;
    if (di::env::is(kName, "split")) return MlaMergeKernel::kSplit;
    return MlaMergeKernel::kAuto;
  }();
  return env;
}

// kAuto: the k-split kernel from kSplitMinParts parts of the grid on, else the wide one (bulk).
// V2-Lite batch 1, H200 run 24 (k-split / wide, the same binary): ctx 512 (16 parts) 506.5 /
// 504.3 vs 511.5 / 511.6 tok/s, ctx 1024 (32) 507.0 / 506.4 vs 509.8 / 509.0; ctx 2048 (65 parts
// at 32-entry splits) 497-501 vs the wide kernel's 486-490 at its best (33 parts).
constexpr int64_t kSplitMinParts = 48;

// The kernel for a shape: the wide kernels need k <= 512 (a latent column per thread), the split
// kernel k % 64 == 0 and its weights in shared memory (n rows of a quarter of k).
MlaMergeKernel merge_kind(int64_t t, int64_t dv, int64_t n, int64_t parts) {
  const int o = g_merge_override.load();
  MlaMergeKernel kind = o >= 0 ? static_cast<MlaMergeKernel>(o) : merge_env();
  if (kind == MlaMergeKernel::kAuto)
    kind = parts >= kSplitMinParts ? MlaMergeKernel::kSplit : MlaMergeKernel::kWideBulk;
  if (kind == MlaMergeKernel::kSplit) {
    const int smem = split_merge_smem(static_cast<int>(t), static_cast<int>(dv),
                                      static_cast<int>(n), static_cast<int>(parts))
                         .total;
    if (dv % (16 * kSplitRanks) != 0 || smem > kSplitMaxSmem) kind = MlaMergeKernel::kWideBulk;
  }
  if (kind == MlaMergeKernel::kWideBulk && dv > int64_t{kMergeGroups} * kHeadLinearThreads)
    kind = MlaMergeKernel::kV1;
  return kind;
}

}  // namespace

void set_mla_merge_override(MlaMergeKernel kind) {
  g_merge_override.store(static_cast<int>(kind));
}

bool mla_merge_uv_supported(int64_t tokens, int64_t heads, int64_t dv, int64_t n, int64_t parts) {
  return head_linear_small_supported(tokens, heads, dv, n) && dv % 4 == 0 && parts >= 1 &&
         parts <= kMlaMergeMaxParts;
}

namespace {

// Shared memory and grid size of the merge kernel `kind` (merge_kind's choice).
int32_t merge_smem(MlaMergeKernel kind, int32_t tokens, int32_t dv, int32_t n, int32_t parts) {
  switch (kind) {
    case MlaMergeKernel::kSplit:
      return split_merge_smem(tokens, dv, n, parts).total;
    case MlaMergeKernel::kWideBulk:
      return wide_merge_smem(tokens, dv, parts, kMergeGroups).total;
    default:
      return merge_scratch_offset(tokens, dv) +
             (merge_chunk(parts) * dv + parts + tokens + kHeadLinearThreads / 32) * 4;
  }
}
int64_t merge_ctas(MlaMergeKernel kind, int64_t heads, int64_t n) {
  switch (kind) {
    case MlaMergeKernel::kSplit:
      return heads * kSplitRanks;
    case MlaMergeKernel::kWideBulk: {
      const int64_t cols = int64_t{kHeadLinearCols} * kMergeGroups;
      return heads * ((n + cols - 1) / cols);
    }
    default:
      return heads * ((n + kHeadLinearCols - 1) / kHeadLinearCols);
  }
}

}  // namespace

int32_t mla_merge_uv_smem(int32_t tokens, int32_t dv, int32_t n, int32_t parts) {
  return merge_smem(merge_kind(tokens, dv, n, parts), tokens, dv, n, parts);
}

int32_t mla_merge_uv_defer_layout(int64_t tokens, int64_t dv, int64_t n, int64_t parts) {
  return merge_kind(tokens, dv, n, parts) == MlaMergeKernel::kSplit ? 2 : 1;
}

int64_t mla_merge_uv_ctas(int64_t tokens, int64_t heads, int64_t dv, int64_t n, int64_t parts) {
  return merge_ctas(merge_kind(tokens, dv, n, parts), heads, n);
}

cudaError_t launch_mla_merge_uv(const MlaMergeUvParams& p, cudaStream_t stream) {
  const int parts = p.attn.num_splits;
  const MlaMergeKernel kind = merge_kind(p.uv.t, p.uv.k, p.uv.n, parts);
  const int smem = merge_smem(kind, p.uv.t, p.uv.k, p.uv.n, parts);
  const auto heads = static_cast<unsigned>(p.uv.heads);
  if (kind == MlaMergeKernel::kSplit) {
    auto* kernel = &mla_merge_uv_split_kernel;
    cudaError_t err = open_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
    if (err != cudaSuccess) return err;
    // DEEPINFER_MLA_MERGE_PUSH=0 (read once): one token's rank sums pulled by rank 0 after the
    // barrier as for more tokens (run 43's A/B).
    static const int push = di::env::get_int("DEEPINFER_MLA_MERGE_PUSH", 1);
    MlaMergeUvParams q = p;
    q.push = push != 0;
    return launch_cluster_pdl(kSplitRanks, kernel, dim3(kSplitRanks, heads), dim3(kSplitThreads),
                              static_cast<size_t>(smem), stream, q);
  }
  const bool wide = kind == MlaMergeKernel::kWideBulk;
  auto* kernel = wide ? &mla_merge_uv_wide_kernel : &mla_merge_uv_kernel;
  cudaError_t err = open_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  if (err != cudaSuccess) return err;
  const int64_t col_blocks = merge_ctas(kind, 1, p.uv.n);
  return launch_pdl(kernel, dim3(static_cast<unsigned>(col_blocks), heads),
                    dim3(static_cast<unsigned>(wide ? kMergeThreads : kHeadLinearThreads)),
                    static_cast<size_t>(smem), stream, p);
}

}  // namespace di::cuda
