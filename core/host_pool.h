// Host memory for op outputs that weft allocates, with freed blocks kept for reuse.
//
// An out-of-place op hands its caller a new output on every call. Memory fresh from the
// kernel costs a page fault per page, paid in whichever process touches it first (Open
// MPI's shared-memory transport writes straight into a peer's pages), so a 16 MiB output
// took two to three times as long as the op itself on the development VM. Blocks of
// kMinCachedBytes and more therefore go back to a free list of their rounded size when
// released, up to WEFT_OUTPUT_CACHE_BYTES in all, and the next output of that size reuses
// pages that are already mapped. Blocks of 2 MiB and more are 2 MiB aligned and marked for
// transparent huge pages (where the kernel leaves that to madvise), which cuts the faults
// and the TLB misses of large buffers by 512.
// New blocks are not pre-faulted: MADV_POPULATE_WRITE made no measured difference to an
// out-of-place call whose output the cache could not serve (bench/README.md, "Pre-faulting").
#ifndef WEFT_CORE_HOST_POOL_H_
#define WEFT_CORE_HOST_POOL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace weft {

class HostPool {
 public:
  // Smaller blocks come from malloc and go back to it (its own free lists serve them well).
  static constexpr size_t kMinCachedBytes = size_t{64} << 10;
  // Every block's alignment at least (what NumPy and vectorized kernels like).
  static constexpr size_t kAlignment = 64;

  // The process's pool (never destroyed: outputs may outlive every other object).
  static HostPool& Global();

  // A block of at least `bytes` bytes (at least one byte), 64-byte aligned, uninitialized;
  // nullptr when memory is exhausted. Give it back with Release(data, bytes), same bytes.
  void* Allocate(size_t bytes);
  void Release(void* data, size_t bytes);

  // Frees every cached block.
  void Trim();

  struct Stats {
    int64_t reused = 0;        // allocations served from the cache
    int64_t allocated = 0;     // allocations of new memory (cached sizes only)
    int64_t cached_bytes = 0;  // bytes on the free lists now
  };
  Stats stats() const;

  // The size a block of `bytes` occupies (what the free lists are keyed by).
  static size_t RoundedSize(size_t bytes);

 private:
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // by rounded size
  Stats stats_;
};

}  // namespace weft

#endif  // WEFT_CORE_HOST_POOL_H_
