#pragma once
// Mixture-of-experts expert computation without host round trips (issue #6).
//
//   1. moe_align (one block): from topk_ids [T, k] builds, on the device, the per-expert exclusive
//      offsets, the list of touched experts, and the permutation of the (token, slot) pairs into
//      rows grouped by expert (expert ascending, slot ascending within an expert: a stable
//      counting sort). All buffers are sized by the upper bound T * k, so nothing is read back.
//   2. decode path: moe_gate_up (gate_up GEMV + silu·mul, f32 out) and moe_down (down GEMV, f32 out).
//      Grid = (row tiles, min(E, T * k)); block y handles the y-th touched expert (blocks beyond
//      the number of touched experts exit at once), each warp one weight row (gate_up: the gate
//      row j and the up row I + j together), reading it once with 16-byte loads and applying it to
//      every row routed to that expert, MT rows at a time (fp32 accumulation).
//   3. moe_combine_f32: out[t] = Σ_j w[t, j] · y[slot_row[t, j]], j ascending (no float atomics).
// Everything is launched with host-known sizes, so the whole op is CUDA-graph capturable.
#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include <cstdint>

namespace di::cuda {

inline constexpr int kMoeAlignThreads = 1024;
inline constexpr int kMoeMaxExperts = kMoeAlignThreads;  // the offsets scan is one block wide

struct MoeAlignParams {
  const int32_t* topk_ids;  // [slots] expert of slot i = t * top_k + j
  int64_t slots;            // T * top_k (< 2^31)
  int32_t top_k;
  int32_t num_experts;      // 1 .. kMoeMaxExperts
  int32_t* offsets;         // [E + 1] rows of expert e: [offsets[e], offsets[e + 1])
  int32_t* active;          // [min(E, slots)] touched experts, ascending; the first *num_active valid
  int32_t* num_active;      // [1]
  int32_t* row_token;       // [slots] token of row r (rows >= offsets[E] unused)
  int32_t* slot_row;        // [slots] row of slot i, -1 for an expert id outside [0, E) (skipped)
  int32_t tile_m;           // > 0: also write tile_start for the grouped GEMM (its BM), else 0
  int32_t* tile_start;      // [E + 1] m-tiles of tile_m rows before expert e, or null
};
void launch_moe_align(const MoeAlignParams& p, cudaStream_t stream);

// The decode path. Requires hidden % 8 == 0, inter % 8 == 0 and 16-byte aligned x / weights.
struct MoeDecodeParams {
  const __nv_bfloat16* x;        // [T, hidden]
  const __nv_bfloat16* gate_up;  // [E, 2 * inter, hidden]
  const __nv_bfloat16* down;     // [E, hidden, inter]
  const int32_t* offsets;        // from moe_align
  const int32_t* active;
  const int32_t* num_active;
  const int32_t* row_token;
  float* act;                    // [slots, inter] silu(gate) * up per row
  float* y;                      // [slots, hidden] expert output per row
  int32_t hidden;
  int32_t inter;
  int32_t max_active;            // grid.y = min(E, slots)
  int32_t rows_hint;             // upper bound on rows per expert (picks MT = 1, 2, 4 or 8)
  int32_t avg_rows = 0;          // ⌈slots / max_active⌉ (0: unknown): v2 picks its tile sizes
                                 // by min(avg_rows, rows_hint); any row count stays correct
                                 // (more passes), v1 ignores it
};
// kV1: one weight row (pair) per warp, loads as the loop goes; kV2: the same sums bit for bit, R
// rows per warp and U chunk-iterations of loads issued ahead (moe_gemm.cu); kTc (default):
// tensor cores with the weights streamed through a cp.async ring, 128 weight rows per CTA
// (moe_decode_tc.cu; act in bf16). kAuto: kTc unless DEEPINFER_MOE_DECODE=v1 or v2 (read once).
// (Tensor-core kernels straight from global memory, the default of runs 8-14 from 4 rows per
// expert, lost to kTc in run 15 and were removed in run 46.)
enum class MoeDecodeImpl { kAuto, kV1, kV2, kTc };
MoeDecodeImpl moe_decode_impl_from_env();
// Tests and benchmarks: force kV1 / kV2 for later calls (kAuto: back to the env choice). Not
// thread-safe; set it outside any graph capture (a captured graph keeps the kernels it saw).
void set_moe_decode_impl_override(MoeDecodeImpl impl);
// DEEPINFER_MOE_DECODE_GROUPED_MIN_ROWS=N (> 0; default 0 = off, read once): in the decode size
// range, take the tensor-core grouped GEMM path instead of the decode kernels when
// slots / num_experts >= N (about N rows per expert; capturable too). For tuning on the GPU.
int moe_decode_grouped_min_rows();
void launch_moe_decode(const MoeDecodeParams& p, cudaStream_t stream,
                       MoeDecodeImpl impl = MoeDecodeImpl::kAuto);
// The kTc kernels (gate_up writes act as bf16 into p.act's bytes; down reads it back).
void launch_moe_decode_tc(const MoeDecodeParams& p, cudaStream_t stream);

// One token (decode at batch 1), v2 only: 2 kernels instead of align + gate_up + down + combine.
// gate_up: grid (⌈inter / 8⌉, slots), act[j] for slot j (2 chunk loads in flight per lane, 6 CTAs
// per SM; 4 in flight at 4 CTAs per SM when the 2x6 grid would take more than one wave (run 37);
// DEEPINFER_MOE_T1_GU=2x6 / 4x4 / 2x8 forces one); down: grid ⌈hidden / 4⌉ (4
// warps), each warp one output column summing its down rows over the slots j ascending (the combine
// folded in; two slots' loads in flight at a time). Slots with an expert id outside [0, E) are
// skipped. Results equal the 4-kernel path bit for bit. Same alignment requirements as
// MoeDecodeParams. Backend::moe_residual adds:
//   shared experts as `shared_slots` more slots of weight 1 after the routed ones: a SwiGLU MLP
//     of S·inter columns, slot top_k + q = its columns [q·inter, (q+1)·inter) (gate rows q·inter
//     + j, up rows S·inter + q·inter + j, down columns q·inter + c); their first gate_up weight
//     loads come before griddepcontrol.wait (which matters only with DEEPINFER_MOE_T1_PDL=1: the
//     kernels launch plainly by default, measured faster);
//   residual: out[n] = bf16(residual[n] + bf16(sum)) (the add kernel's rounding; may alias out).
struct MoeDecodeT1Params {
  const __nv_bfloat16* x;        // [1, hidden]
  const __nv_bfloat16* gate_up;  // [E, 2 * inter, hidden]
  const __nv_bfloat16* down;     // [E, hidden, inter]
  const int32_t* topk_ids;       // [top_k]
  const float* topk_weights;     // [top_k]
  float* act;                    // [top_k + shared_slots, inter] scratch
  __nv_bfloat16* out;            // [1, hidden]
  int32_t hidden;
  int32_t inter;
  int32_t num_experts;
  int32_t top_k;
  const __nv_bfloat16* shared_gate_up = nullptr;  // [2 · S · inter, hidden] or null
  const __nv_bfloat16* shared_down = nullptr;     // [hidden, S · inter]
  int32_t shared_slots = 0;                       // S
  const __nv_bfloat16* residual = nullptr;        // [1, hidden] or null
  // The down kernel lets the stream's next kernel (the next layer's PDL-launched qkv GEMV) start
  // as soon as every down CTA runs, so its first weight loads overlap down's tail. Set by
  // launch_moe_decode_t1 from DEEPINFER_MOE_T1_TRIGGER (default on; 0 off: the A/B switch).
  bool early_trigger = false;
  // The pipelined down kernel loads the ids and its first slot pair's weight rows before
  // griddepcontrol.wait (set by launch_moe_decode_t1 when down is a PDL dependent of gate_up: see
  // there why that is safe).
  bool early_rows = false;
  // Shared slots start before the router ends (shared_early; launch_moe_decode_t1 then launches
  // gate_up as a PDL dependent of the router): their CTAs come first in the grid, recompute x =
  // rms_norm(norm_x) · norm_w (bitwise the rms_norm kernel's h) into shared memory and never wait;
  // only the routed slots wait for the router's ids. norm_x is the residual stream before the
  // block (not written by the router).
  bool shared_early = false;
  const __nv_bfloat16* norm_x = nullptr;  // [1, hidden]
  const __nv_bfloat16* norm_w = nullptr;  // [hidden]
  float eps = 0.0f;
};
// down kernel of the one-token path: kPipelined keeps the next slot pair's weight loads in
// flight while a pair is summed (rows of inter <= 2048; larger inter takes kPairs), kPairs is
// the earlier kernel (loads of one pair, then its sums). Bitwise equal. kSmem (run 21) stages
// act in shared memory once per CTA and streams each warp's rows through a register ring
// (inter <= 2048, act <= 96 KB; else the pair kernel). Bitwise equal too. kAuto (default):
// kSlot where it applies (run 41: Qwen3-30B-A3B +2.9 %, V2-Lite +3.4 % at batch 1), else
// pipelined for inter <= 1024, smem above (a PDL dependent of gate_up that loads its first rows
// before the wait; run 23), by measurement. (Gate_up and down in one persistent kernel, run 35,
// lost at batch 1 and was removed in run 46; docs/batch1_decode.md, "Gate_up and down in one
// kernel".) kSlot (run 41): a CTA per C output columns with one warp per slot (at most 16 slots and
// inter
// <= 2048; else the kernels kAuto falls back to), each warp all C rows of its slot at once, the
// slot-order fold after one barrier; bitwise equal.
// DEEPINFER_MOE_T1_DOWN=v1 selects kPairs, =pipe kPipelined, =smem kSmem, =slot
// kSlot (read once); the override (tests, benchmarks; not thread-safe, outside captures) wins over
// the env.
enum class MoeT1DownImpl { kAuto, kPairs, kPipelined, kSmem, kSlot };
// kSlot's columns per CTA (1, 2 or 4); 0: DEEPINFER_MOE_T1_SLOT_C, else the default by row length.
void set_moe_t1_slot_cols(int cols);
MoeT1DownImpl moe_t1_down_impl();
void set_moe_t1_down_impl_override(MoeT1DownImpl impl);
// num_sms: the device's multiprocessor count (sizes the smem down kernel's grid).
cudaError_t launch_moe_decode_t1(const MoeDecodeT1Params& p, int num_sms, cudaStream_t stream);
// Whether one token takes launch_moe_decode_t1 (default) or the general decode path (align, the
// decode kernels, combine): DEEPINFER_MOE_T1=off (read once); the override (tests, benchmarks:
// 1 on, 0 off, -1 back to the env) wins.
bool moe_t1_path_enabled();
// Whether the shared slots start early (MoeDecodeT1Params::shared_early, when the caller gives
// the norm): DEEPINFER_MOE_SHARED_EARLY=0 turns it off (read once); the override (tests,
// benchmarks: 1 on, 0 off, -1 back to the env) wins.
void set_moe_shared_early_override(int on);
void set_moe_t1_path_override(int on);

// Grouped GEMM on tensor cores (mma.sync m16n8k16 bf16, fp32 accumulate), reading the device
// offsets: c[r, :] = a[a_rows ? a_rows[r] : r, :] · w[e]ᵀ for every row r of expert e.
// Grid (max_m_tiles, ⌈n / 128⌉): block x is the x-th m-tile of kMoeGemmBM rows in expert order
// (tile_start from moe_align with tile_m = kMoeGemmBM); blocks beyond the last tile exit. So it is
// capturable too. Requires k % 8 == 0, n % 8 == 0, 16-byte aligned a and w.
inline constexpr int kMoeGemmBM = 64;
struct MoeGroupedGemmParams {
  const __nv_bfloat16* a;    // [*, k]
  const int32_t* a_rows;     // [rows] source row of a for grouped row r, or null (identity)
  const __nv_bfloat16* w;    // [E, n, k]
  const int32_t* offsets;    // [E + 1]
  const int32_t* tile_start; // [E + 1]
  void* c;                   // [rows, n] f32 or bf16
  bool c_f32;
  int32_t n;
  int32_t k;
  int32_t num_experts;
  int32_t max_m_tiles;       // grid.x: ⌈slots / BM⌉ + min(E, slots) bounds Σ_e ⌈count_e / BM⌉
};
void launch_moe_grouped_gemm(const MoeGroupedGemmParams& p, cudaStream_t stream);

// out[t, :] = Σ_j topk_weights[t, j] · y[slot_row[t * top_k + j], :] (slots with row -1 skipped).
struct MoeCombineF32Params {
  const float* y;              // [rows, hidden]
  const int32_t* slot_row;     // [tokens * top_k]
  const float* topk_weights;   // [tokens, top_k]
  __nv_bfloat16* out;          // [tokens, hidden]
  int64_t tokens;
  int32_t top_k;
  int32_t hidden;
};
void launch_moe_combine_f32(const MoeCombineF32Params& p, cudaStream_t stream);

}  // namespace di::cuda
