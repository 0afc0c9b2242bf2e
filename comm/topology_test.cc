#include "comm/topology.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace weft {
namespace {

using Ranks = std::vector<int>;

Topology Make(StatusOr<Topology> topo) {
  EXPECT_TRUE(topo.ok()) << topo.status();
  return topo.ok() ? *std::move(topo) : Topology();
}

void ExpectRowsSumToOne(const Topology& topo) {
  for (int i = 0; i < topo.size(); ++i) {
    double sum = 0;
    for (int j = 0; j < topo.size(); ++j) sum += topo.weight(i, j);
    EXPECT_NEAR(sum, 1.0, 1e-12) << "row " << i;
  }
}

void ExpectColumnsSumToOne(const Topology& topo) {
  for (int j = 0; j < topo.size(); ++j) {
    double sum = 0;
    for (int i = 0; i < topo.size(); ++i) sum += topo.weight(i, j);
    EXPECT_NEAR(sum, 1.0, 1e-12) << "column " << j;
  }
}

// Out- and in-neighbor lists must be sorted, self-free, and mirror each other exactly.
void ExpectConsistentAdjacency(const Topology& topo) {
  const int n = topo.size();
  for (int i = 0; i < n; ++i) {
    const Ranks& out = topo.out_neighbors(i);
    EXPECT_TRUE(std::is_sorted(out.begin(), out.end()));
    EXPECT_TRUE(std::is_sorted(topo.in_neighbors(i).begin(), topo.in_neighbors(i).end()));
    for (int j = 0; j < n; ++j) {
      const bool in_out = std::count(out.begin(), out.end(), j) == 1;
      const Ranks& in = topo.in_neighbors(j);
      EXPECT_EQ(in_out, std::count(in.begin(), in.end(), i) == 1) << i << " -> " << j;
      EXPECT_EQ(in_out, topo.has_edge(i, j)) << i << " -> " << j;
      EXPECT_EQ(in_out, i != j && topo.weight(i, j) != 0) << i << " -> " << j;
    }
  }
}

void ExpectInvalid(const Status& status, const std::string& fragment) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(fragment), std::string::npos)
      << "'" << status.message() << "' lacks '" << fragment << "'";
}

// ---------------------------------------------------------------------------------------
// Topology basics.

TEST(Topology, NewTopologyHasSelfWeightOneAndNoEdges) {
  Topology topo(3);
  EXPECT_EQ(topo.size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(topo.self_weight(i), 1.0);
    EXPECT_DOUBLE_EQ(topo.weight(i, i), 1.0);
    EXPECT_TRUE(topo.out_neighbors(i).empty());
    EXPECT_TRUE(topo.in_neighbors(i).empty());
  }
  EXPECT_EQ(Topology().size(), 0);
}

TEST(Topology, AddEdgeKeepsNeighborListsSortedAndReweights) {
  Topology topo(5);
  ASSERT_TRUE(topo.AddEdge(0, 4, 0.1).ok());
  ASSERT_TRUE(topo.AddEdge(0, 2, 0.2).ok());
  ASSERT_TRUE(topo.AddEdge(0, 3, 0.3).ok());
  ASSERT_TRUE(topo.AddEdge(3, 2, 0.4).ok());
  ASSERT_TRUE(topo.AddEdge(1, 2, 0.5).ok());
  EXPECT_EQ(topo.out_neighbors(0), (Ranks{2, 3, 4}));
  EXPECT_EQ(topo.in_neighbors(2), (Ranks{0, 1, 3}));
  EXPECT_DOUBLE_EQ(topo.weight(0, 2), 0.2);
  EXPECT_DOUBLE_EQ(topo.weight(2, 0), 0.0);  // edges are directed
  EXPECT_FALSE(topo.has_edge(2, 0));

  ASSERT_TRUE(topo.AddEdge(0, 2, 0.7).ok());
  EXPECT_DOUBLE_EQ(topo.weight(0, 2), 0.7);
  EXPECT_EQ(topo.out_neighbors(0), (Ranks{2, 3, 4}));
  EXPECT_EQ(topo.in_neighbors(2), (Ranks{0, 1, 3}));

  ASSERT_TRUE(topo.SetSelfWeight(2, 0.25).ok());
  EXPECT_DOUBLE_EQ(topo.weight(2, 2), 0.25);
  EXPECT_FALSE(topo.has_edge(2, 2));
  ExpectConsistentAdjacency(topo);
}

TEST(Topology, AddEdgeRejectsBadRanksSelfLoopsAndBadWeights) {
  Topology topo(3);
  ExpectInvalid(topo.AddEdge(0, 3, 1.0), "[0, 3)");
  ExpectInvalid(topo.AddEdge(-1, 1, 1.0), "got -1 -> 1");
  ExpectInvalid(topo.AddEdge(1, 1, 1.0), "self loop");
  ExpectInvalid(topo.AddEdge(0, 1, -0.5), "non-negative");
  ExpectInvalid(topo.AddEdge(0, 1, std::nan("")), "finite");
  ExpectInvalid(topo.SetSelfWeight(3, 1.0), "[0, 3)");
  ExpectInvalid(topo.SetSelfWeight(0, std::numeric_limits<double>::infinity()), "finite");
  EXPECT_TRUE(topo.out_neighbors(0).empty());
  EXPECT_DOUBLE_EQ(topo.self_weight(0), 1.0);
}

TEST(Topology, WeightMatrixRoundTrip) {
  const std::vector<std::vector<double>> w = {
      {0.5, 0.5, 0.0},
      {0.0, 0.2, 0.8},
      {0.1, 0.3, 0.6},
  };
  Topology topo = Make(Topology::FromWeightMatrix(w));
  EXPECT_EQ(topo.size(), 3);
  EXPECT_EQ(topo.ToWeightMatrix(), w);
  EXPECT_EQ(topo.out_neighbors(0), (Ranks{1}));
  EXPECT_EQ(topo.out_neighbors(1), (Ranks{2}));
  EXPECT_EQ(topo.out_neighbors(2), (Ranks{0, 1}));
  EXPECT_EQ(topo.in_neighbors(0), (Ranks{2}));
  EXPECT_EQ(topo.in_neighbors(1), (Ranks{0, 2}));
  EXPECT_EQ(topo.in_neighbors(2), (Ranks{1}));
  EXPECT_FALSE(topo.has_edge(0, 2));  // an explicit zero is no edge
  ExpectConsistentAdjacency(topo);
}

