// The elastic pipeline trainer (pipe/README.md): AutoFreeze at
// freeze points, AutoPipe (shorter pipelines) and AutoDP (more replicas) transitions,
// AutoCache for the frozen prefix, gradient synchronization among the replicas of each
// stage, and per-epoch metrics. Built on RunPipelineStep (runtime.h), comm's point-to-point
// ops and process sets, and pipe/plan's plans.
//
//   weft::init();
//   auto model = pipe::LayerList::FromSequential(MakeModel());
//   pipe::TrainerOptions options;
//   options.make_optimizer = [](std::vector<at::Tensor> params) {
//     return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3));
//   };
//   options.loss = [](const at::Tensor& out, const at::Tensor& y) {
//     return at::cross_entropy_loss(out, y);   // the micro-batch's mean
//   };
//   WEFT_ASSIGN_OR_RETURN(auto trainer, pipe::ElasticTrainer::Create(*model, options));
//   for (int e = 0; e < epochs; ++e) {
//     WEFT_ASSIGN_OR_RETURN(pipe::EpochMetrics m, trainer->TrainEpoch(train_set));
//     std::cout << m.ToLine() << "\n";
//   }
//
// Every rank of the world calls every method (they are collective); every rank holds the
// whole model (a stage runs only its layers; a rank that did not hold a layer it needs
// after a transition receives it, with its optimizer state, from one that did).
#ifndef WEFT_PIPE_RUNTIME_TRAINER_H_
#define WEFT_PIPE_RUNTIME_TRAINER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "pipe/balance/balance.h"
#include "pipe/plan/plan.h"
#include "pipe/runtime/runtime.h"

namespace torch {
namespace optim {
class Optimizer;
}
}  // namespace torch

namespace weft {
namespace pipe {

// Samples by id. The trainer reads only what each rank needs: stage 0 inputs, the last
// stage targets.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // The samples `ids`, stacked along dim 0 in that order; a null pointer: not needed.
  virtual Status Get(const std::vector<int64_t>& ids, at::Tensor* inputs,
                     at::Tensor* targets) const = 0;
  // True when a sample's input differs between epochs (random augmentation before the
  // frozen prefix): AutoCache then refuses, or is bypassed (TrainerOptions).
  virtual bool random_augmentation() const { return false; }
};

// A data set held in memory: sample i is inputs[i] and targets[i].
class TensorDataset : public Dataset {
 public:
  // InvalidArgument for undefined tensors, no sample dimension, or different sample counts.
  static StatusOr<TensorDataset> Create(at::Tensor inputs, at::Tensor targets,
                                        bool random_augmentation = false);
  int64_t size() const override;
  Status Get(const std::vector<int64_t>& ids, at::Tensor* inputs,
             at::Tensor* targets) const override;
  bool random_augmentation() const override { return augmentation_; }

