#include "pipe/freeze/freeze.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace weft {
namespace pipe {

namespace {

// How close (relative to v) the real-valued bound v must be to an integer to count as that
// integer. v = -L * expm1(t * log1p(-alpha)) carries a relative error of a few ulps whatever
// t and alpha (expm1/log1p keep it from growing with t the way pow(1 - alpha, t) does), and a
// decimal alpha such as 0.3 or 0.07 is itself off by an ulp: both move an exact integer
// (L = 10, alpha = 0.3, t = 1 is 3) by ~1e-15 * v, and a plain ceil then gives 4. 1e-12
// leaves a thousandfold margin and is still far below any fractional part the schedule can
// legitimately produce for realistic L and alpha. Relative to v, not L, so that a tiny but
// genuine v (a very small alpha) still rounds up to 1.
constexpr double kIntegerTolerance = 1e-12;

Status CheckAlpha(double alpha) {
  // Written so that NaN fails too.
  if (!(alpha > 0.0 && alpha <= 1.0)) {
    return InvalidArgument(
        "freeze: alpha must be in (0, 1] (the fraction of the still "
        "trainable layers frozen at each freeze point; the paper uses 1/3), "
        "got ",
        alpha);
  }
  return OkStatus();
}

}  // namespace

StatusOr<int> FreezeBound(int layers, double alpha, int t) {
  if (layers < 1) {
    return InvalidArgument("freeze: the model must have at least one layer (group), got ", layers,
                           "; pass the number of freezable layer groups");
  }
  WEFT_RETURN_IF_ERROR(CheckAlpha(alpha));
  if (t < 0) {
    return InvalidArgument(
        "freeze: the freeze point t must be >= 0 (0 = before the first "
        "freeze point), got ",
        t);
  }
  if (t == 0) return 0;
  if (alpha == 1.0) return layers;  // log1p(-1) is -inf: everything freezes at once.
  const double l = static_cast<double>(layers);
  // L * (1 - (1 - alpha)^t) without forming (1 - alpha)^t: exact enough for any t (a large t
  // only drives expm1 to -1, so v never exceeds L and nothing overflows).
  const double v = -l * std::expm1(static_cast<double>(t) * std::log1p(-alpha));
  const double nearest = std::nearbyint(v);
  double bound = std::fabs(v - nearest) <= kIntegerTolerance * v ? nearest : std::ceil(v);
  bound = std::min(std::max(bound, 0.0), l);
  return static_cast<int>(bound);
}

StatusOr<int> NextFrozen(int layers, int t, int previous, const std::vector<double>& grad_norms,
                         const FreezeOptions& options) {
  WEFT_ASSIGN_OR_RETURN(const int bound, FreezeBound(layers, options.alpha, t));
  if (previous < 0 || previous > layers) {
    return InvalidArgument("freeze: the previous frozen count must be in [0, ", layers,
                           "] (the F of the last freeze point, 0 at the start), got ", previous);
  }
  int next = bound;
  if (options.gradient_aware) {
    if (grad_norms.size() != static_cast<size_t>(layers)) {
      return InvalidArgument(
          "freeze: the gradient-aware policy needs one accumulated "
          "gradient norm per layer (",
          layers, "), got ", grad_norms.size(),
          "; pass GradNormAccumulator::Take() of an accumulator of ", layers, " layers");
    }
    // The trainable layer whose gradients moved least over the interval (the earliest on a
    // tie). Layers already frozen have no gradients and are not candidates.
    int least = -1;
    for (int layer = previous; layer < layers; ++layer) {
      const double norm = grad_norms[static_cast<size_t>(layer)];
      if (!(norm >= 0.0) || !std::isfinite(norm)) {
        return InvalidArgument("freeze: the gradient norm of layer ", layer,
                               " must be finite and >= 0, got ", norm,
                               "; check the gradients of that layer for NaN/Inf");
      }
      if (least < 0 || norm < grad_norms[static_cast<size_t>(least)]) least = layer;
    }
    if (least >= 0) next = std::min(next, least + 1);
  }
  // The last layer (group) usually carries the head: it keeps training unless asked.
  if (!options.freeze_last) next = std::min(next, layers - 1);
  // Layers never unfreeze, even where a gradient-aware point chose fewer than the bound.
  return std::max(next, previous);
}

GradNormAccumulator::GradNormAccumulator(int layers)
    : sums_(static_cast<size_t>(std::max(layers, 0)), 0.0) {}

Status GradNormAccumulator::Add(int layer, double norm) {
  if (layer < 0 || layer >= layers()) {
    return InvalidArgument("gradient norms: layer ", layer, " is out of range [0, ", layers(),
                           "); the accumulator was made for ", layers(), " layers");
  }
  if (!(norm >= 0.0) || !std::isfinite(norm)) {
    return InvalidArgument("gradient norms: the norm of layer ", layer,
                           " must be finite and >= 0, got ", norm,
                           "; check that layer's gradients for NaN/Inf (e.g. a diverging loss)");
  }
  sums_[static_cast<size_t>(layer)] += norm;
  return OkStatus();
}

std::vector<double> GradNormAccumulator::Take() {
  std::vector<double> taken(sums_.size(), 0.0);
  taken.swap(sums_);
  iterations_ = 0;
  return taken;
}

}  // namespace pipe
}  // namespace weft
