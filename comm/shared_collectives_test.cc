#include "comm/shared_collectives.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/reduce.h"
#include "gtest/gtest.h"

namespace weft {
namespace comm {
namespace {

// Memory as a fresh shared segment is: zeroed, on a page boundary.
struct Shared {
  explicit Shared(int size) : bytes(SharedCollectives::Footprint(size)) {
    memory = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    std::memset(memory, 0, bytes);
  }
  ~Shared() { std::free(memory); }
  size_t bytes;
  void* memory;
};

// Threads wait for each other as ranks that share cores do.
void Yield(int64_t since) { std::this_thread::yield(); }

// Runs body(rank, reduce) on `size` threads, one rank each, over one shared block, each
// rank copying into the areas as copies(rank) says.
template <typename Copies, typename Body>
void OnRanksCopying(int size, Copies copies, Body body) {
  Shared shared(size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      SharedCollectives reduce(shared.memory, size, rank, copies(rank));
      body(rank, reduce);
    });
  }
  for (auto& t : threads) t.join();
}

// The same with rank 0's tuner choosing the copies.
template <typename Body>
void OnRanks(int size, Body body) {
  OnRanksCopying(
      size, [](int) { return std::optional<CopyMode>(); }, body);
}

// Every way copies into the areas go: fixed plain or streamed, tuned, and mixed (rank 0
// streams and the others do not, as while the others have not seen the tuner's change yet).
const std::vector<std::pair<const char*, std::optional<CopyMode> (*)(int)>>& CopyWays() {
  static const std::vector<std::pair<const char*, std::optional<CopyMode> (*)(int)>> ways = {
      {"plain", [](int) { return std::optional<CopyMode>(CopyMode::kPlain); }},
      {"streamed", [](int) { return std::optional<CopyMode>(CopyMode::kStream); }},
      {"tuned", [](int) { return std::optional<CopyMode>(); }},
      {"mixed",
       [](int rank) {
         return std::optional<CopyMode>(rank == 0 ? CopyMode::kStream : CopyMode::kPlain);
       }},
  };
  return ways;
}

// Tensors of odd sizes (one empty), some in place and some not, spanning several rounds;
// or, `small`, fewer than kAllSumBytes in all.
std::vector<size_t> Counts(bool small = false) {
  const size_t round = SharedCollectives::kRoundBytes / sizeof(float);
  if (small) return {1, 0, 1000, 17, 4096};
  return {1, 0, 1000, round - 3, 17, 2 * round + 5, 4096};
}

float Value(int rank, int tensor, size_t i) {
  return static_cast<float>((rank + 1) * 1000 + tensor * 7 + static_cast<int>(i % 97));
}

// One rank's tensors of Counts(): inputs holding Value(rank, ...), outputs -1; the odd ones
// in place. The pieces point into the vectors, so it stays where it was made.
struct RankTensors {
  explicit RankTensors(int rank, bool small = false)
      : counts(Counts(small)), ins(counts.size()), outs(counts.size()) {
    for (size_t t = 0; t < counts.size(); ++t) {
      ins[t].resize(counts[t]);
      for (size_t i = 0; i < counts[t]; ++i) ins[t][i] = Value(rank, t, i);
      outs[t].assign(counts[t], -1.0f);
      pieces.push_back({ins[t].data(), InPlace(t) ? ins[t].data() : outs[t].data(), counts[t]});
    }
  }
  RankTensors(const RankTensors&) = delete;
  RankTensors& operator=(const RankTensors&) = delete;
  static bool InPlace(size_t t) { return t % 2 == 1; }
  const std::vector<float>& result(size_t t) const { return InPlace(t) ? ins[t] : outs[t]; }

