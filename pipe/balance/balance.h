// Load balancing: partitioning L layers (groups) into K contiguous pipeline stages
// (pipe/README.md, "pipe/balance"). Pure: no LibTorch, no MPI.
#ifndef WEFT_PIPE_BALANCE_BALANCE_H_
#define WEFT_PIPE_BALANCE_BALANCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace weft {
namespace pipe {

// Per-layer cost from parameter counts: a trainable layer costs its count; each of the
// first `frozen` layers costs lambda times it (frozen layers run forward only; the paper's
// lambda is 1/6). InvalidArgument for a negative or non-finite size, frozen outside
// [0, L], lambda outside [0, 1].
StatusOr<std::vector<double>> ParameterCosts(const std::vector<double>& sizes, int frozen,
                                             double lambda = 1.0 / 6.0);
// From measured per-layer times (forward + backward of a trainable layer, seconds or any
// unit), frozen layers costing `frozen_fraction` of theirs (forward only: about 1/3).
StatusOr<std::vector<double>> TimeCosts(const std::vector<double>& times, int frozen,
                                        double frozen_fraction = 1.0 / 3.0);

struct Partition {
  // K + 1 entries: stage s holds layers [boundaries[s], boundaries[s + 1]);
  // boundaries.front() == 0, boundaries.back() == L.
  std::vector<int> boundaries;
  // K entries: each the exact sum of the stage's costs, rounded to the nearest double (so
  // equal sums are equal and the order of summation does not matter).
  std::vector<double> stage_costs;
  double max_cost = 0;              // the largest stage cost
  int stages() const { return static_cast<int>(stage_costs.size()); }
  int layers(int stage) const { return boundaries[stage + 1] - boundaries[stage]; }
  bool has_empty_stage() const;
};

enum class Strategy {
  // The optimal contiguous partition: minimizes the largest stage cost; never an empty
  // stage while L >= K; among optimal partitions, the lexicographically smallest
  // boundaries (deterministic). O(L log(sum/eps)) or better: 10,000 layers into 64
  // stages well under a second. Sums and comparisons are exact (on the doubles' true
  // values, no epsilon): O(L + B K log L), B = the bits of the total in units of the
  // smallest cost bit (about 30-80 for parameter counts and measured times).
  kOptimal,
  // PipeTransformer's greedy parameter-size walk, reproduced with its quirks (it can leave
  // stages empty or overloaded), for comparison with the paper. Its threshold (mean +
  // variance of the rest) is not scale-free; like the reference it works in millions of
  // parameters, so pass parameter counts (ParameterCosts) to reproduce it. Accepts more
  // stages than layers (the extra stages stay empty).
  kGreedy,
  // Equal layer counts (the first L mod K stages one layer more), ignoring costs.
  kEven,
};
const char* StrategyName(Strategy s);  // "optimal", "greedy", "even"
StatusOr<Strategy> ParseStrategy(const std::string& name);

// InvalidArgument for K < 1, an empty cost list, a negative or non-finite cost, or (for
// kOptimal and kEven) more stages than layers.
StatusOr<Partition> PartitionLayers(const std::vector<double>& costs, int stages,
                                    Strategy strategy = Strategy::kOptimal);

// Sub-layer granularity: a transformer block as two pipeline units, each with its norm and
// residual, so that no stage boundary cuts a skip connection. Parameter counts.
struct TransformerBlockDims {
  int64_t hidden = 768;   // model width
  int64_t mlp = 3072;     // MLP inner width
  bool bias = true;       // linear layers have biases
};
struct BlockHalves {
  double attention = 0;  // LayerNorm + QKV projections + output projection
  double mlp = 0;        // LayerNorm + the two MLP linear layers
};
BlockHalves TransformerBlockHalves(const TransformerBlockDims& dims);

}  // namespace pipe
}  // namespace weft

#endif  // WEFT_PIPE_BALANCE_BALANCE_H_
