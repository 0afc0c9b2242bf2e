// weft-plan's planner: from a model, the cluster, alpha and the number of epochs, the
// sequence of plans the elastic pipeline would run (AutoFreeze's schedule, AutoPipe's K,
// AutoDP's replicas), each with the cost model's prediction and its speedup over the static
// pipeline. Pure computation plus text formatting; the command line is tool.h.
#ifndef WEFT_PIPE_PLANNER_PLANNER_H_
#define WEFT_PIPE_PLANNER_PLANNER_H_

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "pipe/balance/balance.h"
#include "pipe/plan/plan.h"
#include "pipe/planner/cost_model.h"
#include "pipe/planner/model.h"

namespace weft {
namespace planner {

struct PlannerOptions {
  int machines = 1;
  int devices = 8;  // per machine
  int k0 = 0;       // the initial pipeline length; 0: devices, capped at the world
  double alpha = 1.0 / 3.0;
  int epochs = 10;
  int micro_batches = 0;  // 0: the plan's default (4 K)
  pipe::Strategy strategy = pipe::Strategy::kOptimal;
  // The balancer's weight of a frozen unit; unset: what the cost model charges for it, 1/3
  // (forward only, of forward + backward), or 0 with AutoCache. The paper's 1/6 on request.
  std::optional<double> lambda;
  CostOptions cost;  // tokens <= 0: the model's default (512 for a layer file)
  // Ablations (the paper's Figure "speedup breakdown"; weft's TrainerOptions of the same
  // names). autopipe = false: K stays K0 (the partition is still rebalanced with the frozen
  // units at lambda, as weft's runtime does). autodp = false: the replicas stay the static
  // pipeline's; freed devices idle. The cache is cost.cache.
  bool autopipe = true;
  bool autodp = true;
  // With autopipe = false: false keeps the static partition too (the paper's "freeze only":
  // frozen units stay where they were and skip their backward pass).
  bool rebalance = true;
  // Samples per epoch (for the transition cost against the epoch's time); ImageNet-1k's
  // training set by default.
  double epoch_samples = 1281167;
};

// Tokens per sample of a layer file when --tokens is not given.
constexpr double kDefaultFileTokens = 512;
// Bounds on the options, far beyond any real cluster or run, so that every plan still
// takes well under a second and no product of them overflows.
constexpr int kMaxWorld = 16384;  // machines x devices
constexpr int kMaxEpochs = 10000;
constexpr int kMaxMicroBatches = 65536;  // per mini-batch

struct EpochPlan {
  int epoch = 0;  // 0-based; epoch e runs after freeze point e (epoch 0: nothing frozen)
  pipe::Plan plan;
  Prediction prediction;
  double speedup = 0;  // throughput over the static pipeline's
  double epoch_seconds = 0;       // epoch_samples / throughput
  // The transition before this epoch: TransitionBytes over the slower link (0 for epoch 0).
  double transition_seconds = 0;
  double transition_bytes = 0;
};

struct PlannerResult {
  // The options as used: k0, lambda and tokens resolved.
  PlannerOptions options;
  double lambda = 0;
  // The static pipeline: K0, every unit trainable, for all epochs.
  pipe::Plan static_plan;
  Prediction static_prediction;
  std::vector<EpochPlan> epochs;
  double static_epoch_seconds = 0;
  // The static run's time over the elastic run's (epochs and transitions) for the same data
  // each epoch.
  double overall_speedup = 0;
};

// One configuration of the ablation: freeze only with the static partition (the paper's),
// freeze only rebalanced (weft's runtime with autopipe = false), + AutoPipe, + AutoPipe + AutoCache,
// + AutoPipe + AutoDP, all four.
struct AblationRow {
  std::string label;
  bool autopipe = false, autodp = false, cache = false, rebalance = true;
  double overall_speedup = 0;
};
// The five configurations above with `options` otherwise (its autopipe, autodp and
// cost.cache are overridden; lambda follows the cache unless options.lambda is set).
StatusOr<std::vector<AblationRow>> RunAblation(const Model& model, const PlannerOptions& options);
std::string FormatAblation(const Model& model, const PlannerOptions& options,
                           const std::vector<AblationRow>& rows);

// InvalidArgument, naming the option, for: machines/devices/epochs < 1, K0 < 1, K0 above the
// world, more stages than units, alpha outside (0, 1], lambda outside [0, 1], micro-batches
// < 0, epoch_samples <= 0, a bad cost option.
Status ValidateOptions(const Model& model, const PlannerOptions& options);

StatusOr<PlannerResult> RunPlanner(const Model& model, const PlannerOptions& options);

// The report: the model and cluster, one block per epoch (a readable table of stages and
// one machine-readable line "PLAN key=value ..."), a summary table of all epochs and one
// line "PLAN_SUMMARY key=value ...".
std::string FormatReport(const Model& model, const PlannerResult& result);

// The comparison of strategies (results of the same model and options but the strategy):
// per epoch K x replicas, samples/s and speedup of each, then the overall speedups; one
// "COMPARE key=value ..." line per strategy.
std::string FormatComparison(const Model& model, const std::vector<PlannerResult>& results);

// The model's header lines (title, units, total parameters, notes).
std::string FormatModel(const Model& model);

// "0-7,12,14-15"; "none" when empty.
std::string FormatRanks(const std::vector<int>& ranks);

}  // namespace planner
}  // namespace weft

#endif  // WEFT_PIPE_PLANNER_PLANNER_H_