 private:
  at::Tensor inputs_, targets_;
  bool augmentation_ = false;
};

struct TrainerOptions {
  // Initial pipeline length; 0: min(world size, layers).
  int k0 = 0;
  // AutoFreeze, at the end of every `freeze_every_epochs`-th epoch.
  bool freeze = true;
  double alpha = 1.0 / 3.0;
  bool gradient_aware = false;
  int freeze_every_epochs = 1;
  // AutoPipe: K halves while the balanced stages fit M0. Off: K stays k0.
  bool autopipe = true;
  // AutoDP: the devices a shorter pipeline frees host more replicas. Off: the replica
  // count stays what the first plan had; freed ranks idle.
  bool autodp = true;
  // AutoCache: stage 0 serves the frozen prefix's output from a cache per sample.
  bool cache = false;
  std::optional<size_t> cache_bytes;  // unset: WEFT_CACHE_BYTES
  std::string cache_dir;              // spill directory shared on a machine; "": none
  bool bypass_cache_on_augmentation = false;  // else a data set with augmentation fails
  // Partitioning: a frozen layer costs lambda times its parameters (0 with the cache: the
  // cache serves them).
  double lambda = 1.0 / 6.0;
  Strategy strategy = Strategy::kOptimal;
  ScheduleKind schedule = ScheduleKind::kGPipe;
  // How the replicas of a stage stay together. kAllreduce: gradients are averaged over
  // all of them every step (the replicas stay identical). kGossip: decentralized, as in
  // Bluefog: each replica steps on its own gradients, then averages its parameters with
  // one other replica of the stage (one-peer exponential-2 schedule over the replicas: at
  // step t, replica r pairs with r XOR 2^(t mod ceil(log2 R)), none when that is >= R), a
  // process set of two ranks instead of R. At a freeze point the stage's replicas average
  // their parameters and adopt replica 0's optimizer state, so every transition starts
  // from identical replicas.
  enum class ReplicaSync { kAllreduce, kGossip };
  ReplicaSync sync = ReplicaSync::kAllreduce;
  // Micro-batches per replica mini-batch (capped at its sample count); 0: 2 K.
  int micro_batches = 0;
  // Samples per optimizer step over all replicas (each replica takes an equal share).
  int64_t batch_size = 64;
  uint64_t seed = 1;  // the epochs' sample orders
  // One optimizer per layer, over that layer's parameters (so that a layer's state moves
  // with it at transitions). Required.
  std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>
      make_optimizer;
  LossFn loss;  // required: the micro-batch's mean loss
  // Op names start with this (two trainers at once need different prefixes).
  std::string name = "pipe";
};

struct EpochMetrics {
  int epoch = 0;          // 0-based
  // The configuration the epoch trained with.
  int frozen = 0;
  int k = 0;
  int replicas = 0;
  int micro_batches = 0;
  std::vector<int> stage_layers;     // layers per stage
  std::vector<double> stage_costs;   // the plan's costs per stage
  double bubble_fraction = 0;        // (K - 1) / (M + K - 1)
  // Training only: from the first step to the last (no transition, no evaluation).
  double train_seconds = 0;
  int64_t samples = 0;
  double samples_per_second = 0;
  double loss = 0;                   // mean over the epoch's steps
  double syncs_per_second = 0;       // data-parallel gradient synchronizations (steps with R > 1)
  double cache_hit_rate = 0;         // frozen-prefix lookups that found an entry (at the
                                     // frozen depth, or shallower to resume from)
  // The transition at the end of the epoch (freeze point); zero when none ran.
  bool transitioned = false;
  int next_frozen = 0;
  int next_k = 0;
  int next_replicas = 0;
  std::vector<int> newly_active;
  double transition_seconds = 0;
  int64_t transition_bytes = 0;      // weights and optimizer state moved, on all ranks

  // "PIPE epoch=0 frozen=0 k=8 replicas=1 ...": one machine-readable line.
  std::string ToLine() const;
};

class ElasticTrainer {
 public:
  // Collective. Checks the options against the model and the world (a world of fewer
  // ranks than k0, more stages than layers, a missing optimizer factory or loss:
  // InvalidArgument on every rank), broadcasts rank 0's parameters so that every rank
  // starts from the same model, and makes the first plan.
  static StatusOr<std::unique_ptr<ElasticTrainer>> Create(const LayerList& model,
                                                          const TrainerOptions& options);
  ~ElasticTrainer();

  // Collective: one epoch over `data` (sample order from options.seed and the epoch; the
  // last partial global batch is dropped), then the freeze point's transition.
  StatusOr<EpochMetrics> TrainEpoch(const Dataset& data);
  // Collective: the fraction of `data` whose argmax output equals the target (forward
  // only through the current pipelines, the replicas splitting the samples).
  StatusOr<double> Evaluate(const Dataset& data, int64_t batch_size = 256);

  const Plan& plan() const;
  int epoch() const;
  // This rank's role in the current plan.
  Role role() const;
  // Layers this rank holds up to date: its stage's, and with AutoCache on stage 0 the
  // frozen prefix too.
  std::vector<int> held_layers() const;
  // The optimizer of `layer` (every rank has one per layer; only held ones step).
  torch::optim::Optimizer& optimizer(int layer);

  struct Impl;

 private:
  explicit ElasticTrainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipe
}  // namespace weft

#endif  // WEFT_PIPE_RUNTIME_TRAINER_H_
