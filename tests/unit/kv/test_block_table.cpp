#include <gtest/gtest.h>

#include "core/error.h"
#include "kv/block_table.h"

namespace di {
namespace {

TEST(PagedBatch, CsrViewAndSlotMapping) {
  BlockTable t0{BlockId(7), BlockId(2), BlockId(5)};
  BlockTable t1{BlockId(3), BlockId(9), BlockId(4)};  // more blocks than the step needs
  std::vector<PagedBatchEntry> entries{{t0, 149, 1}, {t1, 60, 40}};
  PagedBatchView v = build_paged_batch(entries, 64);
  EXPECT_EQ(v.indptr, (std::vector<int32_t>{0, 3, 5}));
  EXPECT_EQ(v.indices, (std::vector<int32_t>{7, 2, 5, 3, 9}));
  EXPECT_EQ(v.last_len, (std::vector<int32_t>{22, 36}));
  ASSERT_EQ(v.slot_block_ids.size(), 41u);
  EXPECT_EQ(v.slot_block_ids[0], 5);
  EXPECT_EQ(v.slot_offsets[0], 21);   // position 149 = block 2, slot 21
  EXPECT_EQ(v.slot_block_ids[1], 3);  // position 60 of seq 1
  EXPECT_EQ(v.slot_offsets[1], 60);
  EXPECT_EQ(v.slot_block_ids[5], 9);  // position 64 starts block 1
  EXPECT_EQ(v.slot_offsets[5], 0);
  EXPECT_EQ(v.slot_offsets[40], 35);  // position 99
}

TEST(PagedBatch, LastLenIsOneToBlockSize) {
  BlockTable t{BlockId(0), BlockId(1)};
  std::vector<PagedBatchEntry> full{{t, 0, 64}};
  EXPECT_EQ(build_paged_batch(full, 64).last_len[0], 64);
  std::vector<PagedBatchEntry> one{{t, 64, 1}};
  PagedBatchView v = build_paged_batch(one, 64);
  EXPECT_EQ(v.last_len[0], 1);
  EXPECT_EQ(v.indptr.back(), 2);
  std::vector<PagedBatchEntry> block1{{t, 0, 2}};
  EXPECT_EQ(build_paged_batch(block1, 1).last_len[0], 1);  // block size 1
}

TEST(PagedBatch, RejectsTablesTooShortAndEmptySteps) {
  BlockTable t{BlockId(0)};
  std::vector<PagedBatchEntry> too_long{{t, 60, 5}};
  EXPECT_THROW(build_paged_batch(too_long, 64), Error);
  std::vector<PagedBatchEntry> empty{{t, 3, 0}};
  EXPECT_THROW(build_paged_batch(empty, 64), Error);
}

}  // namespace
}  // namespace di
