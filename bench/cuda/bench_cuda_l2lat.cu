// How long one L2 hit takes while weights stream from HBM (issue #6). At batch 1 the decode
// step's small kernels (rope/store, attention, combine, router) each spend 2-5 us after their
// griddepcontrol.wait on chains of a few L2 hits, while the next GEMV's CTAs, launched early as
// PDL dependents, have their weight loads in flight on the same SMs (run 30's trace: the qkv
// GEMV stages x in 3.4 us with its own first weights in flight, o_proj in 1.0 us with them long
// landed). This measures a dependent chain of L2 hits (one lane, a pointer chase over 512 KB
// that L2 holds) on SM 0 while other CTAs stream a 1 GB buffer:
//
//   [l2lat] where=none   nothing else runs
//   [l2lat] where=other  streaming CTAs on every SM but the chaser's
//   [l2lat] where=same   streaming CTAs only on the chaser's SM
//   [l2lat] where=all    streaming CTAs everywhere
//
// Streamers: `ld8` (16-byte loads into registers, 8 in flight per thread, as the GEMV and the
// MoE kernels read weights) or `bulk` (cp.async.bulk into a shared-memory ring, the copy engine:
// 4 x 12 KB per CTA), 3 (x3) or 1 (x1) streaming CTAs of 256 threads per SM. Printed: ns per hop
// (median of 5 launches), and the streamers' bytes / time in TB/s.
//
// Then (run 36) the streamers' bandwidth with SMs 0 .. R-1 kept free of them (`reserve=R`: the
// chaser on SM 0, no streamer below SM R), for R = 1 (where=other above), 9, 17, 33: how much
// HBM bandwidth a decode step would give up if its latency-bound kernels had SMs of their own.
//
//   bench_cuda_l2lat [--hops 400]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cuda/kernels/common.cuh"
#include "graph_timing.h"
#include "weight_stream.cuh"

