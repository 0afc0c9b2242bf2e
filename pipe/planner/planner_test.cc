#include "pipe/planner/planner.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace weft {
namespace planner {
namespace {

::testing::AssertionResult MessageHas(const Status& status, const std::string& part) {
  if (status.ok()) return ::testing::AssertionFailure() << "OK, wanted an error with: " << part;
  if (!absl::StrContains(status.message(), part)) {
    return ::testing::AssertionFailure()
           << "\"" << status.message() << "\" lacks \"" << part << "\"";
  }
  return ::testing::AssertionSuccess();
}

Model Vit() { return *MakePreset("vit-b16"); }

PlannerOptions TwoByEight() {
  PlannerOptions o;
  o.machines = 2;
  o.devices = 8;
  o.epochs = 10;
  return o;
}

TEST(PlannerTest, VitOnTwoMachinesFollowsTheFreezeScheduleAndHalvesK) {
  const PlannerOptions o = TwoByEight();
  StatusOr<PlannerResult> r = RunPlanner(Vit(), o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->epochs.size(), 10u);
  EXPECT_EQ(r->options.k0, 8);
  EXPECT_DOUBLE_EQ(r->lambda, 1.0 / 3);  // what the cost model charges a frozen unit
  EXPECT_EQ(r->options.cost.tokens, 197);
  // F_T = ceil(26 (1 - (2/3)^T)), never the last unit.
  const std::vector<int> frozen = {0, 9, 15, 19, 21, 23, 24, 25, 25, 25};
  for (int e = 0; e < 10; ++e) EXPECT_EQ(r->epochs[e].plan.frozen, frozen[e]) << "epoch " << e;
  // Epoch 0 is the static pipeline.
  EXPECT_EQ(r->epochs[0].plan.k, 8);
  EXPECT_EQ(r->epochs[0].plan.replicas, 2);
  EXPECT_DOUBLE_EQ(r->epochs[0].speedup, 1.0);
  EXPECT_TRUE(r->epochs[0].plan.newly_active.empty());
  double inverse = 0, elastic = 0;
  for (size_t e = 0; e < r->epochs.size(); ++e) {
    const EpochPlan& ep = r->epochs[e];
    // Every rank works: 16 devices, K a power of two.
    EXPECT_EQ(ep.plan.k * ep.plan.replicas, 16) << "epoch " << e;
    EXPECT_EQ(ep.plan.micro_batches, 4 * ep.plan.k);
    EXPECT_NEAR(ep.prediction.bubble, (ep.plan.k - 1.0) / (ep.plan.micro_batches + ep.plan.k - 1.0),
                1e-12);
    if (e > 0) {
      const EpochPlan& prev = r->epochs[e - 1];
      // K only shrinks, by halving; replicas double when it does, and new ranks show up.
      EXPECT_TRUE(ep.plan.k == prev.plan.k || ep.plan.k * 2 == prev.plan.k ||
                  ep.plan.k * 4 == prev.plan.k)
          << "epoch " << e;
      EXPECT_EQ(ep.plan.replicas > prev.plan.replicas, !ep.plan.newly_active.empty());
    }
    inverse += 1 / ep.speedup;
    elastic += ep.epoch_seconds + ep.transition_seconds;
    EXPECT_NEAR(ep.epoch_seconds, o.epoch_samples / ep.prediction.throughput, 1e-9);
    EXPECT_EQ(ep.transition_seconds > 0, e > 0 && (ep.plan.k != r->epochs[e - 1].plan.k ||
                                                   ep.plan.partition.boundaries !=
                                                       r->epochs[e - 1].plan.partition.boundaries))
        << e;
  }
  // Frozen units still run forward (no --cache): 25 of them at a third of their cost fill
  // more than M0 on two stages, so K stops at 4.
  EXPECT_EQ(r->epochs.back().plan.k, 4);
  EXPECT_EQ(r->epochs.back().plan.replicas, 4);
  EXPECT_GT(r->epochs.back().speedup, 2);
  // The static run's time over the elastic one's, transitions included: a little below the
  // harmonic mean of the per-epoch speedups (transitions are under a second of ~10^3 s).
  EXPECT_NEAR(r->overall_speedup, 10 * r->static_epoch_seconds / elastic, 1e-9);
  EXPECT_LT(r->overall_speedup, 10 / inverse);
  EXPECT_GT(r->overall_speedup, 10 / inverse * 0.999);
  EXPECT_GT(r->overall_speedup, 1);
}

TEST(PlannerTest, ThePapersLambdaShrinksThePipelineFurther) {
  PlannerOptions o = TwoByEight();
  o.lambda = 1.0 / 6;
  StatusOr<PlannerResult> r = RunPlanner(Vit(), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->epochs.back().plan.k, 2);
  EXPECT_EQ(r->epochs.back().plan.replicas, 8);
  // ... but the balancer then underrates the frozen prefix: the first freeze is slower.
  EXPECT_LT(r->epochs[1].speedup, 1);
}

// The cache costs its fill (the newly frozen units' forward, on stage 0 before the
// pipeline) in the epoch after a freeze point, so the first cached epoch is slower than the
// plain one; once warm it is faster, and so is the run overall.
TEST(PlannerTest, CacheIsSlowerWhileFillingAndFasterOverall) {
  PlannerOptions o = TwoByEight();
  StatusOr<PlannerResult> plain = RunPlanner(Vit(), o);
  o.cost.cache = true;
  StatusOr<PlannerResult> cached = RunPlanner(Vit(), o);
  ASSERT_TRUE(plain.ok() && cached.ok());
  EXPECT_DOUBLE_EQ(cached->epochs[0].speedup, 1);
  EXPECT_LT(cached->epochs[1].speedup, plain->epochs[1].speedup);  // cold: all 9 units
  EXPECT_GT(cached->epochs[1].prediction.cache_seconds, 0);
  // Epochs 8 and 9 freeze nothing new: no fill, only the read.
  const Prediction& warm = cached->epochs[9].prediction;
  const double read = warm.samples_per_replica * 197 * 768 * 4 / o.cost.bandwidth;
  EXPECT_NEAR(warm.cache_seconds, read, 1e-12);
  EXPECT_GT(cached->epochs[9].speedup, plain->epochs[9].speedup);
  EXPECT_GT(cached->overall_speedup, plain->overall_speedup);
}

// The ablation: the paper's order of its configurations holds (AutoDP is what turns the
// freed devices into speed; all four is the fastest), and AutoDP off keeps the static
// replicas.
TEST(PlannerTest, AblationRowsAndTheirOrder) {
  const PlannerOptions o = TwoByEight();
  StatusOr<std::vector<AblationRow>> rows = RunAblation(Vit(), o);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 6u);
  const double freeze_static = (*rows)[0].overall_speedup;
  const double autopipe_cache = (*rows)[3].overall_speedup;
  const double autopipe_dp = (*rows)[4].overall_speedup;
  const double all = (*rows)[5].overall_speedup;
  EXPECT_GT(freeze_static, 1);
  EXPECT_GT(autopipe_dp, autopipe_cache);
  EXPECT_GT(all, autopipe_dp);
  EXPECT_EQ((*rows)[5].label, "all four");
  PlannerOptions no_dp = o;
  no_dp.autodp = false;
  StatusOr<PlannerResult> r = RunPlanner(Vit(), no_dp);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const EpochPlan& e : r->epochs) {
    EXPECT_EQ(e.plan.replicas, 2);
    EXPECT_TRUE(e.plan.newly_active.empty());
  }
  EXPECT_EQ(r->epochs.back().plan.k, 4);  // AutoPipe still shortens the pipelines
  PlannerOptions frozen_split = o;
  frozen_split.autopipe = false;
  frozen_split.rebalance = false;
  r = RunPlanner(Vit(), frozen_split);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const EpochPlan& e : r->epochs) {
    EXPECT_EQ(e.plan.partition.boundaries, r->static_plan.partition.boundaries);
    EXPECT_EQ(e.plan.k, 8);
  }
  std::string text = FormatAblation(Vit(), o, *rows);
  EXPECT_NE(text.find("ABLATION autopipe=1 autodp=1 cache=1 overall_speedup="),
            std::string::npos);
}

