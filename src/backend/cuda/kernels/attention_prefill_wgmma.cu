// Hopper prefill attention (issue #5): warpgroup MMA (wgmma.mma_async, bf16 in, f32 accumulate)
// over the paged KV pool, warp-specialised. Same work decomposition as the mma.sync kernel
// (attention_prefill_mma.cu): a CTA takes kRows = 128 query rows (token, q head of kv head g's
// group; token-major) of one sequence and walks the KV tiles of kN = 128 tokens up to the last
// position any of its rows may see; grid = (num_kv_heads, max_tiles), heaviest tiles first.
//
// Warpgroups (384 threads):
//   0  producer: cp.async (16 B, zero-fill past the sequence) of the Q tile and of each K and V
//      tile into shared memory in the 128-byte-swizzled layout wgmma descriptors read (below).
//      Each lane reads the block table once per tile for one of its warp's 32 rows, prefetched
//      a tile ahead, and the row offsets go round by shuffle (one read per key, in the copy
//      loop, held the kernel at 246 TFLOP/s). A tile is published one tile behind: wait for the
//      copies, fence.proxy.async, arrive on the full barriers. 56 registers.
//   1, 2  consumers: 64 query rows each (one wgmma M). Per KV tile: S = Q·Kᵀ (64 x 128, 8
//      wgmma k-steps from shared memory), causal/length mask only on tiles that cross some row's
//      limit, online softmax in registers (exp2, scale folded in), P rounded to bf16 in the
//      register A layout and O += P·V (wgmma with A from registers, V read transposed). 224
//      registers: S 64 + O 64 + P 32 f32/b32 per thread.
// Pipeline: kStages = 3 K/V buffers with separate full and empty barriers for K and V, so K of
// tile j + 3 loads as soon as S of tile j is done. Inside a consumer, S of tile j is issued
// before P·V of tile j - 1 and the softmax of tile j runs while P·V of tile j - 1 is on the
// tensor cores (FA3's intra-warpgroup overlap); the two consumers take turns to issue (named
// barriers, "ping-pong"), so one's softmax also overlaps the other's MMAs. Tiles are walked last
// to first: the masked ones come first.
//
// Shared-memory layout of a [R rows][128] bf16 tile (Q: R = 128 rows, K / V: R = 128 keys):
// two column halves of 64 elements (128 bytes per row), half h at h * R * 128 bytes; row r of a
// half at r * 128 and its 16-byte chunk c at (c ^ (r & 7)) * 16 (the hardware's 128B swizzle:
// byte-address bits [4, 7) XOR bits [7, 10), atoms of 8 rows = 1024 bytes, 1024-aligned).
//   Q, K (K-major A / B of Q·Kᵀ): descriptor start = half base + 32 bytes per 16-element k-step
//     inside the half, stride byte offset (8-row groups) 1024.
//   V (MN-major B of P·V, keys = K, dims = N): the same bytes read transposed; leading byte
//     offset = distance between the 64-dim halves (R * 128), stride byte offset 1024 (8 keys);
//     a 16-key k-step advances 16 * 128 bytes.
//
// Napkin math, Llama-3.1-8B 8K causal (32 q / 8 kv heads): 4 * 32 * 128 * 8192^2 / 2 = 0.55
// TFLOP: 0.70 ms at 787 TFLOP/s (measured 1.16 ms, 472 TFLOP/s, H200). Per CTA and tile
// 2 * 2 * 128^3 = 8.4 MFLOP (~2050 cycles at 4096 FLOP/cycle/SM) against 64 KiB of K/V (L2
// hits: 8 kv heads x 8K x 512 B = 32 MiB per layer; 4.4 GB over the run, ~3.8 TB/s from L2)
// and 128 x 128 exp2 on 16 MUFU lanes/SM (~1000 cycles), hence the overlap.
#include <cfloat>
#include <climits>
#include <cstdlib>

#include "backend/cuda/kernels/attention_prefill_mma.h"
#include "backend/cuda/kernels/attention_prefill_wgmma.h"
#include "backend/cuda/kernels/attention_tile.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "core/env.h"

