// AutoPipe and AutoDP plans (pipe/README.md, "pipe/plan"): from the
// cluster, the initial pipeline length K0, the layer sizes and the frozen count, which
// pipeline length K, partition, replica count and rank roles to use. Plus the control
// message that carries a transition, and the micro-batch schedules as data. Pure: no
// LibTorch, no MPI.
#ifndef WEFT_PIPE_PLAN_PLAN_H_
#define WEFT_PIPE_PLAN_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "pipe/balance/balance.h"

namespace weft {
namespace pipe {

struct Cluster {
  int machines = 1;
  int devices_per_machine = 8;
  // The rank on each device, devices numbered machine by machine (device d is the
  // (d % devices_per_machine)-th device of machine d / devices_per_machine); a permutation
  // of 0..world()-1. Empty: rank d is on device d, i.e. ranks fill the machines in order.
  // Roles are indexed by rank either way.
  std::vector<int> ranks;
  int world() const { return machines * devices_per_machine; }
  int RankOfDevice(int device) const { return ranks.empty() ? device : ranks[device]; }
};

struct PlanOptions {
  Cluster cluster;
  int k0 = 8;                 // the initial pipeline length (all layers trainable)
  double lambda = 1.0 / 6.0;  // cost of a frozen layer relative to its parameter count
  Strategy strategy = Strategy::kOptimal;
  // Micro-batches per mini-batch: 0 = the default, 4 * K (the reference found 2-4 x K
  // best; the GPipe bubble is then (K - 1) / (5K - 1), under 20%).
  int micro_batches = 0;
};

// A rank's role: stage `stage` of pipeline replica `replica`, or idle (both -1).
struct Role {
  int replica = -1;
  int stage = -1;
  bool active() const { return replica >= 0; }
};

struct Plan {
  int frozen = 0;        // leading layers frozen
  int k = 0;             // pipeline length
  double m0 = 0;         // the largest stage of the initial partition (what a device holds)
  Partition partition;   // of every layer (frozen ones at lambda) into k stages
  int micro_batches = 0;
  int replicas = 0;
  std::vector<Role> roles;          // per rank (size world)
  std::vector<int> newly_active;    // ranks, sorted: see MakePlan
  // Ranks of replica r, by stage.
  std::vector<int> ReplicaRanks(int replica) const;
};

// M0: the largest stage of the optimal (or options.strategy) partition of all layers,
// trainable, on k0 stages.
StatusOr<double> InitialM0(const std::vector<double>& sizes, const PlanOptions& options);

// The plan for `frozen` leading layers. previous == nullptr: the initial plan (K = k0,
// frozen may be > 0). Otherwise K starts from previous->k and halves while K >= 2 and the
// largest stage of the balanced partition on K / 2 stages is <= M0 (K never grows);
// frozen must be >= previous->frozen. Replicas = how many pipelines of K ranks fit, placed
// so that a replica does not straddle machines when avoidable: first floor(D / K) replicas
// inside each machine of D devices (ranks m*D + r*K ...), then the leftover devices in rank
// order grouped by K (these straddle), the rest idle. Rank roles are numbered replica by
// replica in that order. newly_active: ranks active in a replica index that did not exist
// in the previous plan, or idle before (they receive their layers from an existing
// replica); empty for the initial plan. InvalidArgument for K0 < 1, K0 > world, more stages
// than layers, frozen outside [0, L], negative sizes, a previous plan of another world.
// Also InvalidArgument for: no layers, a non-finite size, a cluster with < 1 machine or
// device, micro_batches < 0, frozen below previous->frozen, a previous plan whose K is
// outside [1, min(k0, L)] or whose M0 differs from this model's (made for other sizes, k0
// or strategy). "<= M0" allows a relative 1e-9 so that a stage equal to M0 in real
// arithmetic fits whatever order its costs were summed in. Odd K halves downwards (6 -> 3
// -> 1).
StatusOr<Plan> MakePlan(const std::vector<double>& sizes, int frozen, const PlanOptions& options,
                        const Plan* previous = nullptr);

// ---- the control message of a transition -------------------------------------------------

// What the leader broadcasts at a freeze point. Typed and versioned (never a float array):
// Encode() writes a little-endian byte string (core/codec.h) with a magic number, the
// version, the fields and a CRC-32 (codec::Crc32); Decode() rejects anything else with a
// clear InvalidArgument (wrong magic, unknown version, truncated or trailing bytes, bad
// checksum, values out of range).
struct TransitionMessage {
  static constexpr uint32_t kVersion = 1;
  int64_t freeze_point = 0;  // T: the epoch or iteration index of the freeze point
  int32_t frozen = 0;
  int32_t k = 0;
  double m0 = 0;
  std::vector<int32_t> newly_active;
  // Per-layer gradient norms (the gradient-aware policy); empty otherwise.
  std::vector<double> grad_norms;
};
std::string EncodeTransition(const TransitionMessage& message);
StatusOr<TransitionMessage> DecodeTransition(const std::string& bytes);

// ---- micro-batch schedules ------------------------------------------------------------------

enum class ScheduleKind { kGPipe, kOneFOneB };
const char* ScheduleName(ScheduleKind kind);  // "gpipe", "1f1b"

struct Work {
  int stage = 0;
  int micro_batch = 0;
  bool forward = true;  // false: backward
};

// Unit-time slots (a forward and a backward each take one clock cycle of a stage; the
// schedule is the order and timing, not a cost model): cycles[c] lists what runs at
// clock cycle c, at most one item per stage. GPipe: all forwards (fill), then all
// backwards (drain) in reverse micro-batch order. 1F1B: each stage runs K - 1 - s warm-up
// forwards, then alternates one forward and one backward, then drains. Both respect the
// dependencies (forward of micro-batch m on stage s after stage s - 1; backward on stage s
// after stage s + 1 and after its own forward). InvalidArgument for K < 1 or M < 1.
struct Schedule {
  ScheduleKind kind;
  int stages = 0;
  int micro_batches = 0;
  std::vector<std::vector<Work>> cycles;
  // Idle stage-slots over all stage-slots of the schedule: for both kinds with unit times,
  // (K - 1) / (M + K - 1).
  double BubbleFraction() const;
  // Per stage, the order of its work (what a stage executes).
  std::vector<Work> StageOrder(int stage) const;
};
StatusOr<Schedule> MakeSchedule(ScheduleKind kind, int stages, int micro_batches);

}  // namespace pipe
}  // namespace weft

#endif  // WEFT_PIPE_PLAN_PLAN_H_
