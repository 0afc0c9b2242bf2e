// Bad input under real mpirun: each case is a clear error on every rank involved, the
// inputs are untouched, and the ranks carry on afterwards (no hang).
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "comm/comm.h"
#include "core/config.h"
#include "core/logging.h"
#include "gtest/gtest.h"
#include "tests/comm/test_util.h"

namespace weft {
namespace {

using testing::Buffer;
using testing::Contains;

const auto* const kEnv = weft::testing::InitWeftForAllTests();

// After each test every rank must still be in step.
class Errors : public ::testing::Test {
 protected:
  void TearDown() override { ASSERT_TRUE(barrier().ok()); }
};

TEST_F(Errors, ShapeMismatchUnderOneNameFailsOnEveryRank) {
  if (size() < 2) GTEST_SKIP();
  Buffer x(DType::kFloat32, {rank() == size() - 1 ? 5 : 4});
  x.Fill(rank() + 1);
  Status st = allreduce(x.view(), x.view(), true, "grad.w");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(Contains(st, "allreduce 'grad.w'")) << st;
  EXPECT_TRUE(Contains(st, "[5] on rank " + std::to_string(size() - 1))) << st;
  EXPECT_TRUE(Contains(st, "[4] on rank")) << st;
  EXPECT_EQ(x.Get(0), rank() + 1);  // untouched
}

TEST_F(Errors, DTypeAndOpMismatch) {
  if (size() < 2) GTEST_SKIP();
  Buffer x(rank() == 0 ? DType::kFloat64 : DType::kFloat32, {3});
  Status st = allreduce(x.view(), x.view(), true, "mixed.dtype");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(st, "dtype differs")) << st;
  EXPECT_TRUE(Contains(st, "float64 on rank 0")) << st;

  Buffer y(DType::kFloat32, {3});
  Status st2 = rank() == 0 ? broadcast(y.view(), y.view(), 0, "mixed.op")
                           : allreduce(y.view(), y.view(), true, "mixed.op");
  EXPECT_EQ(st2.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(st2, "different operations")) << st2;
  EXPECT_TRUE(Contains(st2, "broadcast on rank 0")) << st2;
}

TEST_F(Errors, BroadcastRootMismatchAndOutOfRange) {
  Buffer x(DType::kFloat32, {2});
  Status bad = broadcast(x.view(), x.view(), size());
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(bad, "out of range")) << bad;
  if (size() < 2) return;
  Status st = broadcast(x.view(), x.view(), rank() == 0 ? 1 : 0, "root.mismatch");
  EXPECT_TRUE(Contains(st, "root rank differs")) << st;
}

TEST_F(Errors, WeightArgumentsAreCheckedLocally) {
  Buffer x(DType::kFloat32, {2});
  NeighborAllreduceOptions only_src;
  only_src.src_weights = std::map<int, double>{};
  Status st = neighbor_allreduce(x.view(), x.view(), only_src);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(st, "self_weight and src_weights go together")) << st;

  NeighborAllreduceOptions only_dst;
  only_dst.dst_weights = std::map<int, double>{};
  st = neighbor_allreduce(x.view(), x.view(), only_dst);
  EXPECT_TRUE(Contains(st, "dst_weights needs self_weight and src_weights")) << st;

  NeighborAllreduceOptions out_of_range;
  out_of_range.self_weight = 0.5;
  out_of_range.src_weights = std::map<int, double>{{size() + 3, 0.5}};
  st = neighbor_allreduce(x.view(), x.view(), out_of_range);
  EXPECT_TRUE(Contains(st, "out of range")) << st;

  NeighborAllreduceOptions self;
  self.self_weight = 0.5;
  self.src_weights = std::map<int, double>{{rank(), 0.5}};
  st = neighbor_allreduce(x.view(), x.view(), self);
  EXPECT_TRUE(Contains(st, "give its weight as self_weight")) << st;

  Buffer wrong_out(DType::kFloat64, {2});
  st = neighbor_allreduce(x.view(), wrong_out.view());
  EXPECT_TRUE(Contains(st, "the output must have the input's dtype and shape")) << st;

  // An output sharing part of the input's memory is refused (the same memory is in place).
  Buffer wide(DType::kFloat32, {3});
  wide.Fill(1);
  auto* base = static_cast<float*>(wide.view().data());
  const TensorView head(base, DType::kFloat32, {2}), tail(base + 1, DType::kFloat32, {2});
  st = allreduce(head, tail, false);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(Contains(st, "the output overlaps the input without being the same memory")) << st;
  st = neighbor_allreduce(tail, head);
  EXPECT_TRUE(Contains(st, "the output overlaps the input")) << st;
  EXPECT_EQ(wide.Get(0), 1);
  EXPECT_EQ(wide.Get(2), 1);
  // Adjacent is not overlapping.
  const TensorView first(base, DType::kFloat32, {1}), second(base + 1, DType::kFloat32, {1});
  st = allreduce(first, second, false);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(wide.Get(1), size());

  EXPECT_FALSE(pair_gossip(x.view(), x.view(), rank()).ok());
  Status reserved = allreduce(x.view(), x.view(), true, "#3");
  EXPECT_TRUE(Contains(reserved, "reserved")) << reserved;
}

