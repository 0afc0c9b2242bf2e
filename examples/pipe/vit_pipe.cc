// The elastic-pipeline demo (pipe/README.md): the demo ViT (examples/pipe/vit.h, 18
// layer groups) learns the synthetic image task (examples/pipe/synthetic.h) on N ranks with
// pipe::ElasticTrainer. It starts as one pipeline of K = N stages (k0); after every epoch
// AutoFreeze freezes a growing prefix of layer groups, AutoPipe halves K while the
// trainable layers still fit the first plan's largest stage, AutoDP turns the freed ranks
// into more pipeline replicas, and AutoCache serves the frozen prefix's output per sample.
//
//   tools/weftrun -np 8 bazel-bin/examples/pipe/vit_pipe [options]
//
// Rank 0 prints one table row per epoch (the configuration it trained with, how it got
// there, throughput, loss and test accuracy), with --pipe-lines followed by the trainer's
// machine-readable `PIPE ...` line; on a terminal, a progress bar while an epoch runs. Test
// accuracy is measured after every epoch; evaluation and transitions are not training time.
//
// Options: `vit_pipe --help` lists them, with their defaults (the demo's, tuned for 8
// ranks on a 2-core machine).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "examples/pipe/recipe.h"
#include "examples/pipe/synthetic.h"
#include "examples/pipe/vit.h"
#include "examples/terminal.h"
#include "pipe/runtime/runtime.h"
#include "pipe/runtime/trainer.h"
#include "tools/cli/flags.h"

namespace {

using weft::examples::SyntheticImages;
using weft::examples::VitConfig;

struct Flags {
  VitConfig model;
  int epochs = 5;
  double alpha = 1.0 / 3.0;
  int64_t batch = 64;
  double lr = 3e-3;
  int64_t warmup = 50;
  int micro_batches = 0;
  std::string schedule = "gpipe";
  int k0 = 0;
  bool freeze = true, autopipe = true, autodp = true, cache = true;
  bool gradient_aware = false;
  int64_t train_size = 4096;
  int64_t test_size = 1024;
  double noise = 0.4;
  uint64_t seed = 1;
  int threads = 1;
  bool compare = false;
  double target = 0.0;
  int expect_k = 0;
  bool quiet = false;
  bool pipe_lines = false;
  std::string cache_dir;
};

Flags Parse(int argc, char** argv) {
  Flags f;
  weft::cli::FlagSet flags(
      "vit_pipe",
      "The elastic-pipeline demo: the demo ViT on the synthetic image task with freezing, "
      "AutoPipe, AutoDP and AutoCache (examples/pipe/vit_pipe.cc).\n"
      "Run it on several ranks: tools/weftrun -np 8 vit_pipe [options]; the defaults are "
      "tuned for 8 ranks on 2 cores.");
  flags.Int("--epochs", &f.epochs, "epochs", 1)
      .Real("--alpha", &f.alpha, "AutoFreeze's alpha, in (0, 1]", 0, 1)
      .Int("--batch", &f.batch, "global batch, over all replicas", 1)
      .Real("--lr", &f.lr, "peak learning rate", 0)
      .Int("--warmup", &f.warmup, "steps of linear warm-up, then cosine decay to 0", 0)
      .Int("--micro-batches", &f.micro_batches, "micro-batches per replica (0: 2 K)", 0)
      .String("--schedule", &f.schedule, "the pipeline schedule", {"gpipe", "1f1b"})
      .Int("--k0", &f.k0, "initial pipeline length (0: the world size)", 0)
      .Set("--no-freeze", &f.freeze, false, "no freezing (and so no AutoPipe, AutoDP, cache)")
      .Set("--no-autopipe", &f.autopipe, false, "K never shrinks")
      .Set("--no-autodp", &f.autodp, false, "freed ranks stay idle")
      .Set("--no-cache", &f.cache, false, "no AutoCache")
      .Set("--cache", &f.cache, true, "AutoCache (the default)")
      .String("--cache-dir", &f.cache_dir,
              "AutoCache's spill directory, the same path on every rank")
      .Set("--gradient-aware", &f.gradient_aware, true,
           "AutoFreeze's gradient-norm policy on top of the schedule")
      .Int("--train-size", &f.train_size, "training images (at least --batch)", 1)
      .Int("--test-size", &f.test_size, "test images", 1)
      .Real("--noise", &f.noise, "noise of the synthetic images", 0)
      .Uint("--seed", &f.seed, "random seed")
      .Int("--threads", &f.threads, "intra-op threads per rank", 1)
      .Set("--compare", &f.compare, true,
           "then train a static pipeline from the same seed and compare")
      .Real("--target", &f.target, "exit 1 unless the final test accuracy reaches it")
      .Int("--expect-k", &f.expect_k, "exit 1 unless the last epoch trained with K = N (0: any)", 0)
      .Set("--quiet", &f.quiet, true, "no table; only the final RESULT line")
      .Set("--pipe-lines", &f.pipe_lines, true, "after each table row, the trainer's PIPE line");
  flags.ParseOrExit(argc, argv);
  if (f.train_size < f.batch) flags.Fail("--train-size must be at least --batch");
  if (!(f.alpha > 0.0)) flags.Fail("--alpha is in (0, 1]");
  if (!(f.lr > 0.0)) flags.Fail("--lr must be positive");
  return f;
}


struct Progress {
  bool on = false;
  int epoch = 0, epochs = 0;
  int64_t first = 0, steps = 1, last_drawn = -1;
  void Step(int64_t global) {
    if (!on) return;
    const int64_t done = std::min(steps, std::max<int64_t>(0, global + 1 - first));
    // At most 20 updates per epoch (mpirun hands the ranks a terminal even when its own
    // output goes to a file).
    const int64_t tick = 20 * done / steps;
    if (tick <= last_drawn) return;
    last_drawn = tick;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / steps);
    std::printf("\r  epoch %d/%d [%.*s%*s] %3d%%", epoch, epochs, filled,
                "##############################", kWidth - filled, "",
                static_cast<int>(100 * done / steps));
    std::fflush(stdout);
  }
  void Clear() {
    if (on && last_drawn >= 0) std::printf("\r%*s\r", 60, "");
    last_drawn = -1;
  }
};


