// Blocking ops that every rank calls alike run without the coordinator's answer when the
// ranks share one machine (comm/agreement.h). These check that they compute what the
// coordinator's way computes, that the trace says which ops went directly, and that every
// case the direct way cannot take (arguments that differ, a rank with other ops in flight,
// a nonblocking call on one rank, a named op on another thread) still comes out as it does
// through the coordinator: the same results and the same errors, without a hang.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "core/config.h"
#include "gtest/gtest.h"
#include "tests/comm/test_util.h"

namespace weft {
namespace {

using testing::Arena;
using testing::Buffer;
using testing::Contains;

const auto* const kEnv = weft::testing::InitWeftForAllTests();

class DirectAgreement : public ::testing::Test {
 protected:
  void TearDown() override { ASSERT_TRUE(barrier().ok()); }

  // Whether this run leaves the direct way on (WEFT_DIRECT_AGREEMENT).
  static bool DirectWayOn() {
    return config::Registry::Global().GetText("WEFT_DIRECT_AGREEMENT").value_or("1") != "0";
  }

  // Runs `body` with this rank's trace on, and returns how many ops the trace shows as
  // agreed directly (their negotiate span says "direct").
  template <typename Body>
  int DirectOpsIn(const std::string& label, Body body) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    const std::string dir = tmp != nullptr ? tmp : "/tmp";
    const std::string file = dir + "/" + label + "." + std::to_string(rank()) + ".json";
    EXPECT_TRUE(timeline_start(dir + "/" + label + ".%r.json").ok());
    body();
    EXPECT_TRUE(timeline_stop().ok());
    std::ifstream in(file);
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    int count = 0;
    for (size_t at = s.find("\"direct\""); at != std::string::npos;
         at = s.find("\"direct\"", at + 1)) {
      ++count;
    }
    return count;
  }
};

TEST_F(DirectAgreement, BlockingOpsComputeAsThroughTheCoordinator) {
  const int n = size(), me = rank();
  constexpr int kRounds = 20;
  const int direct = DirectOpsIn("direct_ops", [&] {
    for (int round = 0; round < kRounds; ++round) {
      SCOPED_TRACE(round);
      // In place, summed.
      Buffer x(DType::kFloat32, {5});
      x.Fill(me + round);
      ASSERT_TRUE(allreduce(x.view(), x.view(), false).ok());
      EXPECT_EQ(x.Get(4), n * (n - 1) / 2.0 + n * round);
      // Out of place, averaged, another dtype.
      Buffer in(DType::kFloat64, {2, 3}), out(DType::kFloat64, {2, 3});
      in.Fill(2.0 * me);
      ASSERT_TRUE(allreduce(in.view(), out.view(), true).ok());
      EXPECT_DOUBLE_EQ(out.Get(5), n - 1.0);
      EXPECT_EQ(in.Get(0), 2.0 * me);
      // From every root in turn.
      Buffer b(DType::kInt32, {3});
      b.Fill(me == round % n ? 100 + round : -1);
      ASSERT_TRUE(broadcast(b.view(), b.view(), round % n).ok());
      EXPECT_EQ(b.Get(2), 100 + round);
      // Over the topology (the default, unweighted: the mean of this rank's and its
      // in-neighbors' values); with dst_weights the call is dynamic and negotiated.
      Buffer nx(DType::kFloat64, {4}), ny(DType::kFloat64, {4});
      nx.Fill(me + round);
      ASSERT_TRUE(neighbor_allreduce(nx.view(), ny.view(), {}).ok());
      const Topology topology = load_topology();
      const std::vector<int>& sources = topology.in_neighbors(me);
      double expect = me + round;
      for (int j : sources) expect += j + round;
      EXPECT_DOUBLE_EQ(ny.Get(3), expect / (sources.size() + 1));
      if (n > 1) {
        NeighborAllreduceOptions ring;
        ring.self_weight = 0.5;
        ring.src_weights = std::map<int, double>{{(me + n - 1) % n, 0.5}};
        ring.dst_weights = std::map<int, double>{{(me + 1) % n, 1.0}};
        ASSERT_TRUE(neighbor_allreduce(nx.view(), ny.view(), ring).ok());
        EXPECT_DOUBLE_EQ(ny.Get(0), 0.5 * (me + round) + 0.5 * ((me + n - 1) % n + round));
      }
      // A number of rows that differs across ranks.
      Buffer rows(DType::kInt64, {me + 1, 2});
      rows.Fill(me);
      Arena arena;
      auto gathered = allgather(rows.view(), arena.allocator());
      ASSERT_TRUE(gathered.ok()) << gathered.status();
      ASSERT_EQ(gathered->shape()[0], n * (n + 1) / 2);
      int64_t row = 0;
      for (int r = 0; r < n; ++r) {
        for (int k = 0; k <= r; ++k, ++row) {
          EXPECT_EQ(Buffer::Read(gathered->data(), DType::kInt64, 2 * row + 1), r);
        }
      }
    }
  });
  if (n == 1) {
    EXPECT_EQ(direct, 0);  // one rank has nothing to agree on
  } else if (!DirectWayOn()) {
    EXPECT_EQ(direct, 0);
  } else {
    // Ranks that are late by more than the wait go through the coordinator (likely only
    // when ranks outnumber cores): most ops, but not necessarily every one, run directly.
    EXPECT_GT(direct, 0);
  }
}

// Arguments that differ get the coordinator's error, naming the ranks, on every rank.
TEST_F(DirectAgreement, DisagreementsGetTheCoordinatorsErrors) {
  if (size() < 2) GTEST_SKIP();
  const int odd = size() - 1;
  Buffer x(DType::kFloat32, {rank() == odd ? 3 : 4});
  x.Fill(1);
  Status st = allreduce(x.view(), x.view(), false);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(Contains(st, "shape differs across ranks")) << st;
  EXPECT_TRUE(Contains(st, "[3] on rank " + std::to_string(odd))) << st;
  EXPECT_EQ(x.Get(0), 1);

  Buffer y(DType::kFloat32, {4});
  y.Fill(rank());
  st = broadcast(y.view(), y.view(), rank() == odd ? 1 : 0);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(Contains(st, "root rank differs across ranks")) << st;
  EXPECT_EQ(y.Get(0), rank());

  Buffer avg(DType::kFloat32, {4});
  st = allreduce(avg.view(), avg.view(), rank() != odd);
  EXPECT_TRUE(Contains(st, "average/sum differs across ranks")) << st;

  Buffer rows(DType::kFloat32, {2, rank() == odd ? 5 : 4});
  Arena arena;
  auto gathered = allgather(rows.view(), arena.allocator());
  EXPECT_EQ(gathered.status().code(), absl::StatusCode::kInvalidArgument) << gathered.status();
  EXPECT_TRUE(Contains(gathered.status(), "every dimension but the first")) << gathered.status();

  Buffer typed(rank() == odd ? DType::kFloat64 : DType::kFloat32, {4});
  st = allreduce(typed.view(), typed.view(), false);
  EXPECT_TRUE(Contains(st, "dtype differs across ranks")) << st;

  // Dynamic exchanges whose sends and receives do not match: every rank counts in, finds
  // the mismatch in the others' facts, and the coordinator names it.
  if (size() >= 3) {
    const int n = size();
    NeighborAllreduceOptions opts;
    opts.self_weight = 0.5;
    opts.src_weights = std::map<int, double>{{(rank() - 2 + n) % n, 0.5}};
    opts.dst_weights = std::map<int, double>{{(rank() + 1) % n, 1.0}};
    Buffer in(DType::kFloat32, {4}), out(DType::kFloat32, {4});
    in.Fill(7);
    st = neighbor_allreduce(in.view(), out.view(), opts);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_TRUE(Contains(st, "send and receive ranks do not match")) << st;
    EXPECT_TRUE(Contains(st, "rank 0 expects to receive from rank " + std::to_string(n - 2))) << st;
  }

  // A refusal on one rank still reaches the others through the coordinator.
  Buffer wrong(DType::kFloat64, {4});
  Buffer z(DType::kFloat32, {4});
  z.Fill(1);
  st = allreduce(z.view(), rank() == odd ? wrong.view() : z.view(), false);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  if (rank() != odd) {
    EXPECT_TRUE(Contains(st, "failed on rank " + std::to_string(odd) + ", which refused it")) << st;
  }
  // And the next op agrees again.
  z.Fill(1);
  ASSERT_TRUE(allreduce(z.view(), z.view(), false).ok());
  EXPECT_EQ(z.Get(3), size());
}

// A nonblocking op that a rank has alone in flight agrees directly as a blocking one does,
// and computes the same; so does one whose wait comes after other work.
TEST_F(DirectAgreement, ANonblockingOpAloneInFlightAgreesDirectly) {
  const int n = size(), me = rank();
  const int direct = DirectOpsIn("direct_nonblocking", [&] {
    for (int round = 0; round < 20; ++round) {
      SCOPED_TRACE(round);
      Buffer x(DType::kFloat32, {7}), y(DType::kFloat32, {7});
      x.Fill(me + round);
      auto h = round % 2 == 0 ? allreduce_nonblocking(x.view(), y.view(), false)
                              : allreduce_nonblocking(x.view(), y.view(), false, "nb");
      ASSERT_TRUE(h.ok()) << h.status();
      if (round % 4 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      ASSERT_TRUE(wait(*h).ok());
      EXPECT_EQ(y.Get(6), n * (n - 1) / 2.0 + n * round);
      Buffer b(DType::kInt64, {3});
      b.Fill(me == round % n ? 7 * round : -1);
      auto hb = broadcast_nonblocking(b.view(), b.view(), round % n);
      ASSERT_TRUE(hb.ok()) << hb.status();
      ASSERT_TRUE(wait(*hb).ok());
      EXPECT_EQ(b.Get(2), 7 * round);
    }
  });
  if (n > 1 && DirectWayOn()) {
    EXPECT_GT(direct, 0);
  }
}

// An op started after a nonblocking one that waits to be agreed directly completes after
// it: a barrier returns once the ops its thread started before it are done, on every rank,
// whether a rank's engine found the nonblocking op alone (and counted in) or with the
// barrier (and negotiated both).
TEST_F(DirectAgreement, ABarrierCompletesAfterTheNonblockingOpsStartedBeforeIt) {
  const int n = size(), me = rank();
  for (int round = 0; round < 40; ++round) {
    SCOPED_TRACE(round);
    Buffer x(DType::kFloat32, {64});
    x.Fill(me);
    auto h = allreduce_nonblocking(x.view(), x.view(), false);
    ASSERT_TRUE(h.ok()) << h.status();
    if ((me + round) % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
    ASSERT_TRUE(barrier().ok());
    EXPECT_TRUE(poll(*h));
    ASSERT_TRUE(wait(*h).ok());
    EXPECT_EQ(x.Get(63), n * (n - 1) / 2.0);
  }
}

// One rank calls the op nonblocking, or has others in flight: every rank takes the
// coordinator's way for it, and everything completes in the call order.
TEST_F(DirectAgreement, RanksThatCannotAgreeDirectlyTakeTheCoordinatorsWay) {
  const int n = size(), me = rank();
  for (int round = 0; round < 8; ++round) {
    SCOPED_TRACE(round);
    Buffer a(DType::kFloat32, {16}), b(DType::kFloat32, {16}), c(DType::kFloat32, {16});
    a.Fill(me);
    b.Fill(2 * me);
    c.Fill(3 * me);
    const int odd = round % n;
    if (me == odd) {
      // Two in flight before the third, all nonblocking.
      auto ha = allreduce_nonblocking(a.view(), a.view(), false);
      auto hb = allreduce_nonblocking(b.view(), b.view(), false);
      ASSERT_TRUE(ha.ok() && hb.ok());
      auto hc = allreduce_nonblocking(c.view(), c.view(), false);
      ASSERT_TRUE(hc.ok());
      ASSERT_TRUE(wait(*hc).ok());
      ASSERT_TRUE(wait(*ha).ok());
      ASSERT_TRUE(wait(*hb).ok());
    } else {
      ASSERT_TRUE(allreduce(a.view(), a.view(), false).ok());
      ASSERT_TRUE(allreduce(b.view(), b.view(), false).ok());
      ASSERT_TRUE(allreduce(c.view(), c.view(), false).ok());
    }
    const double sum = n * (n - 1) / 2.0;
    EXPECT_EQ(a.Get(15), sum);
    EXPECT_EQ(b.Get(15), 2 * sum);
    EXPECT_EQ(c.Get(15), 3 * sum);
  }
}

// While one rank waits for the others to count in, a named op another of its threads
// started has to run first: the rank that calls that op before its own blocking one waits
// in it. The others' named op stands where the waiting rank's blocking op does in its
// order, so the ranks find different ops there and negotiate; the named op runs, then
// the blocking one, both through the coordinator.
TEST_F(DirectAgreement, ANamedOpOnAnotherThreadRunsWhileABlockingOneWaits) {
  if (size() < 2) GTEST_SKIP();
  const int n = size();
  double fastest = 1e9;
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(round);
    Buffer side(DType::kFloat32, {8}), main_op(DType::kFloat32, {8});
    side.Fill(1);
    main_op.Fill(rank());
    const std::string name = "side." + std::to_string(round);
    const auto start = std::chrono::steady_clock::now();
    if (rank() == 0) {
      Status side_status;
      std::thread helper([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        side_status = allreduce(side.view(), side.view(), false, name);
      });
      ASSERT_TRUE(allreduce(main_op.view(), main_op.view(), false).ok());
      helper.join();
      ASSERT_TRUE(side_status.ok()) << side_status;
    } else {
      ASSERT_TRUE(allreduce(side.view(), side.view(), false, name).ok());
      ASSERT_TRUE(allreduce(main_op.view(), main_op.view(), false).ok());
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(side.Get(7), n);
    EXPECT_EQ(main_op.Get(7), n * (n - 1) / 2.0);
    fastest = std::min(fastest, seconds);
  }
  // Rank 0 gave up its wait when the others' different op came, not after the direct way's
  // longest wait (100 ms), which would hold up every round.
  EXPECT_LT(fastest, 0.1);
}

// Named ops agree directly too, by their names: a loop of named blocking ops runs without
// the coordinator, and where two threads of each rank start named ops of the same shape in
// a different order on each rank (so that the same place holds "a" on some ranks and "b"
// on the others), each op still meets its own name's op on every other rank.
TEST_F(DirectAgreement, NamedOpsAgreeDirectlyByTheirNames) {
  const int n = size(), me = rank();
  const int direct = DirectOpsIn("direct_named", [&] {
    for (int round = 0; round < 10; ++round) {
      Buffer x(DType::kFloat32, {6});
      x.Fill(me + round);
      ASSERT_TRUE(allreduce(x.view(), x.view(), false, "sum." + std::to_string(round % 3)).ok());
      EXPECT_EQ(x.Get(5), n * (n - 1) / 2.0 + n * round);
      Buffer b(DType::kInt32, {2});
      b.Fill(me == round % n ? round : -1);
      ASSERT_TRUE(broadcast(b.view(), b.view(), round % n, "root").ok());
      EXPECT_EQ(b.Get(1), round);
    }
  });
  if (n > 1 && DirectWayOn()) {
    EXPECT_GT(direct, 0);
  }
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE(round);
    Buffer a(DType::kFloat32, {4}), b(DType::kFloat32, {4});
    a.Fill(me + 1);
    b.Fill(1000 * (me + 1));
    const bool a_first = (me + round) % 2 == 0;
    Status sa, sb;
    std::thread first([&] {
      if (a_first) {
        sa = allreduce(a.view(), a.view(), false, "a");
      } else {
        sb = allreduce(b.view(), b.view(), false, "b");
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::thread second([&] {
      if (a_first) {
        sb = allreduce(b.view(), b.view(), false, "b");
      } else {
        sa = allreduce(a.view(), a.view(), false, "a");
      }
    });
    first.join();
    second.join();
    ASSERT_TRUE(sa.ok()) << sa;
    ASSERT_TRUE(sb.ok()) << sb;
    EXPECT_EQ(a.Get(3), n * (n + 1) / 2.0);
    EXPECT_EQ(b.Get(3), 1000 * n * (n + 1) / 2.0);
  }
}

// A rank stages an allgather (writes its first round ahead of the agreement) the way its own
// part would go if every part were as long: ranks whose parts put them on two sides of a
// limit between the ways (on 2 ranks with a CPU each, 120 KiB of output through the shared
// segment, 140 KiB by direct reads) stage it differently, and every rank then negotiates
// it. The results, and the small ops between that agree directly again, stay right.
TEST_F(DirectAgreement, AllgathersStagedDifferentlyOnSomeRanksAreNegotiated) {
  if (size() < 2) GTEST_SKIP();
  const int n = size(), me = rank();
  constexpr int64_t kRow = 256;  // floats: 1 KiB
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE(round);
    auto rows_of = [&](int r) -> int64_t { return r == round % n ? 60 : 70; };
    Buffer part(DType::kFloat32, {rows_of(me), kRow});
    for (int64_t i = 0; i < part.numel(); ++i) part.Set(i, me * 100000 + round * 1000 + i % 997);
    Arena arena;
    auto gathered = allgather(part.view(), arena.allocator());
    ASSERT_TRUE(gathered.ok()) << gathered.status();
    int64_t at = 0;
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < rows_of(r) * kRow; ++i, ++at) {
        ASSERT_EQ(Buffer::Read(gathered->data(), DType::kFloat32, at),
                  r * 100000 + round * 1000 + i % 997)
            << "part " << r << " element " << i;
      }
    }
    Buffer x(DType::kFloat32, {5});
    x.Fill(me + round);
    ASSERT_TRUE(allreduce(x.view(), x.view(), false).ok());
    EXPECT_EQ(x.Get(4), n * (n - 1) / 2.0 + n * round);
  }
}

// The direct way off on one rank only: that rank sends every op to the coordinator, and the
// others, which find it never counting in, do too, at once.
TEST_F(DirectAgreement, OffOnOneRankMeansOffForAll) {
  if (size() < 2) GTEST_SKIP();
  const bool last = rank() == size() - 1;  // rank() is -1 between shutdown() and init()
  ASSERT_TRUE(shutdown().ok());
  if (last) setenv("WEFT_DIRECT_AGREEMENT", "0", 1);
  ASSERT_TRUE(init().ok());
  const int n = size();
  const auto start = std::chrono::steady_clock::now();
  const int direct = DirectOpsIn("direct_off", [&] {
    for (int round = 0; round < 10; ++round) {
      Buffer x(DType::kFloat32, {3});
      x.Fill(rank());
      ASSERT_TRUE(allreduce(x.view(), x.view(), false).ok());
      EXPECT_EQ(x.Get(2), n * (n - 1) / 2.0);
    }
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(direct, 0);
  // Not a wait of 100 ms per op for a rank that never counts in.
  EXPECT_LT(seconds, 0.9);
  ASSERT_TRUE(shutdown().ok());
  if (last) unsetenv("WEFT_DIRECT_AGREEMENT");
  ASSERT_TRUE(init().ok());
}

// A rank that never calls a named op: once the op times out on the others, their numbers of
// ops are one ahead of that rank's for good. The ops that follow still run at once, not
// after the direct way's longest wait (100 ms) on every op.
TEST_F(DirectAgreement, AfterATimeoutLaterOpsDoNotWaitForMismatchedNumbers) {
  if (size() < 2) GTEST_SKIP();
  const int n = size(), late = size() - 1;
  ASSERT_TRUE(config::Registry::Global().Set("WEFT_STALL_TIMEOUT_SECONDS", "0.5").ok());
  Buffer x(DType::kFloat32, {2});
  x.Fill(1);
  if (rank() != late) {
    Status st = allreduce(x.view(), x.view(), false, "never.on.the.last");
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(900));
  }
  config::Registry::Global().Unset("WEFT_STALL_TIMEOUT_SECONDS");
  ASSERT_TRUE(barrier().ok());
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < 10; ++round) {
    Buffer y(DType::kFloat32, {3});
    y.Fill(rank() + round);
    ASSERT_TRUE(allreduce(y.view(), y.view(), false, round % 2 == 0 ? "" : "later").ok());
    EXPECT_EQ(y.Get(2), n * (n - 1) / 2.0 + n * round);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 0.5);
  // A fresh init() starts a fresh agreement, for the tests after this one.
  ASSERT_TRUE(shutdown().ok());
  ASSERT_TRUE(init().ok());
}

}  // namespace
}  // namespace weft
