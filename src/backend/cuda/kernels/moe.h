#pragma once
// Mixture-of-experts kernels: the router (scores, group limit, top-k, weights) and the weighted
// combine of per-expert outputs (bf16 rows; moe_experts now uses moe_grouped.h: device-side
// alignment, decode kernels, grouped GEMM and an f32 combine — issue #6).
#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include <cstdint>

namespace di::cuda {

inline constexpr int kMaxRouterExperts = 512;
inline constexpr int kMaxRouterGroups = 64;

// The CPU backend's algorithm step for step (moe.cu: one thread or one warp per token): softmax (double sum) or
// sigmoid scores; selection on score + bias; group limit (best topk_groups groups by their max or
// top-two sum; other experts' choice set to 0); top-k by repeated arg-max, lower id first on
// ties (= a stable descending sort); weights = unbiased scores, renormalised, scaled.
struct MoeRouteParams {
  const float* logits;       // [tokens, num_experts] f32
  const float* bias;         // [num_experts] f32 or null (DeepSeek-V3 e_score_correction_bias)
  int32_t* topk_ids;         // [tokens, top_k]
  float* topk_weights;       // [tokens, top_k]
  int64_t tokens;
  int32_t num_experts;       // <= kMaxRouterExperts
  int32_t top_k;
  int32_t num_groups;        // <= kMaxRouterGroups, divides num_experts
  int32_t topk_groups;
  bool sigmoid;              // else softmax
  bool group_top_two_sum;    // else group max
  bool renormalize;
  float renorm_eps;
  float scaling;
};
// kAuto: the warp-per-token kernel unless DEEPINFER_MOE_ROUTE=serial (read once); both give the
// same bits. The warp kernel needs top_k <= 32 (else the serial one runs).
enum class MoeRouteImpl { kAuto, kSerial, kWarp };
void launch_moe_route(const MoeRouteParams& p, cudaStream_t stream,
                      MoeRouteImpl impl = MoeRouteImpl::kAuto);

// out[t, :] = sum_j topk_weights[t, j] * y[slot_row[t * top_k + j], :], j ascending, f32 sums.
struct MoeCombineParams {
  const __nv_bfloat16* y;      // [tokens * top_k, hidden] expert outputs, grouped by expert
  const int32_t* slot_row;     // [tokens * top_k] row of y holding slot (t, j)
  const float* topk_weights;   // [tokens, top_k]
  __nv_bfloat16* out;          // [tokens, hidden]
  int64_t tokens;
  int32_t top_k;
  int32_t hidden;
};
void launch_moe_combine(const MoeCombineParams& p, cudaStream_t stream);

}  // namespace di::cuda
