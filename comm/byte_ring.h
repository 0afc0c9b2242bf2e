// A byte stream in memory that two processes map (or two threads share), and whole
// messages over it: how the engine's negotiation messages travel between ranks of one
// machine (control_channel.h). Pure code, tested in one process. Internal to comm/.
#ifndef WEFT_COMM_BYTE_RING_H_
#define WEFT_COMM_BYTE_RING_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

namespace weft {
namespace comm {

// A byte stream from one thread (or process) to one other, in memory both map: a header
// with the two positions, then `capacity` bytes (a power of two) used round and round.
// Writers and readers only ever block each other by having no room or no bytes.
class ByteRing {
 public:
  // Bytes `memory` must span for a ring of `capacity` bytes, a multiple of 64; it starts on a
  // 64-byte boundary (as mapped memory does), so rings laid end to end all do.
  static size_t Footprint(size_t capacity);
  // Zeroes the positions: once, by one process, before either side uses the ring.
  static void Initialize(void* memory);
  ByteRing(void* memory, size_t capacity);

  // Writer: copies as many of the `n` bytes as fit; returns how many.
  size_t Write(const char* data, size_t n);
  // Reader: copies up to `n` of the bytes written and not read yet; returns how many.
  size_t Read(char* data, size_t n);

 private:
  struct Header;
  Header* header_;
  char* data_;
  size_t capacity_;
};

// Whole messages over a ByteRing, each sent as its length and its bytes. A message longer
// than the room left goes in pieces as the reader makes room: the sender keeps what has not
// gone yet (Flush moves it on), the receiver what has come so far.
class RingSender {
 public:
  explicit RingSender(ByteRing ring) : ring_(ring) {}
  // Queues `bytes` and writes what fits now.
  void Send(std::shared_ptr<const std::string> bytes);
  // Writes what fits of the queued messages; true when none is left.
  bool Flush();
  bool idle() const { return queue_.empty(); }

 private:
  struct Pending {
    uint64_t length;  // in the host's byte order: both sides are on one host
    std::shared_ptr<const std::string> bytes;
    size_t done = 0;  // of sizeof(length) + length
  };
  ByteRing ring_;
  std::deque<Pending> queue_;
};

class RingReceiver {
 public:
  explicit RingReceiver(ByteRing ring) : ring_(ring) {}
  // A whole message, if one has arrived (its pieces are kept until then).
  bool Receive(std::string* bytes);

 private:
  ByteRing ring_;
  char length_bytes_[sizeof(uint64_t)];
  size_t length_got_ = 0;
  std::string body_;
  size_t body_got_ = 0;
};

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_BYTE_RING_H_
