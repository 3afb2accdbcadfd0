// MoE router and combine. The router is tiny (tokens x experts, e.g. 256 x 64) and latency-bound.
// Two kernels with the same results bit for bit (and the CPU's order of operations, so ids match
// the CPU op except on exact float ties produced by different exp() roundings):
//   serial: one thread per token, the CPU algorithm step for step (DEEPINFER_MOE_ROUTE=serial);
//   warp (default): one warp per token, experts spread over the lanes (expert i on lane i % 32),
//     element-wise steps in parallel, the softmax's double sum in the warp's reduction order
//     (moe_softmax_denominator, backend.h: lane sums, then a butterfly), top-k as k rounds of a
//     warp arg-max that orders (value descending, id ascending) like the CPU's stable sort.
// A softmax without bias or group limit (MoeRouteParams::on_logits) selects on the logits and
// computes only the k selected weights, as the CPU op does.
#include <atomic>
#include <cfloat>
#include <climits>
#include <cstdlib>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/moe.h"
#include "backend/moe_softmax_denominator.h"
#include "core/env.h"

namespace di::cuda {
namespace {

__global__ void moe_route_kernel(MoeRouteParams p) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= p.tokens) return;
  const int e = p.num_experts;
  const float* l = p.logits + t * e;
  float score[kMaxRouterExperts], choice[kMaxRouterExperts];
  if (p.on_logits) {  // the logits are the scores (no bias): the weights after the top k
    for (int i = 0; i < e; ++i) score[i] = l[i];
  } else if (!p.sigmoid) {
    float mx = l[0];
    for (int i = 1; i < e; ++i) mx = fmaxf(mx, l[i]);
    const double sum = softmax_denominator_lanes(l, e, mx);
    for (int i = 0; i < e; ++i) score[i] = static_cast<float>(exp(static_cast<double>(l[i] - mx)) / sum);
  } else {
    for (int i = 0; i < e; ++i) score[i] = 1.0f / (1.0f + expf(-l[i]));
  }
  for (int i = 0; i < e; ++i) choice[i] = score[i] + (p.bias ? p.bias[i] : 0.0f);
  if (!p.on_logits && p.num_groups > 1 && p.topk_groups < p.num_groups) {
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
  if (p.on_logits) {  // renormalised: over the k selected (slot order), else over all E
    const float mx = score[ids[0]];
    double total = 0.0;
    if (p.renormalize) {
      for (int j = 0; j < p.top_k; ++j) total += exp(static_cast<double>(score[ids[j]] - mx));
    } else {
      total = softmax_denominator_lanes(l, e, mx);
    }
    for (int j = 0; j < p.top_k; ++j) {
      p.topk_ids[t * p.top_k + j] = ids[j];
      p.topk_weights[t * p.top_k + j] =
          static_cast<float>(exp(static_cast<double>(score[ids[j]] - mx)) / total) * p.scaling;
    }
    return;
  }
  for (int j = 0; j < p.top_k; ++j) {
    float w = score[ids[j]];
    if (p.renormalize) w /= (sum + p.renorm_eps);
    p.topk_ids[t * p.top_k + j] = ids[j];
    p.topk_weights[t * p.top_k + j] = w * p.scaling;
  }
}

constexpr int kRouteWarps = 4;  // tokens per block of the warp router

// Register slots per lane (expert lane + 32·s in slot s): the kernels are instantiated for 2 / 4 /
// 8 / 16 slots (E <= 64 / 128 / 256 / 512, route_slots) so that a small router's code is short:
// the 16-slot routing was ~7,200 SASS instructions in the fused router, whose first run on each
// SM waits on instruction fetch (ncu run 20: 18 % of V2-Lite's fused-router stall samples). The
// slots past E are skipped by warp-uniform branches either way, so every instance gives the
// same bits. DEEPINFER_MOE_ROUTE_SLOTS=16 (read once) takes the 16-slot instance for every E
// (the code before run 20).
constexpr int kRoutePerLane = kMaxRouterExperts / 32;
inline int route_slots(int experts) {
  static const bool all16 = di::env::is("DEEPINFER_MOE_ROUTE_SLOTS", "16");
  if (all16) return kRoutePerLane;
  return experts <= 64 ? 2 : experts <= 128 ? 4 : experts <= 256 ? 8 : kRoutePerLane;
}

// Shared-memory scratch of one warp's routing (the choices and group scores of the group limit).
struct RouteWarpScratch {
  float choice[kMaxRouterExperts];
  float gscore[kMaxRouterGroups];
  int keep[kMaxRouterGroups];
};

// A float's bits as an unsigned key with the float order: a > b <=> key(a) > key(b) (no NaNs;
// -0 is mapped to +0 first, so that equal floats have equal keys).
__device__ __forceinline__ unsigned ordered_key(float f) {
  const unsigned u = __float_as_uint(f + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The softmax denominator from the lanes' exps (expert lane + 32·s in slot s, zero past E): the
// lane's sum in slot order, then the butterfly (moe_softmax_denominator, backend.h); every lane
// gets the result.
template <int kSlots>
__device__ __forceinline__ double softmax_denominator_warp(const double (&ex)[kSlots], int e) {
  double v = 0.0;
#pragma unroll
  for (int s = 0; s < kSlots; ++s)
    if (32 * s < e) v += ex[s];  // warp-uniform; ex is 0 past E (v + 0 = v)
#pragma unroll
  for (int o = 16; o >= 1; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// What a router instance is compiled for: any MoeRouteParams (every branch taken at run time), or
// a softmax selected on its logits (MoeRouteParams::on_logits: no bias, no group limit) with the
// weights renormalised over the k selected (Qwen3-MoE) or over the full softmax (DeepSeek-V2-Lite).
// The two model instances hold only their own path: a decode step runs the router once per layer
// and its code cold each time (docs/batch1_decode.md, "Cold code"). Same arithmetic: same bits.
enum class RouteMode { kAny, kLogitsRenorm, kLogitsFull };
inline RouteMode route_mode(const MoeRouteParams& p) {
  if (!p.on_logits) return RouteMode::kAny;
  return p.renormalize ? RouteMode::kLogitsRenorm : RouteMode::kLogitsFull;
}

// Token t's routing by one warp from its logits row l (read through L2: the fused router's last
// CTA reads rows other CTAs wrote; or from shared memory: the cluster router's gathered rows).
// Every lane of the warp calls it. Expert i = lane + 32·s is held by lane i % 32 in register slot s
// (score, choice); slots past the experts are skipped by warp-uniform branches. Each top-k round is
// two warp reductions (redux.sync): the largest choice key, then the lowest id holding it.
template <int kSlots, bool kSharedLogits = false, RouteMode kMode = RouteMode::kAny>
__device__ void route_token_warp(const MoeRouteParams& p, int64_t t, const float* l, int lane,
                                 RouteWarpScratch& sm) {
  // l in global memory (read through L2) or, kSharedLogits, in this CTA's shared memory.
  auto logit = [&](int i) { return kSharedLogits ? l[i] : __ldcg(l + i); };
  const int e = p.num_experts;
  float score[kSlots], choice[kSlots];
  // on_logits (a softmax without bias or groups): the logits are the scores and the choices; the
  // weights come after the top-k rounds, from the full softmax's denominator unless renormalised.
  // A model instance (kMode = route_mode(p), picked by the launch) has these as constants.
  constexpr bool kAny = kMode == RouteMode::kAny;
  const bool on_logits = kAny ? p.on_logits : true;
  const bool renormalize = kAny ? p.renormalize : kMode == RouteMode::kLogitsRenorm;
  const bool sigmoid = kAny ? p.sigmoid : false;
  const float* const bias = kAny ? p.bias : nullptr;
  double denom = 0.0;
  if (on_logits || !sigmoid) {
    float lg[kSlots];
    float mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      lg[s] = -INFINITY;
      if (32 * s < e) {  // warp-uniform
        const int i = lane + 32 * s;
        if (i < e) lg[s] = logit(i);
        mx = fmaxf(mx, lg[s]);
      }
    }
    double ex[kSlots] = {};
    if (!on_logits || !renormalize) {  // the full softmax's denominator
      mx = warp_max(mx);
#pragma unroll
      for (int s = 0; s < kSlots; ++s)
        ex[s] = 32 * s < e && lane + 32 * s < e ? exp(static_cast<double>(lg[s] - mx)) : 0.0;
      denom = softmax_denominator_warp(ex, e);
    }
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (on_logits) {
        score[s] = lg[s];
      } else {
        score[s] = 0.0f;
        if (32 * s < e) score[s] = static_cast<float>(ex[s] / denom);
      }
    }
  } else {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      score[s] = 0.0f;
      if (32 * s < e) {
        const int i = lane + 32 * s;
        if (i < e) score[s] = 1.0f / (1.0f + expf(-logit(i)));
      }
    }
  }
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int i = lane + 32 * s;
    choice[s] = 0.0f;
    if (32 * s < e && i < e) choice[s] = score[s] + (bias ? bias[i] : 0.0f);
  }
  if (kAny && !on_logits && p.num_groups > 1 && p.topk_groups < p.num_groups) {
    const int per_group = e / p.num_groups;
    float* ch = sm.choice;
#pragma unroll
    for (int s = 0; s < kSlots; ++s)
      if (32 * s < e && lane + 32 * s < e) ch[lane + 32 * s] = choice[s];
    __syncwarp();
    float* gscore = sm.gscore;
    int* keep = sm.keep;
    for (int g = lane; g < p.num_groups; g += 32) {  // one group per lane, the serial scan
      const float* c = ch + g * per_group;
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
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int i = lane + 32 * s;
      if (32 * s < e && i < e && !keep[i / per_group]) choice[s] = 0.0f;
    }
  }
  // Top-k: k rounds of arg-max over the untaken experts; better = larger choice, then lower id.
  int my_id = 0;  // lane j keeps the id of round j
  float my_score = 0.0f;
  float sum = 0.0f;
  if constexpr (!kAny && (kSlots == 2 || kSlots == 4)) {
    // The model instances (choices = scores = logits): each lane sorts its experts once, best
    // first, then a round is one warp max over the lanes' heads, a vote for the lanes holding it
    // and a shift of the winner's list (the lowest id by a second reduction only when several
    // heads tie). The same order as the scan below — larger key, then lower id — so the same
    // rounds: same ids, same scores, same bits (test_cuda_moe's *_ties cases repeat gate rows).
    // Run 43 (H200, batch 1, against the scan in one binary): Qwen3-30B-A3B 417.1 -> 420.1 tok/s
    // (+0.7 %), V2-Lite flat (its routing overlaps the shared experts' gate_up).
    unsigned key[kSlots];
    int id[kSlots];
    float sc[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int i = lane + 32 * s;
      const bool real = 32 * s < e && i < e;
      key[s] = real ? ordered_key(choice[s]) : 0u;  // 0: never chosen (real keys are > 0)
      id[s] = i;
      sc[s] = real ? score[s] : 0.0f;
    }
    auto exchange = [&](int a, int b) {  // b before a: swap (a < b; ids ascend with s)
      if (key[b] > key[a] || (key[b] == key[a] && id[b] < id[a])) {
        const unsigned tk = key[a];
        key[a] = key[b];
        key[b] = tk;
        const int ti = id[a];
        id[a] = id[b];
        id[b] = ti;
        const float ts = sc[a];
        sc[a] = sc[b];
        sc[b] = ts;
      }
    };
    exchange(0, 1);  // a sorting network for 2 or 4 entries
    if constexpr (kSlots == 4) {
      exchange(2, 3);
      exchange(0, 2);
      exchange(1, 3);
      exchange(1, 2);
    }
    for (int j = 0; j < p.top_k; ++j) {
      const unsigned best_key = __reduce_max_sync(0xffffffffu, key[0]);
      const unsigned held = __ballot_sync(0xffffffffu, key[0] == best_key);
      int win = __ffs(static_cast<int>(held)) - 1;
      if (__popc(held) > 1) {  // warp-uniform: heads tie; the lowest id among them
        const unsigned lo = __reduce_min_sync(
            0xffffffffu, key[0] == best_key ? static_cast<unsigned>(id[0]) : 0xffffffffu);
        win = static_cast<int>(lo & 31u);
      }
      const int best = __shfl_sync(0xffffffffu, id[0], win);
      const float best_score = __shfl_sync(0xffffffffu, sc[0], win);
      if (lane == win) {
#pragma unroll
        for (int s = 0; s + 1 < kSlots; ++s) {
          key[s] = key[s + 1];
          id[s] = id[s + 1];
          sc[s] = sc[s + 1];
        }
        key[kSlots - 1] = 0u;
      }
      if (lane == j) {
        my_id = best;
        my_score = best_score;
      }
    }
  } else {
    uint32_t taken = 0;  // bit s: expert lane + 32 * s is taken (e <= 512 -> s < 16)
    for (int j = 0; j < p.top_k; ++j) {
      unsigned bk = 0;  // the lane's best candidate (key 0: none; every real key is > 0)
      float bs = 0.0f;
      int bi = INT_MAX;
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        if (32 * s < e) {
          const int i = lane + 32 * s;
          const unsigned k = ordered_key(choice[s]);
          // ascending ids on a lane: strict '>' keeps the lower id
          if (i < e && !((taken >> s) & 1u) && k > bk) {
            bk = k;
            bs = score[s];
            bi = i;
          }
        }
      }
      const unsigned best_key = __reduce_max_sync(0xffffffffu, bk);
      int best = static_cast<int>(
          __reduce_min_sync(0xffffffffu, bk == best_key ? static_cast<unsigned>(bi) : 0xffffffffu));
      if (best >= e) best = 0;  // unreachable (top_k <= e is checked on the host)
      const float best_score = __shfl_sync(0xffffffffu, bs, best & 31);
      if ((best & 31) == lane) taken |= 1u << (best >> 5);
      if (lane == j) {
        my_id = best;
        my_score = best_score;
      }
      sum += best_score;  // j ascending, as the serial kernel
    }
  }
  if (on_logits) {  // my_score: the logit of slot `lane`; slot 0 holds the largest
    const float mx = __shfl_sync(0xffffffffu, my_score, 0);
    const double ex = lane < p.top_k ? exp(static_cast<double>(my_score - mx)) : 0.0;
    double total = denom;
    if (renormalize) {
      total = 0.0;
      for (int j = 0; j < p.top_k; ++j) total += __shfl_sync(0xffffffffu, ex, j);  // slot order
    }
    if (lane < p.top_k) {
      p.topk_ids[t * p.top_k + lane] = my_id;
      p.topk_weights[t * p.top_k + lane] = static_cast<float>(ex / total) * p.scaling;
    }
    return;
  }
  if (lane < p.top_k) {
    float w = my_score;
    if (renormalize) w /= (sum + p.renorm_eps);
    p.topk_ids[t * p.top_k + lane] = my_id;
    p.topk_weights[t * p.top_k + lane] = w * p.scaling;
  }
}

