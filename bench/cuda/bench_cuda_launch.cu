// What a dependency between two steps of the decode path costs on this GPU, apart from any work
// (issue #6: at batch 1 a Qwen3-30B-A3B layer is ~8 dependent kernels, and the step sits ~25 us
// per layer above its bytes). Every measurement is a CUDA graph of many launches, replayed and
// timed with events; the number printed is the median replay divided by the launches (or phases).
//
//   [launch] chain   a chain of kernels of `ctas` CTAs where each CTA reads what another CTA of
//                    the previous kernel wrote: plain launches vs PDL dependents (trigger at the
//                    start, griddepcontrol.wait before the read), as the decode kernels launch;
//   [launch] barrier one resident kernel of `ctas` CTAs (at most one wave) with the same
//                    dependency between phases, met at a grid barrier (release/acquire arrival
//                    counter, spinning): what a persistent kernel would pay instead of a launch;
//   [launch] flags   the same, each CTA waiting only for the CTA it reads (a flag per CTA);
//   [launch] cluster kernels of `ctas` CTAs in thread-block clusters of `size` (0: no cluster
//                    attribute), each CTA with `smem` bytes of dynamic shared memory and a cluster
//                    barrier: how the cost of a launch grows with the number of clusters.
//
//   bench_cuda_launch [--reps 20]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "graph_timing.h"

namespace {

#define CK(x) DI_BENCH_CK(x)

// Each CTA's thread 0 reads the word another CTA of the previous step wrote and writes its own:
// a dependency that spans the whole grid, so no step can start its read early.
__device__ __forceinline__ void hop(const unsigned* in, unsigned* out, int step) {
  if (threadIdx.x == 0) {
    const unsigned src = (blockIdx.x * 7u + 3u + static_cast<unsigned>(step)) % gridDim.x;
    out[blockIdx.x] = __ldcg(in + src) + 1u;
  }
}

__global__ void chain_kernel(const unsigned* in, unsigned* out, int step) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");  // a no-op for a plain launch
  hop(in, out, step);
}

// Phases separated by a grid barrier; the grid must be resident at once (ctas <= SMs here).
__global__ void barrier_kernel(unsigned* a, unsigned* b, unsigned* counter, int phases) {
  for (int p = 0; p < phases; ++p) {
    hop(p % 2 == 0 ? a : b, p % 2 == 0 ? b : a, p);
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned target = static_cast<unsigned>(p + 1) * gridDim.x;
      unsigned seen;
      asm volatile("atom.add.release.gpu.global.u32 %0, [%1], 1;"
                   : "=r"(seen)
                   : "l"(counter)
                   : "memory");
      ++seen;  // the count with this CTA's arrival
      while (seen < target)
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    }
    __syncthreads();
  }
}

// Phases where each CTA waits only for the CTA whose word it reads (one flag per CTA, the phase
// it has finished, stored with release and polled with acquire): the finest dependency a
// persistent kernel could use. data holds one word per (phase, CTA), so nothing is overwritten.
__global__ void flag_kernel(unsigned* data, unsigned* flags, int phases) {
  for (int p = 0; p < phases; ++p) {
    if (threadIdx.x == 0) {
      const unsigned src = (blockIdx.x * 7u + 3u + static_cast<unsigned>(p)) % gridDim.x;
      unsigned v = 0;
      if (p > 0) {
        unsigned done = 0;
        while (done < static_cast<unsigned>(p))
          asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                       : "=r"(done)
                       : "l"(flags + src)
                       : "memory");
        v = __ldcg(data + static_cast<int64_t>(p - 1) * gridDim.x + src);
      }
      data[static_cast<int64_t>(p) * gridDim.x + blockIdx.x] = v + 1u;
      asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flags + blockIdx.x),
                   "r"(static_cast<unsigned>(p + 1))
                   : "memory");
    }
    __syncthreads();
  }
}

__global__ void reset_kernel(unsigned* counter, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) counter[i] = 0;
}

// The dynamic shared memory (maybe none) only sets how many CTAs fit on an SM.
__global__ void cluster_kernel(unsigned* out) {
  __shared__ unsigned word;
  if (threadIdx.x == 0) word = blockIdx.x;
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
  if (threadIdx.x == 0) out[blockIdx.x] += word & 1u;
}