int Fail(const weft::Status& s) {
  std::fprintf(stderr, "vit_pipe (rank %d): %s\n", weft::rank(), s.ToString().c_str());
  return 1;
}

std::string Join(const std::vector<int>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) out += sep;
    out += std::to_string(v[i]);
  }
  return out;
}

struct RunResult {
  double accuracy = 0;
  double train_seconds = 0;
  double transition_seconds = 0;
  double loss = 0;
  int final_k = 0, final_replicas = 0, final_frozen = 0;
  std::vector<int> ks, replicas;
};

weft::StatusOr<RunResult> Train(const Flags& f, const weft::pipe::TensorDataset& train,
                                const weft::pipe::TensorDataset& test, bool freeze,
                                const std::string& name, bool print) {
  const int me = weft::rank();
  const bool table = print && me == 0 && !f.quiet;
  torch::nn::Sequential vit = weft::examples::MakeVit(f.model, f.seed);
  WEFT_ASSIGN_OR_RETURN(weft::pipe::LayerList model, weft::pipe::LayerList::FromSequential(vit));

  weft::examples::LrSchedule schedule;
  schedule.lr = f.lr;
  schedule.warmup = f.warmup;
  schedule.total = (train.size() / f.batch) * f.epochs;
  Progress progress;
  progress.on = table && weft::examples::OutputIsATerminal();
  progress.epochs = f.epochs;
  progress.steps = train.size() / f.batch;

  weft::pipe::TrainerOptions options;
  options.k0 = f.k0;
  options.freeze = freeze;
  options.alpha = f.alpha;
  options.gradient_aware = f.gradient_aware;
  options.autopipe = f.autopipe;
  options.autodp = f.autodp;
  options.cache = f.cache;
  options.cache_dir = f.cache_dir;
  options.schedule =
      f.schedule == "1f1b" ? weft::pipe::ScheduleKind::kOneFOneB : weft::pipe::ScheduleKind::kGPipe;
  options.micro_batches = f.micro_batches;
  options.batch_size = f.batch;
  options.seed = f.seed;
  options.name = name;
  options.make_optimizer = [&schedule, &progress](std::vector<at::Tensor> params) {
    return std::make_unique<weft::examples::ScheduledAdam>(
        std::move(params), &schedule, [&progress](int64_t global) { progress.Step(global); });
  };
  options.loss = [](const at::Tensor& out, const at::Tensor& y) {
    return torch::nn::functional::cross_entropy(out, y);
  };
  WEFT_ASSIGN_OR_RETURN(auto trainer, weft::pipe::ElasticTrainer::Create(model, options));

  if (table) {
    std::printf("\n%s: %d ranks, %d layer groups, k0 = %d; %s\n", name.c_str(), weft::size(),
                model.size(), trainer->plan().k,
                freeze ? "AutoFreeze + AutoPipe + AutoDP + AutoCache (as flagged)"
                       : "no freezing: a static pipeline");
    std::printf("%5s %6s %3s %4s %-12s %-26s %9s %7s %8s %6s %6s %7s %8s\n", "epoch", "frozen",
                "K", "repl", "new ranks", "layers per stage", "samples/s", "trans_s",
                "syncs/s", "cache", "bubble", "loss", "test_acc");
  }
  RunResult r;
  std::vector<int> newly;  // ranks the transition into this epoch activated
  double into = 0;         // seconds of that transition
  for (int e = 0; e < f.epochs; ++e) {
    progress.epoch = e + 1;
    progress.first = static_cast<int64_t>(e) * progress.steps;
    WEFT_ASSIGN_OR_RETURN(weft::pipe::EpochMetrics m, trainer->TrainEpoch(train));
    progress.Clear();
    WEFT_ASSIGN_OR_RETURN(double accuracy, trainer->Evaluate(test));
    r.train_seconds += m.train_seconds;
    r.transition_seconds += m.transition_seconds;
    r.accuracy = accuracy;
    r.loss = m.loss;
    r.final_k = m.k;
    r.final_replicas = m.replicas;
    r.final_frozen = m.frozen;
    r.ks.push_back(m.k);
    r.replicas.push_back(m.replicas);
    if (table) {
      const std::string fresh = newly.empty() ? "-" : Join(newly, ",");
      std::printf("%5d %6d %3d %4d %-12s %-26s %9.1f %7.2f %8.2f %5.0f%% %5.0f%% %7.4f %7.2f%%\n",
                  e + 1, m.frozen, m.k, m.replicas, fresh.c_str(),
                  Join(m.stage_layers, "+").c_str(), m.samples_per_second, into,
                  m.syncs_per_second, 100 * m.cache_hit_rate, 100 * m.bubble_fraction, m.loss,
                  100 * accuracy);
      if (f.pipe_lines) std::printf("  %s test_acc=%.4f\n", m.ToLine().c_str(), accuracy);
      std::fflush(stdout);
    }
    newly = m.newly_active;
    into = m.transition_seconds;
  }
  if (table) {
    std::printf("%s: test accuracy %.2f%%, training %.1f s (transitions %.2f s)\n",
                name.c_str(), 100 * r.accuracy, r.train_seconds, r.transition_seconds);
  }
  return r;
}

