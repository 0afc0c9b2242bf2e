// Point-to-point ops and process sets (comm/comm.h) under real mpirun, on 1, 2, 4 and 8
// ranks: exact values, matching by name and by call order, and the error paths.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "core/config.h"
#include "gtest/gtest.h"
#include "tests/comm/test_util.h"

namespace weft {
namespace {

using weft::testing::Buffer;
using weft::testing::Contains;

const auto* const kEnv = weft::testing::InitWeftForAllTests();

// Receives into library-style owned memory: the Allocator keeps the buffer.
struct Owned {
  std::vector<char> bytes;
  Allocator alloc() {
    return [this](DType dtype, const std::vector<int64_t>& shape) -> StatusOr<TensorView> {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      bytes.assign(static_cast<size_t>(n) * DTypeSize(dtype), 0);
      return TensorView(bytes.data(), dtype, shape);
    };
  }
};

TEST(PointToPoint, RingOfNamedNonblockingSendsAndRecvs) {
  if (size() < 2) GTEST_SKIP();
  const int next = (rank() + 1) % size(), prev = (rank() + size() - 1) % size();
  Buffer out(DType::kFloat64, {3, 5}), in(DType::kFloat64, {3, 5});
  for (int64_t i = 0; i < out.numel(); ++i) out.Set(i, rank() * 100 + i);
  // Receive first, then send: neither waits for the other to be posted.
  // Named by the sender: on 2 ranks, prev == next and both directions are in flight.
  auto r = recv_nonblocking(in.view(), prev, "ring" + std::to_string(prev));
  auto s = send_nonblocking(out.view(), next, "ring" + std::to_string(rank()));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(wait(*s).ok());
  ASSERT_TRUE(wait(*r).ok());
  for (int64_t i = 0; i < in.numel(); ++i) EXPECT_EQ(in.Get(i), prev * 100 + i);
}

TEST(PointToPoint, TheSameNameOnDisjointPairsDoesNotCollide) {
  if (size() < 4) GTEST_SKIP();
  // Pairs (0,1), (2,3)...: every pair uses the name "act" at once.
  const int peer = rank() ^ 1;
  if (peer >= size()) GTEST_SKIP();
  Buffer x(DType::kInt32, {4});
  if (rank() % 2 == 0) {
    x.Fill(rank() + 7);
    ASSERT_TRUE(send(x.view(), peer, "act").ok());
  } else {
    ASSERT_TRUE(recv(x.view(), peer, "act").ok());
    for (int i = 0; i < 4; ++i) EXPECT_EQ(x.Get(i), peer + 7);
  }
}

TEST(PointToPoint, RecvWithAnAllocatorTakesTheSendersShapeAndDtype) {
  if (size() < 2) GTEST_SKIP();
  if (rank() == 0) {
    for (int dst = 1; dst < size(); ++dst) {
      Buffer x(DType::kInt64, {dst, 2});  // a different shape per receiver
      for (int64_t i = 0; i < x.numel(); ++i) x.Set(i, dst * 10 + i);
      ASSERT_TRUE(send(x.view(), dst, "shaped").ok());
    }
  } else {
    Owned owned;
    auto got = recv(owned.alloc(), 0, "shaped");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->dtype(), DType::kInt64);
    EXPECT_EQ(got->shape(), (std::vector<int64_t>{rank(), 2}));
    for (int64_t i = 0; i < got->numel(); ++i) {
      EXPECT_EQ(Buffer::Read(got->data(), DType::kInt64, i), rank() * 10 + i);
    }
  }
}

TEST(PointToPoint, UnnamedOpsOfAPairMatchInCallOrder) {
  if (size() < 2) GTEST_SKIP();
  if (rank() > 1) return;
  std::vector<Buffer> bufs;
  for (int k = 0; k < 5; ++k) bufs.emplace_back(DType::kFloat32, std::vector<int64_t>{k + 1});
  std::vector<Handle> handles;
  for (int k = 0; k < 5; ++k) {
    if (rank() == 0) {
      bufs[k].Fill(k);
      auto h = send_nonblocking(bufs[k].view(), 1);
      ASSERT_TRUE(h.ok()) << h.status();
      handles.push_back(*h);
    } else {
      auto h = recv_nonblocking(bufs[k].view(), 0);
      ASSERT_TRUE(h.ok()) << h.status();
      handles.push_back(*h);
    }
  }
  for (auto& h : handles) ASSERT_TRUE(wait(h).ok());
  if (rank() == 1) {
    for (int k = 0; k < 5; ++k) EXPECT_EQ(bufs[k].Get(k), k);
  }
  // Unnamed collectives of all ranks still match: the pair's counter is its own.
  Buffer y(DType::kFloat32, {1});
  y.Fill(1);
}

TEST(PointToPoint, AShapeOrDtypeMismatchIsAnErrorOnBothRanks) {
  if (size() < 2) GTEST_SKIP();
  if (rank() > 1) return;
  Buffer four(DType::kFloat32, {4}), five(DType::kFloat32, {5}), dbl(DType::kFloat64, {4});
  four.Fill(1);
  five.Fill(2);
  if (rank() == 0) {
    Status st = send(four.view(), 1, "mismatch");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_TRUE(Contains(st, "[4]") && Contains(st, "[5]")) << st;
    st = send(four.view(), 1, "dtype");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_TRUE(Contains(st, "float64")) << st;
  } else {
    Status st = recv(five.view(), 0, "mismatch");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_TRUE(Contains(st, "'mismatch'")) << st;
    for (int i = 0; i < 5; ++i) EXPECT_EQ(five.Get(i), 2);  // untouched
    st = recv(dbl.view(), 0, "dtype");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  }
  // The pair still works afterwards.
  if (rank() == 0) {
    ASSERT_TRUE(send(four.view(), 1, "after").ok());
  } else {
    Buffer got(DType::kFloat32, {4});
    ASSERT_TRUE(recv(got.view(), 0, "after").ok());
    EXPECT_EQ(got.Get(3), 1);
  }
}

TEST(PointToPoint, BadArgumentsFailBeforeAnythingIsSent) {
  Buffer x(DType::kFloat32, {2});
  Status st = send(x.view(), rank(), "self");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(Contains(st, "itself")) << st;
  st = recv(x.view(), size(), "far");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(Contains(st, "src")) << st;
  st = send(x.view(), -1, "neg");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_EQ(recv(Allocator(), 0, "none").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PointToPoint, AMissingSenderIsNamedThenTimesOut) {
  if (size() < 2) GTEST_SKIP();
  // Rank 0's coordinator applies the timeout: every rank sets it.
  ASSERT_TRUE(config::Registry::Global().Set("WEFT_STALL_TIMEOUT_SECONDS", "2").ok());
  Buffer x(DType::kFloat32, {2});
  if (rank() == 1) {
    Status st = recv(x.view(), 0, "never");
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
    EXPECT_TRUE(Contains(st, "recv 'never' from rank 0")) << st;
    EXPECT_TRUE(Contains(st, "waiting for rank 0")) << st;
  } else {
    // Reach the barrier after rank 1 does (about 2 s), so that the barrier does not time out.
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  }
  ASSERT_TRUE(barrier().ok());
  config::Registry::Global().Unset("WEFT_STALL_TIMEOUT_SECONDS");
  ASSERT_TRUE(barrier().ok());
}

// A receive that gives up on a late sender (the stall timeout) leaves the sender's message
// to arrive after it. That message must not be taken by the pair's next receive: a larger
// one made MPI fail that receive as truncated, ending the process (seen in
// transition_death_test, whose ranks wait behind a dead one), and one of the same size
// handed it the wrong op's data. Rank 1 is made late by an Allocator that holds its engine
// for longer than the timeout in a receive from rank 0; rank 2 gives up on rank 1's first
// send, then receives its second.
TEST(PointToPoint, AMessageThatComesAfterItsReceiveGaveUpGoesToNoOtherReceive) {
  if (size() < 3) GTEST_SKIP();
  for (int64_t second : {int64_t{8}, int64_t{64}}) {  // smaller than the first, then as large
    SCOPED_TRACE(second);
    // Only rank 2's receive is to time out: the others, whose ops and barrier wait for ranks
    // 1 and 2, take none (the coordinator on rank 0 applies its own).
    if (rank() == 2) {
      ASSERT_TRUE(config::Registry::Global().Set("WEFT_STALL_TIMEOUT_SECONDS", "1").ok());
    }
    Buffer first(DType::kFloat32, {64}), next(DType::kFloat32, {second});
    if (rank() == 0) {
      Buffer x(DType::kFloat32, {4});
      x.Fill(1);
      ASSERT_TRUE(send(x.view(), 1, "hold").ok());
    } else if (rank() == 1) {
      Owned held;
      Allocator slow = [&](DType d, const std::vector<int64_t>& shape) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1400));
        return held.alloc()(d, shape);
      };
      first.Fill(100);
      next.Fill(200);
      // Once the others have asked for their ops, the three reach rank 0 together and are
      // answered in this order: rank 1's engine is held before it sends, while rank 2,
      // told of both its receives at once, gives up on the first.
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      group_start();
      auto hold = recv_nonblocking(slow, 0, "hold");
      auto a = send_nonblocking(first.view(), 2, "first");
      auto b = send_nonblocking(next.view(), 2, "next");
      ASSERT_TRUE(group_end().ok());
      ASSERT_TRUE(hold.ok() && a.ok() && b.ok());
      EXPECT_TRUE(wait(*hold).ok());
      EXPECT_TRUE(wait(*a).ok());
      EXPECT_TRUE(wait(*b).ok());
    } else if (rank() == 2) {
      first.Fill(-1);
      next.Fill(-1);
      Status given_up = recv(first.view(), 1, "first");
      // Given up after the timeout (or, on a slow machine, in time after all).
      if (given_up.ok()) {
        EXPECT_EQ(first.Get(63), 100);
      } else {
        EXPECT_EQ(given_up.code(), absl::StatusCode::kDeadlineExceeded) << given_up;
      }
      Status b = recv(next.view(), 1, "next");
      EXPECT_TRUE(b.ok()) << b;
      for (int64_t i = 0; i < second; ++i) ASSERT_EQ(next.Get(i), 200) << i;
    }
    config::Registry::Global().Unset("WEFT_STALL_TIMEOUT_SECONDS");
    ASSERT_TRUE(barrier().ok());
  }
}

