// Direct agreement: when every rank of the job shares one machine, an op that every rank
// calls with the same arguments while nothing else is in flight can run without the
// coordinator's answer. Each rank writes its op's facts into memory the ranks share and
// counts itself in with one compare-and-swap; when the count reaches the number of ranks
// the op runs at once on every rank. Any other case (a rank with other ops in flight, an
// op the engine does not offer, a refusal, arguments that differ, a rank that is late) turns the op
// over to the coordinator, with the same outcome on every rank: the op completes only when
// every rank counted in, and a rank that withdraws marks the op's word withdrawn with the
// same compare-and-swap, so it can happen only before the last rank counts in.
//
// Each rank also publishes the last op number it has decided. A rank that skips an op (it
// negotiates it without counting in) only advances that: ranks waiting for it see that it
// decided without counting in, and negotiate too. A skip then costs a store to memory no
// other rank reads unless it waits, which matters for bursts of nonblocking ops.
//
// The op's number (its place among the rank's ops, Request::turn in engine.h) names the
// word; which op it is, is one of the facts. Words are reused every kWords ops, and a word
// whose op ran directly is reused only after every rank has seen that decision. Pure code over a
// block of memory (the control channel's shared segment, or a test's buffer). Internal to comm/.
#ifndef WEFT_COMM_AGREEMENT_H_
#define WEFT_COMM_AGREEMENT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace weft {
namespace comm {

class Agreement {
 public:
  // Facts that must be equal on every rank for the op to run without the coordinator (the
  // engine packs the op, dtype, device, shape and options into the first `agreed_words`, at
  // most kAgreedWords),
  // and a fact of each rank's own that the op needs from every rank (allgather's first
  // dimension). A rank's slot keeps its own fact and the first five agreed words in one
  // cache line, which is all another rank reads for the engine's ops of up to three
  // dimensions.
  static constexpr int kAgreedWords = 12;
  struct Facts {
    int agreed_words = kAgreedWords;
    uint64_t agreed[kAgreedWords] = {};
    int64_t own = 0;
  };

  enum class Decision {
    kWait,       // counted in; not every rank yet
    kRun,        // every rank counted in with the same facts: run it now, on every rank
    kNegotiate,  // send it to the coordinator, as every rank does
  };

  // Bytes for `size` ranks; the memory must start on a 64-byte boundary and be zeroed
  // before any rank uses it (a fresh shared-memory file is).
  static size_t Footprint(int size);
  // Ranks beyond this many always negotiate (the count's width).
  static constexpr int kMaxRanks = 65535;

  Agreement(void* memory, int size, int rank);

  // Op `number` on this rank can run directly: counts this rank in. Numbers increase by
  // one per call to Arrive or Skip. On kWait, call Poll until it decides (or Withdraw).
  Decision Arrive(int64_t number, const Facts& facts);
  // The op this rank arrived at: kWait until it is decided.
  Decision Poll(int64_t number);
  // Stops waiting for the op this rank arrived at: kNegotiate, or kRun when every rank
  // had counted in first.
  Decision Withdraw(int64_t number);
  // This rank sends op `number` to the coordinator without counting in: ranks waiting for
  // it stop at their next Poll.
  void Skip(int64_t number);

  // After kRun, until the next call: rank r's own fact for the op.
  int64_t own(int r) const { return own_[static_cast<size_t>(r)]; }

  // Whether every rank has seen the decision on op `number` (and on every op before it).
  bool SeenByAll(int64_t number) const;

  // From now on no op runs directly (every rank negotiates): unnamed ops can no longer be
  // matched, and the coordinator fails them (it calls this before it says so to anyone).
  void Disable();
  bool disabled() const;

  static constexpr int64_t kWords = 16;

 private:
  struct Slot;
  struct Entry;
  Entry& EntryOf(int64_t number) const;
  Slot& SlotOf(int64_t number, int r) const;
  // Rank r's last decided op, plus one (Decided; 0: none yet).
  std::atomic<int64_t>& SeenOf(int r) const;
  std::atomic<uint64_t>& DisabledFlag() const;
  // Marks op `number` decided on this rank (no pending op left below it).
  void Decided(int64_t number);
  // Whether another rank has decided op `number` (counted in or not).
  bool SomeRankDecided(int64_t number) const;
  bool SameAsArrived(int64_t number, const Facts& facts) const;
  // Every rank counted in: copies their own facts, marks the op decided.
  Decision Ran(int64_t number);

  char* memory_;
  int size_, rank_;
  int64_t waiting_ = -1;      // the op this rank arrived at, until decided
  int64_t decided_ = -1;      // the last op decided, Arrive's or Skip's
  std::vector<int64_t> own_;  // own(), by rank
};

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_AGREEMENT_H_
