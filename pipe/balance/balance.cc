#include "pipe/balance/balance.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace weft {
namespace pipe {

namespace {

// ---- exact sums ----------------------------------------------------------------------------
//
// Every double is an integer times a power of two, so costs scaled by 2^-scale_exp (the
// smallest power among their lowest set bits) are integers, and so are all their sums: held
// as little-endian multiword integers, prefix sums and stage sums are exact, whatever the
// order of summation. That makes the optimum, its ties, and the comparisons between stages
// exact (0.1 + 0.2 vs 0.3 is decided by the doubles' true values, the same way every time),
// with no epsilon anywhere. Parameter counts need one 64-bit word; costs spanning the whole
// double range need 34.
class ExactSums {
 public:
  static constexpr int kMaxWords = 34;  // (1024 + 1074 + 31 + 2) bits
  using Value = uint64_t[kMaxWords];    // only the first words() are used

  // `costs` must be finite and >= 0.
  explicit ExactSums(const std::vector<double>& costs) : layers_(static_cast<int>(costs.size())) {
    int lowest = std::numeric_limits<int>::max();   // exponent of the lowest set bit
    int highest = std::numeric_limits<int>::min();  // every cost is < 2^highest
    for (double c : costs) {
      if (c == 0) continue;
      int exponent = 0;
      const uint64_t mantissa = Mantissa(c, &exponent);
      lowest = std::min(lowest, exponent - 53 + CountTrailingZeros(mantissa));
      highest = std::max(highest, exponent);
    }
    if (lowest == std::numeric_limits<int>::max()) {  // all zero
      scale_exp_ = 0;
      words_ = 1;
    } else {
      scale_exp_ = lowest;
      int length_bits = 0;
      while ((int64_t{1} << length_bits) <= layers_) ++length_bits;
      // A sum of L costs < 2^(highest - lowest) each, plus one bit for P[a] + X <= 2 * total.
      const int bits = highest - lowest + length_bits + 1;
      words_ = (bits + 63) / 64;
    }
    prefix_.assign(static_cast<size_t>(layers_ + 1) * words_, 0);
    for (int i = 0; i < layers_; ++i) {
      uint64_t* next = mutable_prefix(i + 1);
      std::copy(prefix(i), prefix(i) + words_, next);
      const double c = costs[static_cast<size_t>(i)];
      if (c == 0) continue;
      int exponent = 0;
      uint64_t mantissa = Mantissa(c, &exponent);
      const int zeros = CountTrailingZeros(mantissa);
      mantissa >>= zeros;
      AddShifted(mantissa, exponent - 53 + zeros - scale_exp_, next);
    }
  }

  int words() const { return words_; }
  const uint64_t* prefix(int i) const { return &prefix_[static_cast<size_t>(i) * words_]; }

  // -1, 0, 1 as a <, ==, > b.
  int Compare(const uint64_t* a, const uint64_t* b) const {
    for (int w = words_ - 1; w >= 0; --w) {
      if (a[w] != b[w]) return a[w] < b[w] ? -1 : 1;
    }
    return 0;
  }
  // out = a + b (no overflow by construction of words_).
  void Add(const uint64_t* a, const uint64_t* b, uint64_t* out) const {
    uint64_t carry = 0;
    for (int w = 0; w < words_; ++w) {
      const uint64_t s = a[w] + carry;
      const uint64_t c1 = s < carry;
      out[w] = s + b[w];
      carry = c1 + (out[w] < s);
    }
  }
  // out = a - b, a >= b.
  void Sub(const uint64_t* a, const uint64_t* b, uint64_t* out) const {
    uint64_t borrow = 0;
    for (int w = 0; w < words_; ++w) {
      const uint64_t d = a[w] - borrow;
      const uint64_t b1 = a[w] < borrow;
      out[w] = d - b[w];
      borrow = b1 + (d < b[w]);
    }
  }
  void HalveInPlace(uint64_t* x) const {
    for (int w = 0; w < words_; ++w) {
      x[w] = (x[w] >> 1) | (w + 1 < words_ ? x[w + 1] << 63 : 0);
    }
  }
  void IncrementInPlace(uint64_t* x) const {
    for (int w = 0; w < words_ && ++x[w] == 0; ++w) {
    }
  }
  void Copy(const uint64_t* from, uint64_t* to) const { std::copy(from, from + words_, to); }

