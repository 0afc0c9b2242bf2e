#include "core/aligned.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace weft {
namespace {

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kBufferAlignment == 0; }

TEST(AlignedVector, EveryBlockStartsOnTheBoundary) {
  // Sizes malloc serves from its bins, from the top of the heap and from mmap.
  for (size_t n :
       {size_t{1}, size_t{3}, size_t{17}, size_t{4096}, size_t{1} << 20, size_t{40} << 20}) {
    AlignedVector<char> bytes(n, 'x');
    EXPECT_TRUE(Aligned(bytes.data())) << n;
    AlignedVector<float> floats(n);
    EXPECT_TRUE(Aligned(floats.data())) << n;
  }
}

TEST(AlignedVector, GrowingKeepsTheContentsAndTheAlignment) {
  AlignedVector<int> v;
  for (int i = 0; i < 100000; ++i) {
    v.push_back(i);
    ASSERT_TRUE(Aligned(v.data())) << v.size();
  }
  for (int i = 0; i < 100000; ++i) ASSERT_EQ(v[i], i);
  std::vector<AlignedVector<char>> nested(5, AlignedVector<char>(333, 'y'));
  for (const auto& inner : nested) {
    EXPECT_TRUE(Aligned(inner.data()));
    EXPECT_EQ(inner.back(), 'y');
  }
}

}  // namespace
}  // namespace weft
