// The stage runtime of elastic pipelining (pipe/README.md): a model
// as a sequence of layer groups, and one mini-batch through one pipeline replica with the
// GPipe or 1F1B schedule, activations forward and gradients backward between stages over
// comm's point-to-point ops. The trainer (AutoPipe/AutoDP transitions, replica gradient
// sync, AutoCache, metrics) is built on these.
#ifndef WEFT_PIPE_RUNTIME_RUNTIME_H_
#define WEFT_PIPE_RUNTIME_RUNTIME_H_

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "pipe/plan/plan.h"

namespace torch {
namespace nn {
class Sequential;
}
}  // namespace torch

namespace weft {
namespace pipe {

// A model as an ordered sequence of layer groups ("layers"): layers freeze as a prefix and
// pipeline stages hold contiguous slices. Every rank holds the whole list (stages only run
// their slice); copies share the modules.
class LayerList {
 public:
  // Each child of `seq`, in order, is one layer; each takes and returns one tensor.
  // InvalidArgument for an empty Sequential.
  static StatusOr<LayerList> FromSequential(const torch::nn::Sequential& seq);
  // A TorchScript file (torch.jit.save) holding a module whose children, in order, are the
  // layers (e.g. a scripted torch.nn.Sequential); each child's forward takes and returns
  // one tensor. NotFound / InvalidArgument naming the path for a missing or unreadable
  // file or a module without children.
  static StatusOr<LayerList> Load(const std::string& path);

  int size() const;
  // Layer `layer`'s forward (autograd as the caller's mode says).
  at::Tensor Forward(int layer, const at::Tensor& x) const;
  // Parameters and buffers of one layer, with names relative to it, in a fixed order that
  // is the same on every rank for the same model.
  std::vector<std::pair<std::string, at::Tensor>> NamedParameters(int layer) const;
  std::vector<at::Tensor> Parameters(int layer) const;
  std::vector<at::Tensor> Buffers(int layer) const;
  // Per layer: its number of parameter elements (the planner's sizes).
  std::vector<double> ParameterCounts() const;
  // Training or evaluation mode for every layer (dropout...).
  void Train(bool on);

  struct Impl;  // internal

 private:
  std::shared_ptr<Impl> impl_;
};

// Where this rank sits in one pipeline replica for one step.
struct StageSpec {
  std::vector<int> ranks;       // the replica's ranks by stage (K entries)
  std::vector<int> boundaries;  // K + 1: stage s holds layers [boundaries[s], boundaries[s+1])
  int stage = 0;                // this rank's stage: ranks[stage] == comm rank()
  // Layers [0, frozen) are frozen: they run without autograd and get no gradient.
  int frozen = 0;
  // The inputs given to stage 0 have already been through layers [0, input_depth)
  // (AutoCache hands stage 0 the frozen prefix's output): every stage s runs only layers
  // [max(boundaries[s], input_depth), boundaries[s+1]) (the prefix may span stages; such a
  // stage passes the data on). The same on every stage. 0 <= input_depth <= frozen.
  int input_depth = 0;
  ScheduleKind schedule = ScheduleKind::kGPipe;
  int micro_batches = 1;
  // Prefix of the names of this step's ops: unique per replica and step among the ops in
  // flight (e.g. "pipe.e3.r1.s17").
  std::string tag;
};

// The loss of one micro-batch: the mean over its samples.
using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

struct StepResult {
  // The mini-batch's mean loss, on every stage of the replica.
  double loss = 0;
  int64_t samples = 0;
  // On the last stage, when StepOptions::keep_outputs: the model's outputs for the
  // mini-batch (detached, micro-batches concatenated in order); undefined elsewhere.
  at::Tensor outputs;
};

struct StepOptions {
  bool backward = true;      // false: forward only (evaluation; no grad anywhere)
  bool keep_outputs = false;
};

// Runs one mini-batch through this rank's stage of the replica. Every rank of spec.ranks
// calls it with the same spec (except `stage`). Stage 0 passes `inputs` (dim 0 = samples),
// the last stage `targets` (dim 0 = samples); other ranks pass undefined tensors for what
// they do not have (a K = 1 pipeline passes both). The mini-batch is split along dim 0 into
// spec.micro_batches micro-batches (at::tensor_split: the first ones one larger when it
// does not divide; more micro-batches than samples is InvalidArgument), run in the order
// MakeSchedule(spec.schedule, K, M).StageOrder(stage) gives. With backward, the .grad of
// every trainable parameter this stage holds is ACCUMULATED (added to what is there) with
// the gradient of the mini-batch's mean loss: each micro-batch's mean loss weighted by its
// share of the samples, so that the result equals a single-process step on the whole
// mini-batch (tests: 1e-5). A stage whose layers are all frozen runs forward only, and no
// gradient is sent to it. InvalidArgument (before any communication) for a spec that does
// not fit the model or world (sizes, boundaries not increasing from 0 to L, a rank out of
// range or repeated, stage mismatching this rank, frozen / input_depth out of range,
// micro_batches < 1) or missing inputs/targets; errors of the ops otherwise.
StatusOr<StepResult> RunPipelineStep(const LayerList& model, const StageSpec& spec,
                                     const at::Tensor& inputs, const at::Tensor& targets,
                                     const LossFn& loss, const StepOptions& options = {});

}  // namespace pipe
}  // namespace weft

#endif  // WEFT_PIPE_RUNTIME_RUNTIME_H_