  const std::vector<size_t> counts;
  std::vector<std::vector<float>> ins, outs;
  std::vector<SharedCollectives::Piece> pieces;
};

// Large and small groups in turn: more than two ranks sum large ones by slices and small
// ones each in full, and each kind must wait for what the other left in the areas.
TEST(SharedCollectivesTest, SumsEveryTensorOverEveryRankInPlaceOrNot) {
  for (const auto& [way, copies] : CopyWays()) {
    for (int size : {1, 2, 3, 4, 5}) {
      OnRanksCopying(size, copies, [&](int rank, SharedCollectives& reduce) {
        for (bool small : {false, true, true, false, true}) {
          RankTensors x(rank, small);
          reduce.Allreduce(x.pieces, DType::kFloat32, /*average=*/false, Yield);
          for (size_t t = 0; t < x.counts.size(); ++t) {
            for (size_t i = 0; i < x.counts[t]; ++i) {
              float want = 0;
              for (int r = 0; r < size; ++r) want += Value(r, t, i);
              ASSERT_EQ(x.result(t)[i], want) << way << " copies, size " << size << " rank " << rank
                                              << " tensor " << t << " element " << i;
              if (!RankTensors::InPlace(t)) {
                ASSERT_EQ(x.ins[t][i], Value(rank, t, i)) << "input changed";
              }
            }
          }
        }
      });
    }
  }
}

// A fused group of many small tensors (what the streamed copies are for), op after op, long
// enough for rank 0's tuner to try both ways and switch between them while the other ranks
// follow a round or more late: every op's sums stay right.
TEST(SharedCollectivesTest, SmallTensorsSumRightWhileTheTunerSwitches) {
  constexpr int kTensors = 48;
  constexpr size_t kCount = 1000;  // 4000 bytes each: copies that may stream
  for (int size : {2, 3}) {
    OnRanks(size, [&](int rank, SharedCollectives& reduce) {
      std::vector<std::vector<float>> ins(kTensors), outs(kTensors);
      std::vector<SharedCollectives::Piece> pieces;
      for (int t = 0; t < kTensors; ++t) {
        ins[t].resize(kCount);
        outs[t].resize(kCount);
        pieces.push_back({ins[t].data(), outs[t].data(), kCount});
      }
      for (int op = 0; op < 40; ++op) {
        for (int t = 0; t < kTensors; ++t) {
          for (size_t i = 0; i < kCount; ++i) ins[t][i] = Value(rank, t + op, i);
        }
        reduce.Allreduce(pieces, DType::kFloat32, /*average=*/false, Yield);
        for (int t = 0; t < kTensors; ++t) {
          for (size_t i = 0; i < kCount; ++i) {
            float want = 0;
            for (int r = 0; r < size; ++r) want += Value(r, t + op, i);
            ASSERT_EQ(outs[t][i], want)
                << "size " << size << " op " << op << " rank " << rank << " tensor " << t;
          }
        }
      }
    });
  }
}

// Every rank receives the same bits, those of a sum in rank order, also where float sums
// round; and consecutive ops (of other sizes, dtypes and kinds) continue in step. Two ranks
// sum every element each; four sum the large op by slices and the small one each in full.
TEST(SharedCollectivesTest, EveryRankGetsTheRankOrderSumBitForBit) {
  for (int size : {2, 4}) {
    const size_t count = SharedCollectives::kRoundBytes / sizeof(float) + 123;
    std::vector<std::vector<float>> inputs(size, std::vector<float>(count));
    std::mt19937 gen(7);
    std::uniform_real_distribution<float> dist(-1e3f, 1e3f);
    for (auto& in : inputs) {
      for (float& x : in) x = dist(gen);
    }
    // Every 1000th element a NaN of another payload on each rank: which NaN a sum of two
    // carries depends on their order, and every rank must still get the same one.
    auto nan_at = [](size_t i) { return i % 1000 == 7; };
    for (int r = 0; r < size; ++r) {
      const uint32_t bits = 0x7fc00000u | static_cast<uint32_t>(r + 1);
      for (size_t i = 7; i < count; i += 1000) std::memcpy(&inputs[r][i], &bits, sizeof bits);
    }
    std::vector<float> want(count);
    for (size_t i = 0; i < count; ++i) {
      float s = inputs[0][i] + inputs[1][i];
      for (int r = 2; r < size; ++r) s += inputs[r][i];
      want[i] = s / size;
    }
    std::vector<std::vector<float>> got(size, std::vector<float>(count));
    std::vector<std::vector<int64_t>> ints(size, std::vector<int64_t>(3));
    std::vector<std::vector<int32_t>> gathered(size, std::vector<int32_t>(size));
    OnRanks(size, [&](int rank, SharedCollectives& reduce) {
      for (int round = 0; round < 3; ++round) {
        reduce.Allreduce({{inputs[rank].data(), got[rank].data(), count}}, DType::kFloat32,
                         /*average=*/true, Yield);
        // An int64 average rounds to nearest, halves away from zero: (1 + 2) / 2 and
        // (1 + 2 + 3 + 4) / 4.
        std::vector<int64_t> mine = {rank + 1, -(rank + 1), int64_t{1} << 40};
        reduce.Allreduce({{mine.data(), ints[rank].data(), 3}}, DType::kInt64, true, Yield);
        const int32_t me = rank;
        reduce.Allgather(&me, gathered[rank].data(), std::vector<size_t>(size, sizeof(me)), Yield);
      }
    });
    const int64_t average = size == 2 ? 2 : 3;
    for (int r = 0; r < size; ++r) {
      ASSERT_EQ(std::memcmp(got[r].data(), got[0].data(), count * sizeof(float)), 0)
          << "size " << size << ": rank " << r << " got other bits than rank 0";
      for (size_t i = 0; i < count; ++i) {
        if (nan_at(i)) {
          ASSERT_TRUE(std::isnan(got[r][i])) << "size " << size << " rank " << r << " at " << i;
        } else {
          ASSERT_EQ(std::memcmp(&got[r][i], &want[i], sizeof(float)), 0)
              << "size " << size << " rank " << r << " at " << i;
        }
      }
      EXPECT_EQ(ints[r], (std::vector<int64_t>{average, -average, int64_t{1} << 40}))
          << "size " << size << " rank " << r;
      for (int q = 0; q < size; ++q) EXPECT_EQ(gathered[r][q], q);
    }
  }
}

// 16-bit floats sum as reduce.h's Add does (the MPI reduction weft gives them).
TEST(SharedCollectivesTest, HalfPrecisionSumsAsAdd) {
  constexpr int kSize = 3;
  constexpr size_t kCount = 1001;
  std::vector<std::vector<uint16_t>> inputs(kSize, std::vector<uint16_t>(kCount));
  for (int r = 0; r < kSize; ++r) {
    std::vector<float> f(kCount);
    for (size_t i = 0; i < kCount; ++i) f[i] = 0.1f * static_cast<float>(i) + r;
    FromFloatsForTesting(DType::kFloat16, f.data(), inputs[r].data(), kCount);
  }
  std::vector<uint16_t> want(kCount);
  Add(want.data(), inputs[0].data(), inputs[1].data(), DType::kFloat16, kCount);
  AddInPlace(want.data(), inputs[2].data(), DType::kFloat16, kCount);
  std::vector<std::vector<uint16_t>> got(kSize, std::vector<uint16_t>(kCount));
  OnRanks(kSize, [&](int rank, SharedCollectives& reduce) {
    reduce.Allreduce({{inputs[rank].data(), got[rank].data(), kCount}}, DType::kFloat16, false,
                     Yield);
  });
  for (int r = 0; r < kSize; ++r) EXPECT_EQ(got[r], want) << "rank " << r;
}

// Broadcast from each root of tensors spanning several rounds (one empty, some in place on
// the root): every rank gets the root's bytes; the root's inputs stay as they were.
// Broadcasts from every root in turn, large and small, with an allreduce between them (sliced
// on 3 ranks), in one run: each op must wait for what the ones before it left in the areas.
TEST(SharedCollectivesTest, BroadcastCopiesTheRootsTensorsToEveryRank) {
  for (int size : {2, 3}) {
    OnRanksCopying(size, CopyWays()[3].second, [&](int rank, SharedCollectives& shared) {
      for (int root = 0; root < size; ++root) {
        for (bool small : {false, true, false}) {
          RankTensors x(rank, small);
          shared.Broadcast(x.pieces, sizeof(float), root, Yield);
          for (size_t t = 0; t < x.counts.size(); ++t) {
            for (size_t i = 0; i < x.counts[t]; ++i) {
              ASSERT_EQ(x.result(t)[i], Value(root, t, i))
                  << "size " << size << " root " << root << " rank " << rank << " tensor " << t
                  << " element " << i;
              if (rank == root && !RankTensors::InPlace(t)) {
                ASSERT_EQ(x.ins[t][i], Value(rank, t, i)) << "the root's input changed";
              }
            }
          }
        }
        // One full round, so that the last round's sums are long to copy out.
        const size_t n = SharedCollectives::kRoundBytes / sizeof(float);
        std::vector<float> y(n);
        for (size_t i = 0; i < n; ++i) y[i] = Value(rank, 0, i);
        shared.Allreduce({{y.data(), y.data(), n}}, DType::kFloat32, /*average=*/false, Yield);
        for (size_t i = 0; i < n; ++i) {
          float want = 0;
          for (int r = 0; r < size; ++r) want += Value(r, 0, i);
          ASSERT_EQ(y[i], want) << "allreduce after root " << root << ", rank " << rank << " at "
                                << i;
        }
      }
    });
  }
}

// A broadcast's root does not wait for the others to copy its inputs out: it may start the
// next op while they still read, theirs or the op's before. (Direct allgathers among them
// write no area but must keep the meetings in step.) Ops in turn whose readers take
// long (spanning rounds) before a broadcast and short ops after it, each rank late now and
// then, and values of each op's own: a rank that wrote an area before every rank was done
// reading what it held before shows as a wrong value.
TEST(SharedCollectivesTest, BroadcastRootsRunAheadOnlyAsFarAsTheReadersAllow) {
  enum Kind { kAllgather, kBroadcast, kAllreduce, kAllgatherDirect };
  const std::vector<std::pair<Kind, bool>> pattern = {
      {kAllgather, true},  {kBroadcast, false},       {kAllreduce, false}, {kAllreduce, true},
      {kBroadcast, false}, {kAllgather, false},       {kAllgather, true},  {kBroadcast, false},
      {kAllgather, false}, {kBroadcast, true},        {kBroadcast, false}, {kAllgatherDirect, true},
      {kBroadcast, false}, {kAllgatherDirect, false}, {kAllreduce, true}};
  const size_t long_count = SharedCollectives::kRoundBytes * 3 / 4 / sizeof(float) + 5;
  for (int size : {2, 3, 4}) {
    OnRanksCopying(size, CopyWays()[3].second, [&](int rank, SharedCollectives& shared) {
      shared.EnableDirectReads(std::vector<int64_t>(size, getpid()), /*writes=*/true);
      auto value = [](int op, int r, size_t i) {
        return static_cast<float>(op * 1000 + r * 100 + static_cast<int>(i % 97));
      };
      for (int op = 0; op < 88; ++op) {
        if (rank == (op * 7 + 1) % size && op % 3 == 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(50 + 40 * (op % 5)));
        }
        const auto [kind, long_op] = pattern[op % pattern.size()];
        const size_t count = long_op ? long_count : 37;
        std::vector<float> in(count), out(count * size, -1.0f);
        for (size_t i = 0; i < count; ++i) in[i] = value(op, rank, i);
        const std::string what = "size " + std::to_string(size) + " op " + std::to_string(op) +
                                 " rank " + std::to_string(rank);
        if (kind == kBroadcast) {
          const int root = op % size;
          shared.Broadcast({{in.data(), out.data(), count}}, sizeof(float), root, Yield);
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(out[i], value(op, root, i)) << what << " broadcast, element " << i;
          }
        } else if (kind == kAllreduce) {
          shared.Allreduce({{in.data(), out.data(), count}}, DType::kFloat32, /*average=*/false,
                           Yield);
          for (size_t i = 0; i < count; ++i) {
            float want = 0;
            for (int r = 0; r < size; ++r) want += value(op, r, i);
            ASSERT_EQ(out[i], want) << what << " allreduce, element " << i;
          }
        } else {
          std::vector<size_t> parts(size, count * sizeof(float));
          if (kind == kAllgatherDirect) {
            ASSERT_TRUE(shared.AllgatherDirect(in.data(), out.data(), parts, Yield).ok());
          } else {
            shared.Allgather(in.data(), out.data(), parts, Yield);
          }
          for (int r = 0; r < size; ++r) {
            for (size_t i = 0; i < count; ++i) {
              ASSERT_EQ(out[r * count + i], value(op, r, i))
                  << what << " allgather, part " << r << " element " << i;
            }
          }
        }
      }
    });
  }
}

