#include "pipe/planner/cost_model.h"

#include <string>

#include "gtest/gtest.h"
#include "pipe/plan/plan.h"

namespace weft {
namespace planner {
namespace {

Model FourUnits() {
  Model m;
  m.name = m.title = "four";
  m.units = {{"a", 100, std::nullopt},
             {"b", 200, std::nullopt},
             {"c", 300, std::nullopt},
             {"d", 400, std::nullopt}};
  return m;
}

// Two stages [a b | c d], a frozen, 4 micro-batches, 2 replicas.
pipe::Plan TwoStagePlan() {
  pipe::Plan p;
  p.frozen = 1;
  p.k = 2;
  p.partition.boundaries = {0, 2, 4};
  p.partition.stage_costs = {100.0 / 6 + 200, 700};
  p.partition.max_cost = 700;
  p.micro_batches = 4;
  p.replicas = 2;
  return p;
}

CostOptions SmallNumbers() {
  CostOptions o;
  o.batch = 8;  // 2 samples per micro-batch
  o.tokens = 10;
  o.flops = 1000;     // forward of a unit per sample = 2 * params * 10 / 1000 = params / 50
  o.bandwidth = 100;  // bytes/s
  return o;
}

// Worked by hand:
//   forward per sample: a 2 s, b 4 s, c 6 s, d 8 s
//   stage 0: a frozen (forward only) 2 + b trainable 3 x 4 = 14 s per sample -> 28 s per
//            micro-batch of 2 samples
//   stage 1: 3 x (6 + 8) = 42 s per sample -> 84 s per micro-batch
//   pipeline: (M + K - 1) x max = (4 + 2 - 1) x 84 = 420 s
//   sync: 2 (R - 1) / R x 4 bytes x 700 trainable parameters (stage 1) / 100 B/s = 28 s
//   step 448 s; throughput = R x batch / step = 16 / 448 samples/s
TEST(CostModelTest, HandComputedTwoStagePlan) {
  StatusOr<Prediction> p = Predict(FourUnits(), TwoStagePlan(), SmallNumbers());
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->stages.size(), 2u);
  EXPECT_DOUBLE_EQ(p->stages[0].seconds_per_micro_batch, 28);
  EXPECT_DOUBLE_EQ(p->stages[1].seconds_per_micro_batch, 84);
  EXPECT_DOUBLE_EQ(p->stages[0].frozen_params, 100);
  EXPECT_DOUBLE_EQ(p->stages[0].trainable_params, 200);
  EXPECT_DOUBLE_EQ(p->stages[1].trainable_params, 700);
  EXPECT_EQ(p->stages[1].first, 2);
  EXPECT_EQ(p->stages[1].last, 4);
  EXPECT_DOUBLE_EQ(p->max_stage_seconds, 84);
  EXPECT_DOUBLE_EQ(p->pipeline_seconds, 420);
  EXPECT_DOUBLE_EQ(p->sync_seconds, 28);
  EXPECT_DOUBLE_EQ(p->step_seconds, 448);
  EXPECT_DOUBLE_EQ(p->throughput, 16.0 / 448);
  EXPECT_DOUBLE_EQ(p->bubble, 1.0 / 5);  // (K - 1) / (M + K - 1)
  EXPECT_EQ(p->k, 2);
  EXPECT_EQ(p->replicas, 2);
  EXPECT_EQ(p->micro_batches, 4);
}

TEST(CostModelTest, CacheMakesFrozenUnitsFree) {
  CostOptions o = SmallNumbers();
  o.cache = true;
  StatusOr<Prediction> p = Predict(FourUnits(), TwoStagePlan(), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->stages[0].seconds_per_micro_batch, 24);  // b only: 12 s x 2 samples
  EXPECT_DOUBLE_EQ(p->pipeline_seconds, 420);                  // stage 1 still the largest
}

TEST(CostModelTest, OneReplicaHasNoSync) {
  pipe::Plan plan = TwoStagePlan();
  plan.replicas = 1;
  StatusOr<Prediction> p = Predict(FourUnits(), plan, SmallNumbers());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->sync_seconds, 0);
  EXPECT_DOUBLE_EQ(p->throughput, 8.0 / 420);
}

TEST(CostModelTest, SyncGrowsWithReplicasAsARingAllreduce) {
  pipe::Plan plan = TwoStagePlan();
  plan.replicas = 4;  // 2 x 3/4 x 4 x 700 / 100 = 42 s
  StatusOr<Prediction> p = Predict(FourUnits(), plan, SmallNumbers());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->sync_seconds, 42);
}

