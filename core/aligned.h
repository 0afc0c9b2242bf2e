// Buffers that start on a 64-byte boundary (a cache line; PyTorch's CPU allocator places
// tensors so). Open MPI's copies into memory that starts 16 or 32 bytes past one took up to
// 1.7 times as long on the development VM (bench/README.md, "Buffer alignment"), so weft's
// own scratch and fusion buffers, which MPI writes into, are AlignedVectors.
#ifndef WEFT_CORE_ALIGNED_H_
#define WEFT_CORE_ALIGNED_H_

#include <cstddef>
#include <new>
#include <vector>

namespace weft {

constexpr size_t kBufferAlignment = 64;

// A std::allocator that aligns every block to kBufferAlignment.
template <typename T>
struct AlignedAllocator {
  using value_type = T;

  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) {}

  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kBufferAlignment)));
  }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(kBufferAlignment)); }

  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const AlignedAllocator<U>&) const {
    return false;
  }
};

template <typename T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

}  // namespace weft

#endif  // WEFT_CORE_ALIGNED_H_