TEST(Topology, FromWeightMatrixErrors) {
  ExpectInvalid(Topology::FromWeightMatrix({}).status(), "empty");
  ExpectInvalid(Topology::FromWeightMatrix({{1.0, 0.0}, {1.0}}).status(), "row 1 has 1");
  ExpectInvalid(Topology::FromWeightMatrix({{1.0, 0.0}, {0.0, 1.0, 0.0}}).status(), "row 1 has 3");
  ExpectInvalid(Topology::FromWeightMatrix({{1.0, 0.0, 0.0}}).status(), "square 1x1");
  ExpectInvalid(Topology::FromWeightMatrix({{1.0, -0.1}, {0.0, 1.0}}).status(), "w[0][1]");
  ExpectInvalid(Topology::FromWeightMatrix({{1.0, 0.0}, {0.0, -1.0}}).status(), "w[1][1]");
  ExpectInvalid(Topology::FromWeightMatrix({{1.0, std::nan("")}, {0.0, 1.0}}).status(), "w[0][1]");
  ExpectInvalid(
      Topology::FromWeightMatrix({{1.0, 0.0}, {std::numeric_limits<double>::infinity(), 1.0}})
          .status(),
      "w[1][0]");
}

TEST(Topology, RecvWeightsAreTheColumnAndSendWeightsTheRow) {
  const std::vector<std::vector<double>> w = {
      {0.5, 0.5, 0.0},
      {0.0, 0.2, 0.8},
      {0.1, 0.3, 0.6},
  };
  Topology topo = Make(Topology::FromWeightMatrix(w));
  RecvWeights recv = GetRecvWeights(topo, 1);
  EXPECT_DOUBLE_EQ(recv.self_weight, 0.2);
  EXPECT_EQ(recv.neighbor_weights, (std::map<int, double>{{0, 0.5}, {2, 0.3}}));
  RecvWeights send = GetSendWeights(topo, 1);
  EXPECT_DOUBLE_EQ(send.self_weight, 0.2);
  EXPECT_EQ(send.neighbor_weights, (std::map<int, double>{{2, 0.8}}));

  Topology star = Make(StarGraph(4, 0));
  recv = GetRecvWeights(star, 0);
  EXPECT_DOUBLE_EQ(recv.self_weight, 0.25);
  EXPECT_EQ(recv.neighbor_weights, (std::map<int, double>{{1, 0.25}, {2, 0.25}, {3, 0.25}}));
  recv = GetRecvWeights(star, 3);
  EXPECT_DOUBLE_EQ(recv.self_weight, 0.75);
  EXPECT_EQ(recv.neighbor_weights, (std::map<int, double>{{0, 0.25}}));
}

// ---------------------------------------------------------------------------------------
// Generators.

TEST(ExponentialGraph, SmallSizes) {
  Topology one = Make(ExponentialGraph(1));
  EXPECT_EQ(one.size(), 1);
  EXPECT_DOUBLE_EQ(one.self_weight(0), 1.0);
  EXPECT_TRUE(one.out_neighbors(0).empty());

  Topology two = Make(ExponentialGraph(2));
  EXPECT_EQ(two.out_neighbors(0), (Ranks{1}));
  EXPECT_EQ(two.out_neighbors(1), (Ranks{0}));
  EXPECT_DOUBLE_EQ(two.weight(0, 1), 0.5);
  EXPECT_DOUBLE_EQ(two.self_weight(1), 0.5);

  Topology four = Make(ExponentialGraph(4));
  EXPECT_EQ(four.out_neighbors(0), (Ranks{1, 2}));
  EXPECT_EQ(four.in_neighbors(0), (Ranks{2, 3}));
  EXPECT_EQ(four.out_neighbors(3), (Ranks{0, 1}));
  EXPECT_DOUBLE_EQ(four.weight(3, 1), 1.0 / 3);
  EXPECT_DOUBLE_EQ(four.self_weight(3), 1.0 / 3);
  EXPECT_DOUBLE_EQ(four.weight(3, 2), 0.0);

  Topology five = Make(ExponentialGraph(5));
  EXPECT_EQ(five.out_neighbors(0), (Ranks{1, 2, 4}));
  EXPECT_EQ(five.in_neighbors(0), (Ranks{1, 3, 4}));
  EXPECT_DOUBLE_EQ(five.weight(0, 4), 0.25);

  Topology eight = Make(ExponentialGraph(8));
  EXPECT_EQ(eight.out_neighbors(3), (Ranks{4, 5, 7}));
  EXPECT_EQ(eight.in_neighbors(3), (Ranks{1, 2, 7}));
  EXPECT_DOUBLE_EQ(eight.weight(3, 7), 0.25);
  EXPECT_DOUBLE_EQ(eight.self_weight(3), 0.25);

  Topology sixteen = Make(ExponentialGraph(16));
  EXPECT_EQ(sixteen.out_neighbors(10), (Ranks{2, 11, 12, 14}));
  EXPECT_EQ(sixteen.in_neighbors(0), (Ranks{8, 12, 14, 15}));
  EXPECT_DOUBLE_EQ(sixteen.weight(10, 2), 0.2);

  for (int n : {1, 2, 3, 4, 5, 7, 8, 16, 31, 33}) {
    Topology topo = Make(ExponentialGraph(n));
    SCOPED_TRACE(n);
    ExpectRowsSumToOne(topo);
    ExpectColumnsSumToOne(topo);  // circulant with equal weights
    ExpectConsistentAdjacency(topo);
    EXPECT_TRUE(IsRegular(topo));
  }
}

