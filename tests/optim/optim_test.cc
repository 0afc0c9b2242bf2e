// The distributed optimizers (optim/optim.h) under real mpirun on 1, 2 and 4 ranks: where
// communication happens for every pattern of docs/optim.md, one step of each algorithm against
// its formula, convergence on a least-squares problem with a known solution, the helpers,
// and the bad inputs.
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/topology.h"
#include "comm/torch/torch_comm.h"
#include "gtest/gtest.h"
#include "optim/optim.h"
#include "tests/comm/test_util.h"

namespace weft {
namespace optim {
namespace {

const auto* const kEnv = weft::testing::InitWeftForAllTests();

using Model = torch::nn::Linear;

Model MakeModel(int64_t in, double fill) {
  Model m(torch::nn::LinearOptions(in, 1).bias(false));
  m->to(torch::kDouble);
  torch::NoGradGuard no_grad;
  m->weight.fill_(fill);
  return m;
}

std::unique_ptr<DistributedOptimizer> Make(Algorithm a, Model& m, double lr,
                                           Options options = {}) {
  auto opt = DistributedOptimizer::Create(
      a, std::make_shared<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(lr)),
      m.ptr(), options);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return opt.ok() ? std::move(*opt) : nullptr;
}

// The uniform mixing of the topology in force: row i averages i and its in-neighbors.
std::vector<double> Mix(const std::vector<double>& v) {
  const Topology topo = load_topology();
  std::vector<double> out(v.size());
  for (int i = 0; i < topo.size(); ++i) {
    double s = v[i];
    for (int j : topo.in_neighbors(i)) s += v[j];
    out[i] = s / static_cast<double>(topo.in_neighbors(i).size() + 1);
  }
  return out;
}

// Every rank's tensor, flattened, as rows.
std::vector<std::vector<double>> Gather(const at::Tensor& t) {
  auto all = torch_api::allgather(t.detach().reshape({1, -1}).to(torch::kDouble).contiguous());
  EXPECT_TRUE(all.ok()) << all.status();
  std::vector<std::vector<double>> rows;
  for (int r = 0; r < all->size(0); ++r) {
    at::Tensor row = (*all)[r];
    rows.emplace_back(row.data_ptr<double>(), row.data_ptr<double>() + row.numel());
  }
  return rows;
}

// --- where communication happens ---------------------------------------------------------

// Runs a pattern (F: forward and backward, s/S: step(), n: a forward under no-grad, ' ':
// nothing) with lr = 0 and rank-valued parameters; after every call the parameter must be
// the rank's value mixed once per S so far, and misuse warnings must come at `misuses`
// (1-based indexes of counted computations).
void CheckPattern(Algorithm a, const std::string& pattern, std::vector<int> misuses) {
  SCOPED_TRACE(std::string(AlgorithmName(a)) + " '" + pattern + "'");
  Model m = MakeModel(1, rank() + 1);
  Options options;
  options.num_steps_per_communication = 3;
  auto opt = Make(a, m, /*lr=*/0.0, options);
  ASSERT_NE(opt, nullptr);
  std::vector<double> expected(static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) expected[r] = r + 1;
  const at::Tensor x = torch::ones({1, 1}, torch::kDouble);
  int counted = 0;
  std::vector<int> warned;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == ' ') continue;
    if (c == 'F' || c == 'n') {
      const int64_t before = opt->misuse_warnings();
      if (c == 'n') {
        torch::NoGradGuard no_grad;
        opt->forward([&] { return m->forward(x); });
      } else {
        ++counted;
        at::Tensor y = opt->forward([&] { return m->forward(x); });
        y.sum().backward();
      }
      if (opt->misuse_warnings() != before) warned.push_back(counted);
    } else {
      ASSERT_TRUE(opt->step().ok()) << "at position " << i;
      if (c == 'S') expected = Mix(expected);
    }
    ASSERT_NEAR(m->weight.item<double>(), expected[rank()], 1e-12)
        << "after position " << i << " ('" << c << "')";
  }
  EXPECT_EQ(warned, misuses);
}

