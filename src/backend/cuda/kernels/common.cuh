#pragma once
// Device helpers shared by the kernels: bf16 conversion, warp and block reductions, launch checks.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "backend/cuda/kernels/trace.h"
#include "core/env.h"

namespace di::cuda {

using bf16 = __nv_bfloat16;

constexpr float kLog2e = 1.4426950408889634f;  // softmax in base 2: e^x = 2^(x · log2 e)

// An integer switch that tests and benchmarks can also set: di::env::get_int(name, unset)
// (core/env.h: declared there, its value checked) at its first use (not at load time, so that the
// CLI's environment check reports an invalid value before a kernel reads it), then whatever
// store() puts there. Constant-initialized at namespace scope.
class EnvSetting {
 public:
  constexpr EnvSetting(const char* name, int unset) : name_(name), unset_(unset) {}
  int load() const {
    read_once();
    return value_.load(std::memory_order_relaxed);
  }
  void store(int v) {
    read_once();
    value_.store(v, std::memory_order_relaxed);
  }

 private:
  void read_once() const {
    std::call_once(once_, [this] {
      value_.store(di::env::get_int(name_, unset_), std::memory_order_relaxed);
    });
  }
  const char* name_;
  int unset_;
  mutable std::once_flag once_;
  mutable std::atomic<int> value_{0};
};

// DEEPINFER_BATCH_INVARIANT=1 (design.md "Determinism"): kernels whose layout would otherwise
// follow the batch (MLA head split, MLA split size) pin one layout; read once.
inline bool batch_invariant_env() {
  static const bool on = di::env::is("DEEPINFER_BATCH_INVARIANT", "1");
  return on;
}

// Whether the decode attention kernels (tensor-core GQA, MLA cluster) trigger their PDL
// dependents after their wait rather than at their start (run 42; the default):
// DEEPINFER_ATTN_LATE_TRIGGER=0 restores the start. Read once, for both launchers.
inline bool attn_late_trigger_env() {
  static const bool on = di::env::get_int("DEEPINFER_ATTN_LATE_TRIGGER", 1) != 0;
  return on;
}

// DEEPINFER_PDL=0 turns programmatic dependent launches off (the A/B switch); read once.
inline bool pdl_enabled() {
  static const bool on = di::env::get_int("DEEPINFER_PDL", 1) != 0;
  return on;
}

// kernel<<<grid, block, smem, stream>>>(args...) in thread-block clusters of `cluster` CTAs along
// x (grid.x a multiple of it; 0: no clusters) and, when `dependent` (and PDL is on), as a
// programmatic dependent launch: it may then start while the stream's previous kernel still
// runs, so it must pdl_wait() before reading that kernel's outputs (and may load its own weights
// before). The one place the decode path's launch attributes are built.
template <typename... KernelArgs, typename... Args>
inline cudaError_t launch_attrs(bool dependent, int cluster, void (*kernel)(KernelArgs...),
                                dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                Args... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = static_cast<unsigned>(cluster);
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (dependent && pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

// A launch without clusters; a PDL dependent when `dependent` (and PDL is on), else plain.
template <typename... KernelArgs, typename... Args>
inline cudaError_t launch_dependent_if(bool dependent, void (*kernel)(KernelArgs...), dim3 grid,
                                       dim3 block, size_t smem, cudaStream_t stream,
                                       Args... args) {
  return launch_attrs(dependent, 0, kernel, grid, block, smem, stream, args...);
}

// A launch in clusters of `cluster` CTAs along x (0: none), a PDL dependent whenever PDL is on.
template <typename... KernelArgs, typename... Args>
inline cudaError_t launch_cluster_pdl(int cluster, void (*kernel)(KernelArgs...), dim3 grid,
                                      dim3 block, size_t smem, cudaStream_t stream,
                                      Args... args) {
  return launch_attrs(true, cluster, kernel, grid, block, smem, stream, args...);
}

// launch_dependent_if(true, ...): a PDL dependent whenever PDL is on.
template <typename... KernelArgs, typename... Args>
inline cudaError_t launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                              cudaStream_t stream, Args... args) {
  return launch_dependent_if(true, kernel, grid, block, smem, stream, args...);
}

// Raises function attribute `attr` of `kernel` to `value` on the CURRENT device, once per
// (device, kernel, attribute, larger value). Function attributes are per device: a DP group
// drives several devices from one process (one thread each), so a process-wide "done" flag would
// leave every device but the first at the default (seen on 2 H200s: mla_decode failed to launch
// with cudaErrorInvalidValue on the rank that came second, at the 48 KB shared-memory default).
inline cudaError_t raise_func_attribute(const void* kernel, cudaFuncAttribute attr, int value) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int>, int> raised;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(mu);
  int& done = raised[{dev, kernel, static_cast<int>(attr)}];
  if (value <= done) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, attr, value);
  if (err == cudaSuccess) done = value;
  return err;
}
// Opens `kernel` to `smem` bytes of dynamic shared memory (raise_func_attribute).
inline cudaError_t open_dynamic_smem(const void* kernel, int smem) {
  return raise_func_attribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(bf16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float v) { return __float2bfloat16_rn(v); }
// v rounded to bf16 (nearest even), as a float: what a bf16 output holds.
__device__ __forceinline__ float round_bf16(float v) {
  return to_f32(from_f32<bf16>(v));
}

// Thread i of a group (the CTA: i = threadIdx.x; or a warp: i = its lane) prefetches the 128-byte
// line i of [base, base + bytes) into L1 (threads past the range do nothing): a group of at least
// bytes / 128 threads covers it. For what a kernel reads after its griddepcontrol.wait that no
// kernel writes (weights, tables), issued before the wait.
__device__ __forceinline__ void prefetch_l1_lines(const void* base, int64_t bytes, unsigned i) {
  const int64_t line = int64_t{i} * 128;
  if (line < bytes)
    asm volatile("prefetch.global.L1 [%0];" ::"l"(static_cast<const char*>(base) + line));
}
__device__ __forceinline__ void prefetch_l1_lines(const void* base, int64_t bytes) {
  prefetch_l1_lines(base, bytes, threadIdx.x);
}

// Frequency j of a rope table row: table is [max_pos, dim] (f32, or bf16 when !f32), the cos of
// the dim / 2 frequencies, then their sin; (c, s) of position pos (the caller checks its range).
__device__ __forceinline__ void rope_cos_sin(const void* table, bool f32, int32_t pos, int dim,
                                             int j, float& c, float& s) {
  const int half = dim / 2;
  if (f32) {
    const float* t = static_cast<const float*>(table) + int64_t{pos} * dim;
    c = t[j];
    s = t[half + j];
  } else {
    const bf16* t = static_cast<const bf16*>(table) + int64_t{pos} * dim;
    c = to_f32(t[j]);
    s = to_f32(t[half + j]);
  }
}
// prefetch_l1_lines of the rope table row of position pos (nothing outside [0, max_pos)), by
// thread i of the group (default: the CTA's threadIdx.x).
__device__ __forceinline__ void prefetch_rope_row_l1(const void* table, bool f32, int32_t pos,
                                                     int32_t max_pos, int dim, unsigned i) {
  const int elem = f32 ? 4 : 2;
  if (pos >= 0 && pos < max_pos)
    prefetch_l1_lines(static_cast<const char*>(table) + int64_t{pos} * dim * elem, dim * elem, i);
}
__device__ __forceinline__ void prefetch_rope_row_l1(const void* table, bool f32, int32_t pos,
                                                     int32_t max_pos, int dim) {
  prefetch_rope_row_l1(table, f32, pos, max_pos, dim, threadIdx.x);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds >= 32 floats. The fixed
// reduction tree makes the result independent of scheduling (batch-invariant per row).
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

// Max over the block, like block_sum; every thread gets the result.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

// Weights read once per step: DI_L2_EVICT_FIRST marks them evict-first in L2, so the step's
// weight streams (V2-Lite: 138 MB of experts per layer against a 50 MB L2) replace each other
// rather than the code, activations and partial results the next kernels need.
#ifndef DI_L2_EVICT_FIRST
#define DI_L2_EVICT_FIRST 1
#endif
__device__ __forceinline__ uint64_t l2_stream_policy() {
  uint64_t p;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

// 16-byte load of data read once (weights): streamed past L1, so reused rows stay cached.
__device__ __forceinline__ uint4 ld_stream(const uint4* ptr) {
  uint4 v;
#if DI_L2_EVICT_FIRST
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr), "l"(l2_stream_policy()));
#else
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
#endif
  return v;
}

// 8 bf16 packed in a uint4 -> 8 f32 (exact: bf16 is the top half of an f32); element 0 is the
// low half of .x.
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// acc + Σ a[i]·b[i], i ascending (fmaf).
__device__ __forceinline__ float dot8(const float (&a)[8], const float (&b)[8], float acc) {
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(a[i], b[i], acc);
  return acc;
}

// Threads per row of the rms_norm kernel (elementwise.cu); the fused MoE router (moe.cu)
// reproduces its reduction tree for this count.
__host__ __device__ inline int rms_norm_threads(int64_t d) {
  return d >= 2048 ? 512 : (d >= 512 ? 256 : 128);
}

// The GPU-wide nanosecond timer (comparable across SMs; phase timing in benchmarks).
__device__ __forceinline__ unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The kernel timeline (trace.h): off unless built with -DDI_TRACE=1. DI_TRACE_SCOPE(site, tag)
// at a kernel's top records its CTA's start and (thread 0's) end; DI_TRACE_WAITED() after its
// pdl_wait() when the wait returned, DI_TRACE_MARK() when thread 0 passes a phase the kernel
// names (only in kernels with a scope).
#ifndef DI_TRACE
#define DI_TRACE 0
#endif
#if DI_TRACE
namespace {
// This translation unit's copy, set by the host (constant memory; not recording, the trace build
// runs ~5.7 % slower than a normal one either way: run 29 measured no gain over a global).
__constant__ TraceTarget g_trace_target;
void set_trace_target(const TraceTarget& t) {
  cudaMemcpyToSymbol(g_trace_target, &t, sizeof t);
}
[[maybe_unused]] const bool g_trace_registered = (trace_register_setter(&set_trace_target), true);
}  // namespace
// The CTA's event slot (-1: not recording), in static shared memory of the kernel.
__device__ __forceinline__ int& trace_slot() {
  __shared__ int slot;
  return slot;
}
struct TraceScope {
  __device__ TraceScope(uint32_t site, uint32_t tag) {
    if (threadIdx.x + threadIdx.y + threadIdx.z != 0) return;
    int slot = -1;
    if (g_trace_target.events != nullptr) {
      const uint32_t i = atomicAdd(g_trace_target.count, 1u);
      if (i < g_trace_target.capacity) {
        slot = static_cast<int>(i);
        TraceEvent& e = g_trace_target.events[i];
        uint32_t sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        e.site = site;
        e.tag = tag;
        e.cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        e.smid = sm;
        e.t_wait = 0;
        e.t_mark = 0;
        e.t_start = globaltimer_ns();
      }
    }
    trace_slot() = slot;
  }
  __device__ ~TraceScope() {
    if (threadIdx.x + threadIdx.y + threadIdx.z != 0) return;
    const int slot = trace_slot();
    if (slot >= 0) g_trace_target.events[slot].t_end = globaltimer_ns();
  }
};
// Thread 0 writes the time into `field` of its CTA's event (only after a TraceScope; the last
// call counts).
__device__ __forceinline__ void trace_stamp(uint64_t TraceEvent::*field) {
  if (threadIdx.x + threadIdx.y + threadIdx.z != 0) return;
  const int slot = trace_slot();
  if (slot >= 0) g_trace_target.events[slot].*field = globaltimer_ns();
}
#define DI_TRACE_SCOPE(site, tag) const ::di::cuda::TraceScope di_trace_scope_((site), (tag))
#define DI_TRACE_WAITED() ::di::cuda::trace_stamp(&::di::cuda::TraceEvent::t_wait)
#define DI_TRACE_MARK() ::di::cuda::trace_stamp(&::di::cuda::TraceEvent::t_mark)
// The mark once v has been computed (an empty asm that takes v: the timer read cannot move above).
#define DI_TRACE_MARK_AFTER(v)                     \
  do {                                             \
    asm volatile("" ::"f"(static_cast<float>(v))); \
    DI_TRACE_MARK();                               \
  } while (0)
#else
#define DI_TRACE_SCOPE(site, tag) ((void)0)
#define DI_TRACE_WAITED() ((void)0)
#define DI_TRACE_MARK() ((void)0)
#define DI_TRACE_MARK_AFTER(v) ((void)0)
#endif

// Programmatic dependent launch (Hopper): a kernel that calls pdl_trigger() lets the next kernel
// of the stream, when that one is launched with the PDL attribute (the decode GEMV, gemv.cu),
// start before this one ends; that kernel calls pdl_wait() before it reads this one's writes.
// Both are no-ops when the next (resp. this) kernel is launched plainly.
__device__ __forceinline__ void pdl_trigger() {
  asm volatile("griddepcontrol.launch_dependents;" :::);
}
__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// DEEPINFER_PDL_DECODE (a bit mask, read once): which of the decode path's small kernels are
// launched as PDL dependents of their predecessor (launch_decode) instead of plainly: 1 the
// rope/store kernels (qkv_rope_store, mla_rope_store), 2 the CUDA-core GQA decode kernel, 4 the
// split combine, 8 the tensor-core GQA decode kernel. As dependents they start while the
// previous kernel runs (hiding their launch) and wait (griddepcontrol.wait) before reading what
// their predecessors write. Default 13 (all but the CUDA-core GQA kernel), from H200 A/Bs at
// batch 1 (docs/performance.md): the rope/store kernels V2-Lite 391 -> 400 tok/s and the combine
// Qwen3-30B-A3B 296 -> 304 (run 18); the GQA kernels lost (-2.4 %, waiting first) until the
// tensor-core one issued its first K/V copies of earlier steps' entries before its wait (run 26:
// Qwen3-30B-A3B 336.7 -> 343.6, Llama-3.1-8B 223.8 -> 227.1). The CUDA-core kernel still waits
// first, so it stays a plain launch.
enum PdlDecodeKernel : int {
  kPdlRopeStore = 1,
  kPdlGqaDecode = 2,
  kPdlSplitCombine = 4,
  kPdlGqaDecodeMma = 8,
};
inline bool pdl_decode_enabled(PdlDecodeKernel kernel) {
  static const int mask =
      di::env::get_int("DEEPINFER_PDL_DECODE", kPdlRopeStore | kPdlSplitCombine | kPdlGqaDecodeMma);
  return (mask & kernel) != 0 && pdl_enabled();
}

// A decode-path kernel launch: a PDL dependent when pdl_decode_enabled(which). The kernel must
// call pdl_wait() before it reads anything an earlier kernel writes.
template <typename... KernelArgs, typename... Args>
inline cudaError_t launch_decode(PdlDecodeKernel which, void (*kernel)(KernelArgs...), dim3 grid,
                                 dim3 block, size_t smem, cudaStream_t stream, Args... args) {
  return launch_dependent_if(pdl_decode_enabled(which), kernel, grid, block, smem, stream,
                             args...);
}

// Arrival at a grid-wide counter: atomicAdd with release and acquire semantics at GPU scope.
// After a __syncthreads() (the CTA's writes before it are then ordered before thread 0's release),
// the CTA that arrives last sees every arrived CTA's writes once its thread 0 has the old value
// and a __syncthreads() has passed it on. This replaces __threadfence() + atomicAdd +
// __threadfence(): __threadfence() is a sequentially consistent fence (MEMBAR.SC.GPU).
__device__ __forceinline__ unsigned atomic_add_acq_rel_gpu(unsigned* ptr, unsigned v) {
  unsigned old;
  asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], %2;"
               : "=r"(old)
               : "l"(ptr), "r"(v)
               : "memory");
  return old;
}