TEST(ExponentialGraph, ExactPowersAreIncluded) {
  // 3^5 = 243 < 244: a floating-point log(243)/log(3) just below 5 would drop this offset.
  Topology t = Make(ExponentialGraph(244, 3));
  EXPECT_EQ(t.out_neighbors(0), (Ranks{1, 3, 9, 27, 81, 243}));
  EXPECT_TRUE(t.has_edge(1, 0));  // 1 + 243 == 244 == 0 (mod 244)
  EXPECT_DOUBLE_EQ(t.weight(0, 243), 1.0 / 7);
  EXPECT_DOUBLE_EQ(t.self_weight(100), 1.0 / 7);
  ExpectRowsSumToOne(t);
  EXPECT_TRUE(IsRegular(t));

  // 243 is not below 243: the offset stops at 81.
  Topology below = Make(ExponentialGraph(243, 3));
  EXPECT_EQ(below.out_neighbors(0), (Ranks{1, 3, 9, 27, 81}));

  // 10^3 = 1000 < 1001.
  Topology ten = Make(ExponentialGraph(1001, 10));
  EXPECT_EQ(ten.out_neighbors(0), (Ranks{1, 10, 100, 1000}));
  EXPECT_EQ(ten.out_neighbors(5), (Ranks{4, 6, 15, 105}));
  EXPECT_DOUBLE_EQ(ten.weight(5, 4), 0.2);
  ExpectRowsSumToOne(ten);
  Topology ten_below = Make(ExponentialGraph(1000, 10));
  EXPECT_EQ(ten_below.out_neighbors(0), (Ranks{1, 10, 100}));
}

TEST(ExponentialGraph, TwoIsTheBaseTwoCase) {
  for (int n : {1, 2, 5, 8, 13}) {
    Topology a = Make(ExponentialTwoGraph(n));
    Topology b = Make(ExponentialGraph(n, 2));
    EXPECT_EQ(a.ToWeightMatrix(), b.ToWeightMatrix()) << n;
  }
}

TEST(ExponentialGraph, InvalidArguments) {
  ExpectInvalid(ExponentialGraph(0).status(), "at least 1 rank, got 0");
  ExpectInvalid(ExponentialGraph(-3).status(), "got -3");
  ExpectInvalid(ExponentialGraph(8, 1).status(), "base must be at least 2, got 1");
  ExpectInvalid(ExponentialTwoGraph(0).status(), "at least 1");
  ExpectInvalid(SymmetricExponentialGraph(0).status(), "at least 1");
  ExpectInvalid(SymmetricExponentialGraph(8, 0).status(), "base must be at least 2, got 0");
}

TEST(SymmetricExponentialGraph, EdgesAndWeights) {
  Topology one = Make(SymmetricExponentialGraph(1));
  EXPECT_TRUE(one.out_neighbors(0).empty());
  EXPECT_DOUBLE_EQ(one.self_weight(0), 1.0);

  Topology two = Make(SymmetricExponentialGraph(2));  // +1 and -1 coincide
  EXPECT_EQ(two.out_neighbors(0), (Ranks{1}));
  EXPECT_DOUBLE_EQ(two.weight(0, 1), 0.5);

  Topology four = Make(SymmetricExponentialGraph(4));
  EXPECT_EQ(four.out_neighbors(0), (Ranks{1, 3}));
  EXPECT_DOUBLE_EQ(four.weight(0, 3), 1.0 / 3);

  Topology five = Make(SymmetricExponentialGraph(5));  // +-1, +-4 = {1, 4}
  EXPECT_EQ(five.out_neighbors(0), (Ranks{1, 4}));
  EXPECT_DOUBLE_EQ(five.self_weight(2), 1.0 / 3);

  Topology eight = Make(SymmetricExponentialGraph(8));  // +4 == -4
  EXPECT_EQ(eight.out_neighbors(0), (Ranks{1, 4, 7}));
  EXPECT_EQ(eight.out_neighbors(6), (Ranks{2, 5, 7}));
  EXPECT_DOUBLE_EQ(eight.weight(6, 2), 0.25);

  Topology sixteen = Make(SymmetricExponentialGraph(16));
  EXPECT_EQ(sixteen.out_neighbors(0), (Ranks{1, 4, 12, 15}));
  EXPECT_DOUBLE_EQ(sixteen.weight(0, 12), 0.2);

  Topology twenty = Make(SymmetricExponentialGraph(20));  // +16 == -4 and -16 == +4
  EXPECT_EQ(twenty.out_neighbors(0), (Ranks{1, 4, 16, 19}));
  EXPECT_DOUBLE_EQ(twenty.self_weight(0), 0.2);

  // Distances around the ring, not offsets, are powers of the base: on 6 ranks offsets 2
  // and 4 are at distance 2, so only +-1 link; on 24, offset 16 is at distance 8.
  Topology six = Make(SymmetricExponentialGraph(6));
  EXPECT_EQ(six.out_neighbors(0), (Ranks{1, 5}));
  EXPECT_DOUBLE_EQ(six.weight(0, 5), 1.0 / 3);
  Topology twenty_four = Make(SymmetricExponentialGraph(24));
  EXPECT_EQ(twenty_four.out_neighbors(0), (Ranks{1, 4, 20, 23}));

  Topology base2 = Make(SymmetricExponentialGraph(8, 2));  // +-1, +-2, +-4
  EXPECT_EQ(base2.out_neighbors(0), (Ranks{1, 2, 4, 6, 7}));
  EXPECT_DOUBLE_EQ(base2.weight(0, 6), 1.0 / 6);

  for (int n : {1, 2, 3, 4, 5, 8, 16, 17, 20, 64}) {
    Topology topo = Make(SymmetricExponentialGraph(n));
    SCOPED_TRACE(n);
    ExpectRowsSumToOne(topo);
    ExpectConsistentAdjacency(topo);
    EXPECT_TRUE(IsRegular(topo));
    for (int i = 0; i < n; ++i) EXPECT_EQ(topo.out_neighbors(i), topo.in_neighbors(i));
  }
}

