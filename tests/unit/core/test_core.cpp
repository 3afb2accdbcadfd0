#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "core/error.h"
#include "core/ids.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace di {
namespace {

TEST(Check, ThrowsWithMessageAndExpression) {
  try {
    int n = -3;
    DI_CHECK(n > 0, "expected a positive count, got {}", n);
    FAIL() << "DI_CHECK did not throw";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("got -3"), std::string::npos) << what;
    EXPECT_NE(what.find("n > 0"), std::string::npos) << what;
  }
}

TEST(Result, HoldsValueOrError) {
  Result<int> ok = 5;
  EXPECT_TRUE(ok.is_ok());
  EXPECT_EQ(ok.value(), 5);
  Result<int> bad = make_status(StatusCode::kNotFound, "no file {}", "x");
  EXPECT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(bad.status().to_string(), "not_found: no file x");
  EXPECT_THROW(bad.value(), Error);
}

TEST(StrongId, ComparesAndHashes) {
  BlockId a{3}, b{4};
  EXPECT_LT(a, b);
  EXPECT_EQ(a, BlockId{3});
  EXPECT_EQ(std::hash<BlockId>{}(a), std::hash<int32_t>{}(3));
}

TEST(DType, Bf16RoundTripAndRounding) {
  for (float f : {0.0f, 1.0f, -2.5f, 3.140625f, 65536.0f, -0.0078125f}) {
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(f)), f) << f;
  }
  // 1 + 2^-8 is a tie between bf16 1.0 and 1.0078125: round to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.00390625f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.01171875f)), 1.015625f);
}

TEST(DType, F16RoundTrip) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f}) {
    EXPECT_EQ(f16_to_f32(f32_to_f16(f)), f) << f;
  }
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
}

TEST(DType, Fp8E4M3AllCodesRoundTrip) {
  int finite = 0;
  for (int code = 0; code < 256; ++code) {
    float v = fp8e4m3_to_f32(static_cast<uint8_t>(code));
    if (std::isnan(v)) continue;
    ++finite;
    uint8_t back = f32_to_fp8e4m3(v);
    if (v == 0.0f) {
      EXPECT_EQ(back & 0x7f, 0);
    } else {
      EXPECT_EQ(back, code) << "value " << v;
    }
  }
  EXPECT_EQ(finite, 254);
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f32_to_fp8e4m3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(fp8e4m3_to_f32(0x01), 1.0f / 512.0f);
}

TEST(Tensor, ReshapeSliceConvert) {
  Tensor t = Tensor::empty({4, 6}, DType::kF32);
  for (int i = 0; i < 24; ++i) t.f32()[i] = static_cast<float>(i);
  Tensor r = t.reshape({2, -1});
  EXPECT_EQ(r.shape(), (Shape{2, 12}));
  Tensor row = t[2];
  EXPECT_EQ(row.shape(), (Shape{6}));
  EXPECT_EQ(row.f32()[0], 12.0f);
  Tensor b = t.to(DType::kBF16);
  Tensor back = b.to_f32();
  for (int i = 0; i < 24; ++i) EXPECT_EQ(back.f32()[i], static_cast<float>(i));
  EXPECT_THROW(t.reshape({5, 5}), Error);
  EXPECT_THROW(check_shape(t, {4, 5}, "w"), Error);
}

TEST(ThreadPool, CoversRangeExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {1, 7, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallel_for(n, 3, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
}

// Two threads sharing one pool (the engine thread and an HTTP worker both use the global pool):
// each call covers its own range exactly once, whoever gets the workers.
TEST(ThreadPool, ConcurrentCallersEachCoverTheirRange) {
  ThreadPool pool(4);
  auto caller = [&pool](int64_t n) {
    for (int rep = 0; rep < 300; ++rep) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
  };
  std::thread a(caller, 97), b(caller, 61);
  a.join();
  b.join();
}

}  // namespace
}  // namespace di
