// AutoFreeze (pipe/README.md, "pipe/freeze"): how many leading layers (groups) are
// frozen after each freeze point. Pure: no LibTorch, no MPI (the LibTorch gradient-norm
// collection is pipe/freeze/torch_grad_norms.h).
//
// Layers freeze as a prefix 0 .. F-1, never unfreeze, and change only at freeze points
// (each epoch, or every N iterations: the caller decides when T advances).
#ifndef WEFT_PIPE_FREEZE_FREEZE_H_
#define WEFT_PIPE_FREEZE_FREEZE_H_

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace weft {
namespace pipe {

// The schedule bound after freeze point t (t >= 0): F_t = ceil(L * (1 - (1 - alpha)^t)),
// F_0 = 0, computed so that a value that is an exact integer in real arithmetic is not
// pushed to the next integer by floating-point error (e.g. L = 8, alpha = 1/2, t = 1 is 4,
// not 5). InvalidArgument for layers < 1, alpha outside (0, 1], t < 0.
StatusOr<int> FreezeBound(int layers, double alpha, int t);

struct FreezeOptions {
  double alpha = 1.0 / 3.0;  // the paper's default
  // The gradient-aware policy: F_t = min(bound, l* + 1), where l* is the trainable layer
  // (index >= the previous F) with the smallest accumulated gradient norm over the last
  // interval (ties: the earliest). Off: F_t = the bound.
  bool gradient_aware = false;
  // Whether the last layer (group) may freeze. Off (default): F never exceeds L - 1.
  bool freeze_last = false;
};

// The frozen count after freeze point t, given the count before it (`previous`, the F of
// point t - 1) and, for the gradient-aware policy, one accumulated norm per layer (size L;
// entries below `previous` are ignored). Never below `previous` (layers never unfreeze).
// InvalidArgument for a bad alpha/t/layers, previous outside [0, L], or norms of the wrong
// size (or negative / NaN) when the policy needs them.
StatusOr<int> NextFrozen(int layers, int t, int previous, const std::vector<double>& grad_norms,
                         const FreezeOptions& options);

// Sums gradient norms per layer (group) over an interval: one Add per layer per iteration
// (the sum of norms, not the last one), Take() returns them and starts a new interval.
class GradNormAccumulator {
 public:
  explicit GradNormAccumulator(int layers);
  int layers() const { return static_cast<int>(sums_.size()); }
  // InvalidArgument for a layer out of range or a negative or non-finite norm.
  Status Add(int layer, double norm);
  const std::vector<double>& sums() const { return sums_; }
  int64_t iterations() const { return iterations_; }
  // Marks the end of one iteration (for iterations()).
  void EndIteration() { ++iterations_; }
  // The sums of this interval; the accumulator restarts from zero (sums and iterations()).
  std::vector<double> Take();

 private:
  std::vector<double> sums_;
  int64_t iterations_ = 0;
};

}  // namespace pipe
}  // namespace weft

#endif  // WEFT_PIPE_FREEZE_FREEZE_H_
