// What cold code costs a decode kernel after its griddepcontrol.wait (issue #6). Run 30's trace
// found o_proj's CTAs 2.8-3.1 us from their staged input to their end when they had slept at the
// wait while other kernels ran on their SM, 2.3 when they started at the wait, whatever the time
// their weights were requested; one guess is that the SM's instruction cache lost the GEMV's
// post-wait code meanwhile (a decode layer runs ~240 KB of kernel code, docs/cuda_backend.md),
// and that each refetch goes through an L2 that the weight streams keep busy.
//
// A `measured` kernel (one CTA per SM, PDL dependent of the kernel before it) waits, then thread
// 0 of every CTA times `code` straight-line instructions (4 independent FMA chains, so issue and
// not latency bounds them warm). Before it runs one of:
//   warm     the measured kernel itself (its code was just run on every SM)
//   evict    a kernel of 16,384 straight-line instructions (256 KB of code) on every SM
// and during its timed part the other 7 warps of each CTA either idle or stream HBM (16-byte
// loads, 8 in flight per thread, as the decode GEMVs) when `stream` is set. Printed: the median
// over CTAs and launches of the timed part, in ns, and ns per KB of code.
//
//   bench_cuda_icache [--reps 20]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/kernels/common.cuh"
#include "graph_timing.h"
#include "weight_stream.cuh"

namespace {

#define CK(x) DI_BENCH_CK(x)

constexpr int kThreads = 256;
constexpr int kEvictInstr = 16384;

using di::cuda::globaltimer_ns;

// N straight-line float FMAs over four independent registers (N / 4 dependent steps each). Float
// FMAs with a runtime multiplier, because ptxas folds a chain of integer adds of constants into one
// add (the first version timed 0 ns).
template <int N>
__device__ __forceinline__ uint32_t straight_line(uint32_t seed) {
  const float m = __uint_as_float((seed & 0x007fffffu) | 0x3f000000u);  // in [0.5, 1)
  float a = m, b = m + 1.0f, c = m + 2.0f, d = m + 3.0f;
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const float k = static_cast<float>(i) * 1e-3f;
    asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(a) : "f"(m), "f"(k));
    asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(b) : "f"(m), "f"(k + 0.5f));
    asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(c) : "f"(m), "f"(k + 0.25f));
    asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(d) : "f"(m), "f"(k + 0.125f));
  }
  return __float_as_uint(a) ^ __float_as_uint(b) ^ __float_as_uint(c) ^ __float_as_uint(d);
}

struct Params {
  int64_t* ns;          // [launch][cta] the timed part (thread 0)
  int launch;           // which row of ns
  const uint4* stream;  // 1 GB for the streaming warps
  int64_t stream_vecs;
  int stream_on;
  unsigned* done;  // [launch]: set by thread 0 of each CTA when its timed part ends (counter)
  uint32_t* sink;
};

// Warps 1..7 stream until every CTA's timed part is over.
__device__ void stream_until_done(const Params& p) {
  const int64_t per_cta = p.stream_vecs / gridDim.x;
  uint32_t acc = 0;
  di::bench::stream_until<8>(p.stream + blockIdx.x * per_cta, per_cta, threadIdx.x - 32,
                             kThreads - 32, p.done + p.launch, gridDim.x, acc);
  if (acc == 0x9e3779b9u) p.sink[0] = acc;
}

template <int N>
__global__ void __launch_bounds__(kThreads) measured_kernel(Params p) {
  di::cuda::pdl_trigger();
  di::cuda::pdl_wait();
  if (threadIdx.x == 0) {
    const uint64_t t0 = globaltimer_ns();
    const uint32_t r = straight_line<N>(static_cast<uint32_t>(t0));
    const uint64_t t1 = globaltimer_ns();
    if (r == 0x12345u) p.sink[1] = r;
    p.ns[int64_t{p.launch} * gridDim.x + blockIdx.x] = static_cast<int64_t>(t1 - t0);
    atomicAdd(p.done + p.launch, 1u);
  } else if (threadIdx.x >= 32 && p.stream_on) {
    stream_until_done(p);
  }
}

__global__ void __launch_bounds__(kThreads) evict_kernel(uint32_t* sink) {
  di::cuda::pdl_trigger();
  const uint32_t r = straight_line<kEvictInstr>(threadIdx.x);
  if (r == 0x12345u) sink[2] = r;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t stream_bytes = int64_t{1} << 30;
  uint4* d_stream = nullptr;
  CK(cudaMalloc(&d_stream, stream_bytes));
  CK(cudaMemset(d_stream, 0x5a, stream_bytes));
  int64_t* d_ns = nullptr;
  unsigned* d_done = nullptr;
  uint32_t* d_sink = nullptr;
  CK(cudaMalloc(&d_ns, sizeof(int64_t) * reps * sms));
  CK(cudaMalloc(&d_done, sizeof(unsigned) * reps));
  CK(cudaMalloc(&d_sink, 16));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto launch_measured = [&](void (*k)(Params), const Params& p) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(sms));
    cfg.blockDim = dim3(kThreads);
    cfg.stream = s;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, k, p));
  };
  struct Size {
    int instr;
    void (*kernel)(Params);
  };
  const Size sizes[] = {
      {512, measured_kernel<512>}, {2048, measured_kernel<2048>}, {8192, measured_kernel<8192>}};
  for (const Size& z : sizes) {
    for (int evict = 0; evict < 2; ++evict) {
      for (int stream_on = 0; stream_on < 2; ++stream_on) {
        CK(cudaMemset(d_done, 0, sizeof(unsigned) * reps));
        for (int r = 0; r < reps; ++r) {
          Params p{d_ns, r, d_stream, stream_bytes / 16, stream_on, d_done, d_sink};
          if (evict) {
            evict_kernel<<<sms, kThreads, 0, s>>>(d_sink);
            CK(cudaGetLastError());
          } else {  // the measured kernel once before, untimed row r (overwritten below)
            Params warm = p;
            warm.stream_on = 0;
            launch_measured(z.kernel, warm);
            CK(cudaStreamSynchronize(s));
            CK(cudaMemset(d_done + r, 0, sizeof(unsigned)));
          }
          launch_measured(z.kernel, p);
        }
        CK(cudaStreamSynchronize(s));
        std::vector<int64_t> ns(static_cast<size_t>(reps) * sms);
        CK(cudaMemcpy(ns.data(), d_ns, ns.size() * sizeof(int64_t), cudaMemcpyDeviceToHost));
        std::sort(ns.begin(), ns.end());
        const double med = static_cast<double>(ns[ns.size() / 2]);
        const double kb = z.instr * 16.0 / 1024.0;
        std::printf(
            "[icache] code_kb=%.0f before=%s stream=%d median_ns=%.0f p90_ns=%lld ns_per_kb=%.1f\n",
            kb, evict ? "evict" : "warm", stream_on, med,
            static_cast<long long>(ns[ns.size() * 9 / 10]), med / kb);
      }
    }
  }
  return 0;
}
