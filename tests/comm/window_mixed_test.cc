// Rounds of random one-sided window traffic, every rank's tensor checked after each round
// against a model of the whole job. Every rank replays every rank's random choices (a seed
// shared by all), so each knows what its buffers should hold. A round: each rank puts or
// accumulates into random subsets of its out-neighbors with random weights (several
// nonblocking ops, some under the mutex, some scaling the sender's tensor after sending);
// a barrier; some ranks get from random subsets of their in-neighbors; a barrier; each rank
// updates its tensor with random weights (a subset of the neighbors, some with reset) and
// checks it; a barrier. Weights are powers of two (whole ones for integer tensors), so
// float64 and integer results match the model's exactly and float32 ones within rounding.
//
// MIXED_OPS_SEED and MIXED_OPS_ROUNDS as in mixed_ops_test.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/topology.h"
#include "gtest/gtest.h"
#include "tests/comm/test_util.h"

namespace weft {
namespace {

using testing::Buffer;

const auto* const kEnv = weft::testing::InitWeftForAllTests();

uint64_t Seed() { return static_cast<uint64_t>(testing::EnvInt("MIXED_OPS_SEED", 20261203)); }

int Rounds() { return static_cast<int>(testing::EnvInt("MIXED_OPS_ROUNDS", 30)); }

constexpr int64_t kLength = 37;  // not a multiple of any vector width

// Random choices of rank `r` in phase `phase` of `round`: the same stream on every rank.
std::mt19937_64 Choices(uint64_t seed, int round, int phase, int r) {
  std::seed_seq seq{seed, static_cast<uint64_t>(round), static_cast<uint64_t>(phase),
                    static_cast<uint64_t>(r)};
  return std::mt19937_64(seq);
}

// Integer tensors get whole weights, so that their results are exact too.
bool g_whole_weights = false;

double Weight(std::mt19937_64& rng) {
  const double weights[] = {0.25, 0.5, 1.0, 2.0};
  const int first = g_whole_weights ? 2 : 0;
  return weights[std::uniform_int_distribution<int>(first, 3)(rng)];
}

// A non-empty random subset of `from`, each with a weight.
std::map<int, double> Subset(std::mt19937_64& rng, const std::vector<int>& from) {
  std::map<int, double> out;
  for (int r : from) {
    if (std::uniform_int_distribution<int>(0, 2)(rng) > 0) out[r] = Weight(rng);
  }
  if (out.empty() && !from.empty()) out[from[0]] = Weight(rng);
  return out;
}

// The whole job as every rank expects it.
struct Model {
  std::vector<std::vector<double>> x;                   // by rank
  std::vector<std::map<int, std::vector<double>>> buf;  // by rank, then in-neighbor
};

void RunRounds(DType dtype, const Topology& topo) {
  g_whole_weights = !IsFloatingPoint(dtype);
  // Past this the values start over (float32's rounding, int16's range: a round multiplies
  // them by at most about 700 on 8 ranks).
  const double limit = dtype == DType::kInt16 ? 16 : 1e6;
  const double tolerance_scale = IsFloatingPoint(dtype) ? 4 : 0;  // integers: exact
  const int n = size();
  const int me = rank();
  const uint64_t seed = Seed();
  const std::string name = std::string("mixed.") + DTypeName(dtype);
  Model model;
  model.x.resize(n);
  model.buf.resize(n);
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < kLength; ++i) model.x[r].push_back(r + 1 + (i % 5));
    for (int j : topo.in_neighbors(r)) model.buf[r][j] = std::vector<double>(kLength, 0.0);
  }
  Buffer x(dtype, {kLength});
  for (int64_t i = 0; i < kLength; ++i) x.Set(i, model.x[me][i]);
  ASSERT_TRUE(win_create(x.view(), name, /*zero_init=*/true).ok());

