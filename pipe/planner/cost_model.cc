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

Status CheckNonNegative(const char* flag, double value, const char* meaning) {
  if (!std::isfinite(value) || value < 0) {
    return InvalidArgument("expected ", flag, " >= 0 (", meaning, "), found ", value);
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
      CheckPositive("--bandwidth", options.bandwidth, "bytes/s inside a machine"));
  WEFT_RETURN_IF_ERROR(CheckNonNegative("--inter-bandwidth", options.inter_bandwidth,
                                        "bytes/s between machines; 0: --bandwidth"));
  WEFT_RETURN_IF_ERROR(CheckNonNegative("--hidden", options.hidden, "values per token"));
  WEFT_RETURN_IF_ERROR(
      CheckNonNegative("bytes_per_value", options.bytes_per_value, "bytes per value"));
  WEFT_RETURN_IF_ERROR(CheckNonNegative("--optimizer-bytes", options.optimizer_bytes,
                                        "optimizer state bytes per parameter"));
  WEFT_RETURN_IF_ERROR(CheckNonNegative("--cache-bandwidth", options.cache_bandwidth,
                                        "bytes/s of cache reads; 0: --bandwidth"));
  WEFT_RETURN_IF_ERROR(CheckNonNegative("devices_per_machine", options.devices_per_machine,
                                        "devices per machine; 0: one machine"));
  WEFT_RETURN_IF_ERROR(CheckNonNegative("--compute-devices", options.compute_devices,
                                        "devices' worth of compute shared; 0: no bound"));
  return OkStatus();
}

double UnitSecondsPerSample(const Unit& unit, bool frozen, const CostOptions& options) {
  if (frozen && options.cache) return 0;
  const double forward = unit.time.has_value() ? *unit.time / kTrainableOverForward
                                               : 2.0 * unit.params * options.tokens / options.flops;
  return frozen ? forward : kTrainableOverForward * forward;
}

StatusOr<Prediction> Predict(const Model& model, const pipe::Plan& plan,
                             const CostOptions& options, std::optional<int> cached_depth) {
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
  const int r = plan.replicas;
  const double b = options.global_batch ? options.batch / r : options.batch;
  p.samples_per_replica = b;
  const double samples_per_micro_batch = b / plan.micro_batches;
  const int d = options.devices_per_machine;
  auto machine = [d](int rank) { return d > 0 ? rank / d : 0; };
  const double inter = options.inter_bandwidth > 0 ? options.inter_bandwidth : options.bandwidth;
  // Bytes of one sample's activation at a boundary (and of its gradient on the way back).
  const double hidden = options.hidden > 0 ? options.hidden : static_cast<double>(model.hidden);
  const double activation_bytes = options.tokens * hidden * options.bytes_per_value;

  double work_per_sample = 0;  // every stage's compute for one sample
  double inter_gradients = 0, intra_gradients = 0;
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
    work_per_sample += seconds_per_sample;
    stage.seconds_per_micro_batch = seconds_per_sample * samples_per_micro_batch;
    p.max_stage_seconds = std::max(p.max_stage_seconds, stage.seconds_per_micro_batch);
    // The stage's allreduce ring over its replicas: across machines or inside one.
    bool spans = false;
    for (int q = 1; q < r; ++q) {
      spans = spans || machine(plan.ReplicaRanks(q)[s]) != machine(plan.ReplicaRanks(0)[s]);
    }
    const double gradient_bytes = kBytesPerGradient * stage.trainable_params;
    if (spans) {
      inter_gradients += gradient_bytes;
    } else {
      intra_gradients = std::max(intra_gradients, gradient_bytes);
    }
    // The hop to the next stage, forward and backward, on the fill and drain path.
    if (s + 1 < plan.k && activation_bytes > 0) {
      const std::vector<int> ranks = plan.ReplicaRanks(0);
      const double link = machine(ranks[s]) != machine(ranks[s + 1]) ? inter : options.bandwidth;
      p.transfer_seconds += 2 * samples_per_micro_batch * activation_bytes / link;
    }
    p.stages.push_back(stage);
  }
  p.pipeline_seconds =
      (plan.micro_batches + plan.k - 1) * p.max_stage_seconds + p.transfer_seconds;
  if (options.cache && plan.frozen > 0) {
    const int from = std::clamp(cached_depth.value_or(plan.frozen), 0, plan.frozen);
    double fill_per_sample = 0;
    for (int u = from; u < plan.frozen; ++u) {
      CostOptions uncached = options;
      uncached.cache = false;
      fill_per_sample += UnitSecondsPerSample(model.units[u], true, uncached);
    }
    const double cache_read =
        options.cache_bandwidth > 0 ? options.cache_bandwidth : options.bandwidth;
    p.cache_seconds = b * (fill_per_sample + activation_bytes / cache_read);
    work_per_sample += fill_per_sample;
  }
  if (options.compute_devices > 0) {
    p.work_seconds = r * b * work_per_sample / options.compute_devices;
  }
  p.sync_seconds = r > 1 ? 2.0 * (r - 1) / r *
                               std::max(inter_gradients / inter, intra_gradients / options.bandwidth)
                         : 0.0;
  p.step_seconds = std::max(p.pipeline_seconds + p.cache_seconds, p.work_seconds) + p.sync_seconds;
  if (!(p.step_seconds > 0)) {
    return InvalidArgument("expected a step that takes time, found 0 s: every unit of ",
                           model.title,
                           " costs nothing (all parameter counts or times are "
                           "0, or everything is frozen and cached)");
  }
  p.throughput = r * b / p.step_seconds;
  WEFT_ASSIGN_OR_RETURN(const pipe::Schedule schedule,
                        pipe::MakeSchedule(options.schedule, plan.k, plan.micro_batches));
  p.bubble = schedule.BubbleFraction();
  return p;
}

double TransitionBytes(const Model& model, const pipe::Plan& previous, const pipe::Plan& next,
                       const CostOptions& options) {
  double bytes = 0;
  for (int q = 0; q < next.replicas; ++q) {
    const std::vector<int> ranks = next.ReplicaRanks(q);
    for (int s = 0; s < next.k; ++s) {
      const int rank = ranks[s];
      int held_first = 0, held_last = 0;  // the units this rank ran in `previous`
      if (rank < static_cast<int>(previous.roles.size())) {
        const pipe::Role before = previous.roles[rank];
        if (before.active() && before.replica < previous.replicas) {
          held_first = previous.partition.boundaries[before.stage];
          held_last = previous.partition.boundaries[before.stage + 1];
        }
      }
      for (int u = next.partition.boundaries[s]; u < next.partition.boundaries[s + 1]; ++u) {
        const bool frozen = u < next.frozen;
        if (frozen && options.cache) continue;
        if (u >= held_first && u < held_last) continue;
        bytes += model.units[u].params *
                 (options.bytes_per_value + (frozen ? 0.0 : options.optimizer_bytes));
      }
    }
  }
  return bytes;
}

}  // namespace planner
}  // namespace weft