// A grid-scope flag read with acquire / written with release (the persistent MoE kernel's
// grid barrier, moe_gemm.cu).
__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* ptr) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ptr) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(unsigned* ptr, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(ptr), "r"(v) : "memory");
}

// cp.async groups: close the copies this thread issued so far into one group; wait until at most
// N of its groups are in flight (the copies of the others are then visible to this thread).
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// The shared-memory address of a generic pointer into shared memory (for PTX operands).
__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// Thread-block cluster barrier and distributed shared memory (sm_90).
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
// Arrival that orders nothing (the loads before it have been consumed: nothing to release).
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// Shared-memory address `p` of this CTA -> the same address in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t cluster_addr(const void* p, int rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(smem_u32(p)), "r"(rank));
  return out;
}
// A float into distributed shared memory (an address from cluster_addr).
__device__ __forceinline__ void st_cluster_f32(uint32_t addr, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
// st.async into another CTA's shared memory (an address from cluster_addr), completing `bytes`
// on that CTA's mbarrier (remote_bar: the same kind of address).
__device__ __forceinline__ void st_async_v4(uint32_t addr, float4 v, uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];\n" ::"r"(addr),
      "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)),
      "r"(__float_as_uint(v.w)), "r"(remote_bar)
      : "memory");
}
__device__ __forceinline__ void st_async_v2(uint32_t addr, float a, float b, uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];\n" ::"r"(
          addr),
      "r"(__float_as_uint(a)), "r"(__float_as_uint(b)), "r"(remote_bar)
      : "memory");
}
// An mbarrier armed with the bytes that other CTAs' st.async will bring (release at cluster
// scope; wait with mbar_wait<true>).
__device__ __forceinline__ void mbar_expect_tx_cluster(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cluster.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
// 16 bytes global -> shared (cp.async.cg); src_bytes 0 zero-fills (src must still be a valid
// pointer).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(src_bytes)
               : "memory");
}

