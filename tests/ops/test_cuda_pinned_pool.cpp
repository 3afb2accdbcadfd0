// PinnedHostPool (backend/cuda/pinned_pool.h): blocks are reused after release, bounded by the
// cache limit, outlive the pool, and CudaBackend::download into them returns the device bytes.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/pinned_pool.h"

namespace di::cuda {
namespace {

TEST(PinnedHostPool, ReusesReleasedBlocksOfTheSameSizeClass) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible";
  PinnedHostPool pool(size_t{64} << 20);
  void* a = nullptr;
  std::shared_ptr<void> owner = pool.allocate(3 << 20, &a);
  ASSERT_NE(owner, nullptr);
  ASSERT_NE(a, nullptr);
  std::memset(a, 1, 3 << 20);  // the whole requested size is writable host memory
  EXPECT_EQ(pool.bytes_cached(), 0u);
  owner.reset();
  EXPECT_EQ(pool.bytes_cached(), size_t{4} << 20);  // power-of-two size class
  void* b = nullptr;
  owner = pool.allocate((3 << 20) + 17, &b);
  EXPECT_EQ(b, a);  // same class: the cached block again
  EXPECT_EQ(pool.bytes_cached(), 0u);
  void* c = nullptr;
  std::shared_ptr<void> other = pool.allocate(5 << 20, &c);
  EXPECT_NE(c, a);  // another class: a new block
  other.reset();
  owner.reset();
  pool.check_integrity();
  EXPECT_EQ(pool.bytes_cached(), size_t{12} << 20);  // 4 MB + 8 MB classes
}

TEST(PinnedHostPool, CachesAtMostTheLimitAndBlocksOutliveThePool) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible";
  std::shared_ptr<void> survivor;
  {
    PinnedHostPool pool(size_t{1} << 20);
    void* p = nullptr;
    auto x = pool.allocate(1 << 20, &p);
    auto y = pool.allocate(1 << 20, &p);
    x.reset();
    y.reset();  // over the 1 MB limit: freed, not cached
    EXPECT_EQ(pool.bytes_cached(), size_t{1} << 20);
    pool.check_integrity();
    survivor = pool.allocate(1 << 20, &p);
    std::memset(p, 7, 1 << 20);
  }
  survivor.reset();  // released after the pool: freed without touching it
  SUCCEED();
}

TEST(PinnedHostPool, DownloadsOfLogitsSizeMatchTheDevice) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible";
  CudaBackend be(DType::kBF16);
  for (int64_t rows : {1, 3, 33}) {  // 0.5 MB .. 17 MB: pinned; below 256 KB: pageable
    Tensor host = Tensor::empty({rows, 129280}, DType::kF32);
    std::iota(host.data<float>(), host.data<float>() + host.numel(), 0.5f);
    const Tensor dev = be.upload(host, DType::kF32);
    for (int rep = 0; rep < 3; ++rep) {  // the second and third reuse the cached block
      const Tensor back = be.download(dev);
      ASSERT_EQ(back.numel(), host.numel());
      EXPECT_EQ(std::memcmp(back.raw(), host.raw(), host.nbytes()), 0) << rows << " rows";
    }
  }
  const Tensor small = be.upload(Tensor::empty({4, 4}, DType::kF32), DType::kF32);
  EXPECT_EQ(be.download(small).numel(), 16);
}

}  // namespace
}  // namespace di::cuda
