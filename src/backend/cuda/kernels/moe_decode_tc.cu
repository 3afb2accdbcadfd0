// MoE decode on tensor cores with the weights streamed through a cp.async ring (moe_grouped.h,
// MoeDecodeImpl::kTc). The other decode kernels (moe_gemm.cu) load weights into registers one
// row per warp (v2) or straight into mma fragments (mma): each warp's row is a few KB, its loads
// drain before the sums, and a warp sum or a bf16 repack sits between every pair of rows, so at
// 2-4 rows per expert they read 46-71 % of the H200's bandwidth (docs/performance.md run 15).
//
// Here a CTA of 4 warps owns kBM = 128 weight rows of one touched expert and walks the k dim in
// stages of kBK = 64 columns: a kStages-deep ring of cp.async copies (the weight tile [128][64]
// and the stage's slice of the expert's token rows, zero past its rows) feeds ldmatrix + mma.sync
// m16n8k16 with the weight rows as M (2 m-tiles per warp) and the tokens as N (kNt n-tiles of 8).
//   gate_up: smem rows 0-63 are gate rows j0 .. j0 + 63, rows 64-127 the up rows of the same j,
//            so warp w's m-tile 0 (gate) and m-tile 1 (up) hold gate_j and up_j of the same
//            (j, token) in the same registers: act = silu(gate) · up, stored bf16.
//   down:    rows n0 .. n0 + 127 of the expert's down matrix against the act rows (bf16), y f32.
// Then moe_combine_f32 as for the other decode kernels. An expert with more than 8·kNt rows is
// done in groups of 8·kNt tokens (the weights streamed again per group). Grid (row tiles,
// min(E, slots)) from upper bounds, offsets read on the device: capturable. Not bitwise equal to
// v1 / v2 (act in bf16, tensor-core sums).
#include <cstdlib>

#include "backend/cuda/kernels/attention_prefill_mma_math.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/moe_grouped.h"
#include "core/env.h"

namespace di::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kBM = 128;      // weight rows per CTA (32 per warp)
constexpr int kBK = 64;       // k per stage
constexpr int kLd = kBK + 8;  // smem row stride in elements (16-byte pad: conflict-free ldmatrix)

template <int kNt>
struct TcStage {
  bf16 a[kBM][kLd];
  bf16 b[8 * kNt][kLd];
};
template <int kNt, int kStages>
constexpr int kTcSmem = kStages* static_cast<int>(sizeof(TcStage<kNt>));

__device__ __forceinline__ float silu(float g) {
  return g / (1.0f + __expf(-g));
}

