// GQA decode attention for small decode batches with the KV splits merged inside the kernel: the
// CTAs of one (kv head, sequence) form one thread-block cluster of up to 16 (a non-portable
// size, sm_90) and merge over distributed shared memory, so the split combine kernel and its
// dependent launch go away (run 43 put the combine's cost at Qwen3-30B-A3B batch 1 at ~2.4 us a
// layer, +4.9 % as an upper bound). Opt-in (DEEPINFER_GQA_CLUSTER): measured within noise of
// the split kernel + combine at batch 1 (run 44, docs/cuda_backend.md).
//
//   token with `limit` keys: T = ceil(limit / 16) sub-tiles of 16 keys; a CTA takes
//   split = 16 * ceil(T / 16) keys (so at most 16 CTAs), its warp w the sub-tile w (one each)
//
//   CTA r of the cluster (warps W >= split / 16, the launch's; idle warps hold no keys)
//     before the wait   each warp copies its sub-tile's entries stored by earlier steps
//     after the wait    this step's entries, q's fragments (gqa_decode_mma.cuh), the sub-tile's
//                       S = Q·Kᵀ, online softmax, O = P·V (the split kernel's arithmetic);
//                       each warp's rows of O and (max, sum) into shared memory, one barrier
//                       per thread: 4 elements of one head, the warps summed in warp order with
//                       weights 2^(m_w - max) (the thread computes its head's) -> the CTA's
//                       unnormalised part, pushed to the elements' owner rank e / per (per =
//                       4 ceil(G·D / 4 / CTAs)); a head's first thread pushes its (max, sum) to
//                       the owners of the head's elements: st.async stores that complete on
//                       the owner's mbarrier (initialised before one cluster barrier, before
//                       the wait, so every CTA has started when the first push comes)
//     owner             its elements: the CTAs' parts in rank order, weights 2^(m_c - M),
//                       out = sum / sum of weighted l -> bf16, the attention output
//
// No barrier after the pushes: every remote access is a st.async before the owner's wait, every
// read after it is local (as the MLA split merge's push, run 43). A token's bits depend only on
// its own context (the split follows `limit`, warps and CTAs without keys add nothing: their max
// is -inf and they are skipped), so a grid sized for a longer context (a graph bucket) gives the
// same bits; they differ from the split kernel + combine (another merge order), so the path is
// off under DEEPINFER_BATCH_INVARIANT=1 and chosen by the batch (gqa_decode_cluster_takes). Run
// 44 also measured DSMEM stores + one cluster barrier instead of st.async (same bits, ±0 against
// the split kernel where st.async gave +0.2 to +0.6 %); removed.
#include <atomic>

#include "backend/cuda/kernels/attention.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gqa_decode.cuh"
#include "backend/cuda/kernels/gqa_decode_mma.cuh"

