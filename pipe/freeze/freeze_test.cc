#include "pipe/freeze/freeze.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace weft {
namespace pipe {
namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// F_0 .. F_{n-1} for (L, alpha).
std::vector<int> Schedule(int layers, double alpha, int n) {
  std::vector<int> out;
  for (int t = 0; t < n; ++t) {
    auto bound = FreezeBound(layers, alpha, t);
    EXPECT_TRUE(bound.ok()) << bound.status();
    out.push_back(bound.ok() ? *bound : -1);
  }
  return out;
}

void ExpectInvalid(const Status& status, const std::string& fragment) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find(fragment), std::string::npos)
      << "message \"" << status.message() << "\" lacks \"" << fragment << "\"";
}

// Expected values: ceil(L * (1 - (1 - alpha)^t)) in exact rational arithmetic.
TEST(FreezeBound, HalfMatchesExactArithmetic) {
  EXPECT_EQ(Schedule(8, 0.5, 8), (std::vector<int>{0, 4, 6, 7, 8, 8, 8, 8}));
  EXPECT_EQ(Schedule(12, 0.5, 8), (std::vector<int>{0, 6, 9, 11, 12, 12, 12, 12}));
  EXPECT_EQ(Schedule(24, 0.5, 8), (std::vector<int>{0, 12, 18, 21, 23, 24, 24, 24}));
  EXPECT_EQ(Schedule(96, 0.5, 9), (std::vector<int>{0, 48, 72, 84, 90, 93, 95, 96, 96}));
}

TEST(FreezeBound, QuarterMatchesExactArithmetic) {
  EXPECT_EQ(Schedule(8, 0.25, 10), (std::vector<int>{0, 2, 4, 5, 6, 7, 7, 7, 8, 8}));
  EXPECT_EQ(Schedule(12, 0.25, 10), (std::vector<int>{0, 3, 6, 7, 9, 10, 10, 11, 11, 12}));
  EXPECT_EQ(Schedule(24, 0.25, 11), (std::vector<int>{0, 6, 11, 14, 17, 19, 20, 21, 22, 23, 23}));
  EXPECT_EQ(Schedule(96, 0.25, 12),
            (std::vector<int>{0, 24, 42, 56, 66, 74, 79, 84, 87, 89, 91, 92}));
}

TEST(FreezeBound, OneFreezesEverythingAtTheFirstPoint) {
  for (int layers : {1, 8, 12, 24, 96}) {
    EXPECT_EQ(*FreezeBound(layers, 1.0, 0), 0);
    EXPECT_EQ(*FreezeBound(layers, 1.0, 1), layers);
    EXPECT_EQ(*FreezeBound(layers, 1.0, 7), layers);
  }
}

TEST(FreezeBound, ThirdAndFifth) {
  EXPECT_EQ(Schedule(8, 1.0 / 3, 8), (std::vector<int>{0, 3, 5, 6, 7, 7, 8, 8}));
  EXPECT_EQ(Schedule(12, 1.0 / 3, 8), (std::vector<int>{0, 4, 7, 9, 10, 11, 11, 12}));
  EXPECT_EQ(Schedule(24, 1.0 / 3, 9), (std::vector<int>{0, 8, 14, 17, 20, 21, 22, 23, 24}));
  EXPECT_EQ(Schedule(96, 1.0 / 3, 12),
            (std::vector<int>{0, 32, 54, 68, 78, 84, 88, 91, 93, 94, 95, 95}));
  EXPECT_EQ(Schedule(96, 0.2, 12),
            (std::vector<int>{0, 20, 35, 47, 57, 65, 71, 76, 80, 84, 86, 88}));
}

