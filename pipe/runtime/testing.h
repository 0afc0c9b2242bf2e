// Helpers shared by the pipeline runtime's tests (pipe/runtime/pipeline_test.cc, one
// process, and tests/pipe/pipeline_test.cc, several ranks): the plain-autograd reference a
// pipeline step must match.
#ifndef WEFT_PIPE_RUNTIME_TESTING_H_
#define WEFT_PIPE_RUNTIME_TESTING_H_

#include <ATen/ATen.h>

#include "pipe/runtime/runtime.h"

namespace weft {
namespace pipe {
namespace testing {

inline at::Tensor Mse(const at::Tensor& out, const at::Tensor& target) {
  return at::mse_loss(out, target);
}

inline double MaxDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// Plain autograd in one process over the whole mini-batch, layers below `frozen` without
// autograd, MSE loss. Returns the loss; the gradients land in `model`'s parameters (none
// when every layer is frozen).
inline double ReferenceStep(const LayerList& model, const at::Tensor& inputs,
                            const at::Tensor& targets, int frozen) {
  at::Tensor x = inputs;
  for (int layer = 0; layer < model.size(); ++layer) {
    if (layer < frozen) {
      at::NoGradGuard no_grad;
      x = model.Forward(layer, x);
    } else {
      x = model.Forward(layer, x);
    }
  }
  at::Tensor loss = Mse(x, targets);
  if (loss.requires_grad()) loss.backward();
  return loss.item<double>();
}

}  // namespace testing
}  // namespace pipe
}  // namespace weft

#endif  // WEFT_PIPE_RUNTIME_TESTING_H_
