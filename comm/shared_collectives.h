// Collectives through memory the ranks share, when every rank of the job is on one machine:
// allreduce, broadcast and allgather read each tensor where it is and write each output
// where it goes (a fused group needs no fusion buffer). Each rank has a counter of its own,
// on its own cache lines, and two areas of kRoundBytes: input and result. Every rank counts
// itself in at a meeting and waits until all have. Most ops go in rounds "in halves": a
// round of up to half an area writes into one half of the writer's result area (the halves
// taken in turn, round after round, op after op), then meets once, then reads:
//   - allreduce, summed by all (two ranks, and more ranks up to kAllSumBytes): each rank
//     copies its inputs into its half; meeting; each rank sums every element over every
//     rank, in rank order, straight into its outputs (two ranks: its own inputs read where
//     they are);
//   - broadcast: the root copies its inputs into its half (and into its own outputs
//     directly); a one-way meeting: the root counts in and goes on, the others wait for
//     the root's count alone, copy the inputs out, then count in;
//   - allgather: each rank copies its part into its half (and into its own output
//     directly); meeting; each rank copies the others' parts out;
//   - neighbor exchange: each rank writes the scale it sends to each destination at the
//     head of its half and copies its inputs after it; meeting; each rank combines its
//     in-neighbors' halves (scaled as their senders say) into its output.
// A larger allgather may read the others' parts where they are instead (AllgatherDirect),
// where the kernel lets the ranks read each other's memory (Linux's cross-memory attach,
// process_vm_readv): each rank posts its input's address beside its counter and counts in;
// once all have, each copies every other rank's part straight from that rank's input into
// its output; a second meeting, so that no rank returns (and lets its caller change its
// input) while another still reads it. One copy per part, where the areas take two. A
// broadcast can go the same way, the root's input being the only part. A
// neighbor exchange reads its in-neighbors' inputs the same way (ExchangeDirect), each
// sender posting the scale it sends to each destination in a table after the areas. So can
// an allreduce of one tensor (AllreduceDirect): each rank sums its slice of the elements
// from the others' inputs into its own output and writes them into every other rank's
// (process_vm_writev).
// Larger allreduces of more than two ranks go sliced, in rounds of a whole area between two
// meetings, so that each element is summed by one rank instead of all: each rank copies the
// others' slices of its inputs (the tensors taken as one sequence of elements, one slice
// per rank) into its input area; meeting; each rank sums its own slice over every rank, in
// rank order, its own inputs read where they are, into its result area (and divides it,
// for an average); meeting; each rank copies every slice's sum into its outputs.
// Either way every rank gets the same bits, those of the sum in rank order.
// An area is written only after every rank is done reading what was left in it: a half
// after the meeting of the round between (which another rank reaches only after reading
// it), with one more meeting when the round follows a sliced one, whose sums may still be
// being read; a sliced round's areas after its own meetings. After a one-way meeting a
// rank about to write a half first waits until every rank has counted in as far as its
// readers count once done (BeforeWrite): the root of a broadcast runs at most one round
// ahead of its slowest reader. So the areas serve every round. The rounds and their counters
// continue from op to op, which every rank runs in the same order.
//
// An op's first round may be written ahead of its meeting ("staged"), where the caller meets
// every rank of the op by other means first (the engine's direct agreement, agreement.h):
// each rank writes what it would write before the round's meeting (a Stage call), then
// counts in to the caller's meeting; the op, run with `staged` once every rank has, takes
// that meeting for the round's: each rank counts the round's meeting without waiting for
// it. The write happens where it would anyway, after this rank's last op, so the same
// rules keep it from any area another rank still reads; a staged round that is not run so
// (the caller's meeting decided otherwise, or another op ran first) is written again by
// whichever op runs next. A Stage call may wait for other ranks to finish reading an
// earlier op (BeforeWrite), never for a meeting.
//
// A rank that waits polls through a callback, so that another rank's one-sided op into its
// window, which may need its MPI progress, is not held up. There is no deadline: a rank
// that never arrives leaves the others waiting as MPI would, inside the op's transfers,
// where the engine's watchdog ends the job after WEFT_STALL_TIMEOUT_SECONDS. Small copies
// into the areas go with plain or non-temporal stores, as rank 0's Tuner finds faster
// from the time its rounds take; the ops whose way rank 0 picks by timing leave their times
// here for it (PublishOpTimes). Code over a block of memory (a segment the ranks map, or a
// test's buffer). Internal to comm/.
#ifndef WEFT_COMM_SHARED_COLLECTIVES_H_
#define WEFT_COMM_SHARED_COLLECTIVES_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "comm/tuner.h"
#include "core/status.h"
#include "core/tensor.h"