// One CTA: weight rows w_row(r) (r < kBM; nullptr: a zero row) times token rows tok_row(n)
// (n < 8·kNt; nullptr: zero) over k = 0 .. kdim, into acc[m-tile][n-tile][4]: warp w's m-tiles are
// smem rows 32w .. 32w + 15 and 32w + 16 .. 32w + 31. `any` is a valid global address (the
// source of zero-filled copies).
template <int kNt, int kStages, typename WRow, typename TokRow>
__device__ __forceinline__ void tc_gemm(unsigned char* smem, int kdim, const WRow& w_row,
                                        const TokRow& tok_row, const bf16* any,
                                        float (&acc)[2][kNt][4]) {
  auto* st = reinterpret_cast<TcStage<kNt>*>(smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kt_total = (kdim + kBK - 1) / kBK;
  // Per thread: 8 chunks of the A tile (row tid / 8 + 16 i, chunk tid % 8) and the B tile's
  // chunks tid, tid + 128, ... < 64·kNt (token q / 8, chunk q % 8). The row pointers do not change.
  constexpr int kBChunks = (64 * kNt + kThreads - 1) / kThreads;
  const int ck = tid & 7;
  const bf16* arow[kBM * 8 / kThreads];
#pragma unroll
  for (int i = 0; i < kBM * 8 / kThreads; ++i) arow[i] = w_row(tid / 8 + 16 * i);
  const bf16* brow[kBChunks];
#pragma unroll
  for (int i = 0; i < kBChunks; ++i) {
    const int q = tid + kThreads * i;
    brow[i] = q < 64 * kNt ? tok_row(q / 8) : nullptr;
  }
  auto issue = [&](int kt) {
    if (kt < kt_total) {
      TcStage<kNt>& s = st[kt % kStages];
      const int k0 = kt * kBK + ck * 8;
      const bool kin = k0 < kdim;
#pragma unroll
      for (int i = 0; i < kBM * 8 / kThreads; ++i) {
        const bool ok = kin && arow[i] != nullptr;
        cp_async16(&s.a[tid / 8 + 16 * i][ck * 8], ok ? arow[i] + k0 : any, ok ? 16 : 0);
      }
#pragma unroll
      for (int i = 0; i < kBChunks; ++i) {
        const int q = tid + kThreads * i;
        if (q < 64 * kNt) {
          const bool ok = kin && brow[i] != nullptr;
          cp_async16(&s.b[q / 8][ck * 8], ok ? brow[i] + k0 : any, ok ? 16 : 0);
        }
      }
    }
    cp_async_commit();  // an empty group past the end keeps the wait counts uniform
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  for (int kt = 0; kt < kt_total; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt visible to all; stage kt - 1 consumed by all
    issue(kt + kStages - 1);
    const TcStage<kNt>& s = st[kt % kStages];
#pragma unroll
    for (int kc = 0; kc < kBK / 16; ++kc) {
      uint32_t a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
        ldsm_x4(a[mt], &s.a[warp * 32 + mt * 16 + mma_frag::ldsm_q_row(lane)]
                           [kc * 16 + mma_frag::ldsm_q_col(lane)]);
#pragma unroll
      for (int np = 0; np < (kNt + 1) / 2; ++np) {
        // Tokens np·16 .. +15 (two n-tiles) for this 16-wide k step; with kNt = 1 only n-tile 0.
        uint32_t b[4];
        ldsm_x4(b, &s.b[min(np * 16 + mma_frag::ldsm_k_key(lane), 8 * kNt - 1)]
                       [kc * 16 + mma_frag::ldsm_k_col(lane)]);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_bf16_16816(acc[mt][2 * np], a[mt], b[0], b[1]);
          if (2 * np + 1 < kNt) mma_bf16_16816(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring may be refilled by the caller's next group
}

// Block y's touched expert and its grouped rows [row0, row0 + cnt); e < 0: no expert (exit).
struct TcExpert {
  int e, row0, cnt;
};
__device__ __forceinline__ TcExpert tc_expert(const MoeDecodeParams& p) {
  const int a = static_cast<int>(blockIdx.y);
  if (a >= *p.num_active) return {-1, 0, 0};
  const int e = p.active[a];
  return {e, p.offsets[e], p.offsets[e + 1] - p.offsets[e]};
}

template <int kNt, int kStages>
__global__ void __launch_bounds__(kThreads) moe_gate_up_tc_kernel(MoeDecodeParams p) {
  const TcExpert ex = tc_expert(p);
  if (ex.e < 0) return;
  const int e = ex.e, row0 = ex.row0, cnt = ex.cnt;
  extern __shared__ __align__(16) unsigned char smem[];
  const int j0 = static_cast<int>(blockIdx.x) * (kBM / 2);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  const int64_t h = p.hidden;
  const bf16* w = p.gate_up + int64_t{e} * 2 * p.inter * h;
  // smem row 32w + r: gate row j0 + 16w + r (r < 16), else the up row of j0 + 16w + r - 16, so
  // warp w's two m-tiles are the gate and up rows of the same 16 columns j.
  auto w_row = [&](int r) -> const bf16* {
    const int j = j0 + 16 * (r >> 5) + (r & 15);
    return j < p.inter ? w + (int64_t{(r & 16) ? p.inter : 0} + j) * h : nullptr;
  };
  auto* act = reinterpret_cast<bf16*>(p.act);  // [slots, inter] bf16 (the f32 buffer's bytes)
  for (int m0 = 0; m0 < cnt; m0 += 8 * kNt) {
    auto tok_row = [&](int n) -> const bf16* {
      return m0 + n < cnt ? p.x + int64_t{p.row_token[row0 + m0 + n]} * h : nullptr;
    };
    float acc[2][kNt][4] = {};
    tc_gemm<kNt, kStages>(smem, p.hidden, w_row, tok_row, w, acc);
    // acc[0] = gate, acc[1] = up: rows j0 + warp·16 + g (+8), tokens nt·8 + 2·t4 (+1).
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int j = j0 + warp * 16 + g + (i >= 2 ? 8 : 0);
        const int tok = m0 + nt * 8 + 2 * t4 + (i & 1);
        if (j < p.inter && tok < cnt)
          act[int64_t{row0 + tok} * p.inter + j] =
              __float2bfloat16_rn(silu(acc[0][nt][i]) * acc[1][nt][i]);
      }
    }
  }
}

template <int kNt, int kStages>
__global__ void __launch_bounds__(kThreads) moe_down_tc_kernel(MoeDecodeParams p) {
  const TcExpert ex = tc_expert(p);
  if (ex.e < 0) return;
  const int e = ex.e, row0 = ex.row0, cnt = ex.cnt;
  extern __shared__ __align__(16) unsigned char smem[];
  const int n0 = static_cast<int>(blockIdx.x) * kBM;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  const int64_t inter = p.inter;
  const bf16* w = p.down + int64_t{e} * p.hidden * inter;
  auto w_row = [&](int r) -> const bf16* {
    return n0 + r < p.hidden ? w + int64_t{n0 + r} * inter : nullptr;
  };
  const auto* act = reinterpret_cast<const bf16*>(p.act);
  for (int m0 = 0; m0 < cnt; m0 += 8 * kNt) {
    auto tok_row = [&](int n) -> const bf16* {
      return m0 + n < cnt ? act + int64_t{row0 + m0 + n} * inter : nullptr;
    };
    float acc[2][kNt][4] = {};
    tc_gemm<kNt, kStages>(smem, p.inter, w_row, tok_row, w, acc);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int n = n0 + warp * 32 + mt * 16 + g + (i >= 2 ? 8 : 0);
          const int tok = m0 + nt * 8 + 2 * t4 + (i & 1);
          if (n < p.hidden && tok < cnt) p.y[int64_t{row0 + tok} * p.hidden + n] = acc[mt][nt][i];
        }
      }
    }
  }
}

template <int kNt, int kStages>
void launch_tc(const MoeDecodeParams& p, cudaStream_t stream) {
  constexpr int smem = kTcSmem<kNt, kStages>;
  open_dynamic_smem(reinterpret_cast<const void*>(&moe_gate_up_tc_kernel<kNt, kStages>), smem);
  open_dynamic_smem(reinterpret_cast<const void*>(&moe_down_tc_kernel<kNt, kStages>), smem);
  const auto experts = static_cast<unsigned>(p.max_active);
  moe_gate_up_tc_kernel<kNt, kStages>
      <<<dim3(ceil_div(p.inter, kBM / 2), experts), kThreads, smem, stream>>>(p);
  moe_down_tc_kernel<kNt, kStages>
      <<<dim3(ceil_div(p.hidden, kBM), experts), kThreads, smem, stream>>>(p);
}

// Ring depth: 4 stages (78 KB per CTA at 8 tokens: 2 CTAs per SM) unless
// DEEPINFER_MOE_TC_STAGES=3 (59 KB: 3 CTAs per SM); read once.
int tc_stages() {
  static const int stages = di::env::get_int("DEEPINFER_MOE_TC_STAGES", 4);  // 3 | 4
  return stages;
}

template <int kNt>
void launch_tc_nt(const MoeDecodeParams& p, cudaStream_t stream) {
  if (tc_stages() == 3)
    launch_tc<kNt, 3>(p, stream);
  else
    launch_tc<kNt, 4>(p, stream);
}

}  // namespace

void launch_moe_decode_tc(const MoeDecodeParams& p, cudaStream_t stream) {
  const int rows = p.avg_rows > 0 ? min(p.avg_rows, p.rows_hint) : p.rows_hint;
  if (rows <= 8)
    launch_tc_nt<1>(p, stream);
  else if (rows <= 16)
    launch_tc_nt<2>(p, stream);
  else
    launch_tc_nt<4>(p, stream);
}

}  // namespace di::cuda