TEST(WhereCommunicationHappens, EveryPatternOfTheSpec) {
  for (Algorithm a : {Algorithm::kAdaptWithCombine, Algorithm::kAdaptThenCombine}) {
    CheckPattern(a, "FFFS", {});
    CheckPattern(a, "FsFsFS", {});
    CheckPattern(a, "FFsFS", {});
    CheckPattern(a, "FsFFS", {});
    CheckPattern(a, "FFFFS", {4});
    CheckPattern(a, "FFsFFS", {4});
    // The silent drift: the second batch communicates at its second mini-batch.
    CheckPattern(a, "FsFsFSFs FsFSFsFs", {});
    // No-grad computations are not counted.
    CheckPattern(a, "FnFnnFS", {});
  }
}

// --- one step against the formula ---------------------------------------------------------

struct Problem {
  at::Tensor w0, x, t;  // this rank's start, input (1 x 3) and target (1 x 1)
  at::Tensor Gradient() const {  // d/dw (w . x - t)^2 = 2 (w . x - t) x
    return 2 * ((w0 * x).sum() - t.sum()) * x;
  }
};

Problem RankProblem() {
  const double r = rank();
  Problem p;
  p.w0 = torch::tensor({{1.0 + r, -0.5 * r, 0.25}}, torch::kDouble);
  p.x = torch::tensor({{0.5, 1.0 + 0.1 * r, -2.0}}, torch::kDouble);
  p.t = torch::tensor({{3.0 - r}}, torch::kDouble);
  return p;
}

at::Tensor OneStep(Algorithm a, CommunicationType type, double lr, bool overlap = true) {
  const Problem p = RankProblem();
  Model m = MakeModel(3, 0);
  {
    torch::NoGradGuard no_grad;
    m->weight.copy_(p.w0);
  }
  Options options;
  options.communication_type = type;
  options.overlap = overlap;
  auto opt = Make(a, m, lr, options);
  if (opt == nullptr) return at::Tensor();
  opt->zero_grad();
  at::Tensor y = opt->forward([&] { return m->forward(p.x); });
  (y - p.t).pow(2).sum().backward();
  EXPECT_TRUE(opt->step().ok());
  return m->weight.detach().clone();
}

TEST(OneStep, MatchesTheFormulaComputedByHand) {
  const double lr = 0.05;
  const Problem p = RankProblem();
  const auto w = Gather(p.w0);
  const auto g = Gather(p.Gradient());
  const int n = size(), me = rank();
  const Topology topo = load_topology();
  auto mixed = [&](const std::vector<std::vector<double>>& v, size_t k) {
    double s = v[me][k];
    for (int j : topo.in_neighbors(me)) s += v[j][k];
    return s / static_cast<double>(topo.in_neighbors(me).size() + 1);
  };
  auto mean = [&](const std::vector<std::vector<double>>& v, size_t k) {
    double s = 0;
    for (int j = 0; j < n; ++j) s += v[j][k];
    return s / n;
  };
  std::vector<std::vector<double>> stepped = w;  // x - lr g, per rank
  for (int j = 0; j < n; ++j) {
    for (size_t k = 0; k < 3; ++k) stepped[j][k] -= lr * g[j][k];
  }
  struct Want {
    Algorithm a;
    CommunicationType type;
    std::function<double(size_t)> value;
  };
  const std::vector<Want> cases = {
      {Algorithm::kAdaptWithCombine, CommunicationType::kNeighborAllreduce,
       [&](size_t k) { return mixed(w, k) - lr * g[me][k]; }},
      {Algorithm::kAdaptThenCombine, CommunicationType::kNeighborAllreduce,
       [&](size_t k) { return mixed(stepped, k); }},
      {Algorithm::kAdaptWithCombine, CommunicationType::kAllreduce,
       [&](size_t k) { return mean(w, k) - lr * g[me][k]; }},
      {Algorithm::kAdaptThenCombine, CommunicationType::kAllreduce,
       [&](size_t k) { return mean(stepped, k); }},
      {Algorithm::kAdaptWithCombine, CommunicationType::kEmpty,
       [&](size_t k) { return w[me][k] - lr * g[me][k]; }},
      {Algorithm::kGradientAllreduce, CommunicationType::kNeighborAllreduce,
       [&](size_t k) { return w[me][k] - lr * mean(g, k); }},
  };
  for (const Want& c : cases) {
    for (bool overlap : {true, false}) {  // launched early or in step(): the same result
      SCOPED_TRACE(std::string(AlgorithmName(c.a)) + " over " + CommunicationTypeName(c.type) +
                   (overlap ? "" : ", no overlap"));
      const at::Tensor got = OneStep(c.a, c.type, lr, overlap);
      ASSERT_TRUE(got.defined());
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_NEAR(got[0][k].item<double>(), c.value(k), 1e-12) << "element " << k;
      }
    }
  }
}