TEST(MeshGrid2DGraph, DefaultShapes) {
  Topology one = Make(MeshGrid2DGraph(1));
  EXPECT_DOUBLE_EQ(one.self_weight(0), 1.0);
  EXPECT_TRUE(one.out_neighbors(0).empty());

  Topology two = Make(MeshGrid2DGraph(2));  // 1 x 2
  EXPECT_EQ(two.out_neighbors(0), (Ranks{1}));
  EXPECT_DOUBLE_EQ(two.weight(0, 1), 0.5);
  EXPECT_DOUBLE_EQ(two.self_weight(0), 0.5);

  Topology four = Make(MeshGrid2DGraph(4));  // 2 x 2: degree 2 everywhere
  EXPECT_EQ(four.out_neighbors(0), (Ranks{1, 2}));
  EXPECT_EQ(four.out_neighbors(3), (Ranks{1, 2}));
  EXPECT_FALSE(four.has_edge(0, 3));
  EXPECT_DOUBLE_EQ(four.weight(0, 1), 1.0 / 3);
  EXPECT_DOUBLE_EQ(four.self_weight(0), 1.0 / 3);

  Topology five = Make(MeshGrid2DGraph(5));  // prime: a 1 x 5 path
  EXPECT_EQ(five.out_neighbors(0), (Ranks{1}));
  EXPECT_EQ(five.out_neighbors(2), (Ranks{1, 3}));
  EXPECT_DOUBLE_EQ(five.weight(0, 1), 1.0 / 3);  // max(1 + 1, 2 + 1)
  EXPECT_DOUBLE_EQ(five.weight(1, 2), 1.0 / 3);
  EXPECT_DOUBLE_EQ(five.self_weight(0), 2.0 / 3);
  EXPECT_DOUBLE_EQ(five.self_weight(2), 1.0 / 3);

  // 2 x 4: corners 0, 3, 4, 7 have degree 2, the rest degree 3.
  Topology eight = Make(MeshGrid2DGraph(8));
  EXPECT_EQ(eight.out_neighbors(0), (Ranks{1, 4}));
  EXPECT_EQ(eight.out_neighbors(1), (Ranks{0, 2, 5}));
  EXPECT_EQ(eight.in_neighbors(6), (Ranks{2, 5, 7}));
  EXPECT_DOUBLE_EQ(eight.weight(0, 1), 0.25);
  EXPECT_DOUBLE_EQ(eight.weight(0, 4), 1.0 / 3);
  EXPECT_DOUBLE_EQ(eight.self_weight(0), 5.0 / 12);
  EXPECT_DOUBLE_EQ(eight.weight(1, 2), 0.25);
  EXPECT_NEAR(eight.self_weight(1), 0.25, 1e-15);
  EXPECT_FALSE(IsRegular(eight));

  Topology twelve = Make(MeshGrid2DGraph(12));  // 3 x 4
  EXPECT_EQ(twelve.out_neighbors(5), (Ranks{1, 4, 6, 9}));

  Topology sixteen = Make(MeshGrid2DGraph(16));  // 4 x 4
  EXPECT_EQ(sixteen.out_neighbors(5), (Ranks{1, 4, 6, 9}));
  EXPECT_DOUBLE_EQ(sixteen.weight(5, 1), 0.2);
  EXPECT_DOUBLE_EQ(sixteen.weight(5, 6), 0.2);
  EXPECT_NEAR(sixteen.self_weight(5), 0.2, 1e-15);
  EXPECT_DOUBLE_EQ(sixteen.weight(0, 1), 0.25);
  EXPECT_DOUBLE_EQ(sixteen.self_weight(0), 0.5);

  for (int n : {1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 30}) {
    Topology topo = Make(MeshGrid2DGraph(n));
    SCOPED_TRACE(n);
    ExpectRowsSumToOne(topo);
    ExpectColumnsSumToOne(topo);
    ExpectConsistentAdjacency(topo);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) EXPECT_DOUBLE_EQ(topo.weight(i, j), topo.weight(j, i));
    }
  }
}

TEST(MeshGrid2DGraph, GivenShape) {
  Topology tall = Make(MeshGrid2DGraph(8, std::make_pair(4, 2)));  // rank = r * 2 + c
  EXPECT_EQ(tall.out_neighbors(0), (Ranks{1, 2}));
  EXPECT_EQ(tall.out_neighbors(3), (Ranks{1, 2, 5}));
  EXPECT_FALSE(tall.has_edge(1, 2));  // row ends do not wrap
  ExpectRowsSumToOne(tall);

  Topology line = Make(MeshGrid2DGraph(4, std::make_pair(4, 1)));
  EXPECT_EQ(line.out_neighbors(1), (Ranks{0, 2}));

  ExpectInvalid(MeshGrid2DGraph(8, std::make_pair(3, 3)).status(), "got (3, 3)");
  ExpectInvalid(MeshGrid2DGraph(8, std::make_pair(0, 8)).status(), "rows * cols == size 8");
  ExpectInvalid(MeshGrid2DGraph(8, std::make_pair(-2, -4)).status(), "positive");
  ExpectInvalid(MeshGrid2DGraph(0).status(), "at least 1");
}

