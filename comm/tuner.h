// Picks the fastest of a few ways to do something that repeats, from the time each run
// takes: it runs the chosen way and, every `period` runs (at first after `trial`), `trial`
// runs of another (the others taken in turn), then keeps whichever costs less per byte: a
// way's cost is the middle one of its last kWindow counted runs (the lower middle one of an
// even count), which one lucky or unlucky run does not move. A way not tried yet is tried
// after `trial` runs, so that each has been tried once early on. The first `warmup` runs
// after each change are not counted: they may still pay for the change (the other ranks
// writing in the old way, caches warmed by the old way). Where trials are dear, two options
// make them rarer and shorter: with `max_period` above `period`, each trial of a way tried
// before that changes nothing doubles the wait for the next (up to `max_period`; a change
// starts again from `period`), and with `give_up` (above 1), a trial ends at its first
// counted run that costs more than `give_up` times the chosen way's cost. A way whose run
// failed (Fail) is left alone from then on. Pure: tests drive it with made-up times.
// Used by rank 0 for the copy mode of the collectives through shared memory
// (shared_collectives.h) and for the way of some allreduces (mpi_plane.cc). Internal to
// comm/.
#ifndef WEFT_COMM_TUNER_H_
#define WEFT_COMM_TUNER_H_

#include <cstddef>
#include <cstdint>

namespace weft {
namespace comm {

class Tuner {
 public:
  static constexpr int kWindow = 4;
  static constexpr int kMaxWays = 4;
  // `ways`: how many there are (2 to kMaxWays), numbered from 0, the first choice.
  // `warmup`: at least 1; a trial has at least one run past it.
  explicit Tuner(int period = 256, int trial = 4, int max_period = 0, double give_up = 0,
                 int ways = 2, int warmup = 1)
      : period_(period),
        warmup_(warmup < 1 ? 1 : warmup),
        trial_(trial <= warmup_ ? warmup_ + 1 : trial),
        max_period_(max_period > period ? max_period : period),
        give_up_(give_up),
        ways_(ways < 2          ? 2
              : ways > kMaxWays ? kMaxWays
                                : ways),
        wait_(period) {}
  // The way (0 to ways - 1) for the next run.
  int next() const { return trying_ ? candidate_ : chosen_; }
  // The run just made in way `way` took `ns` for `bytes`. A run in another way than next()
  // (one that could not go the way asked) is not counted, nor is one of no bytes.
  void Record(int way, int64_t ns, size_t bytes);
  // The run just made in way `way` failed: that way is not chosen or tried again (unless it
  // is the only one left). The next run goes the best way left.
  void Fail(int way);

 private:
  // A way's cost per byte: the middle of its last kWindow counted runs (infinite: none yet).
  double Cost(int way) const;
  // The way after candidate_ in turn, other than the chosen one and those that failed
  // (-1: none).
  int NextCandidate() const;

  // Ends the trial under way, keeping the better way.
  void EndTrial();

  const int period_, warmup_, trial_, max_period_;
  const double give_up_;
  const int ways_;
  int wait_;  // runs between trials now (period_ up to max_period_)
  int chosen_ = 0;
  int candidate_ = 0;  // the way tried last, or under trial
  bool trying_ = false;
  bool first_trial_ = false;             // the trial under way is its way's first
  int runs_ = 0;                         // in the current stretch (chosen or trial)
  int skip_ = 0;                         // how many of the next runs are not counted
  double cost_[kMaxWays][kWindow] = {};  // ns per byte, by way; 0: empty
  int next_slot_[kMaxWays] = {};
  bool failed_[kMaxWays] = {};  // Fail()
};

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_TUNER_H_
