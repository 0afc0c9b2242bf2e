#include "pipe/plan/plan.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "core/codec.h"

namespace weft {
namespace pipe {
namespace {

// A stage whose cost equals M0 in real arithmetic must count as fitting even when the two
// sums were accumulated in different orders (the partitioner and InitialM0 add different
// layers): a relative slack far below any meaningful cost difference.
constexpr double kRelativeSlack = 1e-9;

bool FitsIn(double cost, double m0) { return cost <= m0 + kRelativeSlack * std::abs(m0); }

Status ValidateCluster(const Cluster& cluster) {
  if (cluster.machines < 1 || cluster.devices_per_machine < 1) {
    return InvalidArgument("expected a cluster of at least 1 machine with at least 1 device, "
                           "found machines = ",
                           cluster.machines, ", devices_per_machine = ",
                           cluster.devices_per_machine, ": set both in PlanOptions::cluster");
  }
  if (static_cast<int64_t>(cluster.machines) * cluster.devices_per_machine >
      std::numeric_limits<int>::max()) {
    return InvalidArgument("cluster of ", cluster.machines, " x ", cluster.devices_per_machine,
                           " devices overflows the rank type");
  }
  if (!cluster.ranks.empty()) {
    const int world = cluster.world();
    if (static_cast<int>(cluster.ranks.size()) != world) {
      return InvalidArgument("expected cluster.ranks to hold one rank per device (", world,
                             "), found ", cluster.ranks.size());
    }
    std::vector<char> seen(world, 0);
    for (int r : cluster.ranks) {
      if (r < 0 || r >= world || seen[r]) {
        return InvalidArgument("expected cluster.ranks to be a permutation of 0..", world - 1,
                               ", found rank ", r, r >= 0 && r < world ? " twice" : "");
      }
      seen[r] = 1;
    }
  }
  return OkStatus();
}

// What InitialM0 and MakePlan both require of their inputs.
Status ValidateCommon(const std::vector<double>& sizes, const PlanOptions& options) {
  WEFT_RETURN_IF_ERROR(ValidateCluster(options.cluster));
  const int world = options.cluster.world();
  if (options.k0 < 1 || options.k0 > world) {
    return InvalidArgument("expected the initial pipeline length k0 in [1, ", world,
                           "] (the world of ", options.cluster.machines, " x ",
                           options.cluster.devices_per_machine, " devices), found ", options.k0,
                           ": use at most one stage per device");
  }
  if (sizes.empty()) {
    return InvalidArgument("expected at least one layer size, found none: pass one parameter "
                           "count per layer (group)");
  }
  const int layers = static_cast<int>(sizes.size());
  if (options.k0 > layers) {
    return InvalidArgument("expected at most as many stages as layers, found k0 = ", options.k0,
                           " stages for ", layers,
                           " layers: lower k0 or split layers into finer groups");
  }
  for (int i = 0; i < layers; ++i) {
    if (!std::isfinite(sizes[i]) || sizes[i] < 0) {
      return InvalidArgument("expected finite, non-negative layer sizes, found sizes[", i,
                             "] = ", sizes[i]);
    }
  }
  return OkStatus();
}

StatusOr<double> M0Unchecked(const std::vector<double>& sizes, const PlanOptions& options) {
  // All layers trainable: the cost of a layer is its size.
  WEFT_ASSIGN_OR_RETURN(Partition partition,
                        PartitionLayers(sizes, options.k0, options.strategy));
  return partition.max_cost;
}

// Replicas inside machines first (no cross-machine traffic inside a pipeline), then the
// leftover devices of all machines in device order, K at a time; the rest stay idle.
std::vector<Role> PlaceReplicas(const Cluster& cluster, int k, int* replicas) {
  const int world = cluster.world();
  const int per_machine = cluster.devices_per_machine / k;
  std::vector<Role> roles(world);
  int replica = 0;
  for (int m = 0; m < cluster.machines; ++m) {
    for (int r = 0; r < per_machine; ++r, ++replica) {
      for (int s = 0; s < k; ++s) {
        roles[cluster.RankOfDevice(m * cluster.devices_per_machine + r * k + s)] = Role{replica, s};
      }
    }
  }
  std::vector<int> leftovers;
  for (int m = 0; m < cluster.machines; ++m) {
    for (int d = per_machine * k; d < cluster.devices_per_machine; ++d) {
      leftovers.push_back(cluster.RankOfDevice(m * cluster.devices_per_machine + d));
    }
  }
  const int straddling = static_cast<int>(leftovers.size()) / k;
  for (int g = 0; g < straddling; ++g, ++replica) {
    for (int s = 0; s < k; ++s) roles[leftovers[g * k + s]] = Role{replica, s};
  }
  *replicas = replica;
  return roles;
}

}  // namespace

std::vector<int> Plan::ReplicaRanks(int replica) const {
  std::vector<int> ranks;
  if (replica < 0 || replica >= replicas) return ranks;
  ranks.assign(k, -1);
  for (int rank = 0; rank < static_cast<int>(roles.size()); ++rank) {
    const Role& role = roles[rank];
    if (role.replica == replica && role.stage >= 0 && role.stage < k) ranks[role.stage] = rank;
  }
  return ranks;
}

StatusOr<double> InitialM0(const std::vector<double>& sizes, const PlanOptions& options) {
  WEFT_RETURN_IF_ERROR(ValidateCommon(sizes, options));
  return M0Unchecked(sizes, options);
}

StatusOr<Plan> MakePlan(const std::vector<double>& sizes, int frozen, const PlanOptions& options,
                        const Plan* previous) {
  WEFT_RETURN_IF_ERROR(ValidateCommon(sizes, options));
  const int layers = static_cast<int>(sizes.size());
  const int world = options.cluster.world();
  if (frozen < 0 || frozen > layers) {
    return InvalidArgument("expected the frozen layer count in [0, ", layers, "], found ", frozen);
  }
  if (options.micro_batches < 0) {
    return InvalidArgument("expected micro_batches >= 0 (0 = the default, 4 * K), found ",
                           options.micro_batches);
  }
  WEFT_ASSIGN_OR_RETURN(const double m0, M0Unchecked(sizes, options));

  if (previous != nullptr) {
    if (static_cast<int>(previous->roles.size()) != world) {
      return InvalidArgument("expected a previous plan for a world of ", world,
                             " ranks, found one for ", previous->roles.size(),
                             ": pass the plan made with the same cluster");
    }
    const int previous_layers =
        previous->partition.boundaries.empty() ? -1 : previous->partition.boundaries.back();
    if (previous_layers != layers) {
      return InvalidArgument("expected a previous plan of ", layers, " layers, found one of ",
                             previous_layers, ": pass the plan made for the same model");
    }
    if (previous->k < 1 || previous->k > options.k0 || previous->k > layers) {
      return InvalidArgument("expected the previous plan's K in [1, min(k0 = ", options.k0,
                             ", layers = ", layers, ")], found ", previous->k,
                             ": pass the plan made for the same model and options");
    }
    if (!(std::abs(previous->m0 - m0) <= kRelativeSlack * std::abs(m0))) {
      return InvalidArgument("expected the previous plan's M0 to be ", m0,
                             " (the largest stage of the initial partition of these sizes on "
                             "k0 = ",
                             options.k0, " stages), found ", previous->m0,
                             ": pass the plan made for the same model, k0 and strategy");
    }
    if (frozen < previous->frozen) {
      return InvalidArgument("expected the frozen count never to decrease (layers never "
                             "unfreeze), found ",
                             frozen, " after ", previous->frozen);
    }
  }

  WEFT_ASSIGN_OR_RETURN(std::vector<double> costs,
                        ParameterCosts(sizes, frozen, options.lambda));

  Plan plan;
  plan.frozen = frozen;
  plan.m0 = m0;
  int k = options.k0;
  if (previous != nullptr) {
    k = previous->k;
    // Halve while the shorter pipeline still holds no more per device than the initial one
    // did; K only shrinks, so a transition never needs more devices per replica.
    while (k >= 2 && k / 2 >= 1 && k / 2 <= layers) {
      WEFT_ASSIGN_OR_RETURN(Partition half, PartitionLayers(costs, k / 2, options.strategy));
      if (!FitsIn(half.max_cost, m0)) break;
      k /= 2;
    }
  }
  plan.k = k;
  WEFT_ASSIGN_OR_RETURN(plan.partition, PartitionLayers(costs, k, options.strategy));
  plan.micro_batches = options.micro_batches > 0 ? options.micro_batches : 4 * k;
  plan.roles = PlaceReplicas(options.cluster, k, &plan.replicas);

  if (previous != nullptr) {
    for (int rank = 0; rank < world; ++rank) {
      const Role& now = plan.roles[rank];
      if (!now.active()) continue;
      if (!previous->roles[rank].active() || now.replica >= previous->replicas) {
        plan.newly_active.push_back(rank);
      }
    }
  }
  return plan;
}

// ---- the control message ----------------------------------------------------------------

namespace {

constexpr char kMagic[4] = {'W', 'F', 'T', 'X'};
// magic + version + freeze_point + frozen + k + m0 + two counts + crc.
constexpr size_t kFixedSize = 4 + 4 + 8 + 4 + 4 + 8 + 4 + 4 + 4;

}  // namespace

std::string EncodeTransition(const TransitionMessage& message) {
  std::string out;
  out.reserve(kFixedSize + 4 * message.newly_active.size() + 8 * message.grad_norms.size());
  codec::Writer w(&out);
  w.Bytes(kMagic, sizeof(kMagic));
  w.Put(TransitionMessage::kVersion);
  w.Put(message.freeze_point);
  w.Put(message.frozen);
  w.Put(message.k);
  w.Put(message.m0);
  w.Put(static_cast<int32_t>(message.newly_active.size()));
  for (int32_t rank : message.newly_active) w.Put(rank);
  w.Put(static_cast<int32_t>(message.grad_norms.size()));
  for (double norm : message.grad_norms) w.Put(norm);
  w.Put(codec::Crc32(out.data(), out.size()));
  return out;
}

StatusOr<TransitionMessage> DecodeTransition(const std::string& bytes) {
  if (bytes.size() < sizeof(kMagic) ||
      std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return InvalidArgument("not a transition message: expected it to start with the magic "
                           "\"WFTX\", found ",
                           bytes.size() < sizeof(kMagic) ? "a message of only "
                                                         : "other bytes in a message of ",
                           bytes.size(), " bytes: pass EncodeTransition() output unchanged");
  }
  codec::Reader in(bytes, "transition message");
  uint32_t magic;
  WEFT_RETURN_IF_ERROR(in.Get("the magic", &magic));
  uint32_t version;
  WEFT_RETURN_IF_ERROR(in.Get("the version", &version));
  // Checked before the layout: a newer version may lay out (and checksum) differently.
  if (version != TransitionMessage::kVersion) {
    return InvalidArgument("unsupported transition message version ", version,
                           ": this build reads version ", TransitionMessage::kVersion,
                           "; run the same weft version on every rank");
  }
  TransitionMessage m;
  WEFT_RETURN_IF_ERROR(in.Get("freeze_point", &m.freeze_point));
  WEFT_RETURN_IF_ERROR(in.Get("frozen", &m.frozen));
  WEFT_RETURN_IF_ERROR(in.Get("k", &m.k));
  WEFT_RETURN_IF_ERROR(in.Get("m0", &m.m0));
  int32_t count;
  // The reserve keeps room for what must follow: the other count (4) and the CRC (4).
  WEFT_RETURN_IF_ERROR(in.Count("the newly_active count", 4, 8, &count));
  m.newly_active.resize(count);
  for (int32_t& rank : m.newly_active) WEFT_RETURN_IF_ERROR(in.Get("a newly active rank", &rank));
  WEFT_RETURN_IF_ERROR(in.Count("the grad_norms count", 8, 4, &count));
  m.grad_norms.resize(count);
  for (double& norm : m.grad_norms) WEFT_RETURN_IF_ERROR(in.Get("a gradient norm", &norm));
  const size_t body = in.pos();
  uint32_t crc;
  WEFT_RETURN_IF_ERROR(in.Get("the checksum", &crc));
  if (in.remaining() != 0) {
    return InvalidArgument("corrupt transition message: expected ", in.pos(),
                           " bytes as its counts say, found ", bytes.size(), " (",
                           in.remaining(), " trailing byte(s)): pass exactly one message");
  }
  const uint32_t expected_crc = codec::Crc32(bytes.data(), body);
  if (crc != expected_crc) {
    return InvalidArgument("corrupt transition message: CRC-32 of its ", body,
                           " bytes is 0x", absl::Hex(expected_crc), ", the message says 0x",
                           absl::Hex(crc), ": it was damaged in transit");
  }

  // The checksum passed: anything out of range now was sent that way.
  if (m.freeze_point < 0) {
    return InvalidArgument("invalid transition message: expected freeze_point >= 0, found ",
                           m.freeze_point);
  }
  if (m.frozen < 0) {
    return InvalidArgument("invalid transition message: expected frozen >= 0, found ",
                           m.frozen);
  }
  if (m.k < 1) {
    return InvalidArgument("invalid transition message: expected k >= 1, found ", m.k);
  }
  if (!std::isfinite(m.m0) || m.m0 < 0) {
    return InvalidArgument("invalid transition message: expected a finite m0 >= 0, found ",
                           m.m0);
  }
  for (size_t i = 0; i < m.newly_active.size(); ++i) {
    if (m.newly_active[i] < 0) {
      return InvalidArgument("invalid transition message: expected ranks >= 0, found "
                             "newly_active[",
                             i, "] = ", m.newly_active[i]);
    }
  }
  for (size_t i = 0; i < m.grad_norms.size(); ++i) {
    if (!std::isfinite(m.grad_norms[i]) || m.grad_norms[i] < 0) {
      return InvalidArgument("invalid transition message: expected finite gradient norms >= "
                             "0, found grad_norms[",
                             i, "] = ", m.grad_norms[i]);
    }
  }
  return m;
}

// ---- micro-batch schedules ----------------------------------------------------------------

const char* ScheduleName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::kOneFOneB:
      return "1f1b";
  }
  return "unknown";
}

