// weft's ring allreduce over a peer transport (peer_transport.h). Internal to comm/.
#ifndef WEFT_COMM_RING_ALLREDUCE_H_
#define WEFT_COMM_RING_ALLREDUCE_H_

#include <cstddef>
#include <vector>

#include "comm/peer_transport.h"
#include "core/aligned.h"
#include "core/status.h"
#include "core/tensor.h"

namespace weft {
namespace comm {

// Sums `in` (count elements of dtype) over the ranks `members` (ranks of the transport, in ring
// order; this rank is members[me]) into `out`: a reduce-scatter, then an allgather. `in` == `out`
// is in place; otherwise `in` is only read and `out` must not overlap it, and no step copies the
// input (the first sums read it where it is). There are 2 (n - 1) steps; in step t every rank
// receives one segment (1/n of the buffer) from the previous rank, and what it received in step t
// it sends on to the next rank in step t + 1: summed with its own part during the reduce-scatter,
// as it is during the allgather. Each link carries 2 (n - 1) / n of the buffer, the least any
// allreduce sends. The segments travel in chunks of `chunk_bytes`, each forwarded as soon as it is
// ready, so the steps overlap. In place, `scratch` holds two incoming segments; out of place, each
// arrives in the output segment its sum overwrites. Every transfer has completed when it returns
// (the transport's WaitAll), also on error.
Status RingAllreduceSum(PeerTransport& transport, const std::vector<int>& members, int me,
                        const void* in, void* out, size_t count, DType dtype, size_t chunk_bytes,
                        AlignedVector<char>* scratch);

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_RING_ALLREDUCE_H_
