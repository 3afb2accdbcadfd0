// What a streaming kernel's first read of its input costs after griddepcontrol.wait (issue #6,
// run 41). On the batch-1 timeline the qkv GEMV takes ~2.9 us from its wait to x staged (run 41,
// Qwen3-30B-A3B; 3.7 in run 37), although x is 4 KB that the previous kernel has just written
// (an L2 hit: ~0.15 us on an idle SM, 0.35-0.8 us beside weight streams, bench_cuda_l2lat). Two
// explanations predict different fixes:
//   queueing: the reader's own weight loads issued before the wait (up to 128 KB per SM) are
//     ahead of x on the SM's return path, so x arrives after them (fix: fewer loads before the
//     wait);
//   hot spot: 264 CTAs read the same 32 lines of L2 at once (fix: the writer stores copies).
// This separates them: a writer kernel (132 CTAs) stores x and a copy of it per reader CTA, a
// reader kernel (264 CTAs of 256 threads, 2 per SM, a PDL dependent as the GEMV is) issues PRE
// 16-byte weight loads per thread before griddepcontrol.wait, then reads x (16 bytes per thread:
// 4 KB per CTA) from the one shared copy or from its own, and times (clock64, per CTA) the wait's
// return to every thread holding its x (__syncthreads_or on a value of x). shared_odd_sms: only
// the CTAs on odd-numbered SMs (%smid) issue weights; the others (idle_sm) read x beside them,
// which tells the SM's own return path from a queue shared by all SMs. H200 (run 42): with 128
// KB per loading SM, 2.17 us when every SM loads, 0.57 on the loading SMs and 0.27 on the others
// when only odd SMs do (0.57 at 32 and 64 KB too): a queue of all SMs' loads, not the SM's own.
//
//   [xread] pre=P x=shared|private|shared_odd_sms ctas=all|loading|idle_sm cycles_median=...
//   us_median=...
//
//   bench_cuda_xread [--reps 20]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/kernels/common.cuh"
#include "graph_timing.h"

namespace {

#define CK(x) DI_BENCH_CK(x)

constexpr int kThreads = 256;
constexpr int kReaders = 264;                // CTAs: the qkv GEMV's grid on 132 SMs
constexpr int kXVecs = kThreads;             // 16-byte vectors of x: 4 KB (hidden 2048, bf16)
constexpr int64_t kWeightBytes = 1ll << 30;  // rotated through, so no launch hits L2

// Stores x (every vector; the shared copy and one copy per reader CTA). Lets the reader start
// first (griddepcontrol.launch_dependents), so that its weight loads overlap this kernel.
__global__ void writer_kernel(uint4* x_shared, uint4* x_copies, uint32_t stamp) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int total = (kReaders + 1) * kXVecs;
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < total;
       i += static_cast<int>(gridDim.x * blockDim.x)) {
    const uint4 v =
        make_uint4(stamp, static_cast<uint32_t>(i), stamp ^ static_cast<uint32_t>(i), 1u);
    if (i < kXVecs)
      x_shared[i] = v;
    else
      x_copies[i - kXVecs] = v;
  }
}

__device__ __forceinline__ unsigned sm_id() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

// odd_sms: only the CTAs on odd-numbered SMs issue their weight loads (the others read x with
// nothing of their own in flight, beside SMs that have); cycles[grid + b] = 1 where CTA b did.
template <int PRE>
__global__ void __launch_bounds__(kThreads)
    reader_kernel(const uint4* w, int64_t w_vecs, int64_t w_off, const uint4* x_shared,
                  const uint4* x_copies, int private_x, int odd_sms, long long* cycles,
                  uint32_t* sink) {
  constexpr int kP = PRE > 0 ? PRE : 1;
  uint4 wv[kP];
  const int64_t t = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  const bool preload = !odd_sms || (sm_id() & 1u);  // CTA-uniform
#pragma unroll
  for (int p = 0; p < kP; ++p)
    wv[p] = preload && p < PRE ? di::cuda::ld_stream(w + (w_off + t + p * stride) % w_vecs)
                               : make_uint4(0, 0, 0, 0);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const long long t0 = clock64();
  const uint4* x = private_x ? x_copies + int64_t{blockIdx.x} * kXVecs : x_shared;
  const uint4 xv = x[threadIdx.x];  // a plain load, as the GEMV's prologue reads x
  uint32_t acc = xv.x ^ xv.y ^ xv.z ^ xv.w;
  const int any = __syncthreads_or(acc == 0x12345678u);  // every thread holds its x
  const long long t1 = clock64();
  if (threadIdx.x == 0) {
    cycles[blockIdx.x] = t1 - t0;
    cycles[gridDim.x + blockIdx.x] = preload ? 1 : 0;
  }
#pragma unroll
  for (int p = 0; p < kP; ++p) acc ^= wv[p].x ^ wv[p].w;
  if (acc == 0x9abcdef0u || any) sink[threadIdx.x] = acc;
}