int Run(const Flags& f) {
  const int me = weft::rank(), n = weft::size();
  const SyntheticImages train_images(f.train_size, f.model, f.seed,
                                     SyntheticImages::Split::kTrain,
                                     static_cast<float>(f.noise));
  const SyntheticImages test_images(f.test_size, f.model, f.seed, SyntheticImages::Split::kTest,
                                    static_cast<float>(f.noise));
  auto train_set = weft::examples::Pregenerate(train_images);
  auto test_set = weft::examples::Pregenerate(test_images);
  if (!train_set.ok()) return Fail(train_set.status());
  if (!test_set.ok()) return Fail(test_set.status());
  const weft::pipe::TensorDataset& train = *train_set;
  const weft::pipe::TensorDataset& test = *test_set;
  if (me == 0 && !f.quiet) {
    const VitConfig& c = f.model;
    std::printf("vit_pipe: ViT image %d patch %d dim %d depth %d (%d groups) on %d ranks; "
                "train %lld test %lld, batch %lld, Adam lr %g (warm-up %lld, cosine), "
                "%d epochs, alpha %.4g, schedule %s, threads %d\n",
                c.image, c.patch, c.dim, c.depth, c.groups(), n,
                static_cast<long long>(f.train_size), static_cast<long long>(f.test_size),
                static_cast<long long>(f.batch), f.lr, static_cast<long long>(f.warmup),
                f.epochs, f.alpha, f.schedule.c_str(), f.threads);
    std::fflush(stdout);
  }
  auto elastic = Train(f, train, test, f.freeze, "elastic", true);
  if (!elastic.ok()) return Fail(elastic.status());
  std::string ks, reps;
  for (size_t i = 0; i < elastic->ks.size(); ++i) {
    ks += (i ? ">" : "") + std::to_string(elastic->ks[i]);
    reps += (i ? ">" : "") + std::to_string(elastic->replicas[i]);
  }
  std::string result = "RESULT ranks=" + std::to_string(n) + " epochs=" +
                       std::to_string(f.epochs) + " k=" + ks + " replicas=" + reps;
  char buffer[512];
  std::snprintf(buffer, sizeof buffer, " frozen=%d accuracy=%.4f loss=%.4f train_s=%.2f "
                "transition_s=%.2f",
                elastic->final_frozen, elastic->accuracy, elastic->loss,
                elastic->train_seconds, elastic->transition_seconds);
  result += buffer;
  if (f.compare) {
    auto baseline = Train(f, train, test, /*freeze=*/false, "nofreeze", true);
    if (!baseline.ok()) return Fail(baseline.status());
    const double diff = 100 * (elastic->accuracy - baseline->accuracy);
    const double speedup = baseline->train_seconds / std::max(elastic->train_seconds, 1e-9);
    if (me == 0 && !f.quiet) {
      std::printf("\ncompare (training time only: no evaluation, no transitions)\n"
                  "  elastic   (freeze + AutoPipe/AutoDP/AutoCache): accuracy %6.2f%%  "
                  "training %6.1f s\n"
                  "  no freeze (static %d-stage pipeline):         accuracy %6.2f%%  "
                  "training %6.1f s\n"
                  "  difference %+.2f points, speedup %.2fx\n",
                  100 * elastic->accuracy, elastic->train_seconds, baseline->ks.front(),
                  100 * baseline->accuracy, baseline->train_seconds, diff, speedup);
    }
    std::snprintf(buffer, sizeof buffer, " nofreeze_accuracy=%.4f nofreeze_train_s=%.2f "
                  "diff_points=%+.2f speedup=%.3f",
                  baseline->accuracy, baseline->train_seconds, diff, speedup);
    result += buffer;
  }
  int rc = 0;
  if (elastic->accuracy < f.target) {
    if (me == 0) {
      std::fprintf(stderr, "vit_pipe: final test accuracy %.4f is below the target %.4f\n",
                   elastic->accuracy, f.target);
    }
    rc = 1;
  }
  if (f.expect_k > 0 && elastic->final_k != f.expect_k) {
    if (me == 0) {
      std::fprintf(stderr, "vit_pipe: the last epoch trained with K = %d, expected %d\n",
                   elastic->final_k, f.expect_k);
    }
    rc = 1;
  }
  if (me == 0) {
    std::printf("%s%s\n", f.quiet ? "" : "\n", result.c_str());
    std::fflush(stdout);
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = Parse(argc, argv);
  if (weft::Status s = weft::init(); !s.ok()) {
    std::fprintf(stderr, "vit_pipe: %s\n", s.ToString().c_str());
    return 1;
  }
  at::set_num_threads(flags.threads);
  int rc = Run(flags);
  weft::Status s = weft::shutdown();
  if (!s.ok() && rc == 0) rc = Fail(s);
  return rc;
}
