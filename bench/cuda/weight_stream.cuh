#pragma once
// A weight stream for the latency benchmarks (bench_cuda_l2lat, bench_cuda_icache): threads
// read a CTA's slice of a buffer with ld_stream (16-byte loads into registers, U in flight per
// thread, as the decode GEMVs and MoE kernels read weights), round and round, until *flag reaches
// target (polled every 8 rounds, relaxed at GPU scope).
#include <cstdint>

#include "backend/cuda/kernels/common.cuh"

namespace di::bench {

// A flag another CTA sets (relaxed at GPU scope: polled, ordering nothing).
__device__ __forceinline__ unsigned load_flag_relaxed(const unsigned* flag) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
  return v;
}

// Thread `tid` of `nthreads` streaming threads over base[0, vecs). Returns the bytes it read;
// xor of the loaded words lands in `acc` (the caller keeps it, so the loads are not dropped).
template <int U>
__device__ uint64_t stream_until(const uint4* base, int64_t vecs, int tid, int nthreads,
                                 const unsigned* flag, unsigned target, uint32_t& acc) {
  uint64_t bytes = 0;
  int64_t off = tid;
  for (int it = 0;; ++it) {
    if ((it & 7) == 0 && load_flag_relaxed(flag) >= target) break;
    uint4 w[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int64_t i = off + int64_t{u} * nthreads;
      if (i >= vecs) i -= vecs;
      w[u] = di::cuda::ld_stream(base + i);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= w[u].x ^ w[u].w;
    off += int64_t{U} * nthreads;
    if (off >= vecs) off -= vecs;
    bytes += uint64_t{U} * 16;
  }
  return bytes;
}

}  // namespace di::bench