using Reader = void (*)(const uint4*, int64_t, int64_t, const uint4*, const uint4*, int, int,
                        long long*, uint32_t*);

struct Stats {
  long long med = 0, p90 = 0;
  size_t n = 0;
};
Stats stats(std::vector<long long> v) {
  Stats s;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.med = v[v.size() / 2];
  s.p90 = v[v.size() * 9 / 10];
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("[xread] skipped: no CUDA device\n");
    return 0;
  }
  int khz = 0;
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  uint4 *w = nullptr, *xs = nullptr, *xc = nullptr;
  long long* cyc = nullptr;
  uint32_t* sink = nullptr;
  CK(cudaMalloc(&w, kWeightBytes));
  CK(cudaMemset(w, 0x3c, kWeightBytes));
  CK(cudaMalloc(&xs, kXVecs * sizeof(uint4)));
  CK(cudaMalloc(&xc, int64_t{kReaders} * kXVecs * sizeof(uint4)));
  CK(cudaMalloc(&cyc, 2 * kReaders * sizeof(long long)));
  CK(cudaMalloc(&sink, kThreads * sizeof(uint32_t)));
  const int64_t w_vecs = kWeightBytes / 16;
  struct Variant {
    int pre;
    Reader fn;
  };
  const Variant variants[] = {
      {0, reader_kernel<0>}, {4, reader_kernel<4>}, {8, reader_kernel<8>}, {16, reader_kernel<16>}};
  int64_t off = 0;
  const double per_us = khz / 1e3;  // cycles per microsecond at the nominal clock
  for (const Variant& v : variants) {
    for (int mode = 0; mode < 3; ++mode) {  // shared x, private x, shared x + odd SMs only
      const int priv = mode == 1, odd = mode == 2;
      if (odd && v.pre == 0) continue;
      std::vector<long long> all, with, without;
      for (int r = 0; r < reps + 2; ++r) {
        writer_kernel<<<132, kThreads, 0, st>>>(xs, xc, static_cast<uint32_t>(r + 1));
        CK(cudaGetLastError());
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = dim3(kReaders);
        cfg.blockDim = dim3(kThreads);
        cfg.stream = st;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        CK(cudaLaunchKernelEx(&cfg, v.fn, static_cast<const uint4*>(w), w_vecs, off,
                              static_cast<const uint4*>(xs), static_cast<const uint4*>(xc), priv,
                              odd, cyc, sink));
        off = (off + int64_t{kReaders} * kThreads * std::max(v.pre, 1)) % w_vecs;
        CK(cudaStreamSynchronize(st));
        if (r < 2) continue;  // warm-up
        std::vector<long long> c(2 * kReaders);
        CK(cudaMemcpy(c.data(), cyc, c.size() * sizeof(long long), cudaMemcpyDeviceToHost));
        for (int b = 0; b < kReaders; ++b) {
          all.push_back(c[b]);
          (c[kReaders + b] ? with : without).push_back(c[b]);
        }
      }
      const char* xname = odd ? "shared_odd_sms" : priv ? "private" : "shared";
      for (int part = 0; part < (odd ? 2 : 1); ++part) {
        const std::vector<long long>& vv = !odd ? all : part == 0 ? with : without;
        const Stats st = stats(vv);
        std::printf(
            "[xread] pre=%d bytes_in_flight_per_sm=%d x=%s ctas=%s n=%zu "
            "cycles_median=%lld p90=%lld us_median=%.2f us_p90=%.2f\n",
            v.pre, v.pre * 16 * kThreads * 2, xname,
            !odd        ? "all"
            : part == 0 ? "loading"
                        : "idle_sm",
            st.n, st.med, st.p90, st.med / per_us, st.p90 / per_us);
      }
      std::fflush(stdout);
    }
  }
  CK(cudaFree(w));
  CK(cudaFree(xs));
  CK(cudaFree(xc));
  CK(cudaFree(cyc));
  CK(cudaFree(sink));
  return 0;
}
