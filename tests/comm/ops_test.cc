// Every op under real mpirun, with exact expected values from rank-filled tensors.
// Run on 1, 2, 4 and 8 ranks (tests/BUILD.bazel).
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "comm/topology.h"
#include "core/config.h"
#include "gtest/gtest.h"
#include "tests/comm/test_util.h"

namespace weft {
namespace {

using testing::Arena;
using testing::Buffer;
using testing::kAllDTypes;
using testing::SetOrUnset;

const auto* const kEnv = weft::testing::InitWeftForAllTests();

double Expected(DType d, double v) { return IsFloatingPoint(d) ? v : std::llround(v); }

void ExpectAll(const Buffer& b, double expected, const std::string& what) {
  const double e = Expected(b.dtype(), expected);
  const double tol = IsFloatingPoint(b.dtype()) ? testing::Tolerance(b.dtype(), e) : 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    ASSERT_NEAR(b.Get(i), e, tol) << what << " (" << DTypeName(b.dtype()) << ") element " << i
                                  << " on rank " << rank();
  }
}

// Every generator, for the topology-sweeping tests.
std::vector<std::pair<std::string, Topology>> AllTopologies(int n) {
  std::vector<std::pair<std::string, Topology>> out;
  out.emplace_back("ExponentialTwo", *ExponentialTwoGraph(n));
  out.emplace_back("Exponential3", *ExponentialGraph(n, 3));
  out.emplace_back("SymmetricExponential", *SymmetricExponentialGraph(n));
  out.emplace_back("MeshGrid2D", *MeshGrid2DGraph(n));
  out.emplace_back("Star", *StarGraph(n));
  out.emplace_back("Ring0", *RingGraph(n, 0));
  out.emplace_back("Ring1", *RingGraph(n, 1));
  out.emplace_back("Ring2", *RingGraph(n, 2));
  out.emplace_back("FullyConnected", *FullyConnectedGraph(n));
  return out;
}

// Restores the default topology when a test ends.
struct TopologyGuard {
  ~TopologyGuard() { EXPECT_TRUE(set_topology(*ExponentialGraph(size())).ok()); }
};

TEST(ProcessModel, QueriesAreConsistent) {
  const char* env_size = std::getenv("OMPI_COMM_WORLD_SIZE");
  ASSERT_NE(env_size, nullptr);
  EXPECT_EQ(size(), std::atoi(env_size));
  EXPECT_GE(rank(), 0);
  EXPECT_LT(rank(), size());
  EXPECT_EQ(local_size(), size());  // one host
  EXPECT_EQ(local_rank(), rank());
  EXPECT_EQ(machine_size(), 1);
  EXPECT_EQ(machine_rank(), 0);
  EXPECT_TRUE(is_initialized());
  EXPECT_TRUE(IsEquivalent(load_topology(), *ExponentialGraph(size())));
  EXPECT_EQ(in_neighbor_ranks(), ExponentialGraph(size())->in_neighbors(rank()));
}

TEST(ProcessModel, InitTwiceIsAnError) {
  Status st = init();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
}

TEST(Allreduce, SumAndAverageForEveryDTypeAndShape) {
  const int n = size();
  const double sum = n * (n + 1) / 2.0;  // of rank + 1
  for (DType d : kAllDTypes) {
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{}, {1}, {7}, {3, 5}, {2, 3, 4}, {1000}}) {
      for (bool average : {false, true}) {
        Buffer in(d, shape), out(d, shape);
        in.Fill(rank() + 1);
        ASSERT_TRUE(allreduce(in.view(), out.view(), average).ok());
        ExpectAll(out, average ? sum / n : sum, "allreduce");
        ExpectAll(in, rank() + 1, "allreduce input untouched");
      }
    }
  }
}

// Every element its own value, so a piece summed into the wrong place shows: sizes below
// the rank count (empty ring segments), not divisible by it, and several MiB (segments in
// several chunks). //tests:comm_ops_ring_test runs this on weft's ring.
TEST(Allreduce, ElementsKeepTheirPlaceAtAnySize) {
  const int n = size();
  const double ranks_sum = n * (n + 1) / 2.0;  // of rank + 1
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kBFloat16}) {
    for (int64_t count : {int64_t{1}, int64_t{n + 1}, int64_t{1000003}, int64_t{3} << 20}) {
      if (count > 4096 && d != DType::kFloat32) continue;
      Buffer in(d, {count}), out(d, {count});
      for (int64_t i = 0; i < count; ++i) in.Set(i, (rank() + 1) * (i % 7 + 1));
      ASSERT_TRUE(allreduce(in.view(), out.view(), false, "places").ok());
      int64_t wrong = 0, first = -1;
      for (int64_t i = 0; i < count; ++i) {
        if (out.Get(i) != ranks_sum * (i % 7 + 1)) {
          if (first < 0) first = i;
          ++wrong;
        }
      }
      EXPECT_EQ(wrong, 0) << DTypeName(d) << " x " << count << ": first wrong at " << first
                          << " (" << out.Get(first < 0 ? 0 : first) << ")";
      int64_t changed = 0;
      for (int64_t i = 0; i < count; ++i) changed += in.Get(i) != (rank() + 1) * (i % 7 + 1);
      EXPECT_EQ(changed, 0) << DTypeName(d) << " x " << count << ": the input changed";
    }
  }
}

// Averages of int64 values round to nearest (halves away from zero) exactly, also past 2^53.
TEST(Allreduce, Int64AverageIsExact) {
  const int n = size();
  const int64_t base = int64_t{1} << 58;  // the sum of 8 ranks still fits
  for (int64_t count : {int64_t{4}, int64_t{1} << 17}) {  // MPI_Allreduce, and the ring
    std::vector<int64_t> x(count, base + rank() + 1), y(count, 0);
    ASSERT_TRUE(allreduce(TensorView(x.data(), DType::kInt64, {count}),
                          TensorView(y.data(), DType::kInt64, {count}), true)
                    .ok());
    // The mean is base + (n + 1) / 2; a half rounds up.
    const int64_t want = base + (n + 2) / 2;
    EXPECT_EQ(std::count(y.begin(), y.end(), want), count) << y[0] << " vs " << want;
  }
}