namespace {

#define CK(x) DI_BENCH_CK(x)

using di::cuda::fence_mbar_init;
using di::cuda::mbar_expect_tx;
using di::cuda::mbar_init;
using di::cuda::mbar_wait;

constexpr int kThreads = 256;
constexpr int kStages = 4;
constexpr uint32_t kStageBytes = 12288;

enum Where : int { kNone = 0, kOther = 1, kSame = 2, kAll = 3 };

struct Params {
  const uint32_t* chain;  // node i holds the index of the next node (128-byte spaced)
  int hops;
  const uint4* stream;  // the streamers' buffer
  int64_t stream_vecs;  // 16-byte vectors in it
  int where;
  int bulk;
  int reserve;      // where=other: no streamer on SMs below this (at least 1: the chaser's)
  unsigned* claim;  // the chaser's CTA claims SM 0 here
  unsigned* done;   // the chaser sets it when its timed hops are over
  unsigned long long*
      out_ns;  // [0] chase ns, [1] stream bytes, [2] first stream start, [3] last stream end
  uint32_t* sink;
};

using di::cuda::globaltimer_ns;
__device__ __forceinline__ unsigned smid() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

__device__ void stream_ld(const Params& p) {
  const int64_t per_cta = p.stream_vecs / gridDim.x;
  uint32_t acc = 0;
  const uint64_t bytes = di::bench::stream_until<8>(p.stream + blockIdx.x * per_cta, per_cta,
                                                    threadIdx.x, kThreads, p.done, 1u, acc);
  if (acc == 0x12345678u) p.sink[0] = acc;  // keeps the loads
  atomicAdd(p.out_ns + 1, static_cast<unsigned long long>(bytes));
}

__device__ void stream_bulk(const Params& p, unsigned char* ring, uint64_t* bars) {
  const int64_t per_cta_bytes = (p.stream_vecs / gridDim.x) * 16 / kStageBytes * kStageBytes;
  const unsigned char* base =
      reinterpret_cast<const unsigned char*>(p.stream) + blockIdx.x * per_cta_bytes;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(&bars[s], 1);
    fence_mbar_init();
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  int64_t off = 0;
  uint64_t bytes = 0;
  uint32_t acc = 0;
  auto issue = [&](int s) {
    mbar_expect_tx(&bars[s], kStageBytes);
    // With the weights' evict-first hint (as ld_stream), so the chain stays in L2.
    di::cuda::bulk_copy_g2s_stream(ring + s * kStageBytes, base + off, kStageBytes, &bars[s]);
    off += kStageBytes;
    if (off >= per_cta_bytes) off = 0;
  };
  for (int s = 0; s < kStages; ++s) issue(s);
  uint32_t round = 0;
  for (;; ++round) {
    for (int s = 0; s < kStages; ++s) {
      mbar_wait(&bars[s], round & 1);
      acc ^= reinterpret_cast<const uint32_t*>(ring + s * kStageBytes)[round & 63];
      bytes += kStageBytes;
      di::cuda::fence_proxy_async();  // the read above before the copy engine overwrites it
      issue(s);
    }
    if (di::bench::load_flag_relaxed(p.done) != 0) break;
  }
  for (int s = 0; s < kStages; ++s) mbar_wait(&bars[s], (round + 1) & 1);  // the last copies
  if (acc == 0x12345678u) p.sink[0] = acc;
  atomicAdd(p.out_ns + 1, static_cast<unsigned long long>(bytes));
}

__global__ void __launch_bounds__(kThreads) l2lat_kernel(Params p) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ uint64_t bars[kStages];
  __shared__ int role;  // 0 idle, 1 chaser, 2 streamer
  const unsigned sm = smid();
  if (threadIdx.x == 0) {
    int r = 0;
    if (sm == 0 && atomicCAS(p.claim, 0u, 1u) == 0u) {
      r = 1;
    } else if (p.where == kAll || (p.where == kOther && sm >= static_cast<unsigned>(p.reserve)) ||
               (p.where == kSame && sm == 0)) {
      r = 2;
    }
    role = r;
  }
  __syncthreads();
  if (role == 0) return;
  if (role == 2) {
    if (threadIdx.x == 0)
      atomicMin(p.out_ns + 2, static_cast<unsigned long long>(globaltimer_ns()));
    if (p.bulk)
      stream_bulk(p, ring, bars);
    else
      stream_ld(p);
    if (threadIdx.x == 0)
      atomicMax(p.out_ns + 3, static_cast<unsigned long long>(globaltimer_ns()));
    return;
  }
  if (threadIdx.x != 0) return;
  // The chaser: one walk to bring the chain into L2, 10 us for the streamers to ramp, then
  // `hops` dependent L2 loads (ld.global.cg: L1 is bypassed), timed.
  uint32_t i = 0;
  for (int h = 0; h < 4096; ++h) i = __ldcg(p.chain + i * 32);
  const uint64_t t_ramp = globaltimer_ns() + 10000;
  while (globaltimer_ns() < t_ramp) {
  }
  const uint64_t t0 = globaltimer_ns();
  for (int h = 0; h < p.hops; ++h) i = __ldcg(p.chain + i * 32);
  const uint64_t t1 = globaltimer_ns();
  p.sink[1] = i;
  p.out_ns[0] = t1 - t0;
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p.done), "r"(1u) : "memory");
}

}  // namespace

