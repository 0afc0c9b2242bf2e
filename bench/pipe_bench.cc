// pipe_bench: the elastic pipeline (freeze + AutoPipe + AutoDP + AutoCache) against the
// static pipeline (no freezing, K = K0 fixed, the same ranks), in one run, on the demo ViT
// (examples/pipe/vit.h, 18 layer groups) and its synthetic task, plus the ablation rows.
// Each row: measured training time (training steps and transitions; evaluation excluded),
// speedup over static, time to the target accuracy, final accuracy, and the planner's
// predicted speedup for the same configuration (pipe/planner's cost model on the ViT's real
// per-layer parameter counts and this run's settings). Run with bench/pipe_bench.sh.
//
//   mpirun -np 8 pipe_bench [--epochs N] [--train-size N] [--test-size N] [--batch N]
//                           [--micro-batches N] [--target X] [--lr X] [--alpha X]
//                           [--compute-devices X] [--configs static,freeze,autopipe,autodp,full]
//
// Rank 0 prints one "ROW key=value ..." line per configuration, one "EPOCH ..." line per
// epoch, and "CALIBRATION ..." (the measured FLOP/s of one rank, fed to the planner).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adam.h>
#include <torch/utils.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "comm/torch/torch_comm.h"
#include "examples/pipe/recipe.h"
#include "examples/pipe/synthetic.h"
#include "examples/pipe/vit.h"
#include "pipe/planner/planner.h"
#include "pipe/runtime/trainer.h"
#include "tools/cli/flags.h"

namespace {

using weft::examples::SyntheticImages;
using weft::examples::VitConfig;

struct Flags {
  int epochs = 5;
  int64_t train_size = 4096;
  int64_t test_size = 1024;
  int64_t batch = 64;
  int micro_batches = 8;
  double target = 0.97;
  double lr = 3e-3;      // the demo's: warm-up then cosine decay (examples/pipe/recipe.h)
  int64_t warmup = 50;
  double noise = 0.4;
  double alpha = 1.0 / 3.0;
  double compute_devices = 0;  // 0: the machine's cores
  std::string configs = "static,freeze,autopipe,autodp,full";
};

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "pipe_bench: %s\n", why.c_str());
  std::exit(2);
}

Flags Parse(int argc, char** argv) {
  Flags f;
  weft::cli::FlagSet flags("pipe_bench",
                           "The elastic-pipelining ablation on the demo ViT: static, freeze only, "
                           "+ AutoPipe, + AutoDP, + AutoCache (bench/README.md).");
  flags.Int("--epochs", &f.epochs, "epochs", 1)
      .Int("--train-size", &f.train_size, "training images", 1)
      .Int("--test-size", &f.test_size, "test images", 1)
      .Int("--batch", &f.batch, "global batch", 1)
      .Int("--micro-batches", &f.micro_batches, "micro-batches per replica", 1)
      .Real("--target", &f.target, "the test accuracy to_target_s waits for")
      .Real("--lr", &f.lr, "peak learning rate", 0)
      .Int("--warmup", &f.warmup, "steps of linear warm-up", 0)
      .Real("--noise", &f.noise, "noise of the synthetic images", 0)
      .Real("--alpha", &f.alpha, "AutoFreeze's alpha", 0, 1)
      .Real("--compute-devices", &f.compute_devices,
            "what the planner's prediction assumes (0: the machine's cores)", 0)
      .String("--configs", &f.configs, "which rows to run, comma-separated");
  flags.ParseOrExit(argc, argv);
  return f;
}

struct Config {
  std::string key, label;
  bool freeze, autopipe, autodp, cache;
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Check(const weft::Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.ToString());
}

