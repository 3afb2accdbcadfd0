#include <gtest/gtest.h>

#include "core/error.h"
#include "kv/block_pool.h"
#include "kv/prefix_cache.h"

namespace di {
namespace {

TEST(BlockPool, AllocateAndReleaseWithRefCounts) {
  BlockPool pool(4, 64);
  EXPECT_TRUE(pool.can_allocate(4));
  EXPECT_FALSE(pool.can_allocate(5));
  std::vector<BlockId> a = pool.allocate(3);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[0], BlockId(0));  // fresh pool: lowest id first
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_FALSE(pool.can_allocate(2));
  pool.incref(a[1]);
  EXPECT_EQ(pool.ref_count(a[1]), 2);
  EXPECT_EQ(pool.decref(a[1]), 1);
  EXPECT_EQ(pool.decref(a[1]), 0);
  pool.release(a[1]);
  EXPECT_TRUE(pool.is_free(a[1]));
  EXPECT_EQ(pool.num_free(), 2);
  pool.check_integrity();
  // The most recently released block is handed out first.
  EXPECT_EQ(pool.allocate(1)[0], a[1]);
  pool.check_integrity();
}

TEST(BlockPool, RejectsMisuse) {
  BlockPool pool(2, 4);
  std::vector<BlockId> a = pool.allocate(1);
  EXPECT_THROW(pool.release(a[0]), Error);          // still referenced
  EXPECT_THROW(pool.incref(BlockId(1)), Error);     // free block
  EXPECT_THROW(pool.ref_count(BlockId(2)), Error);  // out of range
  EXPECT_THROW(pool.allocate(2), Error);            // only one free
  EXPECT_EQ(pool.decref(a[0]), 0);
  EXPECT_THROW(pool.decref(a[0]), Error);
  pool.release(a[0]);
  EXPECT_THROW(pool.release(a[0]), Error);  // double release
  pool.check_integrity();
}

TEST(PrefixCache, LruParksOnlyUnreferencedBlocksAndEvictsOldestFirst) {
  BlockPool pool(4, 4);
  PrefixCache cache(4);
  std::vector<BlockId> b = pool.allocate(3);
  BlockHash h[3];
  for (int i = 0; i < 3; ++i) {
    h[i].bytes[0] = static_cast<uint8_t>(i + 1);
    EXPECT_TRUE(cache.insert(h[i], b[i]));
  }
  BlockHash dup = h[0];
  std::vector<BlockId> extra = pool.allocate(1);
  EXPECT_FALSE(cache.insert(dup, extra[0]));  // hash already names b[0]
  EXPECT_FALSE(cache.is_cached(extra[0]));
  cache.check_integrity(pool);
  EXPECT_EQ(cache.evict(), std::nullopt);  // all referenced
  for (int i : {2, 0, 1}) {
    pool.decref(b[i]);
    cache.park(b[i]);
  }
  cache.check_integrity(pool);
  pool.incref(b[0]);  // a hit revives b[0]
  cache.unpark(b[0]);
  cache.check_integrity(pool);
  EXPECT_EQ(cache.evict(), b[2]);
  pool.release(b[2]);
  EXPECT_EQ(cache.find(h[2]), std::nullopt);
  EXPECT_EQ(cache.evict(), b[1]);
  pool.release(b[1]);
  EXPECT_EQ(cache.evict(), std::nullopt);
  EXPECT_EQ(cache.find(h[0]), b[0]);
  cache.check_integrity(pool);
}

}  // namespace
}  // namespace di
