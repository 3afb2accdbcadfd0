#include "kv/block_table.h"

#include "core/error.h"

namespace di {

PagedBatchView build_paged_batch(std::span<const PagedBatchEntry> entries, int32_t block_size) {
  DI_CHECK(block_size > 0, "block_size must be positive, got {}", block_size);
  PagedBatchView v;
  v.indptr.reserve(entries.size() + 1);
  v.last_len.reserve(entries.size());
  v.indptr.push_back(0);
  for (size_t s = 0; s < entries.size(); ++s) {
    const PagedBatchEntry& e = entries[s];
    DI_CHECK(e.num_computed_tokens >= 0 && e.num_new_tokens >= 1,
             "sequence {} of the batch: {} computed and {} new tokens", s, e.num_computed_tokens,
             e.num_new_tokens);
    int32_t kv_len = e.num_computed_tokens + e.num_new_tokens;
    int32_t num_used = num_blocks_for(kv_len, block_size);
    DI_CHECK(num_used <= static_cast<int32_t>(e.block_table.size()),
             "sequence {} of the batch needs {} blocks for {} tokens but its table has {}", s,
             num_used, kv_len, e.block_table.size());
    for (int32_t i = 0; i < num_used; ++i) v.indices.push_back(e.block_table[i].value());
    v.indptr.push_back(static_cast<int32_t>(v.indices.size()));
    v.last_len.push_back(kv_len - (num_used - 1) * block_size);
    for (int32_t p = e.num_computed_tokens; p < kv_len; ++p) {
      v.slot_block_ids.push_back(e.block_table[p / block_size].value());
      v.slot_offsets.push_back(p % block_size);
    }
  }
  return v;
}

}  // namespace di