TEST(StarGraph, WeightsAndStochasticity) {
  Topology one = Make(StarGraph(1));
  EXPECT_DOUBLE_EQ(one.self_weight(0), 1.0);
  EXPECT_TRUE(one.out_neighbors(0).empty());

  Topology two = Make(StarGraph(2));
  EXPECT_EQ(two.out_neighbors(0), (Ranks{1}));
  EXPECT_EQ(two.out_neighbors(1), (Ranks{0}));
  EXPECT_DOUBLE_EQ(two.self_weight(1), 0.5);
  EXPECT_TRUE(IsRegular(two));

  Topology four = Make(StarGraph(4));
  EXPECT_EQ(four.out_neighbors(0), (Ranks{1, 2, 3}));
  EXPECT_EQ(four.in_neighbors(0), (Ranks{1, 2, 3}));
  EXPECT_EQ(four.out_neighbors(2), (Ranks{0}));
  EXPECT_EQ(four.in_neighbors(2), (Ranks{0}));
  EXPECT_DOUBLE_EQ(four.self_weight(0), 0.25);
  EXPECT_DOUBLE_EQ(four.weight(0, 3), 0.25);
  EXPECT_DOUBLE_EQ(four.weight(3, 0), 0.25);
  EXPECT_DOUBLE_EQ(four.self_weight(3), 0.75);
  EXPECT_FALSE(four.has_edge(1, 2));
  EXPECT_FALSE(IsRegular(four));

  Topology five = Make(StarGraph(5, 2));
  EXPECT_EQ(five.out_neighbors(2), (Ranks{0, 1, 3, 4}));
  EXPECT_EQ(five.out_neighbors(4), (Ranks{2}));
  EXPECT_DOUBLE_EQ(five.self_weight(2), 0.2);
  EXPECT_DOUBLE_EQ(five.self_weight(0), 0.8);
  EXPECT_DOUBLE_EQ(five.weight(4, 2), 0.2);

  for (int n : {1, 2, 4, 5, 8, 16}) {
    for (int center : {0, n - 1, n / 2}) {
      Topology topo = Make(StarGraph(n, center));
      SCOPED_TRACE(testing::Message() << n << " center " << center);
      ExpectColumnsSumToOne(topo);
      ExpectRowsSumToOne(topo);
      ExpectConsistentAdjacency(topo);
    }
  }

  ExpectInvalid(StarGraph(4, 4).status(), "center must be in [0, 4), got 4");
  ExpectInvalid(StarGraph(4, -1).status(), "got -1");
  ExpectInvalid(StarGraph(0).status(), "at least 1");
}

TEST(RingGraph, Styles) {
  for (int style : {0, 1, 2}) {
    Topology one = Make(RingGraph(1, style));
    EXPECT_DOUBLE_EQ(one.self_weight(0), 1.0);
    EXPECT_TRUE(one.out_neighbors(0).empty());

    // Size 2: both directions are the same rank, so one edge each way with 1/2.
    Topology two = Make(RingGraph(2, style));
    EXPECT_EQ(two.out_neighbors(0), (Ranks{1}));
    EXPECT_EQ(two.out_neighbors(1), (Ranks{0}));
    EXPECT_DOUBLE_EQ(two.weight(0, 1), 0.5);
    EXPECT_DOUBLE_EQ(two.self_weight(0), 0.5);
  }

  Topology both = Make(RingGraph(5, 0));
  EXPECT_EQ(both.out_neighbors(0), (Ranks{1, 4}));
  EXPECT_EQ(both.in_neighbors(0), (Ranks{1, 4}));
  EXPECT_EQ(both.out_neighbors(2), (Ranks{1, 3}));
  EXPECT_DOUBLE_EQ(both.weight(0, 4), 1.0 / 3);
  EXPECT_DOUBLE_EQ(both.self_weight(0), 1.0 / 3);

  Topology left = Make(RingGraph(5, 1));
  EXPECT_EQ(left.out_neighbors(0), (Ranks{4}));
  EXPECT_EQ(left.in_neighbors(0), (Ranks{1}));
  EXPECT_EQ(left.out_neighbors(3), (Ranks{2}));
  EXPECT_DOUBLE_EQ(left.weight(3, 2), 0.5);
  EXPECT_DOUBLE_EQ(left.self_weight(3), 0.5);

  Topology right = Make(RingGraph(5, 2));
  EXPECT_EQ(right.out_neighbors(0), (Ranks{1}));
  EXPECT_EQ(right.in_neighbors(0), (Ranks{4}));
  EXPECT_DOUBLE_EQ(right.weight(4, 0), 0.5);

  for (int n : {1, 2, 3, 4, 5, 8, 16}) {
    for (int style : {0, 1, 2}) {
      Topology topo = Make(RingGraph(n, style));
      SCOPED_TRACE(testing::Message() << n << " style " << style);
      ExpectRowsSumToOne(topo);
      ExpectColumnsSumToOne(topo);
      ExpectConsistentAdjacency(topo);
      EXPECT_TRUE(IsRegular(topo));
    }
  }

  ExpectInvalid(RingGraph(4, 3).status(), "got 3");
  ExpectInvalid(RingGraph(4, -1).status(), "style must be 0");
  ExpectInvalid(RingGraph(0).status(), "at least 1");
}

TEST(FullyConnectedGraph, EqualWeightsEverywhere) {
  for (int n : {1, 2, 4, 5, 8, 16}) {
    Topology topo = Make(FullyConnectedGraph(n));
    SCOPED_TRACE(n);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(static_cast<int>(topo.out_neighbors(i).size()), n - 1);
      for (int j = 0; j < n; ++j) EXPECT_DOUBLE_EQ(topo.weight(i, j), 1.0 / n);
    }
    EXPECT_TRUE(IsRegular(topo));
    ExpectConsistentAdjacency(topo);
  }
  ExpectInvalid(FullyConnectedGraph(0).status(), "FullyConnectedGraph");
}

// ---------------------------------------------------------------------------------------
// Graph comparisons.

TEST(Topology, IsRegular) {
  EXPECT_TRUE(IsRegular(Make(ExponentialGraph(8))));
  EXPECT_TRUE(IsRegular(Make(ExponentialGraph(244, 3))));
  EXPECT_TRUE(IsRegular(Make(RingGraph(6, 1))));
  EXPECT_TRUE(IsRegular(Topology(3)));
  EXPECT_FALSE(IsRegular(Make(StarGraph(5))));
  EXPECT_FALSE(IsRegular(Make(MeshGrid2DGraph(9))));

  // Same out-degree everywhere but uneven in-degree: 0 -> 1, 1 -> 0, 2 -> 0.
  Topology uneven(3);
  ASSERT_TRUE(uneven.AddEdge(0, 1, 0.5).ok());
  ASSERT_TRUE(uneven.AddEdge(1, 0, 0.5).ok());
  ASSERT_TRUE(uneven.AddEdge(2, 0, 0.5).ok());
  EXPECT_FALSE(IsRegular(uneven));
}

