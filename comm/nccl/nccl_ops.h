// The NCCL data plane for CUDA tensors: what the engine enqueues on the device once the
// ranks agree. One backend per process, bound to one CUDA device, with one NCCL
// communicator mirroring each MPI communicator it needs (all ranks; the ranks of this
// machine; local rank 0 of every machine), each bootstrapped through MPI on first use.
//
// Every op is enqueued on the backend's stream and returns at once; Record() then gives a
// Completion the engine polls, so the engine never blocks on the device. The stream is a
// blocking stream: it waits for work queued before on the legacy default stream (where
// frameworks produce tensors unless told otherwise) and that stream waits for it.
//
// Internal to comm/: knows MPI and CUDA, not the engine (which calls it from
// Engine::Execute, where every rank runs the same ops in the same order, so the lazy,
// collective bootstrap cannot deadlock).
#ifndef WEFT_COMM_NCCL_NCCL_OPS_H_
#define WEFT_COMM_NCCL_NCCL_OPS_H_

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace weft {
namespace comm {
namespace nccl {

class NcclBackend;

// Empty if this process can use CUDA device `index`, else why not (no device, no driver,
// index out of range). The device count is read once per process. Callers check it before
// queueing an op, so that a machine without a GPU gets a clear error at the call.
std::string DeviceUnavailable(int index);

// "Done yet?" for the work enqueued before it was recorded.
class Completion {
 public:
  ~Completion();
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;
  // No value while the device works; then OK, or the CUDA or NCCL error (from
  // ncclCommGetAsyncError, with ncclGetLastError's detail).
  std::optional<Status> Poll();

 private:
  friend class NcclBackend;
  Completion(NcclBackend* backend, void* event) : backend_(backend), event_(event) {}
  NcclBackend* backend_;
  void* event_;  // cudaEvent_t
};

// Which ranks send to and receive from this one, and the weights (as in comm::Request).
using Peers = std::vector<std::pair<int, double>>;

class NcclBackend {
 public:
  // The MPI communicators of the engine's Context; `cross` is MPI_COMM_NULL on ranks that
  // are not local rank 0. Makes no CUDA call.
  NcclBackend(MPI_Comm data, MPI_Comm local, MPI_Comm cross);
  ~NcclBackend();
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  // The ops. `device` is the tensors' device: the first op binds the backend to it (and
  // bootstraps NCCL, a collective over every rank); a later op on another device fails.
  // Errors returned here are this rank's (enqueueing failed); errors while the device runs
  // surface through Completion::Poll.

  // out = sum over ranks of in (times 1/size when `average`); in == out is in place.
  Status Allreduce(const void* in, void* out, size_t count, DType dtype, bool average,
                   const Device& device);
  // out = root's in; `in` is only read on the root.
  Status Broadcast(const void* in, void* out, size_t bytes, int root, const Device& device);
  // Concatenates every rank's `in` (bytes_per_rank[r] bytes from rank r) into out.
  Status Allgather(const void* in, void* out, const std::vector<size_t>& bytes_per_rank,
                   const Device& device);
  // Receives recv[k].second bytes from rank recv[k].first into out, in that order; sends
  // `in` (in_bytes) to every rank in `send`.
  Status NeighborAllgather(const void* in, size_t in_bytes, void* out,
                           const std::vector<std::pair<int, size_t>>& recv,
                           const std::vector<int>& send, const Device& device);
  // out = self_weight * in + sum_k recv[k].second * (what recv[k].first sent), where each
  // destination send[k].first receives send[k].second * in. in == out is in place.
  Status NeighborAllreduce(const void* in, void* out, size_t count, DType dtype,
                           double self_weight, const Peers& send, const Peers& recv,
                           const Device& device);
  // The hierarchical variant: sum inside the machine, exchange between local rank 0s with
  // machine-level weights (send/recv name machines), broadcast inside the machine, divide
  // by local_size.
  Status Hierarchical(const void* in, void* out, size_t count, DType dtype, double self_weight,
                      const Peers& send, const Peers& recv, int local_rank, int local_size,
                      const Device& device);

  // A completion for everything enqueued so far.
  StatusOr<std::unique_ptr<Completion>> Record();
  // Blocks until the stream is idle (shutdown, or after a failed enqueue).
  Status Synchronize();

  // Host staging (WEFT_<OP>_BY_MPI): synchronous copies ordered after the stream's work.
  Status CopyToHost(void* host, const void* device_ptr, size_t bytes, const Device& device);
  Status CopyToDevice(void* device_ptr, const void* host, size_t bytes, const Device& device);

 private:
  friend class Completion;
  struct Comm;  // one NCCL communicator and the MPI communicator it was bootstrapped from
  struct State;

  Status Bind(const Device& device);      // selects the device, creates the stream
  Status Ready(Comm& comm, const Device& device);  // Bind + lazy NCCL bootstrap
  Status AsyncError() const;              // of every communicator that exists
  // Device scratch buffers, reused across ops (the stream orders their uses).
  StatusOr<void*> Scratch(std::vector<std::pair<void*, size_t>>& pool, size_t index,
                          size_t bytes);
  // Exchange on `comm`: scaled copies of `in` to every destination, receives into
  // recv scratch; then out = self_weight * in + sum_k recv weights * recv_k.
  Status ExchangeAndCombine(Comm& comm, const void* in, void* out, size_t count, DType dtype,
                            double self_weight, const Peers& send, const Peers& recv);
  void ReturnEvent(void* event);

  std::unique_ptr<State> state_;
};

}  // namespace nccl
}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_NCCL_NCCL_OPS_H_
