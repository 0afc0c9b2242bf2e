// Decentralized training: an MLP learns a synthetic classification task on every rank at
// once, each rank on its own shard, combining parameters only with its neighbors (by
// default adapt-with-combine over the dynamic one-peer exponential graph).
//
//   tools/weftrun -np 4 bazel-bin/examples/train [options]
//
// The data is generated on the fly: each class is a union of three Gaussian clusters in
// `--features` dimensions (centers shared by every rank), so the task is learnable but not
// linearly separable. Each rank draws its own training samples; every rank
// evaluates on the same held-out set. Rank 0 prints, per epoch: loss, test accuracy
// (averaged over ranks), the consensus distance of the parameters, and samples/s over all
// ranks; on a terminal, a progress bar while the epoch runs.
//
// Options: `train --help` lists them, with their defaults.
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/topology.h"
#include "comm/torch/torch_comm.h"
#include "examples/terminal.h"
#include "optim/optim.h"
#include "tools/cli/flags.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string optimizer = "awc";
  std::string communication = "neighbor_allreduce";
  std::string topology = "exp2";
  bool dynamic = true;
  int64_t j = 1;
  int epochs = 8;
  int64_t batch = 64;
  int64_t samples = 8192;
  double lr = 0.05;
  int64_t hidden = 128;
  int64_t features = 32;
  int64_t classes = 10;
  int64_t seed = 1;
  double target = 0.95;
  int64_t steps = 0;
  int64_t test_samples = 4096;
  int64_t eval_every = 0;
  bool eval_average = false;
  bool independent_init = false;
  bool quiet = false;
  bool overlap = true;
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr, "train: %s (train --help lists the options)\n", why);
  std::exit(2);
}

Flags Parse(int argc, char** argv) {
  Flags f;
  weft::cli::FlagSet flags(
      "train",
      "Decentralized training of an MLP on a synthetic task, every rank on its own shard "
      "(examples/train.cc).\nRun it on several ranks: tools/weftrun -np 4 train [options]");
  flags
      .String("--optimizer", &f.optimizer, "the distributed optimizer",
              {"awc", "atc", "gradient_allreduce", "win_put", "push_sum", "local"})
      .String("--communication", &f.communication, "what awc and atc combine with",
              {"neighbor_allreduce", "hierarchical", "allreduce", "empty"})
      .String("--topology", &f.topology, "the graph", {"exp2", "ring", "mesh", "star", "full"})
      .Set("--static", &f.dynamic, false,
           "the static topology instead of the dynamic one-peer schedule over it")
      .Int("--J", &f.j, "num_steps_per_communication")
      .Int("--epochs", &f.epochs, "epochs", 1)
      .Int("--batch", &f.batch, "batch size per rank", 1)
      .Int("--samples", &f.samples, "training samples per rank (at least --batch)", 1)
      .Real("--lr", &f.lr, "learning rate")
      .Int("--hidden", &f.hidden, "hidden layer width", 1)
      .Int("--features", &f.features, "input dimensions", 1)
      .Int("--classes", &f.classes, "classes", 2)
      .Int("--seed", &f.seed, "random seed")
      .Real("--target", &f.target, "exit 1 unless the final test accuracy reaches it")
      .Int("--steps", &f.steps, "stop each epoch after this many steps (0: whole epochs)")
      .Int("--test-samples", &f.test_samples, "size of the common test set", 1)
      .Int("--eval-every", &f.eval_every,
           "also evaluate after every N steps (0: after each epoch only)", 0)
      .Set("--independent-init", &f.independent_init, true,
           "every rank starts from its own random parameters, not rank 0's")
      .Set("--eval-average", &f.eval_average, true,
           "also evaluate the average of all ranks' parameters")
      .Set("--quiet", &f.quiet, true, "machine-readable EVAL, EPOCH and RESULT lines")
      .Set("--no-overlap", &f.overlap, false,
           "start communication in step() (measures what overlap hides)");
  flags.ParseOrExit(argc, argv);
  if (f.samples < f.batch) flags.Fail("--samples must be at least --batch");
  return f;
}

