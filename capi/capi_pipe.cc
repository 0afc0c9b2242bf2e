// Elastic pipelining's pure computations (pipe/freeze, pipe/balance, pipe/plan) behind the
// C ABI.
#include <memory>
#include <utility>
#include <vector>

#include "capi/internal.h"
#include "pipe/balance/balance.h"
#include "pipe/freeze/freeze.h"
#include "pipe/plan/plan.h"

struct weft_pipe_plan {
  weft::pipe::Plan plan;
  weft::pipe::PlanOptions options;
};

namespace weft {
namespace capi {

void FillPlanInfo(const pipe::Plan& p, weft_pipe_plan_info* info) {
  info->frozen = p.frozen;
  info->k = p.k;
  info->replicas = p.replicas;
  info->micro_batches = p.micro_batches;
  info->world = static_cast<int>(p.roles.size());
  info->m0 = p.m0;
  info->max_cost = p.partition.max_cost;
}

}  // namespace capi
}  // namespace weft

using weft::capi::CheckVersion;
using weft::capi::CopyOut;
using weft::capi::FillPlanInfo;
using weft::capi::Guard;
using weft::capi::Required;

namespace {

weft::StatusOr<std::vector<double>> Doubles(const double* values, size_t n, const char* fn,
                                            const char* what) {
  if (n > 0 && values == nullptr) {
    return weft::InvalidArgument(fn, ": ", what, " is NULL but its length is ", n);
  }
  return std::vector<double>(values, values + n);
}

// The library's errors, prefixed with the C function's name like every other capi error.
template <typename T>
weft::StatusOr<T> Named(weft::StatusOr<T> result, const char* fn) {
  if (result.ok()) return result;
  return weft::Annotate(result.status(), fn);
}

// `s`: a weft_pipe_strategy as the caller stored it (weft::capi::EnumValue).
weft::StatusOr<weft::pipe::Strategy> ToStrategy(int s, const char* fn) {
  switch (s) {
    case WEFT_PIPE_STRATEGY_OPTIMAL: return weft::pipe::Strategy::kOptimal;
    case WEFT_PIPE_STRATEGY_GREEDY: return weft::pipe::Strategy::kGreedy;
    case WEFT_PIPE_STRATEGY_EVEN: return weft::pipe::Strategy::kEven;
  }
  return weft::InvalidArgument(fn, ": strategy is ", s,
                               "; expected WEFT_PIPE_STRATEGY_OPTIMAL, _GREEDY or _EVEN");
}

}  // namespace

extern "C" {

weft_status weft_pipe_freeze_options_init(weft_pipe_freeze_options* options, unsigned int version) {
  return weft::capi::InitOptions(
      options, version, WEFT_PIPE_FREEZE_OPTIONS_VERSION, "weft_pipe_freeze_options_init",
      "WEFT_PIPE_FREEZE_OPTIONS_VERSION", weft_pipe_freeze_options WEFT_PIPE_FREEZE_OPTIONS_INIT);
}

weft_status weft_pipe_plan_options_init(weft_pipe_plan_options* options, unsigned int version) {
  return weft::capi::InitOptions(options, version, WEFT_PIPE_PLAN_OPTIONS_VERSION,
                                 "weft_pipe_plan_options_init", "WEFT_PIPE_PLAN_OPTIONS_VERSION",
                                 weft_pipe_plan_options WEFT_PIPE_PLAN_OPTIONS_INIT);
}

weft_status weft_pipe_freeze_bound(int* frozen, int layers, double alpha, int t) {
  return Guard("weft_pipe_freeze_bound", [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(frozen, "weft_pipe_freeze_bound", "frozen"));
    WEFT_ASSIGN_OR_RETURN(*frozen, Named(weft::pipe::FreezeBound(layers, alpha, t),
                                         "weft_pipe_freeze_bound"));
    return weft::OkStatus();
  });
}

