// weft's communication API for C++: the process model, the virtual topology, and every
// collective and neighbor operation on tensor views. Semantics: this header and
// comm/README.md. LibTorch users: comm/torch/torch_comm.h takes torch::Tensor directly.
//
// Every op has a blocking form (returns Status) and a nonblocking form (returns a Handle at
// once; poll() or wait() on it). Ops are matched across ranks by `name`, or by call order
// when unnamed, and every rank must call every op. `out` may be `in` (in place), but may not
// share only part of its memory (refused as an invalid argument).
//
// Threads: any thread may call any function after init(), with one rule. Unnamed ops are
// matched by their order on the thread that called init(), and are refused (an
// InvalidArgument error, nothing sent) from any other thread, whose order could differ
// across ranks; name the ops you start on other threads. A call refused for its arguments
// still takes its place in the call order, and the other ranks' op fails with its reason.
#ifndef WEFT_COMM_COMM_H_
#define WEFT_COMM_COMM_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/topology.h"
#include "core/status.h"
#include "core/tensor.h"

namespace weft {

namespace comm {
struct Request;
class Engine;
}  // namespace comm

// Allocates the output of an op whose shape is only known once the ranks agree
// (allgather, neighbor_allgather). Called on the thread making progress: weft's engine
// thread, or a thread waiting in wait(); it must not wait for weft ops (wait() fails there).
using Allocator = std::function<StatusOr<TensorView>(DType, const std::vector<int64_t>& shape)>;

// A nonblocking op in flight. Copyable; the op runs to completion even if every copy is
// dropped (its buffers must stay alive until then).
class Handle {
 public:
  Handle() = default;
  bool valid() const { return request_ != nullptr; }
  // The op's output (for allgather ops, what the Allocator returned); valid after wait().
  TensorView output() const;
  // Ties `owner` (e.g. the framework tensors behind the views) to the op: it is released
  // once the op has completed and every copy of the handle is gone, so a caller may drop
  // its handles early without freeing buffers the engine still uses.
  void keep_alive(std::shared_ptr<const void> owner) const;

