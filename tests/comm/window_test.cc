// One-sided windows on MPI RMA under real mpirun: every operation with exact values over
// several topologies and every dtype, versions, the associated p, mutual exclusion, and
// the error paths (each a clear error on the ranks involved, no hang).
#include <chrono>
#include <map>
#include <thread>

#include "comm/comm.h"
#include "comm/topology.h"
#include "gtest/gtest.h"
#include "tests/comm/test_util.h"

namespace weft {
namespace {

using testing::Buffer;
using testing::Contains;

const auto* const kEnv = weft::testing::InitWeftForAllTests();

// Every test leaves no window behind and the default topology in force.
class Windows : public ::testing::Test {
 protected:
  void TearDown() override {
    EXPECT_TRUE(win_free().ok());
    EXPECT_TRUE(set_topology(*ExponentialGraph(size())).ok());
    ASSERT_TRUE(barrier().ok());
  }
};

// x_r = (r + 1) * (1, 2, 3).
double Value(int r, int i) { return (r + 1.0) * (i + 1); }

std::vector<Topology> Topologies() {
  std::vector<Topology> out;
  out.push_back(*ExponentialGraph(size()));
  out.push_back(*RingGraph(size()));
  out.push_back(*FullyConnectedGraph(size()));
  out.push_back(*StarGraph(size()));
  return out;
}

TEST_F(Windows, PutThenUpdateAveragesExactlyOnEveryTopology) {
  int round = 0;
  for (const Topology& topo : Topologies()) {
    ASSERT_TRUE(set_topology(topo).ok());
    const std::string name = "w.put." + std::to_string(round++);
    Buffer x(DType::kFloat64, {3});
    for (int i = 0; i < 3; ++i) x.Set(i, Value(rank(), i));
    ASSERT_TRUE(win_create(x.view(), name).ok());
    const std::vector<int> in = topo.in_neighbors(rank());

    // Before any put, the buffers hold copies of this rank's own x: versions are 0.
    auto versions = win_version(name);
    ASSERT_TRUE(versions.ok()) << versions.status();
    for (int j : in) EXPECT_EQ((*versions)[j], 0);
    ASSERT_TRUE(barrier().ok());  // nobody puts before everyone has looked

    ASSERT_TRUE(win_put(x.view(), name).ok());
    ASSERT_TRUE(barrier().ok());  // every put has landed (passive target, unlocked)
    versions = win_version(name);
    ASSERT_TRUE(versions.ok());
    ASSERT_EQ(versions->size(), in.size());
    for (int j : in) EXPECT_EQ((*versions)[j], 1) << "from " << j;

    ASSERT_TRUE(win_update(name).ok());  // uniform over self and the buffers
    for (int i = 0; i < 3; ++i) {
      double expected = Value(rank(), i);
      for (int j : in) expected += Value(j, i);
      expected /= static_cast<double>(in.size() + 1);
      EXPECT_DOUBLE_EQ(x.Get(i), expected) << "element " << i;
    }
    versions = win_version(name);
    for (int j : in) EXPECT_EQ((*versions)[j], 0);
    auto p = win_associated_p(name);
    ASSERT_TRUE(p.ok());
    EXPECT_DOUBLE_EQ(*p, 1.0);  // every p was 1
    ASSERT_TRUE(win_free(name).ok());
  }
}

TEST_F(Windows, WeightsSelfWeightAndAssociatedP) {
  Buffer x(DType::kFloat64, {3});
  for (int i = 0; i < 3; ++i) x.Set(i, Value(rank(), i));
  ASSERT_TRUE(win_create(x.view(), "w.weights").ok());
  const Topology topo = load_topology();
  const std::vector<int> in = topo.in_neighbors(rank());
  std::map<int, double> dst;
  for (int d : topo.out_neighbors(rank())) dst[d] = 0.5;
  WinPutOptions put;
  put.self_weight = 0.5;
  put.dst_weights = dst;
  ASSERT_TRUE(win_put(x.view(), "w.weights", put).ok());
  for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(x.Get(i), 0.5 * Value(rank(), i));
  ASSERT_TRUE(barrier().ok());
  WinUpdateOptions update;
  update.self_weight = 1.0;
  update.neighbor_weights.emplace();
  for (int j : in) (*update.neighbor_weights)[j] = 1.0;
  ASSERT_TRUE(win_update("w.weights", update).ok());
  // Push-sum style: x and p move with the same weights.
  double expected_p = 0.5;
  for (size_t k = 0; k < in.size(); ++k) expected_p += 0.5;
  for (int i = 0; i < 3; ++i) {
    double expected = 0.5 * Value(rank(), i);
    for (int j : in) expected += 0.5 * Value(j, i);
    EXPECT_DOUBLE_EQ(x.Get(i), expected);
  }
  EXPECT_DOUBLE_EQ(*win_associated_p("w.weights"), expected_p);
}

// Neighbor buffers hold no pushed mass until written: their p starts at 0, also when
// their tensors start as copies of x.
TEST_F(Windows, NeighborBuffersStartWithNoAssociatedP) {
  Buffer x(DType::kFloat64, {2});
  x.Fill(rank() + 1);
  ASSERT_TRUE(win_create(x.view(), "w.p0").ok());
  WinUpdateOptions update;
  update.self_weight = 1.0;
  update.neighbor_weights.emplace();
  const Topology topo = load_topology();
  for (int j : topo.in_neighbors(rank())) (*update.neighbor_weights)[j] = 1.0;
  Status st = win_update("w.p0", update);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_DOUBLE_EQ(*win_associated_p("w.p0"), 1.0);
  ASSERT_TRUE(win_free("w.p0").ok());
}

TEST_F(Windows, AccumulateThenCollectSumsForEveryDType) {
  for (DType dtype : testing::kAllDTypes) {
    const std::string name = std::string("w.acc.") + DTypeName(dtype);
    Buffer x(dtype, {4});
    for (int i = 0; i < 4; ++i) x.Set(i, rank() + i);
    ASSERT_TRUE(win_create(x.view(), name, /*zero_init=*/true).ok());
    ASSERT_TRUE(win_accumulate(x.view(), name).ok());
    ASSERT_TRUE(win_accumulate(x.view(), name).ok());
    ASSERT_TRUE(barrier().ok());
    auto versions = win_version(name);
    const std::vector<int> in = load_topology().in_neighbors(rank());
    for (int j : in) EXPECT_EQ((*versions)[j], 2);
    ASSERT_TRUE(win_update_then_collect(name).ok());
    for (int i = 0; i < 4; ++i) {
      double expected = rank() + i;
      for (int j : in) expected += 2.0 * (j + i);
      EXPECT_EQ(x.Get(i), expected) << DTypeName(dtype) << " element " << i;
    }
    // The buffers were zeroed: collecting again changes nothing.
    const double before = x.Get(3);
    ASSERT_TRUE(win_update_then_collect(name).ok());
    EXPECT_EQ(x.Get(3), before);
    ASSERT_TRUE(win_free(name).ok());
  }
}

// Accumulated integers wrap around on overflow, as allreduce's sums do, however long the
// tensor (Open MPI 4.1's vectorized MPI_SUM saturates 8- and 16-bit integers in whole
// vectors; comm/README.md).
TEST_F(Windows, AccumulatedIntegersWrapOnOverflow) {
  const std::pair<DType, int64_t> cases[] = {{DType::kInt8, 100},
                                             {DType::kUInt8, 200},
                                             {DType::kInt16, 30000},
                                             {DType::kInt32, 2000000000}};
  for (const auto& [dtype, value] : cases) {
    const std::string name = std::string("w.wrap.") + DTypeName(dtype);
    Buffer x(dtype, {100});
    x.Fill(static_cast<double>(value));
    ASSERT_TRUE(win_create(x.view(), name, /*zero_init=*/true).ok());
    ASSERT_TRUE(win_accumulate(x.view(), name).ok());
    ASSERT_TRUE(win_accumulate(x.view(), name).ok());
    ASSERT_TRUE(barrier().ok());
    // x + every in-neighbor's buffer, which holds two accumulates of `value`.
    ASSERT_TRUE(win_update_then_collect(name).ok());
    const uint64_t k = load_topology().in_neighbors(rank()).size();
    const double want = testing::WrappedProduct(dtype, value, 1 + 2 * k);
    for (int i = 0; i < 100; ++i) {
      ASSERT_EQ(x.Get(i), want) << DTypeName(dtype) << " element " << i;
    }
    ASSERT_TRUE(win_free(name).ok());
  }
}

TEST_F(Windows, GetReadsTheSourcesTensors) {
  ASSERT_TRUE(set_topology(*RingGraph(size())).ok());
  Buffer x(DType::kFloat32, {3});
  for (int i = 0; i < 3; ++i) x.Set(i, Value(rank(), i));
  ASSERT_TRUE(win_create(x.view(), "w.get", /*zero_init=*/true).ok());
  const std::vector<int> in = load_topology().in_neighbors(rank());
  ASSERT_TRUE(barrier().ok());
  WinGetOptions get;
  get.src_weights.emplace();
  for (int j : in) (*get.src_weights)[j] = 2.0;
  ASSERT_TRUE(win_get("w.get", get).ok());
  ASSERT_TRUE(barrier().ok());  // nobody changes x before every get is done
  WinUpdateOptions update;
  update.self_weight = 0.0;
  update.neighbor_weights.emplace();
  for (int j : in) (*update.neighbor_weights)[j] = 0.25;
  ASSERT_TRUE(win_update("w.get", update).ok());
  for (int i = 0; i < 3; ++i) {
    double expected = 0;
    for (int j : in) expected += 0.25 * 2.0 * Value(j, i);
    EXPECT_FLOAT_EQ(x.Get(i), expected);
  }
}

TEST_F(Windows, NonblockingPutAndGet) {
  Buffer x(DType::kFloat64, {2});
  x.Fill(rank() + 1);
  ASSERT_TRUE(win_create(x.view(), "w.nb").ok());
  auto h = win_put_nonblocking(x.view(), "w.nb");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(wait(*h).ok());
  EXPECT_TRUE(poll(*h));
  auto g = win_get_nonblocking("w.nb");
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(wait(*g).ok());
  // x must outlive the window: other ranks may still be reading it (AddressSanitizer saw a
  // neighbor's get read x after this rank's test had freed it). win_free waits for them.
  ASSERT_TRUE(win_free("w.nb").ok());
}

// Ranks accumulate into rank 0 while rank 0 collects, all under its mutex: nothing lost.
TEST_F(Windows, ConcurrentAccumulatesUnderTheMutexLoseNothing) {
  if (size() < 2) GTEST_SKIP();
  ASSERT_TRUE(set_topology(*FullyConnectedGraph(size())).ok());
  Buffer x(DType::kInt64, {1});
  x.Fill(0);
  ASSERT_TRUE(win_create(x.view(), "w.mutex", /*zero_init=*/true).ok());
  constexpr int kRounds = 40;
  if (rank() == 0) {
    for (int i = 0; i < kRounds; ++i) ASSERT_TRUE(win_update_then_collect("w.mutex", true).ok());
  } else {
    Buffer one(DType::kInt64, {1});
    one.Fill(1);
    WinPutOptions put;
    put.dst_weights = std::map<int, double>{{0, 1.0}};
    put.require_mutex = true;
    for (int i = 0; i < kRounds; ++i) ASSERT_TRUE(win_accumulate(one.view(), "w.mutex", put).ok());
  }
  ASSERT_TRUE(barrier().ok());
  if (rank() == 0) {
    ASSERT_TRUE(win_update_then_collect("w.mutex").ok());
    EXPECT_EQ(x.Get(0), static_cast<double>(kRounds * (size() - 1)));
  }
}

TEST_F(Windows, AMutexHeldElsewhereHoldsBackAGuardedPut) {
  if (size() < 3) GTEST_SKIP();
  ASSERT_TRUE(set_topology(*FullyConnectedGraph(size())).ok());
  Buffer x(DType::kFloat32, {1});
  x.Fill(rank());
  ASSERT_TRUE(win_create(x.view(), "w.hold").ok());
  if (rank() == 1) {
    ASSERT_TRUE(win_mutex_acquire("w.hold", {0}).ok());
  }
  ASSERT_TRUE(barrier().ok());
  StatusOr<Handle> h = Handle();
  if (rank() == 2) {
    WinPutOptions put;
    put.dst_weights = std::map<int, double>{{0, 1.0}};
    put.require_mutex = true;
    h = win_put_nonblocking(x.view(), "w.hold", put);
    ASSERT_TRUE(h.ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_FALSE(poll(*h)) << "the put ran while rank 1 held rank 0's mutex";
  }
  ASSERT_TRUE(barrier().ok());
  if (rank() == 1) {
    ASSERT_TRUE(win_mutex_release("w.hold", {0}).ok());
  }
  if (rank() == 2) {
    EXPECT_TRUE(wait(*h).ok());
  }
  ASSERT_TRUE(barrier().ok());
  auto versions = win_version("w.hold");
  if (rank() == 0) {
    EXPECT_EQ((*versions)[2], 1);
  }
}

TEST_F(Windows, ErrorsAreClearAndChangeNothing) {
  Buffer x(DType::kFloat32, {4});
  x.Fill(1);
  Status st = win_put(x.view(), "w.none");
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_TRUE(Contains(st, "no window named 'w.none'")) << st;
  st = win_free("w.none");  // every rank calls it: every rank fails, nobody waits
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;

  ASSERT_TRUE(win_create(x.view(), "w.err").ok());
  EXPECT_EQ(win_create(x.view(), "w.err").code(), absl::StatusCode::kInvalidArgument);
  Buffer wrong(DType::kFloat32, {5});
  st = win_put(wrong.view(), "w.err");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(Contains(st, "the window holds float32[4]")) << st;
  Buffer other(DType::kFloat64, {4});
  EXPECT_EQ(win_accumulate(other.view(), "w.err").code(), absl::StatusCode::kInvalidArgument);

  // A destination that is not an out-neighbor (the exponential graph leaves some out).
  const Topology topo = load_topology();
  for (int d = 0; d < size(); ++d) {
    if (d == rank() || topo.has_edge(rank(), d)) continue;
    WinPutOptions put;
    put.dst_weights = std::map<int, double>{{d, 1.0}};
    st = win_put(x.view(), "w.err", put);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_TRUE(Contains(st, "not an out-neighbor")) << st;
    break;
  }
  WinUpdateOptions half;
  half.self_weight = 0.5;
  EXPECT_EQ(win_update("w.err", half).code(), absl::StatusCode::kInvalidArgument);

  st = set_topology(*RingGraph(size()));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_TRUE(Contains(st, "windows exist (w.err)")) << st;
  EXPECT_TRUE(IsEquivalent(load_topology(), *ExponentialGraph(size())));
  EXPECT_EQ(x.Get(0), 1.0);  // nothing was written by the refused calls
  ASSERT_TRUE(win_free("w.err").ok());
  EXPECT_TRUE(set_topology(*RingGraph(size())).ok());  // allowed again
}

TEST_F(Windows, ShapeMismatchAtCreateFailsOnEveryRank) {
  if (size() < 2) GTEST_SKIP();
  Buffer x(DType::kFloat32, {rank() == 0 ? 3 : 4});
  Status st = win_create(x.view(), "w.shape");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(Contains(st, "shape differs across ranks")) << st;
  EXPECT_TRUE(win_names().empty());
}

}  // namespace
}  // namespace weft
