// Single-process reference for the elastic-pipeline demo: trains the demo ViT
// (examples/pipe/vit.h) on the synthetic image task (examples/pipe/synthetic.h), no MPI.
// With --freeze-alpha it also freezes a growing prefix of layer groups after each epoch,
// on the AutoFreeze schedule (pipe/README.md), so the accuracy cost of freezing
// can be measured apart from any pipelining.
//
//   bazel run -c opt //examples/pipe:vit_baseline -- --epochs 5 [--freeze-alpha 0.3333]
//
// Options: `vit_baseline --help` lists them, with their defaults (the demo's).
// Prints one line per epoch: frozen groups, mean training loss, test accuracy, seconds,
// training samples/s.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "examples/pipe/recipe.h"
#include "examples/pipe/synthetic.h"
#include "examples/pipe/vit.h"
#include "pipe/freeze/freeze.h"
#include "tools/cli/flags.h"

namespace {

using Clock = std::chrono::steady_clock;
using weft::examples::SyntheticImages;
using weft::examples::VitConfig;

struct Flags {
  VitConfig model;
  int epochs = 5;
  int64_t batch = 32;
  double lr = 1e-3;
  std::string optimizer = "adam";
  double momentum = 0.9;
  int64_t warmup = 100;
  std::string schedule = "cosine";
  int64_t train_size = 4096;
  int64_t test_size = 2048;
  double noise = 0.5;
  uint64_t seed = 1;
  int threads = 1;
  double freeze_alpha = 0.0;
};

Flags Parse(int argc, char** argv) {
  Flags f;
  weft::cli::FlagSet flags(
      "vit_baseline",
      "Single-process reference for the elastic-pipeline demo: the demo ViT on the synthetic "
      "image task, with AutoFreeze's schedule at most (examples/pipe/vit_baseline.cc).");
  flags.Int("--epochs", &f.epochs, "epochs", 1)
      .Int("--batch", &f.batch, "batch size", 1)
      .Real("--lr", &f.lr, "peak learning rate", 0)
      .String("--optimizer", &f.optimizer, "the optimizer", {"adam", "sgd"})
      .Real("--momentum", &f.momentum, "sgd's momentum", 0)
      .Int("--warmup", &f.warmup, "steps of linear warm-up", 0)
      .String("--schedule", &f.schedule, "learning rate after the warm-up (cosine: to 0)",
              {"cosine", "constant"})
      .Int("--train-size", &f.train_size, "training images", 1)
      .Int("--test-size", &f.test_size, "test images", 1)
      .Real("--noise", &f.noise, "noise of the synthetic images", 0)
      .Uint("--seed", &f.seed, "random seed")
      .Int("--threads", &f.threads, "intra-op threads", 1)
      .Real("--freeze-alpha", &f.freeze_alpha,
            "after epoch e, freeze groups 0 .. F-1, F = ceil(L (1 - (1 - A)^e)), at most "
            "L - 1 (0: never)",
            0, 1)
      .Int("--image", &f.model.image, "image side, pixels", 1)
      .Int("--patch", &f.model.patch, "patch side, pixels (divides --image)", 1)
      .Int("--channels", &f.model.channels, "image channels", 1)
      .Int("--dim", &f.model.dim, "token width", 1)
      .Int("--depth", &f.model.depth, "encoder blocks", 1)
      .Int("--heads", &f.model.heads, "attention heads (divides --dim)", 1)
      .Int("--mlp", &f.model.mlp, "hidden width of the MLP half", 1)
      .Int("--classes", &f.model.classes, "classes", 2);
  flags.ParseOrExit(argc, argv);
  return f;
}

void SetLearningRate(torch::optim::Optimizer* optimizer, double lr) {
  for (auto& group : optimizer->param_groups()) {
    auto& options = group.options();
    if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options)) adam->lr(lr);
    if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options)) sgd->lr(lr);
  }
}

// Runs groups 0 .. frozen-1 without autograd (they are constants now: no graph is kept
// for them, as the pipeline's first stage will do), the rest with it.
at::Tensor Forward(torch::nn::Sequential& model, int frozen, at::Tensor x) {
  int g = 0;
  for (auto it = model->begin(); it != model->end(); ++it, ++g) {
    if (g < frozen) {
      torch::NoGradGuard no_grad;
      x = it->forward(x);
    } else {
      x = it->forward(x);
    }
  }
  return x;
}

// Makes groups 0 .. frozen-1 constants. Their gradients are dropped, not zeroed: LibTorch
// 1.13's zero_grad() keeps a zero gradient, and Adam would go on moving a parameter with
// a defined (zero) gradient from its momentum; it skips undefined ones.
void Freeze(torch::nn::Sequential& model, int frozen) {
  for (int g = 0; g < frozen; ++g) {
    for (at::Tensor& p : model[g]->parameters()) {
      p.set_requires_grad(false);
      p.mutable_grad().reset();
    }
  }
}