// Allgather of parts of different lengths (one empty, one spanning rounds): every rank's
// output holds each rank's part in rank order.
TEST(SharedCollectivesTest, AllgatherPlacesEveryPartInRankOrder) {
  constexpr int kSize = 4;
  const std::vector<size_t> parts = {5, 0, SharedCollectives::kRoundBytes * 2 + 3, 4096};
  size_t total = 0;
  for (size_t p : parts) total += p;
  auto byte = [](int rank, size_t i) { return static_cast<char>(rank * 37 + i % 251); };
  OnRanksCopying(kSize, CopyWays()[1].second, [&](int rank, SharedCollectives& shared) {
    std::vector<char> in(parts[rank]);
    for (size_t i = 0; i < in.size(); ++i) in[i] = byte(rank, i);
    std::vector<char> out(total, 0);
    for (int round = 0; round < 2; ++round) {
      shared.Allgather(in.data(), out.data(), parts, Yield);
      size_t at = 0;
      for (int r = 0; r < kSize; ++r) {
        for (size_t i = 0; i < parts[r]; ++i) {
          ASSERT_EQ(out[at + i], byte(r, i)) << "rank " << rank << " part " << r << " byte " << i;
        }
        at += parts[r];
      }
    }
  });
}

// An op of another kind between two ops of the tests below, checked: an
// allreduce of `count` elements (sliced on more than two ranks when that is long), a
// broadcast from rank op % size (a one-way meeting), or a small direct allgather.
enum class Between { kNothing, kAllreduce, kBroadcast, kAllgatherDirect };
void RunBetween(SharedCollectives& shared, int size, int rank, Between kind, size_t count, int op) {
  if (kind == Between::kAllreduce) {
    std::vector<float> y(count, static_cast<float>(rank));
    shared.Allreduce({{y.data(), y.data(), count}}, DType::kFloat32, /*average=*/false, Yield);
    ASSERT_EQ(y[count - 1], size * (size - 1) / 2.0f) << "allreduce after op " << op;
  } else if (kind == Between::kBroadcast) {
    std::vector<float> b(9, static_cast<float>(rank));
    shared.Broadcast({{b.data(), b.data(), 9}}, sizeof(float), op % size, Yield);
    ASSERT_EQ(b[8], static_cast<float>(op % size)) << "broadcast after op " << op;
  } else if (kind == Between::kAllgatherDirect) {
    std::vector<float> part(7, static_cast<float>(rank)), all(7 * size);
    ASSERT_TRUE(shared
                    .AllgatherDirect(part.data(), all.data(),
                                     std::vector<size_t>(size, 7 * sizeof(float)), Yield)
                    .ok());
    ASSERT_EQ(all[7 * size - 1], size - 1.0f) << "allgather after op " << op;
  }
}

