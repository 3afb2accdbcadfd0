// MoE router and combine. The router is tiny (tokens x experts, e.g. 256 x 64) and latency-bound:
// one thread per token keeps the CPU's exact order of operations, so ids match bit for bit
// except on exact float ties produced by different exp() roundings.
#include <cfloat>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/moe.h"

namespace di::cuda {
namespace {

__global__ void moe_route_kernel(MoeRouteParams p) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= p.tokens) return;
  const int e = p.num_experts;
  const float* l = p.logits + t * e;
  float score[kMaxRouterExperts], choice[kMaxRouterExperts];
  if (!p.sigmoid) {
    float mx = l[0];
    for (int i = 1; i < e; ++i) mx = fmaxf(mx, l[i]);
    double sum = 0.0;
    for (int i = 0; i < e; ++i) sum += exp(static_cast<double>(l[i] - mx));
    for (int i = 0; i < e; ++i) score[i] = static_cast<float>(exp(static_cast<double>(l[i] - mx)) / sum);
  } else {
    for (int i = 0; i < e; ++i) score[i] = 1.0f / (1.0f + expf(-l[i]));
  }
  for (int i = 0; i < e; ++i) choice[i] = score[i] + (p.bias ? p.bias[i] : 0.0f);
  if (p.num_groups > 1 && p.topk_groups < p.num_groups) {
    const int per_group = e / p.num_groups;
    float gscore[kMaxRouterGroups];
    for (int g = 0; g < p.num_groups; ++g) {
      const float* c = choice + g * per_group;
      if (!p.group_top_two_sum) {
        float a = c[0];
        for (int i = 1; i < per_group; ++i) a = fmaxf(a, c[i]);
        gscore[g] = a;
      } else {
        float a = -INFINITY, b = -INFINITY;
        for (int i = 0; i < per_group; ++i) {
          if (c[i] > a) {
            b = a;
            a = c[i];
          } else if (c[i] > b) {
            b = c[i];
          }
        }
        gscore[g] = per_group > 1 ? a + b : a;
      }
    }
    bool keep[kMaxRouterGroups];
    for (int g = 0; g < p.num_groups; ++g) keep[g] = false;
    for (int j = 0; j < p.topk_groups; ++j) {
      int best = -1;
      for (int g = 0; g < p.num_groups; ++g)
        if (!keep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
      keep[best] = true;
    }
    for (int i = 0; i < e; ++i)
      if (!keep[i / per_group]) choice[i] = 0.0f;
  }
  // Top-k by repeated arg-max over the experts not yet taken (strict '>' keeps the lower id).
  int32_t ids[kMaxRouterExperts];
  bool taken[kMaxRouterExperts];
  for (int i = 0; i < e; ++i) taken[i] = false;
  float sum = 0.0f;
  for (int j = 0; j < p.top_k; ++j) {
    int best = -1;
    for (int i = 0; i < e; ++i)
      if (!taken[i] && (best < 0 || choice[i] > choice[best])) best = i;
    ids[j] = best;
    taken[best] = true;
    sum += score[best];
  }
  for (int j = 0; j < p.top_k; ++j) {
    float w = score[ids[j]];
    if (p.renormalize) w /= (sum + p.renorm_eps);
    p.topk_ids[t * p.top_k + j] = ids[j];
    p.topk_weights[t * p.top_k + j] = w * p.scaling;
  }
}

__global__ void moe_combine_kernel(MoeCombineParams p) {
  const int64_t t = blockIdx.x;
  for (int c = threadIdx.x; c < p.hidden; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < p.top_k; ++j) {
      const int64_t row = p.slot_row[t * p.top_k + j];
      acc = fmaf(p.topk_weights[t * p.top_k + j], to_f32(p.y[row * p.hidden + c]), acc);
    }
    p.out[t * p.hidden + c] = __float2bfloat16_rn(acc);
  }
}

}  // namespace

void launch_moe_route(const MoeRouteParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  moe_route_kernel<<<ceil_div(p.tokens, 64), 64, 0, stream>>>(p);
}

void launch_moe_combine(const MoeCombineParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  moe_combine_kernel<<<static_cast<unsigned>(p.tokens), 256, 0, stream>>>(p);
}

}  // namespace di::cuda