double Evaluate(torch::nn::Sequential& model, const SyntheticImages& test) {
  torch::NoGradGuard no_grad;
  model->eval();
  constexpr int64_t kBatch = 256;
  int64_t correct = 0;
  for (int64_t begin = 0; begin < test.size(); begin += kBatch) {
    std::vector<int64_t> ids(std::min(kBatch, test.size() - begin));
    std::iota(ids.begin(), ids.end(), begin);
    at::Tensor images, labels;
    test.Get(ids, &images, &labels);
    correct += model->forward(images).argmax(1).eq(labels).sum().item<int64_t>();
  }
  model->train();
  return static_cast<double>(correct) / test.size();
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = Parse(argc, argv);
  at::set_num_threads(f.threads);
  const VitConfig& config = f.model;
  const int layers = config.groups();

  torch::nn::Sequential model = weft::examples::MakeVit(config, f.seed);
  SyntheticImages train(f.train_size, config, f.seed, SyntheticImages::Split::kTrain,
                        static_cast<float>(f.noise));
  SyntheticImages test(f.test_size, config, f.seed, SyntheticImages::Split::kTest,
                       static_cast<float>(f.noise));

  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (f.optimizer == "adam") {
    optimizer = std::make_unique<torch::optim::Adam>(model->parameters(),
                                                     torch::optim::AdamOptions(f.lr));
  } else {
    optimizer = std::make_unique<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(f.lr).momentum(f.momentum));
  }

  int64_t parameters = 0;
  for (const at::Tensor& p : model->parameters()) parameters += p.numel();
  std::printf(
      "vit: image %d patch %d dim %d depth %d heads %d mlp %d classes %d: %d groups, "
      "%lld parameters; train %lld test %lld, batch %lld, %s lr %g (%s, warm-up %lld), "
      "threads %d, freeze-alpha %g\n",
      config.image, config.patch, config.dim, config.depth, config.heads, config.mlp,
      config.classes, layers, static_cast<long long>(parameters),
      static_cast<long long>(f.train_size), static_cast<long long>(f.test_size),
      static_cast<long long>(f.batch), f.optimizer.c_str(), f.lr, f.schedule.c_str(),
      static_cast<long long>(f.warmup), f.threads, f.freeze_alpha);
  std::printf("epoch frozen   loss   test_acc  seconds  samples/s\n");

  const int64_t steps_per_epoch = (f.train_size + f.batch - 1) / f.batch;
  const int64_t total_steps = steps_per_epoch * f.epochs;
  weft::examples::LrSchedule schedule;  // the demo's (examples/pipe/recipe.h)
  schedule.lr = f.lr;
  schedule.warmup = f.warmup;
  schedule.total = total_steps;
  schedule.cosine = f.schedule == "cosine";
  std::mt19937_64 shuffle_rng(f.seed);
  std::vector<int64_t> order(f.train_size);
  std::iota(order.begin(), order.end(), 0);
  int frozen = 0;
  int64_t step = 0;
  double accuracy = 0.0;
  for (int epoch = 1; epoch <= f.epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), shuffle_rng);
    const auto start = Clock::now();
    double loss_sum = 0.0;
    for (int64_t begin = 0; begin < f.train_size; begin += f.batch, ++step) {
      const std::vector<int64_t> ids(order.begin() + begin,
                                     order.begin() + std::min(f.train_size, begin + f.batch));
      at::Tensor images, labels;
      train.Get(ids, &images, &labels);
      SetLearningRate(optimizer.get(), schedule.At(step));
      optimizer->zero_grad();
      at::Tensor loss =
          torch::nn::functional::cross_entropy(Forward(model, frozen, images), labels);
      loss.backward();
      optimizer->step();
      loss_sum += loss.item<double>() * static_cast<double>(ids.size());
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    accuracy = Evaluate(model, test);
    std::printf("%5d %6d %8.4f %9.4f %8.2f %10.1f\n", epoch, frozen, loss_sum / f.train_size,
                accuracy, seconds, f.train_size / std::max(seconds, 1e-9));
    std::fflush(stdout);

    if (f.freeze_alpha > 0.0 && epoch < f.epochs) {
      const auto bound = weft::pipe::FreezeBound(layers, f.freeze_alpha, epoch);
      if (!bound.ok()) {
        std::fprintf(stderr, "vit_baseline: %s\n", bound.status().ToString().c_str());
        return 2;
      }
      frozen = std::max(frozen, std::min(layers - 1, *bound));
      Freeze(model, frozen);
    }
  }
  std::printf("final test accuracy %.4f\n", accuracy);
  return 0;
}
