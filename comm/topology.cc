#include "comm/topology.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/codec.h"

namespace weft {
namespace {

// floor(log2(x)) for x >= 1, in integers: a floating-point log rounds the wrong way at
// exact powers (log(243) / log(3) < 5), which silently drops peers.
int FloorLog2(uint64_t x) {
  int log = 0;
  while (x > 1) {
    x >>= 1;
    ++log;
  }
  return log;
}

// Euclidean modulo: the schedules step backwards around rings, where C++'s % would go
// negative.
int Mod(int64_t a, int64_t n) {
  int64_t r = a % n;
  return static_cast<int>(r < 0 ? r + n : r);
}

// The powers base^0, base^1, ... below `size`, computed in 64 bits so the last
// multiplication cannot overflow even for size near INT_MAX.
std::vector<int> PowersBelow(int size, int base) {
  std::vector<int> powers;
  for (int64_t p = 1; p < size; p *= base) powers.push_back(static_cast<int>(p));
  return powers;
}

Status CheckSize(const char* what, int size) {
  if (size < 1) {
    return InvalidArgument(what, ": size must be at least 1 rank, got ", size);
  }
  return OkStatus();
}

Status CheckBase(const char* what, int base) {
  if (base < 2) {
    return InvalidArgument(what, ": base must be at least 2, got ", base);
  }
  return OkStatus();
}

Status CheckWeight(const char* what, double weight) {
  // Weights average tensors: NaN or infinity would poison every receiver, and a negative
  // weight breaks the convex combination the averaging algorithms assume.
  if (!std::isfinite(weight) || weight < 0) {
    return InvalidArgument(what, ": weight must be finite and non-negative, got ", weight);
  }
  return OkStatus();
}

// A circulant graph: every rank i sends to i + offset (mod size) for each offset, with
// equal weights over its distinct targets and itself. Offsets that coincide mod size, or
// land on i itself, contribute nothing.
StatusOr<Topology> CirculantEqualWeights(int size, const std::vector<int64_t>& offsets) {
  std::set<int> distinct;
  for (int64_t offset : offsets) {
    int d = Mod(offset, size);
    if (d != 0) distinct.insert(d);
  }
  Topology topo(size);
  const double w = 1.0 / (static_cast<double>(distinct.size()) + 1.0);
  std::vector<int> targets;
  for (int i = 0; i < size; ++i) {
    WEFT_RETURN_IF_ERROR(topo.SetSelfWeight(i, w));
    targets.clear();
    for (int d : distinct) targets.push_back(Mod(static_cast<int64_t>(i) + d, size));
    // Adding in rank order appends to the sorted neighbor lists instead of shifting them,
    // which keeps dense graphs (fully connected) quadratic rather than cubic.
    std::sort(targets.begin(), targets.end());
    for (int j : targets) WEFT_RETURN_IF_ERROR(topo.AddEdge(i, j, w));
  }
  return topo;
}

void InsertSorted(std::vector<int>* v, int x) {
  auto it = std::lower_bound(v->begin(), v->end(), x);
  if (it == v->end() || *it != x) v->insert(it, x);
}

}  // namespace

Topology::Topology(int size)
    : self_weights_(std::max(size, 0), 1.0),
      out_(std::max(size, 0)),
      in_(std::max(size, 0)),
      out_weights_(std::max(size, 0)) {}

StatusOr<Topology> Topology::FromWeightMatrix(const std::vector<std::vector<double>>& w) {
  const int n = static_cast<int>(w.size());
  if (n == 0) {
    return InvalidArgument(
        "FromWeightMatrix: expected a square matrix of at least 1 rank, "
        "got an empty matrix");
  }
  for (int i = 0; i < n; ++i) {
    if (static_cast<int>(w[i].size()) != n) {
      return InvalidArgument("FromWeightMatrix: expected a square ", n, "x", n, " matrix, but row ",
                             i, " has ", w[i].size(), " entries");
    }
  }
  Topology topo(n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      const double x = w[i][j];
      if (!std::isfinite(x) || x < 0) {
        return InvalidArgument(
            "FromWeightMatrix: weights must be finite and non-negative, "
            "but w[",
            i, "][", j, "] is ", x);
      }
      if (i == j) {
        topo.self_weights_[i] = x;
      } else if (x != 0) {
        WEFT_RETURN_IF_ERROR(topo.AddEdge(i, j, x));
      }
    }
  }
  return topo;
}

