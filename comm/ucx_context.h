// The process's UCX (UCP) context, worker and endpoints, shared by the UCX window transport
// and the UCX peer transport. Built only when the build found UCX (WEFT_WITH_UCX).
// Internal to comm/.
//
// Made collectively once (init() with a UCX setting, or the first UCX window) and kept for
// the life of the process. Once a UCX window exists, a progress thread drives the worker
// every millisecond (multi-threaded mode): some UCP operations aimed at this rank need its
// progress while its engine sits in a blocking MPI collective.
#ifndef WEFT_COMM_UCX_CONTEXT_H_
#define WEFT_COMM_UCX_CONTEXT_H_

#include <mpi.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/mpi_util.h"
#include "core/status.h"

namespace weft {
namespace comm {

Status UcsError(ucs_status_t status, const std::string& what);

class UcxContext {
 public:
  // Collective over `comm` the first time (worker addresses go through MPI).
  static StatusOr<UcxContext*> Get(MPI_Comm comm);
  static UcxContext* IfExists() { return instance_; }

  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }
  ucp_ep_h ep(int rank) const { return eps_[rank]; }
  // Starts the progress thread (the first UCX window does); idempotent.
  void StartProgressThread();

  // Waits for a request from a *_nbx call, driving the worker.
  Status Wait(ucs_status_ptr_t request, const char* what);
  Status Flush(int rank);
  // 64-bit atomic on rank's memory; `reply` (may be null) receives the old value.
  Status Atomic(int rank, ucp_atomic_op_t op, uint64_t value, uint64_t* reply,
                uint64_t address, ucp_rkey_h rkey, const char* what);

  // Tagged messages to or from `peer` (a request for Wait, or an error pointer). Messages
  // between two ranks are matched by a per-pair sequence number, so both sides post them
  // in the same order.
  ucs_status_ptr_t TagSend(int peer, const void* data, size_t bytes);
  ucs_status_ptr_t TagRecv(int peer, void* data, size_t bytes);

 private:
  void ProgressLoop();
  static void StopAtExit();

  static UcxContext* instance_;
  int rank_ = 0;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<ucp_ep_h> eps_;
  std::vector<uint64_t> sent_, received_;  // per-peer message counts (the tags)
  std::atomic<bool> stop_{false};
  // Threads inside Wait() drive the worker themselves; the progress thread stands back
  // meanwhile (competing for the worker's lock cost 100-1000 us per exchange on 2 cores).
  std::atomic<int> waiters_{0};
  std::thread progress_;
};

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_UCX_CONTEXT_H_
