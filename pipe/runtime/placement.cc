#include "pipe/runtime/placement.h"

#include <algorithm>

namespace weft {
namespace pipe {

int ActiveReplicas(const Plan& p, const Placement& o) {
  return o.autodp ? p.replicas : std::min(p.replicas, o.initial_replicas);
}

Role ActiveRole(const Plan& p, const Placement& o, int r) {
  Role role = p.roles[r];
  if (role.replica >= ActiveReplicas(p, o)) return Role{};
  return role;
}

std::vector<int> NeededLayers(const Plan& p, const Placement& o, int r) {
  std::vector<int> out;
  const Role role = ActiveRole(p, o, r);
  if (!role.active()) return out;
  const auto& b = p.partition.boundaries;
  const bool prefix = o.cache && role.stage == 0;
  const int begin = prefix ? 0 : b[role.stage];
  const int end = std::max(b[role.stage + 1], prefix ? p.frozen : 0);
  for (int l = begin; l < end; ++l) out.push_back(l);
  return out;
}

std::vector<int> StageRanks(const Plan& p, const Placement& o, int stage) {
  std::vector<int> out;
  for (int r = 0; r < ActiveReplicas(p, o); ++r) out.push_back(p.ReplicaRanks(r)[stage]);
  std::sort(out.begin(), out.end());
  return out;
}

int MicroBatchCount(const Plan& p, const Placement& o, int64_t samples) {
  const int wanted = o.micro_batches > 0 ? o.micro_batches : 2 * p.k;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, samples)));
}

std::vector<int64_t> Shares(int64_t n, int parts) {
  std::vector<int64_t> offsets(parts + 1, 0);
  for (int p = 0; p < parts; ++p) {
    offsets[p + 1] = offsets[p] + n / parts + (p < n % parts ? 1 : 0);
  }
  return offsets;
}

}  // namespace pipe
}  // namespace weft