weft_status weft_pipe_next_frozen(int* frozen, int layers, int t, int previous,
                                  const double* grad_norms, size_t num_norms,
                                  const weft_pipe_freeze_options* options) {
  static const char* fn = "weft_pipe_next_frozen";
  return Guard(fn, [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(frozen, fn, "frozen"));
    weft::pipe::FreezeOptions o;
    if (options != nullptr) {
      WEFT_RETURN_IF_ERROR(CheckVersion(options->version, WEFT_PIPE_FREEZE_OPTIONS_VERSION, fn,
                                        "weft_pipe_freeze_options",
                                        "WEFT_PIPE_FREEZE_OPTIONS_INIT"));
      o.alpha = options->alpha;
      o.gradient_aware = options->gradient_aware != 0;
      o.freeze_last = options->freeze_last != 0;
    }
    WEFT_ASSIGN_OR_RETURN(auto norms, Doubles(grad_norms, num_norms, fn, "grad_norms"));
    WEFT_ASSIGN_OR_RETURN(*frozen,
                          Named(weft::pipe::NextFrozen(layers, t, previous, norms, o), fn));
    return weft::OkStatus();
  });
}

weft_status weft_pipe_parameter_costs(double* costs, size_t capacity, size_t* count,
                                      const double* sizes, size_t num_layers, int frozen,
                                      double lambda) {
  static const char* fn = "weft_pipe_parameter_costs";
  return Guard(fn, [&]() -> weft::Status {
    WEFT_ASSIGN_OR_RETURN(auto values, Doubles(sizes, num_layers, fn, "sizes"));
    WEFT_ASSIGN_OR_RETURN(auto out,
                          Named(weft::pipe::ParameterCosts(values, frozen, lambda), fn));
    return CopyOut(out, costs, capacity, count, fn);
  });
}

weft_status weft_pipe_partition(int* boundaries, size_t capacity, size_t* count,
                                double* max_cost, const double* costs, size_t num_layers,
                                int stages, weft_pipe_strategy strategy) {
  static const char* fn = "weft_pipe_partition";
  return Guard(fn, [&]() -> weft::Status {
    WEFT_ASSIGN_OR_RETURN(auto values, Doubles(costs, num_layers, fn, "costs"));
    WEFT_ASSIGN_OR_RETURN(auto s, ToStrategy(weft::capi::EnumValue(strategy), fn));
    WEFT_ASSIGN_OR_RETURN(auto partition,
                          Named(weft::pipe::PartitionLayers(values, stages, s), fn));
    WEFT_RETURN_IF_ERROR(CopyOut(partition.boundaries, boundaries, capacity, count, fn));
    if (max_cost != nullptr) *max_cost = partition.max_cost;
    return weft::OkStatus();
  });
}

weft_status weft_pipe_plan_create(weft_pipe_plan** plan, const double* sizes,
                                  size_t num_layers, int frozen,
                                  const weft_pipe_plan_options* options,
                                  const weft_pipe_plan* previous) {
  static const char* fn = "weft_pipe_plan_create";
  return Guard(fn, [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(plan, fn, "plan"));
    *plan = nullptr;
    weft::pipe::PlanOptions o;
    if (options != nullptr) {
      WEFT_RETURN_IF_ERROR(CheckVersion(options->version, WEFT_PIPE_PLAN_OPTIONS_VERSION, fn,
                                        "weft_pipe_plan_options",
                                        "WEFT_PIPE_PLAN_OPTIONS_INIT"));
      o.cluster.machines = options->machines;
      o.cluster.devices_per_machine = options->devices_per_machine;
      o.k0 = options->k0;
      o.lambda = options->lambda;
      WEFT_ASSIGN_OR_RETURN(o.strategy, ToStrategy(weft::capi::EnumValue(options->strategy), fn));
      o.micro_batches = options->micro_batches;
    }
    WEFT_ASSIGN_OR_RETURN(auto values, Doubles(sizes, num_layers, fn, "sizes"));
    WEFT_ASSIGN_OR_RETURN(
        auto made,
        Named(weft::pipe::MakePlan(values, frozen, o, previous ? &previous->plan : nullptr),
              fn));
    *plan = new weft_pipe_plan{std::move(made), o};
    return weft::OkStatus();
  });
}