// Integer sums wrap around on overflow (as MPI_SUM defines them and torch computes them), at
// every length: Open MPI 4.1's vectorized MPI_SUM saturates 8- and 16-bit integers in the
// part of a buffer that fills whole vectors and wraps in the rest, so before weft summed
// those dtypes itself 32 and 64 int8 elements saturated throughout and 31 or 65 mixed the
// two. In place and not, fused and alone.
TEST(Allreduce, IntegerSumsWrapOnOverflowAtEverySize) {
  const int n = size();
  // A value near each dtype's top, and the wrapped sum of n of them.
  struct Case {
    DType dtype;
    double value;
    double sum;
  };
  const auto wrap = [n](DType d, int64_t v) { return testing::WrappedProduct(d, v, n); };
  const std::vector<Case> cases = {
      {DType::kInt8, 100, wrap(DType::kInt8, 100)},
      {DType::kUInt8, 200, wrap(DType::kUInt8, 200)},
      {DType::kInt16, 30000, wrap(DType::kInt16, 30000)},
      {DType::kInt32, 2000000000, wrap(DType::kInt32, 2000000000)},
  };
  for (const Case& c : cases) {
    for (int64_t count : {1, 31, 32, 64, 65, 1000, 300000}) {
      for (bool in_place : {false, true}) {
        Buffer in(c.dtype, {count}), out(c.dtype, {count});
        in.Fill(c.value);
        const TensorView dst = in_place ? in.view() : out.view();
        ASSERT_TRUE(allreduce(in.view(), dst, /*average=*/false).ok()) << DTypeName(c.dtype);
        const Buffer& result = in_place ? in : out;
        int64_t wrong = 0, first = -1;
        for (int64_t i = 0; i < count; ++i) {
          if (result.Get(i) != c.sum && wrong++ == 0) first = i;
        }
        EXPECT_EQ(wrong, 0) << DTypeName(c.dtype) << " x" << count << (in_place ? " in place" : "")
                            << ": element " << first << " is " << result.Get(first < 0 ? 0 : first)
                            << ", expected " << c.sum;
      }
    }
    // Fused: a group of small ones packed into one buffer.
    std::vector<std::unique_ptr<Buffer>> xs;
    std::vector<Handle> handles;
    group_start();
    for (int k = 0; k < 4; ++k) {
      xs.push_back(std::make_unique<Buffer>(c.dtype, std::vector<int64_t>{40 + k}));
      xs.back()->Fill(c.value);
      auto h = allreduce_nonblocking(xs.back()->view(), xs.back()->view(), false);
      ASSERT_TRUE(h.ok()) << h.status();
      handles.push_back(*h);
    }
    ASSERT_TRUE(group_end().ok());
    for (size_t k = 0; k < xs.size(); ++k) {
      ASSERT_TRUE(wait(handles[k]).ok());
      for (int64_t i = 0; i < xs[k]->numel(); ++i) {
        ASSERT_EQ(xs[k]->Get(i), c.sum)
            << DTypeName(c.dtype) << " fused, op " << k << " element " << i;
      }
    }
  }
}

// Out of place from 128 KiB per rank, one machine's allreduces run weft's ring: every dtype
// (integers exact, 16-bit floats through the ring's own sum), averages, and a process set.
TEST(Allreduce, LargeOutOfPlaceEveryDTypeAndProcessSet) {
  const int n = size();
  // (i % 3 + 1) keeps every sum within int8 at 8 ranks.
  for (DType d : kAllDTypes) {
    const bool integral = d == DType::kInt32 || d == DType::kInt64 || d == DType::kInt16 ||
                          d == DType::kInt8 || d == DType::kUInt8;
    const int64_t count = (int64_t{256} << 10) * n / static_cast<int64_t>(DTypeSize(d)) + 3;
    for (bool average : {false, true}) {
      Buffer in(d, {count}), out(d, {count});
      for (int64_t i = 0; i < count; ++i) in.Set(i, (rank() + 1) * (i % 3 + 1));
      ASSERT_TRUE(allreduce(in.view(), out.view(), average).ok()) << DTypeName(d);
      int64_t wrong = 0, first = -1;
      for (int64_t i = 0; i < count; ++i) {
        double want = n * (n + 1) / 2.0 * (i % 3 + 1);
        if (average) want = integral ? std::round(want / n) : want / n;
        if (out.Get(i) != want && wrong++ == 0) first = i;
      }
      EXPECT_EQ(wrong, 0) << DTypeName(d) << (average ? " average" : " sum") << ": first wrong at "
                          << first << " (" << out.Get(first < 0 ? 0 : first) << ")";
    }
  }
  if (n < 3) return;
  // The first and last rank only; the others run an op of their own meanwhile.
  const std::vector<int> pair = {0, n - 1};
  const bool member = rank() == 0 || rank() == n - 1;
  const int64_t count = int64_t{1} << 17;  // 512 KiB of float32
  Buffer in(DType::kFloat32, {count}), out(DType::kFloat32, {count});
  in.Fill(rank() + 1);
  if (member) {
    ASSERT_TRUE(allreduce(in.view(), out.view(), false, "pair", pair).ok());
    ExpectAll(out, 1 + n, "process set of the first and last rank");
  } else {
    std::vector<int> rest;
    for (int r = 1; r < n - 1; ++r) rest.push_back(r);
    ASSERT_TRUE(allreduce(in.view(), out.view(), false, "rest", rest).ok());
    ExpectAll(out, (n - 2) * (n + 1) / 2.0, "process set of the middle ranks");
  }
}

// Lone allreduces around the limits of the default ways' sizes (on a machine whose ranks
// outnumber its CPUs, those of 64 KiB or more reach each other's memory; on 2 ranks with a
// CPU each rank 0 tunes those of 16 KiB or more) give the bits of the same ops with the
// direct access off, in place, out of place and in place on every other rank only, summed
// and averaged, with sums that round differently in another order.
TEST(Allreduce, LargeLoneOpsGiveTheBitsOfEveryOtherWay) {
  const int me = rank();
  auto value = [](int r, int64_t i) {
    return static_cast<float>(((r + 5) * 7919 * (i + 1)) % 4001) / 3.0f + 1e6f * (r % 3);
  };
  // 16 KiB, 64 KiB, 4 MiB and 16 MiB, and 4 bytes less or more.
  const int64_t counts[] = {(1 << 12) - 1, 1 << 12, (1 << 14) - 1, 1 << 14, 1 << 20, (1 << 22) + 1};
  int k = 0;
  for (int64_t count : counts) {
    for (int placement = 0; placement < 3; ++placement) {
      const bool in_place = placement == 0 || (placement == 2 && me % 2 == 0);
      const bool average = k % 2 == 1;
      std::vector<Buffer> results;
      for (const char* cma : {static_cast<const char*>(nullptr), "0"}) {
        SetOrUnset("WEFT_CROSS_MEMORY_ATTACH_BYTES", cma);
        Buffer x(DType::kFloat32, {count}), y(DType::kFloat32, {count});
        for (int64_t i = 0; i < count; ++i) x.Set(i, value(me, i));
        Buffer& out = in_place ? x : y;
        const std::string name = "lone." + std::to_string(k) + (cma ? ".off" : ".default");
        ASSERT_TRUE(allreduce(x.view(), out.view(), average, name).ok()) << name;
        results.push_back(std::move(out));
      }
      EXPECT_EQ(std::memcmp(results[0].view().data(), results[1].view().data(), count * 4), 0)
          << count << " elements, placement " << placement << (average ? ", averaged" : "");
      ++k;
    }
  }
  SetOrUnset("WEFT_CROSS_MEMORY_ATTACH_BYTES", nullptr);
}