TEST(Topology, IsEquivalentIgnoresWeights) {
  EXPECT_TRUE(IsEquivalent(Make(ExponentialTwoGraph(8)), Make(ExponentialGraph(8, 2))));
  // Both are 0 -> {1, 3} circulants on 4 ranks.
  EXPECT_TRUE(IsEquivalent(Make(RingGraph(4, 0)), Make(SymmetricExponentialGraph(4))));
  EXPECT_TRUE(IsEquivalent(Make(RingGraph(3, 0)), Make(FullyConnectedGraph(3))));

  Topology reweighted = Make(ExponentialGraph(8));
  ASSERT_TRUE(reweighted.AddEdge(0, 1, 0.9).ok());
  ASSERT_TRUE(reweighted.SetSelfWeight(0, 0.01).ok());
  EXPECT_TRUE(IsEquivalent(reweighted, Make(ExponentialGraph(8))));

  EXPECT_FALSE(IsEquivalent(Make(ExponentialGraph(4)), Make(FullyConnectedGraph(4))));
  EXPECT_FALSE(IsEquivalent(Make(RingGraph(5, 1)), Make(RingGraph(5, 2))));
  EXPECT_FALSE(IsEquivalent(Topology(3), Topology(4)));
  EXPECT_FALSE(IsEquivalent(Make(ExponentialGraph(8)), Make(ExponentialGraph(9))));
}

TEST(Topology, FingerprintFollowsEquivalence) {
  const std::vector<std::function<StatusOr<Topology>()>> makers = {
      [] { return ExponentialGraph(8); },
      [] { return ExponentialGraph(8, 3); },
      [] { return SymmetricExponentialGraph(8); },
      [] { return MeshGrid2DGraph(8); },
      [] { return StarGraph(8); },
      [] { return StarGraph(8, 3); },
      [] { return RingGraph(8, 0); },
      [] { return RingGraph(8, 1); },
      [] { return RingGraph(8, 2); },
      [] { return FullyConnectedGraph(8); },
      [] { return RingGraph(9, 0); },
      [] { return StatusOr<Topology>(Topology(8)); },
      [] { return StatusOr<Topology>(Topology(9)); },
  };
  std::vector<Topology> graphs;
  for (const auto& make : makers) graphs.push_back(Make(make()));
  for (size_t a = 0; a < graphs.size(); ++a) {
    // Deterministic: rebuilding gives the same value.
    EXPECT_EQ(graphs[a].AdjacencyFingerprint(), Make(makers[a]()).AdjacencyFingerprint());
    for (size_t b = 0; b < graphs.size(); ++b) {
      EXPECT_EQ(IsEquivalent(graphs[a], graphs[b]),
                graphs[a].AdjacencyFingerprint() == graphs[b].AdjacencyFingerprint())
          << a << " vs " << b;
    }
  }

  Topology reweighted = Make(RingGraph(4, 0));
  ASSERT_TRUE(reweighted.AddEdge(0, 1, 0.7).ok());
  EXPECT_EQ(reweighted.AdjacencyFingerprint(),
            Make(SymmetricExponentialGraph(4)).AdjacencyFingerprint());

  // Golden values pin the byte layout (each of size, from, to as 8 little-endian bytes),
  // so every process and platform agrees.
  EXPECT_EQ(Topology(1).AdjacencyFingerprint(), 0x89cd31291d2aefa4ull);
  EXPECT_EQ(Make(RingGraph(3, 2)).AdjacencyFingerprint(), 0x8f399886fb3cf646ull);
}

// ---------------------------------------------------------------------------------------
// Dynamic schedules.

using ScheduleFactory = std::function<StatusOr<std::unique_ptr<DynamicSchedule>>(int rank)>;

// Runs every rank's schedule side by side and checks, at each step, that what r expects
// to receive is exactly the set of ranks that send to r, and that nobody talks to itself.
void ExpectSchedulesAgree(int world, const ScheduleFactory& make, int steps) {
  std::vector<std::unique_ptr<DynamicSchedule>> schedules;
  for (int r = 0; r < world; ++r) {
    auto schedule = make(r);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    schedules.push_back(*std::move(schedule));
  }
  for (int step = 0; step < steps; ++step) {
    std::vector<SendRecvRanks> now;
    for (auto& schedule : schedules) now.push_back(schedule->Next());
    std::vector<std::set<int>> senders(world);
    for (int i = 0; i < world; ++i) {
      const Ranks& send = now[i].send_ranks;
      EXPECT_TRUE(std::is_sorted(send.begin(), send.end()));
      EXPECT_EQ(std::set<int>(send.begin(), send.end()).size(), send.size());
      for (int j : send) {
        ASSERT_TRUE(j >= 0 && j < world) << "rank " << i << " sends to " << j;
        EXPECT_NE(j, i) << "step " << step;
        senders[j].insert(i);
      }
    }
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(now[r].recv_ranks, Ranks(senders[r].begin(), senders[r].end()))
          << "step " << step << " rank " << r;
    }
  }
}

std::vector<SendRecvRanks> Steps(StatusOr<std::unique_ptr<DynamicSchedule>> schedule, int count) {
  std::vector<SendRecvRanks> steps;
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  if (!schedule.ok()) return steps;
  for (int k = 0; k < count; ++k) steps.push_back((*schedule)->Next());
  return steps;
}

void ExpectStep(const SendRecvRanks& step, const Ranks& send, const Ranks& recv) {
  EXPECT_EQ(step.send_ranks, send);
  EXPECT_EQ(step.recv_ranks, recv);
}

TEST(OnePeerSchedule, ExponentialGraphSteps) {
  // Rank 0's targets in clockwise order: 1, 2, 4. Every rank uses the same offset at the
  // same step, so 0 hears from 0 - offset.
  auto steps = Steps(OnePeerSchedule(Make(ExponentialGraph(8)), 0), 4);
  ASSERT_EQ(steps.size(), 4u);
  ExpectStep(steps[0], {1}, {7});
  ExpectStep(steps[1], {2}, {6});
  ExpectStep(steps[2], {4}, {4});
  ExpectStep(steps[3], {1}, {7});
}

