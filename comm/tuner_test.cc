#include "comm/tuner.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace weft {
namespace comm {
namespace {

// Makes `runs` runs the way `tuner` asks, each of 1000 bytes at `cost[way]` ns per byte,
// and notes their ways in `seen`.
template <size_t kWays>
void RunTuned(Tuner& tuner, const double (&cost)[kWays], int runs, std::vector<int>& seen) {
  for (int i = 0; i < runs; ++i) {
    const int way = tuner.next();
    seen.push_back(way);
    tuner.Record(way, static_cast<int64_t>(cost[way] * 1000), 1000);
  }
}

// The tuner keeps the cheaper way, tries the other every `period` runs (the first time
// after `trial`), skips the first run after each change, and follows a change of costs.
TEST(TunerTest, KeepsTheCheaperWayAndNoticesWhenItChanges) {
  constexpr int kPeriod = 10, kTrial = 3;
  Tuner tuner(kPeriod, kTrial);
  double cost[2] = {2.0, 1.0};
  std::vector<int> seen;
  auto run = [&](int runs) { RunTuned(tuner, cost, runs, seen); };
  run(kTrial);  // the first way, the first choice
  EXPECT_EQ(seen, std::vector<int>(kTrial, 0));
  run(kTrial);  // the first trial of the second, which is cheaper
  EXPECT_EQ(tuner.next(), 1);
  seen.clear();
  run(kPeriod);  // it keeps the second; then tries the first again
  EXPECT_EQ(seen, std::vector<int>(kPeriod, 1));
  seen.clear();
  run(kTrial);
  EXPECT_EQ(seen, std::vector<int>(kTrial, 0));
  EXPECT_EQ(tuner.next(), 1);  // still the cheaper
  // The second gets dearer: the next trial of the first wins it back.
  cost[1] = 3.0;
  run(kPeriod + kTrial);
  EXPECT_EQ(tuner.next(), 0);
  // A run right after a change is not counted: an outlier there changes nothing.
  Tuner fresh(kPeriod, kTrial);
  for (int i = 0; i < kTrial; ++i) fresh.Record(0, 2000, 1000);  // 2 ns per byte
  fresh.Record(1, 1, 1000);                                      // the trial's first: skipped
  for (int i = 1; i < kTrial; ++i) fresh.Record(1, 3000, 1000);  // 3
  EXPECT_EQ(fresh.next(), 0);
}

// A run made another way than the one asked for (it could not go that way) counts for
// neither: it neither moves the trial on nor enters either way's costs.
TEST(TunerTest, RunsOfTheOtherWayThanAskedAreNotCounted) {
  constexpr int kPeriod = 10, kTrial = 3;
  Tuner tuner(kPeriod, kTrial);
  for (int i = 0; i < kTrial; ++i) tuner.Record(0, 2000, 1000);
  ASSERT_EQ(tuner.next(), 1);  // the trial of the second way
  // Runs of the first way meanwhile, however cheap, change nothing.
  for (int i = 0; i < 2 * kTrial; ++i) tuner.Record(0, 1, 1000);
  EXPECT_EQ(tuner.next(), 1);
  tuner.Record(1, 1, 1000);                                      // skipped: the trial's first
  for (int i = 1; i < kTrial; ++i) tuner.Record(1, 1000, 1000);  // 1 ns per byte
  EXPECT_EQ(tuner.next(), 1);                                    // cheaper than the first way's 2
  // Nor do runs of no bytes.
  Tuner empty(kPeriod, kTrial);
  for (int i = 0; i < 2 * kTrial; ++i) empty.Record(0, 1000, 0);
  EXPECT_EQ(empty.next(), 0);
}

// With max_period, each trial after the first that changes nothing doubles the wait for
// the next, up to max_period; a change starts again from period.
TEST(TunerTest, TrialsThatChangeNothingComeLessOften) {
  constexpr int kPeriod = 4, kTrial = 2, kMaxPeriod = 16;
  Tuner tuner(kPeriod, kTrial, kMaxPeriod);
  double cost[2] = {1.0, 2.0};
  std::vector<int> seen;
  auto run = [&](int runs) { RunTuned(tuner, cost, runs, seen); };
  run(kTrial + kTrial);  // the first way, then its first trial of the second (which loses)
  // Where each later trial starts: after 4 (the period), 8, 16 and 16 runs of the first way.
  std::vector<int> starts;
  seen.clear();
  run(4 + kTrial + 8 + kTrial + 16 + kTrial + 16 + kTrial);
  for (size_t i = 0; i < seen.size(); ++i) {
    if (seen[i] == 1 && (i == 0 || seen[i - 1] == 0)) starts.push_back(static_cast<int>(i));
  }
  EXPECT_EQ(starts, (std::vector<int>{4, 4 + kTrial + 8, 4 + kTrial + 8 + kTrial + 16,
                                      4 + kTrial + 8 + kTrial + 16 + kTrial + 16}));
  // The second way gets cheaper: the next trial takes it, and the wait is period again.
  cost[1] = 0.5;
  run(16 + kTrial);
  ASSERT_EQ(tuner.next(), 1);
  seen.clear();
  run(kPeriod + 1);
  EXPECT_EQ(seen.back(), 0) << "the trial after a change comes after `period` runs";
}

// With give_up, a trial ends at its first counted run that costs more than give_up times
// the chosen way's cost; a closer one runs its length.
TEST(TunerTest, HopelessTrialsEndEarly) {
  constexpr int kPeriod = 10, kTrial = 4;
  Tuner tuner(kPeriod, kTrial, kPeriod, /*give_up=*/1.5);
  for (int i = 0; i < kTrial; ++i) tuner.Record(0, 1000, 1000);  // 1 ns per byte
  ASSERT_EQ(tuner.next(), 1);
  tuner.Record(1, 1, 1000);     // the trial's first: skipped
  tuner.Record(1, 2000, 1000);  // 2: hopeless
  EXPECT_EQ(tuner.next(), 0);
  // The next trial, 10 runs on, at 1.2: it runs its length (and loses).
  for (int i = 0; i < kPeriod; ++i) tuner.Record(0, 1000, 1000);
  ASSERT_EQ(tuner.next(), 1);
  for (int i = 0; i < kTrial - 1; ++i) {
    tuner.Record(1, 1200, 1000);
    EXPECT_EQ(tuner.next(), 1) << "run " << i;
  }
  tuner.Record(1, 1200, 1000);
  EXPECT_EQ(tuner.next(), 0);
}

// Of three ways, each is tried once early on (after `trial` runs of the chosen one), the
// cheapest is kept, and later trials take the others in turn.
TEST(TunerTest, TriesEveryWayOfSeveralInTurn) {
  constexpr int kPeriod = 10, kTrial = 3;
  Tuner tuner(kPeriod, kTrial, /*max_period=*/0, /*give_up=*/0, /*ways=*/3);
  double cost[3] = {2.0, 3.0, 1.0};
  std::vector<int> seen;
  RunTuned(tuner, cost, 4 * kTrial + 2 * (kPeriod + kTrial), seen);
  std::vector<int> expected;
  auto add = [&](int way, int runs) { expected.insert(expected.end(), runs, way); };
  add(0, kTrial);   // the first choice
  add(1, kTrial);   // the first trial of the second way: dearer
  add(0, kTrial);   // the third, untried, comes after `trial` runs
  add(2, kTrial);   // and is the cheapest: kept
  add(2, kPeriod);  // then the others in turn, every `period` runs
  add(0, kTrial);
  add(2, kPeriod);
  add(1, kTrial);
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(tuner.next(), 2);
  // Runs of a way beyond the tuner's count nothing.
  tuner.Record(3, 1, 1000);
  tuner.Record(-1, 1, 1000);
  EXPECT_EQ(tuner.next(), 2);
}

// A way whose run failed is neither tried nor chosen again: a trial of it ends at once, a
// chosen one gives way to the best of the others; the last way left is kept.
TEST(TunerTest, AWayThatFailedIsLeftAlone) {
  constexpr int kPeriod = 10, kTrial = 3;
  Tuner tuner(kPeriod, kTrial, /*max_period=*/0, /*give_up=*/0, /*ways=*/3);
  double cost[3] = {2.0, 3.0, 1.0};
  std::vector<int> seen;
  RunTuned(tuner, cost, 3 * kTrial, seen);  // the first, a trial of the second, the first
  ASSERT_EQ(tuner.next(), 2);               // the trial of the third
  tuner.Fail(2);
  EXPECT_EQ(tuner.next(), 0);
  seen.clear();
  RunTuned(tuner, cost, 5 * (kPeriod + kTrial), seen);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 2), 0);
  EXPECT_GT(std::count(seen.begin(), seen.end(), 1), 0) << "the second is still tried";
  // Two ways, the second chosen, then failing: back to the first, for good.
  Tuner two(kPeriod, kTrial);
  double costs[2] = {2.0, 1.0};
  seen.clear();
  RunTuned(two, costs, 2 * kTrial, seen);
  ASSERT_EQ(two.next(), 1);
  two.Record(1, 1000, 1000);
  two.Fail(1);
  EXPECT_EQ(two.next(), 0);
  seen.clear();
  RunTuned(two, costs, 5 * (kPeriod + kTrial), seen);
  EXPECT_EQ(seen, std::vector<int>(seen.size(), 0));
  two.Fail(0);  // the only way left
  EXPECT_EQ(two.next(), 0);
  two.Fail(1);  // not the way asked: nothing
  EXPECT_EQ(two.next(), 0);
}