// A ring with many chunks in flight (64 MiB on 2 ranks: 128 chunks of 256 KiB each way per
// step) ends with no rank waiting: over Open MPI's shared memory a large message's receiver
// acknowledges it from a later call into MPI, and a rank that left the ring and idled made
// none, so the rank before it waited for its sends for good. Out of place without the shared
// segment, one machine runs the ring too.
// Before the fix the test hung (until the test's timeout).
TEST(Allreduce, ALargeRingLeavesNoRankWaiting) {
  const int n = size();
  struct Restore {
    ~Restore() { config::Registry::Global().Unset("WEFT_SHARED_MEMORY_BYTES"); }
  } restore;
  ASSERT_TRUE(config::Registry::Global().Set("WEFT_SHARED_MEMORY_BYTES", "0").ok());
  Buffer in(DType::kFloat32, {int64_t{1} << 24}), out(DType::kFloat32, {int64_t{1} << 24});
  for (int k = 0; k < 3; ++k) {
    in.Fill(rank() + 1 + k);
    ASSERT_TRUE(allreduce(in.view(), out.view(), false).ok()) << "op " << k;
    ExpectAll(out, n * (n + 1) / 2.0 + n * k, "op " + std::to_string(k));
  }
}

// On one machine a large out-of-place allreduce runs weft's ring and an in-place one
// MPI_Allreduce; every rank must still run the same algorithm when only some reduce in
// place. Also averages, and int64 sums past 2^53, which a double would round.
TEST(Allreduce, LargeOpsInPlaceOnSomeRanksOnly) {
  const int n = size();
  const int64_t count = int64_t{1} << 18;  // 1 MiB of float32
  for (int in_place_rank : {-1, 0, n - 1}) {
    SCOPED_TRACE(in_place_rank);
    const bool in_place = rank() == in_place_rank;
    Buffer in(DType::kFloat32, {count}), out(DType::kFloat32, {count});
    for (int64_t i = 0; i < count; ++i) in.Set(i, (rank() + 1) * (i % 5 + 1));
    ASSERT_TRUE(allreduce(in.view(), in_place ? in.view() : out.view(), true).ok());
    const Buffer& result = in_place ? in : out;
    int64_t wrong = 0;
    for (int64_t i = 0; i < count; ++i) wrong += result.Get(i) != (n + 1) / 2.0 * (i % 5 + 1);
    EXPECT_EQ(wrong, 0);
    if (!in_place) {
      for (int64_t i = 0; i < count; ++i) wrong += in.Get(i) != (rank() + 1) * (i % 5 + 1);
      EXPECT_EQ(wrong, 0) << "the input changed";
    }
  }
  const int64_t base = int64_t{1} << 53;
  std::vector<int64_t> big(count / 2, base + rank() + 1), sum(count / 2, 0);
  ASSERT_TRUE(allreduce(TensorView(big.data(), DType::kInt64, {count / 2}),
                        TensorView(sum.data(), DType::kInt64, {count / 2}), false)
                  .ok());
  const int64_t want = n * base + n * (n + 1) / 2;
  EXPECT_EQ(std::count(sum.begin(), sum.end(), want), count / 2) << sum[0] << " vs " << want;
}

TEST(Allreduce, InPlaceNamedAndNonblocking) {
  const int n = size();
  Buffer a(DType::kFloat32, {16});
  a.Fill(rank());
  ASSERT_TRUE(allreduce(a.view(), a.view(), false, "in.place").ok());
  ExpectAll(a, n * (n - 1) / 2.0, "in place");

  std::vector<Buffer> bufs;
  std::vector<Handle> handles;
  for (int k = 0; k < 5; ++k) bufs.emplace_back(DType::kFloat64, std::vector<int64_t>{10});
  for (int k = 0; k < 5; ++k) {
    bufs[k].Fill(rank() * (k + 1));
    auto h = allreduce_nonblocking(bufs[k].view(), bufs[k].view(), true, "nb." + std::to_string(k));
    ASSERT_TRUE(h.ok()) << h.status();
    handles.push_back(*h);
  }
  for (int k = 0; k < 5; ++k) {
    ASSERT_TRUE(wait(handles[k]).ok());
    EXPECT_TRUE(poll(handles[k]));
    ExpectAll(bufs[k], (n - 1) / 2.0 * (k + 1), "nonblocking");
  }
}

// Closes whatever groups a failed assertion left open, so that later tests run ungrouped.
struct CloseGroups {
  ~CloseGroups() {
    while (group_end().ok()) {
    }
  }
};

TEST(Group, OpsStartedInAGroupCompleteWithTheRightValues) {
  CloseGroups close_groups;
  const int n = size();
  std::vector<Buffer> bufs;
  std::vector<Handle> handles;
  for (int k = 0; k < 24; ++k) bufs.emplace_back(DType::kFloat32, std::vector<int64_t>{256});
  group_start();
  for (int k = 0; k < 24; ++k) {
    bufs[k].Fill(rank() + k);
    // Named and unnamed ops, and a nested group: only the outermost end hands them over.
    if (k == 12) group_start();
    auto h = allreduce_nonblocking(bufs[k].view(), bufs[k].view(), false,
                                   k % 2 == 0 ? "group." + std::to_string(k) : "");
    ASSERT_TRUE(h.ok()) << h.status();
    handles.push_back(*h);
    if (k == 15) {
      ASSERT_TRUE(group_end().ok());
    }
  }
  // Waiting inside the group hands its ops over at once (this wait would never end if it
  // waited for the group to end).
  ASSERT_TRUE(wait(handles[3]).ok());
  ExpectAll(bufs[3], n * (n - 1) / 2.0 + n * 3, "waited for inside the group");
  ASSERT_TRUE(group_end().ok());
  for (int k = 0; k < 24; ++k) {
    ASSERT_TRUE(wait(handles[k]).ok());
    ExpectAll(bufs[k], n * (n - 1) / 2.0 + n * k, "started in a group");
  }
  const Status unpaired = group_end();
  EXPECT_EQ(unpaired.code(), absl::StatusCode::kFailedPrecondition) << unpaired;
  EXPECT_TRUE(testing::Contains(unpaired, "no group is open on this thread")) << unpaired;
}

TEST(Group, ANonblockingOpCompletesWhileItsGroupIsStillOpen) {
  // A group is a hint: poll() makes progress itself (as the engine thread does at its next
  // timed check), so the op completes before the group ends.
  CloseGroups close_groups;
  Buffer a(DType::kFloat64, {8});
  a.Fill(rank());
  group_start();
  auto h = allreduce_nonblocking(a.view(), a.view(), false, "group.left.open");
  ASSERT_TRUE(h.ok()) << h.status();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!poll(*h) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(poll(*h)) << "an op in an open group never ran";
  ASSERT_TRUE(group_end().ok());
  ASSERT_TRUE(wait(*h).ok());
  ExpectAll(a, size() * (size() - 1) / 2.0, "left in an open group");
}