  // The double nearest to x * 2^scale_exp (ties to even): monotone, so exact comparisons
  // and rounded ones never disagree in direction. (Results in the subnormal range may be
  // rounded twice; no cost model lives there.)
  double ToDouble(const uint64_t* x) const {
    int top_word = words_ - 1;
    while (top_word >= 0 && x[top_word] == 0) --top_word;
    if (top_word < 0) return 0.0;
    const int top_bit = top_word * 64 + 63 - CountLeadingZeros(x[top_word]);
    if (top_bit < 64) return std::ldexp(static_cast<double>(x[0]), scale_exp_);
    // The 64 bits below the top one, with every lower bit folded into the last ("sticky"):
    // the uint64 -> double conversion then rounds exactly as the full value would.
    const int shift = top_bit - 63;
    const uint64_t top64 = Bits(x, shift);
    bool sticky = false;
    for (int w = 0; w < shift / 64 && !sticky; ++w) sticky = x[w] != 0;
    if (!sticky && shift % 64 != 0)
      sticky = (x[shift / 64] & ((uint64_t{1} << (shift % 64)) - 1)) != 0;
    return std::ldexp(static_cast<double>(top64 | (sticky ? 1 : 0)), shift + scale_exp_);
  }

  // The exact sum of costs [begin, end), rounded to the nearest double.
  double Segment(int begin, int end) const {
    Value diff;
    Sub(prefix(end), prefix(begin), diff);
    return ToDouble(diff);
  }