void weft_pipe_plan_destroy(weft_pipe_plan* plan) { delete plan; }

weft_status weft_pipe_plan_get_info(weft_pipe_plan_info* info, const weft_pipe_plan* plan) {
  static const char* fn = "weft_pipe_plan_get_info";
  return Guard(fn, [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(info, fn, "info"));
    WEFT_RETURN_IF_ERROR(CheckVersion(info->version, WEFT_PIPE_PLAN_INFO_VERSION, fn,
                                      "weft_pipe_plan_info", "WEFT_PIPE_PLAN_INFO_INIT"));
    WEFT_RETURN_IF_ERROR(Required(plan, fn, "plan"));
    FillPlanInfo(plan->plan, info);
    return weft::OkStatus();
  });
}

weft_status weft_pipe_plan_boundaries(int* boundaries, size_t capacity, size_t* count,
                                      const weft_pipe_plan* plan) {
  static const char* fn = "weft_pipe_plan_boundaries";
  return Guard(fn, [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(plan, fn, "plan"));
    return CopyOut(plan->plan.partition.boundaries, boundaries, capacity, count, fn);
  });
}

weft_status weft_pipe_plan_stage_costs(double* costs, size_t capacity, size_t* count,
                                       const weft_pipe_plan* plan) {
  static const char* fn = "weft_pipe_plan_stage_costs";
  return Guard(fn, [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(plan, fn, "plan"));
    return CopyOut(plan->plan.partition.stage_costs, costs, capacity, count, fn);
  });
}

weft_status weft_pipe_plan_newly_active(int* ranks, size_t capacity, size_t* count,
                                        const weft_pipe_plan* plan) {
  static const char* fn = "weft_pipe_plan_newly_active";
  return Guard(fn, [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(plan, fn, "plan"));
    return CopyOut(plan->plan.newly_active, ranks, capacity, count, fn);
  });
}

weft_status weft_pipe_plan_role(int* replica, int* stage, const weft_pipe_plan* plan,
                                int rank) {
  static const char* fn = "weft_pipe_plan_role";
  return Guard(fn, [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(replica, fn, "replica"));
    WEFT_RETURN_IF_ERROR(Required(stage, fn, "stage"));
    WEFT_RETURN_IF_ERROR(Required(plan, fn, "plan"));
    const auto& roles = plan->plan.roles;
    if (rank < 0 || rank >= static_cast<int>(roles.size())) {
      return weft::InvalidArgument(fn, ": rank ", rank, " is out of range [0, ", roles.size(),
                                   ")");
    }
    *replica = roles[static_cast<size_t>(rank)].replica;
    *stage = roles[static_cast<size_t>(rank)].stage;
    return weft::OkStatus();
  });
}

weft_status weft_pipe_schedule_bubble(double* bubble, int* cycles, weft_pipe_schedule_kind kind,
                                      int stages, int micro_batches) {
  static const char* fn = "weft_pipe_schedule_bubble";
  return Guard(fn, [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(bubble, fn, "bubble"));
    const int k = weft::capi::EnumValue(kind);
    if (k != WEFT_PIPE_SCHEDULE_GPIPE && k != WEFT_PIPE_SCHEDULE_1F1B) {
      return weft::InvalidArgument(fn, ": kind is ", k,
                                   "; expected WEFT_PIPE_SCHEDULE_GPIPE or _1F1B");
    }
    WEFT_ASSIGN_OR_RETURN(
        auto schedule,
        Named(weft::pipe::MakeSchedule(k == WEFT_PIPE_SCHEDULE_GPIPE
                                           ? weft::pipe::ScheduleKind::kGPipe
                                           : weft::pipe::ScheduleKind::kOneFOneB,
                                       stages, micro_batches),
              fn));
    *bubble = schedule.BubbleFraction();
    if (cycles != nullptr) *cycles = static_cast<int>(schedule.cycles.size());
    return weft::OkStatus();
  });
}

}  // extern "C"
