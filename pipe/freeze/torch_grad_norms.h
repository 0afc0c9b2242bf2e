// Per-layer-group gradient norms from LibTorch gradients, for the gradient-aware AutoFreeze
// policy (pipe/freeze/freeze.h). Call once per iteration after backward (after any gradient
// synchronization, before the optimizer zeroes the gradients), then
// GradNormAccumulator::EndIteration(); at a freeze point NextFrozen(..., accumulator.Take(),
// ...). What is accumulated is the sum over the interval of each group's norm, read from the
// gradients at the time of the call: never a reference to the last gradient tensor.
//
//   weft::pipe::GradNormAccumulator norms(num_groups);
//   ... loss.backward();
//   WEFT_RETURN_IF_ERROR(weft::pipe::AddModuleGradNorms(groups, &norms));
//   norms.EndIteration();
#ifndef WEFT_PIPE_FREEZE_TORCH_GRAD_NORMS_H_
#define WEFT_PIPE_FREEZE_TORCH_GRAD_NORMS_H_

#include <ATen/core/Tensor.h>

#include <vector>

#include "core/status.h"
#include "pipe/freeze/freeze.h"

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace weft {
namespace pipe {

// The L2 norm of a group's gradients, sqrt(sum over its parameters of ||grad||^2), reduced
// in double. Parameters without a gradient (frozen, or unused by this iteration's forward)
// are skipped; a group with none has norm 0. Sparse gradients count their stored values.
// Parameters may live on several devices (one host synchronization per device).
// InvalidArgument for an undefined parameter tensor; Internal if LibTorch fails.
StatusOr<double> GroupGradNorm(const std::vector<at::Tensor>& params);

// Adds GroupGradNorm(groups[i]) to layer first_layer + i of `accumulator` for each i. All
// norms are computed before any is added: on an error (a group out of the accumulator's
// range, a NaN/Inf gradient) the accumulator is unchanged. Does not call EndIteration().
Status AddGroupGradNorms(const std::vector<std::vector<at::Tensor>>& groups,
                         GradNormAccumulator* accumulator, int first_layer = 0);
// The same with one module per group (its parameters, recursively); a null module is
// InvalidArgument.
Status AddModuleGradNorms(const std::vector<const torch::nn::Module*>& groups,
                          GradNormAccumulator* accumulator, int first_layer = 0);

}  // namespace pipe
}  // namespace weft

#endif  // WEFT_PIPE_FREEZE_TORCH_GRAD_NORMS_H_