TEST_F(Errors, WeightNamingANonNeighborIsAnError) {
  if (size() < 4) GTEST_SKIP() << "needs a rank that is not an in-neighbor";
  const std::vector<int> in = in_neighbor_ranks();
  int outsider = -1;
  for (int r = 0; r < size(); ++r) {
    if (r != rank() && std::find(in.begin(), in.end(), r) == in.end()) outsider = r;
  }
  if (outsider < 0) GTEST_SKIP() << "every rank is a neighbor";
  NeighborAllreduceOptions opts;
  opts.self_weight = 0.5;
  opts.src_weights = std::map<int, double>{{outsider, 0.5}};
  Buffer x(DType::kFloat32, {2});
  Status st = neighbor_allreduce(x.view(), x.view(), opts);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(st, "not an in-neighbor")) << st;
}

TEST_F(Errors, MismatchedDynamicSendAndReceiveSetsFailOnAllRanks) {
  if (size() < 3) GTEST_SKIP();
  const int n = size();
  // Everyone sends to the next rank but expects data from the rank two back.
  NeighborAllreduceOptions opts;
  opts.self_weight = 0.5;
  opts.src_weights = std::map<int, double>{{(rank() - 2 + n) % n, 0.5}};
  opts.dst_weights = std::map<int, double>{{(rank() + 1) % n, 1.0}};
  Buffer x(DType::kFloat32, {4}), y(DType::kFloat32, {4});
  x.Fill(7);
  Status st = neighbor_allreduce(x.view(), y.view(), opts, "bad.pattern");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(Contains(st, "send and receive ranks do not match")) << st;
  EXPECT_TRUE(Contains(st, "rank 0 expects to receive from rank " + std::to_string(n - 2))) << st;
  EXPECT_EQ(x.Get(0), 7);
}

TEST_F(Errors, NonMutualPairGossip) {
  if (size() < 3) GTEST_SKIP();
  Buffer x(DType::kFloat32, {2});
  Status st = pair_gossip(x.view(), x.view(), (rank() + 1) % size(), 0.5, 0.5, "gossip.bad");
  EXPECT_TRUE(Contains(st, "send and receive ranks do not match")) << st;
}

TEST_F(Errors, NonEquivalentTopologiesAreRejectedAndNothingChanges) {
  if (size() < 4) GTEST_SKIP() << "ring and exponential graphs coincide below 4 ranks";
  const Topology before = load_topology();
  const Topology mine = rank() == 0 ? *RingGraph(size()) : *ExponentialTwoGraph(size());
  Status st = set_topology(mine);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(Contains(st, "not equivalent")) << st;
  EXPECT_TRUE(IsEquivalent(load_topology(), before));
  Status size_mismatch = set_topology(*RingGraph(size() + 1));
  EXPECT_TRUE(Contains(size_mismatch, "ranks but weft runs")) << size_mismatch;
}