// Bulk copies (sm_90's copy engine without a tensor map) global -> shared, completed on an
// mbarrier: one thread arms the barrier with the bytes to come (mbar_expect_tx) and issues the
// copies (16-byte aligned, sizes multiples of 16); every reader waits for the phase's parity.
// Shared memory the CTA read (generic proxy) before a bulk copy overwrites it needs
// fence_proxy_async() after the barrier that ends those reads.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}
// After mbar_init, before any other thread or the copy engine uses the barrier (then a
// __syncthreads).
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes,
                                              uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
// bulk_copy_g2s of data read once (weights), with ld_stream's L2 hint.
__device__ __forceinline__ void bulk_copy_g2s_stream(void* dst, const void* src, uint32_t bytes,
                                                     uint64_t* bar) {
#if DI_L2_EVICT_FIRST
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;\n" ::"r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(l2_stream_policy())
      : "memory");
#else
  bulk_copy_g2s(dst, src, bytes, bar);
#endif
}
// kCluster: with acquire at cluster scope (the bytes came from other CTAs' st.async).
template <bool kCluster = false>
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    if constexpr (kCluster) {
      asm volatile(
          "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], "
          "%2;\n selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(smem_u32(bar)), "r"(parity)
          : "memory");
    } else {
      asm volatile(
          "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
          " selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(smem_u32(bar)), "r"(parity)
          : "memory");
    }
  }
}