TEST(CostModelTest, MeasuredTimesReplaceTheFlopEstimate) {
  Model m = FourUnits();
  const double times[] = {3, 6, 9, 12};  // forward + backward per sample, trainable
  for (int u = 0; u < 4; ++u) m.units[u].time = times[u];
  // stage 0: a frozen 3 / 3 = 1 + b 6 = 7 s per sample -> 14 per micro-batch;
  // stage 1: 9 + 12 = 21 -> 42; pipeline 5 x 42 = 210; sync still from parameters: 28.
  StatusOr<Prediction> p = Predict(m, TwoStagePlan(), SmallNumbers());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->stages[0].seconds_per_micro_batch, 14);
  EXPECT_DOUBLE_EQ(p->stages[1].seconds_per_micro_batch, 42);
  EXPECT_DOUBLE_EQ(p->pipeline_seconds, 210);
  EXPECT_DOUBLE_EQ(p->sync_seconds, 28);
}

TEST(CostModelTest, UnitSeconds) {
  const CostOptions o = SmallNumbers();
  const Unit u{"x", 50, std::nullopt};
  EXPECT_DOUBLE_EQ(UnitSecondsPerSample(u, /*frozen=*/false, o), 3);
  EXPECT_DOUBLE_EQ(UnitSecondsPerSample(u, /*frozen=*/true, o), 1);
  CostOptions cached = o;
  cached.cache = true;
  EXPECT_DOUBLE_EQ(UnitSecondsPerSample(u, /*frozen=*/true, cached), 0);
  EXPECT_DOUBLE_EQ(UnitSecondsPerSample(u, /*frozen=*/false, cached), 3);
}

TEST(CostModelTest, RefusesBadOptionsAndMismatchedPlans) {
  CostOptions o = SmallNumbers();
  o.batch = 0;
  StatusOr<Prediction> p = Predict(FourUnits(), TwoStagePlan(), o);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(std::string(p.status().message()).find("expected --batch > 0"), std::string::npos);
  o = SmallNumbers();
  o.bandwidth = -1;
  EXPECT_FALSE(Predict(FourUnits(), TwoStagePlan(), o).ok());
  o = SmallNumbers();
  o.tokens = 0;
  EXPECT_FALSE(Predict(FourUnits(), TwoStagePlan(), o).ok());

  Model three = FourUnits();
  three.units.pop_back();
  p = Predict(three, TwoStagePlan(), SmallNumbers());
  ASSERT_FALSE(p.ok());
  EXPECT_NE(std::string(p.status().message()).find("was the plan made for another model?"),
            std::string::npos)
      << p.status();
}

TEST(CostModelTest, AgreesWithARealPlan) {
  pipe::PlanOptions po;
  po.cluster.machines = 1;
  po.cluster.devices_per_machine = 4;
  po.k0 = 2;
  StatusOr<pipe::Plan> plan = pipe::MakePlan({100, 200, 300, 400}, 0, po);
  ASSERT_TRUE(plan.ok()) << plan.status();
  StatusOr<Prediction> p = Predict(FourUnits(), *plan, SmallNumbers());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->k, 2);
  EXPECT_EQ(p->replicas, 2);
  EXPECT_EQ(p->micro_batches, 8);  // the plan's default, 4 K
  // Optimal split of 100 200 300 400 into 2: [100 200 300 | 400]: max 600.
  EXPECT_EQ(plan->partition.boundaries, (std::vector<int>{0, 3, 4}));
  // Stage 0: 3 x 600 / 50 = 36 s per sample, 1 sample per micro-batch; pipeline 9 x 36.
  EXPECT_DOUBLE_EQ(p->pipeline_seconds, 9 * 36);
}