// Direct allgathers read each part from its rank's input: parts of different lengths (one
// empty, one spanning rounds) land in rank order, op after op, with allreduces (sliced on 3
// and 4 ranks) and allgathers through the areas between. Each rank overwrites its input as
// soon as an op returns, and one rank in turn starts late: a rank that returned while
// another still read its input shows as a wrong value in that other's output.
TEST(SharedCollectivesTest, AllgatherDirectReadsEveryPartWhereItIs) {
  for (int size : {2, 3, 4}) {
    std::vector<size_t> parts = {5, 0, SharedCollectives::kRoundBytes * 3 + 3, 4096};
    parts.resize(size);
    size_t total = 0;
    for (size_t p : parts) total += p;
    auto byte = [](int op, int rank, size_t i) {
      return static_cast<char>(op * 11 + rank * 37 + i % 251);
    };
    OnRanks(size, [&](int rank, SharedCollectives& shared) {
      shared.EnableDirectReads(std::vector<int64_t>(size, getpid()), /*writes=*/true);
      std::vector<char> in(parts[rank]), out(total);
      for (int op = 0; op < 24; ++op) {
        if (rank == op % size && op % 2 == 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        for (size_t i = 0; i < in.size(); ++i) in[i] = byte(op, rank, i);
        std::fill(out.begin(), out.end(), 0);
        const bool direct = op % 3 != 2;
        if (direct) {
          const Status status = shared.AllgatherDirect(in.data(), out.data(), parts, Yield);
          ASSERT_TRUE(status.ok()) << status;
        } else {
          shared.Allgather(in.data(), out.data(), parts, Yield);
        }
        std::fill(in.begin(), in.end(), 0x7f);
        size_t at = 0;
        for (int r = 0; r < size; ++r) {
          for (size_t i = 0; i < parts[r]; ++i) {
            ASSERT_EQ(out[at + i], byte(op, r, i)) << "size " << size << " op " << op << " rank "
                                                   << rank << " part " << r << " byte " << i;
          }
          at += parts[r];
        }
        if (op % 4 == 1) {
          ASSERT_NO_FATAL_FAILURE(RunBetween(shared, size, rank, Between::kAllreduce,
                                             SharedCollectives::kRoundBytes / sizeof(float) + 9,
                                             op));
        }
      }
    });
  }
}

// Direct broadcasts: every rank gets the root's input, from each root in turn, in place on
// the root and not, each root overwriting its input as soon as its op returns while one rank
// in turn starts late (a root that returned before its readers were done shows as a wrong
// value), with allreduces and broadcasts through the areas between.
TEST(SharedCollectivesTest, BroadcastDirectReadsTheRootsInput) {
  for (int size : {2, 3, 4}) {
    const size_t bytes = SharedCollectives::kRoundBytes * 2 + 5;
    auto byte = [](int op, size_t i) { return static_cast<char>(op * 13 + i % 241); };
    OnRanks(size, [&](int rank, SharedCollectives& shared) {
      shared.EnableDirectReads(std::vector<int64_t>(size, getpid()), /*writes=*/true);
      std::vector<char> in(bytes), out(bytes);
      for (int op = 0; op < 16; ++op) {
        const int root = op % size;
        if (rank == (op + 1) % size && op % 2 == 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        const bool in_place = op % 4 < 2;
        std::fill(out.begin(), out.end(), 0);
        std::fill(in.begin(), in.end(), 0);
        std::vector<char>& root_in = in_place ? out : in;
        if (rank == root) {
          for (size_t i = 0; i < bytes; ++i) root_in[i] = byte(op, i);
        }
        if (op % 3 != 2) {
          const Status status = shared.BroadcastDirect(rank == root ? root_in.data() : nullptr,
                                                       out.data(), bytes, root, Yield);
          ASSERT_TRUE(status.ok()) << status;
        } else {
          shared.Broadcast({{root_in.data(), out.data(), bytes}}, 1, root, Yield);
        }
        std::vector<char> got = out;
        std::fill(root_in.begin(), root_in.end(), 0x7f);
        for (size_t i = 0; i < bytes; ++i) {
          ASSERT_EQ(got[i], byte(op, i)) << "size " << size << " op " << op << " root " << root
                                         << " rank " << rank << " byte " << i;
        }
        if (op % 4 == 1) {
          ASSERT_NO_FATAL_FAILURE(RunBetween(shared, size, rank, Between::kAllreduce,
                                             SharedCollectives::kRoundBytes / sizeof(float) + 9,
                                             op));
        }
      }
    });
  }
}

// A rank that cannot read another's memory (here: a process that does not exist) gets an
// error naming the rank it read, in a direct allgather and in a direct broadcast; the others'
// op succeeds, no rank waits in vain, and the ops after it run as usual.
TEST(SharedCollectivesTest, DirectReadsFailOnlyOnTheRankThatCannotRead) {
  constexpr int64_t kNoSuchProcess = 0x7ffffff0;  // above any pid_max Linux allows
  const std::vector<size_t> parts = {4096, 4096};
  OnRanks(2, [&](int rank, SharedCollectives& shared) {
    std::vector<int64_t> pids(2, getpid());
    if (rank == 1) pids[0] = kNoSuchProcess;
    shared.EnableDirectReads(pids, /*writes=*/true);
    std::vector<char> in(4096, static_cast<char>(rank + 1)), out(8192, 0);
    const Status status = shared.AllgatherDirect(in.data(), out.data(), parts, Yield);
    if (rank == 1) {
      ASSERT_FALSE(status.ok());
      EXPECT_NE(status.ToString().find("reading rank 0's part"), std::string::npos) << status;
      EXPECT_NE(status.ToString().find("process_vm_readv"), std::string::npos) << status;
    } else {
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_EQ(out[4096], 2);
    }
    EXPECT_EQ(out[rank * 4096], rank + 1) << "its own part";
    std::vector<float> y(1000, static_cast<float>(rank + 1));
    shared.Allreduce({{y.data(), y.data(), y.size()}}, DType::kFloat32, /*average=*/false, Yield);
    EXPECT_EQ(y[999], 3.0f);
    shared.Allgather(in.data(), out.data(), parts, Yield);
    EXPECT_EQ(out[0], 1);
    EXPECT_EQ(out[4096], 2);
    // A broadcast from rank 0 the same way fails on rank 1 alone, naming what it read.
    std::fill(out.begin(), out.end(), 0);
    const Status broadcast = shared.BroadcastDirect(in.data(), out.data(), 4096, 0, Yield);
    if (rank == 1) {
      ASSERT_FALSE(broadcast.ok());
      EXPECT_NE(broadcast.ToString().find("broadcast: reading rank 0's input"), std::string::npos)
          << broadcast;
    } else {
      ASSERT_TRUE(broadcast.ok()) << broadcast;
      EXPECT_EQ(out[4095], 1);
    }
    shared.Allreduce({{y.data(), y.data(), y.size()}}, DType::kFloat32, /*average=*/false, Yield);
    EXPECT_EQ(y[999], 6.0f);
  });
}

// An op's span runs from the first rank's start to the last one's end, once every rank has
// published its times under the op's tag; two ops' times are kept, by parity.
TEST(SharedCollectivesTest, AnOpsSpanIsFromTheFirstStartToTheLastEnd) {
  constexpr int kSize = 3;
  Shared shared(kSize);
  std::vector<std::unique_ptr<SharedCollectives>> ranks;
  for (int r = 0; r < kSize; ++r) {
    ranks.push_back(std::make_unique<SharedCollectives>(shared.memory, kSize, r, std::nullopt));
  }
  EXPECT_EQ(ranks[0]->OpSpan(0, 0), 0) << "nothing published yet";
  // Op 7 (tag 70), op 8 (tag 80), op 9 (tag 90).
  const int64_t starts[kSize] = {1000, 900, 1100}, ends[kSize] = {2000, 2500, 2100};
  for (int r = 0; r < kSize; ++r) ranks[r]->PublishOpTimes(7, 70, starts[r], ends[r]);
  EXPECT_EQ(ranks[0]->OpSpan(7, 70), 1600);
  EXPECT_EQ(ranks[2]->OpSpan(7, 70), 1600) << "every rank reads the same";
  EXPECT_EQ(ranks[0]->OpSpan(7, 71), 0) << "another op under the same number";
  for (int r = 0; r < kSize - 1; ++r) ranks[r]->PublishOpTimes(8, 80, 3000, 3100 + r);
  EXPECT_EQ(ranks[0]->OpSpan(8, 80), 0) << "rank 2 has not published op 8";
  ranks[2]->PublishOpTimes(8, 80, 2990, 3050);
  EXPECT_EQ(ranks[0]->OpSpan(8, 80), 111);
  EXPECT_EQ(ranks[0]->OpSpan(7, 70), 1600) << "op 8 went to the other slot";
  ranks[1]->PublishOpTimes(9, 90, 4000, 4100);
  EXPECT_EQ(ranks[0]->OpSpan(7, 70), 0) << "rank 1's op 9 took op 7's place";
  EXPECT_EQ(ranks[0]->OpSpan(9, 90), 0) << "ranks 0 and 2 have not published op 9";
  EXPECT_EQ(ranks[0]->OpSpan(8, 80), 111);
}

// Direct allreduces: every rank gets the bits of the sum in rank order (and of the average,
// as Divide makes it), those the areas give too, in four dtypes, for tensors of no element
// to several blocks per slice; in place on some ranks and not on others (in place on a rank
// past the first two, whose own term the sum would overwrite); one rank late in turn; and
// every rank overwriting its input and output as soon as its op returns: a rank that
// returned while another still read its input, or before another wrote its slice of the
// sums into its output, shows as a wrong value there.
TEST(SharedCollectivesTest, AllreduceDirectGivesTheRankOrderSum) {
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt64};
  const size_t counts[] = {0, 1, 17, 1000, 300007};
  for (int size : {2, 3, 4}) {
    // Rank r's input to op `op`: random values of the dtype (finite halves).
    auto input = [](int op, int r, DType dtype, size_t count) {
      std::vector<char> bytes(count * DTypeSize(dtype));
      if (count == 0) return bytes;
      std::mt19937 gen(op * 31 + r);
      std::vector<float> f(count);
      std::uniform_real_distribution<float> dist(-1e3f, 1e3f);
      for (float& x : f) x = dist(gen);
      if (dtype == DType::kFloat32) {
        std::memcpy(bytes.data(), f.data(), bytes.size());
      } else if (dtype == DType::kInt64) {
        for (size_t i = 0; i < count; ++i) {
          const int64_t v = static_cast<int64_t>(f[i] * 1e6f);
          std::memcpy(bytes.data() + i * 8, &v, 8);
        }
      } else {
        FromFloatsForTesting(dtype, f.data(), bytes.data(), count);
      }
      return bytes;
    };
    OnRanks(size, [&](int rank, SharedCollectives& shared) {
      shared.EnableDirectReads(std::vector<int64_t>(size, getpid()), /*writes=*/true);
      for (int op = 0; op < 40; ++op) {
        const DType dtype = dtypes[op % 4];
        const size_t count = counts[op / 4 % 5];
        const size_t bytes = count * DTypeSize(dtype);
        const bool average = op % 3 == 1;
        const bool in_place = (rank + op) % 3 == 0;
        const std::string what = "size " + std::to_string(size) + " op " + std::to_string(op) +
                                 " rank " + std::to_string(rank) + " dtype " + DTypeName(dtype) +
                                 " count " + std::to_string(count);
        std::vector<std::vector<char>> inputs;
        for (int r = 0; r < size; ++r) inputs.push_back(input(op, r, dtype, count));
        std::vector<char> want(bytes);
        if (count > 0) {
          Add(want.data(), inputs[0].data(), inputs[1].data(), dtype, count);
          for (int r = 2; r < size; ++r) AddInPlace(want.data(), inputs[r].data(), dtype, count);
          if (average) Divide(want.data(), dtype, count, size);
        }
        if (rank == op % size && op % 2 == 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        std::vector<char> in = inputs[rank], out(bytes, 0x55);
        void* to = in_place ? in.data() : out.data();
        const Status status = shared.AllreduceDirect(in.data(), to, count, dtype, average, Yield);
        const std::vector<char> got(static_cast<char*>(to), static_cast<char*>(to) + bytes);
        std::fill(in.begin(), in.end(), 0x7f);
        std::fill(out.begin(), out.end(), 0x7f);
        ASSERT_TRUE(status.ok()) << what << ": " << status;
        for (size_t i = 0; i < bytes; ++i) {
          ASSERT_EQ(got[i], want[i]) << what << " byte " << i;
        }
        // Through the areas: the same bits.
        if (op % 5 == 0 && count > 0) {
          std::vector<char> again = inputs[rank], through(bytes);
          shared.Allreduce({{again.data(), through.data(), count}}, dtype, average, Yield);
          ASSERT_EQ(std::memcmp(through.data(), want.data(), bytes), 0) << what;
        }
      }
    });
  }
}

// A rank that cannot read another's input fails a direct allreduce with an error naming
// the rank it read; the others, whose slices are whole, fail it too (saying which rank
// could not read) rather than hand out an output that lacks a slice. So too a rank that
// cannot write its sums into another's output: with 10 elements (the first rank's slice
// holds them all) and the second rank's output a page it may only read, the first rank
// reads every input but fails to write the second's output. Every rank met the others as
// often as ever: the ops after it run as usual.
TEST(SharedCollectivesTest, AllreduceDirectFailsOnEveryRankWhenOneCannotReadOrWrite) {
  constexpr int64_t kNoSuchProcess = 0x7ffffff0;  // above any pid_max Linux allows
  for (int size : {2, 3}) {
    OnRanks(size, [&](int rank, SharedCollectives& shared) {
      std::vector<int64_t> pids(size, getpid());
      if (rank == 1) pids[0] = kNoSuchProcess;
      shared.EnableDirectReads(pids, /*writes=*/true);
      std::vector<float> x(100000, static_cast<float>(rank + 1)), y(100000, -1.0f);
      const Status status =
          shared.AllreduceDirect(x.data(), y.data(), x.size(), DType::kFloat32, false, Yield);
      ASSERT_FALSE(status.ok()) << "rank " << rank;
      if (rank == 1) {
        EXPECT_NE(status.ToString().find("allreduce: reading rank 0's input"), std::string::npos)
            << status;
      } else {
        EXPECT_NE(status.ToString().find("rank 1 could not read another rank's input"),
                  std::string::npos)
            << status;
      }
      shared.Allreduce({{x.data(), x.data(), x.size()}}, DType::kFloat32, false, Yield);
      EXPECT_EQ(x[99999], size * (size + 1) / 2.0f);

      pids.assign(size, getpid());
      shared.EnableDirectReads(pids, /*writes=*/true);
      const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
      void* read_only = mmap(nullptr, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      ASSERT_NE(read_only, MAP_FAILED);
      std::vector<float> few(10, 1.0f), few_out(10, -1.0f);
      void* out = rank == 1 ? read_only : few_out.data();
      const Status write =
          shared.AllreduceDirect(few.data(), out, few.size(), DType::kFloat32, false, Yield);
      munmap(read_only, page);
      ASSERT_FALSE(write.ok()) << "rank " << rank;
      EXPECT_NE(
          write.ToString().find(rank == 0 ? "allreduce: writing rank 1's output"
                                          : "rank 0 could not write its sums into another rank's"),
          std::string::npos)
          << write;
      std::vector<float> z(1000, 1.0f);
      ASSERT_TRUE(
          shared.AllreduceDirect(z.data(), z.data(), z.size(), DType::kFloat32, false, Yield).ok());
      EXPECT_EQ(z[999], static_cast<float>(size));
    });
  }
}

// A direct neighbor exchange: each rank sends to the next two ranks (itself too on 2
// ranks, where the next but one is itself) with scales of its own (one of them 1), and
// reads from the two before it; what a rank reads is the sender's input times the
// sender's scale for it, bit for bit as WeightedSum makes a sender's scaled copy. Mixed
// with allreduces and direct allgathers, with a late rank and inputs overwritten as soon as
// an op returns: a rank that returned while another still read it shows as a wrong value.
TEST(SharedCollectivesTest, ExchangeDirectReadsScaledAsEachSenderSays) {
  for (int size : {2, 3, 4}) {
    OnRanks(size, [&](int rank, SharedCollectives& shared) {
      shared.EnableDirectReads(std::vector<int64_t>(size, getpid()), /*writes=*/true);
      const size_t count = SharedCollectives::kRoundBytes / sizeof(float) + 13;
      auto value = [](int op, int r, size_t i) {
        return static_cast<float>(op * 3 + r * 7 + static_cast<int>(i % 89)) / 7.0f;
      };
      auto scale_of = [](int op, int from, int to) {
        return (from + to + op) % 3 == 0 ? 1.0 : 1.0 / (3 + from + 2 * to + op % 2);
      };
      std::vector<float> in(count), got0(count), got1(count);
      for (int op = 0; op < 20; ++op) {
        if (rank == op % size && op % 2 == 1) {
          std::this_thread::sleep_for(std::chrono::microseconds(300));
        }
        for (size_t i = 0; i < count; ++i) in[i] = value(op, rank, i);
        std::vector<std::pair<int, double>> send;
        for (int k = 1; k <= 2; ++k) {
          const int to = (rank + k) % size;
          send.push_back({to, scale_of(op, rank, to)});
        }
        const std::vector<int> from = {(rank + size - 1) % size, (rank + size - 2) % size};
        const std::vector<char*> into = {reinterpret_cast<char*>(got0.data()),
                                         reinterpret_cast<char*>(got1.data())};
        const Status status =
            shared.ExchangeDirect(in.data(), count, DType::kFloat32, send, from, into, Yield);
        ASSERT_TRUE(status.ok()) << status;
        std::fill(in.begin(), in.end(), -1.0f);
        for (int k = 0; k < 2; ++k) {
          const int r = from[k];
          std::vector<float> theirs(count), want(count);
          for (size_t i = 0; i < count; ++i) theirs[i] = value(op, r, i);
          WeightedSum(want.data(), DType::kFloat32, count,
                      {{theirs.data(), scale_of(op, r, rank)}});
          const std::vector<float>& got = k == 0 ? got0 : got1;
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
                << "size " << size << " op " << op << " rank " << rank << " from " << r
                << " element " << i << ": " << got[i] << " against " << want[i];
          }
        }
        const Between between[] = {Between::kAllreduce, Between::kAllgatherDirect,
                                   Between::kNothing};
        ASSERT_NO_FATAL_FAILURE(RunBetween(shared, size, rank, between[op % 3], count, op));
      }
    });
  }
}

// A neighbor exchange through the areas hands each rank its in-neighbors' inputs, each
// scaled as its sender says (bit for bit as WeightedSum scales a sender's copy), round by
// round, op after op: long ops span rounds, some in pieces (a fused group, one piece
// empty) that the rounds cut across, one rank in turn starts late, the receiver writes over
// its own input from inside each round (in place), and broadcasts (one-way meetings),
// sliced allreduces and direct allgathers run between.
TEST(SharedCollectivesTest, ExchangeScalesAsEachSenderSaysRoundByRound) {
  for (int size : {2, 3, 4}) {
    OnRanksCopying(size, CopyWays()[3].second, [&](int rank, SharedCollectives& shared) {
      shared.EnableDirectReads(std::vector<int64_t>(size, getpid()), /*writes=*/true);
      const size_t long_count = 2 * shared.ExchangeRoundElements(sizeof(float)) + 13;
      auto value = [](int op, int r, size_t i) {
        return static_cast<float>(op * 3 + r * 7 + static_cast<int>(i % 89)) / 7.0f;
      };
      auto scale_of = [](int op, int from, int to) {
        return (from + to + op) % 3 == 0 ? 1.0 : 1.0 / (3 + from + 2 * to + op % 2);
      };
      for (int op = 0; op < 30; ++op) {
        if (rank == op % size && op % 2 == 1) {
          std::this_thread::sleep_for(std::chrono::microseconds(300));
        }
        const size_t count = op % 3 == 2 ? 5 : long_count;
        std::vector<float> in(count);
        for (size_t i = 0; i < count; ++i) in[i] = value(op, rank, i);
        std::vector<std::pair<int, double>> send;
        for (int k = 1; k <= 2 && k < size; ++k) {
          const int to = (rank + k) % size;
          send.push_back({to, scale_of(op, rank, to)});
        }
        std::vector<int> from = {(rank + size - 1) % size};
        if (size > 2) from.push_back((rank + size - 2) % size);
        std::vector<std::vector<float>> got(from.size(), std::vector<float>(count, -5.0f)),
            scratch(from.size(), std::vector<float>(count));
        std::vector<char*> into;
        for (auto& v : scratch) into.push_back(reinterpret_cast<char*>(v.data()));
        // The input as one piece, or (every third op) as three, one of them empty, which the
        // rounds cut across: each piece its own output (in place).
        std::vector<SharedCollectives::Piece> pieces;
        std::vector<size_t> cuts = {0, count};
        if (op % 3 == 0) cuts = {0, count / 3, count / 3, count / 3 + count / 2 + 1, count};
        for (size_t c = 0; c + 1 < cuts.size(); ++c) {
          pieces.push_back({in.data() + cuts[c], in.data() + cuts[c], cuts[c + 1] - cuts[c]});
        }
        size_t next = 0;
        shared.Exchange(
            pieces, DType::kFloat32, send, from, into,
            [&](const SharedCollectives::Piece& p, size_t at, size_t n,
                const std::vector<const char*>& received) {
              const size_t begin = static_cast<const float*>(p.in) - in.data() + at;
              ASSERT_EQ(begin, next);
              ASSERT_LE(at + n, p.count);
              next = begin + n;
              for (size_t k = 0; k < from.size(); ++k) {
                std::memcpy(&got[k][begin], received[k], n * sizeof(float));
              }
              std::fill(static_cast<float*>(p.out) + at, static_cast<float*>(p.out) + at + n,
                        -1.0f);
            },
            Yield);
        ASSERT_EQ(next, count);
        for (size_t k = 0; k < from.size(); ++k) {
          const int r = from[k];
          std::vector<float> theirs(count), want(count);
          for (size_t i = 0; i < count; ++i) theirs[i] = value(op, r, i);
          WeightedSum(want.data(), DType::kFloat32, count,
                      {{theirs.data(), scale_of(op, r, rank)}});
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(std::memcmp(&got[k][i], &want[i], sizeof(float)), 0)
                << "size " << size << " op " << op << " rank " << rank << " from " << r
                << " element " << i << ": " << got[k][i] << " against " << want[i];
          }
        }
        const Between between[] = {Between::kAllreduce, Between::kBroadcast,
                                   Between::kAllgatherDirect, Between::kNothing};
        ASSERT_NO_FATAL_FAILURE(RunBetween(shared, size, rank, between[op % 4], long_count, op));
      }
    });
  }
}

// Staged ops (shared_collectives.h): every rank writes an op's first round ahead, the ranks
// meet by other means (here a barrier of the test's own), and the op, run with `staged`,
// takes that meeting for its first. Every kind, short and spanning rounds, one rank late now
// and then, inputs overwritten as soon as an op returns; broadcasts (one-way meetings) and
// sliced allreduces before staging; ops staged and then overtaken by another op before they
// run with `staged` (as the engine may, alike on every rank), which must find their staging
// gone; and ops not staged between. Values of each op's own: a round read before it was
// written, or written while another rank still read what it replaced, shows.
TEST(SharedCollectivesTest, StagedOpsTakeTheCallersMeetingForTheirFirst) {
  enum Kind {
    kAllreduce,
    kBroadcast,
    kAllgather,
    kExchange,
    kAllgatherDirect,
    kExchangeDirect,
    kBroadcastDirect,
    kAllreduceDirect
  };
  constexpr int kKinds = 8;
  enum Mode { kStaged, kOvertaken, kPlain };
  constexpr int kModes = 3;
  const size_t long_count = SharedCollectives::kRoundBytes * 3 / 4 / sizeof(float) + 5;
  for (int size : {2, 3, 4}) {
    std::atomic<int> met{0};
    std::unique_ptr<std::atomic<int>[]> staged_on(new std::atomic<int>[2 * size]);
    OnRanksCopying(size, CopyWays()[3].second, [&](int rank, SharedCollectives& shared) {
      shared.EnableDirectReads(std::vector<int64_t>(size, getpid()), /*writes=*/true);
      int meetings = 0;
      auto meet = [&] {
        met.fetch_add(1);
        ++meetings;
        while (met.load() < meetings * size) std::this_thread::yield();
      };
      auto value = [](int op, int r, size_t i) {
        return static_cast<float>(op * 1000 + r * 100 + static_cast<int>(i % 97));
      };
      const int to = (rank + 1) % size, from = (rank + size - 1) % size;
      int staged_ops = 0;
      for (int op = 0; op < 2 * kKinds * kModes * 2; ++op) {
        const Kind kind = static_cast<Kind>(op % kKinds);
        const Mode mode = static_cast<Mode>(op / kKinds % kModes);
        const size_t count = (op / (kKinds * kModes)) % 2 == 1 ? long_count : 37;
        const std::string what = "size " + std::to_string(size) + " op " + std::to_string(op) +
                                 " kind " + std::to_string(kind) + " mode " + std::to_string(mode) +
                                 " rank " + std::to_string(rank);
        if (rank == (op * 5 + 1) % size && op % 3 == 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(50 + 40 * (op % 5)));
        }
        // Allgathers: rank r's part is count + r elements.
        const bool gather = kind == kAllgather || kind == kAllgatherDirect;
        std::vector<size_t> parts(size);
        size_t total = 0;
        for (int r = 0; r < size; ++r) total += (parts[r] = (count + r) * sizeof(float)) / 4;
        std::vector<float> in(gather ? count + rank : count), out(total, -1.0f), got(count, -1.0f);
        for (size_t i = 0; i < in.size(); ++i) in[i] = value(op, rank, i);
        const std::vector<std::pair<int, double>> send = {{to, 0.5}};
        const int root = op % size;
        auto stage = [&]() -> bool {
          switch (kind) {
            case kAllreduce:
              return shared.StageAllreduce({{in.data(), out.data(), count}}, DType::kFloat32,
                                           Yield);
            case kBroadcast:
              return shared.StageBroadcast({{in.data(), out.data(), count}}, sizeof(float), root,
                                           Yield);
            case kAllgather:
              return shared.StageAllgather(in.data(), parts[rank], Yield);
            case kExchange:
              return shared.StageExchange({{in.data(), in.data(), count}}, DType::kFloat32, send,
                                          Yield);
            case kAllgatherDirect:
            case kBroadcastDirect:
              return shared.StageDirect(in.data(), nullptr);
            case kExchangeDirect:
              return shared.StageDirect(in.data(), &send);
            case kAllreduceDirect:
              return shared.StageDirect(in.data(), nullptr, out.data());
          }
          return false;
        };
        auto run = [&](bool staged) {
          std::vector<char*> scratch = {reinterpret_cast<char*>(got.data())};
          std::vector<float> round_scratch(count);
          switch (kind) {
            case kAllreduce:
              shared.Allreduce({{in.data(), out.data(), count}}, DType::kFloat32,
                               /*average=*/false, Yield, staged);
              break;
            case kBroadcast:
              shared.Broadcast({{in.data(), out.data(), count}}, sizeof(float), root, Yield,
                               staged);
              break;
            case kAllgather:
              shared.Allgather(in.data(), out.data(), parts, Yield, staged);
              break;
            case kExchange:
              shared.Exchange(
                  {{in.data(), in.data(), count}}, DType::kFloat32, send, {from},
                  {reinterpret_cast<char*>(round_scratch.data())},
                  [&](const SharedCollectives::Piece&, size_t at, size_t n,
                      const std::vector<const char*>& received) {
                    std::memcpy(&got[at], received[0], n * sizeof(float));
                  },
                  Yield, staged);
              break;
            case kAllgatherDirect:
              ASSERT_TRUE(shared.AllgatherDirect(in.data(), out.data(), parts, Yield, staged).ok());
              break;
            case kExchangeDirect:
              ASSERT_TRUE(shared
                              .ExchangeDirect(in.data(), count, DType::kFloat32, send, {from},
                                              scratch, Yield, staged)
                              .ok());
              break;
            case kBroadcastDirect:
              ASSERT_TRUE(shared
                              .BroadcastDirect(in.data(), out.data(), count * sizeof(float), root,
                                               Yield, staged)
                              .ok());
              break;
            case kAllreduceDirect:
              ASSERT_TRUE(shared
                              .AllreduceDirect(in.data(), out.data(), count, DType::kFloat32,
                                               /*average=*/false, Yield, staged)
                              .ok());
              break;
          }
        };
        if (mode == kPlain) {
          ASSERT_NO_FATAL_FAILURE(run(false));
        } else {
          staged_on[(op % 2) * size + rank] = stage();
          meet();
          // As the engine's agreement has it: staged only where every rank staged. They
          // stage alike but where one gave up waiting for the readers of a broadcast
          // (kStageWaitMicros; a thread descheduled that long under load), and then the op
          // runs unstaged everywhere, as a negotiated op does.
          bool staged = true;
          for (int r = 0; r < size; ++r) staged = staged && staged_on[(op % 2) * size + r].load();
          staged_ops += staged ? 1 : 0;
          if (mode == kOvertaken) {
            ASSERT_NO_FATAL_FAILURE(RunBetween(shared, size, rank, Between::kBroadcast, 9, op));
          }
          ASSERT_NO_FATAL_FAILURE(run(staged));
        }
        std::fill(in.begin(), in.end(), -1.0f);
        for (size_t i = 0; i < count; ++i) {
          if (kind == kAllreduce || kind == kAllreduceDirect) {
            float want = 0;
            for (int r = 0; r < size; ++r) want += value(op, r, i);
            ASSERT_EQ(out[i], want) << what << " element " << i;
          } else if (kind == kBroadcast || kind == kBroadcastDirect) {
            ASSERT_EQ(out[i], value(op, root, i)) << what << " element " << i;
          } else if (!gather) {
            ASSERT_EQ(got[i], value(op, from, i) * 0.5f) << what << " element " << i;
          }
        }
        size_t at = 0;
        for (int r = 0; gather && r < size; at += parts[r] / sizeof(float), ++r) {
          for (size_t i = 0; i < parts[r] / sizeof(float); ++i) {
            ASSERT_EQ(out[at + i], value(op, r, i)) << what << " part " << r << " element " << i;
          }
        }
        // Before the next op's staging: a broadcast (one way), or a long allreduce (sliced
        // on more than two ranks), now and then.
        const Between between[] = {Between::kNothing, Between::kBroadcast, Between::kNothing,
                                   Between::kAllreduce, Between::kNothing};
        ASSERT_NO_FATAL_FAILURE(RunBetween(shared, size, rank, between[op % 5], long_count, op));
      }
      // Of the 64 ops staged (or overtaken), most run staged (3-4 ranks: none in halves
      // after a sliced allreduce); load may cost a few of them their staging, not most.
      EXPECT_GT(staged_ops, 32) << "size " << size << " rank " << rank;
    });
  }
}