Status Topology::AddEdge(int from, int to, double weight) {
  if (from < 0 || from >= size() || to < 0 || to >= size()) {
    return InvalidArgument("AddEdge: ranks must be in [0, ", size(), "), got ", from, " -> ", to);
  }
  if (from == to) {
    return InvalidArgument("AddEdge: self loops are not edges (rank ", from,
                           "); use SetSelfWeight for the self weight");
  }
  WEFT_RETURN_IF_ERROR(CheckWeight("AddEdge", weight));
  out_weights_[from][to] = weight;
  InsertSorted(&out_[from], to);
  InsertSorted(&in_[to], from);
  return OkStatus();
}

Status Topology::SetSelfWeight(int rank, double weight) {
  if (rank < 0 || rank >= size()) {
    return InvalidArgument("SetSelfWeight: rank must be in [0, ", size(), "), got ", rank);
  }
  WEFT_RETURN_IF_ERROR(CheckWeight("SetSelfWeight", weight));
  self_weights_[rank] = weight;
  return OkStatus();
}

double Topology::weight(int from, int to) const {
  if (from < 0 || from >= size() || to < 0 || to >= size()) return 0.0;
  if (from == to) return self_weights_[from];
  auto it = out_weights_[from].find(to);
  return it == out_weights_[from].end() ? 0.0 : it->second;
}

bool Topology::has_edge(int from, int to) const {
  if (from < 0 || from >= size() || from == to) return false;
  return out_weights_[from].count(to) > 0;
}

std::vector<std::vector<double>> Topology::ToWeightMatrix() const {
  const int n = size();
  std::vector<std::vector<double>> w(n, std::vector<double>(n, 0.0));
  for (int i = 0; i < n; ++i) {
    w[i][i] = self_weights_[i];
    for (const auto& [j, x] : out_weights_[i]) w[i][j] = x;
  }
  return w;
}

uint64_t Topology::AdjacencyFingerprint() const {
  // Each value as 8 little-endian bytes: independent of the platform's int width and byte
  // order.
  codec::Fingerprint h;
  h.Put(static_cast<uint64_t>(size()));
  // out_ is sorted per rank, so walking ranks in order visits edges in (from, to) order.
  for (int from = 0; from < size(); ++from) {
    for (int to : out_[from]) {
      h.Put(static_cast<uint64_t>(from));
      h.Put(static_cast<uint64_t>(to));
    }
  }
  return h.value();
}

// An out-of-range rank gets the default (self weight 1, no neighbors) rather than
// undefined behaviour; callers validate ranks when they set the topology.
RecvWeights GetRecvWeights(const Topology& topo, int rank) {
  RecvWeights result;
  if (rank < 0 || rank >= topo.size()) return result;
  result.self_weight = topo.self_weight(rank);
  for (int i : topo.in_neighbors(rank)) result.neighbor_weights[i] = topo.weight(i, rank);
  return result;
}

RecvWeights GetSendWeights(const Topology& topo, int rank) {
  RecvWeights result;
  if (rank < 0 || rank >= topo.size()) return result;
  result.self_weight = topo.self_weight(rank);
  for (int j : topo.out_neighbors(rank)) result.neighbor_weights[j] = topo.weight(rank, j);
  return result;
}

StatusOr<Topology> ExponentialGraph(int size, int base) {
  WEFT_RETURN_IF_ERROR(CheckSize("ExponentialGraph", size));
  WEFT_RETURN_IF_ERROR(CheckBase("ExponentialGraph", base));
  std::vector<int64_t> offsets;
  for (int p : PowersBelow(size, base)) offsets.push_back(p);
  return CirculantEqualWeights(size, offsets);
}

StatusOr<Topology> ExponentialTwoGraph(int size) { return ExponentialGraph(size, 2); }

