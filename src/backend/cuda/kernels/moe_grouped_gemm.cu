// Grouped GEMM for MoE prefill on tensor cores (see moe_grouped.h): per expert e, the rows
// [offsets[e], offsets[e+1]) times w[e]ᵀ, one launch for all experts, reading the device offsets.
//
// Plain and conservative: block tile 64 x 128 x 32, 4 warps (2 x 2, warp tile 32 x 64),
// 3-stage cp.async pipeline into padded shared memory (row stride 40 halves: ldmatrix is
// conflict-free), ldmatrix.x4 fragments, mma.sync.m16n8k16 bf16 -> f32. Out-of-range rows (past
// the expert's last row), columns (>= n) and k (>= k) are zero-filled by cp.async (src-size 0).
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/moe_grouped.h"

namespace di::cuda {
namespace {

constexpr int kBM = kMoeGemmBM, kBN = 128, kBK = 32, kPad = 8, kLds = kBK + kPad, kStages = 3;
constexpr int kThreads = 128;
static_assert(kBM == 64 && kThreads == 128, "load assignments below assume 64 x 128 x 32 tiles");

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__global__ void __launch_bounds__(kThreads) moe_grouped_gemm_kernel(MoeGroupedGemmParams p) {
  __shared__ __align__(128) bf16 sa[kStages][kBM][kLds];
  __shared__ __align__(128) bf16 sb[kStages][kBN][kLds];

  const int mt = static_cast<int>(blockIdx.x);
  if (mt >= p.tile_start[p.num_experts]) return;  // block-uniform
  // The expert owning m-tile mt: tile_start[lo] <= mt < tile_start[lo + 1].
  int lo = 0, hi = p.num_experts;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (p.tile_start[mid] <= mt)
      lo = mid;
    else
      hi = mid;
  }
  const int e = lo;
  const int m_begin = p.offsets[e] + (mt - p.tile_start[e]) * kBM;
  const int m_end = min(m_begin + kBM, p.offsets[e + 1]);
  const int n0 = static_cast<int>(blockIdx.y) * kBN;
  const bf16* w = p.w + static_cast<int64_t>(e) * p.n * p.k;

  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 1, wn = warp & 1;  // warp tile rows wm*32, cols wn*64

  // Load assignment: A tile = 64 rows x 4 chunks of 8 (2 per thread), B tile = 128 x 4 (4 each).
  const bf16* a_src[2];
  bool a_ok[2];
  int a_row[2], a_kc[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int q = tid + i * kThreads;
    a_row[i] = q >> 2;
    a_kc[i] = (q & 3) * 8;
    const int gr = m_begin + a_row[i];
    a_ok[i] = gr < m_end;
    const int src = a_ok[i] ? (p.a_rows ? p.a_rows[gr] : gr) : 0;
    a_src[i] = p.a + static_cast<int64_t>(src) * p.k;
  }
  const bf16* b_src[4];
  bool b_ok[4];
  int b_row[4], b_kc[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int q = tid + i * kThreads;
    b_row[i] = q >> 2;
    b_kc[i] = (q & 3) * 8;
    b_ok[i] = n0 + b_row[i] < p.n;
    b_src[i] = w + static_cast<int64_t>(b_ok[i] ? n0 + b_row[i] : 0) * p.k;
  }
  auto load_stage = [&](int stage, int kt) {
    const int k0 = kt * kBK;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int kk = k0 + a_kc[i];
      const bool ok = a_ok[i] && kk < p.k;  // k % 8 == 0: the whole chunk is inside
      cp_async16(smem_addr(&sa[stage][a_row[i]][a_kc[i]]), ok ? a_src[i] + kk : p.a, ok ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int kk = k0 + b_kc[i];
      const bool ok = b_ok[i] && kk < p.k;
      cp_async16(smem_addr(&sb[stage][b_row[i]][b_kc[i]]), ok ? b_src[i] + kk : p.w, ok ? 16 : 0);
    }
  };

  float acc[2][8][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 8; ++ni)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mi][ni][r] = 0.0f;

  const int ktiles = (p.k + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    cp_async_commit();  // always commit: group counting stays uniform
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<kStages - 2>();  // the group of tile kt has landed (this thread's copies)
    __syncthreads();               // ... everyone's; and everyone is done with tile kt - 1
    const int pre = kt + kStages - 1;
    if (pre < ktiles) load_stage(pre % kStages, pre);
    cp_async_commit();
    const int st = kt % kStages;
#pragma unroll
    for (int ks = 0; ks < kBK; ks += 16) {
      uint32_t af[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        ldmatrix_x4(af[mi], smem_addr(&sa[st][wm * 32 + mi * 16 + (lane & 15)][ks + (lane >> 4) * 8]));
      uint32_t bfr[8][2];
#pragma unroll
      for (int nj = 0; nj < 4; ++nj) {
        uint32_t r[4];
        ldmatrix_x4(r, smem_addr(&sb[st][wn * 64 + nj * 16 + (lane & 7) + (lane >> 4) * 8]
                                   [ks + ((lane >> 3) & 1) * 8]));
        bfr[2 * nj][0] = r[0];
        bfr[2 * nj][1] = r[1];
        bfr[2 * nj + 1][0] = r[2];
        bfr[2 * nj + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 8; ++ni) mma_bf16_16816(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
    }
  }
  cp_async_wait<0>();

  // Epilogue: c0, c1 at (row g, cols 2t, 2t+1); c2, c3 at row g + 8 (g = lane / 4, t = lane % 4).
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int ni = 0; ni < 8; ++ni) {
      const int col = n0 + wn * 64 + ni * 8 + (lane & 3) * 2;
      if (col >= p.n) continue;  // n % 8 == 0: col + 1 < n as well
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m_begin + wm * 32 + mi * 16 + (lane >> 2) + half * 8;
        if (row >= m_end) continue;
        const float v0 = acc[mi][ni][2 * half], v1 = acc[mi][ni][2 * half + 1];
        const int64_t off = static_cast<int64_t>(row) * p.n + col;
        if (p.c_f32) {
          *reinterpret_cast<float2*>(static_cast<float*>(p.c) + off) = make_float2(v0, v1);
        } else {
          *reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(p.c) + off) = __floats2bfloat162_rn(v0, v1);
        }
      }
    }
  }
}

}  // namespace

void launch_moe_grouped_gemm(const MoeGroupedGemmParams& p, cudaStream_t stream) {
  if (p.max_m_tiles <= 0 || p.n <= 0) return;
  moe_grouped_gemm_kernel<<<dim3(static_cast<unsigned>(p.max_m_tiles), ceil_div(p.n, kBN)), kThreads, 0,
                            stream>>>(p);
}

}  // namespace di::cuda