// Staging waits for the readers of an earlier one-way meeting only so long: a reader that
// never counts in (a rank that died while reading) leaves the op unstaged, to be agreed the
// slow way, instead of holding the root's staging for good. Once the reader is back, the
// op runs unstaged and every rank gets the root's tensors.
TEST(SharedCollectivesTest, StagingGivesUpOnAReaderThatDoesNotCountIn) {
  constexpr int kSize = 2;
  constexpr size_t kCount = 37;
  std::atomic<bool> gave_up{false};
  OnRanks(kSize, [&](int rank, SharedCollectives& shared) {
    std::vector<float> first(kCount, rank == 0 ? 1.0f : -1.0f);
    std::vector<float> second(kCount, rank == 0 ? 2.0f : -1.0f);
    if (rank == 0) {
      shared.Broadcast({{first.data(), first.data(), kCount}}, sizeof(float), 0, Yield);
      const auto start = std::chrono::steady_clock::now();
      const bool staged =
          shared.StageBroadcast({{second.data(), second.data(), kCount}}, sizeof(float), 0, Yield);
      const auto waited = std::chrono::steady_clock::now() - start;
      EXPECT_FALSE(staged);
      EXPECT_GE(waited, std::chrono::microseconds(SharedCollectives::kStageWaitMicros));
      gave_up.store(true);
      shared.Broadcast({{second.data(), second.data(), kCount}}, sizeof(float), 0, Yield);
    } else {
      // Reads nothing of the first broadcast until the root has given up staging the second.
      while (!gave_up.load()) std::this_thread::yield();
      shared.Broadcast({{first.data(), first.data(), kCount}}, sizeof(float), 0, Yield);
      shared.Broadcast({{second.data(), second.data(), kCount}}, sizeof(float), 0, Yield);
    }
    EXPECT_EQ(first[kCount - 1], 1.0f) << "rank " << rank;
    EXPECT_EQ(second[kCount - 1], 2.0f) << "rank " << rank;
  });
}