TEST(OnePeerSchedule, StarIsSortedClockwiseFromTheCenter) {
  Topology star = Make(StarGraph(5, 2));
  // Center 2's out-neighbors clockwise from 2: 3, 4, 0, 1. Leaves always send to 2.
  auto center = Steps(OnePeerSchedule(star, 2), 5);
  ASSERT_EQ(center.size(), 5u);
  ExpectStep(center[0], {3}, {0, 1, 3, 4});
  ExpectStep(center[1], {4}, {0, 1, 3, 4});
  ExpectStep(center[2], {0}, {0, 1, 3, 4});
  ExpectStep(center[3], {1}, {0, 1, 3, 4});
  ExpectStep(center[4], {3}, {0, 1, 3, 4});
  auto leaf = Steps(OnePeerSchedule(star, 0), 5);
  ASSERT_EQ(leaf.size(), 5u);
  ExpectStep(leaf[0], {2}, {});
  ExpectStep(leaf[2], {2}, {2});
  ExpectStep(leaf[3], {2}, {});
}

TEST(OnePeerSchedule, RanksWithoutOutNeighborsSendNothing) {
  Topology topo(3);
  ASSERT_TRUE(topo.AddEdge(1, 0, 0.5).ok());
  auto zero = Steps(OnePeerSchedule(topo, 0), 2);
  ASSERT_EQ(zero.size(), 2u);
  ExpectStep(zero[0], {}, {1});
  auto two = Steps(OnePeerSchedule(topo, 2), 2);
  ASSERT_EQ(two.size(), 2u);
  ExpectStep(two[1], {}, {});
}

TEST(OnePeerSchedule, AllRanksAgree) {
  const std::vector<std::vector<double>> irregular = {
      {1, 1, 1, 0, 1}, {0, 1, 0, 1, 0}, {1, 1, 1, 1, 1}, {0, 0, 0, 1, 0}, {1, 0, 1, 0, 1},
  };
  std::vector<Topology> topologies = {
      Make(ExponentialGraph(1)),
      Make(ExponentialGraph(2)),
      Make(ExponentialGraph(8)),
      Make(ExponentialGraph(12, 3)),
      Make(SymmetricExponentialGraph(16)),
      Make(MeshGrid2DGraph(8)),
      Make(MeshGrid2DGraph(12)),
      Make(StarGraph(5, 2)),
      Make(RingGraph(5, 0)),
      Make(RingGraph(6, 1)),
      Make(RingGraph(2, 0)),
      Make(FullyConnectedGraph(5)),
      Topology(3),
      Make(Topology::FromWeightMatrix(irregular)),
  };
  for (size_t t = 0; t < topologies.size(); ++t) {
    SCOPED_TRACE(testing::Message() << "topology " << t);
    const Topology& topo = topologies[t];
    ExpectSchedulesAgree(
        topo.size(), [&](int rank) { return OnePeerSchedule(topo, rank); }, 120);
  }
}

TEST(OnePeerSchedule, InvalidArguments) {
  Topology topo = Make(RingGraph(4));
  ExpectInvalid(OnePeerSchedule(topo, 4).status(), "rank must be in [0, 4), got 4");
  ExpectInvalid(OnePeerSchedule(topo, -1).status(), "got -1");
  ExpectInvalid(OnePeerSchedule(Topology(), 0).status(), "at least 1 rank");
}

TEST(MachineExponentialTwoSchedule, ExactSteps) {
  auto single = Steps(MachineExponentialTwoSchedule(1, 0), 3);
  ASSERT_EQ(single.size(), 3u);
  for (const auto& step : single) ExpectStep(step, {}, {});

  auto pair = Steps(MachineExponentialTwoSchedule(2, 0), 3);  // floor(log2 1) + 1 = 1
  ASSERT_EQ(pair.size(), 3u);
  for (const auto& step : pair) ExpectStep(step, {1}, {1});

  auto three = Steps(MachineExponentialTwoSchedule(3, 0), 3);  // distances 1, 2, 1
  ASSERT_EQ(three.size(), 3u);
  ExpectStep(three[0], {1}, {2});
  ExpectStep(three[1], {2}, {1});
  ExpectStep(three[2], {1}, {2});

  auto eight = Steps(MachineExponentialTwoSchedule(8, 0), 4);  // 1, 2, 4, 1
  ASSERT_EQ(eight.size(), 4u);
  ExpectStep(eight[0], {1}, {7});
  ExpectStep(eight[1], {2}, {6});
  ExpectStep(eight[2], {4}, {4});
  ExpectStep(eight[3], {1}, {7});

  auto five = Steps(MachineExponentialTwoSchedule(5, 3), 4);  // floor(log2 4) + 1 = 3
  ASSERT_EQ(five.size(), 4u);
  ExpectStep(five[0], {4}, {2});
  ExpectStep(five[1], {0}, {1});
  ExpectStep(five[2], {2}, {4});
  ExpectStep(five[3], {4}, {2});

  auto nine = Steps(MachineExponentialTwoSchedule(9, 0), 5);  // exact log2 8 = 3: 1..8
  ASSERT_EQ(nine.size(), 5u);
  ExpectStep(nine[3], {8}, {1});
  ExpectStep(nine[4], {1}, {8});
}

TEST(MachineExponentialTwoSchedule, AllMachinesAgree) {
  for (int machines = 1; machines <= 17; ++machines) {
    SCOPED_TRACE(machines);
    ExpectSchedulesAgree(
        machines, [&](int m) { return MachineExponentialTwoSchedule(machines, m); }, 40);
  }
}

TEST(MachineExponentialTwoSchedule, InvalidArguments) {
  ExpectInvalid(MachineExponentialTwoSchedule(0, 0).status(), "at least 1");
  ExpectInvalid(MachineExponentialTwoSchedule(4, 4).status(), "[0, 4), got 4");
  ExpectInvalid(MachineExponentialTwoSchedule(4, -1).status(), "got -1");
}

const std::vector<std::pair<int, int>> kShapes = {
    {1, 1}, {2, 1}, {5, 1},  {2, 2},  {4, 2},  {6, 2}, {3, 3},  {6, 3},  {9, 3},
    {4, 4}, {8, 4}, {12, 4}, {16, 4}, {20, 4}, {5, 5}, {18, 6}, {24, 8}, {40, 8},
};

