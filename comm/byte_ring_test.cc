#include "comm/byte_ring.h"

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace weft {
namespace comm {
namespace {

// Ring memory as a process would map it: 64-byte aligned, positions zeroed once.
class RingMemory {
 public:
  explicit RingMemory(size_t capacity) : capacity_(capacity) {
    const size_t bytes = (ByteRing::Footprint(capacity) + 63) / 64 * 64;
    memory_.reset(static_cast<char*>(std::aligned_alloc(64, bytes)));
    ByteRing::Initialize(memory_.get());
  }
  ByteRing ring() { return ByteRing(memory_.get(), capacity_); }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  size_t capacity_;
  std::unique_ptr<char, Free> memory_;
};

// Bytes that differ from message to message and from position to position.
std::string Message(int index, size_t length) {
  std::string s(length, '\0');
  for (size_t i = 0; i < length; ++i) s[i] = static_cast<char>(index * 131 + i * 7 + (i >> 8));
  return s;
}

TEST(ByteRing, WritesWhatFitsAndReadsWhatWasWritten) {
  RingMemory memory(16);
  ByteRing writer = memory.ring();
  ByteRing reader = memory.ring();
  char out[32];
  EXPECT_EQ(reader.Read(out, sizeof(out)), 0u);
  EXPECT_EQ(writer.Write("abcdefghij", 10), 10u);
  EXPECT_EQ(writer.Write("0123456789", 10), 6u);  // room for 6 more
  EXPECT_EQ(writer.Write("x", 1), 0u);            // full
  EXPECT_EQ(reader.Read(out, 4), 4u);
  EXPECT_EQ(std::string(out, 4), "abcd");
  // Across the end of the buffer: the 4 bytes read made room at its start.
  EXPECT_EQ(writer.Write("KLMNOP", 6), 4u);
  EXPECT_EQ(reader.Read(out, sizeof(out)), 16u);
  EXPECT_EQ(std::string(out, 16), "efghij012345KLMN");
  EXPECT_EQ(reader.Read(out, sizeof(out)), 0u);
}

TEST(ByteRing, KeepsEveryByteInOrderOverManyTurns) {
  RingMemory memory(64);
  ByteRing writer = memory.ring();
  ByteRing reader = memory.ring();
  const std::string all = Message(3, 10000);
  std::string got;
  std::mt19937 random(7);
  size_t sent = 0;
  while (got.size() < all.size()) {
    sent += writer.Write(all.data() + sent, std::min<size_t>(random() % 50, all.size() - sent));
    char out[64];
    got.append(out, reader.Read(out, random() % 50));
  }
  EXPECT_EQ(got, all);
}

TEST(RingMessages, ArriveWholeAndInOrderWhateverTheirLength) {
  constexpr size_t kCapacity = 256;
  RingMemory memory(kCapacity);
  RingSender sender(memory.ring());
  RingReceiver receiver(memory.ring());
  // Empty, small, about the ring's size, and several rings long (sent in pieces).
  const std::vector<size_t> lengths = {
      0, 1, 7, 8, 9, 100, kCapacity - 8, kCapacity - 7, kCapacity, kCapacity + 1, 3 * kCapacity + 5,
      0, 2};
  for (size_t i = 0; i < lengths.size(); ++i) {
    sender.Send(std::make_shared<const std::string>(Message(static_cast<int>(i), lengths[i])));
  }
  EXPECT_FALSE(sender.idle());
  std::string got;
  for (size_t i = 0; i < lengths.size(); ++i) {
    int polls = 0;
    while (!receiver.Receive(&got)) {
      ASSERT_LT(++polls, 100) << "message " << i << " never arrived";
      sender.Flush();
    }
    EXPECT_EQ(got, Message(static_cast<int>(i), lengths[i])) << "message " << i;
  }
  EXPECT_TRUE(sender.Flush());
  EXPECT_TRUE(sender.idle());
  EXPECT_FALSE(receiver.Receive(&got));
}

TEST(RingMessages, CrossBetweenThreads) {
  // Two threads as two processes would: one only sends, the other only receives.
  for (size_t capacity : {size_t{64}, size_t{4096}}) {
    RingMemory memory(capacity);
    constexpr int kMessages = 3000;
    std::vector<size_t> lengths(kMessages);
    std::mt19937 random(11);
    for (size_t& length : lengths) length = random() % (capacity * 5 / 2);
    std::thread producer([&] {
      RingSender sender(memory.ring());
      for (int i = 0; i < kMessages; ++i) {
        sender.Send(std::make_shared<const std::string>(Message(i, lengths[i])));
        if (i % 16 == 0) {
          while (!sender.Flush()) std::this_thread::yield();
        }
      }
      while (!sender.Flush()) std::this_thread::yield();
    });
    RingReceiver receiver(memory.ring());
    std::string got;
    int wrong = 0;
    for (int i = 0; i < kMessages; ++i) {
      while (!receiver.Receive(&got)) std::this_thread::yield();
      if (got != Message(i, lengths[i])) ++wrong;
    }
    producer.join();
    EXPECT_EQ(wrong, 0) << "ring of " << capacity << " bytes";
    EXPECT_FALSE(receiver.Receive(&got));
  }
}

}  // namespace
}  // namespace comm
}  // namespace weft
