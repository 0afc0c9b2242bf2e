#include "optim/step_counter.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace weft {

StepCounter::StepCounter(int64_t j, Counts counts, int units)
    : j_(j), next_j_(j), counts_(counts), seen_(static_cast<size_t>(units), 0) {}

StatusOr<StepCounter> StepCounter::Create(int64_t steps_per_communication, Counts counts,
                                          int units) {
  if (steps_per_communication < 1) {
    return InvalidArgument("num_steps_per_communication must be at least 1, got ",
                           steps_per_communication);
  }
  if (units < 1) return InvalidArgument("a step counter needs at least one unit, got ", units);
  return StepCounter(steps_per_communication, counts, units);
}

int64_t StepCounter::countdown(int unit) const {
  if (unit < 0 || unit >= units()) return 0;
  return std::max<int64_t>(0, j_ - seen_[static_cast<size_t>(unit)]);
}

StatusOr<StepCounter::Event> StepCounter::OnComputation(int unit, bool counted) {
  if (unit < 0 || unit >= units()) {
    return InvalidArgument("step counter: unit ", unit, " is out of range [0, ", units(), ")");
  }
  if (!counted) return Event::kIgnored;
  int64_t& seen = seen_[static_cast<size_t>(unit)];
  ++seen;
  if (seen > since_) {
    since_ = seen;
    ++total_;
  }
  if (seen == j_) return Event::kCommunicate;
  if (seen < j_) return Event::kCounted;
  // Past J: one warning per pass, whichever unit sees it first.
  const int64_t over = seen - j_;
  if (over <= warned_) return Event::kCounted;
  warned_ = over;
  warning_ = absl::StrCat(
      "weft: the ", What(), " computation just counted is number ", seen, " since the last ",
      "communicating step(), but num_steps_per_communication is ", j_, ": the optimizer "
      "expected a step() after ", j_, " counted ", What(), " computation", j_ == 1 ? "" : "s",
      " (how many step() calls come in between does not matter). The communication was "
      "started at computation ", j_, " and the next step() combines it; the ", What(),
      " computations since then only train locally. If this is intended, set "
      "num_steps_per_communication to the number of ", What(), " computations per step().");
  return Event::kMisuse;
}

StatusOr<bool> StepCounter::OnStep() {
  if (total_ == 0) {
    return FailedPrecondition(
        "step() before any counted ", What(), " computation: the distributed optimizer must "
        "see every ", What(), " computation of the model (computations under no-grad, or of "
        "a model with no parameter that requires grad, are not counted)");
  }
  const bool communicate = std::any_of(seen_.begin(), seen_.end(),
                                       [this](int64_t s) { return s >= j_; });
  if (!communicate) return false;
  std::fill(seen_.begin(), seen_.end(), 0);
  since_ = 0;
  warned_ = 0;
  j_ = next_j_;
  return true;
}

Status StepCounter::set_steps_per_communication(int64_t j) {
  if (j < 1) return InvalidArgument("num_steps_per_communication must be at least 1, got ", j);
  next_j_ = j;
  if (since_ == 0) j_ = j;
  return OkStatus();
}

}  // namespace weft
