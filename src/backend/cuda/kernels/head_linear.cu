// Per-head linear of few tokens; see head_linear.h.
//
// Napkin math (V2-Lite, 16 heads): W_UKᵀ [16, 512, 128] and W_UV [16, 128, 512] are 2 MB each,
// 0.5 us at 4.3 TB/s; 512 / 128 CTAs read 4 / 16 KB of weights each. At 32 tokens the mma work
// is 32 x 16 x 512 x 128 x 2 = 67 MFLOP, noise on the tensor cores.
//
// mma.sync.m16n8k16 fragments as in mla_decode_wide.cu: ldmatrix x4 with lane L giving row
// (L & 7) + 8 ((L >> 3) & 1), column 8 (L >> 4) of the row-major token tile is the A fragment;
// over the weight rows (the n index), lane L giving row (L & 7) + 8 (L >> 4), column
// 8 ((L >> 3) & 1) yields b0, b1 of two n-tiles for one k step. Shared rows are padded by 8 bf16
// (a row stride of 4 mod 32 words).
#include "backend/cuda/kernels/head_linear.h"

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/head_linear.cuh"

namespace di::cuda {
namespace {

__global__ void __launch_bounds__(kHeadLinearThreads) head_linear_small_kernel(HeadLinearParams p) {
  pdl_trigger();
  extern __shared__ __align__(16) unsigned char smem[];
  head_linear_cols(p, static_cast<int>(blockIdx.x) * kHeadLinearCols, static_cast<int>(blockIdx.y),
                   smem);
}

// Shared memory of the merge kernel past head_linear_smem_bytes: the row's parts [parts][k] f32,
// their weights [parts], the normaliser.
__host__ __device__ inline int merge_scratch_offset(int t, int k) {
  return (head_linear_smem_bytes(t, k) + 15) & ~15;
}

__global__ void __launch_bounds__(kHeadLinearThreads)
    head_linear_merge_kernel(HeadLinearMergeParams mp) {
  pdl_trigger();
  extern __shared__ __align__(16) unsigned char smem[];
  const HeadLinearParams& p = mp.lin;
  const int col0 = static_cast<int>(blockIdx.x) * kHeadLinearCols, h = static_cast<int>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int k = p.k, parts = mp.parts, q4 = k / 4;
  head_linear_load_w(p, col0, h, smem);
  const HeadLinearSmem m = head_linear_smem(p, smem);
  // Zero token rows: rows past t and columns past k stay zero (the mma's padding).
  for (int i = tid; i < m.tpad * m.ld / 8; i += kHeadLinearThreads)
    reinterpret_cast<uint4*>(m.x_s)[i] = make_uint4(0, 0, 0, 0);
  float* o_s = reinterpret_cast<float*>(smem + merge_scratch_offset(p.t, k));  // [parts][k]
  float* w_s = o_s + parts * k;                                                // [parts]
  float* inv_s = w_s + parts;                                                  // [1]
  const int64_t rows_total = int64_t{p.t} * p.heads;
  pdl_wait();  // the partials are the previous kernel's
  for (int r = 0; r < p.t; ++r) {
    const int64_t row = int64_t{r} * p.heads + h;
    for (int s = 0; s < parts; ++s) {
      const float* src = mp.part_o + (s * rows_total + row) * k;
      for (int c = tid; c < q4; c += kHeadLinearThreads)
        cp_async16(o_s + s * k + c * 4, src + c * 4, 16);
    }
    cp_async_commit();
    if (warp == 0) {  // the weights and the normaliser: parts s and s + 32 (< 64) on lane s
      const float* ml = mp.part_ml + row * 2;
      const int64_t stride = rows_total * 2;
      const float2 none = make_float2(-INFINITY, 0.0f);
      const float2 e0 =
          lane < parts ? __ldcg(reinterpret_cast<const float2*>(ml + lane * stride)) : none;
      const float2 e1 = lane + 32 < parts
                            ? __ldcg(reinterpret_cast<const float2*>(ml + (lane + 32) * stride))
                            : none;
      const float mx = warp_max(fmaxf(e0.x, e1.x));
      const float w0 = e0.x == -INFINITY ? 0.0f : expf(e0.x - mx);
      const float w1 = e1.x == -INFINITY ? 0.0f : expf(e1.x - mx);
      if (lane < parts) w_s[lane] = w0;
      if (lane + 32 < parts) w_s[lane + 32] = w1;
      float sum = w0 * e0.y;
      sum += w1 * e1.y;
      sum = warp_sum(sum);
      if (lane == 0) inv_s[0] = sum > 0.0f ? 1.0f / sum : 0.0f;
    }
    cp_async_wait<0>();
    __syncthreads();
    const float inv = inv_s[0];
    for (int c = tid; c < q4; c += kHeadLinearThreads) {
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
      for (int s = 0; s < parts; ++s) {
        const float w = w_s[s];
        if (w == 0.0f) continue;  // empty (or negligible) part: never read its O
        const float4 v = *reinterpret_cast<const float4*>(o_s + s * k + c * 4);
        acc.x = fmaf(w, v.x, acc.x);
        acc.y = fmaf(w, v.y, acc.y);
        acc.z = fmaf(w, v.z, acc.z);
        acc.w = fmaf(w, v.w, acc.w);
      }
      __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(m.x_s + r * m.ld + c * 4);
      dst[0] = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
      dst[1] = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
    }
    __syncthreads();  // o_s / w_s are the next token's; x_s row r is complete
  }
  head_linear_finish(p, col0, h, smem, true);
}

}  // namespace

bool head_linear_merge_supported(int64_t t, int64_t heads, int64_t k, int64_t n, int64_t parts) {
  return head_linear_small_supported(t, heads, k, n) && k % 4 == 0 && parts >= 1 &&
         parts <= kHeadLinearMergeMaxParts;
}

int32_t head_linear_merge_smem(int32_t t, int32_t k, int32_t parts) {
  return merge_scratch_offset(t, k) + (parts * k + parts + 1) * 4;
}

cudaError_t launch_head_linear_merge(const HeadLinearMergeParams& p, cudaStream_t stream) {
  const int smem = head_linear_merge_smem(p.lin.t, p.lin.k, p.parts);
  cudaError_t err =
      open_dynamic_smem(reinterpret_cast<const void*>(&head_linear_merge_kernel), smem);
  if (err != cudaSuccess) return err;
  return launch_pdl(&head_linear_merge_kernel,
                    dim3(static_cast<unsigned>((p.lin.n + kHeadLinearCols - 1) / kHeadLinearCols),
                         static_cast<unsigned>(p.lin.heads)),
                    dim3(kHeadLinearThreads), static_cast<size_t>(smem), stream, p);
}

bool head_linear_small_supported(int64_t t, int64_t heads, int64_t k, int64_t n) {
  return t >= 1 && t <= kHeadLinearMaxTokens && heads >= 1 && heads <= 65535 && k % 8 == 0 &&
         k > 0 && k <= kHeadLinearMaxK && n % 8 == 0 && n > 0;
}

int32_t head_linear_small_smem(int32_t t, int32_t k) {
  return head_linear_smem_bytes(t, k);
}

cudaError_t launch_head_linear_small(const HeadLinearParams& p, cudaStream_t stream) {
  const int smem = head_linear_small_smem(p.t, p.k);
  cudaError_t err =
      open_dynamic_smem(reinterpret_cast<const void*>(&head_linear_small_kernel), smem);
  if (err != cudaSuccess) return err;
  return launch_pdl(&head_linear_small_kernel,
                    dim3(static_cast<unsigned>((p.n + kHeadLinearCols - 1) / kHeadLinearCols),
                         static_cast<unsigned>(p.heads)),
                    dim3(kHeadLinearThreads), static_cast<size_t>(smem), stream, p);
}

}  // namespace di::cuda