TEST(PlannerTest, OneEpochIsTheStaticPipeline) {
  PlannerOptions o = TwoByEight();
  o.epochs = 1;
  StatusOr<PlannerResult> r = RunPlanner(Vit(), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->overall_speedup, 1);
}

TEST(PlannerTest, DefaultK0IsCappedAtTheWorldAndTheUnits) {
  StatusOr<Model> tiny = ParseLayerCsv("name,params\na,1\nb,2\nc,3\n", "tiny.csv");
  ASSERT_TRUE(tiny.ok());
  PlannerOptions o;  // 1 x 8 devices
  StatusOr<PlannerResult> r = RunPlanner(*tiny, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->options.k0, 3);
  EXPECT_EQ(r->options.cost.tokens, kDefaultFileTokens);
  o.devices = 2;
  r = RunPlanner(*tiny, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->options.k0, 2);
}

TEST(PlannerTest, MeasuredTimesAreBalancedWithAThirdForFrozenUnits) {
  StatusOr<Model> m = ParseLayerCsv("name,params,time\na,1,1\nb,1,1\nc,1,1\nd,1,1\n", "t.csv");
  ASSERT_TRUE(m.ok());
  PlannerOptions o;
  o.devices = 2;
  o.epochs = 2;
  o.alpha = 0.5;
  StatusOr<PlannerResult> r = RunPlanner(*m, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->lambda, 1.0 / 3);
  // The balancer sees times: 4 x 1 into 2 stages = 2 each.
  EXPECT_DOUBLE_EQ(r->static_plan.partition.max_cost, 2);
  // After freezing 2 of 4: 1/3 + 1/3 + 1 + 1 on K = 1 would be 2.67 > M0 = 2: K stays 2.
  EXPECT_EQ(r->epochs[1].plan.frozen, 2);
  EXPECT_EQ(r->epochs[1].plan.k, 2);
}

