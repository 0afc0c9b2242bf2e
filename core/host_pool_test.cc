#include "core/host_pool.h"

#include <cstdint>
#include <cstring>

#include "core/config.h"
#include "gtest/gtest.h"

namespace weft {
namespace {

bool Aligned(const void* p, uintptr_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; }

TEST(HostPool, RoundsIntoFewSizes) {
  EXPECT_EQ(HostPool::RoundedSize(0), 64u);
  EXPECT_EQ(HostPool::RoundedSize(100), 128u);
  EXPECT_EQ(HostPool::RoundedSize(64 << 10), size_t{64} << 10);
  EXPECT_EQ(HostPool::RoundedSize((64 << 10) + 1), size_t{128} << 10);
  EXPECT_EQ(HostPool::RoundedSize((4 << 20) + 1), size_t{6} << 20);
  EXPECT_EQ(HostPool::RoundedSize(16 << 20), size_t{16} << 20);
}

TEST(HostPool, ReusesAReleasedBlockOfTheSameSize) {
  HostPool pool;
  const size_t bytes = (1 << 20) + 12;
  void* a = pool.Allocate(bytes);
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(Aligned(a, 64));
  std::memset(a, 1, bytes);  // the whole requested size is usable
  pool.Release(a, bytes);
  EXPECT_EQ(pool.stats().cached_bytes, static_cast<int64_t>(HostPool::RoundedSize(bytes)));
  // Another request that rounds to the same size gets the same pages.
  void* b = pool.Allocate(bytes + 100);
  EXPECT_EQ(b, a);
  EXPECT_EQ(pool.stats().reused, 1);
  EXPECT_EQ(pool.stats().cached_bytes, 0);
  // One of a different size does not.
  void* c = pool.Allocate(8 << 20);
  EXPECT_NE(c, a);
  EXPECT_TRUE(Aligned(c, 2 << 20));
  EXPECT_EQ(pool.stats().allocated, 2);
  pool.Release(b, bytes + 100);
  pool.Release(c, 8 << 20);
  pool.Trim();
  EXPECT_EQ(pool.stats().cached_bytes, 0);
}

TEST(HostPool, SmallBlocksAreNotCached) {
  HostPool pool;
  void* a = pool.Allocate(1000);
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(Aligned(a, 64));
  pool.Release(a, 1000);
  EXPECT_EQ(pool.stats().cached_bytes, 0);
  EXPECT_EQ(pool.stats().allocated, 0);
  pool.Release(nullptr, 10);  // nothing to do
}

TEST(HostPool, KeepsNoMoreThanTheLimit) {
  ASSERT_TRUE(config::Registry::Global().Set("WEFT_OUTPUT_CACHE_BYTES", "3145728").ok());
  HostPool pool;
  void* a = pool.Allocate(2 << 20);
  void* b = pool.Allocate(2 << 20);
  pool.Release(a, 2 << 20);
  pool.Release(b, 2 << 20);  // over 3 MiB: freed, not kept
  EXPECT_EQ(pool.stats().cached_bytes, 2 << 20);
  ASSERT_TRUE(config::Registry::Global().Set("WEFT_OUTPUT_CACHE_BYTES", "0").ok());
  void* c = pool.Allocate(2 << 20);
  pool.Release(c, 2 << 20);
  EXPECT_EQ(pool.stats().cached_bytes, 0);
  config::Registry::Global().Unset("WEFT_OUTPUT_CACHE_BYTES");
}

}  // namespace
}  // namespace weft