TEST(InnerOuterRingSchedule, ExactSteps) {
  // Two machines of four. Step 0: local rank 0 is outer; 1, 2, 3 form the inner ring.
  auto r0 = Steps(InnerOuterRingSchedule(8, 4, 0), 5);
  auto r1 = Steps(InnerOuterRingSchedule(8, 4, 1), 2);
  auto r3 = Steps(InnerOuterRingSchedule(8, 4, 3), 2);
  ASSERT_EQ(r0.size(), 5u);
  ASSERT_EQ(r1.size(), 2u);
  ASSERT_EQ(r3.size(), 2u);
  ExpectStep(r0[0], {4}, {4});
  ExpectStep(r1[0], {2}, {3});
  ExpectStep(r3[0], {1}, {2});
  // Step 1: local rank 1 is outer; 0, 2, 3 form the inner ring.
  ExpectStep(r0[1], {2}, {3});
  ExpectStep(r1[1], {5}, {5});
  ExpectStep(r3[1], {0}, {2});
  ExpectStep(r0[4], {4}, {4});

  // Three machines: the outer ranks form a ring over machines.
  auto m1 = Steps(InnerOuterRingSchedule(12, 4, 4), 1);
  ASSERT_EQ(m1.size(), 1u);
  ExpectStep(m1[0], {8}, {0});

  // Two local ranks: the lone inner rank sits out.
  auto pair = Steps(InnerOuterRingSchedule(4, 2, 0), 2);
  ASSERT_EQ(pair.size(), 2u);
  ExpectStep(pair[0], {2}, {2});
  ExpectStep(pair[1], {}, {});

  // One local rank: only outer exchanges, a plain ring over machines.
  auto solo = Steps(InnerOuterRingSchedule(4, 1, 0), 2);
  ASSERT_EQ(solo.size(), 2u);
  ExpectStep(solo[0], {1}, {3});
  ExpectStep(solo[1], {1}, {3});

  // One machine: the outer rank has nobody to talk to.
  auto lone0 = Steps(InnerOuterRingSchedule(4, 4, 0), 2);
  auto lone1 = Steps(InnerOuterRingSchedule(4, 4, 1), 2);
  ASSERT_EQ(lone0.size(), 2u);
  ASSERT_EQ(lone1.size(), 2u);
  ExpectStep(lone0[0], {}, {});
  ExpectStep(lone1[0], {2}, {3});
  ExpectStep(lone0[1], {2}, {3});
  ExpectStep(lone1[1], {}, {});

  auto single = Steps(InnerOuterRingSchedule(1, 1, 0), 2);
  ASSERT_EQ(single.size(), 2u);
  ExpectStep(single[0], {}, {});
}

TEST(InnerOuterRingSchedule, AllRanksAgree) {
  for (const auto& [world, local] : kShapes) {
    SCOPED_TRACE(testing::Message() << "world " << world << " local " << local);
    ExpectSchedulesAgree(
        world, [&](int rank) { return InnerOuterRingSchedule(world, local, rank); }, 100);
  }
}

TEST(InnerOuterExponentialTwoSchedule, ExactSteps) {
  // Four machines of four: machine distances 1, 2, 1, 2, ...; inner (3 ranks) 1, 2, ...
  auto r0 = Steps(InnerOuterExponentialTwoSchedule(16, 4, 0), 5);
  auto r1 = Steps(InnerOuterExponentialTwoSchedule(16, 4, 1), 2);
  ASSERT_EQ(r0.size(), 5u);
  ASSERT_EQ(r1.size(), 2u);
  ExpectStep(r0[0], {4}, {12});
  ExpectStep(r1[0], {2}, {3});  // inner positions [1, 2, 3], distance 1
  ExpectStep(r0[1], {3}, {2});  // inner positions [0, 2, 3], distance 2
  ExpectStep(r1[1], {9}, {9});  // machine distance 2
  ExpectStep(r0[4], {4}, {12});

  // Five machines of eight: step 2 has machine distance 4 and inner distance 4 (7 inner
  // ranks: floor(log2 6) + 1 = 3 distances 1, 2, 4).
  auto outer = Steps(InnerOuterExponentialTwoSchedule(40, 8, 2), 3);
  auto inner = Steps(InnerOuterExponentialTwoSchedule(40, 8, 0), 3);
  ASSERT_EQ(outer.size(), 3u);
  ASSERT_EQ(inner.size(), 3u);
  ExpectStep(outer[2], {34}, {10});
  ExpectStep(inner[2], {5}, {4});  // positions [0, 1, 3, 4, 5, 6, 7]: 0 + 4 -> 5, 0 - 4 -> 4

  // One machine of three: the two inner ranks pair up; the outer one sits out.
  auto lone = Steps(InnerOuterExponentialTwoSchedule(3, 3, 1), 3);
  ASSERT_EQ(lone.size(), 3u);
  ExpectStep(lone[0], {2}, {2});
  ExpectStep(lone[1], {}, {});
  ExpectStep(lone[2], {0}, {0});
}

TEST(InnerOuterExponentialTwoSchedule, AllRanksAgree) {
  for (const auto& [world, local] : kShapes) {
    SCOPED_TRACE(testing::Message() << "world " << world << " local " << local);
    ExpectSchedulesAgree(
        world, [&](int rank) { return InnerOuterExponentialTwoSchedule(world, local, rank); }, 100);
  }
}

TEST(InnerOuterSchedules, InvalidArguments) {
  for (auto make : {InnerOuterRingSchedule, InnerOuterExponentialTwoSchedule}) {
    ExpectInvalid(make(6, 4, 0).status(), "positive divisor of world_size 6, got 4");
    ExpectInvalid(make(8, 0, 0).status(), "got 0");
    ExpectInvalid(make(8, -2, 0).status(), "got -2");
    ExpectInvalid(make(8, 4, 8).status(), "rank must be in [0, 8), got 8");
    ExpectInvalid(make(8, 4, -1).status(), "got -1");
    ExpectInvalid(make(0, 1, 0).status(), "at least 1");
  }
}

}  // namespace
}  // namespace weft