namespace di::cuda {
namespace {

constexpr int kD = 128;      // head dim (q·k and v)
constexpr int kRows = 128;   // query rows per CTA: 2 consumer warpgroups x 64
constexpr int kN = 128;      // kv tokens per tile
constexpr int kThreads = 384;
constexpr int kTileBytes = kN * kD * 2;   // 32 KiB: one K or V tile
constexpr int kQBytes = kRows * kD * 2;   // 32 KiB
constexpr int kHalfBytes = kN * 128;      // one 64-column half of a tile (kRows == kN)
// K/V buffers. H200, 8K causal: 2 stages 380 TFLOP/s, 3 stages 466 (the copies of tile j + 3
// are issued once both consumers are done with tile j: ~2 tiles of L2 latency hidden).
constexpr int kStages = 3;
// Dynamic shared memory (+ slack to align the tiles to 1024 bytes): 225 KiB of 227.
constexpr int kSmemBytes = kQBytes + 2 * kStages * kTileBytes + 1024;
constexpr int kProducerRegs = 56, kConsumerRegs = 224;  // 128 * 56 + 256 * 224 <= 64K
static_assert(kRows == kN, "Q and K/V tiles share the swizzle geometry");
static_assert(kRows == kPrefillWgmmaRows, "the host plans tiles of kPrefillWgmmaRows rows");

// ---- mbarrier (phase-parity waits) ----
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// 16 bytes global -> shared; src_bytes 0 zero-fills (src must still be a valid pointer).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

// Named barriers (id 1, 2) of the two consumer warpgroups (256 threads: 128 sync + 128 arrive).
__device__ __forceinline__ void named_bar_sync(int id) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}


// ---- wgmma ----
// Shared-memory matrix descriptor, 128B swizzle (layout type 1); byte offsets are >> 4.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (uint64_t{1} << 62);
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Pins the register where it is: the compiler may not move its reads or writes across this point
// (accumulators of an in-flight wgmma must not be touched before its wait).
__device__ __forceinline__ void reg_fence(float& r) {
  asm volatile("" : "+f"(r)::"memory");
}
__device__ __forceinline__ void reg_fence(uint32_t& r) {
  asm volatile("" : "+r"(r)::"memory");
}
// Generic-proxy writes (cp.async) -> async-proxy reads (wgmma operands).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The 64 f32 accumulator registers of an m64n128 wgmma (one thread's share), as "+f" asm operands
// %0..%63 (both wrappers below).
#define DI_WGMMA_ACC64(d)                                                                       \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),       \
  "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),     \
  "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),     \
  "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),     \
  "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),     \
  "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),     \
  "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),     \
  "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// d (64 x 128, f32) (+)= A (64 x 16, smem) · B (16 x 128, smem, K-major); scale_d 0 overwrites d.
__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                         int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : DI_WGMMA_ACC64(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
// d (64 x 128, f32) += A (64 x 16, registers) · B (16 x 128, smem, MN-major: transposed).
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : DI_WGMMA_ACC64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

struct Barriers {
  uint64_t q_full;             // the Q tile landed (128 producer arrivals)
  uint64_t k_full[kStages];    // K tile of the stage landed (128)
  uint64_t v_full[kStages];    // V tile landed (128)
  uint64_t k_empty[kStages];   // both consumers' S = Q·Kᵀ done with it (8 warps)
  uint64_t v_empty[kStages];   // both consumers' P·V done with it (8 warps)
};

// Producer: pool offset (elements) of the entry of kv token kv0 + the row this lane owns (see
// load_kv_tile), -1 past the sequence. One block-table read per lane and tile, shared by K and V.
__device__ __forceinline__ int64_t kv_row_offset(const PagedAttentionKernelParams& p,
                                                 const int32_t* blocks, int kv_len, int kv0,
                                                 int bs_shift) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kvp = kv0 + 2 * warp + (lane & 1) + 8 * (lane >> 1);
  if (kvp >= kv_len) return -1;
  const int bi = bs_shift >= 0 ? kvp >> bs_shift : kvp / p.block_size;
  const int off = bs_shift >= 0 ? kvp & (p.block_size - 1) : kvp - bi * p.block_size;
  return int64_t{blocks[bi]} * p.block_stride + int64_t{off} * p.entry_size;
}

// Producer: K or V rows [kv0, kv0 + kN) into the swizzled tile at `dst` (shared address). Thread
// t copies 16-byte chunk t % 16 of rows r0 + 8 i (r0 = t / 16, i < 16); `dst` is its chunk's
// offset in row r0, and row r0 + 8 i is 1024 bytes further (same r & 7, same swizzle). Warp w
// copies rows 2w, 2w + 1 (+ 8 i): lane 2 i + (lane / 16) holds that row's offset (kv_row_offset).
__device__ __forceinline__ void load_kv_tile(const PagedAttentionKernelParams& p, int64_t row_off,
                                             int64_t head_off, uint32_t dst) {
  const int half = (threadIdx.x & 31) >> 4;
#pragma unroll
  for (int i = 0; i < kN / 8; ++i) {
    const int64_t ro = __shfl_sync(0xffffffffu, row_off, 2 * i + half);
    cp_async16(dst + i * 1024, ro >= 0 ? p.pool + ro + head_off : p.pool, ro >= 0 ? 16 : 0);
  }
}