TEST_F(Errors, SetTopologyWithOpsInFlightFailsEverywhere) {
  if (size() < 2) GTEST_SKIP();
  // The last rank holds an op in flight that the others have not submitted yet.
  Buffer x(DType::kFloat32, {2});
  Handle pending;
  if (rank() == size() - 1) {
    auto h = allreduce_nonblocking(x.view(), x.view(), true, "held");
    ASSERT_TRUE(h.ok());
    pending = *h;
  }
  Status st = set_topology(*RingGraph(size()));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(Contains(st, "in flight on rank " + std::to_string(size() - 1))) << st;
  if (rank() != size() - 1) {
    ASSERT_TRUE(allreduce(x.view(), x.view(), true, "held").ok());
  } else {
    ASSERT_TRUE(wait(pending).ok());
  }
  EXPECT_TRUE(IsEquivalent(load_topology(), *ExponentialGraph(size())));
}

TEST_F(Errors, ReusingANameInFlightIsAnError) {
  Buffer x(DType::kFloat32, {2}), y(DType::kFloat32, {2});
  // "dup" cannot complete on any rank until the last rank submits it, which it does only
  // after the others have tried the name a second time (the barrier runs independently).
  const bool last = rank() == size() - 1;
  if (last) {
    ASSERT_TRUE(barrier().ok());
  }
  auto first = allreduce_nonblocking(x.view(), x.view(), true, "dup");
  ASSERT_TRUE(first.ok());
  if (!last) {
    auto second = allreduce_nonblocking(y.view(), y.view(), true, "dup");
    EXPECT_FALSE(second.ok());
    EXPECT_TRUE(Contains(second.status(), "already in flight")) << second.status();
    ASSERT_TRUE(barrier().ok());
  }
  EXPECT_TRUE(wait(*first).ok());
  // Once completed, the name is free again.
  EXPECT_TRUE(allreduce(y.view(), y.view(), true, "dup").ok());
}

// Unsupported dtypes are refused when a DLTensor becomes a view (core/tensor_test.cc);
// here, what a view can describe but the MPI engine cannot run.
TEST_F(Errors, UnsupportedDeviceAndLayout) {
  Buffer x(DType::kFloat32, {2});
  TensorView cuda(x.view().data(), DType::kFloat32, {2}, {1}, Device::CUDA(0));
  Status st = allreduce(cuda, cuda);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  Buffer square(DType::kFloat32, {2, 2});
  TensorView transposed(square.view().data(), DType::kFloat32, {2, 2}, {1, 2}, Device::CPU());
  Status st2 = allreduce(transposed, transposed);
  EXPECT_EQ(st2.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(st2, "not contiguous")) << st2;
}

TEST_F(Errors, WaitingInsideAnAllocatorIsAnErrorNotADeadlock) {
  Buffer x(DType::kFloat32, {2});
  testing::Arena arena;
  Status inner;
  Allocator alloc = [&](DType d, const std::vector<int64_t>& shape) {
    inner = barrier();  // would wait for the very engine this thread is running
    return arena.allocator()(d, shape);
  };
  auto out = allgather(x.view(), alloc, "alloc.waits");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(inner.code(), absl::StatusCode::kFailedPrecondition) << inner;
  EXPECT_TRUE(Contains(inner, "from an output Allocator")) << inner;
}

