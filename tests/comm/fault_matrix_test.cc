// The fault matrix: every op against every fault a rank can bring to it, under real mpirun
// (2 and 4 ranks). The last rank is the faulty one:
//   - shape: its tensor has another shape (in a dim that must agree);
//   - dtype: float64 where the others pass float32;
//   - refused: an argument the op refuses on that rank alone (a bad root, a NaN weight, an
//     unknown transport, an output of the wrong layout, ...);
//   - skipped: it never calls the op (WEFT_STALL_TIMEOUT_SECONDS is 1.5 for this case).
// Each case asserts, on every rank that calls the op: an error (never a success and never a
// wrong result), within its time bound (5 s; skipped: the timeout plus 3 s), whose message
// names the op; the inputs untouched; and afterwards a named allreduce with the right sum
// on every rank, so that no fault leaves the job out of step.
#include <chrono>
#include <map>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/comm.h"
#include "core/config.h"
#include "gtest/gtest.h"
#include "tests/comm/test_util.h"

namespace weft {
namespace {

using testing::Arena;
using testing::Buffer;

const auto* const kEnv = weft::testing::InitWeftForAllTests();

enum class Op {
  kAllreduce,
  kBroadcast,
  kAllgather,
  kNeighborAllgather,
  kNeighborAllreduce,
  kHierarchical,
  kPairGossip,
  kSendRecv,
  kWinCreate,
};
enum class Fault { kShape, kDType, kRefused, kSkipped };

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllreduce: return "allreduce";
    case Op::kBroadcast: return "broadcast";
    case Op::kAllgather: return "allgather";
    case Op::kNeighborAllgather: return "neighbor_allgather";
    case Op::kNeighborAllreduce: return "neighbor_allreduce";
    case Op::kHierarchical: return "hierarchical_neighbor_allreduce";
    case Op::kPairGossip: return "pair_gossip";
    case Op::kSendRecv: return "send_recv";
    case Op::kWinCreate: return "win_create";
  }
  return "?";
}

const char* FaultName(Fault fault) {
  switch (fault) {
    case Fault::kShape: return "shape";
    case Fault::kDType: return "dtype";
    case Fault::kRefused: return "refused";
    case Fault::kSkipped: return "skipped";
  }
  return "?";
}

// Whether this rank takes part in `op` (send/recv: the first and the last rank only).
bool Calls(Op op, int me, int n) { return op != Op::kSendRecv || me == 0 || me == n - 1; }

// Runs `op` on this rank, faulty or not, under `name`.
Status RunOp(Op op, Fault fault, bool faulty, const std::string& name, Buffer& x) {
  const int me = rank(), n = size();
  const bool refuse = faulty && fault == Fault::kRefused;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Arena arena;
  Buffer out(x.dtype(), refuse ? std::vector<int64_t>{7} : std::vector<int64_t>{2, 2});
  switch (op) {
    case Op::kAllreduce:
      // Refused: an output whose layout is not the input's.
      return allreduce(x.view(), refuse ? out.view() : x.view(), false, name);
    case Op::kBroadcast:
      return broadcast(x.view(), x.view(), refuse ? n : 0, name);  // root out of range
    case Op::kAllgather: {
      Buffer scalar(x.dtype(), {});
      // Refused: a scalar has no dim 0 to gather along.
      return allgather(refuse ? scalar.view() : x.view(), arena.allocator(), name).status();
    }
    case Op::kNeighborAllgather: {
      NeighborAllgatherOptions o;
      if (refuse) {
        o.src_ranks = std::vector<int>{me};  // itself: not an in-neighbor
        o.dst_ranks = std::vector<int>{me};
      }
      return neighbor_allgather(x.view(), arena.allocator(), o, name).status();
    }
    case Op::kNeighborAllreduce: {
      NeighborAllreduceOptions o;
      if (refuse) {
        o.self_weight = nan;
        o.src_weights = std::map<int, double>{};
      }
      return neighbor_allreduce(x.view(), x.view(), o, name);
    }
    case Op::kHierarchical: {
      HierarchicalNeighborAllreduceOptions o;
      if (refuse) {
        o.self_weight = nan;
        o.src_machine_weights = std::map<int, double>{};
      }
      return hierarchical_neighbor_allreduce(x.view(), x.view(), o, name);
    }
    case Op::kPairGossip:
      return pair_gossip(x.view(), x.view(), me ^ 1, refuse ? nan : 0.5, 0.5, name);
    case Op::kSendRecv:
      if (me == 0) return send(x.view(), n - 1, name);
      // Refused: a receive buffer without memory. (A receiver that names a wrong peer, itself
      // say, cannot tell its real peer: that is a stall, ended by the stall timeout.)
      return recv(refuse ? TensorView() : x.view(), 0, name);
    case Op::kWinCreate: {
      WinCreateOptions o;
      if (refuse) o.transport = "carrier-pigeon";
      Status st = win_create(x.view(), name, o);
      if (st.ok()) (void)win_free(name);  // a case that did not fail must not leave a window
      return st;
    }
  }
  return Internal("no such op");
}