TEST(ProcessSets, AllreduceAndBroadcastInDisjointSets) {
  // Even and odd ranks: each set averages and broadcasts among itself, same names.
  std::vector<int> set;
  for (int r = rank() % 2; r < size(); r += 2) set.push_back(r);
  Buffer x(DType::kFloat32, {3});
  x.Fill(rank());
  ASSERT_TRUE(allreduce(x.view(), x.view(), true, "g", set).ok());
  double mean = 0;
  for (int r : set) mean += r;
  mean /= set.size();
  for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(x.Get(i), mean);

  Buffer sum(DType::kInt64, {2});
  sum.Fill(rank() + 1);
  ASSERT_TRUE(allreduce(sum.view(), sum.view(), false, "", set).ok());  // unnamed, per set
  int64_t total = 0;
  for (int r : set) total += r + 1;
  EXPECT_EQ(sum.Get(1), total);

  const int root = set.back();
  Buffer b(DType::kFloat64, {2});
  b.Fill(rank() == root ? 42.5 : -1);
  ASSERT_TRUE(broadcast(b.view(), b.view(), root, "b", set).ok());
  EXPECT_EQ(b.Get(0), 42.5);

  // Every rank listed is the whole world: it matches ranks passing no set.
  std::vector<int> everyone(size());
  for (int r = 0; r < size(); ++r) everyone[r] = r;
  Buffer w(DType::kFloat32, {1});
  w.Fill(1);
  ASSERT_TRUE(allreduce(w.view(), w.view(), false, "world",
                        rank() == 0 ? everyone : std::vector<int>{}).ok());
  EXPECT_EQ(w.Get(0), size());
}