template <int kSlots>
__global__ void __launch_bounds__(kRouteWarps * 32) moe_route_warp_kernel(MoeRouteParams p) {
  __shared__ RouteWarpScratch s[kRouteWarps];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t t = int64_t{blockIdx.x} * kRouteWarps + warp;
  if (t >= p.tokens) return;  // warp-uniform; only __syncwarp inside
  route_token_warp<kSlots>(p, t, p.logits + t * p.num_experts, lane, s[warp]);
}

// ---- the fused router of a decode step: rms_norm, gate GEMV, routing (moe.h) ----
// Block b, warp w of W: expert b·W + w. Its gate row's first kNormRoutePre chunks per lane are
// loaded before griddepcontrol.wait (the weights do not depend on the previous kernel). Every CTA
// then normalises the tokens' rows into shared memory (the rms_norm kernel's arithmetic: see
// norm_rows), CTA 0 also writes them out as h, and each warp writes its expert's logits. Then
// either (W = 4, any expert count) the last CTA to finish (arrival counter) routes token t with
// warp t, reading the logits back through L2, or (the cluster router, W = 16, one cluster of at
// most kRouteClusterMaxCtas CTAs: up to 128 experts) each warp also stores its logits into CTA
// 0's shared memory over distributed shared memory, and CTA 0 routes after one cluster barrier:
// no global round trip and no atomic between the logits and the routing (run 26; the stores
// replaced CTA 0's gather and a second barrier in run 37).
constexpr int kNormRouteWarps = 4;
constexpr int kRouteClusterWarps = 16;
constexpr int kRouteClusterMaxCtas = 8;  // the portable cluster size
constexpr int kRouteClusterMaxExperts = kRouteClusterWarps * kRouteClusterMaxCtas;
constexpr int kNormRoutePre = 8;       // 16-byte chunks per lane in registers (hidden 2048: all)
constexpr int kNormRouteNwChunks = 2;  // norm_w chunks per thread in registers (hidden 2048: all)

