// MoE router and combine. The router is tiny (tokens x experts, e.g. 256 x 64) and latency-bound.
// Two kernels with the same results bit for bit (and the CPU's order of operations, so ids match
// the CPU op except on exact float ties produced by different exp() roundings):
//   serial: one thread per token, the CPU algorithm step for step (DEEPINFER_MOE_ROUTE=serial);
//   warp (default): one warp per token, experts spread over the lanes (expert i on lane i % 32),
//     element-wise steps in parallel, the softmax's double sum still in expert order (every lane
//     sums the shared-memory exps serially), top-k as k rounds of a warp arg-max that orders
//     (value descending, id ascending) like the CPU's stable sort.
#include <cfloat>
#include <climits>
#include <cstdlib>
#include <cstring>

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

constexpr int kRouteWarps = 4;  // tokens per block of the warp router

__global__ void __launch_bounds__(kRouteWarps * 32) moe_route_warp_kernel(MoeRouteParams p) {
  __shared__ double s_exp[kRouteWarps][kMaxRouterExperts];
  __shared__ float s_score[kRouteWarps][kMaxRouterExperts];
  __shared__ float s_choice[kRouteWarps][kMaxRouterExperts];
  __shared__ float s_gscore[kRouteWarps][kMaxRouterGroups];
  __shared__ int s_keep[kRouteWarps][kMaxRouterGroups];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t t = int64_t{blockIdx.x} * kRouteWarps + warp;
  if (t >= p.tokens) return;  // warp-uniform; only __syncwarp below
  const int e = p.num_experts;
  const float* l = p.logits + t * e;
  float* score = s_score[warp];
  float* choice = s_choice[warp];
  if (!p.sigmoid) {
    float mx = -INFINITY;
    for (int i = lane; i < e; i += 32) mx = fmaxf(mx, l[i]);
    mx = warp_max(mx);
    double* ex = s_exp[warp];
    for (int i = lane; i < e; i += 32) ex[i] = exp(static_cast<double>(l[i] - mx));
    __syncwarp();
    double sum = 0.0;
    for (int i = 0; i < e; ++i) sum += ex[i];  // expert order, as the CPU (broadcast reads)
    for (int i = lane; i < e; i += 32) score[i] = static_cast<float>(ex[i] / sum);
  } else {
    for (int i = lane; i < e; i += 32) score[i] = 1.0f / (1.0f + expf(-l[i]));
  }
  for (int i = lane; i < e; i += 32) choice[i] = score[i] + (p.bias ? p.bias[i] : 0.0f);
  __syncwarp();
  if (p.num_groups > 1 && p.topk_groups < p.num_groups) {
    const int per_group = e / p.num_groups;
    float* gscore = s_gscore[warp];
    int* keep = s_keep[warp];
    for (int g = lane; g < p.num_groups; g += 32) {  // one group per lane, the serial scan
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
      keep[g] = 0;
    }
    __syncwarp();
    if (lane == 0) {  // <= 64 groups: the serial selection (lower group id first on ties)
      for (int j = 0; j < p.topk_groups; ++j) {
        int best = -1;
        for (int g = 0; g < p.num_groups; ++g)
          if (!keep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
        keep[best] = 1;
      }
    }
    __syncwarp();
    for (int i = lane; i < e; i += 32)
      if (!keep[i / per_group]) choice[i] = 0.0f;
    __syncwarp();
  }
  // Top-k: k rounds of arg-max over the untaken experts; better = larger choice, then lower id.
  uint32_t taken = 0;  // bit s: expert lane + 32 * s is taken (e <= 512 -> s < 16)
  int my_id = 0;       // lane j keeps the id of round j
  float sum = 0.0f;
  for (int j = 0; j < p.top_k; ++j) {
    float bv = -INFINITY;
    int bi = INT_MAX;  // INT_MAX: no candidate on this lane
    for (int s = 0, i = lane; i < e; ++s, i += 32) {
      if ((taken >> s) & 1u) continue;
      const float v = choice[i];
      if (bi == INT_MAX || v > bv) {  // ascending ids on a lane: strict '>' keeps the lower id
        bv = v;
        bi = i;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (oi != INT_MAX && (bi == INT_MAX || ov > bv || (ov == bv && oi < bi))) {
        bv = ov;
        bi = oi;
      }
    }
    if (bi == INT_MAX) bi = 0;  // unreachable (top_k <= e is checked on the host)
    if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
    if (lane == j) my_id = bi;
    sum += score[bi];  // j ascending, as the serial kernel
  }
  if (lane < p.top_k) {
    float w = score[my_id];
    if (p.renormalize) w /= (sum + p.renorm_eps);
    p.topk_ids[t * p.top_k + lane] = my_id;
    p.topk_weights[t * p.top_k + lane] = w * p.scaling;
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

void launch_moe_route(const MoeRouteParams& p, cudaStream_t stream, MoeRouteImpl impl) {
  if (p.tokens == 0) return;
  if (impl == MoeRouteImpl::kAuto) {
    static const bool serial = [] {
      const char* v = std::getenv("DEEPINFER_MOE_ROUTE");
      return v != nullptr && std::strcmp(v, "serial") == 0;
    }();
    impl = serial ? MoeRouteImpl::kSerial : MoeRouteImpl::kWarp;
  }
  const bool warp_ok = p.num_experts >= 1 && p.num_experts <= kMaxRouterExperts && p.top_k >= 1 &&
                       p.top_k <= 32 && p.top_k <= p.num_experts && p.num_groups >= 1 &&
                       p.num_groups <= kMaxRouterGroups;
  if (impl == MoeRouteImpl::kWarp && warp_ok) {
    moe_route_warp_kernel<<<ceil_div(p.tokens, kRouteWarps), kRouteWarps * 32, 0, stream>>>(p);
  } else {
    moe_route_kernel<<<ceil_div(p.tokens, 64), 64, 0, stream>>>(p);
  }
}

void launch_moe_combine(const MoeCombineParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  moe_combine_kernel<<<static_cast<unsigned>(p.tokens), 256, 0, stream>>>(p);
}

}  // namespace di::cuda