// A way's cost is the middle of its last runs (the lower middle one of an even count): one
// lucky run does not make a way look cheaper than it is, nor one unlucky run dearer.
TEST(TunerTest, AWaysCostIsTheMiddleOfItsLastRuns) {
  constexpr int kPeriod = 10, kTrial = 4;
  Tuner tuner(kPeriod, kTrial);
  tuner.Record(0, 500, 1000);                                    // one lucky run: 0.5
  for (int i = 1; i < kTrial; ++i) tuner.Record(0, 3000, 1000);  // then 3 ns per byte
  ASSERT_EQ(tuner.next(), 1);
  tuner.Record(1, 1, 1000);     // the trial's first: skipped
  tuner.Record(1, 9000, 1000);  // one unlucky run: 9
  tuner.Record(1, 2000, 1000);
  tuner.Record(1, 2000, 1000);  // then 2: cheaper than the first way's 3
  EXPECT_EQ(tuner.next(), 1);
}

// With `warmup`, that many runs after each change are not counted, and a trial runs at
// least one run past them (here 3 runs, though 2 were asked for).
TEST(TunerTest, RunsInTheWarmupAreNotCounted) {
  constexpr int kPeriod = 10, kWarmup = 2;
  Tuner tuner(kPeriod, /*trial=*/2, /*max_period=*/0, /*give_up=*/0, /*ways=*/2, kWarmup);
  for (int i = 0; i < kWarmup + 1; ++i) tuner.Record(0, 2000, 1000);  // 2 ns per byte
  ASSERT_EQ(tuner.next(), 1);
  for (int i = 0; i < kWarmup; ++i) {
    tuner.Record(1, 1, 1000);  // would win, but still paying for the change
    ASSERT_EQ(tuner.next(), 1);
  }
  tuner.Record(1, 3000, 1000);  // 3: dearer
  EXPECT_EQ(tuner.next(), 0);
}

}  // namespace
}  // namespace comm
}  // namespace weft
