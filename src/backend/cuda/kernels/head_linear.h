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

// The merge-and-project of the MLA cluster kernel's deferred mode (mla_decode_cluster.h, run
// 22): x[t, h, :] is not read but merged from `parts` partial attention states of row t·heads + h,
// part_o [parts][t·heads][k] f32 (unnormalised O) and part_ml [parts][t·heads][2] (max, sum;
// max -inf: empty, skipped), in part order: M = max_s m_s, w_s = e^(m_s - M), x = bf16(Σ_s w_s o_s
// / Σ_s w_s l_s) — attention's output — then y as head_linear_small. One CTA per (16 columns,
// head) as head_linear_small: the weights stream before griddepcontrol.wait, then per token the
// CTA copies the row's parts into shared memory in one round of cp.async and merges them (each of
// the 8 CTAs of a head merges the same rows: 8 x 66 KB of L2 reads per head at 33 parts; sharing
// the merge over a cluster of the 8 through DSMEM lost: V2-Lite batch 1 459 -> 445 tok/s, H200
// run 22 call 4).
// Sums: per part in part order (fmaf), the normaliser by lanes (part s on lane s % 32) and a
// warp tree; parts past a token's own add nothing (same bits for any grid padding).
struct HeadLinearMergeParams {
  HeadLinearParams lin;  // x unused
  const float* part_o;
  const float* part_ml;
  int32_t parts;
};
// Parts per row: the weights' pass holds two per lane; 64 x 2 KB of staged rows at k = 512.
inline constexpr int32_t kHeadLinearMergeMaxParts = 64;

bool head_linear_small_supported(int64_t t, int64_t heads, int64_t k, int64_t n);
// Shared memory of one CTA (the host checks it against the device's opt-in limit).
int32_t head_linear_small_smem(int32_t t, int32_t k);
cudaError_t launch_head_linear_small(const HeadLinearParams& p, cudaStream_t stream);
// Supported: head_linear_small's limits and 1 <= parts <= kHeadLinearMergeMaxParts.
bool head_linear_merge_supported(int64_t t, int64_t heads, int64_t k, int64_t n, int64_t parts);
int32_t head_linear_merge_smem(int32_t t, int32_t k, int32_t parts);
cudaError_t launch_head_linear_merge(const HeadLinearMergeParams& p, cudaStream_t stream);

}  // namespace di::cuda