int main(int argc, char** argv) {
  int hops = 400;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--hops") && i + 1 < argc) hops = std::atoi(argv[++i]);
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // A random cycle over 4096 nodes, 128 bytes apart (512 KB: L2-resident, no two in a line).
  const int nodes = 4096;
  std::vector<uint32_t> order(nodes), chain(static_cast<size_t>(nodes) * 32, 0);
  for (int i = 0; i < nodes; ++i) order[i] = static_cast<uint32_t>(i);
  uint64_t rng = 88172645463325252ull;
  for (int i = nodes - 1; i > 0; --i) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    std::swap(order[i], order[rng % static_cast<uint64_t>(i + 1)]);
  }
  for (int i = 0; i < nodes; ++i)
    chain[static_cast<size_t>(order[i]) * 32] = order[(i + 1) % nodes];
  uint32_t* d_chain = nullptr;
  CK(cudaMalloc(&d_chain, chain.size() * 4));
  CK(cudaMemcpy(d_chain, chain.data(), chain.size() * 4, cudaMemcpyHostToDevice));
  const int64_t stream_bytes = int64_t{1} << 30;
  uint4* d_stream = nullptr;
  CK(cudaMalloc(&d_stream, stream_bytes));
  CK(cudaMemset(d_stream, 0x5a, stream_bytes));  // not zeros: the bytes are read, not used
  unsigned *d_claim = nullptr, *d_done = nullptr;
  unsigned long long* d_out = nullptr;
  uint32_t* d_sink = nullptr;
  CK(cudaMalloc(&d_claim, 4));
  CK(cudaMalloc(&d_done, 4));
  CK(cudaMalloc(&d_out, 4 * 8));
  CK(cudaMalloc(&d_sink, 8));
  CK(cudaFuncSetAttribute(l2lat_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  const char* where_name[] = {"none", "other", "same", "all"};
  struct Kind {
    const char* name;
    int bulk, ctas_per_sm;
  };
  // ctas_per_sm streamers per SM: every SM holds ctas_per_sm + 1 CTAs (the shared memory
  // each asks for), SM 0 the chaser and ctas_per_sm streamers.
  const Kind kinds[] = {{"ld8x3", 0, 3}, {"ld8x1", 0, 1}, {"bulkx3", 1, 3}, {"bulkx1", 1, 1}};
  // Five launches of one configuration: the chaser's ns per hop and the streams' TB/s, each
  // sorted (the median is the middle element).
  struct Samples {
    std::vector<double> lat, tbps;
  };
  auto measure = [&](const Kind& k, int where, int reserve) {
    Samples r;
    for (int rep = 0; rep < 5; ++rep) {
      CK(cudaMemset(d_claim, 0, 4));
      CK(cudaMemset(d_done, 0, 4));
      const unsigned long long init[4] = {0, 0, ~0ull, 0};
      CK(cudaMemcpy(d_out, init, sizeof init, cudaMemcpyHostToDevice));
      Params p{d_chain, hops,  d_stream, stream_bytes / 16, where, k.bulk, reserve, d_claim,
               d_done,  d_out, d_sink};
      const int smem = (220 * 1024) / (k.ctas_per_sm + 1) / 1024 * 1024;
      l2lat_kernel<<<sms*(k.ctas_per_sm + 1), kThreads, smem>>>(p);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      unsigned long long out[4];
      CK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
      r.lat.push_back(static_cast<double>(out[0]) / hops);
      const double dt = out[3] > out[2] ? static_cast<double>(out[3] - out[2]) : 0.0;
      r.tbps.push_back(dt > 0 ? static_cast<double>(out[1]) / dt / 1e3 : 0.0);
    }
    std::sort(r.lat.begin(), r.lat.end());
    std::sort(r.tbps.begin(), r.tbps.end());
    return r;
  };
  for (const Kind& k : kinds) {
    for (int where = 0; where < 4; ++where) {
      if (where == kNone && &k != &kinds[0]) continue;
      const Samples r = measure(k, where, 1);
      std::printf(
          "[l2lat] where=%s streamer=%s ns_per_hop=%.0f (min %.0f max %.0f) stream_tbps=%.2f\n",
          where_name[where], where == kNone ? "-" : k.name, r.lat[r.lat.size() / 2], r.lat.front(),
          r.lat.back(), r.tbps[r.tbps.size() / 2]);
    }
  }
  // SMs kept free of streamers (where=other with SMs 0 .. reserve-1 idle but the chaser's).
  for (const Kind& k : {kinds[0], kinds[2]}) {
    for (const int reserve : {1, 9, 17, 33}) {
      const Samples r = measure(k, kOther, reserve);
      std::printf(
          "[l2lat] reserve=%d streaming_sms=%d streamer=%s ns_per_hop=%.0f stream_tbps=%.2f\n",
          reserve, sms - reserve, k.name, r.lat[r.lat.size() / 2], r.tbps[r.tbps.size() / 2]);
    }
  }
  return 0;
}