// A step's wall time in the steady state: the steps after the first kWindow (start-up:
// first touches, the first rounds' connections) in windows of kWindow consecutive steps,
// the median of the windows' means. A window holds whole periods of the one-peer schedules
// (of 1 to 4 peers taken in turn), and a hiccup of the machine lands in one window instead
// of the whole mean. Too few steps for 3 windows: the mean over all steps.
double SteadyStepSeconds(const std::vector<double>& walls) {
  constexpr size_t kWindow = 12;
  std::vector<double> means;
  for (size_t at = kWindow; at + kWindow <= walls.size(); at += kWindow) {
    double sum = 0;
    for (size_t k = at; k < at + kWindow; ++k) sum += walls[k];
    means.push_back(sum / kWindow);
  }
  if (means.size() < 3) {
    double sum = 0;
    for (double w : walls) sum += w;
    return walls.empty() ? 0 : sum / static_cast<double>(walls.size());
  }
  std::sort(means.begin(), means.end());
  const size_t m = means.size();
  return m % 2 ? means[m / 2] : (means[m / 2 - 1] + means[m / 2]) / 2;
}

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t hidden, int64_t out)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, out))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

// The task: every class is a union of three Gaussian clusters (so no linear model solves
// it) in `features` dimensions; the cluster centers are the same on every rank (seeded by
// --seed only), each rank draws its own samples.
struct Task {
  static constexpr int64_t kClusters = 3;
  torch::Tensor centers;  // [classes * kClusters, features]
  Task(int64_t features, int64_t classes, int64_t seed) {
    torch::manual_seed(seed);
    centers = torch::randn({classes * kClusters, features});
  }
  // `n` samples and their labels, from the current random state.
  std::pair<torch::Tensor, torch::Tensor> Draw(int64_t n) const {
    const torch::Tensor cluster = torch::randint(centers.size(0), {n}, torch::kLong);
    const torch::Tensor x =
        centers.index_select(0, cluster) + 1.0 * torch::randn({n, centers.size(1)});
    return {x, cluster.div(kClusters, "floor")};
  }
};

int Fail(const weft::Status& s) {
  std::fprintf(stderr, "train (rank %d): %s\n", weft::rank(), s.ToString().c_str());
  return 1;
}

weft::StatusOr<weft::Topology> MakeTopology(const std::string& name, int n) {
  if (name == "exp2") return weft::ExponentialGraph(n);
  if (name == "ring") return weft::RingGraph(n);
  if (name == "mesh") return weft::MeshGrid2DGraph(n);
  if (name == "star") return weft::StarGraph(n);
  if (name == "full") return weft::FullyConnectedGraph(n);
  return weft::InvalidArgument("unknown --topology ", name, " (exp2|ring|mesh|star|full)");
}

void Progress(int epoch, int epochs, int64_t done, int64_t total) {
  const int width = 30;
  const int filled = static_cast<int>(width * done / std::max<int64_t>(total, 1));
  std::printf("\repoch %d/%d [%.*s%*s] %3d%%", epoch, epochs, filled,
              "##############################", width - filled, "",
              static_cast<int>(100 * done / std::max<int64_t>(total, 1)));
  std::fflush(stdout);
}

