#include <gtest/gtest.h>

#include <set>

#include "sampling/philox.h"

namespace di::sampling {
namespace {

// Random123 tests/kat_vectors, the three "philox4x32 10" lines: counter, key -> output.
TEST(Philox, KnownAnswerVectors) {
  struct Kat {
    PhiloxCounter ctr;
    PhiloxKey key;
    PhiloxCounter expected;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, {{0, 0}}, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       {{0xffffffff, 0xffffffff}},
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       {{0xa4093822, 0x299f31d0}},
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Kat& k : kats) {
    PhiloxCounter out = philox4x32_10(k.ctr, k.key);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out.v[i], k.expected.v[i]) << "word " << i;
  }
}

TEST(Philox, UniformIsInRangeAndDependsOnSeedPositionStream) {
  double sum = 0.0;
  std::set<float> distinct;
  const int n = 100000;
  for (int64_t pos = 0; pos < n; ++pos) {
    float u = sampling_uniform(42, pos);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    distinct.insert(u);
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
  EXPECT_GT(distinct.size(), static_cast<size_t>(n * 0.99));
  EXPECT_EQ(sampling_uniform(42, 7), sampling_uniform(42, 7));
  EXPECT_NE(sampling_uniform(42, 7), sampling_uniform(43, 7));
  EXPECT_NE(sampling_uniform(42, 7), sampling_uniform(42, 7, 1));
  // The high words of seed and position take part too.
  EXPECT_NE(sampling_uniform(1, 7), sampling_uniform(1 + (uint64_t{1} << 32), 7));
  EXPECT_NE(sampling_uniform(1, 7), sampling_uniform(1, 7 + (int64_t{1} << 32)));
  EXPECT_EQ(u32_to_unit_float(0xffffffffu), 1.0f - 1.0f / 16777216.0f);
}

}  // namespace
}  // namespace di::sampling
