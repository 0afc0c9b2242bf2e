#include "pipe/runtime/placement.h"

#include <vector>

#include "gtest/gtest.h"

namespace weft {
namespace pipe {
namespace {

// 8 equal layers on one machine of 8 devices, K0 = 4: two replicas of four stages of two
// layers each (ranks 0-3 and 4-7).
Plan TwoReplicas(int frozen) {
  PlanOptions options;
  options.cluster.machines = 1;
  options.cluster.devices_per_machine = 8;
  options.k0 = 4;
  StatusOr<Plan> plan = MakePlan(std::vector<double>(8, 1.0), frozen, options, nullptr);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

TEST(Placement, SharesSplitEvenlyWithTheRemainderFirst) {
  EXPECT_EQ(Shares(10, 3), (std::vector<int64_t>{0, 4, 7, 10}));
  EXPECT_EQ(Shares(8, 4), (std::vector<int64_t>{0, 2, 4, 6, 8}));
  EXPECT_EQ(Shares(2, 4), (std::vector<int64_t>{0, 1, 2, 2, 2}));
}

TEST(Placement, AutoDpDecidesWhichReplicasTrain) {
  const Plan p = TwoReplicas(0);
  ASSERT_EQ(p.k, 4);
  ASSERT_EQ(p.replicas, 2);
  Placement on;
  EXPECT_EQ(ActiveReplicas(p, on), 2);
  Placement off;
  off.autodp = false;
  off.initial_replicas = 1;
  EXPECT_EQ(ActiveReplicas(p, off), 1);
  // Rank 5 is stage 1 of replica 1: it trains with AutoDP, idles without.
  EXPECT_EQ(ActiveRole(p, on, 5).replica, 1);
  EXPECT_EQ(ActiveRole(p, on, 5).stage, 1);
  EXPECT_FALSE(ActiveRole(p, off, 5).active());
  EXPECT_TRUE(NeededLayers(p, off, 5).empty());
  EXPECT_EQ(StageRanks(p, on, 1), (std::vector<int>{1, 5}));
  EXPECT_EQ(StageRanks(p, off, 1), (std::vector<int>{1}));
}

TEST(Placement, StageZeroHoldsTheFrozenPrefixOnlyWithTheCache) {
  const Plan p = TwoReplicas(3);
  const std::vector<int>& b = p.partition.boundaries;
  ASSERT_LT(b[1], 3) << "the test wants a frozen prefix beyond stage 0's own layers";
  Placement plain;
  std::vector<int> own;
  for (int l = b[0]; l < b[1]; ++l) own.push_back(l);
  EXPECT_EQ(NeededLayers(p, plain, 0), own);
  Placement cached;
  cached.cache = true;
  std::vector<int> with_prefix;
  for (int l = 0; l < std::max(b[1], 3); ++l) with_prefix.push_back(l);
  EXPECT_EQ(NeededLayers(p, cached, 0), with_prefix);
  // Other stages are the same either way.
  EXPECT_EQ(NeededLayers(p, cached, 2), NeededLayers(p, plain, 2));
}

TEST(Placement, MicroBatchesAreTheOptionOrTwoKWithinTheSamples) {
  const Plan p = TwoReplicas(0);
  Placement o;
  EXPECT_EQ(MicroBatchCount(p, o, 64), 8);  // 2 K
  EXPECT_EQ(MicroBatchCount(p, o, 5), 5);   // at most the samples
  EXPECT_EQ(MicroBatchCount(p, o, 0), 1);   // at least one
  o.micro_batches = 3;
  EXPECT_EQ(MicroBatchCount(p, o, 64), 3);
}

}  // namespace
}  // namespace pipe
}  // namespace weft