// Values that are exact integers in real arithmetic but land just above the integer in
// double arithmetic: a plain ceil gives the next integer.
TEST(FreezeBound, ExactIntegersAreNotPushedUp) {
  // 1 - 0.3 is 0.69999999999999996, so 10 * (1 - 0.7) is 3.0000000000000004 in doubles.
  EXPECT_EQ(Schedule(10, 0.3, 8), (std::vector<int>{0, 3, 6, 7, 8, 9, 9, 10}));
  EXPECT_EQ(*FreezeBound(120, 0.3, 1), 36);
  // -100 * expm1(log1p(-0.07)) is 7.0000000000000009.
  EXPECT_EQ(Schedule(100, 0.07, 8), (std::vector<int>{0, 7, 14, 20, 26, 31, 36, 40}));
  // 125 * (1 - 0.8^3) = 61 and 1000 * (1 - 0.8^3) = 488 exactly.
  EXPECT_EQ(Schedule(125, 0.2, 8), (std::vector<int>{0, 25, 45, 61, 74, 85, 93, 99}));
  EXPECT_EQ(Schedule(1000, 0.2, 8), (std::vector<int>{0, 200, 360, 488, 591, 673, 738, 791}));
  EXPECT_EQ(Schedule(100, 0.1, 8), (std::vector<int>{0, 10, 19, 28, 35, 41, 47, 53}));
  // 9 * (1 - (2/3)^2) = 5 and 27 * (1 - (2/3)^3) = 19.
  EXPECT_EQ(Schedule(9, 1.0 / 3, 8), (std::vector<int>{0, 3, 5, 7, 8, 8, 9, 9}));
  EXPECT_EQ(Schedule(27, 1.0 / 3, 8), (std::vector<int>{0, 9, 15, 19, 22, 24, 25, 26}));
}

TEST(FreezeBound, LargeTNeitherOverflowsNorExceedsL) {
  for (double alpha : {1e-9, 0.01, 1.0 / 3, 0.5, 0.999, 1.0}) {
    for (int layers : {1, 8, 96, 100000}) {
      for (int t : {1000, 1 << 20, std::numeric_limits<int>::max()}) {
        auto bound = FreezeBound(layers, alpha, t);
        ASSERT_TRUE(bound.ok()) << bound.status();
        EXPECT_GE(*bound, 0);
        EXPECT_LE(*bound, layers);
      }
    }
    if (alpha >= 0.01) {
      EXPECT_EQ(*FreezeBound(96, alpha, std::numeric_limits<int>::max()), 96) << alpha;
    }
  }
  // A tiny alpha still moves: 1 - alpha rounds to 1 but log1p(-alpha) does not, and the
  // tiny v = 8e-17 is genuine (the tolerance is relative to v), so its ceiling is 1.
  EXPECT_EQ(*FreezeBound(8, 1e-17, 1), 1);
  EXPECT_EQ(*FreezeBound(96, 1e-9, std::numeric_limits<int>::max()), 85);
}

TEST(FreezeBound, NeverDecreasesWithT) {
  for (double alpha : {0.05, 0.1, 0.2, 0.25, 0.3, 1.0 / 3, 0.5, 0.7}) {
    for (int layers = 1; layers <= 130; ++layers) {
      int last = 0;
      for (int t = 0; t < 60; ++t) {
        const int bound = *FreezeBound(layers, alpha, t);
        EXPECT_GE(bound, last) << "L=" << layers << " alpha=" << alpha << " t=" << t;
        last = bound;
      }
      EXPECT_EQ(*FreezeBound(layers, alpha, 5000), layers);
    }
  }
}

TEST(FreezeBound, RejectsBadArguments) {
  ExpectInvalid(FreezeBound(0, 0.5, 1).status(), "at least one layer");
  ExpectInvalid(FreezeBound(-3, 0.5, 1).status(), "got -3");
  ExpectInvalid(FreezeBound(8, 0.0, 1).status(), "alpha must be in (0, 1]");
  ExpectInvalid(FreezeBound(8, -0.5, 1).status(), "alpha must be in (0, 1]");
  ExpectInvalid(FreezeBound(8, 1.5, 1).status(), "got 1.5");
  ExpectInvalid(FreezeBound(8, kNaN, 1).status(), "alpha must be in (0, 1]");
  ExpectInvalid(FreezeBound(8, kInf, 1).status(), "alpha must be in (0, 1]");
  ExpectInvalid(FreezeBound(8, 0.5, -1).status(), "t must be >= 0");
}

FreezeOptions Options(double alpha, bool gradient_aware = false, bool freeze_last = false) {
  FreezeOptions options;
  options.alpha = alpha;
  options.gradient_aware = gradient_aware;
  options.freeze_last = freeze_last;
  return options;
}

TEST(NextFrozen, ScheduleOnlyCapsAtLMinusOne) {
  const FreezeOptions options = Options(0.5);
  // L = 8, alpha = 1/2: bounds 0, 4, 6, 7, 8 -> the last layer keeps training.
  std::vector<int> frozen;
  int previous = 0;
  for (int t = 0; t <= 5; ++t) {
    previous = *NextFrozen(8, t, previous, {}, options);
    frozen.push_back(previous);
  }
  EXPECT_EQ(frozen, (std::vector<int>{0, 4, 6, 7, 7, 7}));
}

