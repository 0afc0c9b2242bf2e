#include "core/host_pool.h"

#include <sys/mman.h>

#include <cstdlib>

#include "core/config.h"

namespace weft {
namespace {

const config::IntSetting kOutputCacheBytes(
    "WEFT_OUTPUT_CACHE_BYTES", int64_t{256} << 20,
    "Freed outputs of 64 KiB and more that weft keeps per process for reuse by later "
    "outputs of the same size, in bytes (0: none).",
    /*min=*/0);

constexpr size_t kHugePage = size_t{2} << 20;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

void* NewBlock(size_t rounded) {
  const size_t align = rounded >= kHugePage ? kHugePage : HostPool::kAlignment;
  void* data = nullptr;
  if (posix_memalign(&data, align, rounded) != 0) return nullptr;
  // Only advice: where transparent huge pages are off (or always on) nothing changes.
  if (align == kHugePage) madvise(data, rounded, MADV_HUGEPAGE);
  return data;
}

}  // namespace

HostPool& HostPool::Global() {
  static HostPool* pool = new HostPool();
  return *pool;
}

size_t HostPool::RoundedSize(size_t bytes) {
  if (bytes < kMinCachedBytes) return RoundUp(bytes == 0 ? 1 : bytes, kAlignment);
  // 64 KiB steps below 4 MiB, 2 MiB steps above: at most 1/32 of a block is slack once a
  // block is large enough for huge pages.
  return bytes < (size_t{4} << 20) ? RoundUp(bytes, size_t{64} << 10) : RoundUp(bytes, kHugePage);
}

void* HostPool::Allocate(size_t bytes) {
  const size_t rounded = RoundedSize(bytes);
  if (rounded < kMinCachedBytes) return NewBlock(rounded);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(rounded);
    if (it != free_.end() && !it->second.empty()) {
      void* data = it->second.back();
      it->second.pop_back();
      stats_.cached_bytes -= static_cast<int64_t>(rounded);
      ++stats_.reused;
      return data;
    }
    ++stats_.allocated;
  }
  return NewBlock(rounded);
}

void HostPool::Release(void* data, size_t bytes) {
  if (data == nullptr) return;
  const size_t rounded = RoundedSize(bytes);
  if (rounded >= kMinCachedBytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stats_.cached_bytes + static_cast<int64_t>(rounded) <= kOutputCacheBytes.Get()) {
      free_[rounded].push_back(data);
      stats_.cached_bytes += static_cast<int64_t>(rounded);
      return;
    }
  }
  std::free(data);
}

void HostPool::Trim() {
  std::map<size_t, std::vector<void*>> blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    blocks.swap(free_);
    stats_.cached_bytes = 0;
  }
  for (auto& [size, list] : blocks) {
    for (void* data : list) std::free(data);
  }
}

HostPool::Stats HostPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace weft