TEST(OneStep, HierarchicalAveragesInsideAndAcrossMachines) {
  // With one machine (the default here) the machine-level exchange has no neighbors, so
  // the result is the machine average minus the local step.
  if (machine_size() != 1) GTEST_SKIP() << "expects every rank on one machine";
  const double lr = 0.05;
  const Problem p = RankProblem();
  const auto w = Gather(p.w0);
  const auto g = Gather(p.Gradient());
  const at::Tensor got =
      OneStep(Algorithm::kAdaptWithCombine, CommunicationType::kHierarchicalNeighborAllreduce, lr);
  for (size_t k = 0; k < 3; ++k) {
    double mean = 0;
    for (int j = 0; j < size(); ++j) mean += w[j][k];
    mean /= size();
    EXPECT_NEAR(got[0][k].item<double>(), mean - lr * g[rank()][k], 1e-12);
  }
}

// --- convergence --------------------------------------------------------------------------

// Least squares with a known solution: every rank has its own rows of A and b = A x*, so
// the global (and every local) minimizer is x*.
constexpr int64_t kDim = 4, kRows = 32;

at::Tensor Solution() { return torch::tensor({{1.5, -2.0, 0.5, 3.0}}, torch::kDouble); }

void Converge(Algorithm a, bool dynamic, CommunicationType type = CommunicationType::kNeighborAllreduce) {
  SCOPED_TRACE(std::string(AlgorithmName(a)) + (dynamic ? ", dynamic one-peer" : ", static") +
               ", " + CommunicationTypeName(type));
  torch::manual_seed(1000 + rank());
  const at::Tensor A = torch::randn({kRows, kDim}, torch::kDouble);
  const at::Tensor b = A.matmul(Solution().t());
  Model m = MakeModel(kDim, 0);
  {
    torch::NoGradGuard no_grad;
    m->weight.copy_(torch::randn({1, kDim}, torch::kDouble));  // rank-specific start
  }
  Options options;
  options.communication_type = type;
  if (a == Algorithm::kGradientAllreduce) {
    // Data parallelism keeps replicas equal, so they must start equal.
    ASSERT_TRUE(broadcast_parameters(m->named_parameters(), 0).ok());
  }
  auto opt = Make(a, m, /*lr=*/0.1, options);
  ASSERT_NE(opt, nullptr);
  auto schedule = OnePeerSchedule(load_topology(), rank());
  ASSERT_TRUE(schedule.ok());
  for (int it = 0; it < 600; ++it) {
    if (dynamic) {
      const SendRecvRanks sr = (*schedule)->Next();
      RoundWeights& rw = opt->weights();
      const double w = 1.0 / static_cast<double>(sr.recv_ranks.size() + 1);
      rw.self_weight = w;
      rw.src_weights = std::map<int, double>{};
      rw.dst_weights = std::map<int, double>{};
      for (int r : sr.recv_ranks) (*rw.src_weights)[r] = w;
      for (int r : sr.send_ranks) (*rw.dst_weights)[r] = 1.0;
    }
    opt->zero_grad();
    at::Tensor y = opt->forward([&] { return m->forward(A); });
    (y - b).pow(2).mean().backward();
    ASSERT_TRUE(opt->step().ok()) << "iteration " << it;
    // Window puts are one-sided: without this, a rank on an oversubscribed machine can
    // run many rounds ahead on stale neighbor values and end short of the tolerance.
    if (a == Algorithm::kWinPut || a == Algorithm::kPushSum) {
      ASSERT_TRUE(barrier().ok());
    }
  }
  ASSERT_TRUE(barrier().ok());
  const double error = (m->weight.detach() - Solution()).abs().max().item<double>();
  EXPECT_LT(error, 1e-8) << "rank " << rank() << " ended at " << m->weight;
  auto distance = consensus_distance(m->named_parameters());
  ASSERT_TRUE(distance.ok()) << distance.status();
  EXPECT_LT(*distance, 1e-8);
  EXPECT_TRUE(opt->close().ok());
}

