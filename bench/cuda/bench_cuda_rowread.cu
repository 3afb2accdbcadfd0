// How fast the one-token MoE kernels' row patterns can be read at all (issue #6, run 41): no
// math, only 16-byte streaming loads (ld_stream, as the kernels load weights) folded by xor.
// Run 40 found the one-token down kernels streaming at 2.6-2.7 TB/s alone, gate_up at 3.9-4.1;
// this separates the access pattern from the kernels' arithmetic and hand-offs.
//
// k experts of E, each a [rows][len] bf16 matrix (down: rows = hidden, len = inter; gate_up:
// rows = 2 inter, len = hidden), read in
// one of three patterns, kChain launches on distinct expert sets captured in one graph (the sets
// rotate through all E experts, so that no launch finds its rows in L2):
//   col   warp = output column n: its k rows (slot s, row n) in slot order, G rows in flight
//         then folded, then the next G (the down kernels' shape: one column, every slot)
//   slot  warp = (slot s, C consecutive rows n0 .. n0 + C - 1), G rows in flight (gate_up's
//         shape and run 40's split-by-slot down; C x len x 2 bytes contiguous per warp)
//   flat  the k matrices as one range, every thread 8 loads in flight (the floor)
// CTAs of 4 warps (128 threads), as the pipelined down kernel, or 8 (256) with --cta8.
//
//   bench_cuda_rowread [--reps 20]
// Prints "[rowread] shape=... mode=... G=... C=... us=... TBps=... pct_bw=..." lines.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/kernels/common.cuh"

#include "graph_timing.h"
#include "h200_ceilings.h"

namespace {

using di::bench::kCopyBw;
constexpr int kChain = 16;           // launches per graph, each on its own expert set

#define CK(x) DI_BENCH_CK(x)

enum Mode : int { kCol = 0, kSlot = 1, kFlat = 2 };

struct RowReadParams {
  const uint4* base;  // [E][rows][len16] 16-byte chunks
  const int* ids;     // [k] expert of each slot
  int k, rows, len16, C;
  uint32_t* sink;
};

__device__ __forceinline__ const uint4* row_ptr(const RowReadParams& p, int s, int n) {
  return p.base + (int64_t{p.ids[s]} * p.rows + n) * p.len16;
}

// U: 16-byte chunks per lane per row (>= len16 / 32); G: rows whose loads are in flight at once.
template <int U, int G, int Mode>
__global__ void __launch_bounds__(256) rowread_kernel(RowReadParams p) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int gw = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  int nrows, s0 = 0, n0 = 0;
  if (Mode == kCol) {
    if (gw >= p.rows) return;
    nrows = p.k;
    n0 = gw;
  } else {
    const int per_slot = p.rows / p.C;
    if (gw >= p.k * per_slot) return;
    s0 = gw / per_slot;
    n0 = (gw - s0 * per_slot) * p.C;
    nrows = p.C;
  }
  uint32_t acc = 0;
  for (int i0 = 0; i0 < nrows; i0 += G) {
    uint4 v[G][U];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int i = i0 + g;
      const uint4* r = nullptr;
      if (i < nrows) r = Mode == kCol ? row_ptr(p, i, n0) : row_ptr(p, s0, n0 + i);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = lane + 32 * u;
        v[g][u] = r != nullptr && c < p.len16 ? di::cuda::ld_stream(r + c) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int u = 0; u < U; ++u) acc ^= v[g][u].x ^ v[g][u].y ^ v[g][u].z ^ v[g][u].w;
  }
  if (acc == 0x12345678u) p.sink[threadIdx.x] = acc;
}

// The k matrices as one range of k x rows x len16 chunks, 8 loads in flight per thread.
__global__ void __launch_bounds__(256) rowread_flat_kernel(RowReadParams p) {
  constexpr int U = 8;
  const int64_t per = int64_t{p.rows} * p.len16, total = per * p.k;
  const int64_t nthreads = int64_t{gridDim.x} * blockDim.x;
  uint32_t acc = 0;
  for (int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; b < total; b += nthreads * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = b + u * nthreads;
      if (i < total) {
        const int64_t s = i / per;
        v[u] = di::cuda::ld_stream(p.base + int64_t{p.ids[s]} * per + (i - s * per));
      } else {
        v[u] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678u) p.sink[threadIdx.x] = acc;
}

__global__ void fill_kernel(uint32_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t h = (static_cast<uint64_t>(i) + seed) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    p[i] = static_cast<uint32_t>(h >> 32) & 0x3DFF3DFFu;  // finite bf16 pairs, never all zero
  }
}

struct Shape {
  const char* name;
  int rows, len, experts, k;
};