// Unnamed ops of every kind, each checked on every rank: a rank left a meeting behind or
// ahead of the others by an earlier op reads or overwrites areas out of step, and one of
// these sums or gathers comes out wrong (or hangs).
void ExpectInStep(int64_t count) {
  const int n = size();
  testing::Arena arena;
  for (int64_t elements : {int64_t{4}, count}) {
    Buffer x(DType::kFloat32, {elements});
    x.Fill(rank() + 1);
    ASSERT_TRUE(allreduce(x.view(), x.view(), false).ok());
    EXPECT_EQ(x.Get(0), n * (n + 1) / 2);
    EXPECT_EQ(x.Get(elements - 1), n * (n + 1) / 2);
    Buffer b(DType::kFloat32, {elements});
    b.Fill(rank() == 0 ? 7 : -1);
    ASSERT_TRUE(broadcast(b.view(), b.view(), 0).ok());
    EXPECT_EQ(b.Get(elements - 1), 7);
    x.Fill(rank() + 1);
    auto gathered = allgather(x.view(), arena.allocator());
    ASSERT_TRUE(gathered.ok()) << gathered.status();
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(Buffer::Read(gathered->data(), DType::kFloat32, r * elements), r + 1);
      EXPECT_EQ(Buffer::Read(gathered->data(), DType::kFloat32, (r + 1) * elements - 1), r + 1);
    }
  }
}

// An Allocator from `arena` that fails on rank `failing` (as an allocation out of memory).
Allocator FailingOn(int failing, testing::Arena& arena) {
  return [failing, &arena](DType d, const std::vector<int64_t>& shape) -> StatusOr<TensorView> {
    if (rank() == failing) return absl::ResourceExhaustedError("no memory left in the test");
    return arena.allocator()(d, shape);
  };
}

// An output allocator that fails on one rank fails that rank's op with the allocator's
// error, and nothing else: the rank still takes its part (into no output, or scratch
// memory), so the other ranks get their whole output and no rank waits for it, and the
// job stays in step. A blocking allgather's first meeting through shared memory can be
// agreed ahead ("staged"): a rank that skipped the op's part would then leave every later
// op a meeting out of step, silently.
TEST_F(Errors, AFailingOutputAllocatorFailsItsRankAloneAndTheJobStaysInStep) {
  if (size() < 2) GTEST_SKIP();
  const int failing = size() - 1;
  testing::Arena arena;
  const Allocator alloc = FailingOn(failing, arena);
  // Parts of 16 B to 2 MiB per rank: through the segment, by direct reads and through MPI,
  // as the number of ranks and their CPUs have it.
  for (int64_t part : {int64_t{4}, int64_t{24} << 10, int64_t{256} << 10, int64_t{512} << 10}) {
    SCOPED_TRACE(part);
    Buffer x(DType::kFloat32, {part});
    x.Fill(rank() + 1);
    for (bool blocking : {true, false}) {
      SCOPED_TRACE(blocking ? "blocking" : "nonblocking");
      StatusOr<TensorView> out = Internal("not run");
      if (blocking) {
        out = allgather(x.view(), alloc);
      } else {
        auto h = allgather_nonblocking(x.view(), alloc);
        ASSERT_TRUE(h.ok()) << h.status();
        const Status st = wait(*h);
        if (st.ok())
          out = h->output();
        else
          out = st;
      }
      if (rank() == failing) {
        EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << out.status();
        EXPECT_TRUE(Contains(out.status(), "no memory left in the test")) << out.status();
      } else {
        ASSERT_TRUE(out.ok()) << out.status();
        for (int r = 0; r < size(); ++r) {
          EXPECT_EQ(Buffer::Read(out->data(), DType::kFloat32, r * part), r + 1);
          EXPECT_EQ(Buffer::Read(out->data(), DType::kFloat32, (r + 1) * part - 1), r + 1);
        }
      }
      EXPECT_EQ(x.Get(part - 1), rank() + 1);  // the input untouched
      ExpectInStep(part);
    }
  }
  // An allocator that returns a tensor of another shape is refused alike.
  Buffer small(DType::kFloat32, {4});
  small.Fill(rank() + 1);
  Buffer wrong(DType::kFloat32, {3});
  auto out = allgather(small.view(), [&](DType d, const std::vector<int64_t>& shape) {
    return rank() == failing ? StatusOr<TensorView>(wrong.view()) : arena.allocator()(d, shape);
  });
  if (rank() == failing) {
    EXPECT_TRUE(Contains(out.status(), "the output allocator returned")) << out.status();
  } else {
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(Buffer::Read(out->data(), DType::kFloat32, 4 * failing), failing + 1);
  }
  ExpectInStep(4);
}