namespace weft {
namespace comm {

// How copies of under kStreamBelowBytes (shared_collectives.cc) go into the areas: with
// plain stores, or with non-temporal ones, which write whole lines without first taking
// each line back from the caches of the ranks that read it last. Which is faster depends
// on where the ranks run (SharedCollectives::CopyIn says what was measured).
enum class CopyMode : uint64_t { kPlain = 0, kStream = 1 };

class SharedCollectives {
 public:
  static constexpr size_t kRoundBytes = size_t{1} << 20;
  // Allreduces of more than two ranks up to this many bytes: each rank sums every element.
  static constexpr size_t kAllSumBytes = size_t{32} << 10;
  // The longest a Stage call waits for readers of an earlier op to leave the half it would
  // write (as long as a rank waits for the others to count in to a direct agreement).
  static constexpr int64_t kStageWaitMicros = 100000;
  // The memory `size` ranks share: zeroed before the first rank uses it.
  static size_t Footprint(int size);
  // This rank's view of that memory. `copies`: how copies into the areas go; without one,
  // rank 0 picks by timing (Tuner) and every rank follows it.
  SharedCollectives(void* memory, int size, int rank,
                    std::optional<CopyMode> copies = std::nullopt);

  // One tensor of a (fused) group: `count` elements read from `in` and written to `out`
  // (which may be `in`; otherwise they must not overlap).
  struct Piece {
    const void* in;
    void* out;
    size_t count;
  };
  // The elements of all of `pieces`.
  static size_t Elements(const std::vector<Piece>& pieces) {
    size_t n = 0;
    for (const Piece& p : pieces) n += p.count;
    return n;
  }
  // Sums `pieces` element by element over every rank (the same counts on every rank, and
  // the same dtype), into their outputs; with `average`, divides the sums by the number of
  // ranks (as reduce.h's Divide). Every rank calls it for the same ops in the same order.
  // While it waits for other ranks, idle(since) runs between two polls (`since`: when the
  // wait began): spin.h's IdleWait, and whatever progress other ranks may need from this
  // one meanwhile.
  // `staged`: this rank staged the op (StageAllreduce returned true) and every rank has
  // since met the others as the caller does (see above); the same on every rank. So for
  // every op below.
  void Allreduce(const std::vector<Piece>& pieces, DType dtype, bool average,
                 const std::function<void(int64_t since)>& idle, bool staged = false);
  // Writes the first round of Allreduce(pieces, dtype, ...) ahead; false where it cannot
  // (a sliced allreduce, or one right after one: that round needs a meeting of its own).
  bool StageAllreduce(const std::vector<Piece>& pieces, DType dtype,
                      const std::function<void(int64_t since)>& idle);
  // Copies the root's inputs of `pieces` (elements of `item` bytes) into every rank's
  // outputs (the root's too, where an output is not its input); the other ranks' inputs are
  // not read.
  void Broadcast(const std::vector<Piece>& pieces, size_t item, int root,
                 const std::function<void(int64_t since)>& idle, bool staged = false);
  // Writes the root's first round of that Broadcast ahead (the others write nothing).
  bool StageBroadcast(const std::vector<Piece>& pieces, size_t item, int root,
                      const std::function<void(int64_t since)>& idle);
  // Gathers every rank's `in` (part_bytes[r] bytes on rank r, the same list on every rank)
  // into every rank's `out`, rank r's part after those of the ranks before it. A null `out`
  // takes this rank's part (its input, its meetings) without gathering anything: a rank
  // with no output to write (its allocator failed) so keeps the others' op, and their count
  // of meetings, going.
  void Allgather(const void* in, void* out, const std::vector<size_t>& part_bytes,
                 const std::function<void(int64_t since)>& idle, bool staged = false);
  // Writes this rank's first round of an Allgather of its `in` (`part_bytes` of it) ahead.
  bool StageAllgather(const void* in, size_t part_bytes,
                      const std::function<void(int64_t since)>& idle);
  // Lets AllgatherDirect, BroadcastDirect and ExchangeDirect read rank r's memory as process
  // pids[r] (pids: one per rank, in rank order), once every rank has found that it can
  // (ReadProcessMemory); with `writes`, AllreduceDirect too, which also writes it
  // (WriteProcessMemory).
  void EnableDirectReads(std::vector<int64_t> pids, bool writes) {
    pids_ = std::move(pids);
    writes_ = writes;
  }
  bool direct_reads() const { return !pids_.empty(); }
  bool direct_writes() const { return direct_reads() && writes_; }
  // Allgather as above, each part read from its rank's `in` where it is (see above); every
  // rank calls it for the same ops, after EnableDirectReads. A read that fails (the other
  // process gone, or its memory no longer readable) fails the op on the reading rank alone,
  // which still meets the others: none of them waits for it in vain. A null `out` reads
  // nothing, as for Allgather.
  Status AllgatherDirect(const void* in, void* out, const std::vector<size_t>& part_bytes,
                         const std::function<void(int64_t since)>& idle, bool staged = false);
  // A broadcast of `bytes` from `root`'s `in` into every rank's `out` the same way: the
  // allgather in which only the root has a part. The root copies its input into its output
  // (nothing in place); the others read it. Its first meeting can be staged as
  // AllgatherDirect's (StageDirect; `in` is read on the root alone).
  Status BroadcastDirect(const void* in, void* out, size_t bytes, int root,
                         const std::function<void(int64_t since)>& idle, bool staged = false);
  // An allreduce of one tensor (`count` elements of `dtype` from `in` into `out`, which may
  // be `in`) by the same direct access, as a reduce-scatter and an allgather in one pass:
  // each rank posts its input's and its output's addresses and meets; each sums its slice
  // of the elements (one per rank, in rank order) over every rank a block at a time, the
  // others' terms read from their inputs, into its output (dividing for an average), and
  // writes each block of the sums into every other rank's output while the block is still
  // in its cache (in place, their lines of it too: it has just read them); then meets
  // again, after which no rank touches another's memory. Only rank r reads or writes slice
  // r of another rank's tensor, and it reads each block before it writes it, so in place
  // is safe. Every rank gets the bits of the sum in rank order. A failed read or write
  // fails the op on every rank (an output would otherwise lack a slice): each rank says at
  // the second meeting whether it read and wrote all it had to. Needs the ranks to be
  // able to write each other's memory as well as read it (direct_writes()).
  Status AllreduceDirect(const void* in, void* out, size_t count, DType dtype, bool average,
                         const std::function<void(int64_t since)>& idle, bool staged = false);
  // Posts what this rank's AllgatherDirect, BroadcastDirect, ExchangeDirect or
  // AllreduceDirect of `in` posts before its first meeting (`send`: ExchangeDirect's scales,
  // null for the others; `out`: AllreduceDirect's output) ahead.
  bool StageDirect(const void* in, const std::vector<std::pair<int, double>>* send,
                   void* out = nullptr);
  // What a neighbor exchange through the areas hands over (Exchange): for each in-neighbor
  // k, a run of its input as it sends it to this rank, beside the piece it goes with.
  using Received = std::function<void(const Piece& piece, size_t at, size_t n,
                                      const std::vector<const char*>& received)>;
  // A neighbor exchange through the areas, in rounds in halves (every rank calls it for the
  // same ops, with pieces of the same counts, of `dtype`, taken as one sequence): each rank
  // writes the scale it sends to each destination (`send`: rank and scale; 1 for the
  // others) at the head of its half and copies the round's part of its pieces' inputs after
  // it; meeting; then, for each piece's run of the round, arrived(piece, at, n, received)
  // runs for its elements [at, at + n), received[k] pointing at the first of them in rank
  // from[k]'s input as that rank sends it to this one: in the sender's half where its scale
  // is 1, else multiplied by the scale into scratch[k] (which holds at least min(total,
  // ExchangeRoundElements) elements) as reduce.h's WeightedSum makes a sender's scaled copy
  // (the same bits); they hold during that call. A piece's output may be its input (what
  // arrived() writes): no rank reads a round's part of it after the round's meeting. So a
  // fused group needs no fusion buffer.
  void Exchange(const std::vector<Piece>& pieces, DType dtype,
                const std::vector<std::pair<int, double>>& send, const std::vector<int>& from,
                const std::vector<char*>& scratch, const Received& arrived,
                const std::function<void(int64_t since)>& idle, bool staged = false);
  // Writes this rank's first round of that Exchange ahead.
  bool StageExchange(const std::vector<Piece>& pieces, DType dtype,
                     const std::vector<std::pair<int, double>>& send,
                     const std::function<void(int64_t since)>& idle);
  // Elements of `item` bytes per round of Exchange.
  size_t ExchangeRoundElements(size_t item) const { return (kHalfBytes - ScalesBytes()) / item; }
  // A neighbor exchange by the same direct reads (after EnableDirectReads; every rank calls
  // it for the same ops, each with `count` elements of `dtype`): each rank posts its `in`
  // and the scale it sends to each destination (`send`: rank and scale), and meets; then
  // copies the input of each rank from[k] into into[k] (count elements), multiplied by the
  // scale that rank sends to this one as reduce.h's WeightedSum makes a sender's scaled
  // copy (the same bits); then meets again, so that no rank changes its input while
  // another reads it. A failed read fails the op on the reading rank alone.
  Status ExchangeDirect(const void* in, size_t count, DType dtype,
                        const std::vector<std::pair<int, double>>& send,
                        const std::vector<int>& from, const std::vector<char*>& into,
                        const std::function<void(int64_t since)>& idle, bool staged = false);
  // The span of a collective that every rank runs in turn (the allreduces whose way rank 0
  // picks by timing): each rank publishes when it started and ended it (steady_clock
  // nanoseconds, one clock for the whole machine) under `op`, the op's number among those
  // (which picks one of two slots, by parity), and `tag`, a number every rank knows the op
  // by (its turn); OpSpan(op, tag) is then the time from the first rank's start to the last
  // one's end, or 0 where a rank's slot does not hold that op. A rank that has run op + 1
  // with the others, which every rank starts only after publishing op's times, finds op's
  // times from every rank, and none of op + 2's. One rank's own view of an op leaves out
  // what the others still do when it is done, and the ways differ in that.
  void PublishOpTimes(uint64_t op, uint64_t tag, int64_t start_ns, int64_t end_ns);
  int64_t OpSpan(uint64_t op, uint64_t tag) const;
  static int64_t NowNanos();  // that clock