struct Config {
  Mode mode;
  int G, C;
  void (*kernel)(RowReadParams);
};

template <int U>
std::vector<Config> configs(int k) {
  std::vector<Config> v{
      {kCol, 1, 1, rowread_kernel<U, 1, kCol>},   {kCol, 2, 1, rowread_kernel<U, 2, kCol>},
      {kCol, 4, 1, rowread_kernel<U, 4, kCol>},   {kSlot, 1, 1, rowread_kernel<U, 1, kSlot>},
      {kSlot, 2, 2, rowread_kernel<U, 2, kSlot>}, {kSlot, 4, 4, rowread_kernel<U, 4, kSlot>},
      {kSlot, 2, 4, rowread_kernel<U, 2, kSlot>}, {kSlot, 2, 8, rowread_kernel<U, 2, kSlot>},
      {kFlat, 8, 0, rowread_flat_kernel}};
  if (U <= 3 && k == 8) {
    v.push_back({kCol, 8, 1, rowread_kernel<U, 8, kCol>});
    v.push_back({kSlot, 8, 8, rowread_kernel<U, 8, kSlot>});
  }
  return v;
}

const char* mode_name(Mode m) {
  return m == kCol ? "col" : m == kSlot ? "slot" : "flat";
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20, cta = 128;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--cta8")) cta = 256;
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("[rowread] skipped: no CUDA device\n");
    return 0;
  }
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  uint32_t* sink = nullptr;
  CK(cudaMalloc(&sink, 1024 * sizeof(uint32_t)));
  // The down matrices of the two MoE models, [E][hidden][inter], then their gate_up matrices,
  // [E][2 inter][hidden] (gate_up's warps read 2 rows of one slot: the slot pattern, C = 1-2).
  const Shape shapes[] = {{"qwen3_30b_a3b", 2048, 768, 128, 8},
                          {"v2lite", 2048, 1408, 64, 8},
                          {"qwen3_30b_a3b_gate_up", 1536, 2048, 128, 8},
                          {"v2lite_gate_up", 2816, 2048, 64, 8}};
  for (const Shape& sh : shapes) {
    const int64_t words = int64_t{sh.experts} * sh.rows * sh.len / 2;
    uint32_t* w = nullptr;
    CK(cudaMalloc(&w, static_cast<size_t>(words) * 4));
    fill_kernel<<<1024, 256, 0, st>>>(w, words, 17);
    CK(cudaGetLastError());
    std::vector<int> ids(static_cast<size_t>(kChain) * sh.k);
    for (int c = 0; c < kChain; ++c)
      for (int s = 0; s < sh.k; ++s)
        ids[static_cast<size_t>(c) * sh.k + s] = (c * sh.k + s) % sh.experts;
    int* dids = nullptr;
    CK(cudaMalloc(&dids, ids.size() * sizeof(int)));
    CK(cudaMemcpy(dids, ids.data(), ids.size() * sizeof(int), cudaMemcpyHostToDevice));
    const int len16 = sh.len / 8;
    const int U = (len16 + 31) / 32;
    const std::vector<Config> cs = U <= 3   ? configs<3>(sh.k)
                                   : U <= 6 ? configs<6>(sh.k)
                                            : configs<8>(sh.k);
    const double bytes = static_cast<double>(sh.k) * sh.rows * sh.len * 2;
    for (const Config& c : cs) {
      unsigned grid = static_cast<unsigned>(sms * (2048 / cta));  // kFlat: full occupancy
      if (c.mode != kFlat) {
        const int64_t warps = c.mode == kCol ? sh.rows : int64_t{sh.k} * (sh.rows / c.C);
        grid = static_cast<unsigned>((warps * 32 + cta - 1) / cta);
      }
      auto enqueue = [&] {
        for (int i = 0; i < kChain; ++i) {
          RowReadParams p{
              reinterpret_cast<const uint4*>(w), dids + i * sh.k, sh.k, sh.rows, len16, c.C, sink};
          c.kernel<<<grid, cta, 0, st>>>(p);
        }
      };
      const double us = di::bench::graph_replay_ms(st, reps, enqueue) * 1e3 / kChain;
      const double tbps = bytes / (us * 1e-6) / 1e12;
      std::printf(
          "[rowread] shape=%s mode=%s G=%d C=%d cta=%d grid=%u row_bytes=%d us=%.2f "
          "TBps=%.2f pct_bw=%.1f\n",
          sh.name, mode_name(c.mode), c.G, c.C, cta, grid, sh.len * 2, us, tbps,
          100.0 * tbps * 1e12 / kCopyBw);
      std::fflush(stdout);
    }
    CK(cudaFree(dids));
    CK(cudaFree(w));
  }
  CK(cudaFree(sink));
  return 0;
}
