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

// The CPU backend's algorithm step for step (moe.cu: one thread or one warp per token): softmax
// (double sum) or sigmoid scores; selection on score + bias; group limit (best topk_groups groups
// by their max or top-two sum; other experts' choice set to 0); top-k by repeated arg-max, lower id
// first on ties (= a stable descending sort); weights = unbiased scores, renormalised, scaled. A
// softmax without bias or groups selects on the logits (on_logits). The softmax's denominator is
// summed in moe_softmax_denominator's order (backend.h).
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
  // The host's moe_route_on_logits (backend.h): select on the logits, then compute the k
  // selected weights only (set only for a softmax without bias and group limit).
  bool on_logits = false;
};
// kAuto: the warp-per-token kernel unless DEEPINFER_MOE_ROUTE=serial (read once); both give the
// same bits. The warp kernel needs top_k <= 32 (else the serial one runs).
enum class MoeRouteImpl { kAuto, kSerial, kWarp };
void launch_moe_route(const MoeRouteParams& p, cudaStream_t stream,
                      MoeRouteImpl impl = MoeRouteImpl::kAuto);

// The router of a decode step in one kernel (Backend::moe_norm_route): h = rms_norm(x) · norm_w
// (bitwise the rms_norm kernel's), logits = h · gateᵀ (per expert one warp: lane chunks
// c = lane + 32 i, 8 fmaf each, then warp_sum), routing = the warp router's on those logits
// (bitwise: route_token_warp). Launched with PDL: the gate rows load before the wait.
// Limits: tokens <= kNormRouteMaxTokens, tokens · hidden <= kNormRouteMaxElems, hidden % 8 == 0,
// top_k <= 32, the router's expert / group limits; `counter` is zero before each launch and is
// left zero (the last CTA resets it).
inline constexpr int kNormRouteMaxTokens = 4;
inline constexpr int kNormRouteMaxElems = 16384;  // 32 KB of bf16 rows in shared memory
struct MoeNormRouteKernelParams {
  const __nv_bfloat16* x;       // [tokens, hidden]
  const __nv_bfloat16* norm_w;  // [hidden]
  const __nv_bfloat16* gate;    // [num_experts, hidden]
  __nv_bfloat16* h;             // [tokens, hidden]
  float* logits;                // [tokens, num_experts] (route.logits is this)
  unsigned* counter;
  MoeRouteParams route;  // route.tokens == tokens
  float eps;
  int32_t tokens;
  int32_t hidden;
};
cudaError_t launch_moe_norm_route(const MoeNormRouteKernelParams& p, cudaStream_t stream);
// Whether launch_moe_norm_route runs the cluster router for `num_experts` (at most 128: one
// cluster of 16-warp CTAs; the logits meet in distributed shared memory, no arrival counter;
// same bits as the counter kernel). DEEPINFER_MOE_ROUTE_CLUSTER=0 (read once) or the override
// (1 / 0 forced, -1 back to the environment) keeps the counter kernel.
bool moe_norm_route_uses_cluster(int num_experts);
void set_moe_route_cluster_override(int on);

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
