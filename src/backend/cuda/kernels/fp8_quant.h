#pragma once
// Per-token-group FP8 quantization of activations for the block-scaled FP8 GEMM (issue #6).
// Host-includable (C++17 and C++20); see docs/cuda_backend.md "FP8 block-scaled linear".
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace di::cuda {

// x [m, k] bf16 -> q [m_pad, k] e4m3 and one f32 scale per row and 128-column block:
//   scale[r, b] = max(amax(x[r, 128b .. 128b+127]), 1e-10) / 448,   q = sat_e4m3(x / scale)
// so that x ≈ q * scale. The scales are stored outer-dim-major, as cuBLASLt's VEC128_32F mode
// reads them for the operand of shape [k, m_pad] (column-major):  scales[b * m_pad + r].
// Rows m .. m_pad-1 are padding: q = 0, scale = 1. Requires k % 128 == 0, m_pad >= m.
struct Fp8QuantParams {
  const __nv_bfloat16* x;  // [m, k]
  uint8_t* q;              // [m_pad, k]
  float* scales;           // [k / 128, m_pad]
  int64_t m;
  int64_t m_pad;
  int32_t k;
};
void launch_fp8_quant_1x128(const Fp8QuantParams& p, cudaStream_t stream);

}  // namespace di::cuda