  // The largest end in [begin, L] with P[end] - P[begin] <= limit.
  int FarthestEnd(int begin, const uint64_t* limit) const {
    Value target;
    Add(prefix(begin), limit, target);
    int lo = begin, hi = layers_;  // P[lo] <= target holds
    while (lo < hi) {
      const int mid = lo + (hi - lo + 1) / 2;
      if (Compare(prefix(mid), target) <= 0) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  }

  // The smallest begin in [0, end] with P[end] - P[begin] <= limit.
  int EarliestBegin(int end, const uint64_t* limit) const {
    int lo = 0, hi = end;  // begin = end qualifies
    Value reach;
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      Add(prefix(mid), limit, reach);
      if (Compare(reach, prefix(end)) >= 0) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  }

 private:
  // c = mantissa * 2^(exponent - 53), mantissa < 2^53 (c > 0, finite; subnormals too).
  static uint64_t Mantissa(double c, int* exponent) {
    const double fraction = std::frexp(c, exponent);  // in [0.5, 1)
    return static_cast<uint64_t>(std::ldexp(fraction, 53));
  }
  static int CountTrailingZeros(uint64_t x) { return x == 0 ? 64 : __builtin_ctzll(x); }
  static int CountLeadingZeros(uint64_t x) { return x == 0 ? 64 : __builtin_clzll(x); }

  // 64 bits of x starting at bit `from`.
  uint64_t Bits(const uint64_t* x, int from) const {
    const int word = from / 64, bit = from % 64;
    uint64_t out = x[word] >> bit;
    if (bit != 0 && word + 1 < words_) out |= x[word + 1] << (64 - bit);
    return out;
  }

  uint64_t* mutable_prefix(int i) { return &prefix_[static_cast<size_t>(i) * words_]; }

  // x += value << shift.
  void AddShifted(uint64_t value, int shift, uint64_t* x) const {
    const int word = shift / 64, bit = shift % 64;
    const uint64_t parts[2] = {value << bit, bit == 0 ? 0 : value >> (64 - bit)};
    uint64_t carry = 0;
    for (int w = word; w < words_; ++w) {
      const int k = w - word;
      if (k >= 2 && carry == 0) break;
      const uint64_t add = k < 2 ? parts[k] : 0;
      const uint64_t s = x[w] + add;
      const uint64_t c1 = s < add;
      x[w] = s + carry;
      carry = c1 + (x[w] < carry);
    }
  }

  int layers_ = 0;
  int words_ = 1;
  int scale_exp_ = 0;
  std::vector<uint64_t> prefix_;  // (L + 1) values of words_ words
};

// ---- validation ----------------------------------------------------------------------------

Status CheckNonNegative(const char* function, const char* what, const std::vector<double>& values) {
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    if (!(v >= 0.0) || !std::isfinite(v)) {
      return InvalidArgument(function, ": the ", what, " of layer ", i,
                             " must be finite and >= 0, got ", v,
                             "; check how the per-layer list was measured");
    }
  }
  return OkStatus();
}

StatusOr<std::vector<double>> ScaleFrozen(const char* function, const char* what,
                                          const std::vector<double>& values, int frozen,
                                          double factor, const char* factor_name) {
  WEFT_RETURN_IF_ERROR(CheckNonNegative(function, what, values));
  if (frozen < 0 || static_cast<size_t>(frozen) > values.size()) {
    return InvalidArgument(function, ": the frozen layer count must be in [0, ", values.size(),
                           "] (the number of layers), got ", frozen);
  }
  if (!(factor >= 0.0 && factor <= 1.0)) {
    return InvalidArgument(function, ": ", factor_name,
                           " (the cost of a frozen layer relative to a trainable one) must be "
                           "in [0, 1], got ",
                           factor);
  }
  std::vector<double> costs = values;
  for (int i = 0; i < frozen; ++i) costs[static_cast<size_t>(i)] *= factor;
  return costs;
}

// ---- strategies ----------------------------------------------------------------------------

// Can costs be cut into at most `stages` contiguous pieces each summing to <= limit?
// Greedy (each piece as long as it can be) is exact for this question; O(K log L).
bool Fits(const ExactSums& sums, int layers, int stages, const uint64_t* limit) {
  int begin = 0;
  for (int used = 0; used < stages; ++used) {
    const int end = sums.FarthestEnd(begin, limit);
    if (end == begin) return false;  // one layer alone exceeds the limit
    if (end == layers) return true;
    begin = end;
  }
  return false;
}

// Minimizes the largest stage, exactly: the optimum M* is the least integer (in units of
// 2^scale_exp) for which the costs fit in K pieces, found by bisection over the integers
// between the largest single cost and the total (no more steps than the total has bits,
// each a greedy check of O(K log L)). Then the lexicographically smallest boundaries among
// the partitions into K non-empty stages of at most M*: g_j, the earliest layer from which j
// stages of at most M* can hold the rest [g_j, L) (j greedy maximal pieces taken from the
// end), bounds boundary K - j from below, and b_s = max(b_{s-1} + 1, g_{K-s}) is the
// smallest boundary that leaves the rest feasible; it always keeps stage s - 1 <= M*
// because some feasible completion cuts at or after it. So the result is unique and
// deterministic.
Partition Optimal(const ExactSums& sums, int layers, int stages) {
  using Value = ExactSums::Value;
  Value lo{}, hi{}, step{};
  for (int i = 0; i < layers; ++i) {
    Value single;
    sums.Sub(sums.prefix(i + 1), sums.prefix(i), single);
    if (sums.Compare(single, lo) > 0) sums.Copy(single, lo);
  }
  sums.Copy(sums.prefix(layers), hi);  // one stage holding everything fits
  while (sums.Compare(lo, hi) < 0) {
    Value mid;
    sums.Sub(hi, lo, step);
    sums.HalveInPlace(step);
    sums.Add(lo, step, mid);
    if (Fits(sums, layers, stages, mid)) {
      sums.Copy(mid, hi);
    } else {
      sums.Copy(mid, lo);
      sums.IncrementInPlace(lo);
    }
  }
  // lo == M*.
  std::vector<int> earliest(static_cast<size_t>(stages), layers);  // earliest[j] = g_j
  for (int j = 1; j < stages; ++j) {
    earliest[static_cast<size_t>(j)] = sums.EarliestBegin(earliest[static_cast<size_t>(j - 1)], lo);
  }
  Partition p;
  p.boundaries.assign(static_cast<size_t>(stages) + 1, 0);
  for (int s = 1; s < stages; ++s) {
    p.boundaries[static_cast<size_t>(s)] = std::max(p.boundaries[static_cast<size_t>(s - 1)] + 1,
                                                    earliest[static_cast<size_t>(stages - s)]);
  }
  p.boundaries.back() = layers;
  return p;
}

Partition Even(int layers, int stages) {
  Partition p;
  p.boundaries.assign(static_cast<size_t>(stages) + 1, 0);
  const int base = layers / stages, extra = layers % stages;
  for (int s = 0; s < stages; ++s) {
    p.boundaries[static_cast<size_t>(s) + 1] =
        p.boundaries[static_cast<size_t>(s)] + base + (s < extra ? 1 : 0);
  }
  return p;
}

// numpy.var: the population variance (ddof = 0), two passes. NaN for no values, as numpy.
double PopulationVariance(const std::vector<double>& x, size_t from) {
  const size_t n = x.size() - from;
  if (n == 0) return std::numeric_limits<double>::quiet_NaN();
  double sum = 0.0;
  for (size_t i = from; i < x.size(); ++i) sum += x[i];
  const double mean = sum / static_cast<double>(n);
  double squares = 0.0;
  for (size_t i = from; i < x.size(); ++i) squares += (x[i] - mean) * (x[i] - mean);
  return squares / static_cast<double>(n);
}

// PipeTransformer's balancing walk, reproduced from its public code
// (pipe/load_balance.py, generate_parameter_size_wise_balance, as AutoElasticPipe calls it
// with no frozen-layer special case: the frozen prefix is already in the costs here):
// - sizes are in millions of parameters (its count_parameters divides by 1e6). The walk's
//   threshold adds a variance to a mean, so it is not scale-free: these units are part of
//   its behaviour;
// - device i (0-based, of K) gets threshold mean + variance, where mean = (the size not yet
//   assigned, a running total decremented layer by layer) / (K - i) and variance =
//   numpy.var(the sizes not yet assigned) / (K - i);
// - it takes the next layer while (its size so far + that layer) < threshold, strictly,
//   and stops at the first layer that does not fit (never skips one);
// - the last device takes every remaining layer, however many.
// So a layer larger than a threshold leaves a device empty, a large variance lets the
// first devices swallow many layers, and the last device collects the rest: stages can be
// empty or overloaded. Its summation order differs from numpy's pairwise sum in the last
// bits of the variance, which only matters for a size within an ulp of a threshold.
Partition Greedy(const std::vector<double>& costs, int stages) {
  constexpr double kMillion = 1e6;
  const size_t layers = costs.size();
  std::vector<double> sizes(layers);
  for (size_t i = 0; i < layers; ++i) sizes[i] = costs[i] / kMillion;
  double unassigned = 0.0;
  for (double s : sizes) unassigned += s;  // Python's sum(): left to right
  std::vector<int> counts(static_cast<size_t>(stages), 0);
  size_t next = 0;
  for (int device = 0; device < stages; ++device) {
    const double devices_left = static_cast<double>(stages - device);
    const double mean = unassigned / devices_left;
    const double variance = PopulationVariance(sizes, next) / devices_left;
    double device_size = 0.0;
    const bool last = device == stages - 1;
    while (next < layers && (last || device_size + sizes[next] < mean + variance)) {
      device_size += sizes[next];
      unassigned -= sizes[next];
      ++counts[static_cast<size_t>(device)];
      ++next;
    }
  }
  Partition p;
  p.boundaries.assign(static_cast<size_t>(stages) + 1, 0);
  for (int s = 0; s < stages; ++s) {
    p.boundaries[static_cast<size_t>(s) + 1] =
        p.boundaries[static_cast<size_t>(s)] + counts[static_cast<size_t>(s)];
  }
  return p;
}

}  // namespace

StatusOr<std::vector<double>> ParameterCosts(const std::vector<double>& sizes, int frozen,
                                             double lambda) {
  return ScaleFrozen("ParameterCosts", "parameter count", sizes, frozen, lambda, "lambda");
}

StatusOr<std::vector<double>> TimeCosts(const std::vector<double>& times, int frozen,
                                        double frozen_fraction) {
  return ScaleFrozen("TimeCosts", "measured time", times, frozen, frozen_fraction,
                     "frozen_fraction");
}

bool Partition::has_empty_stage() const {
  for (int s = 0; s < stages(); ++s) {
    if (layers(s) == 0) return true;
  }
  return false;
}

const char* StrategyName(Strategy s) {
  switch (s) {
    case Strategy::kOptimal:
      return "optimal";
    case Strategy::kGreedy:
      return "greedy";
    case Strategy::kEven:
      return "even";
  }
  return "unknown";
}

StatusOr<Strategy> ParseStrategy(const std::string& name) {
  for (Strategy s : {Strategy::kOptimal, Strategy::kGreedy, Strategy::kEven}) {
    if (name == StrategyName(s)) return s;
  }
  return InvalidArgument("unknown partition strategy \"", name,
                         "\"; expected one of: optimal, greedy, even");
}

StatusOr<Partition> PartitionLayers(const std::vector<double>& costs, int stages,
                                    Strategy strategy) {
  if (stages < 1) {
    return InvalidArgument("PartitionLayers: the number of stages must be >= 1, got ", stages,
                           "; pass the pipeline length K");
  }
  if (costs.empty()) {
    return InvalidArgument(
        "PartitionLayers: there are no layers to partition (the cost list "
        "is empty); pass one cost per layer group, e.g. from "
        "ParameterCosts");
  }
  if (costs.size() > static_cast<size_t>(std::numeric_limits<int>::max() / 2)) {
    return InvalidArgument("PartitionLayers: ", costs.size(), " layers are more than supported (",
                           std::numeric_limits<int>::max() / 2, "); group layers");
  }
  WEFT_RETURN_IF_ERROR(CheckNonNegative("PartitionLayers", "cost", costs));
  const int layers = static_cast<int>(costs.size());
  if (stages > layers && strategy != Strategy::kGreedy) {
    return InvalidArgument("PartitionLayers: ", stages, " stages for ", layers, " layers: the ",
                           StrategyName(strategy),
                           " strategy gives every stage at least one layer; use at most ", layers,
                           " stages, or split the model finer (e.g. a transformer "
                           "block into its halves, TransformerBlockHalves)");
  }
  const ExactSums sums(costs);
  const double total = sums.Segment(0, layers);
  if (!std::isfinite(total)) {
    return InvalidArgument(
        "PartitionLayers: the costs sum to more than the largest double; "
        "scale them down (e.g. parameter counts in millions)");
  }
  Partition p;
  switch (strategy) {
    case Strategy::kOptimal:
      p = Optimal(sums, layers, stages);
      break;
    case Strategy::kGreedy:
      p = Greedy(costs, stages);
      break;
    case Strategy::kEven:
      p = Even(layers, stages);
      break;
    default:
      return InvalidArgument("PartitionLayers: unknown strategy ", static_cast<int>(strategy),
                             "; expected one of: optimal, greedy, even");
  }
  p.stage_costs.resize(static_cast<size_t>(stages));
  p.max_cost = 0;
  for (int s = 0; s < stages; ++s) {
    const double cost = sums.Segment(p.boundaries[static_cast<size_t>(s)],
                                     p.boundaries[static_cast<size_t>(s) + 1]);
    p.stage_costs[static_cast<size_t>(s)] = cost;
    p.max_cost = std::max(p.max_cost, cost);
  }
  return p;
}

BlockHalves TransformerBlockHalves(const TransformerBlockDims& dims) {
  const int64_t h = dims.hidden, m = dims.mlp;
  const int64_t layer_norm = 2 * h;  // scale and shift
  BlockHalves halves;
  // Q, K, V projections h -> h each, then the output projection h -> h.
  halves.attention =
      static_cast<double>(layer_norm + 3 * h * h + h * h + (dims.bias ? 3 * h + h : 0));
  // h -> m, then m -> h.
  halves.mlp = static_cast<double>(layer_norm + h * m + m * h + (dims.bias ? m + h : 0));
  return halves;
}

}  // namespace pipe
}  // namespace weft