TEST(PlannerTest, BadInputSaysWhatIsWrong) {
  const Model vit = Vit();
  struct Case {
    PlannerOptions options;
    const char* expected;
  };
  std::vector<Case> cases;
  auto with = [&](auto change, const char* expected) {
    PlannerOptions o = TwoByEight();
    change(o);
    cases.push_back({o, expected});
  };
  with([](PlannerOptions& o) { o.k0 = -1; }, "expected --k0 >= 1 (the initial pipeline length)");
  with([](PlannerOptions& o) { o.k0 = 17; },
       "expected --k0 <= the world (2 machines x 8 devices = 16 ranks), found 17");
  with([](PlannerOptions& o) { o.alpha = 0; }, "expected --alpha in (0, 1]");
  with([](PlannerOptions& o) { o.alpha = 1.5; }, "expected --alpha in (0, 1]");
  with([](PlannerOptions& o) { o.alpha = std::nan(""); }, "expected --alpha in (0, 1]");
  with([](PlannerOptions& o) { o.lambda = 2; }, "expected --lambda in [0, 1]");
  with([](PlannerOptions& o) { o.machines = 0; }, "expected --machines in [1, 16384], found 0");
  with([](PlannerOptions& o) { o.devices = -8; }, "expected --devices in [1, 16384]");
  with([](PlannerOptions& o) { o.epochs = 0; }, "expected --epochs in [1, 10000]");
  with([](PlannerOptions& o) { o.micro_batches = -1; }, "expected --micro-batches in [0, 65536]");
  // Sizes that would take minutes to plan, or overflow an int when multiplied.
  with([](PlannerOptions& o) { o.machines = 1000000; }, "expected --machines in [1, 16384]");
  with([](PlannerOptions& o) { o.devices = 2000000; }, "expected --devices in [1, 16384]");
  with([](PlannerOptions& o) { o.machines = 4096; },
       "expected at most 16384 ranks, found 4096 machines x 8 devices = 32768");
  with([](PlannerOptions& o) { o.epochs = 1000000000; }, "expected --epochs in [1, 10000]");
  with([](PlannerOptions& o) { o.micro_batches = 2147483647; },
       "expected --micro-batches in [0, 65536]");
  // Finite inputs whose times are not: refused, never printed as inf or nan.
  with([](PlannerOptions& o) { o.cost.batch = 1e308; }, "infinite or undefined times");
  with([](PlannerOptions& o) { o.cost.flops = 1e-308; }, "infinite or undefined times");
  with([](PlannerOptions& o) { o.cost.batch = -256; }, "expected --batch > 0");
  with([](PlannerOptions& o) { o.cost.tokens = -1; }, "expected --tokens > 0");
  with([](PlannerOptions& o) { o.cost.flops = 0; }, "expected --flops > 0");
  with([](PlannerOptions& o) { o.cost.bandwidth = INFINITY; }, "expected --bandwidth > 0");
  for (const Case& c : cases) {
    StatusOr<PlannerResult> r = RunPlanner(vit, c.options);
    EXPECT_TRUE(MessageHas(r.status(), c.expected));
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }

  // More stages than units.
  StatusOr<Model> tiny = ParseLayerCsv("name,params\na,1\nb,2\nc,3\n", "tiny.csv");
  ASSERT_TRUE(tiny.ok());
  PlannerOptions o;
  o.k0 = 4;
  EXPECT_TRUE(MessageHas(RunPlanner(*tiny, o).status(),
                         "expected at most as many stages as units, found K0 = 4 stages for 3 "
                         "units of tiny.csv"));

  // Negative sizes in a model built by hand (files refuse them earlier).
  Model negative = *tiny;
  negative.units[1].params = -2;
  EXPECT_TRUE(MessageHas(RunPlanner(negative, PlannerOptions()).status(),
                         "expected parameter counts >= 0, found -2 for unit 1 (b)"));

  // A layer time too small to divide by.
  StatusOr<Model> subnormal = ParseLayerCsv("name,params,time\na,1,1e-320\nb,2,1e-320\n", "s.csv");
  ASSERT_TRUE(subnormal.ok()) << subnormal.status();
  PlannerOptions one_pipeline;
  one_pipeline.devices = 2;  // K = 2, one replica: no gradient sync to add a finite time
  EXPECT_TRUE(
      MessageHas(RunPlanner(*subnormal, one_pipeline).status(), "infinite or undefined times"));

  // The largest sizes allowed still plan.
  PlannerOptions big = TwoByEight();
  big.machines = 2048;
  big.epochs = 2;
  big.micro_batches = 65536;
  StatusOr<PlannerResult> planned = RunPlanner(vit, big);
  ASSERT_TRUE(planned.ok()) << planned.status();
  EXPECT_TRUE(std::isfinite(planned->overall_speedup));
  PlannerOptions long_run = TwoByEight();
  long_run.epochs = 10000;
  EXPECT_TRUE(RunPlanner(vit, long_run).ok());

  // A model where nothing costs anything.
  StatusOr<Model> zeros = ParseLayerCsv("name,params\na,0\nb,0\n", "zeros.csv");
  ASSERT_TRUE(zeros.ok());
  EXPECT_FALSE(RunPlanner(*zeros, PlannerOptions()).ok());
}