namespace {

// What stage s executes, in order: the schedule's policy, without timing.
std::vector<Work> StagePolicy(ScheduleKind kind, int stages, int micro_batches, int s) {
  std::vector<Work> order;
  order.reserve(2 * micro_batches);
  if (kind == ScheduleKind::kGPipe) {
    for (int m = 0; m < micro_batches; ++m) order.push_back(Work{s, m, true});
    for (int m = micro_batches - 1; m >= 0; --m) order.push_back(Work{s, m, false});
    return order;
  }
  // 1F1B: as many forwards in flight as stages after this one (fewer when M is smaller),
  // which bounds the stashed activations by K - s instead of M.
  const int warmup = std::min(stages - 1 - s, micro_batches);
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) order.push_back(Work{s, next_forward, true});
  while (next_forward < micro_batches) {
    order.push_back(Work{s, next_forward++, true});
    order.push_back(Work{s, next_backward++, false});
  }
  while (next_backward < micro_batches) order.push_back(Work{s, next_backward++, false});
  return order;
}

}  // namespace

StatusOr<Schedule> MakeSchedule(ScheduleKind kind, int stages, int micro_batches) {
  if (kind != ScheduleKind::kGPipe && kind != ScheduleKind::kOneFOneB) {
    return InvalidArgument("unknown schedule kind ", static_cast<int>(kind),
                           ": expected kGPipe or kOneFOneB");
  }
  if (stages < 1 || micro_batches < 1) {
    return InvalidArgument("expected at least 1 stage and 1 micro-batch for a ",
                           ScheduleName(kind), " schedule, found K = ", stages, ", M = ",
                           micro_batches);
  }
  Schedule schedule;
  schedule.kind = kind;
  schedule.stages = stages;
  schedule.micro_batches = micro_batches;

  std::vector<std::vector<Work>> orders(stages);
  for (int s = 0; s < stages; ++s) orders[s] = StagePolicy(kind, stages, micro_batches, s);
  // The cycle at which each item ran, -1 until it has: an item runs at the first cycle after
  // its dependencies and its stage's previous item ran (as soon as possible, unit times).
  const size_t cells = static_cast<size_t>(stages) * micro_batches;
  std::vector<int> forward_at(cells, -1), backward_at(cells, -1);
  auto at = [micro_batches](std::vector<int>& v, int s, int m) -> int& {
    return v[static_cast<size_t>(s) * micro_batches + m];
  };
  std::vector<size_t> next(stages, 0);
  size_t remaining = 2 * cells;
  for (int cycle = 0; remaining > 0; ++cycle) {
    std::vector<Work> now;
    for (int s = 0; s < stages; ++s) {
      if (next[s] == orders[s].size()) continue;
      const Work& w = orders[s][next[s]];
      auto done = [cycle](int c) { return c >= 0 && c < cycle; };
      bool ready;
      if (w.forward) {
        ready = s == 0 || done(at(forward_at, s - 1, w.micro_batch));
      } else {
        ready = done(at(forward_at, s, w.micro_batch)) &&
                (s == stages - 1 || done(at(backward_at, s + 1, w.micro_batch)));
      }
      if (ready) now.push_back(w);
    }
    if (now.empty()) {
      // Unreachable for these two policies (each is deadlock-free); a bug otherwise.
      return Internal("schedule ", ScheduleName(kind), " with K = ", stages, ", M = ",
                      micro_batches, " made no progress at cycle ", cycle);
    }
    for (const Work& w : now) {
      at(w.forward ? forward_at : backward_at, w.stage, w.micro_batch) = cycle;
      ++next[w.stage];
      --remaining;
    }
    schedule.cycles.push_back(std::move(now));
  }
  return schedule;
}

double Schedule::BubbleFraction() const {
  const double slots = static_cast<double>(stages) * cycles.size();
  if (slots == 0) return 0;
  size_t busy = 0;
  for (const auto& cycle : cycles) busy += cycle.size();
  return (slots - busy) / slots;
}

std::vector<Work> Schedule::StageOrder(int stage) const {
  std::vector<Work> order;
  for (const auto& cycle : cycles) {
    for (const Work& w : cycle) {
      if (w.stage == stage) order.push_back(w);
    }
  }
  return order;
}

}  // namespace pipe
}  // namespace weft