// A nonblocking op whose caller neither waits nor polls still runs: the engine thread takes
// it (where ranks share CPUs, at its next look, as submissions do not wake it there), so the
// other ranks' waits end while the last rank sleeps. Every engine thread is idle first (a
// rank other than 0 then sleeps longest between looks).
TEST(Nonblocking, RunsWhileItsCallerNeitherWaitsNorPolls) {
  const int n = size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int sleeper = n - 1;
  Buffer a(DType::kFloat64, {8});
  a.Fill(rank());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto h = allreduce_nonblocking(a.view(), a.view(), false, "left.alone");
  ASSERT_TRUE(h.ok()) << h.status();
  const auto start = std::chrono::steady_clock::now();
  if (rank() == sleeper) std::this_thread::sleep_for(std::chrono::seconds(2));
  ASSERT_TRUE(wait(*h).ok());
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ExpectAll(a, n * (n - 1) / 2.0, "an op its caller left alone");
  // How many of the other ranks waited about as long as the sleeper slept.
  Buffer late(DType::kFloat64, {1});
  late.Fill(rank() != sleeper && waited > 1.5 ? 1 : 0);
  ASSERT_TRUE(allreduce(late.view(), late.view(), false).ok());
  EXPECT_EQ(late.Get(0), 0) << "ranks waited for rank " << sleeper
                            << "'s op until it waited itself: nothing ran it meanwhile";
}

TEST(Broadcast, FromEveryRoot) {
  for (int root = 0; root < size(); ++root) {
    for (DType d : {DType::kFloat32, DType::kInt64, DType::kBFloat16}) {
      Buffer in(d, {3, 4}), out(d, {3, 4});
      in.Fill(root * 10 + rank());
      ASSERT_TRUE(broadcast(in.view(), out.view(), root).ok());
      ExpectAll(out, root * 10 + root, "broadcast");
      ASSERT_TRUE(broadcast(in.view(), in.view(), root, "bcast.inplace").ok());
      ExpectAll(in, root * 10 + root, "broadcast in place");
    }
  }
}

// Broadcasts through shared memory (every size: a 64 MiB limit), read from the root's
// memory (limit 0, WEFT_CROSS_MEMORY_ATTACH_BYTES 64 MiB, where the ranks can; a fused group
// still goes through MPI), through MPI (both 0) and the default way give
// the root's exact values: a fused group of odd sizes spanning several rounds, in place and
// not, then lone ops of 3 MiB in place and of 128 KiB (the direct reads' floor) and 4 bytes
// less out of place, from every root in turn, with an allreduce between roots, so that each
// op follows what the one before it left in the segment.
TEST(Broadcast, SharedMemoryRoundsMatchMpi) {
  const std::vector<int64_t> counts = {1, 70000, 3, 300001, 257};
  const std::pair<const char*, const char*> ways[] = {
      {"67108864", "0"}, {"0", "67108864"}, {"0", "0"}, {nullptr, nullptr}};
  for (const auto& [shared, cma] : ways) {
    SetOrUnset("WEFT_SHARED_MEMORY_BYTES", shared);
    SetOrUnset("WEFT_CROSS_MEMORY_ATTACH_BYTES", cma);
    const std::string limit = shared == nullptr ? "default" : std::string(shared) + "/" + cma;
    for (int root = 0; root < size(); ++root) {
      auto value = [&](int r, size_t k, int64_t i) { return (r * 7 + k * 3 + i) % 101; };
      std::vector<Buffer> ins, outs;
      for (int64_t c : counts) {
        ins.emplace_back(DType::kFloat32, std::vector<int64_t>{c});
        outs.emplace_back(DType::kFloat32, std::vector<int64_t>{c});
      }
      std::vector<Handle> hs;
      group_start();
      for (size_t k = 0; k < counts.size(); ++k) {
        for (int64_t i = 0; i < counts[k]; ++i) ins[k].Set(i, value(rank(), k, i));
        const bool in_place = k % 2 == 0;
        auto h =
            broadcast_nonblocking(ins[k].view(), in_place ? ins[k].view() : outs[k].view(), root);
        ASSERT_TRUE(h.ok()) << h.status();
        hs.push_back(*h);
      }
      ASSERT_TRUE(group_end().ok());
      for (auto& h : hs) ASSERT_TRUE(wait(h).ok());
      for (size_t k = 0; k < counts.size(); ++k) {
        const Buffer& got = k % 2 == 0 ? ins[k] : outs[k];
        for (int64_t i = 0; i < counts[k]; ++i) {
          ASSERT_EQ(got.Get(i), value(root, k, i))
              << "limit " << limit << " root " << root << " tensor " << k << " at " << i;
        }
      }
      Buffer lone(DType::kFloat32, {3 << 18});  // 3 MiB
      for (int64_t i = 0; i < lone.numel(); ++i) lone.Set(i, value(rank(), 9, i));
      ASSERT_TRUE(broadcast(lone.view(), lone.view(), root).ok());
      for (int64_t i = 0; i < lone.numel(); ++i) {
        ASSERT_EQ(lone.Get(i), value(root, 9, i)) << "limit " << limit << " lone op at " << i;
      }
      for (int64_t count : {int64_t{1} << 15, (int64_t{1} << 15) - 1}) {  // 128 KiB, 4 B less
        Buffer in(DType::kFloat32, {count}), out(DType::kFloat32, {count});
        for (int64_t i = 0; i < count; ++i) in.Set(i, value(rank(), 10, i));
        ASSERT_TRUE(broadcast(in.view(), out.view(), root).ok());
        for (int64_t i = 0; i < count; ++i) {
          ASSERT_EQ(out.Get(i), value(root, 10, i))
              << "limit " << limit << " lone op of " << count << " at " << i;
        }
      }
      // A lone broadcast started together with an allreduce: the two go to the coordinator
      // (no direct agreement for either) and run one after the other, neither staged.
      {
        Buffer in(DType::kFloat32, {1 << 16}), out(DType::kFloat32, {1 << 16});  // 256 KiB
        Buffer other(DType::kFloat32, {1 << 10});
        for (int64_t i = 0; i < in.numel(); ++i) in.Set(i, value(rank(), 11, i));
        other.Fill(1);
        group_start();
        auto reduced = allreduce_nonblocking(other.view(), other.view(), false);
        auto sent = broadcast_nonblocking(in.view(), out.view(), root);
        ASSERT_TRUE(group_end().ok());
        ASSERT_TRUE(reduced.ok() && sent.ok());
        ASSERT_TRUE(wait(*reduced).ok());
        ASSERT_TRUE(wait(*sent).ok());
        ExpectAll(other, size(), "allreduce beside a broadcast");
        for (int64_t i = 0; i < in.numel(); ++i) {
          ASSERT_EQ(out.Get(i), value(root, 11, i))
              << "limit " << limit << " negotiated op at " << i;
        }
      }
      Buffer sum(DType::kFloat32, {1 << 18});  // 1 MiB
      sum.Fill(rank());
      ASSERT_TRUE(allreduce(sum.view(), sum.view(), false).ok());
      ExpectAll(sum, size() * (size() - 1) / 2.0, "allreduce between broadcasts");
    }
  }
}

