#pragma once
// Per-head linear of few tokens (MLA's absorbed W_UK / W_UV, issue #6): y[t, h, :] =
// x[t, h, :] · w[h]ᵀ for t <= kHeadLinearMaxTokens. cuBLAS's strided-batched GEMM spends 4-7 us
// on these 2 MB (V2-Lite: 16 heads x 512 x 128) at batch 1 and 32 (ncu, run 15), a launch whose
// weights alone take 0.5 us at 4.3 TB/s.
//
// Work: one CTA of 4 warps per (16 output columns, head); warp w takes a quarter of the k steps:
// it copies its slices of the head's 16 weight rows and of the token rows into shared memory by
// cp.async (the weights before griddepcontrol.wait: a PDL launch streams them under the previous
// kernel's tail), multiplies them on mma.sync m16n8k16 (bf16 in, f32 accumulate; tokens padded to
// 16-row tiles, k to 16 with zeros), and the CTA adds the four partial sums in warp order and
// rounds once to bf16 (as the cuBLAS path).
//
// Limits (head_linear_small_supported): bf16, 1 <= t <= 64, k % 8 == 0 and <= 1024, n % 8 == 0,
// 16-byte aligned x / w (k % 8 keeps every row aligned) and 4-byte aligned y.
#include <cuda_runtime.h>

#include <cstdint>

namespace di::cuda {

inline constexpr int32_t kHeadLinearMaxTokens = 64;

struct HeadLinearParams {
  const void* x;  // bf16: row (t, h) at x + t·x_ld + h·x_hs (contiguous [t, heads, k]: heads·k, k)
  const void* w;  // bf16 [heads, n, k]
  void* y;        // bf16 [t, heads, n]
  int32_t t, heads, k, n;
  int64_t x_ld, x_hs;  // multiples of 8 (16-byte aligned rows)
};

bool head_linear_small_supported(int64_t t, int64_t heads, int64_t k, int64_t n);
// Shared memory of one CTA (the host checks it against the device's opt-in limit).
int32_t head_linear_small_smem(int32_t t, int32_t k);
cudaError_t launch_head_linear_small(const HeadLinearParams& p, cudaStream_t stream);

}  // namespace di::cuda