StatusOr<Topology> SymmetricExponentialGraph(int size, int base) {
  WEFT_RETURN_IF_ERROR(CheckSize("SymmetricExponentialGraph", size));
  WEFT_RETURN_IF_ERROR(CheckBase("SymmetricExponentialGraph", base));
  // Offset d links when its distance around the ring, min(d, size - d), is a power of the
  // base (1 included), as Bluefog defines it; so d and size - d link together.
  const std::vector<int> powers = PowersBelow(size, base);
  std::vector<int64_t> offsets;
  for (int d = 1; d < size; ++d) {
    const int distance = std::min(d, size - d);
    if (std::find(powers.begin(), powers.end(), distance) != powers.end()) offsets.push_back(d);
  }
  return CirculantEqualWeights(size, offsets);
}

StatusOr<Topology> MeshGrid2DGraph(int size, std::optional<std::pair<int, int>> shape) {
  WEFT_RETURN_IF_ERROR(CheckSize("MeshGrid2DGraph", size));
  int rows = 1;
  if (shape.has_value()) {
    const auto [r, c] = *shape;
    if (r < 1 || c < 1 || static_cast<int64_t>(r) * c != size) {
      return InvalidArgument(
          "MeshGrid2DGraph: shape must be positive (rows, cols) with "
          "rows * cols == size ",
          size, ", got (", r, ", ", c, ")");
    }
    rows = r;
  } else {
    // The squarest grid keeps the diameter, and so the mixing time, smallest.
    for (int64_t d = 1; d * d <= size; ++d) {
      if (size % d == 0) rows = static_cast<int>(d);
    }
  }
  const int cols = size / rows;

  auto degree = [&](int rank) {
    const int r = rank / cols;
    const int c = rank % cols;
    return (r > 0) + (r < rows - 1) + (c > 0) + (c < cols - 1);
  };

  Topology topo(size);
  for (int i = 0; i < size; ++i) {
    const int r = i / cols;
    const int c = i % cols;
    std::vector<int> neighbors;
    if (r > 0) neighbors.push_back(i - cols);
    if (c > 0) neighbors.push_back(i - 1);
    if (c < cols - 1) neighbors.push_back(i + 1);
    if (r < rows - 1) neighbors.push_back(i + cols);
    // Metropolis-Hastings weights: symmetric, so the matrix is doubly stochastic.
    double sum = 0;
    for (int j : neighbors) {
      const double w = 1.0 / std::max(degree(i) + 1, degree(j) + 1);
      WEFT_RETURN_IF_ERROR(topo.AddEdge(i, j, w));
      sum += w;
    }
    WEFT_RETURN_IF_ERROR(topo.SetSelfWeight(i, 1.0 - sum));
  }
  return topo;
}

StatusOr<Topology> StarGraph(int size, int center) {
  WEFT_RETURN_IF_ERROR(CheckSize("StarGraph", size));
  if (center < 0 || center >= size) {
    return InvalidArgument("StarGraph: center must be in [0, ", size, "), got ", center);
  }
  Topology topo(size);
  const double w = 1.0 / size;
  // The center spreads evenly over everyone (itself included); each leaf keeps most of
  // its own value and gives the center 1/n, so every row and every column sums to 1.
  WEFT_RETURN_IF_ERROR(topo.SetSelfWeight(center, w));
  for (int i = 0; i < size; ++i) {
    if (i == center) continue;
    WEFT_RETURN_IF_ERROR(topo.SetSelfWeight(i, 1.0 - w));
    WEFT_RETURN_IF_ERROR(topo.AddEdge(center, i, w));
    WEFT_RETURN_IF_ERROR(topo.AddEdge(i, center, w));
  }
  return topo;
}

StatusOr<Topology> RingGraph(int size, int style) {
  WEFT_RETURN_IF_ERROR(CheckSize("RingGraph", size));
  switch (style) {
    // Equal weights over self and the distinct neighbors. For size 2 in style 0 the left
    // and right neighbor are the same rank, so the two edges merge into one and the row
    // is (self 1/2, neighbor 1/2) rather than 1/3 + 1/3 that would not sum to 1; size 1
    // has no neighbor and keeps self weight 1.
    case 0:
      return CirculantEqualWeights(size, {1, -1});
    case 1:
      return CirculantEqualWeights(size, {-1});
    case 2:
      return CirculantEqualWeights(size, {1});
    default:
      return InvalidArgument(
          "RingGraph: style must be 0 (bidirectional), 1 (to i-1) or "
          "2 (to i+1), got ",
          style);
  }
}