TEST(NextFrozen, FreezeLastReachesL) {
  const FreezeOptions options = Options(0.5, false, /*freeze_last=*/true);
  EXPECT_EQ(*NextFrozen(8, 4, 7, {}, options), 8);
  EXPECT_EQ(*NextFrozen(8, 1, 0, {}, Options(1.0, false, true)), 8);
  EXPECT_EQ(*NextFrozen(8, 1, 0, {}, Options(1.0)), 7);
}

TEST(NextFrozen, NeverUnfreezes) {
  // previous above the bound (e.g. a larger alpha before): stays.
  EXPECT_EQ(*NextFrozen(8, 1, 6, {}, Options(0.25)), 6);
  // Everything already frozen stays frozen, even without freeze_last.
  EXPECT_EQ(*NextFrozen(8, 2, 8, {}, Options(0.5)), 8);
  // The gradient-aware choice below previous cannot happen (candidates start at previous).
  EXPECT_EQ(*NextFrozen(8, 3, 5, {0, 0, 0, 0, 0, 9, 9, 9}, Options(0.5, true)), 6);
}

TEST(NextFrozen, GradientAwareTakesTheSmallerOfBoundAndLeastNorm) {
  const FreezeOptions options = Options(0.5, /*gradient_aware=*/true);
  // Bound at t = 1 is 4; the smallest norm among layers >= 0 is layer 2 -> 3.
  EXPECT_EQ(*NextFrozen(8, 1, 0, {5, 4, 1, 3, 1.5, 2, 2, 2}, options), 3);
  // The least-norm layer is past the bound: the bound wins.
  EXPECT_EQ(*NextFrozen(8, 1, 0, {5, 4, 3, 3, 2, 2, 0.1, 2}, options), 4);
  // Entries below `previous` are ignored, even NaN or negative ones.
  EXPECT_EQ(*NextFrozen(8, 2, 3, {kNaN, -1, 0, 7, 6, 9, 9, 9}, options), 5);
  // Ties go to the earliest layer.
  EXPECT_EQ(*NextFrozen(8, 2, 2, {0, 0, 3, 1, 1, 1, 4, 4}, options), 4);
  // The first trainable layer is the least: freeze exactly one more.
  EXPECT_EQ(*NextFrozen(8, 2, 2, {0, 0, 0.1, 1, 1, 1, 4, 4}, options), 3);
  // The last layer has the least norm: l* + 1 = 8, capped at L - 1 unless freeze_last.
  EXPECT_EQ(*NextFrozen(8, 9, 6, {0, 0, 0, 0, 0, 0, 2, 1}, options), 7);
  EXPECT_EQ(*NextFrozen(8, 9, 6, {0, 0, 0, 0, 0, 0, 2, 1}, Options(0.5, true, true)), 8);
  // At t = 0 the bound is 0: nothing freezes whatever the norms.
  EXPECT_EQ(*NextFrozen(8, 0, 0, {1, 1, 1, 1, 1, 1, 1, 1}, options), 0);
}

TEST(NextFrozen, GradientAwareFollowsANormSequence) {
  // L = 12, alpha = 1/3: bounds 4, 7, 9, 10, 11. The norms pick 2, 5, 9, then the bound.
  const FreezeOptions options = Options(1.0 / 3, true);
  int frozen = 0;
  frozen = *NextFrozen(12, 1, frozen, {3, 2, 1, 4, 5, 6, 7, 8, 9, 9, 9, 9}, options);
  EXPECT_EQ(frozen, 3);
  frozen = *NextFrozen(12, 2, frozen, {0, 0, 0, 3, 2, 1, 4, 5, 6, 7, 8, 9}, options);
  EXPECT_EQ(frozen, 6);
  frozen = *NextFrozen(12, 3, frozen, {0, 0, 0, 0, 0, 0, 5, 4, 3, 2, 1, 0.5}, options);
  EXPECT_EQ(frozen, 9);  // the least is layer 11 (-> 12), the bound 9 wins
  frozen = *NextFrozen(12, 4, frozen, {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3}, options);
  EXPECT_EQ(frozen, 10);
  frozen = *NextFrozen(12, 5, frozen, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1}, options);
  EXPECT_EQ(frozen, 11);
  frozen = *NextFrozen(12, 6, frozen, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, options);
  EXPECT_EQ(frozen, 11);  // capped at L - 1
}