TEST(Allgather, VariableFirstDimension) {
  for (DType d : {DType::kFloat32, DType::kInt8, DType::kFloat16}) {
    Buffer in(d, {rank() + 1, 2});
    in.Fill(rank());
    Arena arena;
    auto out = allgather(in.view(), arena.allocator());
    ASSERT_TRUE(out.ok()) << out.status();
    const int n = size();
    ASSERT_EQ(out->shape(), (std::vector<int64_t>{n * (n + 1) / 2, 2}));
    int64_t row = 0;
    for (int r = 0; r < n; ++r) {
      for (int k = 0; k <= r; ++k, ++row) {
        EXPECT_EQ(Buffer::Read(out->data(), d, row * 2), r);
        EXPECT_EQ(Buffer::Read(out->data(), d, row * 2 + 1), r);
      }
    }
  }
}

// Allgathers through shared memory (every size: a 64 MiB limit), read from the other ranks'
// memory (limit 0, WEFT_CROSS_MEMORY_ATTACH_BYTES 64 MiB, where the ranks can), through MPI
// (both 0) and the default way place every rank's rows alike: parts of different lengths, the
// longest spanning several of the segment's 512 KiB rounds and the shortest none (rank 0 adds no
// rows), each allgather after an allreduce that leaves its own bytes in the segment.
TEST(Allgather, SharedMemoryRoundsMatchMpi) {
  constexpr int64_t kRowFloats = 3;
  auto rows_of = [](int r) -> int64_t { return r == 0 ? 0 : 70001 * r + 5; };  // 0.8 MiB per r
  auto value = [](int r, int64_t i) { return static_cast<double>((r * 131 + i * 7) % 1009); };
  const std::pair<const char*, const char*> ways[] = {
      {"67108864", "0"}, {"0", "67108864"}, {"0", "0"}, {nullptr, nullptr}};
  for (const auto& [limit, cma] : ways) {
    SetOrUnset("WEFT_SHARED_MEMORY_BYTES", limit);
    SetOrUnset("WEFT_CROSS_MEMORY_ATTACH_BYTES", cma);
    for (int pass = 0; pass < 2; ++pass) {
      Buffer sum(DType::kFloat32, {1 << 17});
      sum.Fill(rank());
      ASSERT_TRUE(allreduce(sum.view(), sum.view(), false).ok());
      ExpectAll(sum, size() * (size() - 1) / 2.0, "allreduce between allgathers");
      Buffer in(DType::kFloat32, {rows_of(rank()), kRowFloats});
      for (int64_t i = 0; i < in.numel(); ++i) in.Set(i, value(rank(), i));
      Arena arena;
      auto out = allgather(in.view(), arena.allocator());
      ASSERT_TRUE(out.ok()) << out.status();
      int64_t rows = 0;
      for (int r = 0; r < size(); ++r) rows += rows_of(r);
      ASSERT_EQ(out->shape(), (std::vector<int64_t>{rows, kRowFloats}));
      int64_t at = 0;
      for (int r = 0; r < size(); ++r) {
        for (int64_t i = 0; i < rows_of(r) * kRowFloats; ++i, ++at) {
          ASSERT_EQ(Buffer::Read(out->data(), DType::kFloat32, at), value(r, i))
              << "limit " << (limit ? limit : "default") << " cma " << (cma ? cma : "default")
              << " pass " << pass << ": rank " << r << "'s element " << i;
        }
      }
    }
  }
  config::Registry::Global().Unset("WEFT_SHARED_MEMORY_BYTES");
  config::Registry::Global().Unset("WEFT_CROSS_MEMORY_ATTACH_BYTES");
}

TEST(NeighborAllgather, StaticTopologyOrdersByRank) {
  const int n = size();
  for (const auto& [name, topo] : AllTopologies(n)) {
    TopologyGuard guard;
    ASSERT_TRUE(set_topology(topo).ok()) << name;
    Buffer in(DType::kFloat32, {2, 3});
    in.Fill(rank() * 100);
    Arena arena;
    auto out = neighbor_allgather(in.view(), arena.allocator());
    ASSERT_TRUE(out.ok()) << name << ": " << out.status();
    const std::vector<int>& srcs = topo.in_neighbors(rank());
    ASSERT_EQ(out->shape()[0], 2 * static_cast<int64_t>(srcs.size())) << name;
    for (size_t k = 0; k < srcs.size(); ++k) {
      for (int e = 0; e < 6; ++e) {
        EXPECT_EQ(Buffer::Read(out->data(), DType::kFloat32, k * 6 + e), srcs[k] * 100) << name;
      }
    }
  }
}

TEST(NeighborAllgather, DynamicRanksInGivenOrder) {
  const int n = size();
  if (n < 3) GTEST_SKIP() << "needs 3 ranks";
  NeighborAllgatherOptions opts;
  // Receive from the two previous ranks, farthest first; send to the two next.
  opts.src_ranks = std::vector<int>{(rank() - 2 + n) % n, (rank() - 1 + n) % n};
  opts.dst_ranks = std::vector<int>{(rank() + 1) % n, (rank() + 2) % n};
  Buffer in(DType::kInt32, {rank() % 2 + 1});
  in.Fill(rank());
  Arena arena;
  auto out = neighbor_allgather(in.view(), arena.allocator(), opts, "dyn.gather");
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<double> expected;
  for (int src : *opts.src_ranks) {
    for (int k = 0; k < src % 2 + 1; ++k) expected.push_back(src);
  }
  ASSERT_EQ(out->numel(), static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(Buffer::Read(out->data(), DType::kInt32, i), expected[i]);
  }
}

// y_i = W_ii x_i + sum_j W_ji x_j with x_j = j + 1 (weighted), or the uniform average
// over self and in-neighbors (unweighted).
double ExpectedNeighborAverage(const Topology& t, int i, bool weighted) {
  const std::vector<int>& in = t.in_neighbors(i);
  if (!weighted) {
    double s = i + 1;
    for (int j : in) s += j + 1;
    return s / (in.size() + 1);
  }
  double s = t.self_weight(i) * (i + 1);
  for (int j : in) s += t.weight(j, i) * (j + 1);
  return s;
}

TEST(NeighborAllreduce, EveryTopologyWeightedAndNot) {
  const int n = size();
  for (const auto& [name, topo] : AllTopologies(n)) {
    for (bool weighted : {false, true}) {
      TopologyGuard guard;
      ASSERT_TRUE(set_topology(topo, weighted).ok()) << name;
      EXPECT_EQ(is_topo_weighted(), weighted);
      for (DType d : {DType::kFloat32, DType::kFloat64}) {
        Buffer in(d, {5, 3}), out(d, {5, 3});
        in.Fill(rank() + 1);
        ASSERT_TRUE(neighbor_allreduce(in.view(), out.view()).ok()) << name;
        ExpectAll(out, ExpectedNeighborAverage(topo, rank(), weighted),
                  name + (weighted ? " weighted" : " unweighted"));
      }
    }
  }
}

