#include "comm/shared_collectives.h"

#include <sys/types.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define WEFT_STREAM_STORES 1
#endif

#include "absl/strings/str_cat.h"
#include "comm/reduce.h"
#include "core/timeline.h"

namespace weft {
namespace comm {
namespace {

// Four lines per counter (the counter, the posts, the op times, unused): the hardware's
// adjacent-line prefetch pairs lines, and a pair written by two ranks would pass between
// their caches for nothing.
constexpr size_t kCounterBytes = 256;

// Copies into the areas of fewer bytes than this may stream (CopyIn).
constexpr size_t kStreamBelowBytes = size_t{16} << 10;
// Rounds that could stream fewer bytes than this are not timed for the tuner: their
// copies take too little of the round to tell the modes apart.
constexpr size_t kTimedAboveBytes = size_t{64} << 10;

using Counter = std::atomic<uint64_t>;
static_assert(Counter::is_always_lock_free, "the counters are shared between processes");

// Calls fn(piece, first element in it, elements, position in [from, to)) for each run of the
// elements [from, to) of the pieces taken as one sequence.
template <typename Fn>
void ForEachRun(const std::vector<SharedCollectives::Piece>& pieces, size_t from, size_t to,
                Fn fn) {
  size_t start = 0;  // of the current piece in the sequence
  for (const SharedCollectives::Piece& p : pieces) {
    if (p.count == 0) continue;  // nothing to copy (and maybe no buffer)
    const size_t end = start + p.count;
    if (end > from && start < to) {
      const size_t lo = std::max(from, start), hi = std::min(to, end);
      fn(p, lo - start, hi - lo, lo - from);
    }
    if (end >= to) break;
    start = end;
  }
}

// out = term(0) + term(1) + ... + term(size - 1), added in that order (divided by `size`
// for an average): `n` elements of `dtype`. Every rank adds the same terms in the same
// order, so every rank gets the same bits (where both terms are NaN, which one the sum
// carries depends on the order).
template <typename Term>
void SumInRankOrder(char* out, Term term, int size, DType dtype, size_t n, bool average) {
  if (size == 1) {
    std::memcpy(out, term(0), n * DTypeSize(dtype));
  } else {
    Add(out, term(0), term(1), dtype, n);
    for (int r = 2; r < size; ++r) AddInPlace(out, term(r), dtype, n);
  }
  if (average) Divide(out, dtype, n, size);
}

// Splits `m` elements of `item` bytes into one slice per rank, each but the last a whole
// number of 64-byte lines: lo(r) is where rank r's slice starts, lo(size) == m.
struct Slices {
  Slices(size_t m, size_t item, int size) : m(m) {
    const size_t align = std::max<size_t>(1, 64 / item);
    per = ((m + size - 1) / size + align - 1) / align * align;
  }
  size_t operator()(int r) const { return std::min(m, per * static_cast<size_t>(r)); }
  size_t m, per;
};

}  // namespace

int64_t SharedCollectives::NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

size_t SharedCollectives::Footprint(int size) {
  // The counters, the copy mode's word, the areas, the scales of ExchangeDirect.
  return (static_cast<size_t>(size) + 1) * kCounterBytes + size * 2 * kRoundBytes +
         static_cast<size_t>(size) * size * sizeof(uint64_t);
}

SharedCollectives::SharedCollectives(void* memory, int size, int rank,
                                     std::optional<CopyMode> copies)
    : memory_(static_cast<char*>(memory)),
      size_(size),
      rank_(rank),
      copies_(copies),
      tuning_(rank == 0 && !copies.has_value()) {}

void SharedCollectives::StartRound(bool timed) {
  streamable_ = 0;
  CopyMode mode;
  if (copies_.has_value()) {
    mode = *copies_;
  } else {
    auto* word = reinterpret_cast<std::atomic<uint64_t>*>(memory_ + size_ * kCounterBytes);
    if (rank_ == 0) {
      mode = static_cast<CopyMode>(tuner_.next());
      // Only a change: the others read the word every round.
      if (mode != published_) word->store(static_cast<uint64_t>(mode), std::memory_order_relaxed);
      published_ = mode;
    } else {
      mode = static_cast<CopyMode>(word->load(std::memory_order_relaxed));
    }
  }
  stream_ = mode == CopyMode::kStream;
  round_timed_ = timed && tuning_;
  if (round_timed_) {
    round_start_ns_ = NowNanos();
    met_ns_ = 0;
  }
}

void SharedCollectives::EndRound() {
  if (round_timed_ && streamable_ >= kTimedAboveBytes) {
    tuner_.Record(stream_ ? 1 : 0, NowNanos() - round_start_ns_ - met_ns_, streamable_);
  }
  round_timed_ = false;
}

void SharedCollectives::CopyIn(char* dst, const void* from, size_t n) {
  const char* src = static_cast<const char*>(from);
#ifdef WEFT_STREAM_STORES
  // Plain copies up to the first whole line of `dst`, and after the last.
  const size_t head = std::min(n, (64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64);
  const size_t body = (n - head) / 64 * 64;
  const bool streamable = n < kStreamBelowBytes && body > 0;
  if (streamable) streamable_ += n;
  if (stream_ && streamable) {
    std::memcpy(dst, src, head);
    char* d = dst + head;
    const char* s = src + head;
    for (size_t i = 0; i < body; i += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    }
    std::memcpy(d + body, s + body, n - head - body);
    streamed_ = true;
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

char* SharedCollectives::input(int rank) const {
  return memory_ + (static_cast<size_t>(size_) + 1) * kCounterBytes + 2 * kRoundBytes * rank;
}

char* SharedCollectives::result(int rank) const { return input(rank) + kRoundBytes; }

std::atomic<uint64_t>* SharedCollectives::counter(int rank) const {
  return reinterpret_cast<Counter*>(memory_ + static_cast<size_t>(rank) * kCounterBytes);
}

std::atomic<uint64_t>* SharedCollectives::post(int rank) const {
  return reinterpret_cast<Counter*>(memory_ + static_cast<size_t>(rank) * kCounterBytes + 64);
}

void SharedCollectives::PublishOpTimes(uint64_t op, uint64_t tag, int64_t start_ns,
                                       int64_t end_ns) {
  std::atomic<uint64_t>* words = op_times(rank_, op);
  words[0].store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  words[1].store(static_cast<uint64_t>(start_ns), std::memory_order_relaxed);
  words[2].store(static_cast<uint64_t>(end_ns), std::memory_order_relaxed);
  words[0].store(tag + 1, std::memory_order_release);
}

int64_t SharedCollectives::OpSpan(uint64_t op, uint64_t tag) const {
  int64_t first = 0, last = 0;
  for (int r = 0; r < size_; ++r) {
    const std::atomic<uint64_t>* words = op_times(r, op);
    if (words[0].load(std::memory_order_acquire) != tag + 1) return 0;
    const auto start = static_cast<int64_t>(words[1].load(std::memory_order_relaxed));
    const auto end = static_cast<int64_t>(words[2].load(std::memory_order_relaxed));
    std::atomic_thread_fence(std::memory_order_acquire);
    if (words[0].load(std::memory_order_relaxed) != tag + 1) return 0;  // rewritten meanwhile
    first = r == 0 ? start : std::min(first, start);
    last = r == 0 ? end : std::max(last, end);
  }
  return last > first ? last - first : 0;
}

std::atomic<uint64_t>* SharedCollectives::scale(int sender, int receiver) const {
  char* table = input(size_);  // just past the last rank's areas
  return reinterpret_cast<Counter*>(table) + static_cast<size_t>(sender) * size_ + receiver;
}

void SharedCollectives::Count(uint64_t mark) {
  // Release: what this rank wrote before is seen by a rank that sees the count. Streamed
  // stores are not ordered with other stores: a fence first.
#ifdef WEFT_STREAM_STORES
  if (streamed_) _mm_sfence();
#endif
  streamed_ = false;
  counter(rank_)->store(mark, std::memory_order_release);
}

bool SharedCollectives::WaitFor(int from, int to, uint64_t mark,
                                const std::function<void(int64_t since)>& idle,
                                int64_t deadline_us) {
  int64_t since = 0;
  for (int r = from; r < to; ++r) {
    while (counter(r)->load(std::memory_order_acquire) < mark) {
      if (since == 0) since = Timeline::NowMicros();
      if (deadline_us != 0 && Timeline::NowMicros() > deadline_us) return false;
      idle(since);
    }
  }
  return true;
}

void SharedCollectives::Meet(const std::function<void(int64_t since)>& idle,
                             const std::function<void()>& meanwhile) {
  // A timed round counts its meetings out (the fence's wait among them).
  const int64_t arrived_ns = round_timed_ ? NowNanos() : 0;
  const uint64_t mark = ++meetings_;
  Count(mark);
  if (meanwhile) meanwhile();
  WaitFor(0, size_, mark, idle);
  one_way_before_ = one_way_last_;
  one_way_last_ = false;
  if (round_timed_) met_ns_ += NowNanos() - arrived_ns;
}

bool SharedCollectives::BeforeWrite(const std::function<void(int64_t since)>& idle,
                                    int64_t deadline_us) {
  // After a whole meeting every rank has counted it, and so read what the rounds before it
  // left. After a one-way one, the half about to be written was last written two meetings
  // ago; its readers counted in once done: at that meeting if it went one way too, at the
  // next otherwise (a whole meeting's readers read after it).
  if (!one_way_last_) return true;
  const int64_t arrived_ns = round_timed_ ? NowNanos() : 0;
  const bool free =
      WaitFor(0, size_, one_way_before_ ? meetings_ - 1 : meetings_, idle, deadline_us);
  if (round_timed_) met_ns_ += NowNanos() - arrived_ns;
  return free;
}

bool SharedCollectives::Staged() {
#ifdef WEFT_STREAM_STORES
  if (streamed_) _mm_sfence();
#endif
  staged_ = true;
  return true;
}

bool SharedCollectives::TakeStaged(bool staged) {
  const bool ahead = staged && staged_;
  staged_ = false;
  return ahead;
}

void SharedCollectives::MetAhead() {
  Count(++meetings_);
  one_way_before_ = one_way_last_;
  one_way_last_ = false;
}

template <typename Write>
bool SharedCollectives::StageHalf(bool writes, const std::function<void(int64_t since)>& idle,
                                  Write write) {
  staged_ = false;
  if (sliced_last_) return false;
  StartRound(/*timed=*/false);
  if (writes) {
    // Staging comes before the op is agreed: a reader that died while reading this half
    // would hold an unbounded wait here for good (and the watchdog end the job), where the
    // agreement, given up after the same time, takes the op to the coordinator, whose stall
    // timeout turns the missing rank into errors. Unstaged here, staged on the others, the
    // op is negotiated (the staging is an agreed fact).
    if (!BeforeWrite(idle, Timeline::NowMicros() + kStageWaitMicros)) return false;
    write();
  }
  return Staged();
}

bool SharedCollectives::StageAllreduce(const std::vector<Piece>& pieces, DType dtype,
                                       const std::function<void(int64_t since)>& idle) {
  const size_t item = DTypeSize(dtype);
  const size_t total = Elements(pieces);
  if (Sliced(total * item)) {
    staged_ = false;
    return false;
  }
  return StageHalf(/*writes=*/true, idle, [&] {
    WritePieces(half(rank_), pieces, 0, std::min(kHalfBytes / item, total), item);
  });
}

void SharedCollectives::Allreduce(const std::vector<Piece>& pieces, DType dtype, bool average,
                                  const std::function<void(int64_t since)>& idle, bool staged) {
  const bool ahead = TakeStaged(staged);
  const size_t item = DTypeSize(dtype);
  const size_t total = Elements(pieces);
  if (!Sliced(total * item)) return AllreduceByAll(pieces, total, dtype, average, idle, ahead);
  sliced_last_ = true;
  const size_t per_round = kRoundBytes / item;
  for (size_t base = 0; base < total; base += per_round) {
    StartRound(/*timed=*/true);
    const size_t m = std::min(per_round, total - base);
    const Slices lo(m, item, size_);  // segments start on 64-byte boundaries of the areas
    const size_t first = lo(rank_), last = lo(rank_ + 1);
    // The others' segments of this rank's inputs; its own it sums where they are.
    char* mine = input(rank_);
    auto copy_in = [&](size_t from, size_t to) {
      WritePieces(mine + from * item, pieces, base + from, to - from, item);
    };
    copy_in(0, first);
    copy_in(last, m);
    Meet(idle);
    ForEachRun(
        pieces, base + first, base + last, [&](const Piece& p, size_t at, size_t n, size_t pos) {
          const size_t offset = (first + pos) * item;
          auto term = [&](int r) -> const char* {
            return r == rank_ ? static_cast<const char*>(p.in) + at * item : input(r) + offset;
          };
          SumInRankOrder(result(rank_) + offset, term, size_, dtype, n, average);
        });
    Meet(idle);
    for (int r = 0; r < size_; ++r) {
      const char* sums = result(r);
      ForEachRun(pieces, base + lo(r), base + lo(r + 1),
                 [&](const Piece& p, size_t at, size_t n, size_t pos) {
                   std::memcpy(static_cast<char*>(p.out) + at * item, sums + (lo(r) + pos) * item,
                               n * item);
                 });
    }
    EndRound();
  }
}

char* SharedCollectives::half(int rank) const { return result(rank) + (halves_ % 2) * kHalfBytes; }

void SharedCollectives::StartHalves(const std::function<void(int64_t since)>& idle) {
  // After a sliced allreduce the others may still be copying sums out of this rank's
  // result area, which a round in halves writes before its meeting.
  if (sliced_last_) Meet(idle);
  sliced_last_ = false;
}

void SharedCollectives::WritePieces(char* to, const std::vector<Piece>& pieces, size_t base,
                                    size_t m, size_t item) {
  ForEachRun(pieces, base, base + m, [&](const Piece& p, size_t at, size_t n, size_t pos) {
    CopyIn(to + pos * item, static_cast<const char*>(p.in) + at * item, n * item);
  });
}

void SharedCollectives::AllreduceByAll(const std::vector<Piece>& pieces, size_t total, DType dtype,
                                       bool average, const std::function<void(int64_t since)>& idle,
                                       bool ahead) {
  if (!ahead) StartHalves(idle);
  const size_t item = DTypeSize(dtype);
  const size_t per_round = kHalfBytes / item;
  for (size_t base = 0; base < total; base += per_round, ++halves_) {
    const size_t m = std::min(per_round, total - base);
    if (ahead && base == 0) {
      MetAhead();
    } else {
      StartRound(/*timed=*/true);
      BeforeWrite(idle);
      WritePieces(half(rank_), pieces, base, m, item);
      Meet(idle);
    }
    ForEachRun(pieces, base, base + m, [&](const Piece& p, size_t at, size_t n, size_t pos) {
      // Two ranks read their own input where it is (Add reads an element's two terms before
      // it writes the sum, so the output may be the input); more ranks read every term from
      // the areas, as the output may be an input a later AddInPlace would read.
      auto term = [&](int r) -> const char* {
        return size_ == 2 && r == rank_ ? static_cast<const char*>(p.in) + at * item
                                        : half(r) + pos * item;
      };
      SumInRankOrder(static_cast<char*>(p.out) + at * item, term, size_, dtype, n, average);
    });
    EndRound();
  }
}

bool SharedCollectives::StageBroadcast(const std::vector<Piece>& pieces, size_t item, int root,
                                       const std::function<void(int64_t since)>& idle) {
  return StageHalf(/*writes=*/rank_ == root, idle, [&] {
    const size_t total = Elements(pieces);
    WritePieces(half(rank_), pieces, 0, std::min(kHalfBytes / item, total), item);
  });
}

void SharedCollectives::Broadcast(const std::vector<Piece>& pieces, size_t item, int root,
                                  const std::function<void(int64_t since)>& idle, bool staged) {
  const bool ahead = TakeStaged(staged);
  if (!ahead) StartHalves(idle);
  const size_t total = Elements(pieces);
  const size_t per_round = kHalfBytes / item;
  for (size_t base = 0; base < total; base += per_round, ++halves_) {
    // A staged first round: the root's inputs are in its half, and every rank knows.
    const bool met = ahead && base == 0;
    if (!met) StartRound(/*timed=*/false);
    const size_t m = std::min(per_round, total - base);
    char* area = half(root);
    // The meeting goes one way: the root counts in once its inputs are in the area and goes
    // on; the others wait for that count alone, copy out, then count in.
    if (rank_ == root) {
      if (!met) {
        BeforeWrite(idle);
        WritePieces(half(rank_), pieces, base, m, item);
      }
      Count(++meetings_);
      ForEachRun(pieces, base, base + m, [&](const Piece& p, size_t at, size_t n, size_t) {
        if (p.out != p.in) {
          std::memcpy(static_cast<char*>(p.out) + at * item,
                      static_cast<const char*>(p.in) + at * item, n * item);
        }
      });
    } else {
      const uint64_t mark = ++meetings_;
      if (!met) WaitFor(root, root + 1, mark, idle);
      ForEachRun(pieces, base, base + m, [&](const Piece& p, size_t at, size_t n, size_t pos) {
        std::memcpy(static_cast<char*>(p.out) + at * item, area + pos * item, n * item);
      });
      Count(mark);
    }
    one_way_before_ = one_way_last_;
    one_way_last_ = true;
  }
}

void SharedCollectives::WritePart(const void* in, size_t base, size_t n) {
  if (n > 0) CopyIn(half(rank_), static_cast<const char*>(in) + base, n);
}

bool SharedCollectives::StageAllgather(const void* in, size_t part_bytes,
                                       const std::function<void(int64_t since)>& idle) {
  return StageHalf(/*writes=*/true, idle,
                   [&] { WritePart(in, 0, std::min(kHalfBytes, part_bytes)); });
}

void SharedCollectives::Allgather(const void* in, void* out, const std::vector<size_t>& part_bytes,
                                  const std::function<void(int64_t since)>& idle, bool staged) {
  const bool ahead = TakeStaged(staged);
  if (!ahead) StartHalves(idle);
  std::vector<size_t> offset(size_ + 1, 0);
  for (int r = 0; r < size_; ++r) offset[r + 1] = offset[r] + part_bytes[r];
  const size_t longest = *std::max_element(part_bytes.begin(), part_bytes.end());
  char* gathered = static_cast<char*>(out);
  for (size_t base = 0; base < longest; base += kHalfBytes, ++halves_) {
    const bool met = ahead && base == 0;
    auto length = [&](int r) {
      return part_bytes[r] > base ? std::min(kHalfBytes, part_bytes[r] - base) : size_t{0};
    };
    if (!met) {
      StartRound(/*timed=*/false);
      BeforeWrite(idle);
      WritePart(in, base, length(rank_));
    }
    if (const size_t n = length(rank_); n > 0 && gathered != nullptr) {
      std::memcpy(gathered + offset[rank_] + base, static_cast<const char*>(in) + base, n);
    }
    if (met) {
      MetAhead();
    } else {
      Meet(idle);
    }
    for (int r = 0; r < size_ && gathered != nullptr; ++r) {
      if (const size_t n = length(r); r != rank_ && n > 0) {
        std::memcpy(gathered + offset[r] + base, half(r), n);
      }
    }
  }
}

void SharedCollectives::Exchange(const std::vector<Piece>& pieces, DType dtype,
                                 const std::vector<std::pair<int, double>>& send,
                                 const std::vector<int>& from, const std::vector<char*>& scratch,
                                 const Received& arrived,
                                 const std::function<void(int64_t since)>& idle, bool staged) {
  const bool ahead = TakeStaged(staged);
  if (!ahead) StartHalves(idle);
  const size_t item = DTypeSize(dtype);
  const size_t head = ScalesBytes();
  const size_t per_round = ExchangeRoundElements(item);
  const size_t count = Elements(pieces);
  std::vector<const char*> round(from.size()), run(from.size());
  for (size_t base = 0; base < count; base += per_round, ++halves_) {
    const size_t m = std::min(per_round, count - base);
    if (ahead && base == 0) {
      MetAhead();
    } else {
      StartRound(/*timed=*/false);
      BeforeWrite(idle);
      WriteExchange(pieces, base, m, item, send);
      Meet(idle);
    }
    for (size_t k = 0; k < from.size(); ++k) {
      const char* theirs = half(from[k]);
      const double factor = reinterpret_cast<const double*>(theirs)[rank_];
      round[k] = theirs + head;
      if (factor != 1.0) {
        WeightedSum(scratch[k], dtype, m, {{round[k], factor}});
        round[k] = scratch[k];
      }
    }
    ForEachRun(pieces, base, base + m, [&](const Piece& p, size_t at, size_t n, size_t pos) {
      for (size_t k = 0; k < from.size(); ++k) run[k] = round[k] + pos * item;
      arrived(p, at, n, run);
    });
  }
}

void SharedCollectives::WriteExchange(const std::vector<Piece>& pieces, size_t base, size_t m,
                                      size_t item,
                                      const std::vector<std::pair<int, double>>& send) {
  char* mine = half(rank_);
  // Every destination's scale, so that none is left from a round before.
  auto* scales = reinterpret_cast<double*>(mine);
  std::fill(scales, scales + size_, 1.0);
  for (const auto& [to, factor] : send) scales[to] = factor;
  WritePieces(mine + ScalesBytes(), pieces, base, m, item);
}

bool SharedCollectives::StageExchange(const std::vector<Piece>& pieces, DType dtype,
                                      const std::vector<std::pair<int, double>>& send,
                                      const std::function<void(int64_t since)>& idle) {
  const size_t item = DTypeSize(dtype);
  const size_t count = Elements(pieces);
  return StageHalf(/*writes=*/true, idle, [&] {
    WriteExchange(pieces, 0, std::min(ExchangeRoundElements(item), count), item, send);
  });
}

bool SharedCollectives::StageDirect(const void* in, const std::vector<std::pair<int, double>>* send,
                                    void* out) {
  // The direct ops write no area: nothing to wait for (see AllgatherDirect).
  staged_ = false;
  if (!direct_reads()) return false;
  PostDirect(in, send, out);
  return Staged();
}

void SharedCollectives::PostDirect(const void* in, const std::vector<std::pair<int, double>>* send,
                                   void* out) {
  if (send != nullptr) PostScales(*send);
  post(rank_)->store(reinterpret_cast<uintptr_t>(in), std::memory_order_relaxed);
  post_out(rank_)->store(reinterpret_cast<uintptr_t>(out), std::memory_order_relaxed);
}

void SharedCollectives::PostScales(const std::vector<std::pair<int, double>>& send) {
  auto bits = [](double d) {
    uint64_t b;
    std::memcpy(&b, &d, sizeof(b));
    return b;
  };
  // Every entry of this rank's row, so that none is left from an op before.
  for (int r = 0; r < size_; ++r) scale(rank_, r)->store(bits(1.0), std::memory_order_relaxed);
  for (const auto& [to, factor] : send) {
    scale(rank_, to)->store(bits(factor), std::memory_order_relaxed);
  }
}

Status SharedCollectives::AllgatherDirect(const void* in, void* out,
                                          const std::vector<size_t>& part_bytes,
                                          const std::function<void(int64_t since)>& idle,
                                          bool staged) {
  return GatherDirect(in, out, part_bytes, idle, staged, "allgather", "part");
}

Status SharedCollectives::BroadcastDirect(const void* in, void* out, size_t bytes, int root,
                                          const std::function<void(int64_t since)>& idle,
                                          bool staged) {
  std::vector<size_t> parts(size_, 0);
  parts[root] = bytes;
  return GatherDirect(rank_ == root ? in : nullptr, out, parts, idle, staged, "broadcast", "input");
}

Status SharedCollectives::GatherDirect(const void* in, void* out,
                                       const std::vector<size_t>& part_bytes,
                                       const std::function<void(int64_t since)>& idle, bool staged,
                                       const char* op, const char* thing) {
  const bool ahead = TakeStaged(staged);
  std::vector<size_t> offset(size_ + 1, 0);
  for (int r = 0; r < size_; ++r) offset[r + 1] = offset[r] + part_bytes[r];
  char* gathered = static_cast<char*>(out);
  // This rank's own part while the others count in.
  auto own = [&] {
    // (A broadcast's root in place has its input where it goes already.)
    if (part_bytes[rank_] > 0 && gathered != nullptr && gathered + offset[rank_] != in) {
      std::memcpy(gathered + offset[rank_], in, part_bytes[rank_]);
    }
  };
  if (ahead) {
    MetAhead();
    own();
  } else {
    PostDirect(in, nullptr);
    Meet(idle, own);
  }
  Status status = OkStatus();
  for (int k = 1; k < size_ && status.ok() && gathered != nullptr; ++k) {
    const int r = (rank_ + k) % size_;  // each rank starts with a different one
    if (part_bytes[r] == 0) continue;
    status = ReadPosted(r, gathered + offset[r], part_bytes[r], op, thing);
  }
  // Done reading: the others may return. The areas were not written, and every rank has
  // read what ops before left in them (it counted in here after): nothing to wait for
  // before the next op writes them.
  Meet(idle);
  sliced_last_ = false;
  return status;
}

Status SharedCollectives::ExchangeDirect(const void* in, size_t count, DType dtype,
                                         const std::vector<std::pair<int, double>>& send,
                                         const std::vector<int>& from,
                                         const std::vector<char*>& into,
                                         const std::function<void(int64_t since)>& idle,
                                         bool staged) {
  if (TakeStaged(staged)) {
    MetAhead();
  } else {
    PostDirect(in, &send);
    Meet(idle);
  }
  const size_t bytes = count * DTypeSize(dtype);
  Status status = OkStatus();
  for (size_t k = 0; k < from.size() && status.ok(); ++k) {
    const int r = from[k];
    status = ReadPosted(r, into[k], bytes, "neighbor exchange", "input");
    if (!status.ok()) break;
    const uint64_t b = scale(r, rank_)->load(std::memory_order_relaxed);
    double factor;
    std::memcpy(&factor, &b, sizeof(factor));
    if (factor != 1.0) WeightedSum(into[k], dtype, count, {{into[k], factor}});
  }
  Meet(idle);  // done reading (see AllgatherDirect)
  sliced_last_ = false;
  return status;
}

Status SharedCollectives::AllreduceDirect(const void* in, void* out, size_t count, DType dtype,
                                          bool average,
                                          const std::function<void(int64_t since)>& idle,
                                          bool staged) {
  if (TakeStaged(staged)) {
    MetAhead();
  } else {
    PostDirect(in, nullptr, out);
    Meet(idle);
  }
  const size_t item = DTypeSize(dtype);
  const Slices lo(count, item, size_);  // slices start on 64-byte boundaries of the tensor
  // The others' terms (and, in place where this rank's own term is not among the first
  // two, its own: the sum overwrites it before it is added) come a block at a time.
  const size_t block = std::max<size_t>(1, std::min(kBlockBytes / item, lo.per));
  const bool copy_own = in == out && rank_ >= 2;
  // Out of place, the first of the others' terms in rank order (rank 0's; on rank 0, rank
  // 1's) is read straight into the output, where the sum then overwrites it: the read
  // writes whole lines of the output, which the sum finds in the cache, instead of a
  // scratch block beside an output the sum would first have to load.
  const int into_out = in != out && size_ > 1 ? (rank_ == 0 ? 1 : 0) : -1;
  const int blocks = size_ - (copy_own ? 0 : 1) - (into_out >= 0 ? 1 : 0);
  scratch_.resize(static_cast<size_t>(blocks) * block * item);
  Status status = OkStatus();
  bool wrote = true;  // whether a failure was in writing the sums (else in reading)
  const char* mine = static_cast<const char*>(in);
  char* sums = static_cast<char*>(out);
  std::vector<const char*> terms(size_);
  // This rank's blocks go first to last, and in the next op last to first: the lines that
  // op touched last, still in this core's cache, come first then. Where an op's lines about
  // fill the cache, the same order every op would find each line evicted just before it
  // comes back to it (bench/README.md: 2 ranks, 1-4 MiB, on a VM with 2 MiB of L2 a core).
  const size_t first = lo(rank_), end = lo(rank_ + 1);
  const size_t steps = end > first ? (end - first + block - 1) / block : 0;
  const bool backward = backward_;
  backward_ = !backward_;
  for (size_t step = 0; step < steps && status.ok(); ++step) {
    const size_t at = first + (backward ? steps - 1 - step : step) * block;
    const size_t n = std::min(block, end - at);
    for (int r = 0, k = 0; r < size_ && status.ok(); ++r) {
      if (r == rank_ && !copy_own) {
        terms[r] = mine + at * item;
        continue;
      }
      char* to = r == into_out ? sums + at * item
                               : scratch_.data() + static_cast<size_t>(k++) * block * item;
      terms[r] = to;
      if (r == rank_) {
        std::memcpy(to, mine + at * item, n * item);
      } else {
        status = ReadPosted(r, to, n * item, "allreduce", "input", at * item);
      }
    }
    if (!status.ok()) {
      wrote = false;
      break;
    }
    SumInRankOrder(
        sums + at * item, [&](int r) { return terms[r]; }, size_, dtype, n, average);
    // The block of the sums goes to the others' outputs while it is still in this core's
    // cache; in place, their lines of it are there too, just read as their terms.
    for (int k = 1; k < size_ && status.ok(); ++k) {
      const int r = (rank_ + k) % size_;  // each rank starts with a different one
      status = WriteOut(r, sums + at * item, n * item, at * item);
    }
  }
  // Whether this rank read and wrote what it had to, seen by the others once they have
  // met it: each output is whole only if every rank wrote its slice there, so every rank
  // fails the op alike. Each word is read before its reader counts in to the next op's
  // first meeting, and written again only after that one (staged, after the agreement that
  // stands for it, which no rank joins before its last op is done).
  post_failed(rank_)->store(status.ok() ? 0 : wrote ? 2 : 1, std::memory_order_relaxed);
  Meet(idle);
  for (int r = 0; r < size_ && status.ok(); ++r) {
    const uint64_t failed = r == rank_ ? 0 : post_failed(r)->load(std::memory_order_relaxed);
    if (failed != 0) {
      status = Internal("allreduce: rank ", r,
                        failed == 1 ? " could not read another rank's input"
                                    : " could not write its sums into another rank's output");
    }
  }
  sliced_last_ = false;
  return status;
}

Status SharedCollectives::ReadPosted(int rank, void* to, size_t bytes, const char* op,
                                     const char* thing, size_t offset) const {
  const auto* from = reinterpret_cast<const char*>(
                         static_cast<uintptr_t>(post(rank)->load(std::memory_order_relaxed))) +
                     offset;
  const Status status = ReadProcessMemory(pids_[rank], from, to, bytes);
  if (status.ok()) return status;
  return Annotate(status,
                  absl::StrCat(op, ": reading rank ", rank, "'s ", thing, " from its memory"));
}

Status SharedCollectives::WriteOut(int rank, const void* from, size_t bytes, size_t offset) const {
  auto* to = reinterpret_cast<char*>(
                 static_cast<uintptr_t>(post_out(rank)->load(std::memory_order_relaxed))) +
             offset;
  const Status status = WriteProcessMemory(pids_[rank], from, to, bytes);
  if (status.ok()) return status;
  return Annotate(status, absl::StrCat("allreduce: writing rank ", rank, "'s output"));
}

namespace {

// process_vm_readv (`write` false: `remote` into `local`) or process_vm_writev (`local` into
// `remote`), until every byte has gone.
Status CopyProcessMemory(int64_t pid, void* local_at, void* remote_at, size_t bytes, bool write) {
  size_t done = 0;
  while (done < bytes) {
    iovec local{static_cast<char*>(local_at) + done, bytes - done};
    iovec remote{static_cast<char*>(remote_at) + done, bytes - done};
    const ssize_t n = write ? process_vm_writev(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0)
                            : process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : EIO;
      return Internal(write ? "process_vm_writev of " : "process_vm_readv of ", bytes - done,
                      write ? " bytes to process " : " bytes from process ", pid,
                      " failed: ", std::strerror(error),
                      error == EPERM ? " (the kernel does not let this process reach the other's "
                                       "memory; set WEFT_CROSS_MEMORY_ATTACH_BYTES=0 before "
                                       "init())"
                                     : "");
    }
    done += static_cast<size_t>(n);
  }
  return OkStatus();
}

}  // namespace

Status ReadProcessMemory(int64_t pid, const void* from, void* to, size_t bytes) {
  return CopyProcessMemory(pid, to, const_cast<void*>(from), bytes, /*write=*/false);
}

Status WriteProcessMemory(int64_t pid, const void* from, void* to, size_t bytes) {
  return CopyProcessMemory(pid, const_cast<void*>(from), to, bytes, /*write=*/true);
}

}  // namespace comm
}  // namespace weft
