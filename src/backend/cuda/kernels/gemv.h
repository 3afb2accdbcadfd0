#pragma once
// Small-M linear layers of the decode path (issue #5): y = in_op(x) · wᵀ for m <= kGemvMaxRows
// rows, with the neighbouring elementwise ops fused in (Backend::fused_linear):
//
//   prologue (per CTA, into shared memory, rounded to bf16 like the unfused op's output):
//     kNone      a = x
//     kRmsNorm   a = x / rms(x) · norm_w              (x: the residual stream, as rms_norm)
//     kSiluMul   a = silu(x[:, :k]) · x[:, k:2k]      (x: the gate_up output, as silu_mul)
//   main loop: each output row of w is streamed once (16-byte non-caching loads into registers,
//     or cp.async into a per-thread shared-memory ring), split over `split` warps (split-K inside
//     the CTA when n is small), fp32 accumulation;
//   epilogue: r = bf16(acc) [+ bias, rounded again, as the cuBLAS + bias_add path];
//     y = r (bf16 or f32 acc); residual = bf16(residual + r);
//     silu_out: y = silu(r_gate) · r_up (the gate_up projection with silu_mul fused in).
//
// A persistent grid (at most a few CTAs per SM) keeps the prologue to once per CTA; the first
// weight vectors are loaded before the prologue so HBM is busy from the start.
// bf16 only (the fp32 verification mode uses the composed path). Host-includable.
#include <cuda_runtime.h>

#include <cstdint>

namespace di::cuda {

inline constexpr int kGemvMaxRows = 8;  // templates exist for m = 1..8

enum class GemvIn : int32_t { kNone = 0, kRmsNorm = 1, kSiluMul = 2 };

struct GemvParams {
  GemvIn in = GemvIn::kNone;
  const void* x = nullptr;   // bf16 [m, ldx]: k columns (kSiluMul: 2k, gate then up)
  int64_t ldx = 0;
  const void* norm_w = nullptr;  // bf16 [k] (kRmsNorm)
  float eps = 0.0f;
  const void* w = nullptr;   // bf16 [n, k] row-major
  const void* bias = nullptr;  // bf16 [n] or null
  void* y = nullptr;         // [m, ldy] bf16, or f32 when y_f32; null: residual only
  int64_t ldy = 0;
  bool y_f32 = false;
  void* residual = nullptr;  // bf16 [m, ldr] or null
  int64_t ldr = 0;
  int32_t m = 0;
  int32_t n = 0;
  int32_t k = 0;
  // y = silu(r[:, :n/2]) · r[:, n/2:] ([m, n/2] bf16; each half rounded to bf16 first, as
  // silu_mul on the bf16 GEMM output): the gate / up projection with silu_mul as its epilogue.
  // No bias, residual or f32 output.
  bool silu_out = false;
};

// 16-byte slots per 8 staged inputs for m rows and a ring of `ring_stages` (0: the register path):
// the 8 bf16 values, or for one row on the register path (the batch-1 projections) the same 8
// values as floats in two planes (gemv.cu, put_x / get_x). The one definition both the kernel's
// layout and the host's shared-memory bound use.
constexpr int gemv_x_slots(int m, int ring_stages) {
  return m == 1 && ring_stages == 0 ? 2 : 1;
}
constexpr int64_t gemv_staged_bytes(int m, int ring_stages, int64_t k) {
  return int64_t{m} * k * 2 * gemv_x_slots(m, ring_stages);
}

// The most shared memory a CTA needs for the staged activations: the register path's (m * k
// bf16; one row: k floats), which no other path exceeds.
inline int64_t gemv_smem_bytes(int32_t m, int32_t k) {
  return gemv_staged_bytes(m, 0, k);
}

// Whether launch_gemv handles these shapes: 1 <= m <= kGemvMaxRows, k % 8 == 0, 16-byte aligned
// x / w rows, the staged activations within `max_smem` bytes.
bool gemv_supported(const GemvParams& p, int64_t max_smem);

// num_sms: the device's multiprocessor count (sizes the persistent grid). Returns the error of
// the one-time shared-memory opt-in (per device), else cudaSuccess; launch errors are left for
// cudaGetLastError as with every launcher.
cudaError_t launch_gemv(const GemvParams& p, int num_sms, cudaStream_t stream);

// Where the weights in flight wait (m <= 2): 0 = registers (two items per warp), 2 / 3 = a
// per-thread ring of that many shared-memory stages filled by cp.async (one / two items in
// flight while one is used; a ring that does not fit falls back to registers), -1 = the policy
// (3 stages for one row, n and k >= 4096 and weights up to 64 MB, else registers). Initial value:
// DEEPINFER_GEMV_RING, else -1. For A/B measurements.
void set_gemv_ring_stages(int stages);
int gemv_ring_stages();
// One row with the rms_norm prologue on the registers: whether a warp's second item is requested
// before griddepcontrol.wait only on odd-numbered SMs (after x is staged on the others; same
// arithmetic, same bits; gemv.cu, kEarly). -1 = the policy (a warp has more than two items on
// average: Qwen3-30B-A3B's qkv projection), 0 = never, 1 = always. Initial value:
// DEEPINFER_GEMV_EARLY, else -1. gemv_early_launches() counts the launches that took it (tests).
void set_gemv_early(int mode);
int gemv_early();
int64_t gemv_early_launches();
// Forces the warps per row (a power of two the shape allows; 0 = the fill rule). Initial value:
// DEEPINFER_GEMV_SPLIT. For A/B measurements.
void set_gemv_split(int split);
// One row (m = 1) on registers: whether the two items a warp loads before griddepcontrol.wait
// come by bulk copy (the copy engine) into shared memory instead of by loads into registers
// (same arithmetic, same bits). -1 = the policy (weights of at least 64 MB: Llama-3.1-8B's
// gate_up and down, every lm_head), 0 = never, 1 = always. Initial value: DEEPINFER_GEMV_BULK,
// else -1. gemv_bulk_launches() counts the launches that took it (tests).
void set_gemv_bulk(int mode);
int gemv_bulk();
int64_t gemv_bulk_launches();

}  // namespace di::cuda