StatusOr<Topology> FullyConnectedGraph(int size) {
  WEFT_RETURN_IF_ERROR(CheckSize("FullyConnectedGraph", size));
  std::vector<int64_t> offsets;
  for (int d = 1; d < size; ++d) offsets.push_back(d);
  return CirculantEqualWeights(size, offsets);
}

bool IsRegular(const Topology& topo) {
  for (int r = 1; r < topo.size(); ++r) {
    if (topo.in_neighbors(r).size() != topo.in_neighbors(0).size() ||
        topo.out_neighbors(r).size() != topo.out_neighbors(0).size()) {
      return false;
    }
  }
  return true;
}

bool IsEquivalent(const Topology& a, const Topology& b) {
  if (a.size() != b.size()) return false;
  for (int r = 0; r < a.size(); ++r) {
    if (a.out_neighbors(r) != b.out_neighbors(r)) return false;
  }
  return true;
}

namespace {

// Rank r's view of the one-peer schedule. Rank i sends at step k to the (k mod deg_i)-th
// of its clockwise-sorted out-neighbors, so i reaches r exactly at the steps with
// k mod deg_i == (position of r in i's list): storing that pair per in-neighbor makes
// Next() O(in-degree) without simulating the other ranks.
class OnePeer : public DynamicSchedule {
 public:
  OnePeer(const Topology& topo, int rank) {
    const int n = topo.size();
    auto clockwise = [n](int from) {
      return [n, from](int a, int b) { return Mod(a - from, n) < Mod(b - from, n); };
    };
    targets_ = topo.out_neighbors(rank);
    std::sort(targets_.begin(), targets_.end(), clockwise(rank));
    for (int i : topo.in_neighbors(rank)) {  // ascending, so recv_ranks come out sorted
      std::vector<int> order = topo.out_neighbors(i);
      std::sort(order.begin(), order.end(), clockwise(i));
      const auto pos = std::find(order.begin(), order.end(), rank) - order.begin();
      senders_.push_back({i, static_cast<uint64_t>(order.size()), static_cast<uint64_t>(pos)});
    }
  }

  SendRecvRanks Next() override {
    SendRecvRanks result;
    if (!targets_.empty()) result.send_ranks.push_back(targets_[step_ % targets_.size()]);
    for (const Sender& s : senders_) {
      if (step_ % s.degree == s.position) result.recv_ranks.push_back(s.rank);
    }
    ++step_;
    return result;
  }

 private:
  struct Sender {
    int rank;
    uint64_t degree;
    uint64_t position;
  };
  std::vector<int> targets_;
  std::vector<Sender> senders_;
  uint64_t step_ = 0;
};

// Exponential-2 distance of step k among `count` peers on a ring: 1, 2, 4, ... up to the
// largest power of two below count, then wrapping. Requires count >= 2.
int64_t ExpTwoDistance(uint64_t step, int count) {
  const uint64_t period = static_cast<uint64_t>(FloorLog2(count - 1)) + 1;
  return int64_t{1} << (step % period);
}

// Machine m exchanges with the machines at exponential-2 distance d: sends to m + d and
// receives from m - d. With one machine there is nobody to talk to.
class MachineExpTwo : public DynamicSchedule {
 public:
  MachineExpTwo(int machines, int machine) : machines_(machines), machine_(machine) {}

  SendRecvRanks Next() override {
    SendRecvRanks result;
    if (machines_ > 1) {
      const int64_t d = ExpTwoDistance(step_, machines_);
      result.send_ranks.push_back(Mod(machine_ + d, machines_));
      result.recv_ranks.push_back(Mod(machine_ - d, machines_));
    }
    ++step_;
    return result;
  }

