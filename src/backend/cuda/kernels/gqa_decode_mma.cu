// GQA decode attention on tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate).
//
// The CUDA-core decode kernel (gqa_decode.cuh) computes each q·k as a warp sum and runs the
// online softmax token by token for each head: at 8 q heads per kv head and a batch of 32 that is
// ~180 us per layer on the H200 for 67 MB of K/V (Qwen3-30B-A3B, ctx 2048: a chain of shuffles,
// not the bytes). Here the q heads of one kv head are the rows of an m16 tile (rows >= the group
// are zero), so one mma computes 16 heads x 8 keys over 16 dims.
//
// One CTA of 4 warps per (KV split, kv head, sequence), the generic kernel's split layout, so
// combine_splits_kernel merges the partials. Warp w takes the 16-key sub-tiles w, w + 4, ... of
// the split: cp.async of their K and V rows into the warp's shared memory (zero past the split
// end), S = Q·Kᵀ (2 n-tiles, D/16 k-steps; Q's A fragments held in registers), scores scaled
// into base 2, the online softmax per row over the sub-tile (row max over the 4 lanes of a row),
// P rounded to bf16 (the C fragments of S are P's A fragments), O += P·V (V by ldmatrix.trans).
// The four warp states merge in warp order in shared memory. Partial max m is written in the
// natural-log units of the CUDA-core kernel (base-2 max times ln 2). Not bitwise equal to the
// CUDA-core kernel (P in bf16, another summation order); chosen by the model's group (not by the
// batch), so a sequence's bits do not depend on its batch.
//
// H200, same call (docs/performance.md, run 15): Qwen3-30B-A3B (8 heads per kv head) batch 1 /
// 32 / 256 262.4 / 1,011 / 2,393 -> 274.5 / 1,201 / 3,778 tok/s; Llama-3.1-8B (4) batch 1 / 8 /
// 32 / 64 227.8 / 1,519 / 4,862 / 7,765 -> 229.3 / 1,548 / 5,224 / 8,698.
#include <atomic>
#include <cmath>
#include <cstdlib>

#include "backend/cuda/kernels/attention.h"
#include "backend/cuda/kernels/attention_prefill_mma_math.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gqa_decode.cuh"

namespace di::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kSub = 16;  // keys per warp sub-tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int D, int G>
union GqaMmaShared {
  bf16 kv[kWarps][2][kSub][D + 8];  // per warp: its K rows, then its V rows (16-byte pad per row)
  struct {
    float o[kWarps][G][D];  // each warp's unnormalised rows (q heads) of O
    float m[kWarps][G];     // base-2 running max (-inf: no key)
    float l[kWarps][G];
  } merge;
};

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

