// How the engine's own algorithms move bytes between two ranks of the data communicator:
// the neighbor exchanges (neighbor_allreduce, pair_gossip) and the ring allreduce. One
// interface, three implementations, chosen by WEFT_EXCHANGE_TRANSPORT:
// - mpi: MPI point-to-point (MPI_Isend / MPI_Irecv);
// - ucx: UCX tagged messages (builds with UCX);
// - tcp: weft's own TCP connections (tcp_transport.h).
// MakePeerTransport is the one place that knows which exist in this build. Internal to
// comm/.
#ifndef WEFT_COMM_PEER_TRANSPORT_H_
#define WEFT_COMM_PEER_TRANSPORT_H_

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "core/status.h"

namespace weft {
namespace comm {

enum class PeerTransportKind { kMpi, kUcx, kTcp };
// WEFT_EXCHANGE_TRANSPORT: mpi, ucx or tcp; auto (the default) is tcp when the job spans
// several machines and mpi otherwise. `machine_size` is the job's number of machines.
PeerTransportKind ExchangeTransport(int machine_size);

class PeerTransport {
 public:
  using Ticket = size_t;
  virtual ~PeerTransport() = default;

  virtual PeerTransportKind kind() const = 0;
  // The timeline's backend label: "MPI", "UCX" or "TCP".
  virtual const char* name() const = 0;

  // Start sending `bytes` from `data` to `peer` (a rank of the data communicator), or
  // receiving `bytes` from it into `data`; the buffer must stay untouched (send) or
  // unread (receive) until the transfer completes in Wait or WaitAll. Between two ranks,
  // messages are matched in the order they were posted: both sides post the same sequence
  // (the engine runs its ops in the same order on every rank). A transfer to oneself is an
  // error.
  virtual StatusOr<Ticket> Send(int peer, const void* data, size_t bytes) = 0;
  virtual StatusOr<Ticket> Recv(int peer, void* data, size_t bytes) = 0;
  // Waits until that transfer has completed, making progress on every transfer meanwhile.
  virtual Status Wait(Ticket ticket) = 0;
  // Waits for every transfer posted since the last WaitAll, even after an error (no buffer
  // is referred to once it returns), and starts a new series of tickets. The first error.
  virtual Status WaitAll() = 0;
  // After an op failed partway, the transfers it skipped leave `peer`'s stream out of step:
  // a transport whose later messages would pair with them (TCP: a byte stream) stops using
  // the pair, so that the peer's next transfer fails too instead of reading the wrong
  // bytes. MPI and UCX fail the whole job on a transfer error, so they need nothing.
  virtual void Abandon(int peer, const std::string& why) {}
};

// Collective over `data` (every rank, at init): tcp and ucx connect the ranks here.
// `stall_timeout_s` gives WEFT_STALL_TIMEOUT_SECONDS (tcp fails stalled transfers after it).
StatusOr<std::unique_ptr<PeerTransport>> MakePeerTransport(PeerTransportKind kind, MPI_Comm data,
                                                           std::function<double()> stall_timeout_s);

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_PEER_TRANSPORT_H_