TEST(NextFrozen, RejectsBadArguments) {
  ExpectInvalid(NextFrozen(8, 1, 0, {}, Options(0.0)).status(), "alpha");
  ExpectInvalid(NextFrozen(8, -1, 0, {}, Options(0.5)).status(), "t must be >= 0");
  ExpectInvalid(NextFrozen(0, 1, 0, {}, Options(0.5)).status(), "at least one layer");
  ExpectInvalid(NextFrozen(8, 1, -1, {}, Options(0.5)).status(), "previous frozen count");
  ExpectInvalid(NextFrozen(8, 1, 9, {}, Options(0.5)).status(), "in [0, 8]");
  const FreezeOptions aware = Options(0.5, true);
  ExpectInvalid(NextFrozen(8, 1, 0, {}, aware).status(), "one accumulated gradient norm per");
  ExpectInvalid(NextFrozen(8, 1, 0, {1, 2, 3}, aware).status(), "got 3");
  ExpectInvalid(NextFrozen(4, 1, 0, {1, kNaN, 1, 1}, aware).status(), "layer 1");
  ExpectInvalid(NextFrozen(4, 1, 0, {1, 1, -2, 1}, aware).status(), "finite and >= 0");
  ExpectInvalid(NextFrozen(4, 1, 0, {1, 1, 1, kInf}, aware).status(), "layer 3");
  // Without the policy, norms are not looked at.
  EXPECT_EQ(*NextFrozen(4, 1, 0, {kNaN}, Options(0.5)), 2);
}

TEST(GradNormAccumulator, SumsNormsOverAnIntervalAndRestarts) {
  GradNormAccumulator acc(3);
  EXPECT_EQ(acc.layers(), 3);
  EXPECT_EQ(acc.sums(), (std::vector<double>{0, 0, 0}));
  ASSERT_TRUE(acc.Add(0, 1.5).ok());
  ASSERT_TRUE(acc.Add(2, 0.25).ok());
  acc.EndIteration();
  ASSERT_TRUE(acc.Add(0, 2.0).ok());
  ASSERT_TRUE(acc.Add(1, 0.0).ok());
  ASSERT_TRUE(acc.Add(2, 0.5).ok());
  acc.EndIteration();
  EXPECT_EQ(acc.iterations(), 2);
  EXPECT_EQ(acc.sums(), (std::vector<double>{3.5, 0.0, 0.75}));
  EXPECT_EQ(acc.Take(), (std::vector<double>{3.5, 0.0, 0.75}));
  EXPECT_EQ(acc.sums(), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(acc.iterations(), 0);
  ASSERT_TRUE(acc.Add(1, 4.0).ok());
  EXPECT_EQ(acc.Take(), (std::vector<double>{0, 4.0, 0}));
}

TEST(GradNormAccumulator, RejectsBadLayersAndNorms) {
  GradNormAccumulator acc(2);
  ExpectInvalid(acc.Add(2, 1.0), "layer 2 is out of range [0, 2)");
  ExpectInvalid(acc.Add(-1, 1.0), "out of range");
  ExpectInvalid(acc.Add(0, -0.5), "finite and >= 0");
  ExpectInvalid(acc.Add(1, kNaN), "layer 1");
  ExpectInvalid(acc.Add(1, kInf), "finite");
  EXPECT_EQ(acc.sums(), (std::vector<double>{0, 0}));
  GradNormAccumulator empty(-4);
  EXPECT_EQ(empty.layers(), 0);
}

TEST(GradNormAccumulator, FeedsTheGradientAwarePolicy) {
  GradNormAccumulator acc(6);
  // Layer 3 has the smallest total over the interval, though not at the last iteration.
  const double norms[2][6] = {{9, 8, 7, 1, 5, 6}, {9, 8, 7, 4, 2, 6}};
  for (const auto& iteration : norms) {
    for (int layer = 0; layer < 6; ++layer) ASSERT_TRUE(acc.Add(layer, iteration[layer]).ok());
    acc.EndIteration();
  }
  FreezeOptions options = Options(1.0, /*gradient_aware=*/true);
  EXPECT_EQ(*NextFrozen(6, 1, 0, acc.Take(), options), 4);
}

}  // namespace
}  // namespace pipe
}  // namespace weft
