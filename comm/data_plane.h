// The data plane: what runs an op once the ranks have agreed on it. The engine negotiates
// (engine.cc) and hands every agreed group of requests to the plane for its tensors:
// `mpi_plane.cc` for host memory, `device_plane.cc` for CUDA tensors (NCCL, or MPI through
// host memory). Internal to comm/.
//
// Every rank hands its planes the same responses in the same order, so a plane may run
// blocking collectives. A plane runs on the thread making the engine's progress, one op
// at a time.
#ifndef WEFT_COMM_DATA_PLANE_H_
#define WEFT_COMM_DATA_PLANE_H_

#include <mpi.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/engine.h"
#include "comm/peer_transport.h"
#include "comm/protocol.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/timeline.h"

namespace weft {
namespace comm {

// The requests of one response, in its order (more than one when fused).
using Group = std::vector<std::shared_ptr<Request>>;
// Completes a request with its status (the engine's bookkeeping).
using Finisher = std::function<void(const std::shared_ptr<Request>&, Status)>;

class DataPlane {
 public:
  virtual ~DataPlane() = default;
  // Runs `response`'s op on `group` and returns its status, for the engine to complete
  // every request with; or returns no value when the plane completes them itself
  // (through its Finisher: at once, or from a later Poll() or Drain()).
  virtual std::optional<Status> Run(const Response& response, Group& group) = 0;
  // Completes the started work that has finished; true if any did.
  virtual bool Poll() { return false; }
  // Waits for all started work and completes it.
  virtual void Drain() {}
  // Started work not completed yet.
  virtual bool busy() const { return false; }
};

// Host memory, on MPI and the peer transport: MPI collectives, weft's neighbor exchanges
// and its ring allreduce. Its Run always returns the op's status, once the op is done.
class HostPlane : public DataPlane {
 public:
  // The communicator of a process set (sorted ranks; empty: every rank), created at its
  // first op: MPI_Comm_create_group is collective over the set only, and every member
  // runs that op at the same point of the response order.
  virtual StatusOr<MPI_Comm> CommOf(const std::vector<int32_t>& ranks) = 0;
  // Frees the communicators it created (before MPI_Finalize).
  virtual void Close() = 0;
  // Whether Run(response, group) waits for the other ranks first in a loop of its own that
  // polls through the plane's `idle` callback (a meeting in shared memory, MakeHostPlane),
  // rather than inside MPI or the peer transport; every rank of the op answers alike.
  virtual bool MeetsFirst(const Response& response, const Group& group) const = 0;
  // Before the op `r` counts in to the direct agreement: writes ahead what it
  // writes before its first meeting through shared memory, where its first step would be
  // one, and says how (shared_collectives.h, "staged"); kNone where it would not, or cannot
  // now. Run() takes the op's `staged` for that meeting, where it still runs the way staged
  // (every rank answers alike). `tuned`: Preference() picked (0 or more) for `r`; then only
  // what a way of reading the others' memory posts before its first meeting is written,
  // and the answer is kTunedInPlace or kTunedOutOfPlace, as `r` is on this rank.
  virtual Staged Stage(Request& r, bool tuned) = 0;
  // Where rank 0 picks the way the op `r` runs by timing its ways (a tuner of its own),
  // before `r` counts in to the direct agreement: on rank 0 the way to run it (0: the
  // default; at most 3), on the others 0; -1 where the way is not picked so. The engine
  // stages such an op as tuned (Stage), runs it directly only where every rank answered 0
  // or more and staged alike (otherwise the coordinator answers it, with no pick), and hands
  // rank 0's answer to Run() as Response::tuned_way.
  virtual int Preference(const Request& r) = 0;
};
// `peers` moves the engine's own point-to-point traffic; it outlives the plane. Collective
// over ctx.local (the segment of the collectives through shared memory,
// shared_collectives.h). `idle` passes the time between two polls of an op that waits for
// other ranks outside MPI (`since`: when it began waiting); it keeps other ranks' one-sided
// ops into this rank's windows moving, which may need this rank's MPI progress.
std::unique_ptr<HostPlane> MakeHostPlane(const Context& ctx, Timeline* timeline,
                                         PeerTransport* peers,
                                         std::function<void(int64_t since)> idle);

// CUDA tensors.
class DevicePlane : public DataPlane {
 public:
  // Copies between host memory and `device`, ordered after the device work already
  // started (windows on CUDA tensors stage through host memory with it).
  virtual StatusOr<HostCopier> Copier(const Device& device) = 0;
};
// The one factory that knows whether this build has the NCCL backend (device_plane.cc):
// with it, ops run on NCCL (or, where NCCL cannot or WEFT_<OP>_BY_MPI says so, on `host`
// through host memory); without it, every op fails. `host` outlives the plane.
std::unique_ptr<DevicePlane> MakeDevicePlane(const Context& ctx, Timeline* timeline,
                                             HostPlane* host, Finisher finish);

// Helpers the planes share.

// Timeline spans: `phase` (queue, negotiate, fuse, stage, communicate, combine) is the
// event's category; its name follows Bluefog's ("ENQUEUE_ALLREDUCE", "MPI_WIN_PUT"). A span
// whose start is 0 (see TraceStart) is not written.
void TraceSpan(Timeline* timeline, const Request& r, const char* phase, int64_t start_us,
               int64_t end_us, const std::string& detail = "");
// Where a span that ends later starts: now while the timeline records, otherwise 0 without
// reading the clock (a read costs ~26 ns on the development VM; an op's path had a dozen).
int64_t TraceStart(const Timeline* timeline);
// One span per request of `group`, from `start_us` to now, noting the fusion.
void TraceGroup(Timeline* timeline, const Group& group, const char* phase, int64_t start_us);
// Elements per row (dim 0 index) of a tensor of `shape`.
int64_t RowElements(absl::Span<const int64_t> shape);
// An output from a request's allocator: OK if it has the dtype, shape and device asked.
Status CheckAllocated(const StatusOr<TensorView>& out, DType dtype, absl::Span<const int64_t> shape,
                      const Device& device);

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_DATA_PLANE_H_
