#include "pipe/balance/balance.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace weft {
namespace pipe {
namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

void ExpectInvalid(const Status& status, const std::string& fragment) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find(fragment), std::string::npos)
      << "message \"" << status.message() << "\" lacks \"" << fragment << "\"";
}

std::vector<int> Boundaries(const std::vector<double>& costs, int stages, Strategy strategy) {
  auto p = PartitionLayers(costs, stages, strategy);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? p->boundaries : std::vector<int>{};
}

// ---- an independent exact oracle -------------------------------------------------------------
// The test's costs have no bits below 2^-64 and are < 2^60, so cost * 2^64 is an exact
// __int128 and so is every sum of up to 10,000 of them.
using Exact = __int128;

Exact ToExact(double c) {
  const double scaled = std::ldexp(c, 64);
  EXPECT_EQ(scaled, std::floor(scaled)) << "test cost " << c << " has bits below 2^-64";
  EXPECT_LT(c, std::ldexp(1.0, 60));
  return static_cast<Exact>(scaled);
}

struct Oracle {
  explicit Oracle(const std::vector<double>& costs) : prefix(costs.size() + 1, 0) {
    for (size_t i = 0; i < costs.size(); ++i) prefix[i + 1] = prefix[i] + ToExact(costs[i]);
  }
  Exact Sum(int begin, int end) const { return prefix[end] - prefix[begin]; }
  // The double nearest to the exact sum (__int128 -> double rounds correctly).
  double Rounded(int begin, int end) const {
    return std::ldexp(static_cast<double>(Sum(begin, end)), -64);
  }
  int layers() const { return static_cast<int>(prefix.size()) - 1; }
  // The fewest stages (each <= limit) that can hold [begin, L), or a huge number.
  int MinStages(int begin, Exact limit) const {
    int stages = 0;
    int at = begin;
    while (at < layers()) {
      if (Sum(at, at + 1) > limit) return std::numeric_limits<int>::max();
      int end = at + 1;
      while (end < layers() && Sum(at, end + 1) <= limit) ++end;
      at = end;
      ++stages;
    }
    return stages;
  }
  std::vector<Exact> prefix;
};

// Every partition into `stages` non-empty stages, in lexicographic order of boundaries; the
// first with the least largest stage.
std::vector<int> BruteForceOptimal(const Oracle& oracle, int stages) {
  const int layers = oracle.layers();
  std::vector<int> current(static_cast<size_t>(stages) + 1, 0), best;
  Exact best_max = 0;
  current.back() = layers;
  std::function<void(int, Exact)> place = [&](int s, Exact largest) {
    if (s == stages) {
      largest = std::max(largest, oracle.Sum(current[stages - 1], layers));
      if (best.empty() || largest < best_max) {
        best = current;
        best_max = largest;
      }
      return;
    }
    // Stage s - 1 ends at b; the stages s .. stages - 1 still need a layer each.
    for (int b = current[s - 1] + 1; b <= layers - (stages - s); ++b) {
      current[s] = b;
      place(s + 1, std::max(largest, oracle.Sum(current[s - 1], b)));
    }
  };
  if (stages == 1) return {0, layers};
  place(1, 0);
  return best;
}

// The least largest stage over partitions into `stages` non-empty stages: O(K L^2) DP.
Exact DynamicProgrammingOptimum(const Oracle& oracle, int stages) {
  const int layers = oracle.layers();
  const Exact kNone = -1;
  std::vector<Exact> previous(layers + 1, kNone), next(layers + 1, kNone);
  for (int i = 1; i <= layers; ++i) previous[i] = oracle.Sum(0, i);
  for (int k = 2; k <= stages; ++k) {
    std::fill(next.begin(), next.end(), kNone);
    for (int i = k; i <= layers; ++i) {
      for (int j = k - 1; j < i; ++j) {
        if (previous[j] == kNone) continue;
        const Exact candidate = std::max(previous[j], oracle.Sum(j, i));
        if (next[i] == kNone || candidate < next[i]) next[i] = candidate;
      }
    }
    previous.swap(next);
  }
  return previous[layers];
}

