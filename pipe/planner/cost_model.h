// weft-plan's cost model: the time of one mini-batch step of a plan, from layer costs.
//
//   forward time of a unit per sample = 2 * params * tokens / flops
//                                       (or time / 3 when the unit has a measured time)
//   a trainable unit costs forward + backward = 3 x forward; a frozen one forward only,
//   or nothing with AutoCache (cache = true)
//   stage time per micro-batch        = sum over its units x (batch / M) samples
//   pipeline time per mini-batch      = (M + K - 1) x the largest stage time per micro-batch
//                                       (GPipe and 1F1B alike, with unit-time slots)
//   gradient sync per mini-batch      = 2 (R - 1) / R x 4 bytes x the trainable parameters of
//                                       the stage holding the most of them / bandwidth, R > 1
//   throughput                        = R x batch / (pipeline + sync)   samples/s
#ifndef WEFT_PIPE_PLANNER_COST_MODEL_H_
#define WEFT_PIPE_PLANNER_COST_MODEL_H_

#include <vector>

#include "core/status.h"
#include "pipe/plan/plan.h"
#include "pipe/planner/model.h"

namespace weft {
namespace planner {

struct CostOptions {
  double batch = 256;  // samples per pipeline replica per mini-batch
  // Tokens per sample; must be > 0 for Predict. The planner reads 0 as the model's default.
  double tokens = 0;
  double flops = 1e14;         // sustained FLOP/s of one device
  double bandwidth = 1.25e10;  // bytes/s of the gradient allreduce between replicas
  bool cache = false;          // AutoCache: frozen units cost nothing
  pipe::ScheduleKind schedule = pipe::ScheduleKind::kGPipe;
};

// InvalidArgument naming the option for a non-positive or non-finite batch, tokens, flops or
// bandwidth.
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
  double pipeline_seconds = 0;   // per mini-batch
  double sync_seconds = 0;       // per mini-batch
  double step_seconds = 0;       // pipeline + sync
  double throughput = 0;         // samples/s over all replicas
  double bubble = 0;             // the schedule's idle fraction (Schedule::BubbleFraction)
};

// Seconds of one sample through `unit`, trainable (forward + backward) or frozen.
double UnitSecondsPerSample(const Unit& unit, bool frozen, const CostOptions& options);

// Predicts one step of `plan` for `model` (the plan's units are the model's units).
// InvalidArgument when the plan does not match the model or the options are invalid.
StatusOr<Prediction> Predict(const Model& model, const pipe::Plan& plan,
                             const CostOptions& options);

}  // namespace planner
}  // namespace weft

#endif  // WEFT_PIPE_PLANNER_COST_MODEL_H_
