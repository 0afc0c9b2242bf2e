#include "examples/pipe/recipe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <utility>

namespace weft {
namespace examples {

StatusOr<pipe::TensorDataset> Pregenerate(const SyntheticImages& images) {
  std::vector<int64_t> ids(images.size());
  std::iota(ids.begin(), ids.end(), 0);
  at::Tensor inputs, targets;
  images.Get(ids, &inputs, &targets);
  return pipe::TensorDataset::Create(inputs, targets);
}

double LrSchedule::At(int64_t step) const {
  if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (!cosine) return lr;
  const double progress = static_cast<double>(step - warmup) /
                          static_cast<double>(std::max<int64_t>(1, total - warmup));
  return lr * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
}

ScheduledAdam::ScheduledAdam(std::vector<at::Tensor> params, const LrSchedule* schedule,
                             std::function<void(int64_t)> on_step)
    : torch::optim::Adam(std::move(params), torch::optim::AdamOptions(schedule->lr)),
      schedule_(schedule),
      on_step_(std::move(on_step)) {}

at::Tensor ScheduledAdam::step(LossClosure closure) {
  const int64_t global = GlobalStep();
  const double lr = schedule_->At(global);
  for (auto& group : param_groups()) {
    static_cast<torch::optim::AdamOptions&>(group.options()).lr(lr);
  }
  if (on_step_) on_step_(global);
  return torch::optim::Adam::step(std::move(closure));
}

// Adam's step count of the first parameter that has state: the steps taken so far.
int64_t ScheduledAdam::GlobalStep() const {
  for (const auto& group : param_groups()) {
    for (const at::Tensor& p : group.params()) {
      // LibTorch 1.13 keys the state by the parameter's address, as a string.
      auto it = state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
      if (it != state().end()) {
        return static_cast<const torch::optim::AdamParamState&>(*it->second).step();
      }
    }
  }
  return 0;
}

}  // namespace examples
}  // namespace weft