// The same for the other ops that allocate their output: neighbor_allgather and a recv
// into allocated memory.
TEST_F(Errors, AFailingAllocatorOfANeighborGatherOrRecvFailsItsRankAlone) {
  if (size() < 2) GTEST_SKIP();
  const int failing = size() - 1;
  testing::Arena arena;
  const Allocator alloc = FailingOn(failing, arena);
  for (int64_t part : {int64_t{4}, int64_t{256} << 10}) {
    SCOPED_TRACE(part);
    Buffer x(DType::kFloat32, {part});
    x.Fill(rank() + 1);
    auto out = neighbor_allgather(x.view(), alloc);
    if (rank() == failing) {
      EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << out.status();
    } else {
      ASSERT_TRUE(out.ok()) << out.status();
      const std::vector<int> from = in_neighbor_ranks();
      for (size_t k = 0; k < from.size(); ++k) {
        EXPECT_EQ(Buffer::Read(out->data(), DType::kFloat32, static_cast<int64_t>(k) * part),
                  from[k] + 1);
        EXPECT_EQ(
            Buffer::Read(out->data(), DType::kFloat32, static_cast<int64_t>(k + 1) * part - 1),
            from[k] + 1);
      }
    }
    if (rank() == 0) {
      EXPECT_TRUE(send(x.view(), failing).ok());
    } else if (rank() == failing) {
      auto got = recv(alloc, 0);
      EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted) << got.status();
    }
    ExpectInStep(part);
  }
}

TEST_F(Errors, StalledRankIsNamedThenTimesOut) {
  if (size() < 2) GTEST_SKIP();
  const int late = size() - 1;
  ASSERT_TRUE(config::Registry::Global().Set("WEFT_STALL_WARNING_SECONDS", "0.5").ok());
  ASSERT_TRUE(config::Registry::Global().Set("WEFT_STALL_TIMEOUT_SECONDS", "1.5").ok());
  std::mutex mu;
  std::vector<std::string> warnings;
  log::SetSinkForTesting([&](LogLevel level, const std::string& line) {
    std::lock_guard<std::mutex> lock(mu);
    if (level == LogLevel::kWarning) warnings.push_back(line);
  });
  Buffer x(DType::kFloat32, {2});
  x.Fill(3);
  if (rank() != late) {
    Status st = allreduce(x.view(), x.view(), true, "stalled");
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
    EXPECT_TRUE(Contains(st, "waiting for rank " + std::to_string(late))) << st;
    EXPECT_EQ(x.Get(0), 3);
  }
  if (rank() == late) {
    // Join the barrier once the others are about to, so it does not stall in turn.
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  }
  ASSERT_TRUE(barrier().ok());
  if (rank() == late) {
    // The late rank gets the same error at once.
    Status st = allreduce(x.view(), x.view(), true, "stalled");
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  }
  log::SetSinkForTesting(nullptr);
  config::Registry::Global().Unset("WEFT_STALL_WARNING_SECONDS");
  config::Registry::Global().Unset("WEFT_STALL_TIMEOUT_SECONDS");
  if (rank() == 0) {
    std::lock_guard<std::mutex> lock(mu);
    bool named = false;
    for (const auto& w : warnings) {
      named |= w.find("allreduce 'stalled'") != std::string::npos &&
               w.find("for rank " + std::to_string(late)) != std::string::npos;
    }
    EXPECT_TRUE(named) << "no stall warning naming rank " << late;
  }
}

