#include "pipe/plan/plan.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "core/codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace weft {
namespace pipe {
namespace {

using ::testing::HasSubstr;

PlanOptions Options(int machines, int devices, int k0, double lambda) {
  PlanOptions options;
  options.cluster.machines = machines;
  options.cluster.devices_per_machine = devices;
  options.k0 = k0;
  options.lambda = lambda;
  return options;
}

// Plans for a freezing sequence, each made from the one before (the first is the initial
// plan).
std::vector<Plan> Progress(const std::vector<double>& sizes, const PlanOptions& options,
                           const std::vector<int>& frozen_sequence) {
  std::vector<Plan> plans;
  for (int frozen : frozen_sequence) {
    StatusOr<Plan> plan = MakePlan(sizes, frozen, options, plans.empty() ? nullptr : &plans.back());
    EXPECT_TRUE(plan.ok()) << "frozen " << frozen << ": " << plan.status();
    if (!plan.ok()) break;
    plans.push_back(*plan);
  }
  return plans;
}

std::vector<int> Ks(const std::vector<Plan>& plans) {
  std::vector<int> ks;
  for (const Plan& p : plans) ks.push_back(p.k);
  return ks;
}

void ExpectPartition(const Plan& plan, const std::vector<int>& boundaries,
                     const std::vector<double>& stage_costs) {
  EXPECT_EQ(plan.partition.boundaries, boundaries) << "F = " << plan.frozen << ", K = " << plan.k;
  ASSERT_EQ(plan.partition.stage_costs.size(), stage_costs.size());
  for (size_t s = 0; s < stage_costs.size(); ++s) {
    EXPECT_NEAR(plan.partition.stage_costs[s], stage_costs[s], 1e-9) << "stage " << s;
  }
}

// ---- InitialM0 and the compression rule ---------------------------------------------------

TEST(InitialM0Test, LargestStageOfTheInitialPartition) {
  EXPECT_DOUBLE_EQ(*InitialM0(std::vector<double>(12, 1.0), Options(1, 4, 4, 1.0 / 6)), 3.0);
  // [6], [6], [3 3], [2 2 1 1].
  EXPECT_DOUBLE_EQ(*InitialM0({6, 6, 3, 3, 2, 2, 1, 1}, Options(1, 4, 4, 1.0 / 6)), 6.0);
  EXPECT_DOUBLE_EQ(*InitialM0({6, 6, 3, 3, 2, 2, 1, 1}, Options(1, 4, 1, 1.0 / 6)), 24.0);
  // All trainable: lambda plays no part.
  EXPECT_DOUBLE_EQ(*InitialM0(std::vector<double>(16, 1.0), Options(1, 8, 8, 0.0)), 2.0);
}

// 12 equal layers, k0 = 4 (M0 = 3), lambda = 1/6, frozen following the alpha = 1/3 schedule
// bound (F_T = 0, 4, 7, 9, 10, 11). On 2 stages the trainable layers fit M0 once
// F/6 + (12 - F) splits into two halves <= 3; on 1 stage once it is <= 3 in all.
TEST(MakePlanTest, EqualLayersLambdaOneSixth) {
  const std::vector<double> sizes(12, 1.0);
  std::vector<Plan> plans = Progress(sizes, Options(1, 4, 4, 1.0 / 6), {0, 4, 7, 9, 10, 11});
  ASSERT_EQ(plans.size(), 6u);
  // F = 4: 4/6 + 8 = 8.67 > 6: no halving. F = 7: 7/6 + 5 = 6.17 > 6: still none. F = 9:
  // [1.5 + 1 | 2] = 2.5 <= 3: K = 2; 1.5 + 3 = 4.5 > 3. F = 10: 5/3 + 2 > 3: stays. F = 11:
  // 11/6 + 1 = 2.83 <= 3: K = 1.
  EXPECT_EQ(Ks(plans), (std::vector<int>{4, 4, 4, 2, 2, 1}));
  for (const Plan& p : plans) EXPECT_DOUBLE_EQ(p.m0, 3.0);
  ExpectPartition(plans[0], {0, 3, 6, 9, 12}, {3, 3, 3, 3});
  ExpectPartition(plans[1], {0, 6, 8, 10, 12}, {4.0 / 6 + 2, 2, 2, 2});
  // The lexicographically smallest optimal boundaries leave the first stage light.
  ExpectPartition(plans[2], {0, 1, 8, 10, 12}, {1.0 / 6, 2, 2, 2});
  ExpectPartition(plans[3], {0, 10, 12}, {2.5, 2});
  ExpectPartition(plans[4], {0, 10, 12}, {10.0 / 6 + 0, 2});
  ExpectPartition(plans[5], {0, 12}, {11.0 / 6 + 1});
  EXPECT_EQ(plans[3].replicas, 2);
  EXPECT_EQ(plans[5].replicas, 4);
}

// F = 8: the two halves are 8/6 + 1 and exactly 3 = M0, a tie in real arithmetic: it fits.
TEST(MakePlanTest, StageEqualToM0Fits) {
  const std::vector<double> sizes(12, 1.0);
  std::vector<Plan> plans = Progress(sizes, Options(1, 4, 4, 1.0 / 6), {0, 8});
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans[1].k, 2);
  ExpectPartition(plans[1], {0, 9, 12}, {8.0 / 6 + 1, 3});
}

// lambda = 0: frozen layers cost nothing, so only the 12 - F trainable layers count.
TEST(MakePlanTest, EqualLayersLambdaZero) {
  const std::vector<double> sizes(12, 1.0);
  std::vector<Plan> plans = Progress(sizes, Options(1, 4, 4, 0.0), {0, 4, 7, 9, 10, 11});
  ASSERT_EQ(plans.size(), 6u);
  // F = 4: 8 trainable, 4 + 4 > 3. F = 7: 5 trainable, 2 | 3 fits: K = 2. F = 9: 3 fit one
  // stage: K = 1.
  EXPECT_EQ(Ks(plans), (std::vector<int>{4, 4, 2, 1, 1, 1}));
  ExpectPartition(plans[1], {0, 6, 8, 10, 12}, {2, 2, 2, 2});
  ExpectPartition(plans[2], {0, 9, 12}, {2, 3});
  ExpectPartition(plans[3], {0, 12}, {3});
  ExpectPartition(plans[5], {0, 12}, {1});
}

// Uneven sizes (24 parameters): M0 = 6 on 4 stages: [6] [6] [3 3] [2 2 1 1].
TEST(MakePlanTest, UnevenSizes) {
  const std::vector<double> sizes = {6, 6, 3, 3, 2, 2, 1, 1};
  {
    // lambda = 1/6. F = 2: costs 1 1 3 3 2 2 1 1 (14 > 2 * 6): K = 4. F = 4: costs
    // 1 1 .5 .5 2 2 1 1 = 9, [1 1 .5 .5 2 | 2 1 1] = 5 | 4: K = 2; 9 > 6. F = 6: 17/3 <= 6:
    // K = 1.
    std::vector<Plan> plans = Progress(sizes, Options(1, 4, 4, 1.0 / 6), {0, 2, 4, 6});
    ASSERT_EQ(plans.size(), 4u);
    EXPECT_EQ(Ks(plans), (std::vector<int>{4, 4, 2, 1}));
    ExpectPartition(plans[0], {0, 1, 2, 4, 8}, {6, 6, 6, 6});
    ExpectPartition(plans[1], {0, 1, 3, 5, 8}, {1, 4, 5, 4});
    ExpectPartition(plans[2], {0, 5, 8}, {5, 4});
    ExpectPartition(plans[3], {0, 8}, {17.0 / 3});
  }
  {
    // lambda = 0. F = 2: 3 3 2 2 1 1 = 12 = [3 3 | 2 2 1 1] = 6 | 6, both exactly M0: K = 2.
    // F = 4: 2 2 1 1 = 6 = M0: K = 1.
    std::vector<Plan> plans = Progress(sizes, Options(1, 4, 4, 0.0), {0, 2, 4, 6});
    ASSERT_EQ(plans.size(), 4u);
    EXPECT_EQ(Ks(plans), (std::vector<int>{4, 2, 1, 1}));
    ExpectPartition(plans[1], {0, 4, 8}, {6, 6});
    ExpectPartition(plans[2], {0, 8}, {6});
  }
}

// Several halvings in one transition: F 0 -> 6 takes K from 4 straight to 1.
TEST(MakePlanTest, HalvesRepeatedlyInOneTransition) {
  std::vector<Plan> plans = Progress({6, 6, 3, 3, 2, 2, 1, 1}, Options(2, 4, 4, 1.0 / 6), {0, 6});
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans[1].k, 1);
  EXPECT_EQ(plans[1].replicas, 8);
  EXPECT_EQ(plans[1].newly_active, (std::vector<int>{2, 3, 4, 5, 6, 7}));
}