template <int D, int G>
__global__ void __launch_bounds__(kWarps * 32, 3)
    gqa_decode_mma_kernel(PagedAttentionKernelParams p) {
  pdl_trigger();  // the next (PDL-launched) GEMV may start loading its weights
  static_assert(G >= 1 && G <= 16, "the q heads of a kv head are the rows of one m16 tile");
  constexpr int kHalves = G > 8 ? 2 : 1;  // rows g (and g + 8) of a lane that are real heads
  constexpr int kKSteps = D / 16;
  constexpr int kDTiles = D / 8;
  constexpr int kLd = D + 8;
  constexpr int kChunks = D / 8;  // 16-byte chunks per K / V row
  static_assert(32 % kChunks == 0 || kChunks % 32 == 0, "chunk mapping");
  __shared__ __align__(16) GqaMmaShared<D, G> sh;
  const int split = blockIdx.x, kvh = blockIdx.y, s = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const GqaDecodeSeq seq = gqa_decode_seq(p, s);
  const float c2 = p.scale * kLog2e;
  const bf16* layer_base = p.pool + p.layer_offset + int64_t{kvh} * p.kv_head_stride;
  bf16* k_s = &sh.kv[warp][0][0][0];
  bf16* v_s = &sh.kv[warp][1][0][0];
  const int64_t rows = int64_t{p.num_tokens} * p.num_q_heads;
  for (int i = p.qo_indptr[s]; i < p.qo_indptr[s + 1]; ++i) {
    const int limit = min(seq.kv_len, p.positions[i] + 1);
    const int t0 = split * p.split_size;
    const int t1 = min(limit, t0 + p.split_size);
    // Q's A fragments: per row half r (row g + 8r) the registers a_r and a_(2+r); zero rows past
    // the group (rows g + 8 are not held at all for groups of at most 8).
    uint32_t qa[kKSteps][2 * kHalves];
    {
      const bf16* q0 = p.q + (int64_t{i} * p.num_q_heads + int64_t{kvh} * G) * D;
#pragma unroll
      for (int kc = 0; kc < kKSteps; ++kc) {
        const int col = kc * 16 + 2 * t4;
#pragma unroll
        for (int r = 0; r < kHalves; ++r) {
          const int h = g + 8 * r;
          qa[kc][2 * r] = h < G ? ld_u32(q0 + h * D + col) : 0u;
          qa[kc][2 * r + 1] = h < G ? ld_u32(q0 + h * D + col + 8) : 0u;
        }
      }
    }
    auto a_frag = [&](int kc, uint32_t(&a)[4]) {
      a[0] = qa[kc][0];
      a[2] = qa[kc][1];
      if constexpr (kHalves == 2) {
        a[1] = qa[kc][2];
        a[3] = qa[kc][3];
      } else {
        a[1] = a[3] = 0u;
      }
    };
    float o[kDTiles][4];
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g, g + 8 (base 2)
    for (int base = t0 + warp * kSub; base < t1; base += kWarps * kSub) {
      // K and V rows [base, base + 16) of this kv head; rows past t1 zero-filled.
#pragma unroll 2
      for (int idx = lane; idx < kSub * kChunks; idx += 32) {
        const int j = idx / kChunks, c = idx % kChunks;
        const int t = base + j;
        const bf16* ent = p.pool;
        int bytes = 0;
        if (t < t1) {
          const int blk = p.kv_indices[seq.b0 + t / p.block_size];
          ent =
              layer_base + blk * p.block_stride + int64_t{t % p.block_size} * p.entry_size + c * 8;
          bytes = 16;
        }
        cp_async16(k_s + j * kLd + c * 8, bytes ? ent + p.k_offset : ent, bytes);
        cp_async16(v_s + j * kLd + c * 8, bytes ? ent + p.v_offset : ent, bytes);
      }
      cp_async_commit();
      cp_async_wait<0>();
      __syncwarp();
      // S = Q·Kᵀ: n-tile 0 = keys base .. base + 7, n-tile 1 = base + 8 .. base + 15.
      float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
      for (int kc = 0; kc < kKSteps; ++kc) {
        uint32_t a[4], b[4];
        a_frag(kc, a);
        ldsm_x4(b, k_s + mma_frag::ldsm_k_key(lane) * kLd + kc * 16 + mma_frag::ldsm_k_col(lane));
        mma_bf16_16816(sc[0], a, b[0], b[1]);
        mma_bf16_16816(sc[1], a, b[2], b[3]);
      }
      // Online softmax per row half r (c0, c1: row g; c2, c3: row g + 8).
      uint32_t pa[4];
#pragma unroll
      for (int r = 0; r < kHalves; ++r) {
        float sv[2][2];
        float mx = m[r];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = base + nt * 8 + 2 * t4 + e;
            sv[nt][e] = key < t1 ? sc[nt][2 * r + e] * c2 : -INFINITY;
            mx = fmaxf(mx, sv[nt][e]);
          }
        }
        mx = quad_max(mx);                        // finite: key `base` (< t1) is in every row
        const float corr = fast_exp2(m[r] - mx);  // 0 on the first sub-tile (m = -inf)
        m[r] = mx;
        float ps = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            sv[nt][e] = fast_exp2(sv[nt][e] - mx);
            ps += sv[nt][e];
          }
        }
        l[r] = l[r] * corr + ps;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          o[dt][2 * r] *= corr;
          o[dt][2 * r + 1] *= corr;
        }
        pa[r] = pack_bf16(sv[0][0], sv[0][1]);
        pa[2 + r] = pack_bf16(sv[1][0], sv[1][1]);
      }
      if constexpr (kHalves == 1) pa[1] = pa[3] = 0u;
        // O += P·V: V's B fragments for two 8-dim n-tiles per ldmatrix.trans.
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        ldsm_x4_trans(
            b, v_s + mma_frag::ldsm_v_key(lane) * kLd + dp * 16 + mma_frag::ldsm_v_col(lane));
        mma_bf16_16816(o[2 * dp], pa, b[0], b[1]);
        mma_bf16_16816(o[2 * dp + 1], pa, b[2], b[3]);
      }
      __syncwarp();  // every lane's ldmatrix is done before the next sub-tile's cp.async
    }
    // Merge the 4 warps (warp order) and write the split's partial or, with one split, the output.
    __syncthreads();  // the merge area aliases every warp's K / V rows