// The result is a well-formed optimal partition, lexicographically smallest among optimal
// ones, checked without enumerating: each boundary is a valid choice given the ones before
// it, and one position earlier is not.
void ExpectOptimalAndLeast(const std::vector<double>& costs, int stages, const Partition& p) {
  const Oracle oracle(costs);
  const int layers = oracle.layers();
  ASSERT_EQ(p.boundaries.size(), static_cast<size_t>(stages) + 1);
  ASSERT_EQ(p.boundaries.front(), 0);
  ASSERT_EQ(p.boundaries.back(), layers);
  ASSERT_FALSE(p.has_empty_stage());
  Exact largest = 0;
  for (int s = 0; s < stages; ++s) {
    ASSERT_LT(p.boundaries[s], p.boundaries[s + 1]);
    largest = std::max(largest, oracle.Sum(p.boundaries[s], p.boundaries[s + 1]));
    EXPECT_EQ(p.stage_costs[s], oracle.Rounded(p.boundaries[s], p.boundaries[s + 1]));
  }
  EXPECT_EQ(p.max_cost, *std::max_element(p.stage_costs.begin(), p.stage_costs.end()));
  // Optimal: nothing strictly below the largest stage fits in K stages.
  if (largest > 0) {
    EXPECT_GT(oracle.MinStages(0, largest - 1), stages);
  }
  EXPECT_LE(oracle.MinStages(0, largest), stages);
  auto valid = [&](int s, int cut) {
    const int begin = p.boundaries[s - 1];
    return cut > begin && oracle.Sum(begin, cut) <= largest && layers - cut >= stages - s &&
           oracle.MinStages(cut, largest) <= stages - s;
  };
  for (int s = 1; s < stages; ++s) {
    EXPECT_TRUE(valid(s, p.boundaries[s])) << "boundary " << s;
    EXPECT_FALSE(valid(s, p.boundaries[s] - 1)) << "boundary " << s << " could be earlier";
  }
}

// ---- costs -----------------------------------------------------------------------------------

TEST(ParameterCosts, ScalesTheFrozenPrefixByLambda) {
  EXPECT_EQ(*ParameterCosts({6, 12, 18, 24}, 2), (std::vector<double>{1, 2, 18, 24}));
  EXPECT_EQ(*ParameterCosts({6, 12, 18, 24}, 0), (std::vector<double>{6, 12, 18, 24}));
  EXPECT_EQ(*ParameterCosts({6, 12, 18, 24}, 4, 0.5), (std::vector<double>{3, 6, 9, 12}));
  EXPECT_EQ(*ParameterCosts({6, 12}, 1, 0.0), (std::vector<double>{0, 12}));
  EXPECT_EQ(*ParameterCosts({6, 12}, 2, 1.0), (std::vector<double>{6, 12}));
  EXPECT_TRUE(ParameterCosts({}, 0)->empty());
}

TEST(ParameterCosts, RejectsBadInput) {
  ExpectInvalid(ParameterCosts({1, -2, 3}, 0).status(), "parameter count of layer 1");
  ExpectInvalid(ParameterCosts({1, 2, kNaN}, 0).status(), "layer 2 must be finite and >= 0");
  ExpectInvalid(ParameterCosts({kInf}, 0).status(), "got inf");
  ExpectInvalid(ParameterCosts({1, 2}, 3).status(), "frozen layer count must be in [0, 2]");
  ExpectInvalid(ParameterCosts({1, 2}, -1).status(), "got -1");
  ExpectInvalid(ParameterCosts({1, 2}, 1, 1.5).status(), "lambda");
  ExpectInvalid(ParameterCosts({1, 2}, 1, -0.1).status(), "in [0, 1]");
  ExpectInvalid(ParameterCosts({1, 2}, 1, kNaN).status(), "lambda");
}

TEST(TimeCosts, ScalesTheFrozenPrefixByTheForwardFraction) {
  EXPECT_EQ(*TimeCosts({3, 6, 9}, 1), (std::vector<double>{1, 6, 9}));
  EXPECT_EQ(*TimeCosts({3, 6, 9}, 3, 0.5), (std::vector<double>{1.5, 3, 4.5}));
  ExpectInvalid(TimeCosts({3, -6}, 0).status(), "measured time of layer 1");
  ExpectInvalid(TimeCosts({3, 6}, 1, 2.0).status(), "frozen_fraction");
  ExpectInvalid(TimeCosts({3, 6}, 7).status(), "frozen layer count");
}