 private:
  char* input(int rank) const;
  char* result(int rank) const;
  static constexpr size_t kHalfBytes = kRoundBytes / 2;
  // AllreduceDirect reads the others' inputs in blocks of this many bytes.
  static constexpr size_t kBlockBytes = size_t{128} << 10;
  // Rounds in halves (see above): `rank`'s half of its result area for this round.
  char* half(int rank) const;
  // The head of a half in Exchange: one scale (a double's bits) per destination rank, whole
  // lines, so that the data after it starts on one.
  size_t ScalesBytes() const {
    return (static_cast<size_t>(size_) * sizeof(uint64_t) + 63) / 64 * 64;
  }
  // Before the first round in halves of an op: meets first if the last allreduce was sliced.
  void StartHalves(const std::function<void(int64_t since)>& idle);
  // Whether an allreduce of `bytes` goes sliced (see above).
  bool Sliced(size_t bytes) const { return size_ < 2 || (size_ > 2 && bytes > kAllSumBytes); }
  // Allreduce where each rank sums every element (see above); `ahead`: its first round was
  // staged, and met.
  void AllreduceByAll(const std::vector<Piece>& pieces, size_t total, DType dtype, bool average,
                      const std::function<void(int64_t since)>& idle, bool ahead);
  // Copies elements [base, base + m) of `pieces`, taken as one sequence, to `to`: what a
  // round in halves of an allreduce (or a broadcast root) writes into this rank's half
  // before its meeting, and the round's part of a sliced allreduce's inputs.
  void WritePieces(char* to, const std::vector<Piece>& pieces, size_t base, size_t m, size_t item);
  // What a round in halves writes into this rank's half before its meeting: the `n` bytes
  // from `base` of an allgather's part; an exchange's scales and its pieces' elements
  // [base, base + m).
  void WritePart(const void* in, size_t base, size_t n);
  void WriteExchange(const std::vector<Piece>& pieces, size_t base, size_t m, size_t item,
                     const std::vector<std::pair<int, double>>& send);
  // Posts ExchangeDirect's scales in this rank's row of the table.
  void PostScales(const std::vector<std::pair<int, double>>& send);
  // A Stage call of an op in halves: unless a sliced allreduce came last (false), waits
  // until the half is free (BeforeWrite) and calls write() where this rank writes
  // (`writes`), then Staged(). It waits kStageWaitMicros at most, and stages nothing
  // (false) if the half is not free by then.
  template <typename Write>
  bool StageHalf(bool writes, const std::function<void(int64_t since)>& idle, Write write);
  // Ends a Stage call that wrote: the streamed stores fenced (the caller's meeting orders
  // the others' reads after them), the staging noted. Returns true.
  bool Staged();
  // Whether an op run with `staged` finds its staging still there (no op ran since), which
  // holds alike on every rank; forgets it either way.
  bool TakeStaged(bool staged);
  // The first meeting of a staged op: counts it, without waiting (the caller's meeting
  // stood for it).
  void MetAhead();
  // Copies `n` bytes of this rank's into an area the others read after the next meeting;
  // counts those it may stream in `streamable_`. The readers' caches hold the area's lines
  // from the last time they read them, and a plain store takes each line back first, one
  // at a time. Where that is slow, copies of under kStreamBelowBytes (in .cc) gain from
  // non-temporal stores, which write whole lines without taking them, but the readers then
  // find the data in memory rather than in a cache. On a 2-CPU AMD EPYC VM whose two CPUs
  // changed places now and then, copying 64 tensors of 4 KiB into 256 KiB of an area and
  // the other process reading it took 30 us plainly and 20 streamed one time, 14 and 28
  // another: hence the tuner (copies_, tuner_). Larger copies go plainly, whose `rep movsb`
  // writes whole lines.
  void CopyIn(char* dst, const void* src, size_t n);
  // Sets the copy mode of the round about to start: the fixed one, or, tuned, rank 0's
  // tuner's choice, which rank 0 publishes in the segment and the others read there.
  // `timed`: an allreduce's round, which rank 0 times for its tuner, but for its meetings.
  void StartRound(bool timed);
  // Ends a round: rank 0 gives a timed one's time to its tuner.
  void EndRound();
  std::atomic<uint64_t>* counter(int rank) const;
  // The word a rank posts its input's address in for AllgatherDirect: on its counter's
  // second line, which only that rank writes.
  std::atomic<uint64_t>* post(int rank) const;
  // Beside it: AllreduceDirect's output address, and whether the rank failed in summing its
  // slice (0: it did not; 1: reading another's input; 2: writing into another's output).
  std::atomic<uint64_t>* post_out(int rank) const { return post(rank) + 1; }
  std::atomic<uint64_t>* post_failed(int rank) const { return post(rank) + 2; }
  // PublishOpTimes's words of a rank, on its counter's third line, which only that rank
  // writes: for each parity, the tag + 1 (0: none yet), the start and the end.
  std::atomic<uint64_t>* op_times(int rank, uint64_t op) const {
    return post(rank) + 8 + 3 * (op % 2);
  }
  // What a direct op posts before its first meeting, staged or not: `send`'s scales
  // (ExchangeDirect), this rank's input's address and its output's (AllreduceDirect).
  void PostDirect(const void* in, const std::vector<std::pair<int, double>>* send,
                  void* out = nullptr);
  // The scale (a double's bits) `sender` applies to what `receiver` reads of it in
  // ExchangeDirect: a table of size x size words after the areas, row by sender.
  std::atomic<uint64_t>* scale(int sender, int receiver) const;
  // Copies `bytes` from what `rank` posted into `to` (a direct op's read, after the meeting
  // that follows the posts); an error says "`op`: reading rank R's `thing` from its memory".
  Status ReadPosted(int rank, void* to, size_t bytes, const char* op, const char* thing,
                    size_t offset = 0) const;
  // Copies `bytes` from `from` into the output `rank` posted for AllreduceDirect, at
  // `offset`; an error says "allreduce: writing rank R's output".
  Status WriteOut(int rank, const void* from, size_t bytes, size_t offset) const;
  // AllgatherDirect and BroadcastDirect: `op` and `thing` name what a failed read read.
  Status GatherDirect(const void* in, void* out, const std::vector<size_t>& part_bytes,
                      const std::function<void(int64_t since)>& idle, bool staged, const char* op,
                      const char* thing);
  // Sets this rank's count to `mark` (release: what it wrote before is seen by whoever
  // sees the count).
  void Count(uint64_t mark);
  // Waits until ranks [from, to) have counted `mark` (true); with `deadline_us` (not 0,
  // Timeline::NowMicros's clock), gives up then (false).
  bool WaitFor(int from, int to, uint64_t mark, const std::function<void(int64_t since)>& idle,
               int64_t deadline_us = 0);
  // Counts this rank in for the next meeting, and waits until every rank has; `meanwhile`,
  // if given, runs between the two.
  void Meet(const std::function<void(int64_t since)>& idle,
            const std::function<void()>& meanwhile = nullptr);
  // Before this rank writes into a half: after a one-way meeting, waits until every rank
  // is done reading what the half held (false: `deadline_us` came first, as for WaitFor).
  bool BeforeWrite(const std::function<void(int64_t since)>& idle, int64_t deadline_us = 0);

