// The engine: a background thread per process that drains the request queue, negotiates
// with the other ranks through the coordinator (rank 0), hands what is ready to the data
// plane for its tensors (data_plane.h: host memory, or CUDA tensors), and completes
// handles. Internal to comm/.
#ifndef WEFT_COMM_ENGINE_H_
#define WEFT_COMM_ENGINE_H_

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "comm/comm.h"
#include "comm/control_channel.h"
#include "comm/coordinator.h"
#include "comm/peer_transport.h"
#include "comm/protocol.h"
#include "comm/topology.h"
#include "core/timeline.h"

namespace weft {
namespace comm {

class HostPlane;  // data_plane.h
class DevicePlane;

// One op, from submission to completion.
class Engine;

// How the first round of an op that runs on direct agreement was written ahead of it
// (HostPlane::Stage): its agreement, which every rank counted in to after writing, then
// stands for that round's meeting. kTunedInPlace, kTunedOutOfPlace: rank 0 picks the op's
// way by timing (HostPlane::Preference), and the op is in place, or not, on this rank; only
// what the direct reads post was written. The ranks agree on it as on any other value (at
// most 7: three bits of the agreed facts).
enum class Staged : uint8_t {
  kNone = 0,
  kSegment = 1,
  kDirectReads = 2,
  kTunedInPlace = 3,
  kTunedOutOfPlace = 4
};
inline bool IsTuned(Staged staged) {
  return staged == Staged::kTunedInPlace || staged == Staged::kTunedOutOfPlace;
}

// Synchronous copies between host memory and a CUDA device.
using HostCopier = std::function<Status(void* dst, const void* src, size_t bytes, bool to_device)>;

struct Request {
  Request() = default;
  // Copy-constructs the views: a view's dimensions copy as one block that way, where
  // assigning them goes element by element (a quarter of a submission's instructions).
  Request(const TensorView& in_view, const TensorView& out_view) : in(in_view), out(out_view) {}

  Descriptor desc;  // what is negotiated (op, key, shape, pattern...)
  TensorView in;
  TensorView out;
  Allocator alloc;  // allgather ops

  // Resolved parameters (weights are final coefficients; ranks or machine indices).
  double self_weight = 1.0;
  std::vector<std::pair<int, double>> recv;  // source -> weight applied by this rank
                                             // (pair gossip: {peer: pair_weight})
  std::vector<std::pair<int, double>> send;  // destination -> scale applied before sending
  std::shared_ptr<const Topology> new_topology;  // set_topology
  bool new_topology_weighted = false;
  // Window ops: run on the thread making progress (kWinCreate/kWinFree when the ranks
  // agree, kWinLocal as soon as dequeued). No value: not done yet, try again at the next
  // round of progress (a mutex held elsewhere).
  std::function<std::optional<Status>()> action;
  // Who moves the data, for the timeline's event names ("MPI_ALLREDUCE", "NCCL_...",
  // "UCX_WIN_PUT").
  const char* backend = "MPI";

  // The caller waits for it right away, outside a group: it may run without the
  // coordinator's answer when every rank calls it alike (agreement.h), as may a
  // nonblocking op that the engine finds alone.
  bool blocking = false;
  // Its place among this rank's ops over every rank, named or unnamed (not those of a
  // process set, nor internal ones): the number direct agreement knows it by
  // (agreement.h); -1 for the others. Named ops from several threads may take their places
  // in another order on each rank: the agreement then finds different ops under one number,
  // and they are negotiated.
  int64_t turn = -1;
  // Neighbor ops: the exchange follows the topology (no dst_weights), which is the same on
  // every rank, so every rank's sends match the others' receives without a check.
  bool topology_pattern = false;
  // Set on an op that runs on direct agreement only, once every rank has counted in with
  // the same way of staging it.
  Staged staged = Staged::kNone;

  // Timeline only: 0 while it is off (TraceStart).
  int64_t submitted_us = 0;
  int64_t dequeued_us = 0;