TEST(TransformerBlockHalves, CountsViTBaseAsPipeTransformerDid) {
  // ViT-B/16: the reference's per-sub-layer sizes 2.363904 M and 4.723968 M.
  const BlockHalves vit = TransformerBlockHalves({});
  EXPECT_EQ(vit.attention, 2363904);
  EXPECT_EQ(vit.mlp, 4723968);
  TransformerBlockDims no_bias;
  no_bias.bias = false;
  EXPECT_EQ(TransformerBlockHalves(no_bias).attention, 2 * 768 + 4 * 768 * 768);
  EXPECT_EQ(TransformerBlockHalves(no_bias).mlp, 2 * 768 + 2 * 768 * 3072);
  TransformerBlockDims large;
  large.hidden = 1024;
  large.mlp = 4096;
  EXPECT_EQ(TransformerBlockHalves(large).attention, 4200448);  // BERT-large's block
  EXPECT_EQ(TransformerBlockHalves(large).mlp, 8395776);
}

TEST(Strategy, NamesRoundTrip) {
  for (Strategy s : {Strategy::kOptimal, Strategy::kGreedy, Strategy::kEven}) {
    auto parsed = ParseStrategy(StrategyName(s));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, s);
  }
  EXPECT_STREQ(StrategyName(Strategy::kOptimal), "optimal");
  EXPECT_STREQ(StrategyName(Strategy::kGreedy), "greedy");
  EXPECT_STREQ(StrategyName(Strategy::kEven), "even");
  ExpectInvalid(ParseStrategy("balanced").status(),
                "unknown partition strategy \"balanced\"; expected one of: optimal, greedy, even");
  ExpectInvalid(ParseStrategy("").status(), "expected one of");
  ExpectInvalid(ParseStrategy("Optimal").status(), "expected one of");
}

// ---- bad input -------------------------------------------------------------------------------

TEST(PartitionLayers, RejectsBadInput) {
  for (Strategy s : {Strategy::kOptimal, Strategy::kGreedy, Strategy::kEven}) {
    ExpectInvalid(PartitionLayers({1, 2}, 0, s).status(), "number of stages must be >= 1, got 0");
    ExpectInvalid(PartitionLayers({1, 2}, -3, s).status(), "got -3");
    ExpectInvalid(PartitionLayers({}, 2, s).status(), "no layers to partition");
    ExpectInvalid(PartitionLayers({1, -2, 3}, 2, s).status(), "cost of layer 1 must be finite");
    ExpectInvalid(PartitionLayers({1, kNaN}, 1, s).status(),
                  "layer 1 must be finite and >= 0, got nan");
    ExpectInvalid(PartitionLayers({kInf, 1}, 1, s).status(), "layer 0");
    ExpectInvalid(PartitionLayers({1e308, 1e308}, 1, s).status(), "sum to more than");
  }
  ExpectInvalid(PartitionLayers({1, 2, 3}, 4, Strategy::kOptimal).status(),
                "4 stages for 3 layers: the optimal strategy gives every stage at least one "
                "layer; use at most 3 stages");
  ExpectInvalid(PartitionLayers({1, 2, 3}, 5, Strategy::kEven).status(), "the even strategy");
  // The greedy walk reproduces the reference, which did not refuse: 1 M is not below the
  // thresholds 2/3 M and 1 M of devices 0 and 1, so they stay empty.
  EXPECT_EQ(Boundaries({1e6, 1e6}, 3, Strategy::kGreedy), (std::vector<int>{0, 0, 0, 2}));
}

// ---- even ------------------------------------------------------------------------------------