// rms_norm_kernel (elementwise.cu) with R = launch threads: thread v of R sums x[v + R·m]² in m
// order (fmaf), warps of 32 reduce by warp_sum, then warp 0 sums the R/32 warp sums (zeros
// above). Here the CTA's W·32 threads play the R = 128 / 256 / 512 threads' parts (thread i: v =
// i, i + 32·W, ... below R) and the same trees over the row staged in shared memory: bitwise the
// rms_norm kernel's h. xs: the rows, replaced by h in place; nw: this thread's chunks
// c = tid + 32·W·i of norm_w.
template <int W>
__device__ void norm_rows(const MoeNormRouteKernelParams& p, __nv_bfloat16* xs, float* red,
                          const uint4 (&nw)[kNormRouteNwChunks]) {
  constexpr int kT = W * 32;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int d = p.hidden, R = rms_norm_threads(d);
  const int chunks = d / 8;
  for (int t = 0; t < p.tokens; ++t) {
    __nv_bfloat16* x = xs + int64_t{t} * d;
    for (int v = tid; v < R; v += kT) {  // warp-uniform: R and kT are multiples of 32
      float ss = 0.0f;
      for (int i = v; i < d; i += R) {
        const float f = __bfloat162float(x[i]);
        ss += f * f;
      }
      ss = warp_sum(ss);
      if (lane == 0) red[v >> 5] = ss;  // warp v / 32 of the R-thread kernel
    }
    __syncthreads();
    if (warp == 0) {
      float w = lane < R / 32 ? red[lane] : 0.0f;
      w = warp_sum(w);
      if (lane == 0) red[16] = w;
    }
    __syncthreads();
    const float inv = rsqrtf(red[16] / static_cast<float>(d) + p.eps);
    uint4* xv = reinterpret_cast<uint4*>(x);
    uint4* hv = reinterpret_cast<uint4*>(p.h + int64_t{t} * d);
    for (int c = tid, i = 0; c < chunks; c += kT, ++i) {
      float xf[8], wf[8];
      unpack8(xv[c], xf);
      unpack8(i < kNormRouteNwChunks ? nw[i] : __ldg(reinterpret_cast<const uint4*>(p.norm_w) + c),
              wf);
      __nv_bfloat162 y[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        y[k] =
            __floats2bfloat162_rn(xf[2 * k] * inv * wf[2 * k], xf[2 * k + 1] * inv * wf[2 * k + 1]);
      const uint4 yv = *reinterpret_cast<const uint4*>(y);
      xv[c] = yv;  // each chunk is read and written by this thread only
      if (blockIdx.x == 0) hv[c] = yv;
    }
    __syncthreads();  // red is reused by the next token; the rows are read by every warp next
  }
}

template <int kSlots, int W, bool kCluster, RouteMode kMode = RouteMode::kAny>
__global__ void __launch_bounds__(W * 32) moe_norm_route_kernel(MoeNormRouteKernelParams p) {
  DI_TRACE_SCOPE(kTraceMoeNormRoute, kCluster ? 1 : 0);
  // The rows while the logits are computed, then (the routing CTA) the routing scratch.
  constexpr size_t kRowBytes = kNormRouteMaxElems * sizeof(__nv_bfloat16);
  constexpr size_t kScratchBytes = kNormRouteMaxTokens * sizeof(RouteWarpScratch);
  __shared__ __align__(
      16) unsigned char smem[kRowBytes > kScratchBytes ? kRowBytes : kScratchBytes];
  __shared__ float red[17];
  // The cluster router: in CTA 0, every CTA's logits [token][E] (each warp stores its own there).
  __shared__ float all_logits[kCluster ? kNormRouteMaxTokens * kRouteClusterMaxExperts : 1];
  __nv_bfloat16* hs = reinterpret_cast<__nv_bfloat16*>(smem);
  RouteWarpScratch* scratch = reinterpret_cast<RouteWarpScratch*>(smem);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int e = static_cast<int>(blockIdx.x) * W + warp;
  const int ne = p.route.num_experts;
  const int chunks = p.hidden / 8;
  // Before the wait: the warp's gate row and the thread's norm_w chunks (weights).
  const uint4* wr = reinterpret_cast<const uint4*>(p.gate + int64_t{e < ne ? e : 0} * p.hidden);
  uint4 w[kNormRoutePre], nw[kNormRouteNwChunks];
#pragma unroll
  for (int i = 0; i < kNormRoutePre; ++i) {
    const int c = lane + 32 * i;
    w[i] = e < ne && c < chunks ? ld_stream(wr + c) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int i = 0; i < kNormRouteNwChunks; ++i) {
    const int c = tid + W * 32 * i;
    nw[i] =
        c < chunks ? __ldg(reinterpret_cast<const uint4*>(p.norm_w) + c) : make_uint4(0, 0, 0, 0);
  }
  pdl_wait();
  DI_TRACE_WAITED();
  pdl_trigger();
  {  // the tokens' rows of x into shared memory (16-byte loads)
    const uint4* xg = reinterpret_cast<const uint4*>(p.x);
    uint4* xs = reinterpret_cast<uint4*>(hs);
    for (int c = tid; c < p.tokens * chunks; c += W * 32) xs[c] = xg[c];
  }
  __syncthreads();
  norm_rows<W>(p, hs, red, nw);
  if (e < ne) {  // warp-uniform
    for (int t = 0; t < p.tokens; ++t) {
      const uint4* hr = reinterpret_cast<const uint4*>(hs + int64_t{t} * p.hidden);
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < kNormRoutePre; ++i) {
        const int c = lane + 32 * i;
        if (c < chunks) {
          float wf[8], hf[8];
          unpack8(w[i], wf);
          unpack8(hr[c], hf);
          acc = dot8(wf, hf, acc);
        }
      }
      for (int c = lane + 32 * kNormRoutePre; c < chunks; c += 32) {  // hidden > 2048
        float wf[8], hf[8];
        unpack8(ld_stream(wr + c), wf);
        unpack8(hr[c], hf);
        acc = dot8(wf, hf, acc);
      }
      acc = warp_sum(acc);
      if (lane == 0) {
        DI_TRACE_MARK_AFTER(acc);  // (thread 0) its logit
        p.logits[int64_t{t} * ne + e] = acc;
        if constexpr (kCluster)
          st_cluster_f32(cluster_addr(all_logits + t * kRouteClusterMaxExperts + e, 0), acc);
      }
    }
  }
  if constexpr (kCluster) {
    // Each warp has stored its logits into CTA 0's all_logits (the cluster spans the grid: rank
    // = blockIdx.x); after the barrier (release / acquire at cluster scope) CTA 0 holds them all,
    // and every warp of it is done with hs (scratch may reuse it). No CTA reads another's shared
    // memory, so nothing has to stay alive past this one barrier (run 37: it replaced a gather
    // by CTA 0 over distributed shared memory between two barriers).
    cluster_arrive();
    cluster_wait();
    if (blockIdx.x != 0) return;
    if (warp < p.tokens) {
      route_token_warp<kSlots, true, kMode>(
          p.route, warp, all_logits + warp * kRouteClusterMaxExperts, lane, scratch[warp]);
    }
  } else {
    // The last CTA to arrive routes (atomic_add_acq_rel_gpu: release of this CTA's logits,
    // acquire of the others').
    __shared__ bool is_last;
    __syncthreads();  // also: every warp is done with hs before scratch overwrites it
    if (tid == 0) is_last = atomic_add_acq_rel_gpu(p.counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!is_last) return;
    if (warp < p.tokens) {
      route_token_warp<kSlots>(p.route, warp, p.logits + int64_t{warp} * ne, lane, scratch[warp]);
    }
    if (tid == 0) *p.counter = 0;  // for the next launch (stream order)
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
    static const bool serial = di::env::is("DEEPINFER_MOE_ROUTE", "serial");
    impl = serial ? MoeRouteImpl::kSerial : MoeRouteImpl::kWarp;
  }
  const bool warp_ok = p.num_experts >= 1 && p.num_experts <= kMaxRouterExperts && p.top_k >= 1 &&
                       p.top_k <= 32 && p.top_k <= p.num_experts && p.num_groups >= 1 &&
                       p.num_groups <= kMaxRouterGroups;
  if (impl == MoeRouteImpl::kWarp && warp_ok) {
    const int slots = route_slots(p.num_experts);
    void (*kernel)(MoeRouteParams) = slots == 2   ? moe_route_warp_kernel<2>
                                     : slots == 4 ? moe_route_warp_kernel<4>
                                     : slots == 8 ? moe_route_warp_kernel<8>
                                                  : moe_route_warp_kernel<kRoutePerLane>;
    kernel<<<ceil_div(p.tokens, kRouteWarps), kRouteWarps * 32, 0, stream>>>(p);
  } else {
    moe_route_kernel<<<ceil_div(p.tokens, 64), 64, 0, stream>>>(p);
  }
}