 private:
  friend class comm::Engine;
  friend bool poll(const Handle&);
  friend Status wait(const Handle&);
  explicit Handle(std::shared_ptr<comm::Request> r) : request_(std::move(r)) {}
  std::shared_ptr<comm::Request> request_;
};

// --- process model -------------------------------------------------------------------
// Starts MPI (if the program has not) and weft's engine. The default topology is
// ExponentialGraph(size()). Calling init() twice is an error; init() after shutdown() works.
Status init();
// Drains the engine: waits until every rank has called shutdown(); ops that cannot
// complete then fail. MPI itself is finalized at process exit if weft started it.
Status shutdown();
bool is_initialized();
// Unnamed ops are matched across ranks by their order on init()'s thread and refused on
// others. This makes the calling thread that thread instead; it does nothing before init().
// It is for runtimes that move the caller's code between threads (Go's goroutines): they
// serialize unnamed ops themselves and claim the order before each. Claiming it from
// threads that run ops concurrently gives them an order that can differ across ranks.
void claim_call_order();
// Finalizes MPI if weft started it, after shutdown() when weft is still initialized (so it
// is collective then); nothing more when the program started MPI itself. Afterwards init()
// fails. This normally happens at process exit (a C atexit handler); runtimes that end a
// process without running those (Go) call it last.
Status finalize();
// Ends the whole job now, from one rank that cannot go on (an error nothing caught) while
// the others may be waiting for it in a collective: MPI_Abort(code), which makes Open MPI's
// launcher stop every rank. Before MPI is up, or after it is finalized, it ends this
// process alone (exit status `code`). Never returns.
[[noreturn]] void abort_job(int code);
// These return -1 before init().
int rank();
int size();
int local_rank();    // rank among the processes on this machine
int local_size();
int machine_rank();  // index of this machine
int machine_size();
// 1 when every machine runs the same number of ranks and each machine's ranks are
// consecutive (machine m holds ranks m * local_size() ..), 0 otherwise; -1 before init().
int is_homogeneous();
// Whether MPI windows here use MPI's unified memory model (MPI_WIN_MODEL of a window on
// MPI_COMM_SELF; not collective). FailedPrecondition before init().
StatusOr<bool> unified_mpi_window_model();
// Whether this build runs CUDA tensors on NCCL.
bool nccl_built();

// --- topology --------------------------------------------------------------------------
// Collective. Every rank must pass an equivalent graph (same edges). Fails, changing
// nothing, while this or another rank has ops in flight.
Status set_topology(const Topology& topo, bool is_weighted = false);
Topology load_topology();
bool is_topo_weighted();
std::vector<int> in_neighbor_ranks();
std::vector<int> out_neighbor_ranks();
// The topology hierarchical_neighbor_allreduce uses between machines by default
// (ExponentialGraph(machine_size())).
Status set_machine_topology(const Topology& topo, bool is_weighted = false);
Topology load_machine_topology();

// --- ops ---------------------------------------------------------------------------------
struct NeighborAllreduceOptions {
  // self_weight and src_weights go together; dst_weights needs both and makes the call
  // dynamic (point-to-point to exactly those ranks, for this call only).
  // Weights may be any finite numbers: the result is self_weight * x + sum of
  // src_weight * neighbor's x (each neighbor's x first scaled by its dst weight for us).
  // They need not be positive or sum to 1 (gradient tracking and EXTRA combine with
  // I - W, push-sum with unnormalized weights); NaN and infinity are refused.
  // A dynamic call may name this rank in both src_weights and dst_weights (a schedule that
  // wraps around to the caller): a message to itself, adding src * dst weight to self_weight.
  std::optional<double> self_weight;
  std::optional<std::map<int, double>> src_weights;
  std::optional<std::map<int, double>> dst_weights;
  // weft always checks that send and receive sets match (its negotiation carries them at
  // no extra cost); the flag is kept for Bluefog compatibility.
  bool enable_topo_check = true;
};

struct NeighborAllgatherOptions {
  // Both or neither: receive from src_ranks (output in this order) and send to
  // dst_ranks instead of the topology's in- and out-neighbors.
  std::optional<std::vector<int>> src_ranks;
  std::optional<std::vector<int>> dst_ranks;
};

struct HierarchicalNeighborAllreduceOptions {
  // Machine-level weights, keyed by machine index; same rules as NeighborAllreduceOptions.
  std::optional<double> self_weight;
  std::optional<std::map<int, double>> src_machine_weights;
  std::optional<std::map<int, double>> dst_machine_weights;
};

// Process sets. allreduce and broadcast take an optional `ranks`: the op then runs among
// those ranks only (distinct, in any order, the caller among them; empty = every rank).
// Only they call it; they must pass the same set, and they are matched among themselves
// by name, or by their call order within that set when unnamed. Disjoint sets run
// independently (e.g. the replicas of each pipeline stage).
StatusOr<Handle> allreduce_nonblocking(const TensorView& in, const TensorView& out,
                                       bool average = true, const std::string& name = "",
                                       const std::vector<int>& ranks = {});
Status allreduce(const TensorView& in, const TensorView& out, bool average = true,
                 const std::string& name = "", const std::vector<int>& ranks = {});

// root_rank is a rank of the world (and of `ranks` when given).
StatusOr<Handle> broadcast_nonblocking(const TensorView& in, const TensorView& out,
                                       int root_rank, const std::string& name = "",
                                       const std::vector<int>& ranks = {});
Status broadcast(const TensorView& in, const TensorView& out, int root_rank,
                 const std::string& name = "", const std::vector<int>& ranks = {});

// Point to point. Only the two ranks call: a send to `dst` matches the recv on `dst` from
// this rank with the same name (unnamed: the pair's unnamed ops match in call order, so
// both ranks must issue them in the same order). Negotiated like every op: a dtype or
// shape mismatch is an error on both ranks, a missing peer a stall warning (and an error
// after WEFT_STALL_TIMEOUT_SECONDS). A send completes once the data has left `in`.
StatusOr<Handle> send_nonblocking(const TensorView& in, int dst, const std::string& name = "");
Status send(const TensorView& in, int dst, const std::string& name = "");
// Receives into `out`: the sender's dtype and shape must be out's.
StatusOr<Handle> recv_nonblocking(const TensorView& out, int src, const std::string& name = "");
Status recv(const TensorView& out, int src, const std::string& name = "");
// Receives a tensor of whatever dtype and shape the sender sends, into memory from `alloc`
// (Handle::output() after wait()).
StatusOr<Handle> recv_nonblocking(Allocator alloc, int src, const std::string& name = "");
StatusOr<TensorView> recv(Allocator alloc, int src, const std::string& name = "");

// Concatenation along dim 0 of every rank's tensor, in rank order; dim 0 may differ.
StatusOr<Handle> allgather_nonblocking(const TensorView& in, Allocator alloc,
                                       const std::string& name = "");
StatusOr<TensorView> allgather(const TensorView& in, Allocator alloc,
                               const std::string& name = "");

// Concatenation of the in-neighbors' tensors (ordered by rank, or as src_ranks), self
// excluded.
StatusOr<Handle> neighbor_allgather_nonblocking(const TensorView& in, Allocator alloc,
                                                const NeighborAllgatherOptions& options = {},
                                                const std::string& name = "");
StatusOr<TensorView> neighbor_allgather(const TensorView& in, Allocator alloc,
                                        const NeighborAllgatherOptions& options = {},
                                        const std::string& name = "");

StatusOr<Handle> neighbor_allreduce_nonblocking(const TensorView& in, const TensorView& out,
                                                const NeighborAllreduceOptions& options = {},
                                                const std::string& name = "");
Status neighbor_allreduce(const TensorView& in, const TensorView& out,
                          const NeighborAllreduceOptions& options = {},
                          const std::string& name = "");

StatusOr<Handle> hierarchical_neighbor_allreduce_nonblocking(
    const TensorView& in, const TensorView& out,
    const HierarchicalNeighborAllreduceOptions& options = {}, const std::string& name = "");
Status hierarchical_neighbor_allreduce(const TensorView& in, const TensorView& out,
                                       const HierarchicalNeighborAllreduceOptions& options = {},
                                       const std::string& name = "");

// Both peers end with self_weight * own + pair_weight * peer's.
StatusOr<Handle> pair_gossip_nonblocking(const TensorView& in, const TensorView& out, int peer,
                                         double self_weight = 0.5, double pair_weight = 0.5,
                                         const std::string& name = "");
Status pair_gossip(const TensorView& in, const TensorView& out, int peer,
                   double self_weight = 0.5, double pair_weight = 0.5,
                   const std::string& name = "");

StatusOr<Handle> barrier_nonblocking();
Status barrier();

// Groups, as NCCL's ncclGroupStart/ncclGroupEnd: the ops this thread starts between
// group_start() and group_end() do not wake weft's engine thread; the outermost
// group_end() does. A burst of nonblocking ops (one per parameter, say) then reaches the
// engine whole and is negotiated and fused as one, instead of the first op waking the
// engine thread, which would start it alone. This is a hint, not a barrier: an engine
// thread that is awake anyway, or another thread's poll() or wait(), takes the ops as they
// come, and this thread's own wait() inside the group takes them at once. Ops in a group
// are matched, numbered and checked as any others. Groups nest; group_end() on a thread
// with no open group is a FailedPrecondition error. Neither needs init(). An op left in a
// group that is never ended still runs, at the engine thread's next timed check.
void group_start();
Status group_end();

// --- one-sided windows ------------------------------------------------------------------
// One-sided windows. A window associates a tensor x with a name;
// every rank holds one receive buffer per in-neighbor (of the topology in force at
// creation) and exposes x for win_get. Puts and gets are one-sided: the other rank calls
// nothing. set_topology is refused while windows exist.
struct WinPutOptions {
  // After the put, the local tensor (and p) are multiplied by self_weight.
  double self_weight = 1.0;
  // Destination -> weight (the put writes weight * x); default: every out-neighbor, 1.
  std::optional<std::map<int, double>> dst_weights;
  // Hold the destinations' window mutexes around the put.
  bool require_mutex = false;
};

struct WinGetOptions {
  // Source -> weight (the buffer for j receives weight * x_j); default: every in-neighbor.
  std::optional<std::map<int, double>> src_weights;
  bool require_mutex = false;
};

struct WinUpdateOptions {
  // Both or neither: x <- self_weight * x + sum_j neighbor_weights[j] * buf_j. Default:
  // the topology's receive weights (self weight included) when it was set weighted, else
  // the uniform average over x and every buffer (summed, then divided).
  std::optional<double> self_weight;
  std::optional<std::map<int, double>> neighbor_weights;
  bool reset = false;          // zero the buffers used
  bool require_mutex = false;  // hold this rank's own mutex
};

struct WinCreateOptions {
  bool zero_init = false;  // buffers start as zeros instead of copies of x
  // "mpi" (MPI RMA) or "ucx" (UCX RDMA); "" takes WEFT_TRANSPORT. The same on every rank.
  std::string transport;
};

// Collective. `x` must stay alive (and in place) until win_free; buffers start as copies
// of x, or zeros; the associated p starts at 1 for this rank and at 0 for every neighbor's
// buffer (nothing pushed yet). The name must be new. A tensor on a CUDA device is staged through
// host memory (windows are host memory): every window op that reads or writes x copies it between
// the device and the host, so a neighbor's win_get sees x as of this rank's last window op on it.
Status win_create(const TensorView& x, const std::string& name, bool zero_init = false);
Status win_create(const TensorView& x, const std::string& name, const WinCreateOptions& options);
// Collective. "" frees every window.
Status win_free(const std::string& name = "");
// Writes weight * x into each destination's buffer for this rank.
StatusOr<Handle> win_put_nonblocking(const TensorView& x, const std::string& name,
                                     const WinPutOptions& options = {});
Status win_put(const TensorView& x, const std::string& name, const WinPutOptions& options = {});
// The same, but adds to the destination's buffer (atomically per element).
StatusOr<Handle> win_accumulate_nonblocking(const TensorView& x, const std::string& name,
                                            const WinPutOptions& options = {});
Status win_accumulate(const TensorView& x, const std::string& name,
                      const WinPutOptions& options = {});
// Reads weight * x_j from each source into the local buffer for j.
StatusOr<Handle> win_get_nonblocking(const std::string& name, const WinGetOptions& options = {});
Status win_get(const std::string& name, const WinGetOptions& options = {});
// Local: combines the buffers into the window's tensor (in place).
Status win_update(const std::string& name, const WinUpdateOptions& options = {});
// Local: x <- x + sum_j buf_j (a sum, not an average), then every buffer is zeroed.
Status win_update_then_collect(const std::string& name, bool require_mutex = false);
// Puts (and gets) into each buffer since its last update, by in-neighbor.
StatusOr<std::map<int, int64_t>> win_version(const std::string& name);
// The scalar p that follows the same weights as x (push-sum); starts at 1.
StatusOr<double> win_associated_p(const std::string& name);
// Whether win_update and a put's self_weight also apply to p, for every window of this
// process (default on). Off, p stays as it is, which is Bluefog's default (its
// turn_on/off_win_ops_with_associated_p); puts still carry p to the neighbors' buffers.
void set_win_associated_p_ops(bool on);
bool win_associated_p_ops();
// The window mutexes of `ranks` (empty: this rank's own), taken in rank order; waits while
// another rank holds one. Release with win_mutex_release.
Status win_mutex_acquire(const std::string& name, const std::vector<int>& ranks = {});
Status win_mutex_release(const std::string& name, const std::vector<int>& ranks = {});
// Names of the windows alive, sorted.
std::vector<std::string> win_names();

// --- timeline ---------------------------------------------------------------------------
// Starts writing this rank's Chrome trace to `path` (named as WEFT_TIMELINE is: one file per
// rank when several run, '%r' replaced by the rank). Fails if one is already being written.
// Ops already started show only the phases that begin after it.
Status timeline_start(const std::string& path);
// Finishes and closes the trace; nothing to do when none is being written.
Status timeline_stop();
// A user span (e.g. "forward") on the row of `tensor_name`, from start to end.
Status timeline_start_activity(const std::string& tensor_name, const std::string& activity);
Status timeline_end_activity(const std::string& tensor_name);
// Whether a trace is being written (WEFT_TIMELINE or timeline_start).
bool timeline_active();

// True once the op has completed (successfully or not).
bool poll(const Handle& handle);
// Waits for the op; returns its status. Waiting twice returns the same status.
Status wait(const Handle& handle);

}  // namespace weft

#endif  // WEFT_COMM_COMM_H_