TEST(NeighborAllreduce, AllDTypesInPlaceOnDefaultGraph) {
  const Topology topo = load_topology();
  for (DType d : kAllDTypes) {
    Buffer x(d, {33});
    x.Fill(rank() + 1);
    ASSERT_TRUE(neighbor_allreduce(x.view(), x.view()).ok());
    ExpectAll(x, ExpectedNeighborAverage(topo, rank(), false), "in place");
  }
}

TEST(NeighborAllreduce, ExplicitWeightsMatchedBySenderRank) {
  const int n = size();
  const Topology topo = load_topology();
  const std::vector<int>& in = topo.in_neighbors(rank());
  if (in.empty()) GTEST_SKIP() << "no neighbors on 1 rank";
  // A strict subset of in-neighbors, listed in reverse: weights must follow ranks.
  NeighborAllreduceOptions opts;
  opts.self_weight = 0.25;
  std::map<int, double> src;
  src[in.back()] = 0.5;
  if (in.size() > 1) src[in.front()] = 0.125;
  opts.src_weights = src;
  Buffer x(DType::kFloat64, {4}), y(DType::kFloat64, {4});
  x.Fill(rank() + 1);
  ASSERT_TRUE(neighbor_allreduce(x.view(), y.view(), opts, "subset").ok());
  double expected = 0.25 * (rank() + 1);
  for (const auto& [j, w] : src) expected += w * (j + 1);
  ExpectAll(y, expected, "subset weights");
  (void)n;
}

// Weights are any finite numbers (documented in comm.h): I - W style combinations with a
// self weight above 1 and negative neighbor weights come out exactly.
TEST(NeighborAllreduce, WeightsOutsideZeroOneAreUsedAsGiven) {
  const std::vector<int> in = load_topology().in_neighbors(rank());
  if (in.empty()) GTEST_SKIP() << "no neighbors on 1 rank";
  NeighborAllreduceOptions opts;
  opts.self_weight = 5.0;
  std::map<int, double> src;
  for (int j : in) src[j] = -1.0;
  opts.src_weights = src;
  Buffer x(DType::kFloat64, {5}), y(DType::kFloat64, {5});
  x.Fill(rank() + 1);
  ASSERT_TRUE(neighbor_allreduce(x.view(), y.view(), opts, "i.minus.w").ok());
  double expected = 5.0 * (rank() + 1);
  for (int j : in) expected -= j + 1;
  ExpectAll(y, expected, "self 5, neighbors -1");
}

// A dynamic exchange that names the caller on both sides sends to itself.
TEST(NeighborAllreduce, ADynamicExchangeMayNameTheCallerOnBothSides) {
  NeighborAllreduceOptions opts;
  opts.self_weight = 0.25;
  opts.src_weights = std::map<int, double>{{rank(), 0.5}};
  opts.dst_weights = std::map<int, double>{{rank(), 2.0}};
  Buffer x(DType::kFloat64, {4}), y(DType::kFloat64, {4});
  x.Fill(rank() + 1);
  ASSERT_TRUE(neighbor_allreduce(x.view(), y.view(), opts, "to.self").ok());
  ExpectAll(y, 1.25 * (rank() + 1), "0.25 x + 0.5 * 2 x");
  // Naming itself on one side only stays an error.
  NeighborAllreduceOptions one_side = opts;
  one_side.dst_weights = std::map<int, double>{};
  Status st = neighbor_allreduce(x.view(), y.view(), one_side, "to.self.one.side");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
}

TEST(NeighborAllreduce, DynamicOnePeerScheduleWithDstWeights) {
  const int n = size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const Topology topo = *ExponentialTwoGraph(n);
  auto schedule = OnePeerSchedule(topo, rank());
  ASSERT_TRUE(schedule.ok());
  std::vector<std::unique_ptr<DynamicSchedule>> all;
  for (int r = 0; r < n; ++r) all.push_back(std::move(*OnePeerSchedule(topo, r)));
  for (int step = 0; step < 6; ++step) {
    SendRecvRanks mine = (*schedule)->Next();
    std::vector<SendRecvRanks> everyone;
    for (auto& s : all) everyone.push_back(s->Next());
    NeighborAllreduceOptions opts;
    opts.self_weight = 0.5;
    std::map<int, double> src, dst;
    for (int j : mine.recv_ranks) src[j] = 0.5 / mine.recv_ranks.size();
    for (int j : mine.send_ranks) dst[j] = 2.0;  // the sender doubles what it sends
    opts.src_weights = src;
    opts.dst_weights = dst;
    Buffer x(DType::kFloat32, {8}), y(DType::kFloat32, {8});
    x.Fill(rank() + 1);
    ASSERT_TRUE(neighbor_allreduce(x.view(), y.view(), opts).ok()) << "step " << step;
    double expected = 0.5 * (rank() + 1);
    for (const auto& [j, w] : src) expected += w * 2.0 * (j + 1);
    ExpectAll(y, expected, "one-peer step " + std::to_string(step));
  }
}

// Large exchanges over the transport travel in chunks and are combined chunk by chunk as
// they arrive; through shared memory (the default past 4 MiB on one machine) in rounds:
// every element its own value, sizes that are not a multiple of a chunk or a round, in
// place (where a chunk must have left before its result overwrites it) and not, with
// scaled sends (dst weights), each way.
TEST(NeighborAllreduce, ElementsKeepTheirPlaceInLargeExchanges) {
  const int n = size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int to = (rank() + 1) % n, from = (rank() + n - 1) % n;
  // The settings go back to their defaults however the test ends.
  struct Restore {
    ~Restore() {
      config::Registry::Global().Unset("WEFT_SHARED_MEMORY_BYTES");
      config::Registry::Global().Unset("WEFT_CROSS_MEMORY_ATTACH_BYTES");
    }
  } restore;
  for (const char* way : {"transport", "default"}) {
    const bool transport = std::string(way) == "transport";
    ASSERT_TRUE(
        config::Registry::Global().Set("WEFT_SHARED_MEMORY_BYTES", transport ? "0" : "-1").ok());
    ASSERT_TRUE(config::Registry::Global()
                    .Set("WEFT_CROSS_MEMORY_ATTACH_BYTES", transport ? "0" : "-1")
                    .ok());
    for (int64_t count : {int64_t{1000003}, (int64_t{3} << 20) + 5}) {
      for (bool in_place : {false, true}) {
        NeighborAllreduceOptions opts;
        opts.self_weight = 0.5;
        opts.src_weights = std::map<int, double>{{from, 0.25}};
        opts.dst_weights = std::map<int, double>{{to, 2.0}};
        Buffer x(DType::kFloat32, {count}), y(DType::kFloat32, {count});
        for (int64_t i = 0; i < count; ++i) x.Set(i, (rank() + 1) * (i % 13 + 1));
        Buffer& out = in_place ? x : y;
        ASSERT_TRUE(neighbor_allreduce(x.view(), out.view(), opts).ok()) << count;
        int64_t wrong = 0, first = -1;
        for (int64_t i = 0; i < count; ++i) {
          const double expected = (0.5 * (rank() + 1) + 0.25 * 2.0 * (from + 1)) * (i % 13 + 1);
          if (out.Get(i) != expected) {
            if (first < 0) first = i;
            ++wrong;
          }
        }
        EXPECT_EQ(wrong, 0) << way << ", " << count << (in_place ? " in place" : "")
                            << ": first wrong at " << first;
      }
    }
  }
}