TEST(Convergence, EveryOptimizerReachesTheSolution) {
  for (Algorithm a : {Algorithm::kAdaptWithCombine, Algorithm::kAdaptThenCombine,
                      Algorithm::kGradientAllreduce, Algorithm::kWinPut, Algorithm::kPushSum}) {
    Converge(a, /*dynamic=*/false);
  }
  Converge(Algorithm::kAdaptWithCombine, false, CommunicationType::kAllreduce);
  Converge(Algorithm::kAdaptThenCombine, false, CommunicationType::kHierarchicalNeighborAllreduce);
}

TEST(Convergence, DynamicOnePeerTopology) {
  for (Algorithm a : {Algorithm::kAdaptWithCombine, Algorithm::kAdaptThenCombine,
                      Algorithm::kWinPut, Algorithm::kPushSum}) {
    Converge(a, /*dynamic=*/true);
  }
}

// --- helpers ------------------------------------------------------------------------------

TEST(Helpers, ConsensusDistanceOfRankValues) {
  Model m = MakeModel(1, rank());
  auto d = consensus_distance(m->named_parameters());
  ASSERT_TRUE(d.ok()) << d.status();
  const double n = size();
  EXPECT_NEAR(*d, std::sqrt((n * n - 1) / 12.0), 1e-12);
}

TEST(Helpers, BroadcastAndAllreduceParameters) {
  Model m = MakeModel(3, rank() + 1);
  ASSERT_TRUE(allreduce_parameters(m->named_parameters()).ok());
  EXPECT_NEAR(m->weight[0][0].item<double>(), (size() + 1) / 2.0, 1e-12);
  {
    torch::NoGradGuard no_grad;
    m->weight.fill_(rank() * 10);
  }
  const int root = size() - 1;
  ASSERT_TRUE(broadcast_parameters(m->named_parameters(), root).ok());
  EXPECT_EQ(m->weight[0][2].item<double>(), root * 10);
}

template <typename Opt, typename Options>
void CheckBroadcastState(const char* what, Options root_options, Options other_options) {
  SCOPED_TRACE(what);
  const int root = 0;
  Model m = MakeModel(3, 1.0);
  Opt opt(m->parameters(), rank() == root ? root_options : other_options);
  // Only the root trains (and so has state); gradients differ by rank.
  if (rank() == root) {
    for (int i = 0; i < 2; ++i) {
      opt.zero_grad();
      m->forward(torch::full({1, 3}, 1.0 + i, torch::kDouble)).sum().backward();
      opt.step();
    }
  }
  ASSERT_TRUE(broadcast_parameters(m->named_parameters(), root).ok());
  ASSERT_TRUE(broadcast_optimizer_state(opt, root).ok());
  // Identical parameters, state and options: one more identical step stays identical.
  opt.zero_grad();
  m->forward(torch::full({1, 3}, 0.5, torch::kDouble)).sum().backward();
  opt.step();
  const auto all = Gather(m->weight);
  for (int r = 1; r < size(); ++r) {
    for (size_t k = 0; k < 3; ++k) EXPECT_EQ(all[r][k], all[0][k]) << "rank " << r;
  }
  EXPECT_EQ(opt.param_groups()[0].options().get_lr(), root_options.get_lr());
}

