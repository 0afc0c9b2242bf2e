// hierarchical_neighbor_allreduce with machines simulated by WEFT_RANKS_PER_MACHINE=2
// (set by the BUILD rule), so machine-level exchange runs on one host.
#include "comm/comm.h"
#include "gtest/gtest.h"
#include "tests/comm/test_util.h"

namespace weft {
namespace {

const auto* const kEnv = weft::testing::InitWeftForAllTests();

// x = rank + 1; machine m holds ranks 2m and 2m + 1, so its sum is 4m + 3.
double MachineSum(int m) { return 4.0 * m + 3; }

TEST(Hierarchical, ProcessModelSeesSimulatedMachines) {
  EXPECT_EQ(local_size(), 2);
  EXPECT_EQ(local_rank(), rank() % 2);
  EXPECT_EQ(machine_size(), size() / 2);
  EXPECT_EQ(machine_rank(), rank() / 2);
}

TEST(Hierarchical, DefaultMachineGraphAverages) {
  const Topology machines = load_machine_topology();
  ASSERT_TRUE(IsEquivalent(machines, *ExponentialGraph(machine_size())));
  const int m = machine_rank();
  double expected = MachineSum(m);
  for (int j : machines.in_neighbors(m)) expected += MachineSum(j);
  expected /= machines.in_neighbors(m).size() + 1;
  expected /= local_size();
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kBFloat16}) {
    testing::Buffer x(d, {6}), y(d, {6});
    x.Fill(rank() + 1);
    ASSERT_TRUE(hierarchical_neighbor_allreduce(x.view(), y.view()).ok());
    for (int64_t i = 0; i < 6; ++i) {
      EXPECT_NEAR(y.Get(i), expected, testing::Tolerance(d, expected)) << DTypeName(d);
    }
  }
}

// On one machine (2 ranks) the neighbor machine is this one: named on both sides, it is a
// message to itself, and the formula still holds.
TEST(Hierarchical, ExplicitMachineWeightsWithDstScaling) {
  const int M = machine_size(), m = machine_rank();
  HierarchicalNeighborAllreduceOptions opts;
  opts.self_weight = 0.5;
  opts.src_machine_weights = std::map<int, double>{{(m - 1 + M) % M, 0.25}};
  opts.dst_machine_weights = std::map<int, double>{{(m + 1) % M, 2.0}};
  testing::Buffer x(DType::kFloat64, {3});
  x.Fill(rank() + 1);
  ASSERT_TRUE(hierarchical_neighbor_allreduce(x.view(), x.view(), opts, "h.w").ok());
  const double expected =
      (0.5 * MachineSum(m) + 0.25 * 2.0 * MachineSum((m - 1 + M) % M)) / local_size();
  EXPECT_DOUBLE_EQ(x.Get(0), expected);
}

TEST(Hierarchical, MismatchedMachinePatternIsAnError) {
  if (machine_size() < 3) GTEST_SKIP();
  const int M = machine_size(), m = machine_rank();
  HierarchicalNeighborAllreduceOptions opts;
  opts.self_weight = 0.5;
  opts.src_machine_weights = std::map<int, double>{{(m + 1) % M, 0.5}};  // wrong side
  opts.dst_machine_weights = std::map<int, double>{{(m + 1) % M, 1.0}};
  testing::Buffer x(DType::kFloat32, {3});
  Status st = hierarchical_neighbor_allreduce(x.view(), x.view(), opts, "h.bad");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find("machine"), std::string::npos) << st;
}

}  // namespace
}  // namespace weft
