#pragma once
// The split combine folded into the output projection (one decode token; Backend::attention_o_proj
// on CUDA): instead of combine_splits_kernel writing the attention output and the o_proj GEMV
// reading it back, one kernel splits o_proj's k over the q heads:
//
//   grid (C, hidden / R), C·H = num_q_heads (H = 4, or 2 with DEEPINFER_ATTN_O_PROJ_HEADS=2);
//   CTA (q, b): q heads q·H .. q·H + H - 1, output rows b·R .. b·R + R - 1 (R·H·128·2 B of W_o:
//   <= 128 KB at one CTA per SM for H = 4, <= 64 KB at two for H = 2)
//   before griddepcontrol.wait: its W_o block (R rows x H·128 columns) into shared memory
//              (cp.async): the GQA decode kernel is running, and HBM has little else to do
//   after it:  each 128-thread group merges one head's splits (combine_splits_kernel's
//              arithmetic and block size: the same bf16 attention values) -> o in shared memory;
//              y_q[r] = Σ_c W[r, c] · o[c] over the CTA's H·128 columns (f32) -> workspace;
//              arrival at row block b's counter; the last of the C CTAs sums the C partial rows
//              in rank order (= head order), rounds as the GEMV (bf16(acc)), adds the residual
//              (x = bf16(x + y)), stores and resets the counter.
//
// One dependent stage (the combine kernel) and o_proj's activation staging go away. The sum over
// k runs in another order than the one-row GEMV's, so x may differ from the composed path in the
// last bit (the attention values themselves are bit-equal). Opt-in (DEEPINFER_ATTN_O_PROJ=1):
// slower on the H200 (run 34, Qwen3-30B-A3B batch 1; docs/cuda_backend.md "The split combine
// inside o_proj"): H = 4 -10 % (a 128 KB CTA fits beside the decode kernel's CTAs on some SMs
// only, so part of W_o loads after the attention), H = 2 -5 % (all resident; the merge and the
// hand-off after the wait take longer than the combine kernel and the GEMV). A first version
// reduced the C partials in a cluster through distributed shared memory (-12 %): not all 16
// clusters of 8 were resident at once.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace di::cuda {

struct AttnOProjParams {
  const float* partial_o;   // [num_splits, num_q_heads, 128] (one token)
  const float* partial_ml;  // [num_splits, num_q_heads, 2]
  int32_t num_splits;
  int32_t num_q_heads;     // C·H
  const __nv_bfloat16* w;  // W_o [hidden, num_q_heads·128], row-major
  __nv_bfloat16* x;        // the residual [hidden]: x += W_o · attn (bf16, as the GEMV)
  int32_t hidden;
  int32_t rows_per_cta;  // R
  int32_t heads_per_cta;  // H: 4 (512 threads, up to 128 KB of W_o) or 2 (256, up to 64 KB)
  float* partials;       // [hidden / R][C][R] workspace: each CTA's partial rows
  uint32_t* counters;    // [hidden / R], zero (the last CTA of a row block resets its)
};

constexpr int kAttnOProjDim = 128;              // head_dim_v
constexpr int kAttnOProjMaxSmemW = 128 * 1024;  // W_o bytes per CTA

// R for a projection of `hidden` rows over `num_q_heads` heads of 128, H = heads_per_cta (4 or
// 2) heads per CTA, on `num_sms` SMs: the largest R (<= 128, a multiple of 16 dividing hidden)
// whose W_o block fits kAttnOProjMaxSmemW (H = 4: one CTA per SM) or half of it (H = 2: two),
// with at most that many CTAs per SM (so that every CTA can load its block during the
// attention). 0 when there is none, and under DEEPINFER_BATCH_INVARIANT=1 (the GEMV's order).
int attn_o_proj_rows_per_cta(int hidden, int num_q_heads, int num_sms, int heads_per_cta);

// Launches the kernel as a PDL dependent of the stream's previous kernel (the GQA decode kernel
// that wrote the partials). p.rows_per_cta from attn_o_proj_rows_per_cta (> 0).
cudaError_t launch_attn_o_proj(const AttnOProjParams& p, cudaStream_t stream);

}  // namespace di::cuda
