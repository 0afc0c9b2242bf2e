// Small MPI helpers shared by comm/'s transports. Internal to comm/.
#ifndef WEFT_COMM_MPI_UTIL_H_
#define WEFT_COMM_MPI_UTIL_H_

#include <mpi.h>

#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace weft {
namespace comm {

// The predefined MPI type of `dtype`'s elements, or MPI_DATATYPE_NULL for the 16-bit
// floats, which have none.
MPI_Datatype BuiltinMpiType(DType dtype);
// The predefined MPI type to sum `dtype` with MPI_SUM (in MPI_Allreduce, MPI_Accumulate), or
// MPI_DATATYPE_NULL where weft must add the elements itself: the 16-bit floats (no MPI type),
// and the 8- and 16-bit integers, whose MPI_SUM Open MPI 4.1 gets wrong where the CPU has
// AVX: its op/avx component adds them with saturating vector instructions (in int8,
// 100 + 100 is 127 in the elements that fill whole vectors, -56 in the rest, where MPI
// defines MPI_SUM to wrap around as every other sum here does).
MPI_Datatype MpiSumType(DType dtype);
// OK for MPI_SUCCESS; otherwise an internal error naming `what` and MPI's text for the code.
Status MpiCheck(int code, const char* what);
// One pass of MPI's progress engine (a probe on MPI_COMM_SELF, where no message comes): what
// lets other ranks' one-sided ops into this rank's windows, which Open MPI's components may
// need this rank to drive, move while it waits outside MPI.
void MpiProgress();
// Every rank's `length` bytes at `data` (the lengths may differ), indexed by rank.
// Collective over `comm`: how transports publish their addresses.
StatusOr<std::vector<std::string>> AllgatherBytes(MPI_Comm comm, const void* data, size_t length);
// Whether MPI's own progress gives up the core when a poll finds nothing: Open MPI's
// mpi_yield_when_idle as MPI_Init left it (mpirun turns it on when it knows it oversubscribes
// a host), read through the MPI tool interface. False where MPI has no such variable. The
// first call takes about a quarter of a second (Open MPI 4.1); later ones return its answer.
bool MpiYieldsWhenIdle();

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_MPI_UTIL_H_
