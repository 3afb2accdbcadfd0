#include "kv/block_pool.h"

#include "core/error.h"

namespace di {

BlockPool::BlockPool(int32_t num_blocks, int32_t block_size)
    : block_size_(block_size), ref_counts_(num_blocks, 0), is_free_(num_blocks, true) {
  DI_CHECK(num_blocks > 0, "num_blocks must be positive, got {}", num_blocks);
  DI_CHECK(block_size > 0, "block_size must be positive, got {}", block_size);
  free_.reserve(num_blocks);
  for (int32_t i = num_blocks - 1; i >= 0; --i) free_.push_back(BlockId(i));
}

std::vector<BlockId> BlockPool::allocate(int32_t num) {
  DI_CHECK(can_allocate(num), "cannot allocate {} blocks: {} free", num, num_free());
  std::vector<BlockId> out;
  out.reserve(num);
  for (int32_t i = 0; i < num; ++i) {
    BlockId b = free_.back();
    free_.pop_back();
    is_free_[b.value()] = false;
    ref_counts_[b.value()] = 1;
    out.push_back(b);
  }
  return out;
}

void BlockPool::incref(BlockId block) {
  check_id(block);
  DI_CHECK(!is_free_[block.value()], "incref of free block {}", block.value());
  ++ref_counts_[block.value()];
}

int32_t BlockPool::decref(BlockId block) {
  check_id(block);
  DI_CHECK(ref_counts_[block.value()] > 0, "decref of unreferenced block {}", block.value());
  return --ref_counts_[block.value()];
}

void BlockPool::release(BlockId block) {
  check_id(block);
  DI_CHECK(ref_counts_[block.value()] == 0, "release of block {} with {} references", block.value(),
           ref_counts_[block.value()]);
  DI_CHECK(!is_free_[block.value()], "double release of block {}", block.value());
  is_free_[block.value()] = true;
  free_.push_back(block);
}

int32_t BlockPool::ref_count(BlockId block) const {
  check_id(block);
  return ref_counts_[block.value()];
}

bool BlockPool::is_free(BlockId block) const {
  check_id(block);
  return is_free_[block.value()];
}

void BlockPool::check_id(BlockId block) const {
  DI_CHECK(block.value() >= 0 && block.value() < num_blocks(), "block id {} out of [0, {})",
           block.value(), num_blocks());
}

void BlockPool::check_integrity() const {
  std::vector<bool> seen(ref_counts_.size(), false);
  for (BlockId b : free_) {
    check_id(b);
    DI_CHECK(!seen[b.value()], "block {} is on the free list twice", b.value());
    seen[b.value()] = true;
    DI_CHECK(ref_counts_[b.value()] == 0, "free block {} has ref count {}", b.value(),
             ref_counts_[b.value()]);
  }
  for (size_t i = 0; i < ref_counts_.size(); ++i) {
    DI_CHECK(seen[i] == is_free_[i], "block {}: on free list {} but is_free {}", i, seen[i],
             is_free_[i]);
    DI_CHECK(ref_counts_[i] >= 0, "block {} has negative ref count {}", i, ref_counts_[i]);
  }
}

}  // namespace di