// Neighbor allreduces through shared memory (every rank on this machine,
// WEFT_SHARED_MEMORY_BYTES 64 MiB: several rounds for the larger ones), those that read
// their peers' inputs where they are (WEFT_CROSS_MEMORY_ATTACH_BYTES 64 MiB) and those that
// go through the exchange transport (both 0) give the same bits: sizes on both sides of
// 4 KiB and of a transport chunk, three dtypes, scaled sends that round (dst weights of
// thirds), in place and not, and fused groups, one spanning several rounds of the segment
// with some of its tensors in place.
TEST(NeighborAllreduce, SharedMemoryAndDirectReadsMatchTheTransportBitForBit) {
  const int n = size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int to = (rank() + 1) % n, from = (rank() + n - 1) % n;
  NeighborAllreduceOptions opts;
  opts.self_weight = 1.0 / 3;
  opts.src_weights = std::map<int, double>{{from, 2.0 / 3}};
  opts.dst_weights = std::map<int, double>{{to, (rank() + 1) / 3.0}};
  auto value = [&](int64_t i) { return ((rank() + 3) * 7919 * (i + 1)) % 1013 / 17.0; };
  // The way each op takes: through shared memory up to `shared` bytes, else reading the
  // in-neighbors' inputs up to `direct` bytes, else the transport.
  // In place: none, every tensor, or every other one.
  enum class InPlace { kNone, kAll, kMixed };
  auto run = [&](DType dtype, std::vector<int64_t> counts, InPlace mode, const char* shared,
                 const char* direct) {
    auto in_place = [&](size_t k) {
      return mode == InPlace::kAll || (mode == InPlace::kMixed && k % 2 == 1);
    };
    EXPECT_TRUE(config::Registry::Global().Set("WEFT_SHARED_MEMORY_BYTES", shared).ok());
    EXPECT_TRUE(config::Registry::Global().Set("WEFT_CROSS_MEMORY_ATTACH_BYTES", direct).ok());
    std::vector<Buffer> xs, ys;
    for (int64_t c : counts) {
      xs.emplace_back(dtype, std::vector<int64_t>{c});
      ys.emplace_back(dtype, std::vector<int64_t>{c});
      for (int64_t i = 0; i < c; ++i) xs.back().Set(i, value(i));
    }
    std::vector<Handle> hs;
    group_start();
    for (size_t k = 0; k < counts.size(); ++k) {
      auto h = neighbor_allreduce_nonblocking(xs[k].view(),
                                              in_place(k) ? xs[k].view() : ys[k].view(), opts);
      EXPECT_TRUE(h.ok()) << h.status();
      if (h.ok()) hs.push_back(*h);
    }
    EXPECT_TRUE(group_end().ok());
    for (auto& h : hs) EXPECT_TRUE(wait(h).ok());
    std::vector<std::vector<double>> got;
    for (size_t k = 0; k < counts.size(); ++k) {
      const Buffer& out = in_place(k) ? xs[k] : ys[k];
      got.emplace_back();
      for (int64_t i = 0; i < counts[k]; ++i) got.back().push_back(out.Get(i));
    }
    return got;
  };
  const std::vector<std::vector<int64_t>> groups = {
      {1000}, {1100}, {70001}, {300001}, {3, 20000, 1001}, {200001, 3, 150001, 7}};
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kFloat64}) {
    for (const auto& counts : groups) {
      for (InPlace in_place : {InPlace::kNone, InPlace::kAll, InPlace::kMixed}) {
        if (in_place == InPlace::kMixed && counts.size() == 1) continue;
        const auto transport = run(dtype, counts, in_place, "0", "0");
        const std::pair<const char*, std::vector<std::vector<double>>> ways[] = {
            {"shared memory", run(dtype, counts, in_place, "67108864", "0")},
            {"direct reads", run(dtype, counts, in_place, "0", "67108864")}};
        for (const auto& [way, got] : ways) {
          for (size_t k = 0; k < counts.size(); ++k) {
            for (int64_t i = 0; i < counts[k]; ++i) {
              ASSERT_EQ(std::memcmp(&got[k][i], &transport[k][i], sizeof(double)), 0)
                  << way << ", " << DTypeName(dtype) << " tensor " << k << " of " << counts.size()
                  << " (" << counts[k]
                  << (in_place == InPlace::kAll     ? ", in place"
                      : in_place == InPlace::kMixed ? ", every other in place"
                                                    : "")
                  << ") element " << i << ": " << got[k][i] << " against " << transport[k][i];
            }
          }
        }
      }
    }
  }
  config::Registry::Global().Unset("WEFT_SHARED_MEMORY_BYTES");
  config::Registry::Global().Unset("WEFT_CROSS_MEMORY_ATTACH_BYTES");
}

TEST(NeighborAllreduce, RankWithNoSendersReturnsSelfWeightTimesInput) {
  const int n = size();
  // Everyone sends to rank 0 only; rank 0 receives from all, the others from nobody.
  NeighborAllreduceOptions opts;
  opts.self_weight = 0.5;
  std::map<int, double> src, dst;
  if (rank() == 0) {
    for (int j = 1; j < n; ++j) src[j] = 1.0;
  } else {
    dst[0] = 1.0;
  }
  opts.src_weights = src;
  opts.dst_weights = dst;
  Buffer x(DType::kFloat64, {3}), y(DType::kFloat64, {3});
  x.Fill(rank() + 1);
  ASSERT_TRUE(neighbor_allreduce(x.view(), y.view(), opts, "gather.to.zero").ok());
  ExpectAll(y, rank() == 0 ? 0.5 + (n * (n + 1) / 2.0 - 1) : 0.5 * (rank() + 1), "no senders");
  ExpectAll(x, rank() + 1, "input untouched");
}

TEST(PairGossip, PeersAverage) {
  const int n = size();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  const int peer = rank() ^ 1;
  Buffer x(DType::kFloat32, {6});
  x.Fill(rank() + 1);
  ASSERT_TRUE(pair_gossip(x.view(), x.view(), peer).ok());
  ExpectAll(x, (rank() + 1 + peer + 1) / 2.0, "pair gossip");
  Buffer y(DType::kFloat64, {2}), z(DType::kFloat64, {2});
  y.Fill(rank() + 1);
  ASSERT_TRUE(pair_gossip(y.view(), z.view(), peer, 0.75, 0.25, "gossip.w").ok());
  ExpectAll(z, 0.75 * (rank() + 1) + 0.25 * (peer + 1), "weighted pair gossip");
}

