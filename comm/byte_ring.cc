#include "comm/byte_ring.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>

namespace weft {
namespace comm {

static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "the rings' positions are shared between processes");

// The positions count every byte ever written and read; each side stores only its own, on
// a cache line of its own.
struct ByteRing::Header {
  alignas(64) std::atomic<uint64_t> written;
  alignas(64) std::atomic<uint64_t> read;
};

size_t ByteRing::Footprint(size_t capacity) {
  return (sizeof(Header) + capacity + 63) / 64 * 64;  // the next ring's header on a boundary
}

void ByteRing::Initialize(void* memory) {
  Header* header = new (memory) Header;
  header->written.store(0, std::memory_order_relaxed);
  header->read.store(0, std::memory_order_relaxed);
}

ByteRing::ByteRing(void* memory, size_t capacity)
    : header_(static_cast<Header*>(memory)),
      data_(static_cast<char*>(memory) + sizeof(Header)),
      capacity_(capacity) {}

size_t ByteRing::Write(const char* data, size_t n) {
  const uint64_t written = header_->written.load(std::memory_order_relaxed);
  // Acquire: the reader is done with the bytes it has released.
  const uint64_t read = header_->read.load(std::memory_order_acquire);
  n = std::min<size_t>(n, capacity_ - static_cast<size_t>(written - read));
  if (n == 0) return 0;
  const size_t at = static_cast<size_t>(written) & (capacity_ - 1);
  const size_t first = std::min(n, capacity_ - at);
  std::memcpy(data_ + at, data, first);
  std::memcpy(data_, data + first, n - first);
  header_->written.store(written + n, std::memory_order_release);
  return n;
}

size_t ByteRing::Read(char* data, size_t n) {
  const uint64_t read = header_->read.load(std::memory_order_relaxed);
  const uint64_t written = header_->written.load(std::memory_order_acquire);
  n = std::min<size_t>(n, static_cast<size_t>(written - read));
  if (n == 0) return 0;
  const size_t at = static_cast<size_t>(read) & (capacity_ - 1);
  const size_t first = std::min(n, capacity_ - at);
  std::memcpy(data, data_ + at, first);
  std::memcpy(data + first, data_, n - first);
  header_->read.store(read + n, std::memory_order_release);
  return n;
}

void RingSender::Send(std::shared_ptr<const std::string> bytes) {
  const uint64_t length = bytes->size();
  queue_.push_back(Pending{length, std::move(bytes)});
  if (queue_.size() == 1) Flush();
}

bool RingSender::Flush() {
  while (!queue_.empty()) {
    Pending& p = queue_.front();
    constexpr size_t kHead = sizeof(p.length);
    if (p.done < kHead) {
      p.done += ring_.Write(reinterpret_cast<const char*>(&p.length) + p.done, kHead - p.done);
      if (p.done < kHead) return false;
    }
    const size_t body = p.done - kHead;
    p.done += ring_.Write(p.bytes->data() + body, p.bytes->size() - body);
    if (p.done < kHead + p.bytes->size()) return false;
    queue_.pop_front();
  }
  return true;
}

bool RingReceiver::Receive(std::string* bytes) {
  constexpr size_t kHead = sizeof(length_bytes_);
  if (length_got_ < kHead) {
    length_got_ += ring_.Read(length_bytes_ + length_got_, kHead - length_got_);
    if (length_got_ < kHead) return false;
    uint64_t length = 0;
    std::memcpy(&length, length_bytes_, kHead);
    body_.resize(static_cast<size_t>(length));
    body_got_ = 0;
  }
  body_got_ += ring_.Read(&body_[0] + body_got_, body_.size() - body_got_);
  if (body_got_ < body_.size()) return false;
  bytes->swap(body_);
  body_.clear();
  length_got_ = 0;
  return true;
}

}  // namespace comm
}  // namespace weft
