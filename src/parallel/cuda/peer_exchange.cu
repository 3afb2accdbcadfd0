#include "parallel/cuda/peer_exchange.h"

#include <cuda_bf16.h>

#include <algorithm>

namespace di::parallel::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void add_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// After every thread of the block has stored its rows: one signal per destination rank, on that
// rank's counter [phase][this rank]. The fence makes the block's stores (ordered before it by
// the barrier) visible system-wide before the counter moves.
__device__ __forceinline__ void signal_all(const PeerRank& p, int phase) {
  __syncthreads();
  if (threadIdx.x < p.num_ranks) {
    __threadfence_system();
    add_release_sys(p.arrive[threadIdx.x] + phase * p.num_ranks + p.rank, 1u);
  }
}

// Until every rank's blocks of this call have signalled this rank (or the group aborted): the
// counters then hold the blocks of every call so far, `base` (before this call) + gridDim.x.
// Every rank launches the same grid for the same call (the grid depends only on B and N).
__device__ __forceinline__ void wait_all(const PeerRank& p, int phase, uint32_t base) {
  if (threadIdx.x < p.num_ranks) {
    const uint32_t target = base + static_cast<uint32_t>(gridDim.x);
    const uint32_t* counter = p.arrive[p.rank] + phase * p.num_ranks + threadIdx.x;
    for (uint32_t spins = 1;; ++spins) {
      if (static_cast<int32_t>(load_acquire_sys(counter) - target) >= 0) break;
      if ((spins & 1023u) == 0 && *p.abort_flag != 0) break;
    }
  }
  __syncthreads();
}

// The rank's state of a phase, read by every block at its start: calls[phase] = calls so far
// (the parity picks the buffers), calls[2 + phase] = blocks launched so far (the counters' base).
struct CallState {
  uint32_t call;
  uint32_t base;
};
__device__ __forceinline__ CallState read_call(const PeerRank& p, int phase) {
  const auto* c = reinterpret_cast<const volatile uint32_t*>(p.calls);
  return {c[phase], c[2 + phase]};
}

// The last block to finish advances the rank's state for the phase (every block read it at its
// start, before taking a ticket).
__device__ __forceinline__ void finish_call(const PeerRank& p, int phase, CallState st) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(p.tickets + phase, 1u) == gridDim.x - 1) {
      p.tickets[phase] = 0;
      auto* c = reinterpret_cast<volatile uint32_t*>(p.calls);
      c[phase] = st.call + 1u;
      c[2 + phase] = st.base + gridDim.x;
      __threadfence();
    }
  }
}

template <typename Unit>
__device__ __forceinline__ void copy_units(Unit* dst, const Unit* src, int64_t n) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

