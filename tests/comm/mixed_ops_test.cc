// Rounds of randomly mixed ops, every result checked against values computed here. Each
// round draws the same list of ops on every rank (a seed shared by all), then every rank
// submits them in its own order (named ops may come in any order; unnamed ones keep their
// relative order, which is how they are matched), some in a group, some blocking, and waits
// for them in its own order. Ops in flight together are negotiated, fused and run as the
// engine decides: the test checks that whatever it decides, every output is exact (or
// within the dtype's rounding for averages) and that no op fails.
//
// MIXED_OPS_SEED picks another seed (the default is fixed, so that a failure repeats);
// MIXED_OPS_ROUNDS the number of rounds. (Not WEFT_ names: weft warns about those it does
// not know.)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/topology.h"
#include "gtest/gtest.h"
#include "tests/comm/test_util.h"

namespace weft {
namespace {

using testing::Arena;
using testing::Buffer;

const auto* const kEnv = weft::testing::InitWeftForAllTests();

enum class Kind {
  kAllreduce,
  kBroadcast,
  kAllgather,
  kNeighborAllgather,
  kNeighborAllreduce,
  kDynamicNeighborAllreduce,  // to the rank `shift` ahead, from the one `shift` behind
  kPairGossip,                // with rank ^ 1, or the rank n / 2 away
  kHierarchical,              // hierarchical_neighbor_allreduce on the default machine graph
  kSendRecv,                  // from `root` to the rank `shift` ahead of it
  kSetAllreduce,
  kBarrier
};

struct Op {
  Kind kind = Kind::kAllreduce;
  std::string name;  // "" = unnamed
  DType dtype = DType::kFloat32;
  int64_t numel = 1;          // per rank (allgather: columns of a row)
  bool average = false;       // allreduce
  int root = 0;               // broadcast
  std::vector<int64_t> rows;  // allgather: dim 0 of each rank's tensor
  bool weighted = false;      // neighbor_allreduce: explicit weights; the others: which
  int shift = 1;              // kDynamicNeighborAllreduce
  std::vector<int> members;   // kSetAllreduce: the process set
  bool blocking = false;      // only unnamed ops, whose order every rank shares
};

uint64_t Seed() { return static_cast<uint64_t>(testing::EnvInt("MIXED_OPS_SEED", 20261203)); }

int Rounds() { return static_cast<int>(testing::EnvInt("MIXED_OPS_ROUNDS", 40)); }

// Rank r's element i of op j: small integers, whose sums over up to 8 ranks are exact in
// every dtype used, int8 included.
double Value(int r, int64_t i, int j) { return r + 1 + (i * 7 + j) % 11; }

const DType kDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                         DType::kInt32,   DType::kInt64,   DType::kInt8};

bool IsFloat(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kFloat16 ||
         d == DType::kBFloat16;
}

// The ops of one round, the same on every rank.
std::vector<Op> Draw(std::mt19937_64& rng, int round, int n) {
  auto pick = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::vector<Op> ops(static_cast<size_t>(pick(1, 24)));
  for (size_t j = 0; j < ops.size(); ++j) {
    Op& op = ops[j];
    const int64_t k = pick(0, 99);
    op.kind = k < 27   ? Kind::kAllreduce
              : k < 38 ? Kind::kBroadcast
              : k < 47 ? Kind::kAllgather
              : k < 55 ? Kind::kNeighborAllgather
              : k < 66 ? Kind::kNeighborAllreduce
              : k < 74 ? Kind::kDynamicNeighborAllreduce
              : k < 81 ? Kind::kPairGossip
              : k < 85 ? Kind::kHierarchical
              : k < 92 ? Kind::kSetAllreduce
              : k < 98 ? Kind::kSendRecv
                       : Kind::kBarrier;
    if (n < 3 && op.kind == Kind::kSetAllreduce) op.kind = Kind::kAllreduce;
    if (n % 2 == 1 && op.kind == Kind::kPairGossip) op.kind = Kind::kAllreduce;  // no pairs
    // Machines of unequal size (WEFT_RANKS_PER_MACHINE not dividing n): not simulated here.
    if (is_homogeneous() != 1 && op.kind == Kind::kHierarchical) op.kind = Kind::kAllreduce;
    if (pick(0, 1) == 1 && op.kind != Kind::kBarrier) {
      op.name = "r" + std::to_string(round) + ".op" + std::to_string(j);
    }
    op.dtype = kDTypes[pick(0, 6)];
    const bool weights = op.kind == Kind::kNeighborAllreduce ||
                         op.kind == Kind::kDynamicNeighborAllreduce || op.kind == Kind::kPairGossip;
    if (weights) op.dtype = kDTypes[pick(0, 3)];
    // Mostly small, now and then large (a group then splits where the fusion threshold is
    // set low: the BUILD file's second test).
    op.numel = pick(0, 9) == 0 ? pick(20000, 300000) : pick(1, 3000);
    op.average = IsFloat(op.dtype) && pick(0, 1) == 1;
    op.root = static_cast<int>(pick(0, n - 1));
    for (int r = 0; r < n; ++r) op.rows.push_back(pick(0, 3));
    const bool gather = op.kind == Kind::kAllgather || op.kind == Kind::kNeighborAllgather;
    op.numel = gather ? pick(1, 5) : op.numel;
    op.weighted = pick(0, 1) == 1;
    op.shift = static_cast<int>(pick(1, std::max(1, n - 1)));
    if (op.kind == Kind::kSetAllreduce) {
      std::vector<int> all(n);
      for (int r = 0; r < n; ++r) all[r] = r;
      std::shuffle(all.begin(), all.end(), rng);
      all.resize(static_cast<size_t>(pick(2, n - 1)));
      op.members = all;  // any order: the set is what counts
    }
    op.blocking = op.name.empty() && pick(0, 4) == 0;
  }
  return ops;
}

// One op's buffers on this rank and how to check them.
struct Live {
  int index = 0;
  std::unique_ptr<Buffer> in, out;
  Arena arena;
  Handle handle;
  TensorView gathered;  // allgather's output, once known
  bool done = false;    // blocking: ran already
};

// kPairGossip's peer of rank r (n is even).
int Peer(const Op& op, int r) { return op.weighted ? r ^ 1 : (r + size() / 2) % size(); }

bool Gathers(const Op& op) {
  return op.kind == Kind::kAllgather || op.kind == Kind::kNeighborAllgather;
}

bool Member(const Op& op, int r) {
  if (op.kind == Kind::kSendRecv) return r == op.root || r == (op.root + op.shift) % size();
  return op.kind != Kind::kSetAllreduce ||
         std::find(op.members.begin(), op.members.end(), r) != op.members.end();
}

// in-neighbor -> weight, and the self weight, of this rank's neighbor_allreduce.
std::pair<double, std::map<int, double>> NeighborWeights(const Op& op, int me) {
  const std::vector<int> in = in_neighbor_ranks();
  std::map<int, double> src;
  double self = 0;
  if (op.weighted) {
    self = 0.5;
    for (size_t i = 0; i < in.size(); ++i) src[in[i]] = 0.25 + 0.125 * ((me + in[i]) % 3);
  } else {
    const double w = 1.0 / static_cast<double>(in.size() + 1);
    self = w;
    for (int j : in) src[j] = w;
  }
  return {self, src};
}

Status Submit(const Op& op, Live& live, int me, bool in_place) {
  std::vector<int64_t> shape = {op.numel};
  if (Gathers(op)) shape = {op.rows[me], op.numel};
  live.in = std::make_unique<Buffer>(op.dtype, shape);
  for (int64_t i = 0; i < live.in->numel(); ++i) live.in->Set(i, Value(me, i, live.index));
  if (!in_place) live.out = std::make_unique<Buffer>(op.dtype, shape);
  const TensorView in = live.in->view();
  const TensorView out = in_place ? in : live.out->view();
  auto keep = [&live](StatusOr<Handle> h) -> Status {
    if (!h.ok()) return h.status();
    live.handle = *h;
    return OkStatus();
  };
  switch (op.kind) {
    case Kind::kAllreduce:
      if (op.blocking) return allreduce(in, out, op.average, op.name);
      return keep(allreduce_nonblocking(in, out, op.average, op.name));
    case Kind::kSetAllreduce:
      if (op.blocking) return allreduce(in, out, op.average, op.name, op.members);
      return keep(allreduce_nonblocking(in, out, op.average, op.name, op.members));
    case Kind::kBroadcast:
      if (op.blocking) return broadcast(in, out, op.root, op.name);
      return keep(broadcast_nonblocking(in, out, op.root, op.name));
    case Kind::kAllgather: {
      if (op.blocking) {
        auto r = allgather(in, live.arena.allocator(), op.name);
        if (r.ok()) live.gathered = *r;
        return r.status();
      }
      return keep(allgather_nonblocking(in, live.arena.allocator(), op.name));
    }
    case Kind::kNeighborAllgather: {
      if (op.blocking) {
        auto r = neighbor_allgather(in, live.arena.allocator(), {}, op.name);
        if (r.ok()) live.gathered = *r;
        return r.status();
      }
      return keep(neighbor_allgather_nonblocking(in, live.arena.allocator(), {}, op.name));
    }
    case Kind::kNeighborAllreduce: {
      NeighborAllreduceOptions options;
      if (op.weighted) {
        auto [self, src] = NeighborWeights(op, me);
        options.self_weight = self;
        options.src_weights = src;
      }
      if (op.blocking) return neighbor_allreduce(in, out, options, op.name);
      return keep(neighbor_allreduce_nonblocking(in, out, options, op.name));
    }
    case Kind::kDynamicNeighborAllreduce: {
      const int n = size();
      NeighborAllreduceOptions options;
      options.self_weight = 0.5;
      options.src_weights = std::map<int, double>{{(me - op.shift + n) % n, 0.5}};
      options.dst_weights = std::map<int, double>{{(me + op.shift) % n, op.weighted ? 0.5 : 1.0}};
      if (op.blocking) return neighbor_allreduce(in, out, options, op.name);
      return keep(neighbor_allreduce_nonblocking(in, out, options, op.name));
    }
    case Kind::kPairGossip: {
      const double self = op.weighted ? 0.25 : 0.5;
      if (op.blocking) return pair_gossip(in, out, Peer(op, me), self, 1 - self, op.name);
      return keep(pair_gossip_nonblocking(in, out, Peer(op, me), self, 1 - self, op.name));
    }
    case Kind::kHierarchical:
      if (op.blocking) return hierarchical_neighbor_allreduce(in, out, {}, op.name);
      return keep(hierarchical_neighbor_allreduce_nonblocking(in, out, {}, op.name));
    case Kind::kSendRecv: {
      if (me == op.root) {
        const int dst = (op.root + op.shift) % size();
        if (op.blocking) return send(in, dst, op.name);
        return keep(send_nonblocking(in, dst, op.name));
      }
      if (op.blocking) return recv(out, op.root, op.name);
      return keep(recv_nonblocking(out, op.root, op.name));
    }
    case Kind::kBarrier:
      if (op.blocking) return barrier();
      return keep(barrier_nonblocking());
  }
  return OkStatus();
}

// The first wrong element of the op's output on this rank, described; "" when all are right.
std::string Check(const Op& op, const Live& live, int me, bool in_place) {
  const TensorView& gathered = live.gathered;
  const int n = size();
  // What the expected values depend on besides the element, read once per op.
  std::pair<double, std::map<int, double>> weights;
  if (op.kind == Kind::kNeighborAllreduce) weights = NeighborWeights(op, me);
  std::vector<int> in_machines;
  if (op.kind == Kind::kHierarchical) {
    in_machines = load_machine_topology().in_neighbors(machine_rank());
  }
  auto expect_at = [&](int64_t i) -> double {
    switch (op.kind) {
      case Kind::kAllreduce:
      case Kind::kSetAllreduce: {
        double sum = 0;
        int count = 0;
        for (int r = 0; r < n; ++r) {
          if (!Member(op, r)) continue;
          sum += Value(r, i, live.index);
          ++count;
        }
        return op.average ? sum / count : sum;
      }
      case Kind::kBroadcast:
      case Kind::kSendRecv:
        return Value(op.root, i, live.index);
      case Kind::kNeighborAllreduce: {
        const auto& [self, src] = weights;
        double v = self * Value(me, i, live.index);
        for (const auto& [j, w] : src) v += w * Value(j, i, live.index);
        return v;
      }
      case Kind::kDynamicNeighborAllreduce:
        // Half its own, half what the rank `shift` behind sent (scaled by its dst weight).
        return 0.5 * Value(me, i, live.index) +
               0.5 * (op.weighted ? 0.5 : 1.0) * Value((me - op.shift + n) % n, i, live.index);
      case Kind::kPairGossip: {
        const double self = op.weighted ? 0.25 : 0.5;
        return self * Value(me, i, live.index) + (1 - self) * Value(Peer(op, me), i, live.index);
      }
      case Kind::kHierarchical: {
        // The average of this machine's ranks and of its in-neighbor machines' averages
        // (machine m holds ranks m * local_size() on).
        const int per = local_size();
        const auto machine_average = [&](int m) {
          double sum = 0;
          for (int r = m * per; r < (m + 1) * per; ++r) sum += Value(r, i, live.index);
          return sum / per;
        };
        double v = machine_average(machine_rank());
        for (int j : in_machines) v += machine_average(j);
        return v / static_cast<double>(in_machines.size() + 1);
      }
      default:
        return 0;
    }
  };
  if (op.kind == Kind::kBarrier) return "";
  if (op.kind == Kind::kSendRecv && me == op.root) return "";  // the receiver checks
  if (Gathers(op)) {
    // Every rank's rows in rank order (allgather), or the in-neighbors' (self excluded).
    std::vector<int> from;
    if (op.kind == Kind::kAllgather) {
      for (int r = 0; r < n; ++r) from.push_back(r);
    } else {
      from = in_neighbor_ranks();
      std::sort(from.begin(), from.end());
    }
    int64_t total_rows = 0;
    for (int r : from) total_rows += op.rows[r];
    const std::vector<int64_t> want = {total_rows, op.numel};
    if (gathered.shape() != want) {
      return "output shape " + ShapeToString(gathered.shape()) + ", expected " +
             ShapeToString(want);
    }
    int64_t at = 0;
    for (int r : from) {
      for (int64_t i = 0; i < op.rows[r] * op.numel; ++i, ++at) {
        const double got = Buffer::Read(gathered.data(), op.dtype, at);
        if (got != Value(r, i, live.index)) {
          return "element " + std::to_string(at) + " (rank " + std::to_string(r) + "'s " +
                 std::to_string(i) + ") is " + std::to_string(got) + ", expected " +
                 std::to_string(Value(r, i, live.index));
        }
      }
    }
    return "";
  }
  const Buffer& result = in_place ? *live.in : *live.out;
  for (int64_t i = 0; i < result.numel(); ++i) {
    const double want = expect_at(i);
    const double got = result.Get(i);
    if (std::abs(got - want) > testing::Tolerance(op.dtype, want)) {
      return "element " + std::to_string(i) + " is " + std::to_string(got) + ", expected " +
             std::to_string(want);
    }
  }
  return "";
}

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kAllreduce:
      return "allreduce";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kAllgather:
      return "allgather";
    case Kind::kNeighborAllgather:
      return "neighbor_allgather";
    case Kind::kNeighborAllreduce:
      return "neighbor_allreduce";
    case Kind::kDynamicNeighborAllreduce:
      return "dynamic neighbor_allreduce";
    case Kind::kPairGossip:
      return "pair_gossip";
    case Kind::kHierarchical:
      return "hierarchical_neighbor_allreduce";
    case Kind::kSendRecv:
      return "send/recv";
    case Kind::kSetAllreduce:
      return "process-set allreduce";
    case Kind::kBarrier:
      return "barrier";
  }
  return "?";
}