#pragma unroll
    for (int r = 0; r < kHalves; ++r) {
      const int h = g + 8 * r;
      const float lr = quad_sum(l[r]);
      if (h < G) {
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          sh.merge.o[warp][h][dt * 8 + 2 * t4] = o[dt][2 * r];
          sh.merge.o[warp][h][dt * 8 + 2 * t4 + 1] = o[dt][2 * r + 1];
        }
        if (t4 == 0) {
          sh.merge.m[warp][h] = m[r];
          sh.merge.l[warp][h] = lr;
        }
      }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * D; idx += kWarps * 32) {
      const int h = idx / D, d = idx % D;
      float mm = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) mm = fmaxf(mm, sh.merge.m[w][h]);
      float ll = 0.0f, ov = 0.0f;
      if (mm != -INFINITY) {
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          const float mw = sh.merge.m[w][h];
          if (mw == -INFINITY) continue;
          const float cw = fast_exp2(mw - mm);
          ll += cw * sh.merge.l[w][h];
          ov += cw * sh.merge.o[w][h][d];
        }
      }
      const int64_t row = int64_t{i} * p.num_q_heads + int64_t{kvh} * G + h;
      if (p.num_splits == 1) {
        p.out[row * D + d] = __float2bfloat16_rn(ll > 0.0f ? ov / ll : 0.0f);
      } else {
        p.partial_o[(split * rows + row) * D + d] = ov;
        if (d == 0) {
          p.partial_ml[(split * rows + row) * 2] = mm == -INFINITY ? -INFINITY : mm * kLn2;
          p.partial_ml[(split * rows + row) * 2 + 1] = ll;
        }
      }
    }
    __syncthreads();  // the merge area is reused by the next token's K / V rows
  }
}

template <int D>
bool launch_d(const PagedAttentionKernelParams& p, int group, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.num_splits), static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>(p.num_seqs));
  switch (group) {
    case 1:
      gqa_decode_mma_kernel<D, 1><<<grid, kWarps * 32, 0, stream>>>(p);
      return true;
    case 2:
      gqa_decode_mma_kernel<D, 2><<<grid, kWarps * 32, 0, stream>>>(p);
      return true;
    case 4:
      gqa_decode_mma_kernel<D, 4><<<grid, kWarps * 32, 0, stream>>>(p);
      return true;
    case 8:
      gqa_decode_mma_kernel<D, 8><<<grid, kWarps * 32, 0, stream>>>(p);
      return true;
    case 16:
      gqa_decode_mma_kernel<D, 16><<<grid, kWarps * 32, 0, stream>>>(p);
      return true;
    default:
      return false;
  }
}

int env_mode() {
  const char* env = std::getenv("DEEPINFER_GQA_DECODE_MMA");
  return env == nullptr ? -1 : std::atoi(env);
}
std::atomic<int> g_mma_mode{env_mode()};

}  // namespace

int gqa_decode_mma_mode() {
  return g_mma_mode.load(std::memory_order_relaxed);
}
void set_gqa_decode_mma_mode(int mode) {
  g_mma_mode.store(mode, std::memory_order_relaxed);
}

bool gqa_decode_mma_for(int group, int head_dim) {
  const int mode = gqa_decode_mma_mode();
  if (mode == 0 || (head_dim != 64 && head_dim != 128)) return false;
  if (group != 1 && group != 2 && group != 4 && group != 8 && group != 16) return false;
  return mode == 1 || group >= 4;
}

bool launch_gqa_decode_mma(const PagedAttentionKernelParams& p, cudaStream_t stream) {
  if (p.pool_f32 != nullptr || p.num_tokens > p.num_seqs || p.num_seqs > 65535) return false;
  if (p.num_kv_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0) return false;
  if (p.head_dim_qk != p.head_dim_v || p.v_offset == p.k_offset) return false;
  const int group = p.num_q_heads / p.num_kv_heads;
  if (!gqa_decode_mma_for(group, p.head_dim_qk)) return false;
  // 16-byte K / V rows (cp.async) and 4-byte q pairs.
  if ((p.k_offset | p.v_offset | p.kv_head_stride | p.entry_size) % 8 != 0) return false;
  if (p.block_stride % 8 != 0 || p.layer_offset % 8 != 0 ||
      reinterpret_cast<uintptr_t>(p.pool) % 16 != 0 || reinterpret_cast<uintptr_t>(p.q) % 4 != 0)
    return false;
  return p.head_dim_qk == 64 ? launch_d<64>(p, group, stream) : launch_d<128>(p, group, stream);
}

}  // namespace di::cuda