int Run(const Flags& f) {
  const int me = weft::rank(), n = weft::size();
  weft::optim::Algorithm algorithm = weft::optim::Algorithm::kAdaptWithCombine;
  weft::optim::Options options;
  options.num_steps_per_communication = f.j;
  options.overlap = f.overlap;
  const bool local = f.optimizer == "local";
  if (f.optimizer == "awc" || local) {
    algorithm = weft::optim::Algorithm::kAdaptWithCombine;
  } else if (f.optimizer == "atc") {
    algorithm = weft::optim::Algorithm::kAdaptThenCombine;
  } else if (f.optimizer == "gradient_allreduce") {
    algorithm = weft::optim::Algorithm::kGradientAllreduce;
  } else if (f.optimizer == "win_put") {
    algorithm = weft::optim::Algorithm::kWinPut;
  } else if (f.optimizer == "push_sum") {
    algorithm = weft::optim::Algorithm::kPushSum;
  } else {
    Usage("--optimizer must be awc, atc, gradient_allreduce, win_put, push_sum or local");
  }
  if (local || f.communication == "empty") {
    options.communication_type = weft::optim::CommunicationType::kEmpty;
  } else if (f.communication == "neighbor_allreduce") {
    options.communication_type = weft::optim::CommunicationType::kNeighborAllreduce;
  } else if (f.communication == "hierarchical") {
    options.communication_type = weft::optim::CommunicationType::kHierarchicalNeighborAllreduce;
  } else if (f.communication == "allreduce") {
    options.communication_type = weft::optim::CommunicationType::kAllreduce;
  } else {
    Usage("--communication must be neighbor_allreduce, hierarchical, allreduce or empty");
  }
  auto topo = MakeTopology(f.topology, n);
  if (!topo.ok()) return Fail(topo.status());
  if (weft::Status s = weft::set_topology(*topo); !s.ok()) return Fail(s);
  auto schedule = weft::OnePeerSchedule(*topo, me);
  if (!schedule.ok()) return Fail(schedule.status());
  // Neighbor weights per round only for the ops that take them.
  const bool per_round = f.dynamic && !local &&
                         algorithm != weft::optim::Algorithm::kGradientAllreduce &&
                         (options.communication_type ==
                              weft::optim::CommunicationType::kNeighborAllreduce ||
                          algorithm == weft::optim::Algorithm::kWinPut ||
                          algorithm == weft::optim::Algorithm::kPushSum);

  // Data: this rank's training shard and the common test set.
  const Task task(f.features, f.classes, f.seed);
  torch::manual_seed(f.seed * 1000 + 1 + me);
  const auto [train_x, train_y] = task.Draw(f.samples);
  torch::manual_seed(f.seed * 1000);
  const auto [test_x, test_y] = task.Draw(f.test_samples);

  torch::manual_seed(f.seed * 7 + me);  // each rank draws its own (see --independent-init)
  Mlp model(f.features, f.hidden, f.classes);
  auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(),
                                                 torch::optim::SGDOptions(f.lr).momentum(0.9));
  if (!f.independent_init || algorithm == weft::optim::Algorithm::kGradientAllreduce) {
    // Every rank starts from rank 0's parameters (data parallelism needs it; the
    // decentralized optimizers otherwise spend their first steps averaging unrelated
    // random networks).
    if (auto s = weft::optim::broadcast_parameters(model->named_parameters(), 0); !s.ok()) {
      return Fail(s);
    }
  }
  auto made = weft::optim::DistributedOptimizer::Create(algorithm, sgd, model.ptr(), options);
  if (!made.ok()) return Fail(made.status());
  weft::optim::DistributedOptimizer& opt = **made;

  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  const bool bar = me == 0 && !f.quiet && weft::examples::OutputIsATerminal();
  if (me == 0 && !f.quiet) {
    std::printf("training a %lld-parameter MLP on %d ranks: %s%s%s, %s topology (%s), J = %lld, "
                "%lld samples per rank\n",
                static_cast<long long>(parameters), n,
                local ? "local SGD (no communication)" : weft::optim::AlgorithmName(algorithm),
                (algorithm == weft::optim::Algorithm::kAdaptWithCombine ||
                 algorithm == weft::optim::Algorithm::kAdaptThenCombine) && !local
                    ? " over "
                    : "",
                (algorithm == weft::optim::Algorithm::kAdaptWithCombine ||
                 algorithm == weft::optim::Algorithm::kAdaptThenCombine) && !local
                    ? weft::optim::CommunicationTypeName(options.communication_type)
                    : "",
                f.topology.c_str(), per_round ? "dynamic one-peer" : "static",
                static_cast<long long>(f.j), static_cast<long long>(f.samples));
  }

  const int64_t batches = f.samples / f.batch;
  const int64_t steps_per_epoch = f.steps > 0 ? std::min(f.steps, batches) : batches;
  double accuracy = 0, loss_avg = 0, distance = 0, rate = 0, step_seconds = 0;
  double train_seconds = 0;
  int64_t total_steps = 0;
  std::vector<double> step_walls;  // each step's wall time (SteadyStepSeconds; rank 0 reports)
  // Test accuracy averaged over ranks (each rank's own model on the common test set).
  // Called between steps, when no communication is in flight.
  double average_accuracy = 0;
  auto test_accuracy = [&]() {
    return model->forward(test_x).argmax(1).eq(test_y).to(torch::kDouble).mean().reshape({1});
  };
  auto evaluate = [&]() -> weft::Status {
    model->eval();
    torch::NoGradGuard no_grad;
    torch::Tensor correct = test_accuracy();
    if (f.eval_average) {
      // The consensus model: every parameter averaged over the ranks (one flat allreduce),
      // evaluated in place of this rank's own, which is then put back.
      std::vector<torch::Tensor> params = model->parameters();
      std::vector<torch::Tensor> flat_parts;
      for (const auto& p : params) flat_parts.push_back(p.reshape({-1}));
      const torch::Tensor own = torch::cat(flat_parts);
      torch::Tensor averaged = own.clone();
      if (auto s = weft::torch_api::allreduce_(averaged, /*average=*/true, "train.average");
          !s.ok()) {
        return s;
      }
      auto install = [&](const torch::Tensor& flat) {
        int64_t at = 0;
        for (auto& p : params) {
          p.copy_(flat.slice(0, at, at + p.numel()).view_as(p));
          at += p.numel();
        }
      };
      install(averaged);
      correct = torch::cat({correct, test_accuracy()});
      install(own);
    }
    if (auto s = weft::torch_api::allreduce_(correct, /*average=*/true, "train.accuracy");
        !s.ok()) {
      return s;
    }
    accuracy = correct[0].item<double>();
    if (f.eval_average) average_accuracy = correct[1].item<double>();
    model->train();
    if (me == 0 && f.quiet) {
      std::printf("EVAL step=%lld train_s=%.3f accuracy=%.4f", static_cast<long long>(total_steps),
                  train_seconds, accuracy);
      if (f.eval_average) std::printf(" average_accuracy=%.4f", average_accuracy);
      std::printf("\n");
      std::fflush(stdout);
    }
    return weft::OkStatus();
  };
  for (int epoch = 1; epoch <= f.epochs; ++epoch) {
    model->train();
    const torch::Tensor order = torch::randperm(f.samples, torch::kLong);
    double loss_sum = 0;
    double seconds = 0;  // this epoch's training time
    auto start = Clock::now();
    for (int64_t b = 0; b < steps_per_epoch; ++b) {
      const auto wall_start = Clock::now();
      if (per_round) {
        const weft::SendRecvRanks sr = (*schedule)->Next();
        weft::optim::RoundWeights& w = opt.weights();
        const double share = 1.0 / static_cast<double>(sr.recv_ranks.size() + 1);
        w.self_weight = share;
        w.src_weights = std::map<int, double>{};
        w.dst_weights = std::map<int, double>{};
        for (int r : sr.recv_ranks) (*w.src_weights)[r] = share;
        for (int r : sr.send_ranks) (*w.dst_weights)[r] = 1.0;
      }
      const torch::Tensor idx = order.slice(0, b * f.batch, (b + 1) * f.batch);
      const torch::Tensor x = train_x.index_select(0, idx);
      const torch::Tensor y = train_y.index_select(0, idx);
      opt.zero_grad();
      const torch::Tensor logits = opt.forward([&] { return model->forward(x); });
      const torch::Tensor loss = torch::nn::functional::cross_entropy(logits, y);
      loss.backward();
      const auto step_start = Clock::now();
      if (weft::Status s = opt.step(); !s.ok()) return Fail(s);
      step_seconds += std::chrono::duration<double>(Clock::now() - step_start).count();
      loss_sum += loss.item<double>();
      step_walls.push_back(std::chrono::duration<double>(Clock::now() - wall_start).count());
      if (bar && (b % 8 == 0 || b + 1 == steps_per_epoch)) {
        Progress(epoch, f.epochs, b + 1, steps_per_epoch);
      }
      ++total_steps;
      if (f.eval_every > 0 && total_steps % f.eval_every == 0 && b + 1 < steps_per_epoch) {
        const double part = std::chrono::duration<double>(Clock::now() - start).count();
        seconds += part;
        train_seconds += part;
        if (weft::Status s = evaluate(); !s.ok()) return Fail(s);
        start = Clock::now();
      }
    }
    const double part = std::chrono::duration<double>(Clock::now() - start).count();
    seconds += part;
    train_seconds += part;
    rate = static_cast<double>(steps_per_epoch * f.batch * n) / seconds;

    if (weft::Status s = evaluate(); !s.ok()) return Fail(s);
    torch::Tensor mean_loss =
        torch::tensor({loss_sum / static_cast<double>(steps_per_epoch)}, torch::kDouble);
    if (auto s = weft::torch_api::allreduce_(mean_loss, /*average=*/true, "train.loss"); !s.ok()) {
      return Fail(s);
    }
    loss_avg = mean_loss[0].item<double>();
    auto d = weft::optim::consensus_distance(model->named_parameters());
    if (!d.ok()) return Fail(d.status());
    distance = *d;
    if (me == 0 && f.quiet) {
      // Per epoch, for benchmarks that measure the time to an accuracy.
      std::printf("EPOCH epoch=%d step=%lld train_s=%.3f accuracy=%.4f loss=%.4f\n", epoch,
                  static_cast<long long>(total_steps), train_seconds, accuracy, loss_avg);
      std::fflush(stdout);
    }
    if (me == 0 && !f.quiet) {
      if (bar) std::printf("\r%*s\r", 60, "");
      std::printf("epoch %2d/%d  loss %.4f  accuracy %5.2f%%  consensus distance %.2e  "
                  "%8.0f samples/s\n",
                  epoch, f.epochs, loss_avg, 100 * accuracy, distance, rate);
      std::fflush(stdout);
    }
  }
  if (weft::Status s = opt.close(); !s.ok()) return Fail(s);
  const double steps_per_second = static_cast<double>(total_steps) / train_seconds;
  // Time inside step() per step, averaged over ranks: what communication leaves exposed
  // (plus the local update).
  torch::Tensor exposed =
      torch::tensor({step_seconds / static_cast<double>(total_steps)}, torch::kDouble);
  if (auto s = weft::torch_api::allreduce_(exposed, true, "train.exposed"); !s.ok()) {
    return Fail(s);
  }
  if (me == 0) {
    if (f.quiet) {
      std::printf(
          "RESULT optimizer=%s ranks=%d parameters=%lld steps=%lld train_s=%.4f "
          "steps_per_s=%.2f step_ms=%.4f steady_step_ms=%.4f accuracy=%.4f loss=%.4f "
          "consensus=%.3e",
          f.optimizer.c_str(), n, static_cast<long long>(parameters),
          static_cast<long long>(total_steps), train_seconds, steps_per_second,
          1e3 * exposed[0].item<double>(), 1e3 * SteadyStepSeconds(step_walls), accuracy, loss_avg,
          distance);
      if (f.eval_average) std::printf(" average_accuracy=%.4f", average_accuracy);
      std::printf("\n");
    } else {
      std::printf("final test accuracy %.2f%% (target %.0f%%): %s\n", 100 * accuracy,
                  100 * f.target, accuracy >= f.target ? "reached" : "NOT reached");
    }
  }
  return accuracy >= f.target ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = Parse(argc, argv);
  if (weft::Status s = weft::init(); !s.ok()) {
    std::fprintf(stderr, "train: %s\n", s.ToString().c_str());
    return 1;
  }
  torch::set_num_threads(1);  // one core per rank
  int rc = Run(flags);
  weft::Status s = weft::shutdown();
  if (!s.ok() && rc == 0) rc = Fail(s);
  return rc;
}
