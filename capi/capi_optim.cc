// The step counter of the distributed optimizers (optim/step_counter.h) behind the C ABI.
#include <utility>

#include "capi/internal.h"
#include "optim/step_counter.h"

struct weft_step_counter {
  weft::StepCounter counter;
};

using weft::capi::Guard;
using weft::capi::Required;

extern "C" {

weft_status weft_step_counter_create(weft_step_counter** counter,
                                     int64_t steps_per_communication, weft_count_kind counts,
                                     int units) {
  return Guard("weft_step_counter_create", [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(counter, "weft_step_counter_create", "counter"));
    *counter = nullptr;
    const int kind = weft::capi::EnumValue(counts);
    if (kind != WEFT_COUNT_FORWARD && kind != WEFT_COUNT_BACKWARD) {
      return weft::InvalidArgument("weft_step_counter_create: counts is ", kind,
                                   "; expected WEFT_COUNT_FORWARD or WEFT_COUNT_BACKWARD");
    }
    WEFT_ASSIGN_OR_RETURN(
        weft::StepCounter c,
        weft::StepCounter::Create(steps_per_communication,
                                  kind == WEFT_COUNT_FORWARD ? weft::StepCounter::Counts::kForward
                                                             : weft::StepCounter::Counts::kBackward,
                                  units));
    *counter = new weft_step_counter{std::move(c)};
    return weft::OkStatus();
  });
}

void weft_step_counter_destroy(weft_step_counter* counter) { delete counter; }

weft_status weft_step_counter_computation(weft_computation_event* event,
                                          weft_step_counter* counter, int unit, int counted) {
  return Guard("weft_step_counter_computation", [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(event, "weft_step_counter_computation", "event"));
    WEFT_RETURN_IF_ERROR(Required(counter, "weft_step_counter_computation", "counter"));
    WEFT_ASSIGN_OR_RETURN(auto e, counter->counter.OnComputation(unit, counted != 0));
    switch (e) {
      case weft::StepCounter::Event::kIgnored: *event = WEFT_COMPUTATION_IGNORED; break;
      case weft::StepCounter::Event::kCounted: *event = WEFT_COMPUTATION_COUNTED; break;
      case weft::StepCounter::Event::kCommunicate: *event = WEFT_COMPUTATION_COMMUNICATE; break;
      case weft::StepCounter::Event::kMisuse: *event = WEFT_COMPUTATION_MISUSE; break;
    }
    return weft::OkStatus();
  });
}

weft_status weft_step_counter_step(int* communicate, weft_step_counter* counter) {
  return Guard("weft_step_counter_step", [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(communicate, "weft_step_counter_step", "communicate"));
    WEFT_RETURN_IF_ERROR(Required(counter, "weft_step_counter_step", "counter"));
    WEFT_ASSIGN_OR_RETURN(bool s, counter->counter.OnStep());
    *communicate = s ? 1 : 0;
    return weft::OkStatus();
  });
}

weft_status weft_step_counter_set_steps_per_communication(weft_step_counter* counter,
                                                          int64_t steps_per_communication) {
  return Guard("weft_step_counter_set_steps_per_communication", [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(
        Required(counter, "weft_step_counter_set_steps_per_communication", "counter"));
    return counter->counter.set_steps_per_communication(steps_per_communication);
  });
}

weft_status weft_step_counter_steps_per_communication(int64_t* steps_per_communication,
                                                      const weft_step_counter* counter) {
  return Guard("weft_step_counter_steps_per_communication", [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(steps_per_communication,
                                  "weft_step_counter_steps_per_communication",
                                  "steps_per_communication"));
    WEFT_RETURN_IF_ERROR(
        Required(counter, "weft_step_counter_steps_per_communication", "counter"));
    *steps_per_communication = counter->counter.steps_per_communication();
    return weft::OkStatus();
  });
}

weft_status weft_step_counter_countdown(int64_t* countdown, const weft_step_counter* counter,
                                        int unit) {
  return Guard("weft_step_counter_countdown", [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(countdown, "weft_step_counter_countdown", "countdown"));
    WEFT_RETURN_IF_ERROR(Required(counter, "weft_step_counter_countdown", "counter"));
    if (unit < 0 || unit >= counter->counter.units()) {
      return weft::InvalidArgument("weft_step_counter_countdown: unit ", unit,
                                   " is out of range [0, ", counter->counter.units(), ")");
    }
    *countdown = counter->counter.countdown(unit);
    return weft::OkStatus();
  });
}

weft_status weft_step_counter_computations(int64_t* total, int64_t* since_communication,
                                           const weft_step_counter* counter) {
  return Guard("weft_step_counter_computations", [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(total, "weft_step_counter_computations", "total"));
    WEFT_RETURN_IF_ERROR(Required(since_communication, "weft_step_counter_computations",
                                  "since_communication"));
    WEFT_RETURN_IF_ERROR(Required(counter, "weft_step_counter_computations", "counter"));
    *total = counter->counter.computations();
    *since_communication = counter->counter.computations_since_communication();
    return weft::OkStatus();
  });
}

const char* weft_step_counter_misuse_warning(const weft_step_counter* counter) {
  if (counter == nullptr) return nullptr;
  return weft::capi::KeepString(counter->counter.MisuseWarning());
}

}  // extern "C"