TEST(PlannerTest, ReportHasATablePerEpochAndMachineReadableLines) {
  StatusOr<PlannerResult> r = RunPlanner(Vit(), TwoByEight());
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string report = FormatReport(Vit(), *r);
  int plan_lines = 0, summary_lines = 0;
  for (absl::string_view line : absl::StrSplit(report, '\n')) {
    if (absl::StartsWith(line, "PLAN ")) {
      ++plan_lines;
      for (const char* key :
           {"epoch=", "frozen=", "units=", "k=", "replicas=", "micro_batches=", "bubble=",
            "newly_active=", "boundaries=", "stage_cost=", "stage_ms=", "pipeline_ms=", "sync_ms=",
            "step_ms=", "samples_per_s=", "speedup="}) {
        EXPECT_TRUE(absl::StrContains(line, absl::StrCat(" ", key))) << key << " in " << line;
      }
      // key=value pairs only, no stray words.
      std::vector<std::string> fields = absl::StrSplit(line.substr(5), ' ');
      for (const std::string& f : fields) EXPECT_TRUE(absl::StrContains(f, "=")) << f;
    }
    if (absl::StartsWith(line, "PLAN_SUMMARY ")) ++summary_lines;
  }
  EXPECT_EQ(plan_lines, 10);
  EXPECT_EQ(summary_lines, 1);
  EXPECT_TRUE(absl::StrContains(report, "86,567,656 parameters"));
  EXPECT_TRUE(absl::StrContains(report, "epoch 3: frozen 19/26, K 4, 4 replicas"));
  EXPECT_TRUE(absl::StrContains(report, "newly active ranks: 8-15"));
}

TEST(PlannerTest, ComparisonHasEveryStrategy) {
  std::vector<PlannerResult> results;
  for (pipe::Strategy s :
       {pipe::Strategy::kOptimal, pipe::Strategy::kGreedy, pipe::Strategy::kEven}) {
    PlannerOptions o = TwoByEight();
    o.strategy = s;
    StatusOr<PlannerResult> r = RunPlanner(Vit(), o);
    ASSERT_TRUE(r.ok()) << r.status();
    results.push_back(*r);
  }
  const std::string table = FormatComparison(Vit(), results);
  EXPECT_TRUE(absl::StrContains(table, "COMPARE strategy=optimal "));
  EXPECT_TRUE(absl::StrContains(table, "COMPARE strategy=greedy "));
  EXPECT_TRUE(absl::StrContains(table, "COMPARE strategy=even "));
  EXPECT_TRUE(absl::StrContains(table, "overall"));
  EXPECT_TRUE(absl::StrContains(table, "fastest elastic run: "));
}

TEST(PlannerTest, FormatRanksCompressesRuns) {
  EXPECT_EQ(FormatRanks({}), "none");
  EXPECT_EQ(FormatRanks({3}), "3");
  EXPECT_EQ(FormatRanks({15, 8, 9, 10, 11, 12, 13, 14, 2, 4, 5}), "2,4-5,8-15");
}

}  // namespace
}  // namespace planner
}  // namespace weft
