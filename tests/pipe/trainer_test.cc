// The elastic trainer (pipe/runtime/trainer.h) under real mpirun: transitions keep every
// replica identical and frozen layers unchanged, the stages always cover the model,
// AutoCache changes nothing but the work, and bad set-ups fail on every rank.
#include "pipe/runtime/trainer.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/torch/torch_comm.h"
#include "gtest/gtest.h"
#include "optim/optim.h"
#include "tests/comm/test_util.h"

namespace weft {
namespace pipe {
namespace {

const auto* const kEnv = weft::testing::InitWeftForAllTests();

constexpr int kClasses = 4;
constexpr int kFeatures = 6;

// A layer group: Linear then tanh (Sequentials cannot nest in a Sequential).
struct BlockImpl : torch::nn::Module {
  BlockImpl(int in, int out) : fc(register_module("fc", torch::nn::Linear(in, out))) {}
  at::Tensor forward(const at::Tensor& x) { return at::tanh(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Block);

// Eight layer groups: seven blocks and a head.
torch::nn::Sequential MakeModel(int groups = 8) {
  torch::manual_seed(3);
  torch::nn::Sequential seq;
  int width = kFeatures;
  for (int g = 0; g + 1 < groups; ++g) {
    seq->push_back(Block(width, 12));
    width = 12;
  }
  seq->push_back(torch::nn::Linear(width, kClasses));
  return seq;
}

// Gaussian clusters, one per class, generated from the sample id.
class Clusters : public Dataset {
 public:
  explicit Clusters(int64_t n, bool augmented = false) : n_(n), augmented_(augmented) {
    at::Generator g = at::detail::createCPUGenerator(11);
    centers_ = at::randn({kClasses, kFeatures}, g) * 2;
  }
  int64_t size() const override { return n_; }
  Status Get(const std::vector<int64_t>& ids, at::Tensor* inputs,
             at::Tensor* targets) const override {
    std::vector<at::Tensor> xs;
    std::vector<int64_t> ys;
    for (int64_t id : ids) {
      at::Generator g = at::detail::createCPUGenerator(1000 + id);
      xs.push_back(centers_[id % kClasses] + at::randn({kFeatures}, g));
      ys.push_back(id % kClasses);
    }
    if (inputs) *inputs = at::stack(xs);
    if (targets) *targets = at::tensor(ys, at::kLong);
    return OkStatus();
  }
  bool random_augmentation() const override { return augmented_; }

 private:
  int64_t n_;
  bool augmented_;
  at::Tensor centers_;
};

TrainerOptions Options(const std::string& name) {
  TrainerOptions o;
  o.name = name;
  o.alpha = 0.5;
  o.batch_size = 32;
  o.micro_batches = 4;
  o.make_optimizer = [](std::vector<at::Tensor> params) {
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
  };
  o.loss = [](const at::Tensor& out, const at::Tensor& y) {
    return at::cross_entropy_loss(out, y);
  };
  return o;
}

// Per (rank, layer): a fingerprint of the layer's parameters (sum, sum of squares, and a
// weighted sum) and of its optimizer state, for the layers the rank holds; NaN elsewhere.
// Every rank gets the whole table.
at::Tensor Fingerprints(ElasticTrainer& trainer, const LayerList& model, const std::string& name) {
  const int layers = model.size();
  at::Tensor table = at::zeros({size(), layers, 4}, at::kDouble);
  at::Tensor mask = at::zeros({size(), layers}, at::kDouble);
  for (int l : trainer.held_layers()) {
    double sum = 0, sq = 0, weighted = 0;
    for (const at::Tensor& p : model.Parameters(l)) {
      at::Tensor d = p.detach().to(at::kDouble).reshape({-1});
      sum += d.sum().item<double>();
      sq += d.pow(2).sum().item<double>();
      weighted += (d * at::arange(d.numel(), at::kDouble)).sum().item<double>();
    }
    // Adam's per-parameter state (the saved bytes name parameters by address).
    double opt = 0;
    auto& states = trainer.optimizer(l).state();
    for (const at::Tensor& p : model.Parameters(l)) {
      // LibTorch 1.13 keys the state by the parameter's address, as a string.
      auto it = states.find(c10::guts::to_string(p.unsafeGetTensorImpl()));
      if (it == states.end()) continue;
      auto& adam = static_cast<torch::optim::AdamParamState&>(*it->second);
      opt += adam.step() + adam.exp_avg().sum().item<double>() +
             1e3 * adam.exp_avg_sq().sum().item<double>();
    }
    table[rank()][l][0] = sum;
    table[rank()][l][1] = sq;
    table[rank()][l][2] = weighted;
    table[rank()][l][3] = l >= trainer.plan().frozen ? opt : 0.0;
    mask[rank()][l] = 1;
  }
  EXPECT_TRUE(torch_api::allreduce_(table, false, name + ".table").ok());
  EXPECT_TRUE(torch_api::allreduce_(mask, false, name + ".mask").ok());
  return at::where(mask.unsqueeze(2) > 0, table, at::full_like(table, NAN));
}

// The machine of every rank (comm's machine detection).
std::vector<int64_t> MachineOfEachRank(const std::string& name) {
  at::Tensor table = at::zeros({size()}, at::kLong);
  table[rank()] = machine_rank();
  EXPECT_TRUE(torch_api::allreduce_(table, false, name).ok());
  return std::vector<int64_t>(table.data_ptr<int64_t>(), table.data_ptr<int64_t>() + size());
}

// Pipelines stay inside machines where they fit: on machines of equal size L, at least
// machines x floor(L / K) replicas have all their stages on one machine, however mpirun
// dealt the ranks over the machines.
void CheckPlacement(const Plan& plan, const std::vector<int64_t>& machine_of) {
  std::vector<int> per_machine(machine_size(), 0);
  for (int64_t m : machine_of) ++per_machine[m];
  if (std::count(per_machine.begin(), per_machine.end(), per_machine[0]) != machine_size()) {
    return;  // machines of different sizes: placement is rank order
  }
  int inside = 0;
  for (int r = 0; r < plan.replicas; ++r) {
    std::vector<int> ranks = plan.ReplicaRanks(r);
    bool one_machine = true;
    for (int q : ranks) one_machine = one_machine && machine_of[q] == machine_of[ranks[0]];
    inside += one_machine ? 1 : 0;
  }
  EXPECT_GE(inside, machine_size() * (per_machine[0] / plan.k))
      << "K = " << plan.k << ", " << plan.replicas << " replicas on " << machine_size()
      << " machines of " << per_machine[0] << " ranks";
}

void CheckTransitions(TrainerOptions::ReplicaSync sync, const std::string& name) {
  auto model = LayerList::FromSequential(MakeModel());
  ASSERT_TRUE(model.ok()) << model.status();
  TrainerOptions options = Options(name);
  options.sync = sync;
  auto trainer = ElasticTrainer::Create(*model, options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const std::vector<int64_t> machine_of = MachineOfEachRank(name + ".machines");
  CheckPlacement((*trainer)->plan(), machine_of);
  Clusters data(512);
  std::map<int, std::vector<double>> frozen_reference;  // layer -> fingerprint when frozen
  int previous_k = (*trainer)->plan().k;
  for (int epoch = 0; epoch < 4; ++epoch) {
    SCOPED_TRACE(epoch);
    auto metrics = (*trainer)->TrainEpoch(data);
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    const Plan& plan = (*trainer)->plan();
    EXPECT_TRUE(metrics->transitioned);
    EXPECT_EQ(metrics->next_frozen, plan.frozen);
    EXPECT_LE(plan.k, previous_k);  // K only shrinks
    EXPECT_EQ(plan.replicas, size() / plan.k);
    CheckPlacement(plan, machine_of);
    previous_k = plan.k;
    // The stages cover the model: boundaries from 0 to L, no stage empty, and this rank
    // holds exactly its stage's layers.
    ASSERT_EQ(plan.partition.boundaries.front(), 0);
    ASSERT_EQ(plan.partition.boundaries.back(), model->size());
    EXPECT_FALSE(plan.partition.has_empty_stage());
    const Role role = (*trainer)->role();
    ASSERT_TRUE(role.active());
    std::vector<int> expected;
    for (int l = plan.partition.boundaries[role.stage];
         l < plan.partition.boundaries[role.stage + 1]; ++l) {
      expected.push_back(l);
    }
    EXPECT_EQ((*trainer)->held_layers(), expected);
    // Every holder of a layer has the same parameters and optimizer state.
    at::Tensor table = Fingerprints(**trainer, *model, name + ".check" + std::to_string(epoch));
    int holders_total = 0;
    for (int l = 0; l < model->size(); ++l) {
      std::vector<double> first;
      int holders = 0;
      for (int r = 0; r < size(); ++r) {
        at::Tensor row = table[r][l];
        if (std::isnan(row[0].item<double>())) continue;
        std::vector<double> values(row.data_ptr<double>(), row.data_ptr<double>() + 4);
        if (first.empty()) first = values;
        EXPECT_EQ(values, first) << "layer " << l << " differs on rank " << r;
        ++holders;
      }
      EXPECT_EQ(holders, plan.replicas) << "layer " << l;
      holders_total += holders;
      if (l < plan.frozen) {
        if (!frozen_reference.count(l)) frozen_reference[l] = {first[0], first[1], first[2]};
        EXPECT_EQ(std::vector<double>(first.begin(), first.begin() + 3), frozen_reference[l])
            << "frozen layer " << l << " changed";
      }
    }
    EXPECT_EQ(holders_total, model->size() * plan.replicas);
  }
  // With alpha = 1/2 on 8 layers, layers froze and (on more than one rank) K shrank.
  EXPECT_GE((*trainer)->plan().frozen, 4);
  if (size() >= 4) {
    EXPECT_LT((*trainer)->plan().k, size());
  }
  auto accuracy = (*trainer)->Evaluate(Clusters(128));
  ASSERT_TRUE(accuracy.ok()) << accuracy.status();
  // What the multi-host test compares with a one-host run of the same plan: the accuracy
  // and every layer's parameter sum.
  at::Tensor table = Fingerprints(**trainer, *model, name + ".final");
  if (rank() == 0) {
    std::string sums;
    for (int l = 0; l < model->size(); ++l) {
      double sum = NAN;
      for (int r = 0; r < size() && std::isnan(sum); ++r) sum = table[r][l][0].item<double>();
      char buf[32];
      std::snprintf(buf, sizeof buf, "%s%.9g", l ? "," : "", sum);
      sums += buf;
    }
    std::printf("TRAINER_RESULT %s accuracy=%.6f layer_sums=%s\n", name.c_str(), *accuracy,
                sums.c_str());
  }
  // Half the layers freeze after one epoch of 16 steps: it learns, not to convergence
  // (chance is 1/4). With allreduce, the same figure on every world size: the math does
  // not depend on K.
  EXPECT_GT(*accuracy, 0.5);
}

TEST(Trainer, TransitionsKeepReplicasIdenticalAndFrozenLayersUnchanged) {
  CheckTransitions(TrainerOptions::ReplicaSync::kAllreduce, "t1");
}

// Decentralized replicas differ between freeze points; every transition still starts from
// identical ones (the consensus average, replica 0's optimizer state).
TEST(Trainer, GossipReplicasAreIdenticalAfterEveryTransition) {
  CheckTransitions(TrainerOptions::ReplicaSync::kGossip, "t2");
}

TEST(Trainer, TheCacheChangesTheWorkNotTheResult) {
  Clusters data(192);
  std::vector<std::vector<double>> losses(2);
  std::vector<double> hit_rates;
  for (int with_cache = 0; with_cache < 2; ++with_cache) {
    auto model = LayerList::FromSequential(MakeModel());
    ASSERT_TRUE(model.ok());
    TrainerOptions options = Options(with_cache ? "c1" : "c0");
    options.cache = with_cache;
    options.freeze_every_epochs = 2;  // the second epoch of each interval hits
    // The same partition both ways (the cache changes lambda): one stage per rank.
    options.lambda = 0;
    options.autopipe = false;
    auto trainer = ElasticTrainer::Create(*model, options);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    for (int epoch = 0; epoch < 4; ++epoch) {
      auto metrics = (*trainer)->TrainEpoch(data);
      ASSERT_TRUE(metrics.ok()) << metrics.status();
      losses[with_cache].push_back(metrics->loss);
      if (with_cache) hit_rates.push_back(metrics->cache_hit_rate);
    }
  }
  for (size_t e = 0; e < losses[0].size(); ++e) {
    EXPECT_NEAR(losses[0][e], losses[1][e], 1e-5) << "epoch " << e;
  }
  EXPECT_EQ(hit_rates[0], 0);   // nothing frozen yet
  EXPECT_EQ(hit_rates[2], 0);   // first epoch at a new depth: computed and stored
  EXPECT_EQ(hit_rates[3], 1);   // second epoch: every sample from the cache
}

TEST(Trainer, BadSetUpsFailOnEveryRank) {
  auto model = LayerList::FromSequential(MakeModel());
  ASSERT_TRUE(model.ok());
  TrainerOptions options = Options("bad");
  options.k0 = size() + 1;  // a plan that does not fit the world
  auto trainer = ElasticTrainer::Create(*model, options);
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument) << trainer.status();
  EXPECT_NE(std::string(trainer.status().message()).find("ranks"), std::string::npos);

  if (size() >= 2) {
    auto small = LayerList::FromSequential(MakeModel(1));  // one layer, K > 1 stages
    ASSERT_TRUE(small.ok());
    options.k0 = 2;
    trainer = ElasticTrainer::Create(*small, options);
    EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument) << trainer.status();
  }
  options.k0 = 0;
  options.loss = nullptr;
  EXPECT_EQ(ElasticTrainer::Create(*model, options).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Random augmentation: the cache refuses, or is bypassed on request.
  options = Options("aug");
  options.cache = true;
  trainer = ElasticTrainer::Create(*model, options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto metrics = (*trainer)->TrainEpoch(Clusters(64, /*augmented=*/true));
  EXPECT_FALSE(metrics.ok());
  EXPECT_NE(std::string(metrics.status().message()).find("augmentation"), std::string::npos)
      << metrics.status();
  options.name = "aug2";
  options.bypass_cache_on_augmentation = true;
  trainer = ElasticTrainer::Create(*model, options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  metrics = (*trainer)->TrainEpoch(Clusters(64, /*augmented=*/true));
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->cache_hit_rate, 0);
}

}  // namespace
}  // namespace pipe
}  // namespace weft
