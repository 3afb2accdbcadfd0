// MoE alignment on the device: a stable counting sort of the (token, slot) pairs by expert, in
// one block of kMoeAlignThreads threads (see moe_grouped.h). Integer atomics only, so the result
// is the same on every run; the order within an expert is the slot order (as the CPU backend's).
//
// Cost: one pass over the ids for the counts, a block scan over the experts, then tiles of
// blockDim slots where each thread ranks its slot among the earlier slots of its tile with the
// same expert (O(tile) shared-memory reads). Decode (T * k <= 1024) is a single tile.
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/moe_grouped.h"

namespace di::cuda {
namespace {

__global__ void __launch_bounds__(kMoeAlignThreads) moe_align_kernel(MoeAlignParams p) {
  __shared__ int32_t base[kMoeMaxExperts];  // counts, then the next free row of each expert
  __shared__ int32_t tile_ids[kMoeAlignThreads];
  __shared__ int32_t warp_c[32], warp_a[32], warp_t[32];
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  const int lane = tid & 31, warp = tid >> 5, nwarps = (nt + 31) >> 5;
  const int num_e = p.num_experts;

  for (int e = tid; e < num_e; e += nt) base[e] = 0;
  __syncthreads();
  for (int64_t i = tid; i < p.slots; i += nt) {
    const int e = p.topk_ids[i];
    if (e >= 0 && e < num_e) atomicAdd(&base[e], 1);
  }
  __syncthreads();

  // Exclusive scans of the counts (-> offsets), of the touched flags (-> active list) and of the
  // m-tiles per expert (-> tile_start). num_e <= blockDim.x: thread e owns expert e.
  const int c = tid < num_e ? base[tid] : 0;
  const int a = c > 0 ? 1 : 0;
  const int tl = p.tile_m > 0 ? (c + p.tile_m - 1) / p.tile_m : 0;
  int ic = c, ia = a, it = tl;
  for (int o = 1; o < 32; o <<= 1) {
    const int yc = __shfl_up_sync(0xffffffffu, ic, o), ya = __shfl_up_sync(0xffffffffu, ia, o);
    const int yt = __shfl_up_sync(0xffffffffu, it, o);
    if (lane >= o) {
      ic += yc;
      ia += ya;
      it += yt;
    }
  }
  if (lane == 31) {
    warp_c[warp] = ic;
    warp_a[warp] = ia;
    warp_t[warp] = it;
  }
  __syncthreads();
  if (warp == 0) {
    const int wc = lane < nwarps ? warp_c[lane] : 0, wa = lane < nwarps ? warp_a[lane] : 0;
    const int wt = lane < nwarps ? warp_t[lane] : 0;
    int sc = wc, sa = wa, st = wt;
    for (int o = 1; o < 32; o <<= 1) {
      const int yc = __shfl_up_sync(0xffffffffu, sc, o), ya = __shfl_up_sync(0xffffffffu, sa, o);
      const int yt = __shfl_up_sync(0xffffffffu, st, o);
      if (lane >= o) {
        sc += yc;
        sa += ya;
        st += yt;
      }
    }
    if (lane < nwarps) {
      warp_c[lane] = sc - wc;  // exclusive prefix of the warp totals
      warp_a[lane] = sa - wa;
      warp_t[lane] = st - wt;
    }
  }
  __syncthreads();
  if (tid < num_e) {
    const int exc = warp_c[warp] + ic - c, exa = warp_a[warp] + ia - a, ext = warp_t[warp] + it - tl;
    p.offsets[tid] = exc;
    base[tid] = exc;  // only thread tid reads or writes base[tid] in this phase
    if (a) p.active[exa] = tid;
    if (p.tile_start) p.tile_start[tid] = ext;
    if (tid == num_e - 1) {
      p.offsets[num_e] = exc + c;
      *p.num_active = exa + a;
      if (p.tile_start) p.tile_start[num_e] = ext + tl;
    }
  }
  __syncthreads();

  // Placement, one tile of nt slots at a time: row = base[e] + rank among earlier slots of the
  // tile with the same expert; then base[e] += the tile's count of e.
  for (int64_t t0 = 0; t0 < p.slots; t0 += nt) {
    const int64_t i = t0 + tid;
    int e = -1;
    if (i < p.slots) {
      e = p.topk_ids[i];
      if (e < 0 || e >= num_e) e = -1;
    }
    tile_ids[tid] = e;
    __syncthreads();
    if (e >= 0) {
      int rank = 0;
      for (int j = 0; j < tid; ++j) rank += tile_ids[j] == e ? 1 : 0;
      const int row = base[e] + rank;
      p.row_token[row] = static_cast<int32_t>(i / p.top_k);
      p.slot_row[i] = row;
    } else if (i < p.slots) {
      p.slot_row[i] = -1;
    }
    __syncthreads();  // every thread has read base[] and tile_ids[]
    if (e >= 0) atomicAdd(&base[e], 1);
    __syncthreads();
  }
}

}  // namespace

void launch_moe_align(const MoeAlignParams& p, cudaStream_t stream) {
  if (p.slots == 0) return;
  moe_align_kernel<<<1, kMoeAlignThreads, 0, stream>>>(p);
}

}  // namespace di::cuda
