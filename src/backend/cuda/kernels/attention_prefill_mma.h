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

// Variant (prefill_mma_rows): warps 4 or 8 with one 16-row m-tile per warp (64 / 128 rows per
// CTA), or m_tiles 2 (4 warps x 32 rows = 128 rows). p.rows_per_tile / p.max_tiles must match.
void launch_paged_attention_prefill_mma(const PagedAttentionKernelParams& p, int warps, int m_tiles,
                                        cudaStream_t stream);

// One-CTA prologue of the tensor-core prefill kernels: tile_indptr[s] = first tile of sequence s
// for tiles of `rows_per_tile` rows ((new tokens) x group rows per sequence).
void launch_prefill_tile_indptr(const int32_t* qo_indptr, int32_t num_seqs, int32_t group,
                                int32_t rows_per_tile, int32_t* tile_indptr, cudaStream_t stream);

}  // namespace di::cuda