// A rank that skips an unnamed op: after the timeout, the ranks' counts of unnamed calls
// differ, so every later unnamed op fails at once on every rank (never pairs with a
// different op); named ops still work; shutdown() returns on every rank, and after a new
// init() unnamed ops work again.
TEST_F(Errors, AfterAnUnnamedOpTimesOutUnnamedOpsFailUntilReinit) {
  if (size() < 2) GTEST_SKIP();
  const int late = size() - 1;
  ASSERT_TRUE(config::Registry::Global().Set("WEFT_STALL_TIMEOUT_SECONDS", "1").ok());
  Buffer x(DType::kFloat32, {3});
  x.Fill(1);
  if (rank() != late) {
    Status st = allreduce(x.view(), x.view(), false);  // the late rank never calls this one
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  } else {
    // Join the sync below once the others are about to, so it does not time out in turn.
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
  }
  Buffer sync(DType::kFloat32, {1});
  ASSERT_TRUE(allreduce(sync.view(), sync.view(), false, "skipped.sync").ok());
  // The next unnamed op, which every rank calls: no rank may get a sum, let alone a wrong
  // one. The late rank's call takes the timed-out number and gets its error.
  x.Fill(rank() + 1);
  const auto start = std::chrono::steady_clock::now();
  Status st = allreduce(x.view(), x.view(), false);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_FALSE(st.ok());
  if (rank() == late) {
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  } else {
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
    EXPECT_TRUE(Contains(st, "unnamed ops can no longer be matched across ranks")) << st;
    EXPECT_TRUE(Contains(st, "waiting for rank " + std::to_string(late))) << st;
    EXPECT_LT(seconds, 0.9) << "failed by the timeout, not at once";
  }
  EXPECT_EQ(x.Get(0), rank() + 1);  // untouched
  // And from here on on every rank, the late one included.
  st = broadcast(x.view(), x.view(), 0);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_TRUE(Contains(st, "shut down and re-initialize weft")) << st;
  // Named ops still pair by name.
  x.Fill(rank() + 1);
  ASSERT_TRUE(allreduce(x.view(), x.view(), false, "named.after.timeout").ok());
  EXPECT_EQ(x.Get(0), size() * (size() + 1) / 2.0);
  config::Registry::Global().Unset("WEFT_STALL_TIMEOUT_SECONDS");
  EXPECT_EQ(barrier().code(), absl::StatusCode::kFailedPrecondition);  // unnamed too
  ASSERT_TRUE(shutdown().ok());
  ASSERT_TRUE(init().ok());
  x.Fill(1);
  ASSERT_TRUE(allreduce(x.view(), x.view(), false).ok());
  EXPECT_EQ(x.Get(0), size());
}

// --- refusals keep the call order -----------------------------------------------------------

// The others' op fails promptly with the refusing rank's reason (no stall timeout is set:
// without the refusal being told, they would wait forever), and the unnamed ops after it
// pair with the right ones.
TEST_F(Errors, ARefusedUnnamedOpFailsEverywhereAndKeepsTheOrder) {
  if (size() < 2) GTEST_SKIP();
  const int refuser = size() - 1;
  Buffer x(DType::kFloat32, {4});
  x.Fill(1);
  Buffer wrong(DType::kFloat64, {4});  // not the input's dtype: refused before submission
  const auto start = std::chrono::steady_clock::now();
  Status st = allreduce(x.view(), rank() == refuser ? wrong.view() : x.view(), false);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(Contains(st, "the output must have the input's dtype and shape")) << st;
  if (rank() != refuser) {
    EXPECT_TRUE(Contains(st, "failed on rank " + std::to_string(refuser) + ", which refused it"))
        << st;
    EXPECT_LT(seconds, 5.0);
    EXPECT_EQ(x.Get(0), 1);  // untouched
  }
  // Two more unnamed ops with different values: each must add up its own values.
  for (double v : {2.0, 4.0}) {
    Buffer y(DType::kFloat32, {4});
    y.Fill(v);
    ASSERT_TRUE(allreduce(y.view(), y.view(), false).ok());
    for (int i = 0; i < 4; ++i) EXPECT_EQ(y.Get(i), v * size()) << "value " << v;
  }
}