// The same two-stage plan on 2 machines x 2 devices: replica 0 = ranks 0, 1 (machine 0),
// replica 1 = ranks 2, 3 (machine 1). Both stages' rings span the machines, so their
// gradients share the slower link: 2 (R - 1) / R x 4 x (200 + 700) / 50 B/s = 72 s.
// Boundary hops (hidden 1, 10 tokens, 4 bytes: 40 bytes per sample, 2 per micro-batch) go
// inside a machine: 2 x 80 / 100 = 1.6 s.
pipe::Plan TwoMachines() {
  pipe::Plan p = TwoStagePlan();
  p.roles = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  return p;
}

TEST(CostModelTest, RingsAcrossMachinesShareTheSlowerLink) {
  CostOptions o = SmallNumbers();
  o.devices_per_machine = 2;
  o.inter_bandwidth = 50;
  o.hidden = 1;
  StatusOr<Prediction> p = Predict(FourUnits(), TwoMachines(), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->sync_seconds, 72);
  EXPECT_DOUBLE_EQ(p->transfer_seconds, 1.6);
  EXPECT_DOUBLE_EQ(p->pipeline_seconds, 421.6);
  EXPECT_DOUBLE_EQ(p->step_seconds, 493.6);
  // One machine of 4 devices: only the largest stage's ring counts, at the faster link.
  o.devices_per_machine = 4;
  p = Predict(FourUnits(), TwoMachines(), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->sync_seconds, 28);
}

// The cache: stage 0 skips unit a; each step reads b = 8 cached activations of 40 bytes at
// 20 B/s (16 s), and with a cold cache computes a's forward for them (8 x 2 s = 16 s).
TEST(CostModelTest, CacheChargesItsReadAndItsFill) {
  CostOptions o = SmallNumbers();
  o.cache = true;
  o.hidden = 1;
  o.cache_bandwidth = 20;
  StatusOr<Prediction> warm = Predict(FourUnits(), TwoStagePlan(), o);
  ASSERT_TRUE(warm.ok()) << warm.status();
  EXPECT_DOUBLE_EQ(warm->cache_seconds, 16);
  StatusOr<Prediction> cold = Predict(FourUnits(), TwoStagePlan(), o, 0);
  ASSERT_TRUE(cold.ok()) << cold.status();
  EXPECT_DOUBLE_EQ(cold->cache_seconds, 32);
  EXPECT_DOUBLE_EQ(cold->step_seconds - warm->step_seconds, 16);
}

// Oversubscribed: the whole step's work (2 replicas x 8 samples x (14 + 42) s) shared by
// one device's compute is 896 s, more than the pipeline's 420 s.
TEST(CostModelTest, SharedComputeBoundsTheStep) {
  CostOptions o = SmallNumbers();
  o.compute_devices = 1;
  StatusOr<Prediction> p = Predict(FourUnits(), TwoStagePlan(), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->work_seconds, 896);
  EXPECT_DOUBLE_EQ(p->step_seconds, 896 + 28);
  // A global batch of 8 over 2 replicas: 4 samples each, half the work and pipeline.
  o.global_batch = true;
  p = Predict(FourUnits(), TwoStagePlan(), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->samples_per_replica, 4);
  EXPECT_DOUBLE_EQ(p->work_seconds, 448);
  EXPECT_DOUBLE_EQ(p->throughput, 8 / (448.0 + 28));
}

// A rank that changes stage receives the units it did not hold; a newly active one all of
// its stage's (weights 4 bytes, optimizer state 4 more for trainable units).
TEST(CostModelTest, TransitionBytesCountWhatARankDidNotHold) {
  pipe::Plan before = TwoStagePlan();
  before.roles = {{0, 0}, {0, 1}, {-1, -1}, {-1, -1}};
  before.replicas = 1;
  pipe::Plan after = TwoMachines();  // replica 1 (ranks 2, 3) is new
  CostOptions o = SmallNumbers();
  // Ranks 0 and 1 keep their stages: nothing. Rank 2: a (frozen, 4 B) + b (8 B) = 400 +
  // 1600; rank 3: c and d, 8 B each = 5600.
  EXPECT_DOUBLE_EQ(TransitionBytes(FourUnits(), before, after, o), 7600);
  o.cache = true;  // the frozen unit a is not needed
  EXPECT_DOUBLE_EQ(TransitionBytes(FourUnits(), before, after, o), 7200);
}

}  // namespace
}  // namespace planner
}  // namespace weft
