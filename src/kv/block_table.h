#pragma once
// Block tables and the CSR view of a batch that attention kernels read.
//
// A sequence's token at position p has its KV in block table[p / block_size], slot p % block_size.
// For a step that computes tokens [num_computed, num_computed + num_new) of each sequence:
//
//   seq 0: table [7 2 5]   kv_len 150 (block 64)    indptr   [0 3 5]
//   seq 1: table [3 9 4]   kv_len 100               indices  [7 2 5 3 9]     (only blocks holding
//   KV)
//                                                   last_len [22 36]
// New tokens get slots (block id, offset) in `slot_block_ids` / `slot_offsets`, batch order.
#include <cstdint>
#include <span>
#include <vector>

#include "core/ids.h"

namespace di {

using BlockTable = std::vector<BlockId>;

inline int32_t num_blocks_for(int32_t num_tokens, int32_t block_size) {
  return (num_tokens + block_size - 1) / block_size;
}

struct PagedBatchEntry {
  std::span<const BlockId> block_table;  // may hold more blocks than the step needs
  int32_t num_computed_tokens = 0;       // KV already cached before this step (context)
  int32_t num_new_tokens = 0;            // tokens computed this step, >= 1
};

struct PagedBatchView {
  std::vector<int32_t> indptr;          // [num_seqs + 1] into indices; back() = blocks used
  std::vector<int32_t> indices;         // block ids, concatenated per sequence
  std::vector<int32_t> last_len;        // [num_seqs] valid tokens in the last block, 1..block_size
  std::vector<int32_t> slot_block_ids;  // [total new tokens] block that receives each new token
  std::vector<int32_t> slot_offsets;    // [total new tokens] slot in that block, 0..block_size-1
};

// Host-side metadata for one step (plan on the CPU, copy to the device once).
PagedBatchView build_paged_batch(std::span<const PagedBatchEntry> entries, int32_t block_size);

}  // namespace di