// A burst of like unnamed calls travels and is matched as one run; an op in its middle that
// differs on one rank, or that one rank refuses, fails alone on every rank, and the others
// of the burst (before and after it, fused or not) add up their own values.
TEST_F(Errors, OneBadOpInABurstFailsAlone) {
  if (size() < 2) GTEST_SKIP();
  const int odd = size() - 1;
  constexpr int kOps = 16, kWider = 5, kRefused = 9;
  std::vector<Buffer> xs;
  for (int i = 0; i < kOps; ++i) {
    xs.emplace_back(DType::kFloat32, std::vector<int64_t>{rank() == odd && i == kWider ? 5 : 4});
    xs.back().Fill(i + 1);
  }
  Buffer wrong(DType::kFloat64, {4});
  std::vector<StatusOr<Handle>> handles;
  for (int i = 0; i < kOps; ++i) {
    const bool refuse = rank() == odd && i == kRefused;
    handles.push_back(
        allreduce_nonblocking(xs[i].view(), refuse ? wrong.view() : xs[i].view(), false));
  }
  for (int i = 0; i < kOps; ++i) {
    SCOPED_TRACE(i);
    Status st = handles[i].ok() ? wait(*handles[i]) : handles[i].status();
    if (i == kWider) {
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
      EXPECT_TRUE(Contains(st, "shape differs across ranks")) << st;
      EXPECT_EQ(xs[i].Get(0), i + 1);  // untouched
    } else if (i == kRefused) {
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
      if (rank() != odd) {
        EXPECT_TRUE(Contains(st, "failed on rank " + std::to_string(odd) + ", which refused it"))
            << st;
      }
      EXPECT_EQ(xs[i].Get(0), i + 1);
    } else {
      ASSERT_TRUE(st.ok()) << st;
      for (int k = 0; k < 4; ++k) EXPECT_EQ(xs[i].Get(k), (i + 1) * size());
    }
  }
}

TEST_F(Errors, ARefusedNamedOpFailsOnTheOthersPromptly) {
  if (size() < 2) GTEST_SKIP();
  const int refuser = 0;
  Buffer x(DType::kFloat32, {3});
  x.Fill(rank());
  const auto start = std::chrono::steady_clock::now();
  Status st = broadcast(x.view(), x.view(), rank() == refuser ? -1 : 0, "refused.root");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(Contains(st, "root_rank -1 is out of range")) << st;
  if (rank() != refuser) {
    EXPECT_TRUE(Contains(st, "broadcast 'refused.root' failed on rank 0")) << st;
    EXPECT_LT(seconds, 5.0);
    EXPECT_EQ(x.Get(0), rank());
  }
  // The name is free again everywhere, and a correct call under it runs.
  ASSERT_TRUE(broadcast(x.view(), x.view(), 0, "refused.root").ok());
  EXPECT_EQ(x.Get(0), 0);
}

// A refusal in a process set reaches the set's other members only.
TEST_F(Errors, ARefusedProcessSetOpFailsItsMembers) {
  if (size() < 3) GTEST_SKIP();
  const std::vector<int> set = {0, 1};
  if (rank() > 1) return;
  Buffer x(DType::kFloat32, {2});
  x.Fill(1);
  Buffer wrong(DType::kFloat32, {3});
  Status st = allreduce(x.view(), rank() == 1 ? wrong.view() : x.view(), false, "", set);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  if (rank() == 0) {
    EXPECT_TRUE(Contains(st, "failed on rank 1, which refused it")) << st;
  }
  ASSERT_TRUE(allreduce(x.view(), x.view(), false, "", set).ok());
  EXPECT_EQ(x.Get(0), 2);
}

