// Who does what under a plan, as the elastic trainer uses it: which replicas train, each
// rank's role and the layers it holds, the ranks of a stage across replicas, the
// micro-batch count and how a batch splits over the replicas. Pure (no LibTorch, no MPI),
// so it has its own target and tests.
#ifndef WEFT_PIPE_RUNTIME_PLACEMENT_H_
#define WEFT_PIPE_RUNTIME_PLACEMENT_H_

#include <cstdint>
#include <vector>

#include "pipe/plan/plan.h"

namespace weft {
namespace pipe {

// The trainer's choices that decide how a plan is used.
struct Placement {
  bool autodp = true;        // every replica of a plan trains; off: at most initial_replicas
  int initial_replicas = 1;  // the first plan's replica count
  bool cache = false;        // AutoCache: stage 0 also holds the frozen prefix
  int micro_batches = 0;     // per replica mini-batch; 0: 2 K
};

// The replicas that train under `p`.
int ActiveReplicas(const Plan& p, const Placement& o);
// Rank r's role under `p`; idle (Role{}) when its replica does not train.
Role ActiveRole(const Plan& p, const Placement& o, int r);
// The layers rank r needs under `p`: its stage's, and with the cache on stage 0 the frozen
// prefix too (stage 0 computes it for the cache, wherever the partition put it).
std::vector<int> NeededLayers(const Plan& p, const Placement& o, int r);
// The ranks running `stage` in the training replicas of `p`, sorted.
std::vector<int> StageRanks(const Plan& p, const Placement& o, int stage);
// Micro-batches for a replica's `samples`: the option (or 2 K), at least 1 and at most
// `samples`.
int MicroBatchCount(const Plan& p, const Placement& o, int64_t samples);
// The [begin, end) offsets of n items split into `parts` (the first n % parts one larger):
// parts + 1 entries.
std::vector<int64_t> Shares(int64_t n, int parts);

}  // namespace pipe
}  // namespace weft

#endif  // WEFT_PIPE_RUNTIME_PLACEMENT_H_
