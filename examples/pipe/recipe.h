// The elastic-pipeline demo's training recipe, shared by examples/pipe/vit_pipe.cc and
// bench/pipe_bench.cc so that the benchmark measures the demo's training: the data set
// generated once, and Adam with a linear warm-up then cosine decay over the run's steps.
#ifndef WEFT_EXAMPLES_PIPE_RECIPE_H_
#define WEFT_EXAMPLES_PIPE_RECIPE_H_

#include <torch/optim/adam.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "core/status.h"
#include "examples/pipe/synthetic.h"
#include "pipe/runtime/trainer.h"

namespace weft {
namespace examples {

// Every sample of `images`, generated once (they depend only on the seed and the id), so
// that a step costs an index_select. No augmentation: AutoCache may cache them.
StatusOr<pipe::TensorDataset> Pregenerate(const SyntheticImages& images);

// Linear warm-up over `warmup` steps, then cosine decay to 0 at step `total` (or, with
// `cosine` off, constant).
struct LrSchedule {
  double lr = 1e-3;
  int64_t warmup = 0;
  int64_t total = 1;
  bool cosine = true;
  double At(int64_t step) const;
};

// Adam whose learning rate follows `schedule` over the global step. The elastic trainer
// steps each layer's optimizer once per global step while the layer trains, and moves its
// state (Adam's per-parameter step count included) to the ranks that take the layer over,
// so Adam's own step count is the global step on whichever rank holds the layer.
// `on_step(global)` runs before each step (a progress bar); it may be empty.
class ScheduledAdam : public torch::optim::Adam {
 public:
  ScheduledAdam(std::vector<at::Tensor> params, const LrSchedule* schedule,
                std::function<void(int64_t)> on_step = nullptr);
  at::Tensor step(LossClosure closure = nullptr) override;

 private:
  int64_t GlobalStep() const;
  const LrSchedule* schedule_;
  std::function<void(int64_t)> on_step_;
};

}  // namespace examples
}  // namespace weft

#endif  // WEFT_EXAMPLES_PIPE_RECIPE_H_