namespace di::cuda {
namespace {

using gqa_mma::kSub;
constexpr int kMaxWarps = 16;  // sub-tiles per CTA: contexts up to 16 x 16 x 16 = 4,096 keys
constexpr int kMaxCtas = 16;   // the largest (non-portable) cluster on sm_90
constexpr int kMaxRows = 16;   // q heads per kv head (one m16 tile)

// Shared memory: per warp its K and V rows (then its rows of O, which fit in the same bytes),
// then the merge state.
template <int D>
constexpr int warp_bytes() {
  return 2 * kSub * (D + 8) * static_cast<int>(sizeof(bf16));
}
struct ClusterTail {
  __align__(16) float recv_o[kMaxRows * 128 + 4 * kMaxCtas];  // pushed elements: [CTA][per]
  float recv_ml[kMaxCtas][kMaxRows][2];                       // pushed (max, sum) per CTA, row
  float m[kMaxWarps][kMaxRows];  // per warp and row: max (base 2; -inf: no key), sum
  float l[kMaxWarps][kMaxRows];
  uint64_t bar;  // the owner's barrier for the pushed bytes
};

template <int D, int G>
__global__ void __launch_bounds__(kMaxWarps * 32, 1)
    gqa_decode_cluster_kernel(PagedAttentionKernelParams p) {
  DI_TRACE_SCOPE(kTraceGqaDecodeMma, 2);
  const bool late_trigger = p.late_trigger != 0;
  if (!late_trigger) pdl_trigger();
  static_assert(G >= 1 && G <= kMaxRows, "the q heads of a kv head are the rows of one m16 tile");
  static_assert(G * D * sizeof(float) <= warp_bytes<D>(), "a warp's O rows fit in its buffers");
  static_assert(G * D <= kMaxRows * 128, "recv_o holds the elements");
  constexpr int kHalves = gqa_mma::halves<G>();
  constexpr int kDTiles = D / 8;
  constexpr int kLd = D + 8;
  constexpr int kAll = 0x7fffffff;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int nw = static_cast<int>(blockDim.x >> 5);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int rank = blockIdx.x, ncta = gridDim.x, kvh = blockIdx.y, s = blockIdx.z;
  bf16* k_s = reinterpret_cast<bf16*>(smem_raw + warp * warp_bytes<D>());
  bf16* v_s = k_s + kSub * kLd;
  auto& t = *reinterpret_cast<ClusterTail*>(smem_raw + nw * warp_bytes<D>());
  // Elements each rank owns: whole float4s (D % 4 == 0, so a float4 lies in one head).
  const int per = 4 * ((G * D / 4 + ncta - 1) / ncta);
  const int own0 = min(G * D, rank * per), own1 = min(G * D, own0 + per);
  const int own_heads = own1 > own0 ? (own1 - 1) / D - own0 / D + 1 : 0;
  const GqaDecodeSeq seq = gqa_decode_seq(p, s);
  const float c2 = p.scale * kLog2e;
  const bf16* layer_base = p.pool + p.layer_offset + int64_t{kvh} * p.kv_head_stride;
  auto limit_of = [&](int i) { return min(seq.kv_len, p.positions[i] + 1); };
  // Keys per CTA for a token with `limit` keys: whole sub-tiles, at most kMaxCtas CTAs.
  auto split_of = [](int limit) {
    const int tiles = (limit + kSub - 1) / kSub;
    return kSub * max(1, (tiles + kMaxCtas - 1) / kMaxCtas);
  };
  // Before the wait (a PDL dependent of the rope/store kernel): the batch metadata and the first
  // token's entries stored by earlier steps (positions < old_end), nothing this step writes.
  const int i0 = p.qo_indptr[s], i1 = p.qo_indptr[s + 1];
  const int old_end = seq.kv_len - (i1 - i0);
  if (i0 < i1) {
    const int limit = limit_of(i0), sp = split_of(limit);
    const int t0 = rank * sp, t1 = min(limit, t0 + sp);
    if (warp * kSub < sp)
      gqa_mma::copy_subtile<D>(p, seq.b0, layer_base, k_s, v_s, t0 + warp * kSub, t1, 0, old_end,
                               true, lane);
  }
  cp_async_commit();
  // The owner's barrier, seen initialised by every CTA of the cluster (which has then started).
  if (threadIdx.x == 0) {
    mbar_init(&t.bar, 1);
    fence_mbar_init();
  }
  cluster_arrive_relaxed();
  cluster_wait();
  pdl_wait();
  DI_TRACE_WAITED();
  if (late_trigger) pdl_trigger();
  for (int i = i0; i < i1; ++i) {
    const int limit = limit_of(i), sp = split_of(limit);
    const int t0 = rank * sp, t1 = min(limit, t0 + sp), base = t0 + warp * kSub;
    const bool keys = warp * kSub < sp && base < t1;  // warp-uniform
    if (i > i0) {
      // The previous token's merge is read (its owners passed the barrier below and read their
      // parts before this one), and this CTA's buffers are free again.
      cluster_arrive_relaxed();
      cluster_wait();
    }
    // The first token: the entries from old_end on (the rest came before the wait); later ones:
    // all, rows past t1 zeroed.
    if (keys)
      gqa_mma::copy_subtile<D>(p, seq.b0, layer_base, k_s, v_s, base, t1, i > i0 ? 0 : old_end,
                               kAll, i > i0, lane);
    cp_async_commit();
    float o[kDTiles][4];
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g, g + 8 (base 2)
    if (keys) {
      uint32_t qa[D / 16][2 * kHalves];
      gqa_mma::load_q_frags<D, G>(p.q + (int64_t{i} * p.num_q_heads + int64_t{kvh} * G) * D, lane,
                                  qa);
      cp_async_wait<0>();
      __syncwarp();
      gqa_mma::attend_subtile<D, G>(qa, k_s, v_s, base, t1, c2, lane, o, m, l, false);
    } else {
      cp_async_wait<0>();
    }
    // The warp's rows of O over its own K/V buffer (its ldmatrix reads are done), its (m, l).
    float* o_s = reinterpret_cast<float*>(k_s);
#pragma unroll
    for (int r = 0; r < kHalves; ++r) {
      const int h = g + 8 * r;
      const float lr = gqa_mma::quad_sum(l[r]);
      if (h < G) {
        if (keys) {
#pragma unroll
          for (int dt = 0; dt < kDTiles; ++dt)
            *reinterpret_cast<float2*>(&o_s[h * D + dt * 8 + 2 * t4]) =
                make_float2(o[dt][2 * r], o[dt][2 * r + 1]);
        }
        if (t4 == 0) {
          t.m[warp][h] = m[r];
          t.l[warp][h] = lr;
        }
      }
    }
    __syncthreads();
    if (i == i0) DI_TRACE_MARK();  // the CTA's attention done; the merge follows
    const int used = min(ncta, (limit + sp - 1) / sp);  // CTAs holding keys of this token
    if (threadIdx.x == 0 && own1 > own0)
      mbar_expect_tx_cluster(&t.bar,
                             static_cast<uint32_t>(used * ((own1 - own0) * 4 + own_heads * 8)));
    // This CTA's part of 4 elements of one head per thread: the warps in warp order with weights
    // 2^(m_w - max) (each thread computes its head's), pushed to the elements' owner; the thread
    // of a head's first elements pushes that head's (max, sum) to the owners of its elements.
    // CTAs without keys push nothing (owners read `used` parts).
    if (rank < used) {
      for (int q = threadIdx.x; q < G * D / 4; q += blockDim.x) {
        const int e = 4 * q, h = e / D, d = e % D;
        float mm = -INFINITY;
        for (int w = 0; w < nw; ++w) mm = fmaxf(mm, t.m[w][h]);
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float ll = 0.0f;
        if (mm != -INFINITY) {
          for (int w = 0; w < nw; ++w) {
            const float mw = t.m[w][h];
            if (mw == -INFINITY) continue;
            const float cw = fast_exp2(mw - mm);
            ll += cw * t.l[w][h];
            const float4 ow = *reinterpret_cast<const float4*>(smem_raw + w * warp_bytes<D>() +
                                                               (h * D + d) * sizeof(float));
            acc.x += cw * ow.x;
            acc.y += cw * ow.y;
            acc.z += cw * ow.z;
            acc.w += cw * ow.w;
          }
        }
        const int owner = e / per;
        const uint32_t dst = cluster_addr(&t.recv_o[rank * per + (e - owner * per)], owner);
        st_async_v4(dst, acc, cluster_addr(&t.bar, owner));
        if (d == 0) {
          for (int ow = h * D / per; ow <= (h * D + D - 1) / per; ++ow) {
            st_async_v2(cluster_addr(&t.recv_ml[rank][h][0], ow), mm, ll, cluster_addr(&t.bar, ow));
          }
        }
      }
    }
    if (own1 > own0) mbar_wait<true>(&t.bar, static_cast<uint32_t>(i - i0) & 1u);
    // The owner: its elements from the `used` parts, in rank order, 4 per thread.
    for (int e = own0 + 4 * static_cast<int>(threadIdx.x); e < own1; e += 4 * blockDim.x) {
      const int h = e / D, d = e % D, j = e - own0;
      float mx = -INFINITY;
      for (int c = 0; c < used; ++c) mx = fmaxf(mx, t.recv_ml[c][h][0]);
      float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      float den = 0.0f;
      if (mx != -INFINITY) {
        for (int c = 0; c < used; ++c) {
          const float mc = t.recv_ml[c][h][0];
          if (mc == -INFINITY) continue;
          const float wc = fast_exp2(mc - mx);
          const float4 oc = *reinterpret_cast<const float4*>(&t.recv_o[c * per + j]);
          sum.x += wc * oc.x;
          sum.y += wc * oc.y;
          sum.z += wc * oc.z;
          sum.w += wc * oc.w;
          den += wc * t.recv_ml[c][h][1];
        }
      }
      if (!(den > 0.0f)) sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f), den = 1.0f;
      const int64_t row = int64_t{i} * p.num_q_heads + int64_t{kvh} * G + h;
      __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(p.out + row * D + d);
      out[0] =
          __halves2bfloat162(__float2bfloat16_rn(sum.x / den), __float2bfloat16_rn(sum.y / den));
      out[1] =
          __halves2bfloat162(__float2bfloat16_rn(sum.z / den), __float2bfloat16_rn(sum.w / den));
    }
  }
}

// DEEPINFER_GQA_CLUSTER: 0 off, non-zero on for decode batches of at most kMaxSeqs sequences;
// read once; set_gqa_decode_cluster overrides it (-1: the environment's value again).
constexpr int kMaxSeqs = 4;
std::atomic<int> g_override{-1};
std::atomic<int64_t> g_launches{0};
int env_mode() {
  static const int mode = di::env::get_int("DEEPINFER_GQA_CLUSTER", 0);
  return mode;
}

// The launch's shape: warps per CTA and CTAs per cluster for the longest context the grid covers
// (num_splits x split_size keys); 0 warps when beyond kMaxWarps sub-tiles per CTA.
struct ClusterShape {
  int warps = 0;
  int ctas = 0;
};
ClusterShape cluster_shape(const PagedAttentionKernelParams& p) {
  const int64_t keys = int64_t{p.num_splits} * p.split_size;
  const int64_t tiles = (keys + kSub - 1) / kSub;
  const int64_t warps = std::max<int64_t>(1, (tiles + kMaxCtas - 1) / kMaxCtas);
  if (warps > kMaxWarps) return {};
  return {static_cast<int>(warps), static_cast<int>(std::min<int64_t>(kMaxCtas, tiles))};
}

template <int D>
int smem_bytes(int warps) {
  return warps * warp_bytes<D>() + static_cast<int>(sizeof(ClusterTail));
}

template <int D, int G>
bool launch_dg(const PagedAttentionKernelParams& p, const ClusterShape& c, cudaStream_t stream) {
  auto* kernel = gqa_decode_cluster_kernel<D, G>;
  const int smem = smem_bytes<D>(c.warps);
  if (open_dynamic_smem(reinterpret_cast<const void*>(kernel), smem) != cudaSuccess) return false;
  if (c.ctas > 8 &&  // a non-portable cluster size
      raise_func_attribute(reinterpret_cast<const void*>(kernel),
                           cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)
    return false;
  PagedAttentionKernelParams q = p;
  q.late_trigger = attn_late_trigger_env();
  const dim3 grid(static_cast<unsigned>(c.ctas), static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>(p.num_seqs));
  const cudaError_t err =
      launch_attrs(pdl_decode_enabled(kPdlGqaDecodeMma), c.ctas, kernel, grid,
                   dim3(static_cast<unsigned>(c.warps * 32)), static_cast<size_t>(smem), stream, q);
  if (err != cudaSuccess) {    // e.g. no GPC with room for 16 CTAs: the split kernel instead
    (void)cudaGetLastError();  // not left for the caller's launch check
    return false;
  }
  g_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

template <int D>
bool launch_d(const PagedAttentionKernelParams& p, const ClusterShape& c, cudaStream_t stream) {
  switch (p.num_q_heads / p.num_kv_heads) {
    case 4:
      return launch_dg<D, 4>(p, c, stream);
    case 8:
      return launch_dg<D, 8>(p, c, stream);
    case 16:
      return launch_dg<D, 16>(p, c, stream);
    default:
      return false;
  }
}

}  // namespace

int gqa_decode_cluster() {
  const int o = g_override.load(std::memory_order_relaxed);
  return o >= 0 ? o : env_mode();
}
void set_gqa_decode_cluster(int mode) {
  g_override.store(mode, std::memory_order_relaxed);
}
int64_t gqa_decode_cluster_launches() {
  return g_launches.load(std::memory_order_relaxed);
}

bool gqa_decode_cluster_takes(const PagedAttentionKernelParams& p) {
  if (gqa_decode_cluster() == 0 || batch_invariant_env()) return false;
  if (p.num_splits <= 1 || p.num_seqs > kMaxSeqs) return false;
  // The split kernel's checks: at most one new token per sequence, equal head dims of 64 / 128,
  // the layout, the q alignment.
  if (!gqa_decode_mma_takes(p)) return false;
  const int group = p.num_q_heads / p.num_kv_heads;  // (mode 1 there also takes groups 1, 2)
  if (group != 4 && group != 8 && group != 16) return false;
  if (reinterpret_cast<uintptr_t>(p.out) % 8 != 0) return false;  // 4 bf16 per store
  return cluster_shape(p).warps > 0;
}

bool launch_gqa_decode_cluster(const PagedAttentionKernelParams& p, cudaStream_t stream) {
  if (!gqa_decode_cluster_takes(p)) return false;
  const ClusterShape c = cluster_shape(p);
  return p.head_dim_qk == 64 ? launch_d<64>(p, c, stream) : launch_d<128>(p, c, stream);
}

}  // namespace di::cuda
