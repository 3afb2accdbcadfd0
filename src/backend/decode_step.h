#pragma once
// One decode step padded to `bucket` sequences, host i32 tensors in PagedBatch order: what a
// captured step graph (fixed shapes, cuda::DecodeGraph) is refreshed with before each replay.
// Rows >= n are padding (slot -1: no KV written; no blocks: zero attention); qo_indptr and rows
// are 0..bucket; kv_indices holds bucket * max_blocks_per_seq entries, the used ones first.
// Header-only: the CUDA backend library uses it and is linked after the generic one.
#include <cstdint>

#include "backend/backend.h"
#include "core/error.h"

namespace di {

struct PaddedDecodeStep {
  Tensor ids, positions, slots, qo_indptr, kv_indptr, kv_indices, kv_last_len, rows;
};

inline PaddedDecodeStep pad_decode_step(const DecodeStepInputs& in, int32_t bucket,
                                 int32_t max_blocks_per_seq, int32_t block_size) {
  const auto n = static_cast<int32_t>(in.token_ids.size());
  DI_CHECK(n <= bucket && in.positions.size() == in.token_ids.size() &&
               in.slots.size() == in.token_ids.size() &&
               in.block_tables.size() == in.token_ids.size(),
           "decode step: {} sequences for a bucket of {} (or mismatched inputs)", n, bucket);
  DI_CHECK(in.block_size == block_size, "decode step: block size {}, captured with {}",
           in.block_size, block_size);
  auto zeros = [](int64_t len) { return Tensor::zeros({len}, DType::kI32); };
  PaddedDecodeStep out{zeros(bucket),     zeros(bucket),
                       zeros(bucket),     zeros(int64_t{bucket} + 1),
                       zeros(int64_t{bucket} + 1), zeros(int64_t{bucket} * max_blocks_per_seq),
                       zeros(bucket),     zeros(bucket)};
  int32_t used = 0;
  for (int32_t s = 0; s < bucket; ++s) {
    out.qo_indptr.data<int32_t>()[s + 1] = s + 1;
    out.rows.data<int32_t>()[s] = s;
    if (s < n) {
      const auto& table = in.block_tables[static_cast<size_t>(s)];
      const int32_t p = in.positions[static_cast<size_t>(s)];
      const int32_t nblocks = p / block_size + 1;
      DI_CHECK(nblocks <= max_blocks_per_seq && static_cast<int32_t>(table.size()) >= nblocks,
               "decode step: sequence {} at position {} needs {} blocks ({} given, {} max)", s, p,
               nblocks, table.size(), max_blocks_per_seq);
      out.ids.data<int32_t>()[s] = in.token_ids[static_cast<size_t>(s)];
      out.positions.data<int32_t>()[s] = p;
      out.slots.data<int32_t>()[s] = in.slots[static_cast<size_t>(s)];
      for (int32_t b = 0; b < nblocks; ++b)
        out.kv_indices.data<int32_t>()[used++] = table[static_cast<size_t>(b)];
      out.kv_last_len.data<int32_t>()[s] = p - (nblocks - 1) * block_size + 1;
    } else {
      out.slots.data<int32_t>()[s] = -1;  // padding: no KV written, no blocks, zero attention
    }
    out.kv_indptr.data<int32_t>()[s + 1] = used;
  }
  return out;
}

}  // namespace di