  for (int round = 0; round < Rounds(); ++round) {
    const std::string where =
        "seed " + std::to_string(seed) + " round " + std::to_string(round) + " " + DTypeName(dtype);
    // Puts and accumulates.
    std::vector<Handle> handles;
    for (int s = 0; s < n; ++s) {
      auto rng = Choices(seed, round, 0, s);
      const int ops = std::uniform_int_distribution<int>(1, 3)(rng);
      for (int k = 0; k < ops; ++k) {
        const bool accumulate = std::uniform_int_distribution<int>(0, 1)(rng) == 1;
        const bool mutex = std::uniform_int_distribution<int>(0, 3)(rng) == 0;
        const std::map<int, double> dsts = Subset(rng, topo.out_neighbors(s));
        // After the op, the sender's own tensor is scaled (the next op sends the result).
        const double self = std::uniform_int_distribution<int>(0, 2)(rng) == 0 ? Weight(rng) : 1.0;
        if (dsts.empty()) continue;
        for (const auto& [d, w] : dsts) {
          std::vector<double>& b = model.buf[d][s];
          for (int64_t i = 0; i < kLength; ++i) {
            b[i] = (accumulate ? b[i] : 0.0) + w * model.x[s][i];
          }
        }
        for (double& v : model.x[s]) v *= self;
        if (s != me) continue;
        WinPutOptions options;
        options.dst_weights = dsts;
        options.require_mutex = mutex;
        options.self_weight = self;
        auto h = accumulate ? win_accumulate_nonblocking(x.view(), name, options)
                            : win_put_nonblocking(x.view(), name, options);
        ASSERT_TRUE(h.ok()) << where << ": " << h.status();
        handles.push_back(*h);
      }
    }
    for (const Handle& h : handles) ASSERT_TRUE(wait(h).ok()) << where;
    ASSERT_TRUE(barrier().ok());

    // Gets (nobody writes its tensor meanwhile).
    for (int s = 0; s < n; ++s) {
      auto rng = Choices(seed, round, 1, s);
      if (std::uniform_int_distribution<int>(0, 1)(rng) == 0) continue;
      const std::vector<int>& in = topo.in_neighbors(s);
      if (in.empty()) continue;
      const std::map<int, double> srcs = Subset(rng, in);
      for (const auto& [j, w] : srcs) {
        for (int64_t i = 0; i < kLength; ++i) model.buf[s][j][i] = w * model.x[j][i];
      }
      if (s != me) continue;
      WinGetOptions options;
      options.src_weights = srcs;
      ASSERT_TRUE(win_get(name, options).ok()) << where;
    }
    ASSERT_TRUE(barrier().ok());

    // Updates, each rank its own tensor.
    for (int s = 0; s < n; ++s) {
      auto rng = Choices(seed, round, 2, s);
      const double self = Weight(rng);
      const std::map<int, double> weights = Subset(rng, topo.in_neighbors(s));
      const bool reset = std::uniform_int_distribution<int>(0, 1)(rng) == 1;
      std::vector<double>& xs = model.x[s];
      for (int64_t i = 0; i < kLength; ++i) {
        double v = self * xs[i];
        for (const auto& [j, w] : weights) v += w * model.buf[s][j][i];
        xs[i] = v;
      }
      if (reset) {
        for (const auto& [j, w] : weights)
          std::fill(model.buf[s][j].begin(), model.buf[s][j].end(), 0.0);
      }
      if (s != me) continue;
      WinUpdateOptions options;
      options.self_weight = self;
      options.neighbor_weights = weights;
      options.reset = reset;
      ASSERT_TRUE(win_update(name, options).ok()) << where;
    }
    // A wrong value is reported and the round goes on: returning here would leave the
    // other ranks waiting in the next barrier.
    int64_t wrong = 0, first = -1;
    for (int64_t i = 0; i < kLength; ++i) {
      const double want = model.x[me][i];
      if (std::abs(x.Get(i) - want) > testing::Tolerance(dtype, want) * tolerance_scale &&
          wrong++ == 0) {
        first = i;
      }
    }
    EXPECT_EQ(wrong, 0) << where << ": element " << first << " on rank " << me << " is "
                        << x.Get(first < 0 ? 0 : first) << ", expected "
                        << model.x[me][first < 0 ? 0 : first];
    // Keeps the magnitudes (and float32's rounding) in check: every rank rescales alike.
    double top = 0;
    for (int r = 0; r < n; ++r) {
      for (double v : model.x[r]) top = std::max(top, std::abs(v));
      for (const auto& [j, b] : model.buf[r]) {
        for (double v : b) top = std::max(top, std::abs(v));
      }
    }
    ASSERT_TRUE(barrier().ok());
    if (top > limit) {
      // Starts over from fresh values: a collective re-creation of the window.
      ASSERT_TRUE(win_free(name).ok());
      for (int r = 0; r < n; ++r) {
        for (int64_t i = 0; i < kLength; ++i) model.x[r][i] = r + 1 + ((i + round) % 5);
        for (auto& [j, b] : model.buf[r]) std::fill(b.begin(), b.end(), 0.0);
      }
      for (int64_t i = 0; i < kLength; ++i) x.Set(i, model.x[me][i]);
      ASSERT_TRUE(win_create(x.view(), name, /*zero_init=*/true).ok());
    }
  }
  ASSERT_TRUE(win_free(name).ok());
}

TEST(MixedWindowOps, ExponentialGraphFloat64) { RunRounds(DType::kFloat64, load_topology()); }

// int32 accumulates through MPI_Accumulate; int16 by get-add-put on MPI windows.
TEST(MixedWindowOps, IntegersOnTheExponentialGraph) {
  RunRounds(DType::kInt32, load_topology());
  RunRounds(DType::kInt16, load_topology());
}

TEST(MixedWindowOps, RingAndStarFloat32) {
  const int n = size();
  for (const Topology& topo : {*RingGraph(n), *StarGraph(n)}) {
    ASSERT_TRUE(set_topology(topo).ok());
    RunRounds(DType::kFloat32, topo);
  }
  ASSERT_TRUE(set_topology(*ExponentialGraph(n)).ok());
}

}  // namespace
}  // namespace weft