 private:
  int machines_;
  int machine_;
  uint64_t step_ = 0;
};

// See InnerOuterRingSchedule in the header. At step k local rank o = k mod L is the outer
// rank of every machine and talks across machines; the other L - 1 local ranks form a
// ring of positions 0..L-2 (local-rank order, o skipped) and talk within the machine.
// Rotating o spreads the cross-machine traffic over all local ranks.
class InnerOuter : public DynamicSchedule {
 public:
  InnerOuter(int world, int local, int rank, bool exponential)
      : machines_(world / local),
        local_size_(local),
        machine_(rank / local),
        local_rank_(rank % local),
        exponential_(exponential) {}

  SendRecvRanks Next() override {
    SendRecvRanks result;
    const int outer = static_cast<int>(step_ % static_cast<uint64_t>(local_size_));
    if (local_rank_ == outer) {
      if (machines_ > 1) {
        const int64_t d = exponential_ ? ExpTwoDistance(step_, machines_) : 1;
        result.send_ranks.push_back(Mod(machine_ + d, machines_) * local_size_ + outer);
        result.recv_ranks.push_back(Mod(machine_ - d, machines_) * local_size_ + outer);
      }
    } else {
      const int count = local_size_ - 1;
      // A lone inner rank would only pair with itself, so it sits this step out.
      if (count >= 2) {
        const int position = local_rank_ < outer ? local_rank_ : local_rank_ - 1;
        const int64_t d = exponential_ ? ExpTwoDistance(step_, count) : 1;
        auto to_rank = [&](int p) { return machine_ * local_size_ + (p < outer ? p : p + 1); };
        result.send_ranks.push_back(to_rank(Mod(position + d, count)));
        result.recv_ranks.push_back(to_rank(Mod(position - d, count)));
      }
    }
    ++step_;
    return result;
  }

 private:
  int machines_;
  int local_size_;
  int machine_;
  int local_rank_;
  bool exponential_;
  uint64_t step_ = 0;
};

StatusOr<std::unique_ptr<DynamicSchedule>> MakeInnerOuter(const char* what, int world, int local,
                                                          int rank, bool exponential) {
  WEFT_RETURN_IF_ERROR(CheckSize(what, world));
  if (local < 1 || world % local != 0) {
    return InvalidArgument(what, ": local_size must be a positive divisor of world_size ", world,
                           ", got ", local);
  }
  if (rank < 0 || rank >= world) {
    return InvalidArgument(what, ": rank must be in [0, ", world, "), got ", rank);
  }
  return std::unique_ptr<DynamicSchedule>(new InnerOuter(world, local, rank, exponential));
}

}  // namespace

StatusOr<std::unique_ptr<DynamicSchedule>> OnePeerSchedule(const Topology& topo, int rank) {
  if (topo.size() < 1) {
    return InvalidArgument("OnePeerSchedule: the topology must have at least 1 rank, got 0");
  }
  if (rank < 0 || rank >= topo.size()) {
    return InvalidArgument("OnePeerSchedule: rank must be in [0, ", topo.size(), "), got ", rank);
  }
  return std::unique_ptr<DynamicSchedule>(new OnePeer(topo, rank));
}

StatusOr<std::unique_ptr<DynamicSchedule>> MachineExponentialTwoSchedule(int machine_size,
                                                                         int machine_rank) {
  WEFT_RETURN_IF_ERROR(CheckSize("MachineExponentialTwoSchedule", machine_size));
  if (machine_rank < 0 || machine_rank >= machine_size) {
    return InvalidArgument("MachineExponentialTwoSchedule: machine_rank must be in [0, ",
                           machine_size, "), got ", machine_rank);
  }
  return std::unique_ptr<DynamicSchedule>(new MachineExpTwo(machine_size, machine_rank));
}

StatusOr<std::unique_ptr<DynamicSchedule>> InnerOuterRingSchedule(int world_size, int local_size,
                                                                  int rank) {
  return MakeInnerOuter("InnerOuterRingSchedule", world_size, local_size, rank,
                        /*exponential=*/false);
}

StatusOr<std::unique_ptr<DynamicSchedule>> InnerOuterExponentialTwoSchedule(int world_size,
                                                                            int local_size,
                                                                            int rank) {
  return MakeInnerOuter("InnerOuterExponentialTwoSchedule", world_size, local_size, rank,
                        /*exponential=*/true);
}

}  // namespace weft