TEST(PartitionLayers, EvenGivesTheFirstStagesTheRemainder) {
  EXPECT_EQ(Boundaries({9, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 4, Strategy::kEven),
            (std::vector<int>{0, 3, 6, 8, 10}));
  EXPECT_EQ(Boundaries({1, 1, 1, 1, 1, 1}, 3, Strategy::kEven), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(Boundaries({1, 2, 3}, 3, Strategy::kEven), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(Boundaries({1, 2, 3}, 1, Strategy::kEven), (std::vector<int>{0, 3}));
  const Partition p = *PartitionLayers({9, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 4, Strategy::kEven);
  EXPECT_EQ(p.stage_costs, (std::vector<double>{11, 3, 2, 2}));
  EXPECT_EQ(p.max_cost, 11);
  EXPECT_EQ(p.stages(), 4);
  EXPECT_EQ(p.layers(0), 3);
  EXPECT_EQ(p.layers(3), 2);
}

// ---- optimal: worked examples ------------------------------------------------------------------

TEST(PartitionLayers, OptimalWorkedExamples) {
  // Max 3 either way; the smallest first boundary wins.
  EXPECT_EQ(Boundaries({1, 1, 1, 1, 1}, 2, Strategy::kOptimal), (std::vector<int>{0, 2, 5}));
  // M* = 17 ({8, 9}); the first stage cannot stop before 5 (then {5..9} = 35 > 2 * 17).
  const Partition p = *PartitionLayers({1, 2, 3, 4, 5, 6, 7, 8, 9}, 3);
  EXPECT_EQ(p.boundaries, (std::vector<int>{0, 5, 7, 9}));
  EXPECT_EQ(p.stage_costs, (std::vector<double>{15, 13, 17}));
  EXPECT_EQ(p.max_cost, 17);
  // One layer per stage when K == L.
  EXPECT_EQ(Boundaries({4, 0, 7}, 3, Strategy::kOptimal), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(Boundaries({4, 0, 7}, 1, Strategy::kOptimal), (std::vector<int>{0, 3}));
  // Zeros: no empty stage, and the earliest boundaries.
  EXPECT_EQ(Boundaries({0, 0, 5, 0, 0}, 3, Strategy::kOptimal), (std::vector<int>{0, 1, 2, 5}));
  EXPECT_EQ(Boundaries({0, 0, 0, 0}, 3, Strategy::kOptimal), (std::vector<int>{0, 1, 2, 4}));
  EXPECT_EQ(PartitionLayers({0, 0, 0, 0}, 3)->max_cost, 0);
  // A dominant layer sits alone; the rest balance around it.
  EXPECT_EQ(Boundaries({1, 1, 10, 1, 1, 1, 1}, 3, Strategy::kOptimal),
            (std::vector<int>{0, 2, 3, 7}));
}

TEST(PartitionLayers, OptimalComparesTheDoublesExactly) {
  // 0.1 + 0.2 is 0.3000000000000000166... and 0.3 is 0.2999999999999999888...: {0.1, 0.2}
  // is the larger stage, exactly; [0, 1, 3] would be 0.5. The stage cost is the exact sum
  // rounded to nearest (here exactly halfway: to even, 0.30000000000000004).
  const Partition fp = *PartitionLayers({0.1, 0.2, 0.3}, 2);
  EXPECT_EQ(fp.boundaries, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(fp.stage_costs, (std::vector<double>{0.30000000000000004, 0.3}));
  // 2^53 + 1 is not a double: with double prefix sums [0, 1, 3] (max 2^53 + 1) and
  // [0, 2, 3] (max 2^53) would tie and the earlier boundary would wrongly win.
  const double big = std::ldexp(1.0, 53);
  const Partition wide = *PartitionLayers({1, 1, big}, 2);
  EXPECT_EQ(wide.boundaries, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(wide.stage_costs, (std::vector<double>{2, big}));
  // A stage sum wider than 64 bits rounds correctly: 2^53 + 1 + 2^-20 is just above the
  // midpoint of 2^53 and 2^53 + 2, so it is 2^53 + 2 (adding in doubles gives 2^53).
  EXPECT_EQ(PartitionLayers({big, 1, std::ldexp(1.0, -20)}, 1)->max_cost, big + 2);
  // Tiny layers next to a huge one keep their exact sum (double prefix differences say 0).
  const Partition tiny = *PartitionLayers({1e20, 1, 1, 1, 1}, 2);
  EXPECT_EQ(tiny.boundaries, (std::vector<int>{0, 1, 5}));
  EXPECT_EQ(tiny.stage_costs, (std::vector<double>{1e20, 4}));
  // The whole double range at once (many words of exact sums).
  const Partition range = *PartitionLayers({1e300, 5e-324, 1e-300, 1e300, 3, 1e299, 0, 2e300}, 3);
  EXPECT_EQ(range.boundaries, (std::vector<int>{0, 1, 6, 8}));
  EXPECT_EQ(range.max_cost, 2e300);
}

// ViT-B/16 as PipeTransformer split it: embeddings, 12 x (attention, MLP), norm, head.
std::vector<double> VitBaseUnits() {
  const BlockHalves block = TransformerBlockHalves({});
  std::vector<double> sizes = {742656};
  for (int i = 0; i < 12; ++i) {
    sizes.push_back(block.attention);
    sizes.push_back(block.mlp);
  }
  sizes.push_back(1536);
  sizes.push_back(7690);
  return sizes;
}

TEST(PartitionLayers, OptimalOnViTBase) {
  const std::vector<double> sizes = VitBaseUnits();
  for (int stages : {1, 2, 4, 8, 16}) {
    const Partition p = *PartitionLayers(sizes, stages);
    ExpectOptimalAndLeast(sizes, stages, p);
    EXPECT_EQ(p.max_cost, static_cast<double>(DynamicProgrammingOptimum(Oracle(sizes), stages)) /
                              std::ldexp(1.0, 64));
  }
  // On 8 devices: 11.82 M at most, where the greedy walk reaches 14.18 M (below).
  EXPECT_EQ(PartitionLayers(sizes, 8)->max_cost, 11821066);
  // With 5 blocks frozen at lambda = 1/6, the frozen prefix packs into the first stage.
  const Partition frozen = *PartitionLayers(*ParameterCosts(sizes, 11), 4);
  ExpectOptimalAndLeast(*ParameterCosts(sizes, 11), 4, frozen);
}

// ---- optimal against brute force ---------------------------------------------------------------

// Random costs of several kinds, all exact in the oracle: small integers (many ties and
// zeros), larger integers with zeros, dyadic fractions, 52-bit fractions, lambda-scaled
// integers (x / 6: inexact doubles), and a few repeated inexact values (ties between
// different stages that only exact sums see as ties).
const double kRepeated[] = {1.0 / 3, 2.0 / 3, 0.1};

std::vector<double> RandomCosts(std::mt19937_64& rng, int layers, int kind) {
  std::vector<double> costs(static_cast<size_t>(layers));
  std::uniform_int_distribution<int> small(0, 4), large(0, 1000), sixteenths(0, 64), pick(0, 2);
  std::uniform_int_distribution<uint64_t> fraction(0, (uint64_t{1} << 52) - 1);
  std::bernoulli_distribution zero(0.25);
  const int frozen = std::uniform_int_distribution<int>(0, layers)(rng);
  for (int i = 0; i < layers; ++i) {
    double c = 0;
    switch (kind) {
      case 0:
        c = small(rng);
        break;
      case 1:
        c = zero(rng) ? 0 : large(rng);
        break;
      case 2:
        c = sixteenths(rng) / 16.0;
        break;
      case 3:
        c = zero(rng) ? 0 : std::ldexp(static_cast<double>(fraction(rng)), -52);
        break;
      case 4:
        c = i < frozen ? large(rng) / 6.0 : large(rng);
        break;
      default:
        c = kRepeated[pick(rng)];
        break;
    }
    costs[static_cast<size_t>(i)] = c;
  }
  return costs;
}

TEST(PartitionLayers, OptimalMatchesBruteForce) {
  std::mt19937_64 rng(20240611);
  int cases = 0;
  for (int round = 0; round < 120; ++round) {
    for (int kind = 0; kind < 6; ++kind) {
      const int layers = std::uniform_int_distribution<int>(1, 10)(rng);
      const std::vector<double> costs = RandomCosts(rng, layers, kind);
      const Oracle oracle(costs);
      for (int stages = 1; stages <= layers; ++stages) {
        const Partition p = *PartitionLayers(costs, stages);
        const std::vector<int> expected = BruteForceOptimal(oracle, stages);
        ASSERT_EQ(p.boundaries, expected) << "kind " << kind << ", " << layers << " layers, "
                                          << stages << " stages, case " << cases;
        ASSERT_FALSE(p.has_empty_stage());
        for (int s = 0; s < stages; ++s) {
          ASSERT_EQ(p.stage_costs[s], oracle.Rounded(p.boundaries[s], p.boundaries[s + 1]));
        }
        ++cases;
      }
    }
  }
  EXPECT_GT(cases, 3000);
}

TEST(PartitionLayers, OptimalMatchesDynamicProgramming) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 40; ++round) {
    for (int kind = 0; kind < 6; ++kind) {
      const int layers = std::uniform_int_distribution<int>(10, 60)(rng);
      const int stages = std::uniform_int_distribution<int>(1, std::min(layers, 12))(rng);
      const std::vector<double> costs = RandomCosts(rng, layers, kind);
      const Partition p = *PartitionLayers(costs, stages);
      ExpectOptimalAndLeast(costs, stages, p);
      const Oracle oracle(costs);
      Exact largest = 0;
      for (int s = 0; s < stages; ++s) {
        largest = std::max(largest, oracle.Sum(p.boundaries[s], p.boundaries[s + 1]));
      }
      ASSERT_EQ(largest, DynamicProgrammingOptimum(oracle, stages))
          << "kind " << kind << ", " << layers << " layers, " << stages << " stages";
    }
  }
}

TEST(PartitionLayers, OptimalOnTenThousandLayers) {
  std::mt19937_64 rng(42);
  for (int kind : {1, 3, 4}) {
    const std::vector<double> costs = RandomCosts(rng, 10000, kind);
    const Partition p = *PartitionLayers(costs, 64);
    ExpectOptimalAndLeast(costs, 64, p);
    // Deterministic: the same answer twice.
    EXPECT_EQ(PartitionLayers(costs, 64)->boundaries, p.boundaries);
  }
}

// ---- greedy (PipeTransformer's walk) ---------------------------------------------------------

TEST(PartitionLayers, GreedyReproducesThePipeTransformerLog) {
  // The reference's own log for ViT-B/16 (pipe/log/vision_transformer_12_layers.log,
  // "freeze layer number = 0"): sizes [0.742656, 12 x (2.363904, 4.723968), 0.001536,
  // 0.00769] M on 8 devices gave {4, 2, 3, 3, 3, 3, 4, 5} sub-layers per device, largest
  // 14.175744 M. Here in parameters, as ParameterCosts gives them.
  const std::vector<double> sizes = VitBaseUnits();
  const Partition p = *PartitionLayers(sizes, 8, Strategy::kGreedy);
  EXPECT_EQ(p.boundaries, (std::vector<int>{0, 4, 6, 9, 12, 15, 18, 22, 27}));
  EXPECT_EQ(p.stage_costs, (std::vector<double>{10194432, 7087872, 11811840, 9451776, 11811840,
                                                9451776, 14175744, 11821066}));
  EXPECT_EQ(p.max_cost, 14175744);
  // Same walk on 4 and 2 devices: {7, 6, 6, 8} and {13, 14}.
  EXPECT_EQ(Boundaries(sizes, 4, Strategy::kGreedy), (std::vector<int>{0, 7, 13, 19, 27}));
  EXPECT_EQ(Boundaries(sizes, 2, Strategy::kGreedy), (std::vector<int>{0, 13, 27}));
}

TEST(PartitionLayers, GreedyUnderfillsEarlyStagesAndOverloadsTheLast) {
  // Six equal layers (1 M each), K = 3: the variance is 0 and the test is strict, so device
  // 0 stops below the mean 2 (1 layer), device 1 below 5 / 2 (2 layers), and the last takes
  // the remaining 3: largest 3 M where the optimum is 2 M.
  std::vector<double> equal(6, 1e6);
  const Partition greedy = *PartitionLayers(equal, 3, Strategy::kGreedy);
  EXPECT_EQ(greedy.boundaries, (std::vector<int>{0, 1, 3, 6}));
  EXPECT_EQ(greedy.max_cost, 3e6);
  EXPECT_EQ(PartitionLayers(equal, 3)->max_cost, 2e6);
  // 1..6 M on 4 devices. Device 0: mean 21/4, var(1..6)/4 = 35/48: threshold 5.979, takes
  // 1 + 2 = 3 (not + 3). Device 1: 18/3 + var(3..6)/3 = 6.417, takes 3 (not + 4). Device 2:
  // 15/2 + var(4, 5, 6)/2 = 7.833, takes 4 (not + 5). The last takes 5 + 6 = 11.
  const Partition ramp = *PartitionLayers({1e6, 2e6, 3e6, 4e6, 5e6, 6e6}, 4, Strategy::kGreedy);
  EXPECT_EQ(ramp.boundaries, (std::vector<int>{0, 2, 3, 4, 6}));
  EXPECT_EQ(ramp.stage_costs, (std::vector<double>{3e6, 3e6, 4e6, 11e6}));
  EXPECT_EQ(PartitionLayers({1e6, 2e6, 3e6, 4e6, 5e6, 6e6}, 4)->max_cost, 6e6);
}

TEST(PartitionLayers, GreedyLeavesStagesEmpty) {
  // 0.9 M then two 0.05 M layers on 3 devices. Device 0: threshold 1/3 + var/3 = 0.387 <
  // 0.9: empty. Device 1: 1/2 + var/2 = 0.580 < 0.9: empty. The last takes all three.
  const Partition p = *PartitionLayers({900000, 50000, 50000}, 3, Strategy::kGreedy);
  EXPECT_EQ(p.boundaries, (std::vector<int>{0, 0, 0, 3}));
  EXPECT_TRUE(p.has_empty_stage());
  EXPECT_EQ(p.max_cost, 1e6);
  // A large variance lets device 0 swallow everything: {10, 1, 1, 1} M on 2 devices has
  // threshold 13/2 + 15.1875/2 = 14.09 > 13, so device 1 is left empty.
  EXPECT_EQ(Boundaries({10e6, 1e6, 1e6, 1e6}, 2, Strategy::kGreedy), (std::vector<int>{0, 4, 4}));
  // More devices than layers: the equal layers exceed each mean, only the last is used.
  EXPECT_EQ(Boundaries({5e6, 5e6}, 4, Strategy::kGreedy), (std::vector<int>{0, 0, 0, 0, 2}));
}

TEST(PartitionLayers, GreedyDependsOnTheUnitsAsTheReferenceDid) {
  // The threshold adds a variance (units^2) to a mean (units): the walk is done in millions
  // of parameters, as the reference measured. The same proportions in single parameters
  // give a negligible variance, and device 0 (threshold 6.5) cannot take the 10.
  EXPECT_EQ(Boundaries({10, 1, 1, 1}, 2, Strategy::kGreedy), (std::vector<int>{0, 0, 4}));
  EXPECT_EQ(Boundaries({10e6, 1e6, 1e6, 1e6}, 2, Strategy::kGreedy), (std::vector<int>{0, 4, 4}));
}

TEST(PartitionLayers, OptimalNeverWorseThanGreedyOrEven) {
  std::mt19937_64 rng(99);
  for (int round = 0; round < 200; ++round) {
    const int layers = std::uniform_int_distribution<int>(1, 40)(rng);
    const int stages = std::uniform_int_distribution<int>(1, layers)(rng);
    std::vector<double> costs = RandomCosts(rng, layers, round % 6);
    for (double& c : costs) c *= 1e6;
    const double optimal = PartitionLayers(costs, stages)->max_cost;
    EXPECT_LE(optimal, PartitionLayers(costs, stages, Strategy::kGreedy)->max_cost);
    EXPECT_LE(optimal, PartitionLayers(costs, stages, Strategy::kEven)->max_cost);
  }
}

}  // namespace
}  // namespace pipe
}  // namespace weft
