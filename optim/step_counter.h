// The step counter of the distributed optimizers: when J = num_steps_per_communication counted
// computations have run, the optimizer communicates; a step() then is an S (wait, combine, update,
// start over), a step() before is an s (local). One state machine for every language: the C++
// optimizers use it directly, Python, Go and Julia through the C ABI (weft_step_counter_*).
//
// Units: an optimizer that counts forward computations feeds one unit (the model). One
// that counts backward computations launches each parameter's communication as its
// gradient is ready, so it feeds one unit per parameter: each unit counts down on its
// own, and a backward pass that finds units already at 0 is one misuse, warned once.
//
// Not thread-safe: the optimizer that owns it serializes calls (autograd runs a pass's
// hooks one at a time).
#ifndef WEFT_OPTIM_STEP_COUNTER_H_
#define WEFT_OPTIM_STEP_COUNTER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace weft {

class StepCounter {
 public:
  enum class Counts { kForward, kBackward };
  // What a computation did to the count.
  enum class Event {
    kIgnored,      // not counted: grad mode off, or no parameter requires grad
    kCounted,      // counted; the countdown has not reached 0
    kCommunicate,  // counted, and it brought the countdown to 0: communicate now
    kMisuse,       // counted while the countdown was already 0: warn (MisuseWarning())
  };

  // J >= 1 and units >= 1, else InvalidArgument.
  static StatusOr<StepCounter> Create(int64_t steps_per_communication, Counts counts,
                                      int units = 1);

  // A computation of `unit` finished. `counted` is false for one under no-grad, or of a
  // model none of whose parameters requires grad: it changes nothing.
  StatusOr<Event> OnComputation(int unit = 0, bool counted = true);
  // A step(): true for an S (some unit reached 0 since the last S: the optimizer waits for
  // what it launched, launches what it has not (units still counting, so that every rank
  // communicates every unit), combines, and the countdowns start again from J), false for
  // an s (local update). FailedPrecondition before any counted computation: the optimizer
  // is not seeing the model's computations.
  StatusOr<bool> OnStep();

  // Takes effect at once when no computation was counted since the last S, else at the
  // next S.
  Status set_steps_per_communication(int64_t j);
  int64_t steps_per_communication() const { return j_; }
  Counts counts() const { return counts_; }
  int units() const { return static_cast<int>(seen_.size()); }
  // J minus the unit's counted computations since the last S, floored at 0; 0 for a unit
  // out of range.
  int64_t countdown(int unit) const;
  // Whether the unit reached 0 (its communication was launched) since the last S.
  bool launched(int unit) const { return countdown(unit) == 0; }
  // Counted computations (per pass: the maximum over units) since creation / since the
  // last S.
  int64_t computations() const { return total_; }
  int64_t computations_since_communication() const { return since_; }
  // The warning for the last kMisuse, in words a user understands.
  const std::string& MisuseWarning() const { return warning_; }

 private:
  StepCounter(int64_t j, Counts counts, int units);
  const char* What() const { return counts_ == Counts::kForward ? "forward" : "backward"; }

  int64_t j_;
  int64_t next_j_;
  Counts counts_;
  std::vector<int64_t> seen_;  // per unit, computations since the last S
  int64_t since_ = 0;          // max of seen_
  int64_t warned_ = 0;         // misuses warned since the last S (a pass warns once)
  int64_t total_ = 0;
  std::string warning_;
};

}  // namespace weft

#endif  // WEFT_OPTIM_STEP_COUNTER_H_