TEST(ReadProcessMemoryTest, CopiesAndNamesWhatFailed) {
  std::vector<char> from(3 << 20), to(3 << 20);
  for (size_t i = 0; i < from.size(); ++i) from[i] = static_cast<char>(i % 253);
  ASSERT_TRUE(ReadProcessMemory(getpid(), from.data(), to.data(), from.size()).ok());
  EXPECT_EQ(from, to);
  const Status bad = ReadProcessMemory(getpid(), nullptr, to.data(), 64);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.ToString().find("process_vm_readv of 64 bytes from process"), std::string::npos)
      << bad;
  EXPECT_NE(bad.ToString().find("Bad address"), std::string::npos) << bad;
  EXPECT_NE(bad.ToString().find(std::to_string(getpid())), std::string::npos) << bad;
}

TEST(WriteProcessMemoryTest, CopiesAndNamesWhatFailed) {
  std::vector<char> from(3 << 20), to(3 << 20);
  for (size_t i = 0; i < from.size(); ++i) from[i] = static_cast<char>(i % 251);
  ASSERT_TRUE(WriteProcessMemory(getpid(), from.data(), to.data(), from.size()).ok());
  EXPECT_EQ(from, to);
  const Status bad = WriteProcessMemory(getpid(), from.data(), nullptr, 64);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.ToString().find("process_vm_writev of 64 bytes to process"), std::string::npos)
      << bad;
  EXPECT_NE(bad.ToString().find("Bad address"), std::string::npos) << bad;
  EXPECT_NE(bad.ToString().find(std::to_string(getpid())), std::string::npos) << bad;
}

}  // namespace
}  // namespace comm
}  // namespace weft
