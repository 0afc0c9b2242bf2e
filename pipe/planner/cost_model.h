// weft-plan's cost model: the time of one mini-batch step of a plan, from layer costs. Every
// term and its source is in pipe/planner/README.md ("The cost model"); in short, per step of
// a plan with K stages, R replicas, M micro-batches and b samples per replica:
//
//   forward of a unit per sample  = 2 x params x tokens / flops (or time / 3, measured)
//   trainable unit: 3 x forward; frozen: 1 x forward; frozen with AutoCache: 0 in the
//   pipeline (the newly frozen units' forward and the cache read are charged apart)
//   pipeline = (M + K - 1) x the largest stage per micro-batch
//            + the fill and drain hops: 2 x sum over boundaries of (b / M) x tokens x hidden
//              x 4 bytes / the link's bandwidth (inside a machine or between machines)
//   sync     = 2 (R - 1) / R x max(sum of the trainable gradient bytes of the stages whose
//              replicas span machines / inter_bandwidth, the largest stage's gradient bytes of
//              those that do not / bandwidth)       (ring allreduces sharing the NIC)
//   cache    = b x (forward of the units frozen since the cached depth + tokens x hidden x 4
//              bytes / cache_bandwidth), before the pipeline (stage 0 serves the prefix)
//   step     = max(pipeline + cache, the work bound with compute_devices) + sync
//   throughput = R x b / step
#ifndef WEFT_PIPE_PLANNER_COST_MODEL_H_
#define WEFT_PIPE_PLANNER_COST_MODEL_H_

#include <optional>
#include <vector>

#include "core/status.h"
#include "pipe/plan/plan.h"
#include "pipe/planner/model.h"

namespace weft {
namespace planner {

// The defaults describe the PipeTransformer paper's testbed (2 machines x 8 NVIDIA Quadro
// RTX 5000, PCIe 3.0 x16 inside a machine, InfiniBand between them): README.md.
struct CostOptions {
  double batch = 256;  // samples per pipeline replica per mini-batch (see global_batch)
  // True: `batch` is the mini-batch over all replicas, each replica taking batch / R (weft's
  // runtime, TrainerOptions::batch_size). False: each replica takes `batch` (the paper's
  // AutoDP: more replicas, larger global batch).
  bool global_batch = false;
  // Tokens per sample; must be > 0 for Predict. The planner reads 0 as the model's default.
  double tokens = 0;
  double flops = 11.2e12;        // FLOP/s of one device (the RTX 5000's float32 peak)
  double bandwidth = 15.754e9;   // bytes/s inside a machine (PCIe 3.0 x16)
  double inter_bandwidth = 5e9;  // bytes/s between machines (InfiniBand, 40 Gb/s); 0: bandwidth
  // Values per token crossing a stage boundary; 0: the model's hidden size (a layer file has
  // none: no boundary transfer and no cache read are costed).
  double hidden = 0;
  double bytes_per_value = 4;  // activations, gradients and weights: float32
  // Optimizer state per trainable parameter moved to a new replica at a transition (bytes;
  // 4: SGD with momentum, the paper's; 8: Adam).
  double optimizer_bytes = 4;
  bool cache = false;          // AutoCache: the frozen prefix's output is read from a cache
  double cache_bandwidth = 0;  // bytes/s reading cached activations into a device; 0: bandwidth
  // Devices per machine (the placement of ranks, for which links a transfer crosses); 0: all
  // on one machine. The planner sets it from --devices.
  int devices_per_machine = 0;
  // > 0: every device shares the compute of this many devices (an oversubscribed machine:
  // 8 ranks on 2 cores is 2); a step then takes at least all its work / this many devices.
  double compute_devices = 0;
  pipe::ScheduleKind schedule = pipe::ScheduleKind::kGPipe;
};

// InvalidArgument naming the option for a non-positive or non-finite batch, tokens, flops or
// bandwidth, or a negative (or non-finite) inter_bandwidth, hidden, bytes_per_value,
// optimizer_bytes, cache_bandwidth, devices_per_machine or compute_devices.
Status ValidateCostOptions(const CostOptions& options);

struct StagePrediction {
  int first = 0;  // units [first, last)
  int last = 0;
  double trainable_params = 0;
  double frozen_params = 0;
  double seconds_per_micro_batch = 0;
};

struct Prediction {
  int k = 0;
  int replicas = 0;
  int micro_batches = 0;
  std::vector<StagePrediction> stages;
  double max_stage_seconds = 0;  // per micro-batch
  double transfer_seconds = 0;   // the fill and drain hops (part of pipeline_seconds)
  double pipeline_seconds = 0;   // per mini-batch
  double cache_seconds = 0;      // AutoCache: reading the prefix, computing newly frozen units
  double work_seconds = 0;       // all the step's compute / compute_devices (0: not bounded)
  double sync_seconds = 0;       // per mini-batch
  double step_seconds = 0;       // max(pipeline + cache, work) + sync
  double samples_per_replica = 0;
  double throughput = 0;         // samples/s over all replicas
  double bubble = 0;             // the schedule's idle fraction (Schedule::BubbleFraction)
};

// Seconds of one sample through `unit`, trainable (forward + backward) or frozen.
double UnitSecondsPerSample(const Unit& unit, bool frozen, const CostOptions& options);

// Predicts one step of `plan` for `model` (the plan's units are the model's units). Only
// replicas 0 .. plan.replicas - 1 run. With AutoCache, `cached_depth` is the depth the cache
// holds from the previous epoch (the previous plan's frozen count; 0 for a cold cache): the
// units from there to plan.frozen run forward once per sample this epoch. Unset: the cache
// already holds plan.frozen. InvalidArgument when the plan does not match the model or the
// options are invalid.
StatusOr<Prediction> Predict(const Model& model, const pipe::Plan& plan,
                             const CostOptions& options,
                             std::optional<int> cached_depth = std::nullopt);

// Bytes moved at the transition from `previous` to `next` (both of `model`): every rank
// active in next receives the units of its new stage it did not hold in previous (all of
// them for a newly active rank): weights, and optimizer state for trainable ones. With
// AutoCache a stage does not need its frozen units.
double TransitionBytes(const Model& model, const pipe::Plan& previous, const pipe::Plan& next,
                       const CostOptions& options);

}  // namespace planner
}  // namespace weft

#endif  // WEFT_PIPE_PLANNER_COST_MODEL_H_
