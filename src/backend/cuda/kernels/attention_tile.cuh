#pragma once
// The row tile one CTA of a tiled paged-attention grid works on (paged_attention_kernel and the
// two tensor-core prefill kernels): tile_indptr holds each sequence's first tile, a tile is
// `rows` consecutive (token, q head of the kv head's group) rows of one sequence, token-major.
#include "backend/cuda/kernels/attention.h"
#include "backend/cuda/kernels/common.cuh"

namespace di::cuda {

struct AttnTile {
  int s;                  // the sequence
  int group;              // q heads per kv head
  int q_begin;            // the sequence's first new token (row of q / out)
  int row0;               // the tile's first row within the sequence
  int nr;                 // valid rows in the tile (>= 1)
  int kv_len;             // the sequence's cached tokens (the new ones included)
  const int32_t* blocks;  // its block table
};

__device__ __forceinline__ AttnTile attn_tile(const PagedAttentionKernelParams& p, int tile,
                                              int rows) {
  AttnTile t;
  t.s = tile_owner(p.tile_indptr, p.num_seqs, tile);
  t.group = p.num_q_heads / p.num_kv_heads;
  t.q_begin = p.qo_indptr[t.s];
  const int seq_rows = (p.qo_indptr[t.s + 1] - t.q_begin) * t.group;
  t.row0 = (tile - p.tile_indptr[t.s]) * rows;
  t.nr = min(rows, seq_rows - t.row0);
  const int nblocks = p.kv_indptr[t.s + 1] - p.kv_indptr[t.s];
  t.kv_len = nblocks > 0 ? (nblocks - 1) * p.block_size + p.kv_last_len[t.s] : 0;
  t.blocks = p.kv_indices + p.kv_indptr[t.s];
  return t;
}

// The tile of a prefill CTA (grid.y over the batch's tiles, heaviest first: the last tiles of
// tile_indptr are the longest sequences' latest rows), or -1 for a CTA past them.
__device__ __forceinline__ int prefill_tile_of_cta(const PagedAttentionKernelParams& p) {
  const int total = p.tile_indptr[p.num_seqs];
  const int y = static_cast<int>(blockIdx.y);
  return y < total ? total - 1 - y : -1;
}

}  // namespace di::cuda