class FaultMatrix : public ::testing::TestWithParam<std::tuple<Op, Fault>> {};

TEST_P(FaultMatrix, EveryCallingRankFailsPromptlyAndTheJobStaysInStep) {
  const auto [op, fault] = GetParam();
  const int me = rank(), n = size();
  if (n < 2) GTEST_SKIP() << "needs a second rank";
  if (op == Op::kPairGossip && n % 2 != 0) GTEST_SKIP() << "pairs need an even world";
  const int faulty_rank = n - 1;
  const bool faulty = me == faulty_rank;
  const std::string name =
      absl::StrCat("fm.", OpName(op), ".", FaultName(fault));
  const double timeout_s = 1.5;
  if (fault == Fault::kSkipped) {
    ASSERT_TRUE(config::Registry::Global()
                    .Set("WEFT_STALL_TIMEOUT_SECONDS", absl::StrCat(timeout_s))
                    .ok());
  }
  const bool wide = faulty && fault == Fault::kShape;
  const DType dtype = faulty && fault == Fault::kDType ? DType::kFloat64 : DType::kFloat32;
  Buffer x(dtype, wide ? std::vector<int64_t>{2, 3} : std::vector<int64_t>{2, 2});
  x.Fill(me + 1);
  const bool skips = faulty && fault == Fault::kSkipped;
  if (Calls(op, me, n) && !skips) {
    const auto start = std::chrono::steady_clock::now();
    Status st = RunOp(op, fault, faulty, name, x);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_FALSE(st.ok()) << name << " succeeded on rank " << me;
    const double bound = fault == Fault::kSkipped ? timeout_s + 3 : 5;
    EXPECT_LT(took, bound) << name << " took " << took << " s on rank " << me << ": " << st;
    // The message says which op (by its name, or the op's own for a local refusal).
    const std::string message(st.message());
    EXPECT_TRUE(message.find(name) != std::string::npos ||
                (faulty && message.find(op == Op::kSendRecv ? "recv" : OpName(op)) !=
                               std::string::npos))
        << name << " on rank " << me << ": " << st;
    if (!faulty && fault == Fault::kRefused) {
      EXPECT_NE(message.find("which refused it"), std::string::npos) << st;
    }
    if (fault == Fault::kSkipped) {
      EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
    }
    for (int64_t i = 0; i < x.numel(); ++i) {
      ASSERT_EQ(x.Get(i), me + 1) << name << ": rank " << me << "'s input changed";
    }
  }
  if (fault == Fault::kSkipped) {
    // The ranks that did not wait for the op (the skipper, and for send/recv the ranks
    // outside it) wait out the timeout here, so that every rank has dropped it before the
    // barrier: a barrier that timed out would end unnamed call order (errors_test).
    if (skips || !Calls(op, me, n)) {
      std::this_thread::sleep_for(std::chrono::duration<double>(timeout_s + 0.5));
    }
    config::Registry::Global().Unset("WEFT_STALL_TIMEOUT_SECONDS");
    ASSERT_TRUE(barrier().ok());
  }
  // The job is in step: a named allreduce sums right on every rank.
  Buffer check(DType::kFloat32, {3});
  check.Fill(me + 1);
  Status after = allreduce(check.view(), check.view(), false, name + ".after");
  ASSERT_TRUE(after.ok()) << after;
  EXPECT_EQ(check.Get(0), n * (n + 1) / 2.0) << "after " << name;
  EXPECT_TRUE(win_names().empty()) << "a window outlived " << name;
}

std::string CaseName(const ::testing::TestParamInfo<std::tuple<Op, Fault>>& info) {
  return absl::StrCat(OpName(std::get<0>(info.param)), "_", FaultName(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(
    AllOps, FaultMatrix,
    ::testing::Combine(::testing::Values(Op::kAllreduce, Op::kBroadcast, Op::kAllgather,
                                         Op::kNeighborAllgather, Op::kNeighborAllreduce,
                                         Op::kHierarchical, Op::kPairGossip, Op::kSendRecv,
                                         Op::kWinCreate),
                       ::testing::Values(Fault::kShape, Fault::kDType, Fault::kRefused,
                                         Fault::kSkipped)),
    CaseName);

}  // namespace
}  // namespace weft