// Consumer: S = Q · Kᵀ for this warpgroup's 64 rows and one K tile (8 k-steps of 16 dims).
__device__ __forceinline__ void issue_qk(float (&sc)[64], uint32_t q_wg, uint32_t k_tile) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t off = (kk >> 2) * kHalfBytes + (kk & 3) * 32;
    wgmma_ss(sc, smem_desc(q_wg + off, 16, 1024), smem_desc(k_tile + off, 16, 1024), kk > 0);
  }
  wgmma_commit();
}

// Consumer: O += P · V for one V tile (8 k-steps of 16 keys; P from registers).
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pf)[32],
                                         uint32_t v_tile) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk) {
    const uint32_t a[4] = {pf[4 * kk], pf[4 * kk + 1], pf[4 * kk + 2], pf[4 * kk + 3]};
    wgmma_rs(o, a, smem_desc(v_tile + kk * 16 * 128, kHalfBytes, 1024));
  }
  wgmma_commit();
}

// Accumulator layout of wgmma m64n128 (per thread; warp w of the warpgroup owns rows 16w..16w+15,
// g = lane / 4, t = lane % 4): element 4i + 2h + e is row 16w + g + 8h, column 8i + 2t + e.
// The A-register layout of m64k16 is the same per 16 columns, so P's A fragment for keys
// 16kk..16kk+15 is pf[4kk + j] = bf16x2(s[8kk + 2j], s[8kk + 2j + 1]).
// kPingPong: the two consumers take turns to issue their MMAs (named barriers 1 and 2), so one's
// softmax runs while the other's MMAs are on the tensor cores (H200 8K causal: 466 TFLOP/s vs
// 457 without).
template <bool kPingPong>
__global__ void __launch_bounds__(kThreads, 1) prefill_wgmma_kernel(PagedAttentionKernelParams p) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ Barriers bars;
  __shared__ int pos_s[kRows];
  const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;  // swizzle atoms: 1024-aligned
  const uint32_t q_s = base;
  const uint32_t k_s = q_s + kQBytes;                 // stage st at + st * kTileBytes
  const uint32_t v_s = k_s + kStages * kTileBytes;

  const int kvh = blockIdx.x;
  const int tile = prefill_tile_of_cta(p);
  if (tile < 0) return;
  const AttnTile at = attn_tile(p, tile, kRows);
  const int group = at.group, q_begin = at.q_begin, row0 = at.row0, nr = at.nr;
  const int kv_len = at.kv_len;
  const int32_t* blocks = at.blocks;

  // Last visible position per row (-1: no row / nothing visible).
  if (threadIdx.x < kRows) {
    const int r = threadIdx.x;
    pos_s[r] = r < nr ? min(p.positions[q_begin + (row0 + r) / group], kv_len - 1) : -1;
  }
  if (threadIdx.x == 0) {
    mbar_init(smem_u32(&bars.q_full), 128);
    for (int st = 0; st < kStages; ++st) {
      mbar_init(smem_u32(&bars.k_full[st]), 128);
      mbar_init(smem_u32(&bars.v_full[st]), 128);
      mbar_init(smem_u32(&bars.k_empty[st]), 8);
      mbar_init(smem_u32(&bars.v_empty[st]), 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  // Every warp reduces on its own: the CTA's last visible position (tiles to walk) and each
  // consumer's first (tiles from which on it must mask).
  const int lane = threadIdx.x & 31;
  int max_pos = -1, min_pos0 = INT_MAX, min_pos1 = INT_MAX;
  for (int r = lane; r < nr; r += 32) {
    const int ps = pos_s[r];
    max_pos = max(max_pos, ps);
    if (r < kRows / 2)
      min_pos0 = min(min_pos0, ps);
    else
      min_pos1 = min(min_pos1, ps);
  }
  max_pos = __reduce_max_sync(0xffffffffu, max_pos);
  min_pos0 = __reduce_min_sync(0xffffffffu, min_pos0);
  min_pos1 = __reduce_min_sync(0xffffffffu, min_pos1);
  const int n_tiles = max_pos >= 0 ? max_pos / kN + 1 : 0;
  const int wg = threadIdx.x / 128;

  if (wg == 0) {  // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    const int t = threadIdx.x, c = t & 15, r0 = t >> 4;
    const uint32_t dst_off = (c >> 3) * kHalfBytes + r0 * 128 + (((c & 7) ^ r0) << 4);
#pragma unroll
    for (int i = 0; i < kRows / 8; ++i) {
      const int r = r0 + 8 * i;
      const bf16* src = p.q;
      int bytes = 0;
      if (r < nr) {
        const int tok = q_begin + (row0 + r) / group, h = kvh * group + (row0 + r) % group;
        src = p.q + (int64_t{tok} * p.num_q_heads + h) * kD + c * 8;
        bytes = 16;
      }
      cp_async16(q_s + dst_off + i * 1024, src, bytes);
    }
    cp_async_commit();
    const int bs_shift = (p.block_size & (p.block_size - 1)) == 0 ? __ffs(p.block_size) - 1 : -1;
    const int64_t head_off = p.layer_offset + int64_t{kvh} * p.kv_head_stride + c * 8;
    // Publishes tile `it` (and Q with tile 0) once this thread's copies of it have landed: the
    // copies are generic-proxy writes and wgmma reads through the async proxy, so wait, fence,
    // then release on the full barriers. The copies of the next K tile (one commit group) may
    // still be in flight. (Arriving through cp.async.mbarrier.arrive with a fence in every
    // consumer instead measured the same within 2 %.)
    auto publish = [&](int it, bool last) {
      if (last)
        cp_async_wait<0>();
      else
        cp_async_wait<1>();
      fence_proxy_async();
      if (it == 0) mbar_arrive(smem_u32(&bars.q_full));
      if (it >= 0) {
        mbar_arrive(smem_u32(&bars.k_full[it % kStages]));
        mbar_arrive(smem_u32(&bars.v_full[it % kStages]));
      }
    };
    int64_t row_off =
        n_tiles > 0 ? kv_row_offset(p, blocks, kv_len, (n_tiles - 1) * kN, bs_shift) : -1;
    for (int it = 0; it < n_tiles; ++it) {
      const int st = it % kStages;
      const uint32_t use = static_cast<uint32_t>(it / kStages);
      if (use > 0) mbar_wait(smem_u32(&bars.k_empty[st]), (use - 1) & 1);
      load_kv_tile(p, row_off, head_off + p.k_offset, k_s + st * kTileBytes + dst_off);
      cp_async_commit();
      if (it > 0) publish(it - 1, false);
      if (use > 0) mbar_wait(smem_u32(&bars.v_empty[st]), (use - 1) & 1);
      load_kv_tile(p, row_off, head_off + p.v_offset, v_s + st * kTileBytes + dst_off);
      cp_async_commit();
      if (it + 1 < n_tiles)  // the next tile's block-table reads overlap the empty waits
        row_off = kv_row_offset(p, blocks, kv_len, (n_tiles - 2 - it) * kN, bs_shift);
    }
    publish(n_tiles - 1, true);
    if (n_tiles == 0) mbar_arrive(smem_u32(&bars.q_full));
    return;
  }

  // ---- consumers ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
  const int cw = wg - 1;
  const int g = lane >> 2, tq = lane & 3;
  const int row_a = cw * 64 + ((threadIdx.x >> 5) & 3) * 16 + g;  // and row_a + 8
  const int pos_r[2] = {pos_s[row_a], pos_s[row_a + 8]};
  const int min_pos = cw == 0 ? min_pos0 : min_pos1;
  const float sl2 = p.scale * kLog2e;
  const uint32_t q_wg = q_s + cw * 64 * 128;

  float o[64], sc[64];
  uint32_t pf[32];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

  // Mask, online softmax of S in place (sc becomes P in f32); corr = rescale factor of O.
  auto softmax = [&](int kv0, float (&corr)[2]) {
    if (kv0 + kN - 1 > min_pos) {
#pragma unroll
      for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = kv0 + 8 * i + 2 * tq + (e & 1);
          if (key > pos_r[e >> 1]) sc[4 * i + e] = -INFINITY;
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int i = 0; i < 16; ++i) mx = fmaxf(mx, fmaxf(sc[4 * i + 2 * h], sc[4 * i + 2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[h], mx);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // nothing visible yet: p = 0
      corr[h] = fast_exp2((m_run[h] - m_use) * sl2);          // m_run = -inf: 0
      m_run[h] = m_new;
      const float ms = m_use * sl2;
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = fast_exp2(fmaf(sc[4 * i + 2 * h + e], sl2, -ms));
          sc[4 * i + 2 * h + e] = pv;
          sum += pv;
        }
      l_run[h] = l_run[h] * corr[h] + sum;  // per-lane partial; quad-reduced at the end
    }
  };
  auto pack_p = [&] {
#pragma unroll
    for (int j = 0; j < 32; ++j) pf[j] = pack_bf16(sc[2 * j], sc[2 * j + 1]);
  };

  // Ping-pong turns: consumer cw issues after barrier 1 + cw, then hands over with 2 - cw. Each
  // consumer has n_tiles + 1 issue points; consumer 1 opens with one hand-over and consumer 0
  // closes with one wait, so every arrival is matched.
  auto take_turn = [&] {
    if constexpr (kPingPong) named_bar_sync(1 + cw);
  };
  auto hand_over = [&] {
    if constexpr (kPingPong) named_bar_arrive(2 - cw);
  };
  if (kPingPong && cw == 1) named_bar_arrive(1);
  mbar_wait(smem_u32(&bars.q_full), 0);
  if (n_tiles > 0) {
    float corr[2];
    mbar_wait(smem_u32(&bars.k_full[0]), 0);
      take_turn();
    issue_qk(sc, q_wg, k_s);
    hand_over();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) reg_fence(sc[i]);
    if (lane == 0) mbar_arrive(smem_u32(&bars.k_empty[0]));
    softmax((n_tiles - 1) * kN, corr);  // O is still zero: no rescale
    pack_p();
    for (int it = 1; it < n_tiles; ++it) {
      const int st = it % kStages, pst = (it - 1) % kStages;
      mbar_wait(smem_u32(&bars.k_full[st]), (it / kStages) & 1);
          take_turn();
      issue_qk(sc, q_wg, k_s + st * kTileBytes);
      mbar_wait(smem_u32(&bars.v_full[pst]), ((it - 1) / kStages) & 1);
          issue_pv(o, pf, v_s + pst * kTileBytes);
      hand_over();
      wgmma_wait<1>();  // S of tile `it` done; P·V of tile it - 1 may still run
#pragma unroll
      for (int i = 0; i < 64; ++i) reg_fence(sc[i]);
      if (lane == 0) mbar_arrive(smem_u32(&bars.k_empty[st]));
      softmax((n_tiles - 1 - it) * kN, corr);
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 64; ++i) reg_fence(o[i]);
#pragma unroll
      for (int j = 0; j < 32; ++j) reg_fence(pf[j]);
      if (lane == 0) mbar_arrive(smem_u32(&bars.v_empty[pst]));
#pragma unroll
      for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[4 * i + e] *= corr[e >> 1];
      pack_p();
    }
    const int last = (n_tiles - 1) % kStages;
    mbar_wait(smem_u32(&bars.v_full[last]), ((n_tiles - 1) / kStages) & 1);
      take_turn();
    issue_pv(o, pf, v_s + last * kTileBytes);
    hand_over();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) reg_fence(o[i]);
  }
  if (kPingPong && cw == 0) named_bar_sync(1);

  // Normalise and write rows row_a (h = 0) and row_a + 8 (h = 1).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = row_a + 8 * h;
    if (r >= nr) continue;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const int tok = q_begin + (row0 + r) / group, hq = kvh * group + (row0 + r) % group;
    bf16* dst = p.out + (int64_t{tok} * p.num_q_heads + hq) * kD + 2 * tq;