TEST(HierarchicalNeighborAllreduce, OneMachineIsTheLocalAverage) {
  // All ranks of one host form one machine: the machine graph has no edges.
  Buffer x(DType::kFloat32, {4}), y(DType::kFloat32, {4});
  x.Fill(rank() + 1);
  ASSERT_TRUE(hierarchical_neighbor_allreduce(x.view(), y.view()).ok());
  ExpectAll(y, (size() + 1) / 2.0, "hierarchical on one machine");
}

TEST(Barrier, Completes) {
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(barrier().ok());
}

TEST(Handles, KeepAliveOwnersAreReleasedAfterCompletion) {
  auto buffer = std::make_shared<Buffer>(DType::kFloat32, std::vector<int64_t>{256});
  std::weak_ptr<Buffer> watch = buffer;
  buffer->Fill(rank());
  {
    auto h = allreduce_nonblocking(buffer->view(), buffer->view(), false, "kept");
    ASSERT_TRUE(h.ok());
    h->keep_alive(std::move(buffer));  // the op now owns the only reference
  }  // the handle is dropped before the op completes (most likely)
  // Ops complete in order on every rank: once a later op is done, so is "kept".
  ASSERT_TRUE(barrier().ok());
  EXPECT_TRUE(watch.expired());
}

TEST(Fusion, ManySmallNonblockingOpsMatchUnfused) {
  const int n = size();
  auto run = [&](int64_t threshold) {
    EXPECT_TRUE(config::Registry::Global()
                    .Set("WEFT_FUSION_THRESHOLD_BYTES", std::to_string(threshold))
                    .ok());
    std::vector<Buffer> bufs;
    for (int k = 0; k < 64; ++k) bufs.emplace_back(DType::kFloat32, std::vector<int64_t>{1024});
    std::vector<Handle> hs;
    for (int k = 0; k < 64; ++k) {
      for (int64_t i = 0; i < 1024; ++i) bufs[k].Set(i, rank() * 1000 + k + i % 7);
      auto h = allreduce_nonblocking(bufs[k].view(), bufs[k].view(), false);
      EXPECT_TRUE(h.ok());
      hs.push_back(*h);
    }
    for (auto& h : hs) EXPECT_TRUE(wait(h).ok());
    return bufs;
  };
  auto fused = run(64 << 20);
  auto unfused = run(0);
  config::Registry::Global().Unset("WEFT_FUSION_THRESHOLD_BYTES");
  for (int k = 0; k < 64; ++k) {
    for (int64_t i = 0; i < 1024; ++i) {
      const double expected = 1000.0 * n * (n - 1) / 2 + n * (k + i % 7);
      ASSERT_EQ(fused[k].Get(i), expected) << k << "," << i;
      ASSERT_EQ(unfused[k].Get(i), expected) << k << "," << i;
    }
  }
}

// With every rank on this machine, allreduces up to WEFT_SHARED_MEMORY_BYTES sum
// through memory the ranks share, in rounds of 1 MiB: a fused group of odd sizes spanning
// several rounds (in place and not, sums and averages, three dtypes) and a lone 3 MiB op
// give the exact values, as they do through MPI (limit 0), and the inputs of out-of-place
// ops stay untouched.
TEST(Allreduce, SharedMemoryRoundsMatchMpi) {
  const int n = size();
  const std::vector<int64_t> counts = {1, 70000, 3, 300001, 257, 1 << 18};
  auto run = [&](const char* limit, DType dtype, bool average) {
    EXPECT_TRUE(config::Registry::Global().Set("WEFT_SHARED_MEMORY_BYTES", limit).ok());
    std::vector<Buffer> ins, outs;
    for (int64_t c : counts) {
      ins.emplace_back(dtype, std::vector<int64_t>{c});
      outs.emplace_back(dtype, std::vector<int64_t>{c});
    }
    std::vector<Handle> hs;
    group_start();
    for (size_t k = 0; k < counts.size(); ++k) {
      // Multiples of n: averages are exact in every dtype (within float16's integers).
      for (int64_t i = 0; i < counts[k]; ++i) ins[k].Set(i, n * ((rank() + k + i) % 5));
      const bool in_place = k % 2 == 0;
      auto h =
          allreduce_nonblocking(ins[k].view(), in_place ? ins[k].view() : outs[k].view(), average);
      EXPECT_TRUE(h.ok()) << h.status();
      hs.push_back(*h);
    }
    EXPECT_TRUE(group_end().ok());
    for (auto& h : hs) EXPECT_TRUE(wait(h).ok());
    std::vector<Buffer> results;
    for (size_t k = 0; k < counts.size(); ++k) {
      const bool in_place = k % 2 == 0;
      if (!in_place) {
        for (int64_t i = 0; i < counts[k]; ++i) {
          if (ins[k].Get(i) != n * ((rank() + k + i) % 5)) {
            ADD_FAILURE() << "input " << k << " changed at " << i;
            break;
          }
        }
      }
      results.push_back(in_place ? ins[k] : outs[k]);
    }
    Buffer lone(dtype, {3 << 18});  // 3 MiB of float32
    for (int64_t i = 0; i < lone.numel(); ++i) lone.Set(i, n * ((rank() + i) % 3));
    EXPECT_TRUE(allreduce(lone.view(), lone.view(), average).ok());
    results.push_back(lone);
    return results;
  };
  for (DType dtype : {DType::kFloat32, DType::kInt32, DType::kFloat16}) {
    for (bool average : {false, true}) {
      const auto shared = run("67108864", dtype, average);
      const auto mpi = run("0", dtype, average);
      for (size_t k = 0; k < shared.size(); ++k) {
        const int64_t c = k < counts.size() ? counts[k] : shared[k].numel();
        for (int64_t i = 0; i < c; ++i) {
          double want = 0;
          for (int r = 0; r < n; ++r) {
            want += k < counts.size() ? n * ((r + k + i) % 5) : n * ((r + i) % 3);
          }
          if (average) want /= n;
          ASSERT_EQ(shared[k].Get(i), want) << DTypeName(dtype) << (average ? " average" : " sum")
                                            << " tensor " << k << " at " << i;
          ASSERT_EQ(mpi[k].Get(i), want) << DTypeName(dtype) << " through MPI, tensor " << k;
        }
      }
    }
  }
  config::Registry::Global().Unset("WEFT_SHARED_MEMORY_BYTES");
}

TEST(Fusion, NeighborAllreduceFusedMatches) {
  std::vector<Buffer> bufs;
  for (int k = 0; k < 20; ++k) bufs.emplace_back(DType::kFloat64, std::vector<int64_t>{k + 1});
  std::vector<Handle> hs;
  for (int k = 0; k < 20; ++k) {
    bufs[k].Fill((rank() + 1) * (k + 1));
    hs.push_back(*neighbor_allreduce_nonblocking(bufs[k].view(), bufs[k].view()));
  }
  const double avg = ExpectedNeighborAverage(load_topology(), rank(), false);
  for (int k = 0; k < 20; ++k) {
    ASSERT_TRUE(wait(hs[k]).ok());
    ExpectAll(bufs[k], avg * (k + 1), "fused neighbor_allreduce");
  }
}

}  // namespace
}  // namespace weft
