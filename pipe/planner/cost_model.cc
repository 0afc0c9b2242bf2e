#include "pipe/planner/cost_model.h"

#include <algorithm>
#include <cmath>

namespace weft {
namespace planner {

namespace {

// A trainable unit runs forward and backward; the backward pass costs about twice the
// forward one (the gradients of both the activations and the weights).
constexpr double kTrainableOverForward = 3.0;
constexpr double kBytesPerGradient = 4.0;  // float32 gradients

Status CheckPositive(const char* flag, double value, const char* meaning) {
  if (!std::isfinite(value) || value <= 0) {
    return InvalidArgument("expected ", flag, " > 0 (", meaning, "), found ", value);
  }
  return OkStatus();
}

}  // namespace

Status ValidateCostOptions(const CostOptions& options) {
  WEFT_RETURN_IF_ERROR(
      CheckPositive("--batch", options.batch, "samples per replica per mini-batch"));
  WEFT_RETURN_IF_ERROR(CheckPositive("--tokens", options.tokens, "tokens per sample"));
  WEFT_RETURN_IF_ERROR(CheckPositive("--flops", options.flops, "FLOP/s of one device"));
  WEFT_RETURN_IF_ERROR(
      CheckPositive("--bandwidth", options.bandwidth, "bytes/s of the gradient allreduce"));
  return OkStatus();
}

double UnitSecondsPerSample(const Unit& unit, bool frozen, const CostOptions& options) {
  if (frozen && options.cache) return 0;
  const double forward = unit.time.has_value() ? *unit.time / kTrainableOverForward
                                               : 2.0 * unit.params * options.tokens / options.flops;
  return frozen ? forward : kTrainableOverForward * forward;
}

StatusOr<Prediction> Predict(const Model& model, const pipe::Plan& plan,
                             const CostOptions& options) {
  WEFT_RETURN_IF_ERROR(ValidateCostOptions(options));
  const std::vector<int>& bounds = plan.partition.boundaries;
  if (plan.k < 1 || static_cast<int>(bounds.size()) != plan.k + 1 || bounds.front() != 0 ||
      bounds.back() != model.layers()) {
    return InvalidArgument("expected a plan of ", model.layers(),
                           " units with K + 1 stage "
                           "boundaries from 0 to ",
                           model.layers(), ", found K = ", plan.k, " and ", bounds.size(),
                           " boundaries (was the plan made for "
                           "another model?)");
  }
  if (plan.micro_batches < 1 || plan.replicas < 1) {
    return InvalidArgument("expected a plan with micro-batches >= 1 and replicas >= 1, found ",
                           plan.micro_batches, " and ", plan.replicas);
  }
  Prediction p;
  p.k = plan.k;
  p.replicas = plan.replicas;
  p.micro_batches = plan.micro_batches;
  const double samples_per_micro_batch = options.batch / plan.micro_batches;
  double largest_trainable = 0;
  for (int s = 0; s < plan.k; ++s) {
    StagePrediction stage;
    stage.first = bounds[s];
    stage.last = bounds[s + 1];
    double seconds_per_sample = 0;
    for (int u = stage.first; u < stage.last; ++u) {
      const bool frozen = u < plan.frozen;
      (frozen ? stage.frozen_params : stage.trainable_params) += model.units[u].params;
      seconds_per_sample += UnitSecondsPerSample(model.units[u], frozen, options);
    }
    stage.seconds_per_micro_batch = seconds_per_sample * samples_per_micro_batch;
    p.max_stage_seconds = std::max(p.max_stage_seconds, stage.seconds_per_micro_batch);
    largest_trainable = std::max(largest_trainable, stage.trainable_params);
    p.stages.push_back(stage);
  }
  p.pipeline_seconds = (plan.micro_batches + plan.k - 1) * p.max_stage_seconds;
  const int r = plan.replicas;
  p.sync_seconds =
      r > 1 ? 2.0 * (r - 1) / r * kBytesPerGradient * largest_trainable / options.bandwidth : 0.0;
  p.step_seconds = p.pipeline_seconds + p.sync_seconds;
  if (!(p.step_seconds > 0)) {
    return InvalidArgument("expected a step that takes time, found 0 s: every unit of ",
                           model.title,
                           " costs nothing (all parameter counts or times are "
                           "0, or everything is frozen and cached)");
  }
  p.throughput = r * options.batch / p.step_seconds;
  WEFT_ASSIGN_OR_RETURN(const pipe::Schedule schedule,
                        pipe::MakeSchedule(options.schedule, plan.k, plan.micro_batches));
  p.bubble = schedule.BubbleFraction();
  return p;
}

}  // namespace planner
}  // namespace weft