  std::mutex mu;
  std::condition_variable cv;
  // Set once, under mu, after `status`, which is final from then on: a caller that sees it
  // set reads the status without the lock (a burst's later handles, done with the first,
  // cost their waits one load each).
  std::atomic<bool> done{false};
  Status status;
  std::vector<std::shared_ptr<const void>> owners;  // Handle::keep_alive; guarded by mu
  std::weak_ptr<Engine> engine;  // lets a waiting caller drive the engine

  bool is_done() const { return done.load(std::memory_order_acquire); }

  void Complete(Status s);
};

// What init() learned about the processes, and the communicators weft owns.
struct Context {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  int machine_rank = 0, machine_size = 1;
  bool homogeneous = true;           // equal machines, each machine's ranks consecutive
  // This machine's ranks outnumber the CPUs they may run on (the same on each of them).
  bool oversubscribed = false;
  MPI_Comm control = MPI_COMM_NULL;  // descriptors and responses
  MPI_Comm data = MPI_COMM_NULL;     // the ops themselves
  MPI_Comm local = MPI_COMM_NULL;    // ranks of this machine
  MPI_Comm cross = MPI_COMM_NULL;    // local rank 0 of every machine (others: NULL)
  std::vector<int> cross_ranks;      // the data rank of each rank of `cross`
};

// Progress (draining the queue, negotiating, running ops) is made by whichever thread holds
// progress_mu_: the engine thread, or a caller waiting for its op, which saves the two
// thread wake-ups a handoff costs. Everything marked "engine state" needs progress_mu_.
// Whether this build has the NCCL backend (device_plane.cc).
bool NcclBuilt();
// OK if ops can run on `device` (a CUDA device) in this process; otherwise why not, naming
// the op and which tensor (device_plane.cc).
Status DeviceUsable(const Device& device, const char* op, const char* which);

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  Engine(const Context& ctx, Timeline* timeline);
  ~Engine();

  // Starts the engine thread and the watchdog.
  void Start();
  // Validated requests only. Fails if the engine is stopping. `caller_waits`: the caller
  // waits for it right away and so makes the progress itself, or its thread is in a group
  // (group_start) that hands its requests over at the end; the engine thread is not woken
  // (it would run the op on whatever core it gets, often one another rank needs).
  // `blocking`: the caller waits for this op alone, outside a group (Request::blocking).
  StatusOr<Handle> Submit(std::shared_ptr<Request> request, bool caller_waits = false,
                          bool blocking = false);
  // A request this rank refused before submitting it (a bad argument): it still takes its
  // place in the call order (an unnamed op's number), and the other ranks of the op get
  // the refusal as their op's error. Only desc.op, key (the name), group and the pattern
  // used for messages need to be set. Returns `why`.
  Status Refuse(std::shared_ptr<Request> request, Status why);
  // Makes the calling thread the one whose unnamed ops are numbered (init()'s until then).
  void ClaimCallOrder() { order_thread_.store(std::this_thread::get_id()); }
  // Wakes the engine thread if it sleeps with requests queued: the end of a group, whose
  // requests were submitted without waking it (not where ranks share CPUs: Loop's idle
  // sleep is short there instead).
  void Wake();
  // Number of submitted requests not yet completed.
  int64_t in_flight() const { return in_flight_.load(); }
  // Runs after the engine processed the shutdown response; joins the thread and waits
  // until no caller is driving progress.
  void Join();

  // Called by wait(): makes progress on the caller's thread while `r` is not done, for at
  // most WEFT_ENGINE_SPIN_MICROS without progress, then hands back to the engine thread.
  // Fails when called from inside progress (it would wait for itself).
  Status DriveUntilDone(Request& r);
  // Called by poll(): one round of progress if no other thread is making it.
  void TryProgress();