namespace {
std::atomic<int> g_route_cluster{-1};  // -1: DEEPINFER_MOE_ROUTE_CLUSTER (default on)
bool route_cluster_on() {
  const int forced = g_route_cluster.load(std::memory_order_relaxed);
  if (forced >= 0) return forced != 0;
  static const bool on = di::env::get_int("DEEPINFER_MOE_ROUTE_CLUSTER", 1) != 0;
  return on;
}
}  // namespace

void set_moe_route_cluster_override(int on) {
  g_route_cluster.store(on, std::memory_order_relaxed);
}

bool moe_norm_route_uses_cluster(int num_experts) {
  // (DEEPINFER_MOE_ROUTE_SLOTS=16 asks for the 16-slot kernel: the counter one has it.)
  return route_cluster_on() && num_experts <= kRouteClusterMaxExperts &&
         route_slots(num_experts) <= 4;
}

cudaError_t launch_moe_norm_route(const MoeNormRouteKernelParams& p, cudaStream_t stream) {
  const int slots = route_slots(p.route.num_experts);
  if (moe_norm_route_uses_cluster(p.route.num_experts)) {
    // slots <= 4 here (at most 128 experts); the cluster is the whole grid (<= 8 CTAs). The
    // instance of the routing mode (RouteMode: the models' softmax routings have their own).
    constexpr int W = kRouteClusterWarps;
    using Kernel = void (*)(MoeNormRouteKernelParams);
    constexpr Kernel kByMode[2][3] = {{moe_norm_route_kernel<2, W, true, RouteMode::kAny>,
                                       moe_norm_route_kernel<2, W, true, RouteMode::kLogitsRenorm>,
                                       moe_norm_route_kernel<2, W, true, RouteMode::kLogitsFull>},
                                      {moe_norm_route_kernel<4, W, true, RouteMode::kAny>,
                                       moe_norm_route_kernel<4, W, true, RouteMode::kLogitsRenorm>,
                                       moe_norm_route_kernel<4, W, true, RouteMode::kLogitsFull>}};
    const Kernel kernel = kByMode[slots == 2 ? 0 : 1][static_cast<int>(route_mode(p.route))];
    const int ctas = ceil_div(p.route.num_experts, kRouteClusterWarps);
    return launch_cluster_pdl(ctas, kernel, dim3(static_cast<unsigned>(ctas)),
                              dim3(kRouteClusterWarps * 32), 0, stream, p);
  }
  void (*kernel)(MoeNormRouteKernelParams) =
      slots == 2   ? moe_norm_route_kernel<2, kNormRouteWarps, false>
      : slots == 4 ? moe_norm_route_kernel<4, kNormRouteWarps, false>
      : slots == 8 ? moe_norm_route_kernel<8, kNormRouteWarps, false>
                   : moe_norm_route_kernel<kRoutePerLane, kNormRouteWarps, false>;
  return launch_pdl(kernel, dim3(ceil_div(p.route.num_experts, kNormRouteWarps)),
                    dim3(kNormRouteWarps * 32), 0, stream, p);
}

void launch_moe_combine(const MoeCombineParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  moe_combine_kernel<<<static_cast<unsigned>(p.tokens), 256, 0, stream>>>(p);
}

}  // namespace di::cuda
