// State and argument checks shared by the C++ API's front ends: the process model
// (comm.cc), the ops (ops.cc) and the windows (window_api.cc). Internal to comm/.
#ifndef WEFT_COMM_FRONT_H_
#define WEFT_COMM_FRONT_H_

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.h"
#include "comm/engine.h"
#include "comm/topology.h"
#include "comm/window.h"
#include "core/timeline.h"

namespace weft {
namespace comm {

// What init() sets up and shutdown() tears down.
struct State {
  comm::Context ctx;
  Timeline timeline;
  std::shared_ptr<comm::Engine> engine;  // requests hold weak references
  std::mutex topo_mu;
  std::shared_ptr<const Topology> topology;
  bool weighted = false;
  std::shared_ptr<const Topology> machine_topology;
  bool machine_weighted = false;
  std::mutex win_mu;
  std::map<std::string, std::shared_ptr<comm::Window>> windows;  // win_mu
};

// The process's state: set between init() and shutdown(), guarded by g_mu.
extern std::mutex g_mu;
extern std::shared_ptr<State> g_state;
std::shared_ptr<State> Current();
Status NotInitialized(const char* what);

// Argument checks; errors name the op and the argument.
Status CheckTensor(const TensorView& t, const char* op, const char* which);
// The output has the input's dtype, shape and device.
Status CheckSameLayout(const TensorView& in, const TensorView& out, const char* op);
Status CheckRank(int r, int size, const char* op, const char* what);
// Weights keyed by rank (or machine: `unit`): in range, finite, not self unless allowed.
Status CheckWeights(const std::map<int, double>& weights, int size, int self, const char* op,
                    const char* what, const char* unit, bool self_allowed = false);

// The bytes that tell apart ops that may be fused together (same pattern and weights).
std::string PatternSignature(const char* tag, double self_weight,
                             const std::vector<std::pair<int, double>>& send,
                             const std::vector<std::pair<int, double>>& recv);
// Resolves neighbor weights into the request: who to send to (with the sender-side
// scale) and receive from (with the receiver-side weight), for ranks or machines.
Status ResolveNeighborWeights(Request* r, const Topology& topo, bool weighted, int self,
                              std::optional<double> self_weight,
                              const std::optional<std::map<int, double>>& src_weights,
                              const std::optional<std::map<int, double>>& dst_weights,
                              const char* op, const char* unit, const char* src_name,
                              const char* dst_name);

// The state, or an error when weft is not initialized or the name is reserved.
StatusOr<std::shared_ptr<State>> Begin(const char* op, const std::string& name);
// What matches a window's creation across ranks (its refusals included).
std::string WinCreateKey(const std::string& name);
std::shared_ptr<Request> NewRequest(const State& state, OpType op, const TensorView& in,
                                    const TensorView& out, const std::string& name);

// Set while a blocking form submits its op: it waits at once, so it drives the engine itself.
extern thread_local bool t_caller_waits;
// Open groups on this thread (group_start): their ops do not wake the engine thread.
extern thread_local int t_group_depth;
struct CallerWaits {
  CallerWaits() { t_caller_waits = true; }
  ~CallerWaits() { t_caller_waits = false; }
};
StatusOr<Handle> Submit(State& state, std::shared_ptr<Request> r);
// Hands a request to the engine, or, when this rank's own checks refused its arguments,
// has the engine tell the other ranks (Engine::Refuse): the op still takes its place in
// the call order, and the ranks that called it correctly fail with this rank's reason
// instead of waiting for it, or pairing their later unnamed ops with the wrong ones.
// Checks that run before the op's process set is known cannot be told (the others key
// the op by its set) and return at once instead.
StatusOr<Handle> SubmitOrRefuse(State& state, std::shared_ptr<Request> r, Status checks);
// The process topology and whether it is weighted.
std::pair<std::shared_ptr<const Topology>, bool> Topo(State& s);

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_FRONT_H_
