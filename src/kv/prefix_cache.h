#pragma once
// PrefixCache: which blocks hold the KV of which full-block hash (block_hash.h), plus the LRU order
// in which unreferenced cached blocks are evicted.
//
//   hash_to_block_  BlockHash -> BlockId      one block per hash; a duplicate insert is ignored
//   block_hash_     BlockId -> BlockHash      the inverse, for eviction
//   lru_            cached blocks with ref 0  front = least recently used = evicted first
//
// Ref counts live in the BlockPool. A cached block with ref > 0 is never in the LRU list and is
// never evicted; the KvCacheManager park()s a cached block when its ref count drops to 0 and
// unpark()s it when a new request hits it.
#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/ids.h"
#include "kv/block_hash.h"
#include "kv/block_pool.h"

namespace di {

class PrefixCache {
 public:
  explicit PrefixCache(int32_t num_blocks);

  std::optional<BlockId> find(const BlockHash& hash) const;
  // Registers a used block under `hash`. Returns false (and changes nothing) when the hash already
  // names another block: two requests computed the same block concurrently; the second copy stays
  // uncached and is freed normally.
  bool insert(const BlockHash& hash, BlockId block);
  bool is_cached(BlockId block) const { return block_hash_[block.value()].has_value(); }

  // A cached block lost its last reference: it becomes the most recently used evictable block.
  void park(BlockId block);
  // A parked block is referenced again.
  void unpark(BlockId block);
  // Forgets the least recently used parked block and returns it (the caller frees it in the pool).
  std::optional<BlockId> evict();

  int32_t num_cached() const { return static_cast<int32_t>(hash_to_block_.size()); }
  int32_t num_evictable() const { return static_cast<int32_t>(lru_.size()); }

  // Maps are inverse; no cached block is free in the pool; the LRU list holds exactly the cached
  // blocks whose ref count is 0.
  void check_integrity(const BlockPool& pool) const;

 private:
  std::unordered_map<BlockHash, BlockId> hash_to_block_;
  std::vector<std::optional<BlockHash>> block_hash_;  // [num_blocks]
  std::list<BlockId> lru_;
  std::vector<std::optional<std::list<BlockId>::iterator>> lru_pos_;  // [num_blocks]
};

}  // namespace di
