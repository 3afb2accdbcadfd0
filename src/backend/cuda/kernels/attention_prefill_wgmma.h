#pragma once
// Hopper (sm_90a) prefill attention on warpgroup MMA (wgmma.mma_async), warp-specialised: a
// cp.async producer warpgroup and two consumer warpgroups of 64 query rows (design, layouts and
// pipeline: attention_prefill_wgmma.cu). Same params struct and semantics as the mma.sync kernel
// (attention_prefill_mma.h): p.tile_indptr is workspace (num_seqs + 1 ints), p.rows_per_tile
// must be kPrefillWgmmaRows and p.max_tiles prefill_mma_max_tiles(..., kPrefillWgmmaRows);
// num_splits must be 1. Supported: prefill_wgmma_supported (attention_prefill_mma_math.h) and
// q / out / pool 16-byte aligned; the caller falls back to the mma.sync kernel otherwise.
#include "backend/cuda/kernels/attention.h"
#include "backend/cuda/kernels/attention_prefill_mma_math.h"

namespace di::cuda {

void launch_paged_attention_prefill_wgmma(const PagedAttentionKernelParams& p,
                                          cudaStream_t stream);

}  // namespace di::cuda