// FLOP/s of one rank on this model: forward + backward of a batch, single-threaded, counted
// as the planner counts (6 x parameters x tokens per sample).
double Calibrate(const VitConfig& config, const SyntheticImages& data, double params) {
  torch::nn::Sequential model = weft::examples::MakeVit(config, 7);
  std::vector<int64_t> ids(64);
  std::iota(ids.begin(), ids.end(), 0);
  at::Tensor x, y;
  data.Get(ids, &x, &y);
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    const double t0 = Now();
    at::Tensor loss = at::cross_entropy_loss(model->forward(x), y);
    loss.backward();
    const double t = Now() - t0;
    if (rep > 0) best = std::min(best, t);
  }
  return 6.0 * params * config.tokens() * 64 / best;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = Parse(argc, argv);
  at::set_num_threads(1);  // 8 ranks share the machine's cores
  Check(weft::init(), "init");
  const int me = weft::rank();
  const int world = weft::size();

  VitConfig config;
  // The demo's data and recipe (examples/pipe/recipe.h).
  SyntheticImages train(f.train_size, config, 1, SyntheticImages::Split::kTrain,
                        static_cast<float>(f.noise));
  SyntheticImages test(f.test_size, config, 1, SyntheticImages::Split::kTest,
                       static_cast<float>(f.noise));
  auto train_data = weft::examples::Pregenerate(train);
  auto test_data = weft::examples::Pregenerate(test);
  Check(train_data.status(), "generating the training set");
  Check(test_data.status(), "generating the test set");
  const weft::pipe::TensorDataset& train_set = *train_data;
  const weft::pipe::TensorDataset& test_set = *test_data;
  weft::examples::LrSchedule schedule;
  schedule.lr = f.lr;
  schedule.warmup = f.warmup;
  schedule.total = f.epochs * (f.train_size / f.batch);

  // The ViT's real per-layer parameter counts, for the planner.
  auto probe = weft::pipe::LayerList::FromSequential(weft::examples::MakeVit(config, 1));
  if (!probe.ok()) Die(probe.status().ToString());
  const std::vector<double> counts = probe->ParameterCounts();
  weft::planner::Model plan_model;
  plan_model.name = plan_model.title = "demo ViT";
  plan_model.hidden = config.dim;
  plan_model.default_tokens = config.tokens();
  double params = 0;
  for (size_t l = 0; l < counts.size(); ++l) {
    plan_model.units.push_back({"group" + std::to_string(l), counts[l], std::nullopt});
    params += counts[l];
  }
  // Calibrate on rank 0 alone (the others wait), then share.
  at::Tensor flops = at::zeros({1}, at::kDouble);
  if (me == 0) flops[0] = Calibrate(config, train, params);
  Check(weft::barrier(), "barrier");
  {
    std::vector<double> v = {flops[0].item<double>()};
    at::Tensor t = at::tensor(v, at::kDouble);
    Check(weft::torch_api::broadcast_(t, 0, "bench.flops"), "broadcast");
    flops = t;
  }
  const double cores = f.compute_devices > 0
                           ? f.compute_devices
                           : static_cast<double>(std::thread::hardware_concurrency());
  if (me == 0) {
    std::printf("CALIBRATION flops_per_rank=%.4g compute_devices=%g params=%.0f groups=%zu "
                "tokens=%d world=%d\n",
                flops[0].item<double>(), cores, params, counts.size(), config.tokens(), world);
  }

  const std::vector<Config> all = {
      {"static", "static (K=8, no freezing)", false, false, false, false},
      {"freeze", "freeze only", true, false, false, false},
      {"autopipe", "+ AutoPipe", true, true, false, false},
      {"autodp", "+ AutoDP", true, true, true, false},
      {"full", "+ AutoCache (full system)", true, true, true, true},
  };
  for (const Config& c : all) {
    if (("," + f.configs + ",").find("," + c.key + ",") == std::string::npos) continue;
    // Prediction.
    double predicted = 1.0;
    if (c.freeze) {
      weft::planner::PlannerOptions po;
      po.machines = 1;
      po.devices = world;
      po.k0 = std::min(8, world);
      po.alpha = f.alpha;
      po.epochs = f.epochs;
      po.micro_batches = f.micro_batches;
      po.autopipe = c.autopipe;
      po.autodp = c.autodp;
      po.epoch_samples = static_cast<double>(f.train_size / f.batch * f.batch);
      po.cost.batch = static_cast<double>(f.batch);
      po.cost.global_batch = true;
      po.cost.flops = flops[0].item<double>();
      po.cost.compute_devices = cores;
      po.cost.cache = c.cache;
      po.cost.optimizer_bytes = 8;  // Adam
      auto r = weft::planner::RunPlanner(plan_model, po);
      if (!r.ok()) Die("planner: " + r.status().ToString());
      predicted = r->overall_speedup;
    }
    auto layers = weft::pipe::LayerList::FromSequential(weft::examples::MakeVit(config, 1));
    if (!layers.ok()) Die(layers.status().ToString());
    weft::pipe::TrainerOptions o;
    o.name = "bench." + c.key;
    o.k0 = std::min(8, world);
    o.freeze = c.freeze;
    o.alpha = f.alpha;
    o.autopipe = c.autopipe;
    o.autodp = c.autodp;
    o.cache = c.cache;
    o.lambda = 1.0 / 3.0;  // what a frozen group costs (forward only), as the planner charges
    o.micro_batches = f.micro_batches;
    o.batch_size = f.batch;
    o.make_optimizer = [&schedule](std::vector<at::Tensor> p) {
      return std::make_unique<weft::examples::ScheduledAdam>(std::move(p), &schedule);
    };
    o.loss = [](const at::Tensor& out, const at::Tensor& y) {
      return at::cross_entropy_loss(out, y);
    };
    auto trainer = weft::pipe::ElasticTrainer::Create(*layers, o);
    if (!trainer.ok()) Die(trainer.status().ToString());
    double elapsed = 0, to_target = -1, accuracy = 0;
    int64_t samples = 0;
    for (int e = 0; e < f.epochs; ++e) {
      auto m = (*trainer)->TrainEpoch(train_set);
      if (!m.ok()) Die(m.status().ToString());
      elapsed += m->train_seconds + m->transition_seconds;
      samples += m->samples;
      auto acc = (*trainer)->Evaluate(test_set, 256);
      if (!acc.ok()) Die(acc.status().ToString());
      accuracy = *acc;
      if (to_target < 0 && accuracy >= f.target) to_target = elapsed;
      if (me == 0) {
        std::printf("EPOCH config=%s epoch=%d frozen=%d k=%d replicas=%d train_s=%.3f "
                    "transition_s=%.3f samples_per_s=%.1f loss=%.4f accuracy=%.4f "
                    "cache_hit_rate=%.3f\n",
                    c.key.c_str(), e, m->frozen, m->k, m->replicas, m->train_seconds,
                    m->transition_seconds, m->samples_per_second, m->loss, accuracy,
                    m->cache_hit_rate);
        std::fflush(stdout);
      }
    }
    if (me == 0) {
      std::printf("ROW config=%s label=\"%s\" train_s=%.3f samples_per_s=%.1f to_target_s=%.3f "
                  "accuracy=%.4f predicted=%.4f\n",
                  c.key.c_str(), c.label.c_str(), elapsed, samples / elapsed, to_target, accuracy,
                  predicted);
      std::fflush(stdout);
    }
  }
  Check(weft::barrier(), "barrier");
  Check(weft::shutdown(), "shutdown");
  return 0;
}
