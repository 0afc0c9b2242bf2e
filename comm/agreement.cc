#include "comm/agreement.h"

#include <algorithm>
#include <cassert>

namespace weft {
namespace comm {
namespace {

// A word: bits 0-15 how many ranks counted in, bit 16 withdrawn, the rest the op's number
// plus one (0: no op yet, as in zeroed memory).
constexpr uint64_t kCountMask = 0xFFFF;
constexpr uint64_t kWithdrawn = uint64_t{1} << 16;
constexpr int kNumberShift = 17;

int64_t NumberOf(uint64_t w) { return static_cast<int64_t>(w >> kNumberShift) - 1; }
int CountOf(uint64_t w) { return static_cast<int>(w & kCountMask); }
bool WithdrawnIn(uint64_t w) { return (w & kWithdrawn) != 0; }
uint64_t Word(int64_t number, int count, bool withdrawn) {
  return (static_cast<uint64_t>(number + 1) << kNumberShift) | (withdrawn ? kWithdrawn : 0) |
         static_cast<uint64_t>(count);
}

constexpr size_t kLine = 64;

}  // namespace

// One rank's facts for the op of a word. `number` (the op's plus one) is written last and
// cleared first, so a reader that finds its op's number there reads that op's facts.
struct alignas(kLine) Agreement::Slot {
  std::atomic<int64_t> number;
  std::atomic<int64_t> own;
  std::atomic<uint64_t> agreed_words;
  std::atomic<uint64_t> agreed[kAgreedWords];
};

struct alignas(kLine) Agreement::Entry {
  std::atomic<uint64_t> word;
};

namespace {

// The layout: a line of flags, a line per rank (the last op it has decided, plus one), then
// per word its line and every rank's slot.
struct alignas(kLine) Header {
  std::atomic<uint64_t> disabled;
};
struct alignas(kLine) Seen {
  std::atomic<int64_t> through;  // the last op decided, plus one
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared words must be lock-free");

size_t EntryBytes(int size) { return kLine + static_cast<size_t>(size) * 2 * kLine; }

}  // namespace

size_t Agreement::Footprint(int size) {
  return sizeof(Header) + static_cast<size_t>(size) * sizeof(Seen) + kWords * EntryBytes(size);
}

Agreement::Agreement(void* memory, int size, int rank)
    : memory_(static_cast<char*>(memory)), size_(size), rank_(rank) {
  static_assert(sizeof(Slot) == 2 * kLine, "a slot is two lines");
}

Agreement::Entry& Agreement::EntryOf(int64_t number) const {
  char* at = memory_ + sizeof(Header) + static_cast<size_t>(size_) * sizeof(Seen) +
             static_cast<size_t>(number % kWords) * EntryBytes(size_);
  return *reinterpret_cast<Entry*>(at);
}

std::atomic<int64_t>& Agreement::SeenOf(int r) const {
  return reinterpret_cast<Seen*>(memory_ + sizeof(Header))[r].through;
}

std::atomic<uint64_t>& Agreement::DisabledFlag() const {
  return reinterpret_cast<Header*>(memory_)->disabled;
}

Agreement::Slot& Agreement::SlotOf(int64_t number, int r) const {
  char* entry = reinterpret_cast<char*>(&EntryOf(number));
  return *reinterpret_cast<Slot*>(entry + kLine + static_cast<size_t>(r) * sizeof(Slot));
}

void Agreement::Disable() { DisabledFlag().store(1, std::memory_order_release); }

bool Agreement::disabled() const { return DisabledFlag().load(std::memory_order_acquire) != 0; }

bool Agreement::SeenByAll(int64_t number) const {
  for (int r = 0; r < size_; ++r) {
    if (SeenOf(r).load(std::memory_order_acquire) - 1 < number) return false;
  }
  return true;
}

void Agreement::Decided(int64_t number) {
  decided_ = std::max(decided_, number);
  if (waiting_ == number) waiting_ = -1;
  // Through the op below the one still waiting, if any: its word must outlive its decision.
  const int64_t through = waiting_ >= 0 ? waiting_ - 1 : decided_;
  SeenOf(rank_).store(through + 1, std::memory_order_release);
}

bool Agreement::SameAsArrived(int64_t number, const Facts& facts) const {
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const Slot& s = SlotOf(number, r);
    if (s.number.load(std::memory_order_acquire) != number + 1) continue;  // not here yet
    if (s.agreed_words.load(std::memory_order_relaxed) !=
        static_cast<uint64_t>(facts.agreed_words)) {
      return false;
    }
    for (int i = 0; i < facts.agreed_words; ++i) {
      if (s.agreed[i].load(std::memory_order_relaxed) != facts.agreed[i]) return false;
    }
  }
  return true;
}

Agreement::Decision Agreement::Ran(int64_t number) {
  // Every rank's slot stays until every rank has marked the decision seen: copy first.
  own_.resize(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    own_[static_cast<size_t>(r)] = SlotOf(number, r).own.load(std::memory_order_relaxed);
  }
  Decided(number);
  return Decision::kRun;
}

Agreement::Decision Agreement::Arrive(int64_t number, const Facts& facts) {
  assert(facts.agreed_words >= 0 && facts.agreed_words <= kAgreedWords);
  if (size_ > kMaxRanks || disabled()) {
    Skip(number);
    return Decision::kNegotiate;
  }
  Entry& e = EntryOf(number);
  Slot& mine = SlotOf(number, rank_);
  bool written = false;
  uint64_t w = e.word.load(std::memory_order_acquire);
  for (;;) {
    const int64_t at = NumberOf(w);
    if (at > number || (at == number && WithdrawnIn(w))) {
      Decided(number);
      return Decision::kNegotiate;
    }
    // The word still holds an earlier op that ran directly, and some rank has not seen
    // that yet: it must not lose it. Negotiate (the others see this rank's decision).
    if (at < number && !WithdrawnIn(w) && CountOf(w) == size_ && !SeenByAll(at)) {
      Skip(number);
      return Decision::kNegotiate;
    }
    if (!written) {
      mine.number.store(0, std::memory_order_relaxed);
      mine.agreed_words.store(static_cast<uint64_t>(facts.agreed_words), std::memory_order_relaxed);
      for (int i = 0; i < facts.agreed_words; ++i) {
        mine.agreed[i].store(facts.agreed[i], std::memory_order_relaxed);
      }
      mine.own.store(facts.own, std::memory_order_relaxed);
      mine.number.store(number + 1, std::memory_order_release);
      written = true;
    }
    uint64_t next;
    if (at < number) {
      next = Word(number, 1, false);
    } else if (!SameAsArrived(number, facts)) {
      next = w | kWithdrawn;  // the coordinator names the difference
    } else {
      next = w + 1;
    }
    if (!e.word.compare_exchange_weak(w, next, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      continue;  // w is the word now
    }
    if (WithdrawnIn(next)) {
      Decided(number);
      return Decision::kNegotiate;
    }
    waiting_ = number;
    if (CountOf(next) == size_) return Ran(number);
    return Poll(number);  // a rank may have skipped it already
  }
}

Agreement::Decision Agreement::Poll(int64_t number) {
  const Entry& e = EntryOf(number);
  uint64_t w = e.word.load(std::memory_order_acquire);
  if (NumberOf(w) == number && !WithdrawnIn(w) && CountOf(w) < size_) {
    if (!SomeRankDecided(number)) return Decision::kWait;
    // A rank has decided the op. If it counted in, its count is in the word now (it
    // counts in before it marks the decision seen); otherwise it skipped it, and the op
    // can never complete.
    w = e.word.load(std::memory_order_acquire);
  }
  if (NumberOf(w) == number && !WithdrawnIn(w) && CountOf(w) == size_) return Ran(number);
  Decided(number);
  return Decision::kNegotiate;
}

bool Agreement::SomeRankDecided(int64_t number) const {
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && SeenOf(r).load(std::memory_order_acquire) - 1 >= number) return true;
  }
  return false;
}

Agreement::Decision Agreement::Withdraw(int64_t number) {
  Entry& e = EntryOf(number);
  uint64_t w = e.word.load(std::memory_order_acquire);
  for (;;) {
    if (NumberOf(w) != number || WithdrawnIn(w)) {
      Decided(number);
      return Decision::kNegotiate;
    }
    if (CountOf(w) == size_) return Ran(number);
    if (e.word.compare_exchange_weak(w, w | kWithdrawn, std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
      Decided(number);
      return Decision::kNegotiate;
    }
  }
}

void Agreement::Skip(int64_t number) { Decided(number); }

}  // namespace comm
}  // namespace weft
