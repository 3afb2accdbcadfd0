#include <gtest/gtest.h>

#include "kv/block_hash.h"

namespace di {
namespace {

// Known answers computed independently with Python hashlib from the layout in block_hash.h:
//   sha256(pack('<I', len(salt)) + salt + pack('<I', len(model)) + model + tokens as '<I')
TEST(BlockHash, MatchesTheWireFormat) {
  std::vector<TokenId> tokens{1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<BlockHash> h;
  extend_block_hashes(h, tokens, 4, "m", "");
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0].hex(), "d9c2c1a6d8547f71ff9c945b240b3bac6afe549d6f9b3b47b5cfbd1daeb2e40c");
  EXPECT_EQ(h[1].hex(), "e867f56c6cf5b28bda9149bc59e632734f1fe8adb6f2591b6d51c21c54b1576f");
  std::vector<BlockHash> salted;
  extend_block_hashes(salted, tokens, 4, "m", "tenant-a");
  EXPECT_EQ(salted[0].hex(), "9c3019d7339155418f5dfb278dd5f83557d2f25e7d67e855313f3dfd85241433");
  EXPECT_NE(salted[1], h[1]);  // the salt of block 0 flows down the chain
}

TEST(BlockHash, OnlyFullBlocksAndIncrementalExtensionAgrees) {
  std::vector<TokenId> tokens;
  std::vector<BlockHash> incremental;
  for (TokenId t = 0; t < 23; ++t) {
    tokens.push_back(t * 7);
    extend_block_hashes(incremental, tokens, 4, "model", "s");
    EXPECT_EQ(incremental.size(), tokens.size() / 4);
  }
  std::vector<BlockHash> at_once;
  extend_block_hashes(at_once, tokens, 4, "model", "s");
  EXPECT_EQ(incremental, at_once);
}

TEST(BlockHash, FieldsAreLengthPrefixed) {
  std::vector<TokenId> tokens{1, 2, 3, 4};
  BlockHash a = hash_block(nullptr, "ab", "c", tokens);
  BlockHash b = hash_block(nullptr, "a", "bc", tokens);
  EXPECT_NE(a, b);
  EXPECT_NE(hash_block(nullptr, "", "m1", tokens), hash_block(nullptr, "", "m2", tokens));
  std::vector<TokenId> other{1, 2, 3, 5};
  EXPECT_NE(hash_block(nullptr, "", "m", tokens), hash_block(nullptr, "", "m", other));
}

TEST(BlockHash, SameBlockUnderDifferentParentsDiffers) {
  std::vector<TokenId> x{9, 9, 9, 9}, p1{1, 1, 1, 1}, p2{2, 2, 2, 2};
  BlockHash h1 = hash_block(nullptr, "", "m", p1);
  BlockHash h2 = hash_block(nullptr, "", "m", p2);
  EXPECT_NE(hash_block(&h1, "", "m", x), hash_block(&h2, "", "m", x));
}

}  // namespace
}  // namespace di