cudaError_t launch(void (*kernel)(const unsigned*, unsigned*, int), int ctas, bool pdl,
                   cudaStream_t stream, const unsigned* in, unsigned* out, int step) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(ctas));
  cfg.blockDim = dim3(128);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, in, out, step);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(3, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf(
          "bench_cuda_launch [--reps N]: the cost of a dependency between decode steps\n"
          "(kernel chains plain / PDL, a grid barrier, cluster launches); [launch] "
          "lines.\n");
      return 0;
    } else {
      std::fprintf(stderr, "unknown argument %s (see --help)\n", argv[i]);
      return 2;
    }
  }
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr int kMaxCtas = 16384;
  constexpr int kChainMax = 384, kMaxResident = 1024;  // flag_kernel's phases and CTAs
  unsigned *a, *b, *counter;
  CK(cudaMalloc(&a, kMaxCtas * sizeof(unsigned)));
  CK(cudaMalloc(&b, kMaxCtas * sizeof(unsigned)));
  CK(cudaMalloc(&counter, sizeof(unsigned)));
  unsigned *data, *flags;
  CK(cudaMalloc(&data, size_t{kChainMax} * kMaxResident * sizeof(unsigned)));
  CK(cudaMalloc(&flags, kMaxResident * sizeof(unsigned)));
  CK(cudaMemset(a, 0, kMaxCtas * sizeof(unsigned)));
  CK(cudaMemset(b, 0, kMaxCtas * sizeof(unsigned)));

  // Kernel chains: launches of an empty graph step cost nothing extra per launch here, so the
  // per-kernel time is the dependency's latency (launch, completion, the read).
  constexpr int kChain = kChainMax;  // a Qwen3-30B-A3B step at batch 1: 48 layers x 8 kernels
  for (const int ctas : {32, sms, 4 * sms}) {
    for (const bool pdl : {false, true}) {
      const double ms = di::bench::graph_replay_ms(stream, reps, [&] {
        for (int k = 0; k < kChain; ++k)
          CK(launch(chain_kernel, ctas, pdl, stream, k % 2 == 0 ? a : b, k % 2 == 0 ? b : a, k));
      });
      std::printf("[launch] chain ctas=%d pdl=%d kernels=%d us_per_kernel=%.3f\n", ctas,
                  pdl ? 1 : 0, kChain, ms * 1e3 / kChain);
    }
  }

  // The same dependency at a grid barrier inside one kernel.
  for (const int ctas : {32, sms}) {
    const double ms = di::bench::graph_replay_ms(stream, reps, [&] {
      reset_kernel<<<1, 32, 0, stream>>>(counter, 1);
      barrier_kernel<<<ctas, 128, 0, stream>>>(a, b, counter, kChain);
    });
    const double fms = di::bench::graph_replay_ms(stream, reps, [&] {
      reset_kernel<<<1, 256, 0, stream>>>(flags, ctas);
      flag_kernel<<<ctas, 128, 0, stream>>>(data, flags, kChain);
    });
    // The kernel's own launch and the reset are in both; over 384 phases they are ~1 %.
    std::printf("[launch] barrier ctas=%d phases=%d us_per_phase=%.3f\n", ctas, kChain,
                ms * 1e3 / kChain);
    std::printf("[launch] flags ctas=%d phases=%d us_per_phase=%.3f\n", ctas, kChain,
                fms * 1e3 / kChain);
  }

  // Cluster launches: kernels of `ctas` CTAs, plain launches in a graph.
  CK(cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024));
  CK(cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  constexpr int kClusterLaunches = 64;
  for (const int smem : {0, 100 * 1024}) {
    for (const int ctas : {8, 32, 128, 1024, 8192}) {
      for (const int size : {0, 1, 2, 4, 8, 16}) {
        if (size > ctas) continue;
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = dim3(static_cast<unsigned>(ctas));
        cfg.blockDim = dim3(128);
        cfg.dynamicSmemBytes = static_cast<size_t>(smem);
        cfg.stream = stream;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = static_cast<unsigned>(std::max(size, 1));
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = size > 0 ? 1 : 0;
        int active = -1;
        if (size > 0 &&
            cudaOccupancyMaxActiveClusters(&active, cluster_kernel, &cfg) != cudaSuccess) {
          (void)cudaGetLastError();
          std::printf("[launch] cluster size=%d ctas=%d smem=%d: not launchable\n", size, ctas,
                      smem);
          continue;
        }
        const double ms = di::bench::graph_replay_ms(stream, reps, [&] {
          for (int k = 0; k < kClusterLaunches; ++k)
            CK(cudaLaunchKernelEx(&cfg, cluster_kernel, k % 2 == 0 ? a : b));
        });
        std::printf(
            "[launch] cluster size=%d ctas=%d smem=%d max_active_clusters=%d "
            "us_per_kernel=%.3f\n",
            size, ctas, smem, active, ms * 1e3 / kClusterLaunches);
      }
    }
  }
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaFree(counter));
  CK(cudaFree(data));
  CK(cudaFree(flags));
  CK(cudaStreamDestroy(stream));
  return 0;
}
