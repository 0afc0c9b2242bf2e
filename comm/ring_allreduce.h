// weft's ring allreduce over a peer transport (peer_transport.h). Internal to comm/.
#ifndef WEFT_COMM_RING_ALLREDUCE_H_
#define WEFT_COMM_RING_ALLREDUCE_H_

#include <cstddef>
#include <vector>

#include "comm/peer_transport.h"
#include "core/status.h"
#include "core/tensor.h"

namespace weft {
namespace comm {

// Sums `buf` (count elements of dtype) in place over the ranks `members` (ranks of the
// transport, in ring order; this rank is members[me]): a reduce-scatter, then an
// allgather. There are 2 (n - 1) steps; in step t every rank receives one segment (1/n of
// the buffer) from the previous rank, and what it received in step t it sends on to the
// next rank in step t + 1: summed with its own part during the reduce-scatter, as it is
// during the allgather. Each link carries 2 (n - 1) / n of the buffer, the least any
// allreduce sends. The segments travel in chunks of `chunk_bytes`, each forwarded as soon
// as it is ready, so the steps overlap. `scratch` holds two incoming segments. Every
// transfer has completed when it returns (the transport's WaitAll), also on error.
Status RingAllreduceSum(PeerTransport& transport, const std::vector<int>& members, int me,
                        void* buf, size_t count, DType dtype, size_t chunk_bytes,
                        std::vector<char>* scratch);

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_RING_ALLREDUCE_H_