TEST(MakePlanTest, InitialPlanKeepsK0EvenWithFrozenLayers) {
  StatusOr<Plan> plan = MakePlan(std::vector<double>(12, 1.0), 11, Options(1, 4, 4, 1.0 / 6));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->k, 4);
  EXPECT_EQ(plan->frozen, 11);
  EXPECT_TRUE(plan->newly_active.empty());
}

TEST(MakePlanTest, NeverGrowsAndStaysWithoutNewFreezing) {
  const std::vector<double> sizes(12, 1.0);
  const PlanOptions options = Options(1, 4, 4, 1.0 / 6);
  std::vector<Plan> plans = Progress(sizes, options, {0, 9, 9, 11, 11, 12});
  ASSERT_EQ(plans.size(), 6u);
  EXPECT_EQ(Ks(plans), (std::vector<int>{4, 2, 2, 1, 1, 1}));
  // A plan with the same K has no new ranks.
  EXPECT_TRUE(plans[2].newly_active.empty());
  EXPECT_TRUE(plans[4].newly_active.empty());
  EXPECT_TRUE(plans[5].newly_active.empty());
}

// Odd lengths halve with integer division: 6 -> 3 -> 1.
TEST(MakePlanTest, OddLengthsHalveDown) {
  std::vector<Plan> plans = Progress(std::vector<double>(6, 1.0), Options(1, 6, 6, 0.0), {0, 3, 5});
  ASSERT_EQ(plans.size(), 3u);
  EXPECT_EQ(Ks(plans), (std::vector<int>{6, 3, 1}));
  EXPECT_EQ(plans[1].replicas, 2);
  EXPECT_EQ(plans[1].newly_active, (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(plans[2].replicas, 6);
  EXPECT_EQ(plans[2].newly_active, (std::vector<int>{2, 3, 4, 5}));
}

// The strategy decides the balanced partition, hence K: with equal layer counts per stage
// (kEven) F = 7, lambda = 0 puts 5 trainable layers on the second half (> M0 = 3).
TEST(MakePlanTest, StrategyDecidesTheHalving) {
  PlanOptions options = Options(1, 4, 4, 0.0);
  options.strategy = Strategy::kEven;
  std::vector<Plan> plans = Progress(std::vector<double>(12, 1.0), options, {0, 7, 9});
  ASSERT_EQ(plans.size(), 3u);
  EXPECT_EQ(Ks(plans), (std::vector<int>{4, 4, 1}));
}

TEST(MakePlanTest, MicroBatches) {
  const std::vector<double> sizes(12, 1.0);
  PlanOptions options = Options(1, 4, 4, 1.0 / 6);
  std::vector<Plan> plans = Progress(sizes, options, {0, 9, 11});
  ASSERT_EQ(plans.size(), 3u);
  EXPECT_EQ(plans[0].micro_batches, 16);
  EXPECT_EQ(plans[1].micro_batches, 8);
  EXPECT_EQ(plans[2].micro_batches, 4);
  options.micro_batches = 6;
  EXPECT_EQ(MakePlan(sizes, 0, options)->micro_batches, 6);
}

// ---- replica placement, roles and newly active ranks ---------------------------------------

// 16 equal layers, k0 = 8 (M0 = 2), lambda = 0: F = 8, 12, 14 leave 8, 4, 2 trainable
// layers, which take K from 8 to 4, 2 and 1, one halving at a time.
std::vector<Plan> EightFourTwoOne(int machines, int devices) {
  std::vector<Plan> plans =
      Progress(std::vector<double>(16, 1.0), Options(machines, devices, 8, 0.0), {0, 8, 12, 14});
  EXPECT_EQ(Ks(plans), (std::vector<int>{8, 4, 2, 1}));
  return plans;
}

// Roles as (replica, stage) per rank; {-1, -1} idle.
using RoleTable = std::vector<std::pair<int, int>>;
RoleTable Roles(const Plan& plan) {
  RoleTable table;
  for (const Role& r : plan.roles) table.emplace_back(r.replica, r.stage);
  return table;
}

TEST(PlacementTest, OneMachineOfEight) {
  std::vector<Plan> plans = EightFourTwoOne(1, 8);
  ASSERT_EQ(plans.size(), 4u);
  EXPECT_EQ(Roles(plans[0]),
            (RoleTable{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}, {0, 5}, {0, 6}, {0, 7}}));
  EXPECT_EQ(plans[0].replicas, 1);
  EXPECT_TRUE(plans[0].newly_active.empty());

  EXPECT_EQ(Roles(plans[1]),
            (RoleTable{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {1, 0}, {1, 1}, {1, 2}, {1, 3}}));
  EXPECT_EQ(plans[1].replicas, 2);
  EXPECT_EQ(plans[1].newly_active, (std::vector<int>{4, 5, 6, 7}));

  EXPECT_EQ(Roles(plans[2]),
            (RoleTable{{0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 0}, {2, 1}, {3, 0}, {3, 1}}));
  EXPECT_EQ(plans[2].replicas, 4);
  // Replicas 2 and 3 are new; ranks 2, 3 move to replica 1, which existed.
  EXPECT_EQ(plans[2].newly_active, (std::vector<int>{4, 5, 6, 7}));

  EXPECT_EQ(Roles(plans[3]),
            (RoleTable{{0, 0}, {1, 0}, {2, 0}, {3, 0}, {4, 0}, {5, 0}, {6, 0}, {7, 0}}));
  EXPECT_EQ(plans[3].replicas, 8);
  EXPECT_EQ(plans[3].newly_active, (std::vector<int>{4, 5, 6, 7}));
}

TEST(PlacementTest, OneMachineOfFour) {
  // K0 = 8 does not fit 4 devices.
  StatusOr<Plan> too_long = MakePlan(std::vector<double>(16, 1.0), 0, Options(1, 4, 8, 0.0));
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  // k0 = 4 (M0 = 4): F = 8 leaves 8 trainable, 4 | 4: K = 2; F = 12 leaves 4: K = 1.
  std::vector<Plan> plans =
      Progress(std::vector<double>(16, 1.0), Options(1, 4, 4, 0.0), {0, 8, 12});
  ASSERT_EQ(plans.size(), 3u);
  EXPECT_EQ(Ks(plans), (std::vector<int>{4, 2, 1}));
  EXPECT_EQ(Roles(plans[0]), (RoleTable{{0, 0}, {0, 1}, {0, 2}, {0, 3}}));
  EXPECT_EQ(Roles(plans[1]), (RoleTable{{0, 0}, {0, 1}, {1, 0}, {1, 1}}));
  EXPECT_EQ(plans[1].newly_active, (std::vector<int>{2, 3}));
  EXPECT_EQ(Roles(plans[2]), (RoleTable{{0, 0}, {1, 0}, {2, 0}, {3, 0}}));
  EXPECT_EQ(plans[2].newly_active, (std::vector<int>{2, 3}));
}

TEST(PlacementTest, TwoMachinesOfFour) {
  std::vector<Plan> plans = EightFourTwoOne(2, 4);
  ASSERT_EQ(plans.size(), 4u);
  // K = 8 > 4 devices: no replica fits in a machine; all 8 devices are leftovers, one
  // replica straddling both machines.
  EXPECT_EQ(Roles(plans[0]),
            (RoleTable{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}, {0, 5}, {0, 6}, {0, 7}}));
  EXPECT_EQ(plans[0].replicas, 1);
  // K = 4: one replica per machine.
  EXPECT_EQ(Roles(plans[1]),
            (RoleTable{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {1, 0}, {1, 1}, {1, 2}, {1, 3}}));
  EXPECT_EQ(plans[1].newly_active, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(Roles(plans[2]),
            (RoleTable{{0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 0}, {2, 1}, {3, 0}, {3, 1}}));
  EXPECT_EQ(plans[2].newly_active, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(Roles(plans[3]),
            (RoleTable{{0, 0}, {1, 0}, {2, 0}, {3, 0}, {4, 0}, {5, 0}, {6, 0}, {7, 0}}));
  EXPECT_EQ(plans[3].newly_active, (std::vector<int>{4, 5, 6, 7}));
}

// Ranks dealt round-robin over the machines (mpirun --map-by node): machine 0 holds the
// even ranks. The replicas still stay inside machines, on the machines' own ranks.
TEST(PlacementTest, RanksDealtRoundRobinOverMachines) {
  PlanOptions options = Options(2, 4, 8, 0.0);
  options.cluster.ranks = {0, 2, 4, 6, 1, 3, 5, 7};
  std::vector<Plan> plans = Progress(std::vector<double>(16, 1.0), options, {0, 8, 12, 14});
  ASSERT_EQ(Ks(plans), (std::vector<int>{8, 4, 2, 1}));
  // K = 8: one replica across both machines, in device order.
  EXPECT_EQ(plans[0].ReplicaRanks(0), (std::vector<int>{0, 2, 4, 6, 1, 3, 5, 7}));
  // K = 4: one replica per machine.
  EXPECT_EQ(plans[1].ReplicaRanks(0), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(plans[1].ReplicaRanks(1), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(plans[1].newly_active, (std::vector<int>{1, 3, 5, 7}));
  // K = 2: two per machine.
  EXPECT_EQ(plans[2].ReplicaRanks(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(plans[2].ReplicaRanks(1), (std::vector<int>{4, 6}));
  EXPECT_EQ(plans[2].ReplicaRanks(2), (std::vector<int>{1, 3}));
  EXPECT_EQ(plans[2].ReplicaRanks(3), (std::vector<int>{5, 7}));
}

TEST(PlacementTest, TwoMachinesOfEight) {
  std::vector<Plan> plans = EightFourTwoOne(2, 8);
  ASSERT_EQ(plans.size(), 4u);
  EXPECT_EQ(Roles(plans[0]), (RoleTable{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}, {0, 5}, {0, 6},
                                        {0, 7}, {1, 0}, {1, 1}, {1, 2}, {1, 3}, {1, 4}, {1, 5},
                                        {1, 6}, {1, 7}}));
  EXPECT_EQ(plans[0].replicas, 2);
  EXPECT_TRUE(plans[0].newly_active.empty());

  EXPECT_EQ(Roles(plans[1]), (RoleTable{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {1, 0}, {1, 1}, {1, 2},
                                        {1, 3}, {2, 0}, {2, 1}, {2, 2}, {2, 3}, {3, 0}, {3, 1},
                                        {3, 2}, {3, 3}}));
  EXPECT_EQ(plans[1].replicas, 4);
  // Machine 1's ranks move from replica 1 to the new replicas 2 and 3.
  EXPECT_EQ(plans[1].newly_active,
            (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));

  EXPECT_EQ(Roles(plans[2]), (RoleTable{{0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 0}, {2, 1}, {3, 0},
                                        {3, 1}, {4, 0}, {4, 1}, {5, 0}, {5, 1}, {6, 0}, {6, 1},
                                        {7, 0}, {7, 1}}));
  EXPECT_EQ(plans[2].replicas, 8);
  EXPECT_EQ(plans[2].newly_active, (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));

  RoleTable k1;
  for (int r = 0; r < 16; ++r) k1.emplace_back(r, 0);
  EXPECT_EQ(Roles(plans[3]), k1);
  EXPECT_EQ(plans[3].replicas, 16);
  EXPECT_EQ(plans[3].newly_active, (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
}

// 2 machines of 6 devices: with K = 4 each machine holds one replica (ranks 0-3, 6-9) and
// only the leftovers 4, 5 | 10, 11 form a replica across machines.
TEST(PlacementTest, LeftoverDevicesStraddle) {
  std::vector<Plan> plans = EightFourTwoOne(2, 6);
  ASSERT_EQ(plans.size(), 4u);
  // K = 8: ranks 0-7 straddle (6 on machine 0, 2 on machine 1); 8-11 idle.
  EXPECT_EQ(Roles(plans[0]), (RoleTable{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}, {0, 5}, {0, 6},
                                        {0, 7}, {-1, -1}, {-1, -1}, {-1, -1}, {-1, -1}}));
  EXPECT_EQ(plans[0].replicas, 1);

  EXPECT_EQ(Roles(plans[1]), (RoleTable{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {2, 0}, {2, 1}, {1, 0},
                                        {1, 1}, {1, 2}, {1, 3}, {2, 2}, {2, 3}}));
  EXPECT_EQ(plans[1].replicas, 3);
  EXPECT_EQ(plans[1].ReplicaRanks(0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(plans[1].ReplicaRanks(1), (std::vector<int>{6, 7, 8, 9}));
  EXPECT_EQ(plans[1].ReplicaRanks(2), (std::vector<int>{4, 5, 10, 11}));
  // 4-7 move to new replicas; 8-11 were idle.
  EXPECT_EQ(plans[1].newly_active, (std::vector<int>{4, 5, 6, 7, 8, 9, 10, 11}));

  // K = 2: three replicas inside each machine, none straddles.
  EXPECT_EQ(Roles(plans[2]), (RoleTable{{0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 0}, {2, 1}, {3, 0},
                                        {3, 1}, {4, 0}, {4, 1}, {5, 0}, {5, 1}}));
  EXPECT_EQ(plans[2].newly_active, (std::vector<int>{6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(plans[3].replicas, 12);
  EXPECT_EQ(plans[3].newly_active, (std::vector<int>{6, 7, 8, 9, 10, 11}));
}

// 2 machines of 5 devices, K = 4: ranks 0-3 and 5-8 form replicas, the 2 leftovers (4, 9)
// are fewer than K and stay idle.
TEST(PlacementTest, TooFewLeftoversStayIdle) {
  StatusOr<Plan> plan = MakePlan(std::vector<double>(8, 1.0), 0, Options(2, 5, 4, 1.0 / 6));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(Roles(*plan), (RoleTable{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {-1, -1}, {1, 0}, {1, 1},
                                     {1, 2}, {1, 3}, {-1, -1}}));
  EXPECT_EQ(plan->replicas, 2);
  EXPECT_FALSE(plan->roles[4].active());
  EXPECT_TRUE(plan->roles[5].active());
}

TEST(PlacementTest, ReplicaRanksOutOfRangeIsEmpty) {
  StatusOr<Plan> plan = MakePlan(std::vector<double>(8, 1.0), 0, Options(1, 8, 4, 1.0 / 6));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ReplicaRanks(1), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_TRUE(plan->ReplicaRanks(2).empty());
  EXPECT_TRUE(plan->ReplicaRanks(-1).empty());
}

// ---- bad input ---------------------------------------------------------------------------

void ExpectInvalid(const StatusOr<Plan>& plan, const std::string& fragment) {
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr(fragment));
}

TEST(MakePlanTest, RejectsBadInput) {
  const std::vector<double> sizes(12, 1.0);
  ExpectInvalid(MakePlan(sizes, 0, Options(1, 8, 0, 0.0)), "k0 in [1, 8]");
  ExpectInvalid(MakePlan(sizes, 0, Options(1, 8, 9, 0.0)), "found 9");
  ExpectInvalid(MakePlan(std::vector<double>(4, 1.0), 0, Options(1, 8, 8, 0.0)),
                "at most as many stages as layers");
  ExpectInvalid(MakePlan({}, 0, Options(1, 8, 1, 0.0)), "at least one layer");
  ExpectInvalid(MakePlan(sizes, -1, Options(1, 8, 4, 0.0)), "frozen layer count in [0, 12]");
  ExpectInvalid(MakePlan(sizes, 13, Options(1, 8, 4, 0.0)), "frozen layer count in [0, 12]");
  std::vector<double> negative = sizes;
  negative[5] = -1;
  ExpectInvalid(MakePlan(negative, 0, Options(1, 8, 4, 0.0)), "sizes[5] = -1");
  std::vector<double> nan = sizes;
  nan[2] = std::numeric_limits<double>::quiet_NaN();
  ExpectInvalid(MakePlan(nan, 0, Options(1, 8, 4, 0.0)), "sizes[2]");
  ExpectInvalid(MakePlan(sizes, 0, Options(0, 8, 4, 0.0)), "at least 1 machine");
  PlanOptions negative_micro = Options(1, 8, 4, 0.0);
  negative_micro.micro_batches = -1;
  ExpectInvalid(MakePlan(sizes, 0, negative_micro), "micro_batches");
  StatusOr<Plan> bad_lambda = MakePlan(sizes, 2, Options(1, 8, 4, 2.0));
  EXPECT_EQ(bad_lambda.status().code(), absl::StatusCode::kInvalidArgument);

  StatusOr<double> m0 = InitialM0(sizes, Options(1, 8, 0, 0.0));
  EXPECT_EQ(m0.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MakePlanTest, RejectsAnIncompatiblePreviousPlan) {
  const std::vector<double> sizes(12, 1.0);
  const PlanOptions options = Options(1, 8, 4, 0.0);
  StatusOr<Plan> first = MakePlan(sizes, 6, options);
  ASSERT_TRUE(first.ok()) << first.status();
  // Another world.
  ExpectInvalid(MakePlan(sizes, 6, Options(2, 8, 4, 0.0), &*first), "world of 16");
  // Frozen decreasing.
  ExpectInvalid(MakePlan(sizes, 5, options, &*first), "never to decrease");
  // Another model (its M0 differs).
  ExpectInvalid(MakePlan(std::vector<double>(12, 2.0), 6, options, &*first), "M0");
  // A K longer than k0.
  ExpectInvalid(MakePlan(sizes, 6, Options(1, 8, 2, 0.0), &*first), "previous plan's K");
  // Another layer count with the same M0 (3 of 12 or of 11 unit layers on 4 stages).
  ExpectInvalid(MakePlan(std::vector<double>(11, 1.0), 6, options, &*first), "found one of 12");
}

TEST(PlacementTest, RanksMustBeAPermutation) {
  const std::vector<double> sizes(8, 1.0);
  PlanOptions options = Options(2, 2, 2, 0.0);
  options.cluster.ranks = {0, 1, 2};
  ExpectInvalid(MakePlan(sizes, 0, options), "one rank per device (4), found 3");
  options.cluster.ranks = {0, 1, 1, 3};
  ExpectInvalid(MakePlan(sizes, 0, options), "found rank 1 twice");
  options.cluster.ranks = {0, 1, 2, 4};
  ExpectInvalid(MakePlan(sizes, 0, options), "permutation of 0..3, found rank 4");
}

// ---- the control message ----------------------------------------------------------------

TransitionMessage Sample() {
  TransitionMessage m;
  m.freeze_point = 3;
  m.frozen = 4;
  m.k = 2;
  m.m0 = 3.0;
  m.newly_active = {4, 5};
  m.grad_norms = {0.5};
  return m;
}

void ExpectSame(const TransitionMessage& a, const TransitionMessage& b) {
  EXPECT_EQ(a.freeze_point, b.freeze_point);
  EXPECT_EQ(a.frozen, b.frozen);
  EXPECT_EQ(a.k, b.k);
  EXPECT_EQ(std::memcmp(&a.m0, &b.m0, sizeof(double)), 0) << a.m0 << " vs " << b.m0;
  EXPECT_EQ(a.newly_active, b.newly_active);
  ASSERT_EQ(a.grad_norms.size(), b.grad_norms.size());
  // Bit for bit (memcmp on empty vectors would pass null pointers).
  for (size_t i = 0; i < a.grad_norms.size(); ++i) {
    EXPECT_EQ(std::memcmp(&a.grad_norms[i], &b.grad_norms[i], sizeof(double)), 0) << i;
  }
}

// The layout is a wire format: pinned byte for byte (CRC from zlib's crc32).
TEST(TransitionMessageTest, GoldenBytes) {
  const unsigned char expected[] = {
      0x57, 0x46, 0x54, 0x58,                          // "WFTX"
      0x01, 0x00, 0x00, 0x00,                          // version 1
      0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // freeze_point 3
      0x04, 0x00, 0x00, 0x00,                          // frozen 4
      0x02, 0x00, 0x00, 0x00,                          // k 2
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x40,  // m0 3.0
      0x02, 0x00, 0x00, 0x00,                          // 2 newly active ranks
      0x04, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00,  // 4, 5
      0x01, 0x00, 0x00, 0x00,                          // 1 gradient norm
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xe0, 0x3f,  // 0.5
      0xe7, 0x0c, 0x03, 0x0f,                          // CRC-32 0x0f030ce7
  };
  EXPECT_EQ(EncodeTransition(Sample()),
            std::string(reinterpret_cast<const char*>(expected), sizeof(expected)));
}

TEST(TransitionMessageTest, RoundTrips) {
  {
    StatusOr<TransitionMessage> back = DecodeTransition(EncodeTransition(Sample()));
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSame(*back, Sample());
  }
  {
    TransitionMessage empty;
    empty.k = 1;
    StatusOr<TransitionMessage> back = DecodeTransition(EncodeTransition(empty));
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSame(*back, empty);
    EXPECT_EQ(EncodeTransition(empty).size(), 44u);
  }
  {
    TransitionMessage large;
    large.freeze_point = int64_t{1} << 40;
    large.frozen = 70000;
    large.k = 64;
    large.m0 = 85054464.123456789;
    for (int i = 0; i < 4096; ++i) large.newly_active.push_back(i * 3);
    for (int i = 0; i < 100000; ++i) large.grad_norms.push_back(1.0 / (i + 1) + 1e-300);
    large.grad_norms[7] = std::numeric_limits<double>::denorm_min();
    large.grad_norms[8] = std::numeric_limits<double>::max();
    large.grad_norms[9] = 0;
    const std::string bytes = EncodeTransition(large);
    EXPECT_EQ(bytes.size(), 44u + 4 * 4096 + 8 * 100000);
    StatusOr<TransitionMessage> back = DecodeTransition(bytes);
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSame(*back, large);
  }
}

void ExpectRejected(const std::string& bytes, const std::string& fragment) {
  StatusOr<TransitionMessage> m = DecodeTransition(bytes);
  ASSERT_FALSE(m.ok()) << "accepted: " << fragment;
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()), HasSubstr(fragment));
}

// Overwrites 4 bytes at `offset` and, unless told not to, re-seals the checksum so that
// only the field itself is wrong.
std::string Patch32(std::string bytes, size_t offset, uint32_t value, bool reseal = true) {
  for (int i = 0; i < 4; ++i) bytes[offset + i] = static_cast<char>((value >> (8 * i)) & 0xFF);
  if (reseal) {
    const uint32_t crc = codec::Crc32(bytes.data(), bytes.size() - 4);
    for (int i = 0; i < 4; ++i) {
      bytes[bytes.size() - 4 + i] = static_cast<char>((crc >> (8 * i)) & 0xFF);
    }
  }
  return bytes;
}

TEST(TransitionMessageTest, RejectsMalformedInput) {
  const std::string good = EncodeTransition(Sample());
  ExpectRejected("", "magic");
  ExpectRejected("WFT", "magic");
  ExpectRejected("XFTX" + good.substr(4), "magic");
  // Version 2 (even with a valid checksum): both versions named.
  ExpectRejected(Patch32(good, 4, 2), "version 2: this build reads version 1");
  ExpectRejected(good.substr(0, 10), "truncated");
  ExpectRejected(good.substr(0, good.size() - 1), "truncated");
  ExpectRejected(good + '\0', "1 trailing byte(s)");
  std::string bad_crc = good;
  bad_crc.back() ^= 0x40;
  ExpectRejected(bad_crc, "CRC-32");
  // Counts: negative, then absurd (more entries than bytes left).
  ExpectRejected(Patch32(good, 32, 0xFFFFFFFFu), "newly_active count is -1");
  ExpectRejected(Patch32(good, 32, 1000000), "newly_active count is 1000000");
  ExpectRejected(Patch32(good, 44, 0x80000000u), "grad_norms count is -2147483648");
  ExpectRejected(Patch32(good, 44, 2), "grad_norms count is 2");
}

TEST(TransitionMessageTest, RejectsOutOfRangeValues) {
  auto encoded = [](void (*edit)(TransitionMessage*)) {
    TransitionMessage m = Sample();
    edit(&m);
    return EncodeTransition(m);
  };
  ExpectRejected(encoded([](TransitionMessage* m) { m->k = 0; }), "k >= 1");
  ExpectRejected(encoded([](TransitionMessage* m) { m->frozen = -1; }), "frozen >= 0");
  ExpectRejected(encoded([](TransitionMessage* m) { m->freeze_point = -1; }), "freeze_point");
  ExpectRejected(encoded([](TransitionMessage* m) {
                   m->m0 = std::numeric_limits<double>::quiet_NaN();
                 }),
                 "finite m0");
  ExpectRejected(encoded([](TransitionMessage* m) {
                   m->m0 = std::numeric_limits<double>::infinity();
                 }),
                 "finite m0");
  ExpectRejected(encoded([](TransitionMessage* m) { m->m0 = -1; }), "finite m0");
  ExpectRejected(encoded([](TransitionMessage* m) {
                   m->grad_norms[0] = std::numeric_limits<double>::infinity();
                 }),
                 "grad_norms[0]");
  ExpectRejected(encoded([](TransitionMessage* m) {
                   m->grad_norms[0] = std::numeric_limits<double>::quiet_NaN();
                 }),
                 "grad_norms[0]");
  ExpectRejected(encoded([](TransitionMessage* m) { m->grad_norms[0] = -0.5; }),
                 "grad_norms[0]");
  ExpectRejected(encoded([](TransitionMessage* m) { m->newly_active[1] = -3; }),
                 "newly_active[1] = -3");
}

// Every single-byte corruption of a message is rejected: a damaged magic, version or count
// breaks the layout, and one that leaves the layout valid changes a value the CRC covers.
TEST(TransitionMessageTest, EverySingleByteCorruptionIsRejected) {
  TransitionMessage m = Sample();
  m.newly_active = {8, 9, 10, 11};
  m.grad_norms = {3.5, 0.25, 1e-3, 7.0};
  const std::string good = EncodeTransition(m);
  ASSERT_TRUE(DecodeTransition(good).ok());
  for (size_t i = 0; i < good.size(); ++i) {
    for (int mask : {0x01, 0x02, 0x10, 0x80, 0xFF}) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ mask);
      StatusOr<TransitionMessage> decoded = DecodeTransition(bad);
      EXPECT_FALSE(decoded.ok()) << "byte " << i << " ^ " << mask << " accepted";
      if (!decoded.ok()) {
        EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
      }
    }
  }
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(DecodeTransition(good.substr(0, n)).ok()) << "prefix of " << n << " bytes";
  }
}

// ---- schedules ----------------------------------------------------------------------------

// "s<stage>:F<m>" / "s<stage>:B<m>" per item, space-separated per cycle.
std::vector<std::string> Cycles(const Schedule& schedule) {
  std::vector<std::string> out;
  for (const auto& cycle : schedule.cycles) {
    std::string line;
    for (const Work& w : cycle) {
      if (!line.empty()) line += ' ';
      line += "s" + std::to_string(w.stage) + (w.forward ? ":F" : ":B") +
              std::to_string(w.micro_batch);
    }
    out.push_back(line);
  }
  return out;
}

std::string Order(const std::vector<Work>& works) {
  std::string line;
  for (const Work& w : works) {
    if (!line.empty()) line += ' ';
    line += (w.forward ? "F" : "B") + std::to_string(w.micro_batch);
  }
  return line;
}

TEST(ScheduleTest, Names) {
  EXPECT_STREQ(ScheduleName(ScheduleKind::kGPipe), "gpipe");
  EXPECT_STREQ(ScheduleName(ScheduleKind::kOneFOneB), "1f1b");
}

TEST(ScheduleTest, GPipeTwoStagesTwoMicroBatches) {
  StatusOr<Schedule> s = MakeSchedule(ScheduleKind::kGPipe, 2, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Cycles(*s), (std::vector<std::string>{
                            "s0:F0",
                            "s0:F1 s1:F0",
                            "s1:F1",
                            "s1:B1",
                            "s0:B1 s1:B0",
                            "s0:B0",
                        }));
  EXPECT_DOUBLE_EQ(s->BubbleFraction(), 1.0 / 3);
}

TEST(ScheduleTest, OneFOneBTwoStagesTwoMicroBatches) {
  StatusOr<Schedule> s = MakeSchedule(ScheduleKind::kOneFOneB, 2, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Cycles(*s), (std::vector<std::string>{
                            "s0:F0",
                            "s0:F1 s1:F0",
                            "s1:B0",
                            "s0:B0 s1:F1",
                            "s1:B1",
                            "s0:B1",
                        }));
  EXPECT_DOUBLE_EQ(s->BubbleFraction(), 1.0 / 3);
}

TEST(ScheduleTest, GPipeThreeStagesTwoMicroBatches) {
  StatusOr<Schedule> s = MakeSchedule(ScheduleKind::kGPipe, 3, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Cycles(*s), (std::vector<std::string>{
                            "s0:F0",
                            "s0:F1 s1:F0",
                            "s1:F1 s2:F0",
                            "s2:F1",
                            "s2:B1",
                            "s1:B1 s2:B0",
                            "s0:B1 s1:B0",
                            "s0:B0",
                        }));
  EXPECT_DOUBLE_EQ(s->BubbleFraction(), 0.5);
}

TEST(ScheduleTest, OneFOneBThreeStagesTwoMicroBatches) {
  StatusOr<Schedule> s = MakeSchedule(ScheduleKind::kOneFOneB, 3, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  // Stage 0 would warm up with K - 1 = 2 forwards: all M = 2 of them.
  EXPECT_EQ(Cycles(*s), (std::vector<std::string>{
                            "s0:F0",
                            "s0:F1 s1:F0",
                            "s1:F1 s2:F0",
                            "s2:B0",
                            "s1:B0 s2:F1",
                            "s0:B0 s2:B1",
                            "s1:B1",
                            "s0:B1",
                        }));
  EXPECT_DOUBLE_EQ(s->BubbleFraction(), 0.5);
}

TEST(ScheduleTest, StageOrders) {
  StatusOr<Schedule> gpipe = MakeSchedule(ScheduleKind::kGPipe, 4, 8);
  ASSERT_TRUE(gpipe.ok());
  EXPECT_EQ(Order(gpipe->StageOrder(2)), "F0 F1 F2 F3 F4 F5 F6 F7 B7 B6 B5 B4 B3 B2 B1 B0");
  StatusOr<Schedule> one = MakeSchedule(ScheduleKind::kOneFOneB, 4, 8);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(Order(one->StageOrder(0)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(Order(one->StageOrder(1)), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  EXPECT_EQ(Order(one->StageOrder(3)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  EXPECT_TRUE(one->StageOrder(4).empty());
}

TEST(ScheduleTest, SingleStageHasNoBubble) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
    StatusOr<Schedule> s = MakeSchedule(kind, 1, 3);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->cycles.size(), 6u);
    EXPECT_EQ(s->BubbleFraction(), 0.0);
  }
  EXPECT_EQ(Order(MakeSchedule(ScheduleKind::kOneFOneB, 1, 3)->StageOrder(0)),
            "F0 B0 F1 B1 F2 B2");
}

// Computed from the cycles given, not from a formula.
TEST(ScheduleTest, BubbleFractionCountsIdleSlots) {
  Schedule s;
  s.kind = ScheduleKind::kGPipe;
  s.stages = 2;
  s.micro_batches = 1;
  s.cycles = {{Work{0, 0, true}}, {Work{0, 0, false}, Work{1, 0, true}}};
  EXPECT_DOUBLE_EQ(s.BubbleFraction(), 0.25);
  s.cycles.clear();
  EXPECT_EQ(s.BubbleFraction(), 0.0);
}

TEST(ScheduleTest, RejectsBadSizes) {
  EXPECT_EQ(MakeSchedule(ScheduleKind::kGPipe, 0, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeSchedule(ScheduleKind::kOneFOneB, 2, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(MakeSchedule(ScheduleKind::kGPipe, -1, 4).status().message()),
              HasSubstr("K = -1"));
}

// Every (stage, micro-batch) runs one forward and one backward; a stage runs at most one item
// per cycle; dependencies hold; the bubble is (K - 1) / (M + K - 1); 1F1B keeps at most
// K - s micro-batches in flight on stage s.
TEST(ScheduleTest, DependenciesAndBubbleForManySizes) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
    for (int k = 1; k <= 8; ++k) {
      for (int m = 1; m <= 16; ++m) {
        SCOPED_TRACE(std::string(ScheduleName(kind)) + " K=" + std::to_string(k) +
                     " M=" + std::to_string(m));
        StatusOr<Schedule> s = MakeSchedule(kind, k, m);
        ASSERT_TRUE(s.ok()) << s.status();
        EXPECT_EQ(s->stages, k);
        EXPECT_EQ(s->micro_batches, m);
        std::map<std::tuple<int, int, bool>, int> when;
        for (size_t c = 0; c < s->cycles.size(); ++c) {
          std::vector<bool> busy(k, false);
          for (const Work& w : s->cycles[c]) {
            ASSERT_TRUE(w.stage >= 0 && w.stage < k && w.micro_batch >= 0 && w.micro_batch < m);
            EXPECT_FALSE(busy[w.stage]) << "stage " << w.stage << " twice in cycle " << c;
            busy[w.stage] = true;
            EXPECT_TRUE(when.emplace(std::make_tuple(w.stage, w.micro_batch, w.forward), c).second);
          }
        }
        ASSERT_EQ(when.size(), static_cast<size_t>(2 * k * m));
        auto cycle_of = [&when](int stage, int micro_batch, bool forward) {
          return when.at(std::make_tuple(stage, micro_batch, forward));
        };
        for (int st = 0; st < k; ++st) {
          for (int mb = 0; mb < m; ++mb) {
            const int f = cycle_of(st, mb, true);
            const int b = cycle_of(st, mb, false);
            if (st > 0) {
              EXPECT_LT(cycle_of(st - 1, mb, true), f) << "F s" << st << " m" << mb;
            }
            EXPECT_LT(f, b) << "s" << st << " m" << mb;
            if (st < k - 1) {
              EXPECT_LT(cycle_of(st + 1, mb, false), b) << "B s" << st << " m" << mb;
            }
          }
        }
        EXPECT_EQ(s->cycles.size(), static_cast<size_t>(2 * (m + k - 1)));
        EXPECT_NEAR(s->BubbleFraction(), static_cast<double>(k - 1) / (m + k - 1), 1e-12);
        if (kind == ScheduleKind::kOneFOneB) {
          for (int st = 0; st < k; ++st) {
            int in_flight = 0, most = 0;
            for (const Work& w : s->StageOrder(st)) {
              in_flight += w.forward ? 1 : -1;
              most = std::max(most, in_flight);
            }
            EXPECT_LE(most, std::min(k - st, m)) << "stage " << st;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace pipe
}  // namespace weft
