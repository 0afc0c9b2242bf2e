// Virtual topologies: weighted directed graphs over ranks, their generators, and the
// dynamic send/receive schedules. Pure code (no MPI), unit-tested in one process.
//
// W[i][j] is the weight of the edge i -> j, applied by the receiver j; the self loop W[i][i]
// carries rank i's self weight.
#ifndef WEFT_COMM_TOPOLOGY_H_
#define WEFT_COMM_TOPOLOGY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/status.h"

namespace weft {

class Topology {
 public:
  Topology() = default;
  // `size` ranks, no edges, every self weight 1.
  explicit Topology(int size);

  // From a dense matrix: w[i][j] != 0 (i != j) is an edge i -> j; w[i][i] the self weight.
  static StatusOr<Topology> FromWeightMatrix(const std::vector<std::vector<double>>& w);

  int size() const { return static_cast<int>(self_weights_.size()); }

  // Adds (or re-weights) the edge from -> to; from != to, both in range.
  Status AddEdge(int from, int to, double weight);
  Status SetSelfWeight(int rank, double weight);

  double self_weight(int rank) const { return self_weights_[rank]; }
  // 0 when there is no edge; the self weight when from == to.
  double weight(int from, int to) const;
  bool has_edge(int from, int to) const;

  // Neighbors sorted by rank, self excluded.
  const std::vector<int>& out_neighbors(int rank) const { return out_[rank]; }
  const std::vector<int>& in_neighbors(int rank) const { return in_[rank]; }

  std::vector<std::vector<double>> ToWeightMatrix() const;

  // 64-bit FNV-1a over (size, sorted edge list): equal for equivalent graphs on every
  // process and platform; used by set_topology's cross-rank check.
  uint64_t AdjacencyFingerprint() const;

 private:
  std::vector<double> self_weights_;
  std::vector<std::vector<int>> out_;
  std::vector<std::vector<int>> in_;
  std::vector<std::map<int, double>> out_weights_;  // from -> {to: weight}
};

struct RecvWeights {
  double self_weight = 1.0;
  std::map<int, double> neighbor_weights;  // in-neighbor -> W[neighbor][rank]
};
// (W[r][r], {i: W[i][r] for each in-neighbor i}).
RecvWeights GetRecvWeights(const Topology& topo, int rank);
// (W[r][r], {j: W[r][j] for each out-neighbor j}): row r.
RecvWeights GetSendWeights(const Topology& topo, int rank);

// Generators. Each returns InvalidArgument for sizes or parameters that make no sense.
StatusOr<Topology> ExponentialGraph(int size, int base = 2);
StatusOr<Topology> ExponentialTwoGraph(int size);
// i links to i + d for every offset d whose distance around the ring, min(d, size - d), is
// a power of `base` (1, base, base^2, ...); equal weights (Bluefog's definition).
StatusOr<Topology> SymmetricExponentialGraph(int size, int base = 4);
// `shape` (rows, cols) with rows * cols == size; default: rows = the largest divisor of
// size not above sqrt(size).
StatusOr<Topology> MeshGrid2DGraph(int size, std::optional<std::pair<int, int>> shape = {});
StatusOr<Topology> StarGraph(int size, int center = 0);
// style 0: bidirectional, 1/3 each; 1: i -> i-1 with 1/2; 2: i -> i+1 with 1/2.
StatusOr<Topology> RingGraph(int size, int style = 0);
StatusOr<Topology> FullyConnectedGraph(int size);

// Every rank has the same in-degree and the same out-degree.
bool IsRegular(const Topology& topo);
// Same size and same edges (weights ignored).
bool IsEquivalent(const Topology& a, const Topology& b);

// Dynamic schedules: infinite iterators, one step per Next().
struct SendRecvRanks {
  std::vector<int> send_ranks;
  std::vector<int> recv_ranks;
};

class DynamicSchedule {
 public:
  virtual ~DynamicSchedule() = default;
  virtual SendRecvRanks Next() = 0;
};

// One peer per step over a topology: rank r's out-neighbors sorted clockwise from r
// ((j - r) mod n ascending); at step k, r sends to sorted[k mod out_degree] and receives
// from every rank whose step-k target is r.
StatusOr<std::unique_ptr<DynamicSchedule>> OnePeerSchedule(const Topology& topo, int rank);

// Machine level: distance d = 2^(k mod (floor(log2(M - 1)) + 1)); machine m sends to
// (m + d) mod M and receives from (m - d) mod M. Ranks are machine indices. M == 1 yields
// empty sets.
StatusOr<std::unique_ptr<DynamicSchedule>> MachineExponentialTwoSchedule(int machine_size,
                                                                         int machine_rank);

// Inner-outer schedules over world ranks laid out machine by machine (rank =
// machine * local_size + local_rank). At step k, local rank (k mod local_size) of every
// machine talks to the same local rank on other machines (ring: next/previous machine;
// exponential-2: the machine-level exponential-2 distance); the other local ranks of
// the machine exchange among themselves (ring: next/previous of those local ranks;
// exponential-2: distance 2^j over those local ranks).
StatusOr<std::unique_ptr<DynamicSchedule>> InnerOuterRingSchedule(int world_size,
                                                                  int local_size, int rank);
StatusOr<std::unique_ptr<DynamicSchedule>> InnerOuterExponentialTwoSchedule(int world_size,
                                                                            int local_size,
                                                                            int rank);

}  // namespace weft

#endif  // WEFT_COMM_TOPOLOGY_H_