  // Windows alive: while there are some, the idle engine thread keeps polling MPI so that
  // one-sided operations from other ranks progress on transports that need it.
  std::atomic<int> windows{0};
  // How the engine's own algorithms (neighbor exchanges, pair gossip, the hierarchical op's
  // exchange between machines, the ring allreduce) move data between ranks of the data
  // communicator (WEFT_EXCHANGE_TRANSPORT). Set by init() before Start().
  std::unique_ptr<PeerTransport> peers;

  // Synchronous copies between host memory and `device` (a CUDA device), ordered after
  // the device work the engine queued: windows on CUDA tensors stage through host memory
  // with it. Only from the thread making progress (a window op's action). Fails in builds
  // without the NCCL backend.
  StatusOr<HostCopier> DeviceCopier(const Device& device);

  // WEFT_STALL_TIMEOUT_SECONDS (0: wait forever).
  static double stall_timeout_s();

  // Called by the thread making progress when a set_topology op succeeds.
  std::function<void(const Request&)> on_set_topology;

  static Handle MakeHandle(std::shared_ptr<Request> r) { return Handle(std::move(r)); }

 private:
  // With WEFT_STALL_TIMEOUT_SECONDS set, ends the job (MPI_Abort, then _exit) when this
  // rank has spent longer than the timeout plus a margin inside one MPI call of an op,
  // or, away from rank 0, has had ops waiting three times as long for any answer from
  // the coordinator: a rank or a link is gone, and nothing else would ever return.
  void Watchdog();
  void StopWatchdog();
  // Marks the op this thread runs on MPI (the watchdog's first condition).
  class Running {
   public:
    Running(Engine* engine, const Request& r, size_t fused_with);
    ~Running();

   private:
    Engine* engine_;
  };
  // Turns the name into the key that matches the op across ranks (the unnamed ones are
  // numbered; messages name the op from it, see Describe); refuses unnamed ops from threads
  // other than the one that created the engine (init()). Requires queue_mu_.
  Status AssignKey(Request& r, bool refusing);
  void Loop();
  // Wakes the engine thread after a caller stopped driving with work left (it sleeps while
  // a caller drives).
  void HandBack();
  // Whether the caller should notify queue_cv_: the engine thread sleeps and no wake-up is
  // on its way yet (records that one is). Requires queue_mu_.
  bool TakeWakeUp();
  // How long a caller waiting for its op polls before it sleeps and hands progress back:
  // WEFT_ENGINE_SPIN_MICROS, or twice as long as the last op took to run if that is longer
  // (up to WEFT_ENGINE_WAIT_SPIN_MAX_MICROS; not when the first is 0). When ops take milliseconds,
  // the ranks leave one op milliseconds apart, and so wait that long for the next op's answer: a
  // caller asleep by then would see it only at the engine thread's next poll (up to
  // WEFT_ENGINE_MAX_SLEEP_MICROS later), on every op. A blocking MPI call polls throughout.
  int64_t WaitSpinMicros() const;
  bool Progress();  // requires progress_mu_
  // Direct agreement (agreement.h), all requiring progress_mu_. Whether `r`, just drained,
  // may run without the coordinator's answer; if so it becomes direct_ (true), otherwise
  // every rank is told that it goes to the coordinator.
  // `alone`: nothing else was drained with it.
  bool TryDirect(const std::shared_ptr<Request>& r, bool alone);
  // direct_'s decision, once made: runs it, or sends it to the coordinator. `must`: decide
  // now (withdraw unless every rank is in), since this rank has another op to run first or
  // has drained a later one, whose descriptor must not reach the coordinator before it.
  bool SettleDirect(bool must);
  // After every rank counted in for a dynamic neighbor_allreduce: whether every rank's sends
  // are what the others expect to receive (their own facts, agreement.h).
  bool PatternsMatch(const Agreement& agreement) const;
  bool Busy() const;  // requires progress_mu_: ops outstanding or messages in flight
  void SendDescriptors(const std::vector<const Descriptor*>& batch);
  bool PollDescriptors();    // rank 0; one message per call
  bool RunCoordinator();     // rank 0
  bool PollResponses();      // ranks != 0; one message per call
  void Process(const std::vector<Response>& responses);
  void Execute(const Response& response, std::vector<std::shared_ptr<Request>>& group);
  void FailAll(const Status& status);
  void Finish(const std::shared_ptr<Request>& r, Status s);
  // Timeline spans (data_plane.h).
  void Trace(const std::vector<std::shared_ptr<Request>>& group, const char* phase,
             int64_t start_us);
  void Span(const Request& r, const char* phase, int64_t start_us, int64_t end_us,
            const std::string& detail = "");

