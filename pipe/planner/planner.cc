#include "pipe/planner/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "pipe/freeze/freeze.h"

namespace weft {
namespace planner {

namespace {

// The balancer weighs a frozen unit as the cost model runs it: forward only, 1 of the 3
// parts of a trainable unit's forward and backward, or nothing when AutoCache serves it.
// (The paper's lambda, 1/6, stays available with --lambda 1/6; with it the balancer piles
// cheap-looking frozen units onto one stage that then runs slower than it planned.)
constexpr double kDefaultLambda = 1.0 / 3.0;

int ResolvedK0(const Model& model, const PlannerOptions& options) {
  if (options.k0 != 0) return options.k0;
  return std::min({options.devices, options.machines * options.devices, model.layers()});
}

// A balancer cost: millions of parameters, or milliseconds per sample for measured times.
std::string BalanceCost(double cost, bool times) {
  return times ? absl::StrFormat("%.4fms", cost * 1e3) : absl::StrFormat("%.2fM", cost / 1e6);
}

std::string Millions(double params) { return absl::StrFormat("%.2fM", params / 1e6); }

std::string Percent(double fraction) { return absl::StrFormat("%.1f%%", 100 * fraction); }

std::string Fixed(double value, int digits) { return absl::StrFormat("%.*f", digits, value); }

std::string Fraction(int frozen, int layers) { return absl::StrCat(frozen, "/", layers); }

std::string CommaList(const std::vector<double>& values, int digits, double scale = 1) {
  std::vector<std::string> parts;
  for (double v : values) parts.push_back(Fixed(v * scale, digits));
  return absl::StrJoin(parts, ",");
}

std::string UnitRange(const Model& model, int first, int last) {
  if (first >= last) return "(empty)";
  if (last - first == 1) return model.units[first].name;
  return absl::StrCat(model.units[first].name, " .. ", model.units[last - 1].name);
}

std::string Indices(int first, int last) {
  if (first >= last) return "-";
  if (last - first == 1) return absl::StrCat(first);
  return absl::StrCat(first, "-", last - 1);
}

}  // namespace

std::string FormatRanks(const std::vector<int>& ranks) {
  if (ranks.empty()) return "none";
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < sorted.size()) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(sorted[i]) : absl::StrCat(sorted[i], "-", sorted[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

Status ValidateOptions(const Model& model, const PlannerOptions& options) {
  if (model.units.empty()) {
    return InvalidArgument("expected a model with at least one unit, found none");
  }
  for (size_t u = 0; u < model.units.size(); ++u) {
    const Unit& unit = model.units[u];
    if (!std::isfinite(unit.params) || unit.params < 0) {
      return InvalidArgument("expected parameter counts >= 0, found ", unit.params, " for unit ", u,
                             " (", unit.name, ")");
    }
    if (unit.time.has_value() && (!std::isfinite(*unit.time) || *unit.time < 0)) {
      return InvalidArgument("expected times >= 0, found ", *unit.time, " for unit ", u, " (",
                             unit.name, ")");
    }
  }
  if (options.machines < 1 || options.machines > kMaxWorld) {
    return InvalidArgument("expected --machines in [1, ", kMaxWorld, "], found ", options.machines);
  }
  if (options.devices < 1 || options.devices > kMaxWorld) {
    return InvalidArgument("expected --devices in [1, ", kMaxWorld,
                           "] (devices per machine), found ", options.devices);
  }
  if (int64_t{options.machines} * options.devices > kMaxWorld) {
    return InvalidArgument("expected at most ", kMaxWorld, " ranks, found ", options.machines,
                           " machines x ", options.devices,
                           " devices = ", int64_t{options.machines} * options.devices);
  }
  if (options.epochs < 1 || options.epochs > kMaxEpochs) {
    return InvalidArgument("expected --epochs in [1, ", kMaxEpochs, "], found ", options.epochs);
  }
  if (!(options.alpha > 0 && options.alpha <= 1)) {
    return InvalidArgument(
        "expected --alpha in (0, 1] (the share of the still-trainable "
        "units frozen at each freeze point; the paper uses 1/3), found ",
        options.alpha);
  }
  if (options.lambda.has_value() && !(*options.lambda >= 0 && *options.lambda <= 1)) {
    return InvalidArgument(
        "expected --lambda in [0, 1] (the balancer's weight of a frozen "
        "unit relative to a trainable one), found ",
        *options.lambda);
  }
  if (options.micro_batches < 0 || options.micro_batches > kMaxMicroBatches) {
    return InvalidArgument("expected --micro-batches in [0, ", kMaxMicroBatches,
                           "] (0: 4 x K), found ", options.micro_batches);
  }
  const int world = options.machines * options.devices;
  const int k0 = ResolvedK0(model, options);
  if (k0 < 1) {
    return InvalidArgument("expected --k0 >= 1 (the initial pipeline length), found ", k0);
  }
  if (k0 > world) {
    return InvalidArgument("expected --k0 <= the world (", options.machines,
                           options.machines == 1 ? " machine x " : " machines x ", options.devices,
                           " devices = ", world, " ranks), found ", k0,
                           ": lower --k0 or add devices");
  }
  if (k0 > model.layers()) {
    return InvalidArgument("expected at most as many stages as units, found K0 = ", k0,
                           " stages for ", model.layers(), " units of ", model.title,
                           ": lower --k0 (every stage needs at least one unit)");
  }
  if (!std::isfinite(options.epoch_samples) || options.epoch_samples <= 0) {
    return InvalidArgument("expected --epoch-samples > 0, found ", options.epoch_samples);
  }
  CostOptions cost = options.cost;
  if (cost.tokens == 0) cost.tokens = 1;  // 0: the model's default, filled in by RunPlanner
  return ValidateCostOptions(cost);
}

namespace {

// Values at the ends of the double range (a batch of 1e308, a layer time of 1e-320) pass
// every input check yet give infinite or NaN times: refuse them rather than print them.
StatusOr<PlannerResult> CheckFinite(PlannerResult result) {
  auto usable = [](double x) { return std::isfinite(x) && x > 0; };
  bool ok = usable(result.static_prediction.throughput) && usable(result.static_epoch_seconds) &&
            usable(result.overall_speedup);
  for (const EpochPlan& e : result.epochs) {
    ok = ok && usable(e.prediction.throughput) && usable(e.speedup) && usable(e.epoch_seconds) &&
         std::isfinite(e.transition_seconds);
  }
  if (ok) return result;
  return InvalidArgument(
      "the cost model gives infinite or undefined times for these inputs (predicted static "
      "throughput ",
      result.static_prediction.throughput, " samples/s, overall speedup ", result.overall_speedup,
      "): --batch, --flops, --bandwidth, --tokens, --hidden, "
      "--epoch-samples and the layers' parameters or times are too large or too small to "
      "compute with; give them in ordinary units (samples, FLOP/s, bytes/s, seconds)");
}

}  // namespace

StatusOr<PlannerResult> RunPlanner(const Model& model, const PlannerOptions& options) {
  WEFT_RETURN_IF_ERROR(ValidateOptions(model, options));
  PlannerResult result;
  result.options = options;
  result.options.k0 = ResolvedK0(model, options);
  result.lambda = options.lambda.value_or(options.cost.cache ? 0.0 : kDefaultLambda);
  result.options.lambda = result.lambda;
  if (result.options.cost.tokens <= 0) {
    result.options.cost.tokens =
        model.default_tokens > 0 ? static_cast<double>(model.default_tokens) : kDefaultFileTokens;
  }
  result.options.cost.devices_per_machine = options.devices;
  const CostOptions& cost = result.options.cost;
  const double inter = cost.inter_bandwidth > 0 ? cost.inter_bandwidth : cost.bandwidth;

  pipe::PlanOptions plan_options;
  plan_options.cluster.machines = options.machines;
  plan_options.cluster.devices_per_machine = options.devices;
  plan_options.k0 = result.options.k0;
  plan_options.lambda = result.lambda;
  plan_options.strategy = options.strategy;
  plan_options.micro_batches = options.micro_batches;
  const bool times = model.has_times();
  const std::vector<double> sizes = times ? model.times() : model.params();

  StatusOr<pipe::Plan> initial = pipe::MakePlan(sizes, 0, plan_options);
  if (!initial.ok()) return Annotate(initial.status(), "planning the static pipeline");
  result.static_plan = *std::move(initial);
  {
    // The static pipeline: nothing frozen, so nothing cached either.
    CostOptions static_cost = cost;
    static_cost.cache = false;
    WEFT_ASSIGN_OR_RETURN(result.static_prediction,
                          Predict(model, result.static_plan, static_cost));
  }
  result.static_epoch_seconds = options.epoch_samples / result.static_prediction.throughput;

  pipe::FreezeOptions freeze;
  freeze.alpha = options.alpha;
  freeze.gradient_aware = false;
  freeze.freeze_last = false;
  double elastic_seconds = 0;
  for (int e = 0; e < options.epochs; ++e) {
    EpochPlan epoch;
    epoch.epoch = e;
    if (e == 0) {
      epoch.plan = result.static_plan;
    } else {
      const pipe::Plan& previous = result.epochs.back().plan;
      StatusOr<int> frozen = pipe::NextFrozen(model.layers(), e, previous.frozen, {}, freeze);
      if (!frozen.ok()) {
        return Annotate(frozen.status(), absl::StrCat("freeze point ", e));
      }
      // Without AutoPipe every plan is an initial one: K0 stages, rebalanced.
      StatusOr<pipe::Plan> plan = pipe::MakePlan(sizes, *frozen, plan_options,
                                                 options.autopipe ? &previous : nullptr);
      if (!plan.ok()) {
        return Annotate(plan.status(),
                        absl::StrCat("planning epoch ", e, " (", *frozen, " units frozen)"));
      }
      epoch.plan = *std::move(plan);
      if (!options.autopipe && !options.rebalance) {
        const int frozen_now = epoch.plan.frozen;
        epoch.plan = result.static_plan;
        epoch.plan.frozen = frozen_now;
      }
      if (!options.autodp) {
        // The static pipeline's replicas only; the others idle, nobody new joins.
        const int keep = result.static_plan.replicas;
        if (epoch.plan.replicas > keep) {
          epoch.plan.replicas = keep;
          for (pipe::Role& role : epoch.plan.roles) {
            if (role.replica >= keep) role = pipe::Role{};
          }
        }
        epoch.plan.newly_active.clear();
      }
      epoch.transition_bytes = TransitionBytes(model, previous, epoch.plan, cost);
      epoch.transition_seconds = epoch.transition_bytes / inter;
    }
    const std::optional<int> cached_depth =
        e == 0 ? std::optional<int>() : std::optional<int>(result.epochs.back().plan.frozen);
    WEFT_ASSIGN_OR_RETURN(epoch.prediction, Predict(model, epoch.plan, cost, cached_depth));
    epoch.speedup = epoch.prediction.throughput / result.static_prediction.throughput;
    epoch.epoch_seconds = options.epoch_samples / epoch.prediction.throughput;
    elastic_seconds += epoch.epoch_seconds + epoch.transition_seconds;
    result.epochs.push_back(std::move(epoch));
  }
  result.overall_speedup = options.epochs * result.static_epoch_seconds / elastic_seconds;
  return CheckFinite(std::move(result));
}

StatusOr<std::vector<AblationRow>> RunAblation(const Model& model,
                                               const PlannerOptions& options) {
  std::vector<AblationRow> rows = {
      {"freeze only, static split", false, false, false, false},
      {"freeze only, rebalanced", false, false, false},
      {"+ AutoPipe", true, false, false},
      {"+ AutoPipe + AutoCache", true, false, true},
      {"+ AutoPipe + AutoDP", true, true, false},
      {"all four", true, true, true},
  };
  for (AblationRow& row : rows) {
    PlannerOptions o = options;
    o.autopipe = row.autopipe;
    o.autodp = row.autodp;
    o.cost.cache = row.cache;
    o.rebalance = row.rebalance;
    StatusOr<PlannerResult> r = RunPlanner(model, o);
    if (!r.ok()) return Annotate(r.status(), absl::StrCat("ablation '", row.label, "'"));
    row.overall_speedup = r->overall_speedup;
  }
  return rows;
}

std::string FormatAblation(const Model& model, const PlannerOptions& options,
                           const std::vector<AblationRow>& rows) {
  std::string out = FormatModel(model);
  absl::StrAppendFormat(&out,
                        "ablation: %d machine%s x %d devices, alpha %.4f, %d epochs; overall "
                        "speedup over the static pipeline\n",
                        options.machines, options.machines == 1 ? "" : "s", options.devices,
                        options.alpha, options.epochs);
  absl::StrAppendFormat(&out, "%-24s %8s %6s %5s %8s\n", "configuration", "AutoPipe", "AutoDP",
                        "cache", "speedup");
  for (const AblationRow& row : rows) {
    absl::StrAppendFormat(&out, "%-24s %8s %6s %5s %7.2fx\n", row.label,
                          row.autopipe ? "on" : "off", row.autodp ? "on" : "off",
                          row.cache ? "on" : "off", row.overall_speedup);
  }
  for (const AblationRow& row : rows) {
    absl::StrAppend(&out, "ABLATION autopipe=", row.autopipe ? 1 : 0,
                    " autodp=", row.autodp ? 1 : 0, " cache=", row.cache ? 1 : 0,
                    " overall_speedup=", Fixed(row.overall_speedup, 4), "\n");
  }
  return out;
}

std::string FormatModel(const Model& model) {
  std::string out = absl::StrCat("model: ", model.title);
  if (model.name != model.title) absl::StrAppend(&out, " (", model.name, ")");
  absl::StrAppend(&out, ": ", model.layers(), " units, ", FormatCount(model.total_params()),
                  " parameters (", Millions(model.total_params()), ")");
  if (model.has_times()) {
    double total = 0;
    for (const Unit& u : model.units) total += *u.time;
    absl::StrAppend(&out, ", measured times (", absl::StrFormat("%.4f", total * 1e3),
                    " ms per sample forward + backward)");
  }
  out += "\n";
  for (const std::string& note : model.notes) absl::StrAppend(&out, "  ", note, "\n");
  return out;
}

namespace {

std::string DescribeOptions(const Model& model, const PlannerResult& r) {
  const PlannerOptions& o = r.options;
  const CostOptions& c = o.cost;
  std::string out = absl::StrFormat(
      "cluster: %d machine%s x %d devices = %d ranks; K0 %d; alpha %.4f; lambda %.4f; "
      "strategy %s; schedule %s; micro-batches %s\n",
      o.machines, o.machines == 1 ? "" : "s", o.devices, o.machines * o.devices, o.k0, o.alpha,
      r.lambda, pipe::StrategyName(o.strategy), pipe::ScheduleName(c.schedule),
      o.micro_batches == 0 ? std::string("4 x K") : absl::StrCat(o.micro_batches));
  const std::string batch =
      c.global_batch ? absl::StrFormat("batch %g samples per mini-batch over all replicas", c.batch)
                     : absl::StrFormat("batch %g samples per replica per mini-batch", c.batch);
  const std::string compute =
      model.has_times()
          ? std::string("measured times (forward = 1/3 of a unit's time)")
          : absl::StrFormat("%g tokens per sample, %g FLOP/s per device", c.tokens, c.flops);
  const double hidden = c.hidden > 0 ? c.hidden : static_cast<double>(model.hidden);
  absl::StrAppendFormat(
      &out,
      "cost model: %s, %s; %g B/s inside a machine, %g B/s between machines; %g values per "
      "token at a boundary%s\n",
      batch, compute, c.bandwidth, c.inter_bandwidth > 0 ? c.inter_bandwidth : c.bandwidth,
      hidden, hidden > 0 ? "" : " (no boundary transfers costed)");
  absl::StrAppendFormat(
      &out, "elastic: AutoPipe %s, AutoDP %s, AutoCache %s; %g samples per epoch%s\n",
      o.autopipe ? "on" : "off", o.autodp ? "on" : "off",
      c.cache ? absl::StrFormat("on (reads at %g B/s)",
                                c.cache_bandwidth > 0 ? c.cache_bandwidth : c.bandwidth)
              : std::string("off (frozen units run forward)"),
      o.epoch_samples,
      c.compute_devices > 0
          ? absl::StrFormat("; all devices share %g devices' compute", c.compute_devices)
          : std::string());
  const Prediction& s = r.static_prediction;
  absl::StrAppendFormat(&out,
                        "static pipeline: K %d x %d replica%s, step %.2f ms, %.1f samples/s\n", s.k,
                        s.replicas, s.replicas == 1 ? "" : "s", s.step_seconds * 1e3, s.throughput);
  return out;
}

std::string FormatEpoch(const Model& model, const EpochPlan& e) {
  const pipe::Plan& plan = e.plan;
  const Prediction& p = e.prediction;
  const bool times = model.has_times();
  std::string out = absl::StrFormat(
      "epoch %d: frozen %s, K %d, %d replica%s, %d micro-batches, bubble %s, newly active "
      "ranks: %s\n",
      e.epoch, Fraction(plan.frozen, model.layers()), plan.k, plan.replicas,
      plan.replicas == 1 ? "" : "s", plan.micro_batches, Percent(p.bubble),
      FormatRanks(plan.newly_active));
  // Column widths from the longest unit range.
  size_t names = 12;
  for (const StagePrediction& s : p.stages) {
    names = std::max(names, UnitRange(model, s.first, s.last).size());
  }
  absl::StrAppendFormat(&out, "  %5s  %-7s  %-*s  %10s  %10s  %9s  %10s\n", "stage", "units",
                        static_cast<int>(names), "first .. last", "balance", "trainable", "frozen",
                        "ms/micro");
  for (int s = 0; s < plan.k; ++s) {
    const StagePrediction& sp = p.stages[s];
    absl::StrAppendFormat(
        &out, "  %5d  %-7s  %-*s  %10s  %10s  %9s  %10.3f\n", s, Indices(sp.first, sp.last),
        static_cast<int>(names), UnitRange(model, sp.first, sp.last),
        BalanceCost(plan.partition.stage_costs[s], times), Millions(sp.trainable_params),
        Millions(sp.frozen_params), sp.seconds_per_micro_batch * 1e3);
  }
  absl::StrAppendFormat(&out,
                        "  step %.2f ms = pipeline %.2f (of it hops %.2f) + cache %.2f + sync "
                        "%.2f%s; %.1f samples/s; speedup %.2fx\n",
                        p.step_seconds * 1e3, p.pipeline_seconds * 1e3, p.transfer_seconds * 1e3,
                        p.cache_seconds * 1e3, p.sync_seconds * 1e3,
                        p.work_seconds > p.pipeline_seconds + p.cache_seconds
                            ? absl::StrFormat(" (compute-bound: work %.2f ms)",
                                              p.work_seconds * 1e3)
                            : std::string(),
                        p.throughput, e.speedup);
  if (e.epoch > 0) {
    absl::StrAppendFormat(&out, "  transition before it: %.1f MB moved, %.3f s; epoch %.1f s\n",
                          e.transition_bytes / 1e6, e.transition_seconds, e.epoch_seconds);
  }
  std::vector<double> stage_ms;
  for (const StagePrediction& sp : p.stages) stage_ms.push_back(sp.seconds_per_micro_batch);
  absl::StrAppend(
      &out, "PLAN epoch=", e.epoch, " frozen=", plan.frozen, " units=", model.layers(),
      " k=", plan.k, " replicas=", plan.replicas, " micro_batches=", plan.micro_batches,
      " bubble=", Fixed(p.bubble, 4), " newly_active=", FormatRanks(plan.newly_active),
      " boundaries=", absl::StrJoin(plan.partition.boundaries, ","),
      " stage_cost=", CommaList(plan.partition.stage_costs, times ? 6 : 0, times ? 1e3 : 1),
      " stage_ms=", CommaList(stage_ms, 3, 1e3),
      " pipeline_ms=", Fixed(p.pipeline_seconds * 1e3, 3),
      " transfer_ms=", Fixed(p.transfer_seconds * 1e3, 3),
      " cache_ms=", Fixed(p.cache_seconds * 1e3, 3), " work_ms=", Fixed(p.work_seconds * 1e3, 3),
      " sync_ms=", Fixed(p.sync_seconds * 1e3, 3), " step_ms=", Fixed(p.step_seconds * 1e3, 3),
      " transition_s=", Fixed(e.transition_seconds, 3),
      " samples_per_s=", Fixed(p.throughput, 1), " speedup=", Fixed(e.speedup, 4), "\n");
  return out;
}

}  // namespace

std::string FormatReport(const Model& model, const PlannerResult& r) {
  std::string out = FormatModel(model);
  out += DescribeOptions(model, r);
  for (const EpochPlan& e : r.epochs) {
    out += "\n";
    out += FormatEpoch(model, e);
  }
  absl::StrAppend(&out, "\nsummary (speedup = samples/s over the static pipeline's)\n");
  absl::StrAppendFormat(&out, "%5s  %7s  %3s  %8s  %4s  %6s  %9s  %8s  %10s  %7s  %s\n", "epoch",
                        "frozen", "K", "replicas", "M", "bubble", "step ms", "sync ms", "samples/s",
                        "speedup", "newly active");
  for (const EpochPlan& e : r.epochs) {
    const Prediction& p = e.prediction;
    absl::StrAppendFormat(&out, "%5d  %7s  %3d  %8d  %4d  %6s  %9.2f  %8.2f  %10.1f  %6.2fx  %s\n",
                          e.epoch, Fraction(e.plan.frozen, model.layers()), e.plan.k,
                          e.plan.replicas, e.plan.micro_batches, Percent(p.bubble),
                          p.step_seconds * 1e3, p.sync_seconds * 1e3, p.throughput, e.speedup,
                          FormatRanks(e.plan.newly_active));
  }
  const int n = static_cast<int>(r.epochs.size());
  double transitions = 0;
  for (const EpochPlan& e : r.epochs) transitions += e.transition_seconds;
  absl::StrAppendFormat(&out,
                        "overall: %.2fx over %d epoch%s of %g samples (static %.0f s; elastic "
                        "%.0f s, of it %.1f s of transitions)\n",
                        r.overall_speedup, n, n == 1 ? "" : "s", r.options.epoch_samples,
                        n * r.static_epoch_seconds, n * r.static_epoch_seconds / r.overall_speedup,
                        transitions);
  absl::StrAppend(&out, "PLAN_SUMMARY epochs=", n, " units=", model.layers(),
                  " params=", Fixed(model.total_params(), 0), " k0=", r.options.k0,
                  " world=", r.options.machines * r.options.devices,
                  " strategy=", pipe::StrategyName(r.options.strategy),
                  " static_samples_per_s=", Fixed(r.static_prediction.throughput, 1),
                  " overall_speedup=", Fixed(r.overall_speedup, 4), "\n");
  return out;
}

std::string FormatComparison(const Model& model, const std::vector<PlannerResult>& results) {
  std::string out = FormatModel(model);
  if (results.empty()) return out;
  out += DescribeOptions(model, results.front());
  // The static line of DescribeOptions is the first strategy's; each column has its own.
  absl::StrAppend(&out,
                  "\nstrategies: K x replicas, samples/s and the speedup over the same "
                  "strategy's static pipeline (* = a stage without units)\n");
  absl::StrAppendFormat(&out, "%5s  %7s", "epoch", "frozen");
  for (const PlannerResult& r : results) {
    absl::StrAppendFormat(&out, "  | %-27s", pipe::StrategyName(r.options.strategy));
  }
  out += "\n";
  absl::StrAppendFormat(&out, "%5s  %7s", "", "");
  for (size_t i = 0; i < results.size(); ++i) {
    absl::StrAppendFormat(&out, "  | %-6s %10s %9s", "KxR", "samples/s", "speedup");
  }
  out += "\n";
  bool any_empty = false;
  const size_t epochs = results.front().epochs.size();
  for (size_t e = 0; e < epochs; ++e) {
    const EpochPlan& first = results.front().epochs[e];
    absl::StrAppendFormat(&out, "%5d  %7s", first.epoch,
                          Fraction(first.plan.frozen, model.layers()));
    for (const PlannerResult& r : results) {
      const EpochPlan& ep = r.epochs[e];
      const bool empty = ep.plan.partition.has_empty_stage();
      any_empty = any_empty || empty;
      absl::StrAppendFormat(&out, "  | %-6s %10.1f %8.2fx",
                            absl::StrCat(ep.plan.k, "x", ep.plan.replicas, empty ? "*" : ""),
                            ep.prediction.throughput, ep.speedup);
    }
    out += "\n";
  }
  absl::StrAppendFormat(&out, "%-14s", "static");
  for (const PlannerResult& r : results) {
    absl::StrAppendFormat(&out, "  | %-6s %10.1f %9s",
                          absl::StrCat(r.static_plan.k, "x", r.static_plan.replicas,
                                       r.static_plan.partition.has_empty_stage() ? "*" : ""),
                          r.static_prediction.throughput, "1.00x");
  }
  out += "\n";
  absl::StrAppendFormat(&out, "%-14s", "overall");
  for (const PlannerResult& r : results) {
    absl::StrAppendFormat(&out, "  | %-6s %10s %8.2fx", "", "", r.overall_speedup);
  }
  out += "\n";
  // The same elastic runs on one scale: over the first strategy's static pipeline.
  const PlannerResult& reference = results.front();
  const std::string reference_label =
      absl::StrCat("vs ", pipe::StrategyName(reference.options.strategy));
  absl::StrAppendFormat(&out, "%-14s", reference_label);
  for (const PlannerResult& r : results) {
    double elastic = 0;
    for (const EpochPlan& ep : r.epochs) elastic += 1.0 / ep.prediction.throughput;
    const double fixed = r.epochs.size() / reference.static_prediction.throughput;
    absl::StrAppendFormat(&out, "  | %-6s %10s %8.2fx", "", "", fixed / elastic);
  }
  out += "\n";
  // The fastest elastic run in absolute terms (the same data, so total time ~ sum of
  // 1 / samples/s over the epochs).
  const PlannerResult* best = nullptr;
  double best_time = 0;
  for (const PlannerResult& r : results) {
    double time = 0;
    for (const EpochPlan& ep : r.epochs) time += 1.0 / ep.prediction.throughput;
    if (best == nullptr || time < best_time) {
      best = &r;
      best_time = time;
    }
  }
  absl::StrAppendFormat(&out,
                        "%s: the overall speedup over the %s static pipeline, one scale for "
                        "every strategy; fastest elastic run: %s\n",
                        reference_label, pipe::StrategyName(reference.options.strategy),
                        pipe::StrategyName(best->options.strategy));
  if (any_empty) {
    absl::StrAppend(&out, "* the partition leaves a stage empty: that device holds no units\n");
  }
  for (const PlannerResult& r : results) {
    std::vector<double> speedups;
    std::vector<std::string> kr;
    double time = 0;
    for (const EpochPlan& ep : r.epochs) {
      speedups.push_back(ep.speedup);
      kr.push_back(absl::StrCat(ep.plan.k, "x", ep.plan.replicas));
      time += 1.0 / ep.prediction.throughput;
    }
    absl::StrAppend(
        &out, "COMPARE strategy=", pipe::StrategyName(r.options.strategy),
        " k_x_replicas=", absl::StrJoin(kr, ","), " speedups=", CommaList(speedups, 4),
        " static_samples_per_s=", Fixed(r.static_prediction.throughput, 1),
        " overall_speedup=", Fixed(r.overall_speedup, 4),
        " reference=", pipe::StrategyName(reference.options.strategy), " speedup_vs_reference=",
        Fixed(r.epochs.size() / reference.static_prediction.throughput / time, 4),
        " mean_seconds_per_sample=", absl::StrFormat("%.6g", time / r.epochs.size()), "\n");
  }
  return out;
}

}  // namespace planner
}  // namespace weft