TEST(ProcessSets, ManyNonblockingOpsInOverlappingOrderComplete) {
  // Sets {r, r+1 mod n} overlap: every rank is in two. Submitted in different orders on
  // different ranks, they still complete (the coordinator orders them for everyone).
  if (size() < 3) GTEST_SKIP();
  const int next = (rank() + 1) % size(), prev = (rank() + size() - 1) % size();
  Buffer a(DType::kFloat64, {4}), b(DType::kFloat64, {4});
  a.Fill(rank());
  b.Fill(rank());
  std::vector<int> up = {rank(), next}, down = {prev, rank()};
  std::sort(up.begin(), up.end());
  std::sort(down.begin(), down.end());
  const std::string up_name = "pair" + std::to_string(std::min(rank(), next));
  const std::string down_name = "pair" + std::to_string(std::min(prev, rank()));
  StatusOr<Handle> h1, h2;
  if (rank() % 2 == 0) {
    h1 = allreduce_nonblocking(a.view(), a.view(), true, up_name, up);
    h2 = allreduce_nonblocking(b.view(), b.view(), true, down_name, down);
  } else {
    h2 = allreduce_nonblocking(b.view(), b.view(), true, down_name, down);
    h1 = allreduce_nonblocking(a.view(), a.view(), true, up_name, up);
  }
  ASSERT_TRUE(h1.ok() && h2.ok());
  ASSERT_TRUE(wait(*h1).ok());
  ASSERT_TRUE(wait(*h2).ok());
  EXPECT_DOUBLE_EQ(a.Get(0), (rank() + next) / 2.0);
  EXPECT_DOUBLE_EQ(b.Get(0), (rank() + prev) / 2.0);
}

TEST(ProcessSets, BadSetsAreRefused) {
  Buffer x(DType::kFloat32, {1});
  Status st = allreduce(x.view(), x.view(), true, "dup", {rank(), rank()});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(Contains(st, "twice")) << st;
  st = allreduce(x.view(), x.view(), true, "range", {rank(), size()});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  if (size() > 1) {
    const int other = (rank() + 1) % size();
    st = allreduce(x.view(), x.view(), true, "without me", {other});
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_TRUE(Contains(st, "not in `ranks`")) << st;
    st = broadcast(x.view(), x.view(), other, "root outside", {rank()});
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_TRUE(Contains(st, "root_rank")) << st;
  }
}

}  // namespace
}  // namespace weft