// ldmatrix.m8n8.x4 (b16): lane L gives the row address of row (L & 7) of matrix (L >> 3);
// register i receives matrix i (fragment layouts: attention_prefill_mma_math.h).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(ptr))
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(ptr))
               : "memory");
}

// Two consecutive bf16 as one 32-bit register (4-byte aligned).
__device__ __forceinline__ uint32_t ld_u32(const bf16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// c += a · b on tensor cores: one m16n8k16 bf16 MMA with f32 accumulation (mma.sync, sm_80+), in
// the PTX fragment layouts (a: 4 registers of the 16x16 row-major tile, b: 2 of the 16x8 column-
// major tile, c: 4 floats of the 16x8 tile).
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> bf16x2 (round to nearest even), `lo` in the low half (the lower column / k index).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 2^x by the SFU (ex2.approx.ftz; ex2.approx(-inf) = +0): the prefill kernels' softmax.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Fragment helpers around mma_bf16_16816 for kMt 16-row m-tiles and kNt 8-column n-tiles per
// warp (g = lane / 4, t4 = lane % 4, the PTX fragment coordinates):
//   scale_acc_rows: acc rows r *= corr[r] (flash attention's rescale of O by e^(m_old - m_new));
//   load_a_frags:   the A fragments of k-step k0 from a row-major bf16 tile in shared memory (row
//                   stride ld elements), m-tile mt covering rows mt·16 ..
template <int kMt, int kNt>
__device__ __forceinline__ void scale_acc_rows(float (&acc)[kMt][kNt][4], const float* corr, int g) {
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
    const float c_lo = corr[mt * 16 + g], c_hi = corr[mt * 16 + g + 8];
#pragma unroll
    for (int j = 0; j < kNt; ++j) {
      acc[mt][j][0] *= c_lo;
      acc[mt][j][1] *= c_lo;
      acc[mt][j][2] *= c_hi;
      acc[mt][j][3] *= c_hi;
    }
  }
}
template <int kMt>
__device__ __forceinline__ void load_a_frags(uint32_t (&a)[kMt][4], const bf16* tile, int ld,
                                             int k0, int g, int t4) {
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
    const bf16* pa = tile + (mt * 16 + g) * ld + k0 + 2 * t4;
    a[mt][0] = ld_u32(pa);
    a[mt][1] = ld_u32(pa + 8 * ld);
    a[mt][2] = ld_u32(pa + 8);
    a[mt][3] = ld_u32(pa + 8 * ld + 8);
  }
}

// The sequence that owns row tile `tile` of a tiled attention grid: the last s < num_seqs with
// tile_indptr[s] <= tile (tile_indptr: exclusive prefix sums of the sequences' tile counts).
__device__ __forceinline__ int tile_owner(const int32_t* tile_indptr, int num_seqs, int tile) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_indptr[mid] <= tile)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

// d rounded up to a multiple of 16 (k steps of m16n8k16, 16-element padded rows).
__host__ __device__ inline int pad16(int d) { return (d + 15) & ~15; }

}  // namespace di::cuda
