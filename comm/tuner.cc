#include "comm/tuner.h"

#include <algorithm>
#include <iterator>
#include <limits>

namespace weft {
namespace comm {

double Tuner::Cost(int way) const {
  // The runs' costs in order (insertion: there are at most kWindow).
  double costs[kWindow];
  int n = 0;
  for (double c : cost_[way]) {
    if (c <= 0) continue;
    int at = n++;
    for (; at > 0 && costs[at - 1] > c; --at) costs[at] = costs[at - 1];
    costs[at] = c;
  }
  if (n == 0) return std::numeric_limits<double>::infinity();
  return costs[(n - 1) / 2];
}

int Tuner::NextCandidate() const {
  for (int k = 1; k <= ways_; ++k) {
    const int way = (candidate_ + k) % ways_;
    if (way != chosen_ && !failed_[way]) return way;
  }
  return -1;
}

void Tuner::Fail(int way) {
  if (way < 0 || way >= ways_ || way != next()) return;
  int left = 0;
  for (int w = 0; w < ways_; ++w) left += failed_[w] ? 0 : 1;
  if (left <= 1) return;  // the only way left: keep it
  failed_[way] = true;
  std::fill(std::begin(cost_[way]), std::end(cost_[way]), 0.0);
  if (trying_) {
    candidate_ = way;
    EndTrial();  // keeps the chosen way: the failed one has no cost
    return;
  }
  // The chosen way failed: the cheapest of the others (the first if none was timed).
  int best = -1;
  for (int w = 0; w < ways_; ++w) {
    if (!failed_[w] && (best < 0 || Cost(w) < Cost(best))) best = w;
  }
  chosen_ = best;
  runs_ = 0;
  skip_ = warmup_;
  wait_ = period_;
}

void Tuner::Record(int way, int64_t ns, size_t bytes) {
  if (bytes == 0 || way < 0 || way >= ways_ || way != next()) return;
  bool hopeless = false;
  if (skip_ > 0) {
    --skip_;
  } else {
    const double cost = static_cast<double>(std::max<int64_t>(ns, 1)) / bytes;
    cost_[way][next_slot_[way]] = cost;
    next_slot_[way] = (next_slot_[way] + 1) % kWindow;
    hopeless = trying_ && give_up_ > 1 && cost > give_up_ * Cost(chosen_);
  }
  ++runs_;
  if (!trying_) {
    const int candidate = NextCandidate();
    if (candidate < 0) return;  // nothing else to try
    const bool untried = Cost(candidate) == std::numeric_limits<double>::infinity();
    if (runs_ >= (untried ? trial_ : wait_)) {
      // A fresh trial: what the way cost before may no longer hold.
      std::fill(std::begin(cost_[candidate]), std::end(cost_[candidate]), 0.0);
      candidate_ = candidate;
      trying_ = true;
      first_trial_ = untried;
      runs_ = 0;
      skip_ = warmup_;
    }
  } else if (runs_ >= trial_ || hopeless) {
    EndTrial();
  }
}

void Tuner::EndTrial() {
  trying_ = false;
  runs_ = 0;
  skip_ = warmup_;
  if (!failed_[candidate_] && Cost(candidate_) < Cost(chosen_)) {
    chosen_ = candidate_;
    wait_ = period_;
  } else if (!first_trial_) {
    wait_ = std::min(2 * wait_, max_period_);
  }
}

}  // namespace comm
}  // namespace weft
