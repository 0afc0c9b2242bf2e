// One mini-batch through one stage of a pipeline replica (runtime.h, RunPipelineStep).
// The second LibTorch translation unit of pipe/runtime: single-op ATen headers only.
//
// Per stage, the work order is the schedule's (pipe/plan). Every receive is posted before
// any compute, so activations and gradients arrive while the stage works on other
// micro-batches; sends are nonblocking and only waited for at the end. Dependencies are
// the schedule's own, so no stage waits for something its peer has not been told to do.
#include <ATen/ops/cat.h>
#include <ATen/ops/tensor_split.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/comm.h"
#include "comm/torch/torch_comm.h"
#include "pipe/runtime/runtime.h"

namespace weft {
namespace pipe {
namespace {

// Op names: "<tag>.a<m>" is micro-batch m's activation into a stage, "<tag>.g<m>" the
// gradient of that activation back out of it. A name is only matched between the two
// ranks of one pair, and each pair carries one direction of each kind, so m suffices.
std::string ActivationName(const std::string& tag, int m) { return absl::StrCat(tag, ".a", m); }
std::string GradientName(const std::string& tag, int m) { return absl::StrCat(tag, ".g", m); }
std::string LossName(const std::string& tag) { return absl::StrCat(tag, ".loss"); }

// Everything RunPipelineStep checks before it communicates. Sample counts are checked on
// every rank that was given inputs or targets: a middle stage, given neither, cannot know
// them (see runtime.h).
Status ValidateStep(const LayerList& model, const StageSpec& spec, const at::Tensor& inputs,
                    const at::Tensor& targets) {
  const int layers = model.size();
  if (layers < 1) return InvalidArgument("RunPipelineStep: the model has no layers");
  const int k = static_cast<int>(spec.ranks.size());
  if (k < 1) {
    return InvalidArgument("RunPipelineStep: spec.ranks is empty (need one rank per stage)");
  }
  if (static_cast<int>(spec.boundaries.size()) != k + 1) {
    return InvalidArgument("RunPipelineStep: spec.boundaries has ", spec.boundaries.size(),
                           " entries; ", k, " stages need ", k + 1);
  }
  if (spec.boundaries.front() != 0 || spec.boundaries.back() != layers) {
    return InvalidArgument("RunPipelineStep: spec.boundaries [",
                           absl::StrJoin(spec.boundaries, ", "),
                           "] must run from 0 to the model's ", layers, " layers");
  }
  for (int s = 0; s < k; ++s) {
    if (spec.boundaries[s] >= spec.boundaries[s + 1]) {
      return InvalidArgument("RunPipelineStep: spec.boundaries [",
                             absl::StrJoin(spec.boundaries, ", "),
                             "] must be strictly increasing (stage ", s, " is empty)");
    }
  }
  if (spec.stage < 0 || spec.stage >= k) {
    return InvalidArgument("RunPipelineStep: spec.stage ", spec.stage, " is not in [0, ", k, ")");
  }
  // Without comm (a K = 1 pipeline needs none) the process is rank 0 of a world of 1.
  const bool have_comm = is_initialized();
  const int world = have_comm ? size() : 1;
  const int me = have_comm ? rank() : 0;
  if (k > 1 && !have_comm) {
    return FailedPrecondition("RunPipelineStep: a pipeline of ", k,
                              " stages needs weft::init() first");
  }
  std::set<int> seen;
  for (int r : spec.ranks) {
    if (r < 0 || r >= world) {
      return InvalidArgument("RunPipelineStep: rank ", r, " in spec.ranks is not in [0, ", world,
                             ")");
    }
    if (!seen.insert(r).second) {
      return InvalidArgument("RunPipelineStep: rank ", r, " appears twice in spec.ranks [",
                             absl::StrJoin(spec.ranks, ", "), "]");
    }
  }
  if (spec.ranks[spec.stage] != me) {
    return InvalidArgument("RunPipelineStep: spec.stage ", spec.stage, " belongs to rank ",
                           spec.ranks[spec.stage], ", but this is rank ", me);
  }
  if (spec.frozen < 0 || spec.frozen > layers) {
    return InvalidArgument("RunPipelineStep: spec.frozen ", spec.frozen, " is not in [0, ", layers,
                           "]");
  }
  if (spec.input_depth < 0 || spec.input_depth > spec.frozen) {
    return InvalidArgument("RunPipelineStep: spec.input_depth ", spec.input_depth,
                           " is not in [0, frozen = ", spec.frozen, "]");
  }
  if (spec.micro_batches < 1) {
    return InvalidArgument("RunPipelineStep: spec.micro_batches is ", spec.micro_batches,
                           "; need at least 1");
  }
  if (spec.stage == 0 && !inputs.defined()) {
    return InvalidArgument("RunPipelineStep: stage 0 needs inputs");
  }
  if (spec.stage == k - 1 && !targets.defined()) {
    return InvalidArgument("RunPipelineStep: the last stage needs targets");
  }
  for (const auto& [what, tensor] :
       {std::pair<const char*, const at::Tensor*>{"inputs", &inputs}, {"targets", &targets}}) {
    if (!tensor->defined()) continue;
    if (tensor->dim() < 1) {
      return InvalidArgument("RunPipelineStep: ", what, " need a sample dimension (dim 0)");
    }
    if (tensor->size(0) < spec.micro_batches) {
      return InvalidArgument("RunPipelineStep: ", spec.micro_batches, " micro-batches for ",
                             tensor->size(0), " samples (", what,
                             "); need at most one micro-batch per sample");
    }
  }
  if (inputs.defined() && targets.defined() && inputs.size(0) != targets.size(0)) {
    return InvalidArgument("RunPipelineStep: ", inputs.size(0), " input samples but ",
                           targets.size(0), " targets");
  }
  return OkStatus();
}

StatusOr<StepResult> RunStage(const LayerList& model, const StageSpec& spec,
                              const Schedule& schedule, const at::Tensor& inputs,
                              const at::Tensor& targets, const LossFn& loss_fn,
                              const StepOptions& options) {
  const int k = static_cast<int>(spec.ranks.size());
  const int s = spec.stage;
  const int m_count = spec.micro_batches;
  const bool first = s == 0;
  const bool last = s == k - 1;
  const std::vector<int>& b = spec.boundaries;
  // Layers below input_depth were already applied to the inputs, wherever they sit (the
  // frozen prefix may span several stages; such a stage then just passes data on).
  const int begin = std::max(b[s], spec.input_depth);
  const int end = b[s + 1];
  // Frozen layers are a prefix: a stage is trainable iff its last layer is, and then so is
  // every later stage.
  const bool trainable = options.backward && end > spec.frozen;
  const bool prev_trainable = options.backward && !first && b[s] > spec.frozen;
  const bool recv_grads = trainable && !last;

  // The whole step runs in the mode the options ask for, whatever the caller's mode is.
  c10::AutoGradMode grad_mode(options.backward);

  // Receives first, so that transfers overlap everything below.
  std::vector<torch_api::TorchHandle> act_recv(m_count), grad_recv(m_count);
  if (!first) {
    for (int m = 0; m < m_count; ++m) {
      WEFT_ASSIGN_OR_RETURN(
          act_recv[m], torch_api::recv_nonblocking(spec.ranks[s - 1], ActivationName(spec.tag, m)));
    }
  }
  if (recv_grads) {
    for (int m = 0; m < m_count; ++m) {
      WEFT_ASSIGN_OR_RETURN(
          grad_recv[m], torch_api::recv_nonblocking(spec.ranks[s + 1], GradientName(spec.tag, m)));
    }
  }
  std::vector<torch_api::TorchHandle> sends;

  std::vector<at::Tensor> input_chunks, target_chunks;
  if (first) input_chunks = at::tensor_split(inputs, m_count, 0);
  int64_t samples = 0;
  if (last) {
    target_chunks = at::tensor_split(targets, m_count, 0);
    samples = targets.size(0);
  }

  // Per micro-batch, what its backward needs: this stage's input (for its gradient) and
  // its output (or, on the last stage, its weighted loss). Released after the backward.
  std::vector<at::Tensor> stage_in(m_count), stage_out(m_count), outputs;
  double loss_sum = 0;

  for (const Work& work : schedule.StageOrder(s)) {
    const int m = work.micro_batch;
    if (work.forward) {
      at::Tensor x;
      if (first) {
        x = input_chunks[m];
      } else {
        WEFT_ASSIGN_OR_RETURN(x, act_recv[m].wait());
        act_recv[m] = {};
        // A fresh leaf: its .grad becomes the gradient sent back.
        if (prev_trainable) x.requires_grad_(true);
      }
      at::Tensor y = x;
      for (int layer = begin; layer < end; ++layer) {
        if (layer < spec.frozen) {
          c10::NoGradGuard no_grad;
          y = model.Forward(layer, y);
        } else {
          y = model.Forward(layer, y);
        }
      }
      if (!last) {
        WEFT_ASSIGN_OR_RETURN(
            torch_api::TorchHandle send,
            torch_api::send_nonblocking(y.detach().contiguous(), spec.ranks[s + 1],
                                        ActivationName(spec.tag, m)));
        sends.push_back(std::move(send));
        if (trainable) stage_out[m] = y;
      } else {
        const at::Tensor& target = target_chunks[m];
        at::Tensor loss = loss_fn(y, target);
        if (!loss.defined() || loss.numel() != 1) {
          return InvalidArgument(
              "RunPipelineStep: the loss function must return one value (the "
              "micro-batch's mean loss); it returned ",
              loss.defined() ? loss.numel() : 0, " values");
        }
        // Weighted by the micro-batch's share of the samples, so the weighted losses (and
        // their gradients) sum to the mini-batch's mean.
        loss = loss.reshape({}).mul(static_cast<double>(target.size(0)) /
                                    static_cast<double>(samples));
        loss_sum += loss.detach().to(at::kDouble).item<double>();
        if (options.keep_outputs) outputs.push_back(y.detach());
        if (trainable) stage_out[m] = loss;
      }
      if (prev_trainable) stage_in[m] = x;
    } else {
      if (!trainable) continue;  // forward only, or a stage of frozen layers
      if (last) {
        // Without a path to a trainable parameter (say, a stage of parameterless layers
        // behind frozen ones) there is nothing to accumulate.
        if (stage_out[m].requires_grad()) stage_out[m].backward();
      } else {
        WEFT_ASSIGN_OR_RETURN(at::Tensor grad, grad_recv[m].wait());
        grad_recv[m] = {};
        if (stage_out[m].requires_grad()) stage_out[m].backward(grad);
      }
      stage_out[m] = at::Tensor();
      if (prev_trainable) {
        at::Tensor grad_in = stage_in[m].grad();
        // An input the output does not depend on gets no gradient: it is zero.
        if (!grad_in.defined()) grad_in = at::zeros_like(stage_in[m]);
        WEFT_ASSIGN_OR_RETURN(torch_api::TorchHandle send,
                              torch_api::send_nonblocking(grad_in.contiguous(), spec.ranks[s - 1],
                                                          GradientName(spec.tag, m)));
        sends.push_back(std::move(send));
        stage_in[m] = at::Tensor();
      }
    }
  }
  for (const torch_api::TorchHandle& send : sends) {
    WEFT_RETURN_IF_ERROR(send.wait().status());
  }

  StepResult result;
  result.loss = loss_sum;
  result.samples = samples;
  if (k > 1) {
    // The last stage alone computes the loss; the sample count travels with it because a
    // middle stage is given neither inputs nor targets.
    at::Tensor shared = at::zeros({2}, at::kDouble);
    if (last) {
      shared[0] = loss_sum;
      shared[1] = static_cast<double>(samples);
    }
    WEFT_RETURN_IF_ERROR(
        torch_api::broadcast_(shared, spec.ranks[k - 1], LossName(spec.tag), spec.ranks));
    result.loss = shared[0].item<double>();
    result.samples = static_cast<int64_t>(shared[1].item<double>());
  }
  if (last && options.keep_outputs) result.outputs = at::cat(outputs, 0);
  return result;
}

}  // namespace

StatusOr<StepResult> RunPipelineStep(const LayerList& model, const StageSpec& spec,
                                     const at::Tensor& inputs, const at::Tensor& targets,
                                     const LossFn& loss, const StepOptions& options) {
  WEFT_RETURN_IF_ERROR(ValidateStep(model, spec, inputs, targets));
  WEFT_ASSIGN_OR_RETURN(
      Schedule schedule,
      MakeSchedule(spec.schedule, static_cast<int>(spec.ranks.size()), spec.micro_batches));
  // Layers and the loss function are user code: their exceptions become a Status (ops
  // already in flight complete on their own; their handles keep the tensors alive).
  try {
    return RunStage(model, spec, schedule, inputs, targets, loss, options);
  } catch (const c10::Error& e) {
    return Internal("RunPipelineStep (stage ", spec.stage, ", tag ", spec.tag,
                    "): LibTorch failed: ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Internal("RunPipelineStep (stage ", spec.stage, ", tag ", spec.tag, "): ", e.what());
  }
}

}  // namespace pipe
}  // namespace weft