  Context ctx_;
  Timeline* timeline_;
  // The only thread whose unnamed ops have an order: init()'s, or the last to claim it.
  std::atomic<std::thread::id> order_thread_;
  std::thread watchdog_;
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool watch_stop_ = false;                   // watch_mu_
  const Request* running_ = nullptr;          // watch_mu_: the op transferring now
  size_t running_fused_with_ = 0;             // watch_mu_: the other ops of its group
  std::atomic<int64_t> running_since_us_{0};  // 0: none
  std::atomic<int64_t> last_answer_us_{0};    // ranks != 0: the coordinator's last answer
  std::atomic<bool> awaiting_answer_{false};  // ranks != 0: ops wait for the coordinator
  std::thread thread_;

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  // Swapped with drained_ by Progress: the two vectors keep their capacity, so draining
  // allocates nothing (a std::deque allocates on construction, in every round of polling).
  std::vector<std::shared_ptr<Request>> queue_;
  bool stopping_ = false;  // no more submissions
  bool kick_ = false;      // a driving caller handed progress back to the engine thread
  bool sleeping_ = false;  // the engine thread waits on queue_cv_
  // A submission has woken the sleeping engine thread (reset when it wakes): later ones need
  // not. Not "the queue is non-empty": a group's requests wait in the queue unannounced, and
  // another thread's op behind them must still wake it.
  bool wake_sent_ = false;
  int64_t next_unnamed_ = 0;
  int64_t next_turn_ = 0;  // Request::turn
  std::map<std::vector<int32_t>, int64_t> next_unnamed_in_group_;
  std::set<std::string> names_in_flight_;
  std::atomic<int64_t> in_flight_{0};

  std::mutex progress_mu_;
  // Engine state (progress_mu_).
  absl::flat_hash_map<std::string, std::shared_ptr<Request>> outstanding_;
  std::vector<std::shared_ptr<Request>> drained_;  // Progress's batch from queue_; empty between
  std::deque<std::shared_ptr<Request>> local_;  // kWinLocal, in submission order
  bool RunLocal();
  std::unique_ptr<Coordinator> coordinator_;  // rank 0
  // The op this rank counted in for direct agreement, until decided (in neither
  // queue_ nor outstanding_ meanwhile); when it waits since.
  std::shared_ptr<Request> direct_;
  int64_t direct_since_us_ = 0;
  bool direct_runs_ = false;  // every rank counted in already when this one did
  Staged direct_staged_ = Staged::kNone;  // how this rank staged it
  // Descriptors to the coordinator, its responses back. Opened by the constructor, which
  // init() runs on every rank at the same point (opening it is collective on rank 0's
  // machine).
  std::unique_ptr<ControlChannel> control_;
  bool shutdown_done_ = false;
  int64_t last_stall_check_us_ = 0;
  std::atomic<int64_t> last_run_us_{0};  // how long the last op took to run (Execute)
  // When Progress() last did something, on whichever thread ran it: the engine thread's
  // back-off counts from it (spin.h, BusySleepMicros).
  std::atomic<int64_t> last_progress_us_{0};
  // What runs the agreed ops (data_plane.h), made by Start() (every use of them comes
  // after it; the host plane keeps `peers`, which init() sets before): host memory, and
  // CUDA tensors (whose work may complete later, through Finish).
  std::unique_ptr<HostPlane> host_;
  std::unique_ptr<DevicePlane> device_;
};

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_ENGINE_H_