__device__ __forceinline__ float to_float(float v) {
  return v;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ void from_float(float* p, float v) {
  *p = v;
}
__device__ __forceinline__ void from_float(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

// Unit: uint4 when the x part and every row start are 16-byte aligned, else uint16_t.
template <typename Unit>
__global__ void __launch_bounds__(kThreads) peer_dispatch_kernel(PeerDispatchParams p) {
  const PeerRank& peer = p.peer;
  const int n = peer.num_ranks;
  const CallState st = read_call(peer, 0);
  const int64_t par = st.call & 1u;
  const int64_t x_bytes = int64_t{p.hidden} * (p.dtype == RowDtype::kFloat32 ? 4 : 2);
  const int64_t x_units = x_bytes / static_cast<int64_t>(sizeof(Unit));

  // Push: this rank's row r into slot (par, rank, r) of every rank's gather buffer.
  for (int64_t r = blockIdx.x; r < p.rows_per_rank; r += gridDim.x) {
    const bool real = r < p.num_tokens;
    const auto* src = reinterpret_cast<const Unit*>(static_cast<const char*>(p.x) + r * x_bytes);
    const int64_t offset = ((par * n + peer.rank) * peer.max_rows + r) * peer.row_bytes;
    for (int64_t i = threadIdx.x; i < x_units; i += blockDim.x) {
      Unit v{};
      if (real) v = src[i];
      for (int q = 0; q < n; ++q) {
        reinterpret_cast<Unit*>(static_cast<char*>(peer.gather[q]) + offset)[i] = v;
      }
    }
    for (int j = threadIdx.x; j < p.top_k; j += blockDim.x) {
      const int32_t id = real ? p.topk_ids[r * p.top_k + j] : -1;
      const float w = real ? p.topk_weights[r * p.top_k + j] : 0.0f;
      for (int q = 0; q < n; ++q) {
        char* row = static_cast<char*>(peer.gather[q]) + offset;
        reinterpret_cast<int32_t*>(row + x_bytes)[j] = id;
        reinterpret_cast<float*>(row + x_bytes + int64_t{p.top_k} * 4)[j] = w;
      }
    }
  }
  signal_all(peer, 0);
  wait_all(peer, 0, st.base);

  // Unpack every rank's rows from this rank's buffer.
  const int64_t rows = int64_t{n} * p.rows_per_rank;
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const int64_t src_rank = i / p.rows_per_rank, r = i % p.rows_per_rank;
    const char* row = static_cast<const char*>(peer.gather[peer.rank]) +
                      ((par * n + src_rank) * peer.max_rows + r) * peer.row_bytes;
    copy_units(reinterpret_cast<Unit*>(static_cast<char*>(p.x_all) + i * x_bytes),
               reinterpret_cast<const Unit*>(row), x_units);
    const auto* ids = reinterpret_cast<const int32_t*>(row + x_bytes);
    const auto* wts = reinterpret_cast<const float*>(row + x_bytes + int64_t{p.top_k} * 4);
    for (int j = threadIdx.x; j < p.top_k; j += blockDim.x) {
      const int32_t e = ids[j];
      p.owned_ids[i * p.top_k + j] = e >= p.expert_begin && e < p.expert_end ? e : -1;
      p.weights_all[i * p.top_k + j] = wts[j];
    }
  }
  finish_call(peer, 0, st);
}

template <typename T, typename Unit>
__global__ void __launch_bounds__(kThreads) peer_combine_kernel(PeerCombineParams p) {
  const PeerRank& peer = p.peer;
  const int n = peer.num_ranks;
  const CallState st = read_call(peer, 1);
  const int64_t par = st.call & 1u;
  const int64_t units = peer.ret_row_bytes / static_cast<int64_t>(sizeof(Unit));

  // Push: partial row (q, t) into slot (par, rank, t) of rank q's return buffer.
  const int64_t items = int64_t{n} * p.rows_per_rank;
  for (int64_t i = blockIdx.x; i < items; i += gridDim.x) {
    const int64_t q = i / p.rows_per_rank, t = i % p.rows_per_rank;
    const auto* src =
        reinterpret_cast<const Unit*>(static_cast<const char*>(p.partial) + i * peer.ret_row_bytes);
    auto* dst =
        reinterpret_cast<Unit*>(static_cast<char*>(peer.ret[q]) +
                                ((par * n + peer.rank) * peer.max_rows + t) * peer.ret_row_bytes);
    copy_units(dst, src, units);
  }
  signal_all(peer, 1);
  wait_all(peer, 1, st.base);

  // out[t] = sum over ranks in rank order (rank 0's value first: one rank is an exact copy).
  const T* in = static_cast<const T*>(peer.ret[peer.rank]);
  T* out = static_cast<T*>(p.out);
  const int64_t slot_stride = int64_t{peer.max_rows} * p.hidden;
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    for (int64_t h = threadIdx.x; h < p.hidden; h += blockDim.x) {
      const int64_t base = par * n * slot_stride + t * p.hidden + h;
      float acc = to_float(in[base]);
      for (int r = 1; r < n; ++r) acc = __fadd_rn(acc, to_float(in[base + r * slot_stride]));
      from_float(out + t * p.hidden + h, acc);
    }
  }
  finish_call(peer, 1, st);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

unsigned peer_blocks(int32_t rows_per_rank, int32_t num_ranks) {
  return static_cast<unsigned>(peer_exchange_blocks(rows_per_rank, num_ranks));
}

}  // namespace

int peer_exchange_blocks(int32_t rows_per_rank, int32_t num_ranks) {
  const int64_t rows = int64_t{rows_per_rank} * num_ranks;  // rows each rank unpacks / pushes
  return static_cast<int>(std::clamp<int64_t>((rows + 3) / 4, kPeerMinBlocks, kPeerMaxBlocks));
}

cudaError_t launch_peer_dispatch(const PeerDispatchParams& params, cudaStream_t stream) {
  const int64_t x_bytes = int64_t{params.hidden} * (params.dtype == RowDtype::kFloat32 ? 4 : 2);
  // Every rank launches the same grid (the counters count blocks), whatever its token count.
  const unsigned grid = peer_blocks(params.rows_per_rank, params.peer.num_ranks);
  if (x_bytes % 16 == 0 && params.peer.row_bytes % 16 == 0 && aligned16(params.x) &&
      aligned16(params.x_all)) {
    peer_dispatch_kernel<uint4><<<grid, kThreads, 0, stream>>>(params);
  } else {
    peer_dispatch_kernel<uint16_t><<<grid, kThreads, 0, stream>>>(params);
  }
  return cudaGetLastError();
}

cudaError_t launch_peer_combine(const PeerCombineParams& params, cudaStream_t stream) {
  const bool vec = params.peer.ret_row_bytes % 16 == 0 && aligned16(params.partial);
  const unsigned grid = peer_blocks(params.rows_per_rank, params.peer.num_ranks);
  if (params.dtype == RowDtype::kFloat32) {
    if (vec) {
      peer_combine_kernel<float, uint4><<<grid, kThreads, 0, stream>>>(params);
    } else {
      peer_combine_kernel<float, uint32_t><<<grid, kThreads, 0, stream>>>(params);
    }
  } else {
    if (vec) {
      peer_combine_kernel<__nv_bfloat16, uint4><<<grid, kThreads, 0, stream>>>(params);
    } else {
      peer_combine_kernel<__nv_bfloat16, uint16_t><<<grid, kThreads, 0, stream>>>(params);
    }
  }
  return cudaGetLastError();
}

}  // namespace di::parallel::cuda
