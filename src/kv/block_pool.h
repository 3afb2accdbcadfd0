#pragma once
// BlockPool: num_blocks fixed-size KV blocks (block_size tokens each) with reference counts.
//
// A block is in exactly one of three states:
//   free    ref 0, on the free list                      allocate() hands it out
//   used    ref > 0, in one or more block tables         decref() to 0 moves it on
//   parked  ref 0, not on the free list                  owned by the PrefixCache (evictable)
// The pool does not know about hashes: when decref() returns 0 the owner (KvCacheManager) either
// release()s the block to the free list or parks it in the prefix cache.
#include <cstdint>
#include <vector>

#include "core/ids.h"

namespace di {

class BlockPool {
 public:
  BlockPool(int32_t num_blocks, int32_t block_size);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t block_size() const { return block_size_; }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }

  bool can_allocate(int32_t num) const { return num >= 0 && num <= num_free(); }
  // Takes `num` free blocks, each with ref count 1. Deterministic: the most recently released
  // block first (lowest id first in a fresh pool).
  std::vector<BlockId> allocate(int32_t num);

  // A used or parked block gains a reference.
  void incref(BlockId block);
  // Drops one reference; returns the remaining count.
  int32_t decref(BlockId block);
  // An unreferenced, unparked block returns to the free list.
  void release(BlockId block);

  int32_t ref_count(BlockId block) const;
  bool is_free(BlockId block) const;

  // Free list holds distinct blocks, each with ref 0, and matches is_free().
  void check_integrity() const;

 private:
  void check_id(BlockId block) const;

  int32_t block_size_;
  std::vector<int32_t> ref_counts_;  // [num_blocks]
  std::vector<bool> is_free_;        // [num_blocks]
  std::vector<BlockId> free_;        // stack; back() is handed out first
};

}  // namespace di
