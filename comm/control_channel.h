// How the engine's negotiation messages travel: descriptors from every rank to the
// coordinator (rank 0), and its responses back. Ranks on rank 0's machine exchange them
// through rings in shared memory, one each way per rank, which a poll reads with a load
// instead of a call into MPI; the others as MPI messages on the control communicator.
// Between two ranks, messages arrive whole and in the order they were sent, whichever way
// they go. Internal to comm/.
#ifndef WEFT_COMM_CONTROL_CHANNEL_H_
#define WEFT_COMM_CONTROL_CHANNEL_H_

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/agreement.h"
#include "comm/byte_ring.h"
#include "comm/shared_segment.h"

namespace weft {
namespace comm {

struct Context;  // engine.h

// Used by the thread making progress only.
class ControlChannel {
 public:
  // Collective over ctx.local on rank 0's machine (every rank there calls it; elsewhere it
  // returns at once): rank 0 makes one shared memory segment with the rings of every rank
  // of its machine, the others map it, and it is unlinked once all have. When any rank
  // there cannot, or WEFT_CONTROL_SHARED_MEMORY is off on one, all of them use MPI.
  static std::unique_ptr<ControlChannel> Open(const Context& ctx);
  ~ControlChannel();
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  // Ranks other than 0: queues descriptors for the coordinator.
  void SendToCoordinator(std::shared_ptr<const std::string> bytes);
  // Rank 0: queues the same responses for every other rank.
  void SendToAll(const std::shared_ptr<const std::string>& bytes);
  // Rank 0: one waiting message of descriptors, from any rank: its bytes and sender.
  bool ReceiveDescriptors(int* from, std::string* bytes);
  // Ranks other than 0: one waiting message of responses.
  bool ReceiveResponses(std::string* bytes);
  // Moves queued messages on; true when all have left (handed to MPI or written whole).
  // While a ring has no room for what is queued, enters MPI's progress too: its reader may
  // be inside MPI waiting for this rank (a one-sided op into one of its windows).
  bool Flush();
  // Flush, then whether nothing is left queued in the rings to `ranks` (every rank when
  // empty): whether they can have every message sent so far without this rank's help.
  bool Delivered(const std::vector<int32_t>& ranks);
  // Messages queued that have not all left.
  bool sending() const;
  // Whether a poll for messages (a Receive*) calls MPI: then MPI's own progress decides
  // whether the poll gives up the core (spin.h).
  bool polls_mpi() const { return rank_ == 0 ? mpi_peers_ : receivers_[0] == nullptr; }
  // When every rank of the job is on rank 0's machine and uses the shared segment: the
  // direct agreement of ops there (agreement.h); otherwise null.
  Agreement* agreement() const { return agreement_.get(); }

 private:
  ControlChannel(const Context& ctx);
  bool RingsIdle() const;  // nothing queued for any ring
  void SendMpi(int to, int tag, std::shared_ptr<const std::string> bytes);
  bool ReceiveMpi(int source, int tag, int* from, std::string* bytes);

  int rank_, size_;
  MPI_Comm comm_;
  std::unique_ptr<SharedSegment> segment_;  // the rings (and agreement), or null
  // By rank: the rings to and from rank 0 (on rank 0, every rank of its machine's; on the
  // others, their own), or none for ranks that use MPI.
  std::vector<std::unique_ptr<RingSender>> senders_;
  std::vector<std::unique_ptr<RingReceiver>> receivers_;
  std::vector<RingSender*> rings_out_;  // the non-null senders_, which Flush moves on
  std::vector<int> ring_ranks_;         // rank 0: the ranks with rings, polled in turn
  size_t next_ring_ = 0;    // rank 0: where the next poll starts (no rank waits behind another)
  bool mpi_peers_ = false;  // rank 0: some ranks use MPI
  bool mpi_first_ = false;  // rank 0: a ring's message came last, so MPI's turn is next
  std::vector<std::pair<MPI_Request, std::shared_ptr<const std::string>>> mpi_sends_;
  std::unique_ptr<Agreement> agreement_;  // in segment_
};

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_CONTROL_CHANNEL_H_
