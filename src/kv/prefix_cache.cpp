#include "kv/prefix_cache.h"

#include "core/error.h"

namespace di {

PrefixCache::PrefixCache(int32_t num_blocks) : block_hash_(num_blocks), lru_pos_(num_blocks) {}

std::optional<BlockId> PrefixCache::find(const BlockHash& hash) const {
  auto it = hash_to_block_.find(hash);
  if (it == hash_to_block_.end()) return std::nullopt;
  return it->second;
}

bool PrefixCache::insert(const BlockHash& hash, BlockId block) {
  DI_CHECK(!is_cached(block), "block {} is already cached", block.value());
  if (!hash_to_block_.emplace(hash, block).second) return false;
  block_hash_[block.value()] = hash;
  return true;
}

void PrefixCache::park(BlockId block) {
  DI_CHECK(is_cached(block), "park of uncached block {}", block.value());
  DI_CHECK(!lru_pos_[block.value()], "block {} is already parked", block.value());
  lru_pos_[block.value()] = lru_.insert(lru_.end(), block);
}

void PrefixCache::unpark(BlockId block) {
  auto& pos = lru_pos_[block.value()];
  DI_CHECK(pos.has_value(), "unpark of block {} that is not parked", block.value());
  lru_.erase(*pos);
  pos.reset();
}

std::optional<BlockId> PrefixCache::evict() {
  if (lru_.empty()) return std::nullopt;
  BlockId block = lru_.front();
  lru_.pop_front();
  lru_pos_[block.value()].reset();
  hash_to_block_.erase(*block_hash_[block.value()]);
  block_hash_[block.value()].reset();
  return block;
}

void PrefixCache::check_integrity(const BlockPool& pool) const {
  DI_CHECK(static_cast<int32_t>(block_hash_.size()) == pool.num_blocks(),
           "cache sized for {} blocks, pool has {}", block_hash_.size(), pool.num_blocks());
  for (const auto& [hash, block] : hash_to_block_) {
    DI_CHECK(block_hash_[block.value()] == hash,
             "hash {} maps to block {} which holds another hash", hash.hex(), block.value());
    DI_CHECK(!pool.is_free(block), "hash {} maps to free block {}", hash.hex(), block.value());
  }
  int32_t num_with_hash = 0;
  int32_t num_unreferenced = 0;
  for (int32_t b = 0; b < pool.num_blocks(); ++b) {
    if (!block_hash_[b]) {
      DI_CHECK(!lru_pos_[b], "uncached block {} is in the LRU list", b);
      continue;
    }
    ++num_with_hash;
    bool unreferenced = pool.ref_count(BlockId(b)) == 0;
    num_unreferenced += unreferenced;
    DI_CHECK(unreferenced == lru_pos_[b].has_value(),
             "cached block {} has ref count {} but in-LRU is {}", b, pool.ref_count(BlockId(b)),
             lru_pos_[b].has_value());
    if (lru_pos_[b]) DI_CHECK(**lru_pos_[b] == BlockId(b), "LRU position of block {} is stale", b);
  }
  DI_CHECK(num_with_hash == num_cached(), "{} blocks carry a hash, map has {}", num_with_hash,
           num_cached());
  DI_CHECK(num_unreferenced == num_evictable(), "{} unreferenced cached blocks, LRU has {}",
           num_unreferenced, num_evictable());
}

}  // namespace di
