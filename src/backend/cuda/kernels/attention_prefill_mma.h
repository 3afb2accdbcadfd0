#pragma once
// Tensor-core (mma.sync m16n8k16 bf16) FlashAttention-2-style prefill over the paged KV pool.
// Same params struct and semantics as the CUDA-core kernel (attention.h); the launcher uses
// p.tile_indptr (workspace, num_seqs + 1 ints), p.rows_per_tile (= 16 * warps) and p.max_tiles;
// num_splits must be 1. Supported: head_dim_qk == head_dim_v in {64, 128}, entry_size, offsets
// and kv_head_stride multiples of 8 elements, q / out / pool 16-byte aligned (see
// prefill_mma_supported in attention_prefill_mma_math.h).
#include "backend/cuda/kernels/attention.h"
#include "backend/cuda/kernels/attention_prefill_mma_math.h"

namespace di::cuda {

// warps: 4 (64 rows per CTA) or 8 (128 rows per CTA).
void launch_paged_attention_prefill_mma(const PagedAttentionKernelParams& p, int warps,
                                        cudaStream_t stream);

}  // namespace di::cuda