#pragma unroll
    for (int i = 0; i < 16; ++i)
      *reinterpret_cast<uint32_t*>(dst + 8 * i) =
          pack_bf16(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);
  }
}

template <bool kPingPong>
void launch_cfg(const PagedAttentionKernelParams& p, dim3 grid, cudaStream_t stream) {
  open_dynamic_smem(reinterpret_cast<const void*>(&prefill_wgmma_kernel<kPingPong>), kSmemBytes);
  prefill_wgmma_kernel<kPingPong><<<grid, kThreads, kSmemBytes, stream>>>(p);
}

// Consumer ping-pong (kPingPong): on unless DEEPINFER_ATTN_WGMMA_PINGPONG=0 (A/B; read once).
bool prefill_wgmma_ping_pong() {
  static const bool on = di::env::get_int("DEEPINFER_ATTN_WGMMA_PINGPONG", 1) != 0;
  return on;
}

}  // namespace

void launch_paged_attention_prefill_wgmma(const PagedAttentionKernelParams& p,
                                          cudaStream_t stream) {
  if (p.num_tokens == 0 || p.num_seqs == 0) return;
  const int group = p.num_q_heads / p.num_kv_heads;
  launch_prefill_tile_indptr(p.qo_indptr, p.num_seqs, group, kPrefillWgmmaRows, p.tile_indptr,
                             stream);
  const dim3 grid(static_cast<unsigned>(p.num_kv_heads), static_cast<unsigned>(p.max_tiles));
  if (prefill_wgmma_ping_pong())
    launch_cfg<true>(p, grid, stream);
  else
    launch_cfg<false>(p, grid, stream);
}

}  // namespace di::cuda