TEST(MixedOps, EveryResultIsRightWhateverTheOrderAndFusion) {
  const int n = size();
  const int me = rank();
  const uint64_t seed = Seed();
  std::mt19937_64 shared(seed);
  std::mt19937_64 mine(seed * 1000003 + static_cast<uint64_t>(me) + 1);
  int checked = 0;
  for (int round = 0; round < Rounds(); ++round) {
    // Now and then another topology (unweighted) for the neighbor ops, between rounds: it
    // cannot change while ops are in flight.
    const int topology = static_cast<int>(std::uniform_int_distribution<int>(0, 7)(shared));
    if (topology < 4) {
      const StatusOr<Topology> graph = topology == 0   ? ExponentialGraph(n)
                                       : topology == 1 ? RingGraph(n)
                                       : topology == 2 ? StarGraph(n, round % n)
                                                       : MeshGrid2DGraph(n);
      ASSERT_TRUE(graph.ok()) << graph.status();
      ASSERT_TRUE(set_topology(*graph).ok());
    }
    const std::vector<Op> ops = Draw(shared, round, n);
    // This rank's submission order: named ops shuffled among the places named ops hold.
    std::vector<int> order(ops.size());
    std::vector<int> named, places;
    for (size_t j = 0; j < ops.size(); ++j) {
      order[j] = static_cast<int>(j);
      if (!ops[j].name.empty()) {
        named.push_back(static_cast<int>(j));
        places.push_back(static_cast<int>(j));
      }
    }
    std::shuffle(named.begin(), named.end(), mine);
    for (size_t i = 0; i < places.size(); ++i) order[places[i]] = named[i];

    const bool grouped = std::uniform_int_distribution<int>(0, 1)(mine) == 1;
    std::vector<Live> live(ops.size());
    std::vector<bool> in_place(ops.size());
    if (grouped) group_start();
    for (int j : order) {
      const Op& op = ops[j];
      if (!Member(op, me)) continue;
      live[j].index = j;
      // Whether the output is the input is each rank's own choice (not matched).
      in_place[j] = !Gathers(op) && std::uniform_int_distribution<int>(0, 1)(mine) == 1;
      // A blocking call inside a group hands the group's earlier ops to the engine with its
      // own and waits for its own; that is allowed, and so tested.
      const Status st = Submit(op, live[j], me, in_place[j]);
      ASSERT_TRUE(st.ok()) << "seed " << seed << " round " << round << " op " << j << " ("
                           << KindName(op.kind) << "): " << st;
      live[j].done = op.blocking;
    }
    if (grouped) {
      ASSERT_TRUE(group_end().ok());
    }
    std::vector<int> waits;
    for (size_t j = 0; j < ops.size(); ++j) {
      if (Member(ops[j], me) && !live[j].done) waits.push_back(static_cast<int>(j));
    }
    std::shuffle(waits.begin(), waits.end(), mine);
    for (int j : waits) {
      const Status st = wait(live[j].handle);
      ASSERT_TRUE(st.ok()) << "seed " << seed << " round " << round << " op " << j << " ("
                           << KindName(ops[j].kind) << "): " << st;
    }
    for (size_t j = 0; j < ops.size(); ++j) {
      const Op& op = ops[j];
      if (!Member(op, me)) continue;
      if (Gathers(op) && !op.blocking) live[j].gathered = live[j].handle.output();
      const std::string wrong = Check(op, live[j], me, in_place[j]);
      EXPECT_EQ(wrong, "") << "seed " << seed << " round " << round << " op " << j << " ("
                           << KindName(op.kind) << (op.name.empty() ? ", unnamed" : ", named")
                           << ", " << DTypeName(op.dtype) << ", " << op.numel << " elements)";
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
  ASSERT_TRUE(set_topology(*ExponentialGraph(n)).ok());
}

}  // namespace
}  // namespace weft