// Unnamed ops from a thread other than init()'s are refused on every rank: their order
// there is not the same across ranks, so they could pair with other ranks' different ops.
// Named ops work from any thread, and the init thread's unnamed ops keep their order.
TEST_F(Errors, UnnamedOpsFromOtherThreadsAreRefusedNeverMixed) {
  constexpr int kThreads = 4, kOps = 8;
  std::atomic<int> refused{0}, wrong{0}, other{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kOps; ++i) {
        Buffer y(DType::kFloat64, {2});
        y.Fill(100 * t + i);
        Status st = allreduce(y.view(), y.view(), false);
        if (st.ok()) {
          wrong++;
        } else if (st.code() == absl::StatusCode::kInvalidArgument &&
                   Contains(st, "thread that called init()") &&
                   Contains(st, "give the op a name")) {
          refused++;
          if (y.Get(0) != 100 * t + i) wrong++;  // a refused op writes nothing
        } else {
          other++;
        }
        // Named, the same ops are fine from any thread.
        Buffer z(DType::kFloat64, {2});
        z.Fill(100 * t + i);
        st = allreduce(z.view(), z.view(), false,
                       "thread." + std::to_string(t) + "." + std::to_string(i));
        if (!st.ok() || z.Get(0) != (100 * t + i) * size()) wrong++;
      }
      if (barrier().ok()) wrong++;  // barrier cannot be named: init thread only
    });
  }
  // Meanwhile the init thread's own unnamed ops.
  for (int i = 0; i < kOps; ++i) {
    Buffer y(DType::kFloat32, {2});
    y.Fill(i + 1);
    Status st = allreduce(y.view(), y.view(), false);
    EXPECT_TRUE(st.ok()) << st;
    EXPECT_EQ(y.Get(1), (i + 1) * size());
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(refused.load(), kThreads * kOps);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(other.load(), 0);
}

// claim_call_order hands the order to another thread (what the Go binding does before each
// unnamed op, since goroutines move between threads): that thread's unnamed ops now match
// across ranks, and the init thread's are refused until it claims the order back.
TEST_F(Errors, ClaimingTheCallOrderMovesItToTheClaimingThread) {
  Status from_other;
  double sum = 0;
  Status init_thread_meanwhile;
  std::thread other([&] {
    claim_call_order();
    Buffer y(DType::kFloat64, {2});
    y.Fill(rank() + 1);
    from_other = allreduce(y.view(), y.view(), false);
    sum = y.Get(0);
  });
  other.join();
  EXPECT_TRUE(from_other.ok()) << from_other;
  EXPECT_EQ(sum, size() * (size() + 1) / 2.0);
  Buffer z(DType::kFloat64, {2});
  init_thread_meanwhile = allreduce(z.view(), z.view(), false);
  EXPECT_EQ(init_thread_meanwhile.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(init_thread_meanwhile, "thread that called init()"));
  claim_call_order();
  z.Fill(2);
  Status back = allreduce(z.view(), z.view(), false);
  EXPECT_TRUE(back.ok()) << back;
  EXPECT_EQ(z.Get(1), 2.0 * size());
}

// A setting that decides how ops run, set differently on one rank, fails init() on every
// rank with its name, where it used to hang every rank; with it fixed, init() works again.
TEST_F(Errors, SettingsThatDifferAcrossRanksFailInitEverywhere) {
  ASSERT_TRUE(shutdown().ok());
  const char* kName = "WEFT_RING_ALLREDUCE_BYTES";
  const bool last = std::getenv("OMPI_COMM_WORLD_RANK") != nullptr &&
                    std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")) ==
                        std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")) - 1;
  const bool several = std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")) > 1;
  if (last) setenv(kName, "12345", 1);
  Status st = init();
  if (several) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_TRUE(Contains(st, "WEFT_RING_ALLREDUCE_BYTES")) << st;
    EXPECT_FALSE(is_initialized());
  } else {
    ASSERT_TRUE(st.ok()) << st;  // one rank agrees with itself
    ASSERT_TRUE(shutdown().ok());
  }
  unsetenv(kName);
  ASSERT_TRUE(init().ok());
}

}  // namespace
}  // namespace weft