TEST(Helpers, BroadcastOptimizerStateOfEachOptimizer) {
  using namespace torch::optim;  // NOLINT
  CheckBroadcastState<SGD>("SGD", SGDOptions(0.1).momentum(0.9), SGDOptions(0.3).momentum(0.9));
  CheckBroadcastState<Adam>("Adam", AdamOptions(0.01), AdamOptions(0.02));
  CheckBroadcastState<AdamW>("AdamW", AdamWOptions(0.01), AdamWOptions(0.02));
  CheckBroadcastState<RMSprop>("RMSprop", RMSpropOptions(0.01).momentum(0.5),
                               RMSpropOptions(0.02).momentum(0.5));
  CheckBroadcastState<Adagrad>("Adagrad", AdagradOptions(0.1), AdagradOptions(0.2));
}

// --- bad input ----------------------------------------------------------------------------

TEST(BadInput, ClearErrors) {
  Model m = MakeModel(3, 1.0);
  auto sgd = [&] { return std::make_shared<torch::optim::SGD>(m->parameters(), 0.1); };
  Options zero;
  zero.num_steps_per_communication = 0;
  auto bad_j = DistributedOptimizer::Create(Algorithm::kAdaptWithCombine, sgd(), m.ptr(), zero);
  ASSERT_FALSE(bad_j.ok());
  EXPECT_EQ(bad_j.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad_j.status().message()).find("num_steps_per_communication"),
            std::string::npos);

  Model frozen = MakeModel(3, 1.0);
  frozen->weight.set_requires_grad(false);
  auto none = DistributedOptimizer::Create(
      Algorithm::kAdaptThenCombine,
      std::make_shared<torch::optim::SGD>(frozen->parameters(), 0.1), frozen.ptr());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(std::string(none.status().message()).find("no parameter that requires grad"),
            std::string::npos)
      << none.status();

  Model other = MakeModel(3, 1.0);
  auto foreign = DistributedOptimizer::Create(
      Algorithm::kGradientAllreduce,
      std::make_shared<torch::optim::SGD>(other->parameters(), 0.1), m.ptr());
  ASSERT_FALSE(foreign.ok());
  EXPECT_NE(std::string(foreign.status().message()).find("does not hold"), std::string::npos);

  // A step before any counted computation: the forward was not run through the optimizer.
  for (Algorithm a : {Algorithm::kAdaptWithCombine, Algorithm::kAdaptThenCombine}) {
    auto opt = Make(a, m, 0.1);
    ASSERT_NE(opt, nullptr);
    m->forward(torch::ones({1, 3}, torch::kDouble)).sum().backward();  // not through forward()
    Status s = opt->step();
    if (a == Algorithm::kAdaptThenCombine) {
      EXPECT_TRUE(s.ok()) << s;  // backward is counted by hooks: nothing to forget
      continue;
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(std::string(s.message()).find("before any counted forward"), std::string::npos) << s;
    EXPECT_NE(std::string(s.message()).find("opt->forward"), std::string::npos) << s;
  }
}

TEST(BadInput, ParametersThatDifferAcrossRanks) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  Model m = MakeModel(rank() == 0 ? 3 : 4, 1.0);
  auto opt = DistributedOptimizer::Create(
      Algorithm::kAdaptWithCombine, std::make_shared<torch::optim::SGD>(m->parameters(), 0.1),
      m.ptr());
  ASSERT_FALSE(opt.ok());
  EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(opt.status().message()).find("differ across ranks"), std::string::npos)
      << opt.status();
  // The engine is fine afterwards.
  EXPECT_TRUE(barrier().ok());
}

}  // namespace
}  // namespace optim
}  // namespace weft