  char* memory_;
  int size_, rank_;
  uint64_t meetings_ = 0;     // this rank's, so far
  uint64_t halves_ = 0;       // rounds in halves, so far
  bool sliced_last_ = false;  // the last allreduce was sliced
  bool staged_ = false;       // a Stage call wrote, and no op ran since
  bool streamed_ = false;     // CopyIn streamed since the last meeting
  // The last meeting, and the one before it, went one way (a broadcast's: only the root's
  // count is waited for, and the others count in once done reading).
  bool one_way_last_ = false;
  bool one_way_before_ = false;
  // The copy mode: fixed, or (none) rank 0's tuner's, published in the segment.
  std::optional<CopyMode> copies_;
  const bool tuning_;                      // rank 0 without a fixed mode: tuner_ chooses
  Tuner tuner_;                            // rank 0, tuning: way 0 plain, 1 streamed
  CopyMode published_ = CopyMode::kPlain;  // rank 0: the mode in the segment's word
  bool stream_ = false;                    // this round's copies stream (StartRound)
  size_t streamable_ = 0;                  // bytes this round copied that could stream
  bool round_timed_ = false;               // rank 0 times this round (StartRound, Meet, EndRound)
  int64_t round_start_ns_ = 0;
  int64_t met_ns_ = 0;  // the timed round's meetings so far
  bool writes_ = false;        // AllreduceDirect may run (EnableDirectReads)
  std::vector<int64_t> pids_;  // each rank's process, for the direct ops (EnableDirectReads)
  std::vector<char> scratch_;  // AllreduceDirect's blocks of the others' inputs
  bool backward_ = false;      // AllreduceDirect's next op takes its blocks last to first
};

// Copies `bytes` from address `from` of process `pid` to `to` in this one, with
// process_vm_readv; an error names the process and what the kernel said.
Status ReadProcessMemory(int64_t pid, const void* from, void* to, size_t bytes);
// Copies `bytes` from `from` in this process to address `to` of process `pid`, with
// process_vm_writev; an error as ReadProcessMemory's.
Status WriteProcessMemory(int64_t pid, const void* from, void* to, size_t bytes);

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_SHARED_COLLECTIVES_H_
