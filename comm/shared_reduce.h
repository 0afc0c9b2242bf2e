// The shared-memory allreduce: when every rank of the job shares one machine, a fused group
// of allreduces (many tensors, each with its own input and output) sums through memory the
// ranks share instead of being packed into one buffer for MPI_Allreduce and unpacked after.
// The tensors are taken as one sequence of elements, in rounds of at most kRoundBytes:
//   1. each rank copies its inputs for the round into its own input area;
//   2. every rank counts itself in (a counter of its own, on its own cache line) and waits
//      until all have;
//   3. each rank sums one segment (1/n of the round) over every rank's input area, in rank
//      order, into its own result area (and divides it, for an average);
//   4. every rank counts itself in again and waits;
//   5. each rank copies every rank's result segment into its outputs.
// A rank writes its input area (1) only after every rank has summed the previous round (3 ->
// 4) and its result area (3) only after every rank has copied the previous round's (5 -> 2),
// so the two areas serve every round. Each segment is summed once, so every rank receives
// the same bits; a sum follows rank order, as a loop over the ranks would add. The rounds and
// their counters continue from op to op, which every rank runs in the same order.
//
// A rank that waits polls through a callback, so that another rank's one-sided op into its
// window, which may need its MPI progress, is not held up. There is no deadline: a rank
// that never arrives leaves the others waiting as MPI would, inside the op's transfers,
// where the engine's watchdog ends the job after WEFT_STALL_TIMEOUT_SECONDS. Pure code over a block
// of memory (a segment the ranks map, or a test's buffer). Internal to comm/.
#ifndef WEFT_COMM_SHARED_REDUCE_H_
#define WEFT_COMM_SHARED_REDUCE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"

namespace weft {
namespace comm {

class SharedReduce {
 public:
  static constexpr size_t kRoundBytes = size_t{1} << 20;
  // The memory `size` ranks share: zeroed before the first rank uses it.
  static size_t Footprint(int size);
  // This rank's view of that memory.
  SharedReduce(void* memory, int size, int rank);

  // One tensor of a fused group: `count` elements read from `in` and written to `out` (which
  // may be `in`; otherwise they must not overlap).
  struct Piece {
    const void* in;
    void* out;
    size_t count;
  };
  // Sums `pieces` element by element over every rank (the same counts on every rank, and
  // the same dtype), into their outputs; with `average`, divides the sums by the number of
  // ranks (as reduce.h's Divide). Every rank calls it for the same ops in the same order.
  // While it waits for other ranks, idle(since) runs between two polls (`since`: when the
  // wait began): spin.h's IdleWait, and whatever progress other ranks may need from this
  // one meanwhile.
  void Allreduce(const std::vector<Piece>& pieces, DType dtype, bool average,
                 const std::function<void(int64_t since)>& idle);

 private:
  char* input(int rank) const;
  char* result(int rank) const;
  // Counts this rank in for the next meeting, and waits until every rank has.
  void Meet(const std::function<void(int64_t since)>& idle);

  char* memory_;
  int size_, rank_;
  uint64_t meetings_ = 0;  // this rank's, so far
};

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_SHARED_REDUCE_H_
