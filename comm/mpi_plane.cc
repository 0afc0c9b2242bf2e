// The data plane for host memory: MPI collectives, and weft's own algorithms (neighbor
// exchanges, pair gossip, the hierarchical op, the ring allreduce) over the peer transport.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "comm/data_plane.h"
#include "comm/mpi_util.h"
#include "comm/reduce.h"
#include "comm/ring_allreduce.h"
#include "comm/shared_collectives.h"
#include "comm/shared_segment.h"
#include "comm/spin.h"
#include "comm/tuner.h"
#include "core/aligned.h"
#include "core/config.h"
#include "core/logging.h"

namespace weft {
namespace comm {
namespace {

// Memory an op takes this rank's part into when its output allocator failed (RunAllgather
// says why), freed when the op returns.
class ScratchOutput {
 public:
  // At least `bytes` bytes, or null if there are none to be had.
  char* Take(size_t bytes) {
    memory_.reset(new (std::nothrow) char[std::max<size_t>(bytes, 1)]);
    return memory_.get();
  }
  // Leaves the memory allocated for good: a transfer MPI could not take back may still
  // write into it.
  void Abandon() { (void)memory_.release(); }

 private:
  std::unique_ptr<char[]> memory_;
};

// Allocates the output of `r` (dtype, shape, device agreed) with its allocator into r.out;
// on failure leaves r.out alone and returns why. The op still takes this rank's part then
// (RunAllgather says why), into no output or scratch memory.
Status TakeOutput(Request& r, DType dtype, const std::vector<int64_t>& shape,
                  const Device& device) {
  auto out = r.alloc(dtype, shape);
  const Status allocated = CheckAllocated(out, dtype, shape, device);
  if (allocated.ok()) r.out = *out;
  return allocated;
}

// A failed allocator's error, where not even scratch memory was to be had to take this
// rank's part: the op's other ranks may then wait for it (WEFT_STALL_TIMEOUT_SECONDS).
Status NoScratch(const Status& allocated, size_t bytes) {
  return Status(allocated.code(),
                absl::StrCat(allocated.message(), "; no scratch memory either (", bytes,
                             " bytes) to take this rank's part, so the op's other ranks may wait "
                             "for it"));
}

// Cancels a posted receive and waits for it to end (cancelled, or completed by a message
// already on its way), a second at most: whether MPI is done with its buffer.
bool Withdraw(MPI_Request* req) {
  if (MPI_Cancel(req) != MPI_SUCCESS) return false;
  const int64_t since = Timeline::NowMicros();
  for (;;) {
    int finished = 0;
    if (MPI_Test(req, &finished, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (finished) return true;
    if (Timeline::NowMicros() - since > 1000000) return false;
    IdleWait(since, /*polled_mpi=*/true);
  }
}

constexpr int kDataTag = 3;
// Tags from here on number the sends and receives between a pair (MpiPlane::sends_to_).
constexpr int kPairTagBase = 16;
// Counts passed to MPI are ints; larger buffers go in chunks of this many elements.
constexpr size_t kMaxChunk = 1u << 30;

MPI_Datatype g_half = MPI_DATATYPE_NULL;
MPI_Datatype g_bfloat = MPI_DATATYPE_NULL;
MPI_Op g_sum = MPI_OP_NULL;  // weft's own sum (SumOp)
std::once_flag g_types_once;

// The dtype of the MPI types AllreduceSum passes with g_sum (MpiType, SumOp).
DType SumDType(MPI_Datatype type) {
  if (type == g_half) return DType::kFloat16;
  if (type == g_bfloat) return DType::kBFloat16;
  if (type == MPI_INT8_T) return DType::kInt8;
  if (type == MPI_UINT8_T) return DType::kUInt8;
  if (type == MPI_INT16_T) return DType::kInt16;
  // A reduction cannot fail: summing bytes of unknown meaning would be a silent wrong result.
  std::fprintf(stderr, "weft: internal error: weft's MPI sum got a type it does not know\n");
  std::abort();
}

void Sum(void* in, void* inout, int* len, MPI_Datatype* type) {
  AddInPlace(inout, in, SumDType(*type), static_cast<size_t>(*len));
}

void InitTypes() {
  std::call_once(g_types_once, [] {
    MPI_Type_contiguous(2, MPI_BYTE, &g_half);
    MPI_Type_commit(&g_half);
    MPI_Type_contiguous(2, MPI_BYTE, &g_bfloat);
    MPI_Type_commit(&g_bfloat);
    MPI_Op_create(&Sum, /*commute=*/1, &g_sum);
  });
}

MPI_Datatype MpiType(DType dtype) {
  if (dtype == DType::kFloat16) return g_half;
  if (dtype == DType::kBFloat16) return g_bfloat;
  return BuiltinMpiType(dtype);
}

// MPI_SUM, or weft's own sum for the dtypes MPI_SUM cannot take (MpiSumType).
MPI_Op SumOp(DType dtype) { return MpiSumType(dtype) == MPI_DATATYPE_NULL ? g_sum : MPI_SUM; }

// Sums `in` over `comm` into `out`; in == out is in place.
Status AllreduceSum(const void* in, void* out, size_t count, DType dtype, MPI_Comm comm) {
  const size_t item = DTypeSize(dtype);
  for (size_t done = 0; done < count; done += kMaxChunk) {
    const int n = static_cast<int>(std::min(kMaxChunk, count - done));
    char* dst = static_cast<char*>(out) + done * item;
    const void* src = in == out ? MPI_IN_PLACE : static_cast<const char*>(in) + done * item;
    WEFT_RETURN_IF_ERROR(
        MpiCheck(MPI_Allreduce(src, dst, n, MpiType(dtype), SumOp(dtype), comm), "MPI_Allreduce"));
  }
  return OkStatus();
}

const config::IntSetting kRingAllreduceBytes(
    "WEFT_RING_ALLREDUCE_BYTES", -1,
    "CPU allreduces of at least this many bytes run weft's ring over the peer transport "
    "(WEFT_EXCHANGE_TRANSPORT) instead of MPI_Allreduce: every one when the job spans several "
    "machines; on one machine, over the mpi transport, only an unfused op whose output is not "
    "its input on any rank. -1: across machines 256 KiB over tcp and 8 MiB over mpi or ucx, "
    "on one machine 128 KiB per rank of the op, except never for an op that sums through "
    "shared memory (WEFT_SHARED_MEMORY_BYTES); 0: always MPI_Allreduce. Every rank must see "
    "the same value.",
    /*min=*/-1, /*max=*/int64_t{1} << 50, config::Agreement::kSameOnEveryRank);

// Whether an allreduce of `bytes` over `members` ranks runs weft's ring. Across machines,
// over weft's TCP transport the ring reached 0.90 of a 1 Gbit/s link from 256 KiB up
// (MPI_Allreduce: 0.09); over MPI it gained only from 8 MiB. On one machine MPI_Allreduce
// is as fast in place, but out of place Open MPI first copies the whole input into the
// output, while the ring reads the input where it is and receives into the output: as fast
// as in place from 2 MiB, faster below, and 1.4-1.7x faster than MPI's out-of-place
// allreduce at 8-16 MiB on 2 ranks (bench/README.md). An op that can sum through shared
// memory (`shared`) is faster there still, in place or not: 2 ranks at every size, 4 ranks
// sharing 2 cores 1.1-1.7x out of place from 512 KiB to 16 MiB.
bool UseRing(PeerTransportKind kind, int machines, int members, size_t bytes, bool out_of_place,
             bool shared) {
  if (members <= 1) return false;
  if (machines == 1 && !(out_of_place && kind == PeerTransportKind::kMpi)) return false;
  int64_t threshold = kRingAllreduceBytes.Get();
  if (threshold < 0) {
    if (machines == 1) {
      if (shared) return false;
      threshold = (int64_t{128} << 10) * members;
    } else {
      threshold = kind == PeerTransportKind::kTcp ? int64_t{256} << 10 : int64_t{8} << 20;
    }
  }
  return threshold > 0 && bytes >= static_cast<uint64_t>(threshold);
}

const config::IntSetting kSharedMemoryBytes(
    "WEFT_SHARED_MEMORY_BYTES", -1,
    "When every rank of the job is on one machine, allreduces (that do not run weft's ring), "
    "broadcasts, allgathers and neighbor allreduces over all of them of up to this many bytes (a "
    "fused group: all of its tensors; an allgather: its output) run through memory the ranks "
    "share, reading each input and writing each output where it is (no fusion buffer), instead "
    "of MPI's collectives and point-to-point messages. -1: 512 KiB (allgathers: 16 KiB, 128 KiB "
    "where the machine's ranks outnumber its CPUs, where larger ones read the other ranks' "
    "memory instead, WEFT_CROSS_MEMORY_ATTACH_BYTES; broadcasts of one tensor: under 128 KiB "
    "there), but any size (save the allgathers, broadcasts and the allreduces of 64 KiB or more "
    "that reach the other ranks' memory instead) when the machine's ranks outnumber its CPUs, "
    "and for allreduces (large ones may run another way instead: WEFT_TUNE_WAYS) and the other "
    "broadcasts when the job has two ranks; neighbor allreduces: up to 64 KiB (8 KiB where ranks "
    "have a CPU each and larger ones read the other ranks' memory), and those of more than 4 MiB "
    "that do not read the other ranks' memory (WEFT_CROSS_MEMORY_ATTACH_BYTES); 0: never. Every "
    "rank must see the same value.",
    /*min=*/-1, /*max=*/int64_t{1} << 50, config::Agreement::kSameOnEveryRank);

const config::IntSetting kSharedMemoryStream(
    "WEFT_SHARED_MEMORY_STREAM", -1,
    "How the collectives through shared memory copy tensors of under 16 KiB into the memory "
    "the ranks share: 0 with plain stores, 1 with non-temporal stores (faster where the "
    "ranks' CPUs take cache lines from each other slowly, slower where they share a cache); "
    "-1: rank 0 times both now and then, and every rank follows its choice.",
    /*min=*/-1, /*max=*/1);

const config::IntSetting kCrossMemoryAttachBytes(
    "WEFT_CROSS_MEMORY_ATTACH_BYTES", -1,
    "When every rank of the job is on one machine: allgathers over all of them of up to this "
    "many bytes (their output) that do not go through shared memory copy each other rank's part "
    "straight from that rank's input into the output with process_vm_readv (Linux's cross-memory "
    "attach), where init() found that the ranks may read each other's memory, instead of running "
    "MPI's allgather; so do neighbor allreduces of up to this many bytes (a fused group: all of "
    "its tensors) over the default exchange transport that do not go through shared memory (from "
    "4 KiB), instead of MPI's sends and receives, and broadcasts of one tensor over all of them, "
    "of 128 KiB up to this many bytes (the others copy the root's input into their outputs), "
    "instead of going through shared memory or MPI's broadcast. -1: 2 MiB for allgathers (no "
    "limit where the machine's ranks outnumber its CPUs), 4 MiB for neighbor allreduces, no "
    "limit for broadcasts; 0: never. Each needs the shared memory segment (not mapped when "
    "WEFT_SHARED_MEMORY_BYTES is 0 at init()). While it is not 0 and WEFT_SHARED_MEMORY_BYTES is "
    "-1, allgathers of more than 16 KiB (128 KiB where the machine's ranks outnumber its CPUs), "
    "broadcasts of one tensor of 128 KiB or more, and neighbor allreduces of more than 64 KiB "
    "(8 KiB where ranks have a CPU each) up to this limit, go this way rather than through "
    "shared memory; larger neighbor allreduces go through shared memory. Where the machine's "
    "ranks outnumber its CPUs, allreduces of one CPU tensor over all of them of 64 KiB up to "
    "this many bytes (-1: no limit) sum their slices from the others' inputs and write the sums "
    "into the others' outputs with process_vm_writev, rather than going through shared memory "
    "(unless WEFT_SHARED_MEMORY_BYTES is set at least as high, or WEFT_RING_ALLREDUCE_BYTES is "
    "set). A read or write that fails (another rank's process gone) fails the op on every rank. "
    "Allreduces of 16 KiB or more of a job of two ranks with a CPU each may go that way too, "
    "this limit aside, where this is not 0 at init() (WEFT_TUNE_WAYS). The allreduces go this "
    "way only where init() found that every rank can write the others' memory as well as read "
    "it. Every rank must see the same value.",
    /*min=*/-1, /*max=*/int64_t{1} << 50, config::Agreement::kSameOnEveryRank);

const config::BoolSetting kTuneWays(
    "WEFT_TUNE_WAYS", true,
    "Where a job of two ranks with a CPU each runs on one machine: rank 0 times the allreduces "
    "of one CPU tensor of 16 KiB or more (1 MiB where the third way below cannot run: "
    "WEFT_CROSS_MEMORY_ATTACH_BYTES 0 at init(), or ranks that cannot write each other's memory) "
    "over both ranks, in place and out of place apart, through the memory the ranks share, "
    "through MPI (in place its allreduce, out of place weft's ring over MPI's messages where the "
    "exchange transport is mpi and WEFT_RING_ALLREDUCE_BYTES lets it) and (where the ranks can "
    "reach each other's memory) by reading the other rank's tensor where it is and writing the "
    "sums into its output, and both ranks run each such allreduce the way rank 0 picked for it: "
    "an op's time runs from the first rank's start to the last one's end; for each size "
    "(doubling from 16 KiB; one choice for 128 MiB and more) rank 0 runs the shared memory, "
    "tries each other way for 5 ops after 5 of the chosen one, keeps the way whose last ops took "
    "less (the middle of up to 4, the first 2 after a change not counted), and then tries "
    "another way in turn after 256 ops (twice as long after each later trial that changes "
    "nothing, up to 4096), ending a trial at an op 1.3x as costly as the chosen way. Blocking or "
    "lone allreduces only (the ranks agree on those without the coordinator; fused groups, "
    "process sets and ops the coordinator answers go through shared memory), and only while "
    "WEFT_SHARED_MEMORY_BYTES is -1; while on, such allreduces do not write their first round "
    "ahead, and one in place on some ranks only is agreed by the coordinator (and goes through "
    "shared memory). Every way gives the same bits. 0: always through shared memory. Every rank "
    "must see the same value.",
    config::Agreement::kSameOnEveryRank);

// Allreduces whose way rank 0 picks by timing (WEFT_TUNE_WAYS) are of at least this many
// bytes, one tuner per doubling of the size from here (kTunedSizes of them, the last for
// every larger size, 128 MiB and more), in place and out of place apart. Which way wins
// depends on the machine: on 2 ranks with a CPU each, MPI's in-place allreduce
// (reduce-scatter then allgather, each half read from the other process with
// process_vm_readv) took 0.73-0.93x the shared memory's time from 2 to 16 MiB on one Intel
// Xeon VM, where an AMD EPYC VM had the shared memory ahead at every size. weft's own sums
// by direct access (SharedCollectives::AllreduceDirect), once they wrote their sums into
// the other rank's output instead of having it read them, beat both from 16 KiB on a later
// Intel Xeon VM, in place and out of place (the shared memory's time over theirs: 1.2-1.4x
// at 16 KiB, 1.7-2.4x from 128 KiB to 2 MiB: bench/README.md, "Allreduces: writing the
// sums into the other rank's output"); at 8 KiB the segment was slightly faster (2.9-3.1
// us against 3.1-3.5). Timing each op costs rank 0 nothing measurable there (tuned against
// always direct, 16 KiB to 1 MiB: the same).
constexpr size_t kTunedAllreduceFromBytes = size_t{16} << 10;
constexpr int kTunedSizes = 14;
// Where the direct way cannot run (the ranks cannot write each other's memory), tuning
// starts here: below it the segment beat MPI's allreduce on both VMs, and a tuned op gives
// up writing its first round into the segment ahead.
constexpr size_t kTunedWithoutDirectFromBytes = size_t{1} << 20;
// The ways of a tuned allreduce, as the tuner numbers them.
enum AllreduceWay : int { kWaySegment = 0, kWayMpi = 1, kWayDirect = 2 };
// Each tuner takes each op's span over the ranks (RunAllreduce), tries each other way for 5
// ops after 5 of the chosen one, then another in turn after 256, waiting twice as long
// after each later trial that changes nothing (up to 4096 ops), and ends a trial at once at
// an op 1.3x as costly as the chosen way: a trial of a much slower way (MPI's from 32 MiB in
// place, 1.5-1.7x the shared memory's time) costs little. The first 2 ops after a change
// are not counted: at 16 KiB the direct way's second op after one took 4.1-4.4 us, against
// 2.6-2.8 later. A way's cost is the middle of its last 4 ops, which one lucky op does not
// move. A way whose op failed (the direct access, once the kernel stops letting a rank
// reach the other's memory) is not picked again.
Tuner WayTuner(int ways) {
  return Tuner(/*period=*/256, /*trial=*/5, /*max_period=*/4096, /*give_up=*/1.3, ways,
               /*warmup=*/2);
}

// The direct reads' limits where WEFT_CROSS_MEMORY_ATTACH_BYTES is -1. With the direct
// agreement standing for their first meeting, on 2 ranks with a CPU each the allgathers'
// beat MPI_Allgather up to 2 MiB and lost from 4 MiB (four runs of six), while the neighbor
// exchanges' beat the transport at 4 MiB in every run (1.0-1.1x the raw exchange against
// 0.8-0.97x); past that both ways moved with the machine's noise (bench/README.md).
constexpr int64_t kDirectAllgatherBytes = int64_t{2} << 20;
// Where the machine's ranks outnumber its CPUs, 4 ranks on 2 CPUs, the allgathers' direct
// reads took 0.6-0.8x the segment's time from 256 KiB to 16 MiB (and beat MPI's allgather
// there) and matched both at 32 and 64 MiB: no limit there.
constexpr int64_t kDirectAllgatherSharedCpusBytes = std::numeric_limits<int64_t>::max();
constexpr int64_t kDirectExchangeBytes = int64_t{4} << 20;
// Where the machine's ranks outnumber its CPUs, allreduces of one tensor over every rank
// of 64 KiB or more sum their slices from the others' inputs and write the sums into the
// others' outputs (SharedCollectives::AllreduceDirect) instead of going through the
// segment. On 4 ranks sharing 2 CPUs (comm_bench, three runs alternating) in place took
// 22.6-23.1 us against the segment's 27.3-27.5 at 64 KiB, 194-196 against 330-337 at 1 MiB
// and 6.1-6.4 ms against 11.5-11.6 at 32 MiB, out of place 22-30 us against 27-34, 230-231
// against 346-351 and 10.5-12.5 ms against 13.5-13.8; at 32 KiB the segment was faster in
// place (17.0-18.1 us against 19.2-21.1).
constexpr size_t kDirectAllreduceSharedCpusFromBytes = size_t{64} << 10;
constexpr int64_t kDirectAllreduceSharedCpusBytes = std::numeric_limits<int64_t>::max();
// A broadcast read where the root has it copies it once (by each reader) where the segment
// copies it twice (by the root in, by each reader out). On 2 ranks with a CPU each that took
// 0.42-0.74x the segment's time from 256 KiB to 64 MiB and 0.79-0.84x at 128 KiB, but
// 1.2-1.3x at 64 KiB (the two meetings and the system call), so it takes broadcasts from
// 128 KiB, of any size (bench/README.md, "Broadcasts: reading the root's memory"). So too
// where 4 ranks share 2 CPUs: 0.4-0.7x the segment's time from 256 KiB to 16 MiB, and at
// 128 KiB faster in five runs of seven.
constexpr int64_t kDirectBroadcastBytes = std::numeric_limits<int64_t>::max();
constexpr size_t kDirectBroadcastFromBytes = size_t{128} << 10;
// Whether an op of `bytes` may read the other ranks' memory where they are, up to the
// setting, or `default_limit` when it is -1.
bool UseDirectReads(size_t bytes, int64_t default_limit) {
  int64_t limit = kCrossMemoryAttachBytes.Get();
  if (limit < 0) limit = default_limit;
  return bytes <= static_cast<uint64_t>(limit);
}

// Whether every rank of `local` (every rank of the job, `rank` among them) can read every
// other's memory with process_vm_readv: each tries a word of each other's, and they agree.
// On success `pids` holds each rank's process, and `writes` whether every rank can also
// write every other's memory with process_vm_writev (each writes back the word it read;
// the kernel asks the same of both calls, but a seccomp filter may allow one alone).
// Collective over `local`.
bool ProbeDirectReads(MPI_Comm local, int size, int rank, std::vector<int64_t>* pids,
                      bool* writes) {
  // What each rank's word holds: its process id, scrambled, so that a read of the wrong
  // process or address shows.
  auto expected = [](int64_t pid) { return static_cast<uint64_t>(pid) * 0x9e3779b97f4a7c15u; };
  const int64_t me = getpid();
  volatile uint64_t word = expected(me);
  const int64_t post[2] = {me, static_cast<int64_t>(reinterpret_cast<uintptr_t>(&word))};
  std::vector<int64_t> posts(2 * size);
  // Whether this rank could read, and write, every other's word.
  int ok[2] = {
      MPI_Allgather(post, 2, MPI_INT64_T, posts.data(), 2, MPI_INT64_T, local) == MPI_SUCCESS, 1};
  for (int r = 0; ok[0] && r < size; ++r) {
    if (r == rank) continue;
    uint64_t got = 0;
    void* at = reinterpret_cast<void*>(static_cast<uintptr_t>(posts[2 * r + 1]));
    ok[0] = ReadProcessMemory(posts[2 * r], at, &got, sizeof(got)).ok() &&
            got == expected(posts[2 * r]);
    ok[1] = ok[1] && ok[0] && WriteProcessMemory(posts[2 * r], &got, at, sizeof(got)).ok();
  }
  // Every rank has read and written before any leaves the allreduce: `word` outlives them.
  int all[2] = {0, 0};
  if (MPI_Allreduce(ok, all, 2, MPI_INT, MPI_MIN, local) != MPI_SUCCESS) return false;
  if (all[0] != 1) return false;
  pids->resize(size);
  for (int r = 0; r < size; ++r) (*pids)[r] = posts[2 * r];
  *writes = all[1] == 1;
  return true;
}

// Whether an op of `bytes` over every rank runs through shared memory; `any_size`: by
// default whatever its size. Where 4 ranks share 2 CPUs every op ran faster through shared
// memory than through Open MPI at every size measured (512 KiB to 32 MiB: allgather
// 0.98-3.32x MPI's speed, broadcast 1.44-4.04x, with and without weftrun's malloc settings);
// so did two ranks with a CPU each for allreduces and broadcasts (up to 16 and 64 MiB).
// Their allgathers, which copy each part twice through the segment where Open MPI copies it
// once from the other rank's buffer, lost from 1 MiB where the buffers sit on huge pages
// (weftrun's settings: 0.57-0.86x against 0.88-1.02 through MPI) and won where they do not
// (1.06-1.74x against 0.92-1.09), so they keep 512 KiB, as do jobs of more ranks with a CPU
// each, which were not measured (bench/README.md). Where the ranks can read each other's
// memory, reading each part once from its rank's buffer (AllgatherDirect) beat the segment
// from 32 KiB on two ranks with a CPU each (kDirectAllgatherOwnCpusAboveBytes; and MPI's
// allgather up to 2 MiB), and on 4 ranks sharing 2 CPUs at every size from 256 KiB (see
// kDirectAllgatherSharedCpusBytes), so their allgathers keep a lower `default_limit`
// instead, as do neighbor allreduces (their own measurements below) and broadcasts of one
// tensor (kDirectBroadcastFromBytes).
constexpr int64_t kSharedMemoryDefaultBytes = int64_t{512} << 10;
bool UseSharedMemory(size_t bytes, bool any_size,
                     int64_t default_limit = kSharedMemoryDefaultBytes) {
  int64_t limit = kSharedMemoryBytes.Get();
  if (limit < 0) limit = any_size ? std::numeric_limits<int64_t>::max() : default_limit;
  return bytes <= static_cast<uint64_t>(limit);
}

// Neighbor allreduces of up to this many bytes go through shared memory unless
// WEFT_SHARED_MEMORY_BYTES says otherwise: one copy into the segment and one meeting, where
// Open MPI sends eagerly up to 4 KiB and reads the other process's memory after a
// handshake from there. Against MPI and the direct reads below they gained up to 64 KiB (on
// 2 ranks with a CPU each 2.1-2.6x at 4-8 KiB), and at 128 KiB lost on 2 ranks for a
// one-peer schedule while 4 ranks sharing 2 CPUs still gained; from 512 KiB they lost
// (bench/README.md).
constexpr int64_t kSharedExchangeBytes = int64_t{64} << 10;
// Where ranks have a CPU each and the direct reads below can take the op, they keep only up
// to 8 KiB: since the direct agreement stands for the direct reads' first meeting, those
// beat the segment from 16 KiB on 2 ranks (comm_bench, eleven runs alternating of one or
// both neighbor ops): 4.3-5.3 us against 5.3-5.8 at 16 KiB, 5.8-7.3 against 8.3-9.3 at 32
// KiB, 9.1-10.7 against 11.2-12.7 at 64 KiB (one run disturbed: 7.4 and 10.0), even at 8
// KiB. On 4 ranks sharing 2 CPUs they lost at 8-16 KiB (8 KiB: 12-31 us against 9.5-15),
// so 64 KiB stays there.
constexpr int64_t kSharedExchangeOwnCpusBytes = int64_t{8} << 10;
// Neighbor allreduces past that limit, of at least this many bytes (and up to
// WEFT_CROSS_MEMORY_ATTACH_BYTES), read their peers' inputs where they are, where they can
// (the floor matters where WEFT_SHARED_MEMORY_BYTES is set lower). Below it Open MPI sends
// eagerly (its shared-memory transport's eager limit is 4 KiB), in about 1 us on 2 ranks,
// where the two meetings and the system call take about 3.5 us more (bench/README.md); from
// it Open MPI also reads the other process's memory, after a handshake of its own.
constexpr size_t kDirectExchangeFromBytes = size_t{4} << 10;
// Neighbor allreduces of more than this many bytes (the direct reads' default limit) that
// the direct reads do not take go through shared memory again, unless
// WEFT_SHARED_MEMORY_BYTES says otherwise, instead of Open MPI's sends and receives. Past
// the caches both of the other ways read each peer's whole input into a receive buffer and
// then combine it, a round trip through memory per peer that the segment's rounds leave
// out (each half is combined while it is still in the cache): from 8 MiB to 64 MiB the raw
// exchange's time over weft's went from 0.85-1.24 to 0.95-2.31 on 2 ranks with a CPU each,
// and from 0.65-1.22 to 1.19-2.44 on 4 ranks sharing 2 CPUs; at 4 MiB and below the direct
// reads were as fast or faster (bench/README.md).
constexpr int64_t kSharedExchangeAboveBytes = kDirectExchangeBytes;
// Allgathers of more than this many bytes read the others' parts where they are, where
// they can, unless WEFT_SHARED_MEMORY_BYTES says otherwise (UseSharedMemory): where the
// machine's ranks outnumber its CPUs, 128 KiB (on 4 ranks sharing 2 CPUs the segment was
// faster up to 64 KiB and even at 128 KiB); where ranks have a CPU each, 16 KiB: on 2 ranks
// (three runs alternating) the direct reads took 3.4-3.6 us against the segment's 4.6-4.8 at
// 32 KiB, 4.4-5.0 against 7.8-7.9 at 64 KiB and 6.1-7.2 against 10.2-12.8 at 128 KiB (as
// fast as MPI_Allgather), were even at 16 KiB and lost below (2.4-3.7 us against 1.4-2.6).
constexpr int64_t kDirectAllgatherAboveBytes = int64_t{128} << 10;
constexpr int64_t kDirectAllgatherOwnCpusAboveBytes = int64_t{16} << 10;

// A group's tensors for SharedCollectives (whose timeline names they now take).
std::vector<SharedCollectives::Piece> SharedPieces(Group& group) {
  std::vector<SharedCollectives::Piece> pieces;
  pieces.reserve(group.size());
  for (auto& r : group) {
    pieces.push_back({r->in.data(), r->out.data(), static_cast<size_t>(r->out.numel())});
    r->backend = "SHM";
  }
  return pieces;
}

// The ring moves segments in chunks of this size: a chunk goes on to the next rank as soon
// as it has arrived (and been summed), so every link stays busy.
constexpr size_t kRingChunkBytes = size_t{256} << 10;
// Neighbor exchanges move their messages in chunks of this size, and the receiver combines
// each chunk as soon as it has arrived from every in-neighbor, while the rest travels.
constexpr size_t kExchangeChunkBytes = size_t{1} << 20;

Status Bcast(void* buf, size_t bytes, int root, MPI_Comm comm) {
  for (size_t done = 0; done < bytes; done += kMaxChunk) {
    const int n = static_cast<int>(std::min(kMaxChunk, bytes - done));
    WEFT_RETURN_IF_ERROR(
        MpiCheck(MPI_Bcast(static_cast<char*>(buf) + done, n, MPI_BYTE, root, comm), "MPI_Bcast"));
  }
  return OkStatus();
}

class MpiPlane : public HostPlane {
 public:
  // Collective over ctx.local (the segment of the collectives through shared memory).
  MpiPlane(const Context& ctx, Timeline* timeline, PeerTransport* peers,
           std::function<void(int64_t since)> idle);

  std::optional<Status> Run(const Response& response, Group& group) override;
  StatusOr<MPI_Comm> CommOf(const std::vector<int32_t>& ranks) override;
  void Close() override;
  bool MeetsFirst(const Response& response, const Group& group) const override;
  Staged Stage(Request& r, bool tuned) override;
  int Preference(const Request& r) override;

 private:
  // Whether rank 0 picks the way of the op `r` by timing (kTuneWays, AllreduceWay); every
  // rank answers alike. Way 0 is the default one.
  bool Tuned(const Request& r) const;
  // The tuner of ops of `bytes`, in place or not (kTunedSizes of each).
  Tuner& TunerFor(bool in_place, size_t bytes);
  // Rank 0: gives the tuner last_timed_'s span where every rank's times are there.
  void RecordLastTimed();
  // Whether allreduces and broadcasts through shared memory take any size by default
  // (UseSharedMemory).
  bool AnySize() const { return ctx_.size == 2 || ctx_.oversubscribed; }
  // How an allreduce of `group` runs: through the shared segment (`shared` and not
  // `ring`), weft's ring, by reading the other ranks' memory (`direct`), or MPI_Allreduce.
  struct AllreducePath {
    bool shared, ring;
    bool direct = false;
  };
  AllreducePath AllreducePathOf(const Response& response, const Group& group) const;
  // Whether an allreduce (unless it runs the ring) of `bytes` over every rank (`whole`) or
  // a process set runs through the shared segment.
  bool SegmentTakes(size_t bytes, bool whole) const;
  // Whether an allreduce that rank 0 does not tune, of `bytes` over every rank (`whole`),
  // of one tensor (`lone`) on the host (`cpu`), reads the other ranks' memory by default.
  bool DirectAllreduceTakes(size_t bytes, bool whole, bool lone, bool cpu) const;
  // How a broadcast of `bytes` over every rank (`whole`) or a process set runs: through the
  // shared segment, read by the others from the root's memory (`lone`: of one tensor only),
  // or MPI_Bcast. Every rank of the op answers alike.
  enum class BroadcastWay { kShared, kDirect, kMpi };
  BroadcastWay BroadcastWayOf(size_t bytes, bool whole, bool lone) const;
  BroadcastWay BroadcastWayOf(const Group& group) const;
  // How an allgather of `total` bytes of output over every rank runs.
  enum class GatherWay { kShared, kDirect, kMpi };
  GatherWay AllgatherWay(size_t total) const;
  // Runs an allreduce; rank 0 times those whose way it picks (Tuned) for their tuner.
  Status RunAllreduce(Group& group, const Response& response);
  Status AllreduceOnce(Group& group, const Response& response);
  Status RunBroadcast(Group& group);
  Status RunAllgather(Group& group, const Response& response);
  Status RunNeighborAllgather(std::shared_ptr<Request>& r, const std::vector<int64_t>& dims);
  Status RunNeighborAllreduce(Group& group);
  Status RunHierarchical(Group& group);
  Status RunPairGossip(Group& group);
  Status RunSendRecv(Group& group, const Response& response);
  // This rank's index in a process set.
  static int IndexIn(const std::vector<int32_t>& group, int rank);
  // Point-to-point exchange of `count` elements per peer over `peers` into recv_scratch_;
  // sends are scaled copies when needed. The peers are data ranks, or indices into
  // `to_data` (the data ranks). With `arrived`, the messages travel in chunks, and
  // arrived(begin, end) runs for each element range once it has come from every peer and
  // left for every peer.
  Status Exchange(const std::vector<int>* to_data, const void* send_buf, size_t count, DType dtype,
                  const std::vector<std::pair<int, double>>& send,
                  const std::vector<std::pair<int, double>>& recv,
                  const std::function<void(size_t, size_t)>& arrived);
  // How a neighbor exchange moves its data: over the peer transport, through the shared
  // segment (SharedCollectives::Exchange), or reading each peer's input where it is
  // (SharedCollectives::ExchangeDirect).
  enum class ExchangeWay { kTransport, kShared, kDirect };
  // Combines the received buffers into `out`: self_weight * in + sum_k w_k * recv_k, then
  // unpacks a fused group. kDirect combines once every peer has read this rank's input.
  Status ExchangeAndCombine(Group& group, const std::vector<std::pair<int, double>>& recv,
                            ExchangeWay way = ExchangeWay::kTransport);
  // How a neighbor allreduce of `group` exchanges; of `bytes` over every rank (`whole`) or
  // a process set.
  ExchangeWay NeighborExchangeWay(const Group& group) const;
  ExchangeWay NeighborExchangeWay(size_t bytes, bool whole) const;
  // Whether `group` (one op) was staged (Stage) as `way`: it then runs that way with
  // `staged` (shared_collectives.h).
  static bool Ahead(const Group& group, Staged way) {
    return group.size() == 1 && group[0]->staged == way;
  }
  // The in-neighbors of `recv` that a shared or direct exchange reads (one of weight 0 is
  // not read at all), each with its weight and a receive buffer of at least `bytes`.
  struct Readers {
    std::vector<int> from;
    std::vector<double> weights;
    std::vector<char*> into;
  };
  Readers PeersToRead(const std::vector<std::pair<int, double>>& recv, size_t bytes);
  // Packs the inputs of a fused group into one buffer (or returns the lone input).
  void* Pack(Group& group, size_t* count);
  void Unpack(Group& group, const void* buffer);
  void Trace(const Group& group, const char* phase, int64_t start_us) {
    TraceGroup(timeline_, group, phase, start_us);
  }

  const Context ctx_;
  Timeline* const timeline_;
  PeerTransport* const peers_;
  const std::function<void(int64_t since)> idle_;  // MakeHostPlane
  // MPI writes into these: they start on 64-byte boundaries (core/aligned.h).
  AlignedVector<char> fusion_;
  // Reused across ops: fresh multi-MiB buffers per call cost a page fault per page.
  std::vector<AlignedVector<char>> recv_scratch_;
  AlignedVector<char> ring_scratch_;  // the ring allreduce's incoming segment
  std::vector<AlignedVector<char>> send_scratch_;
  std::map<std::vector<int32_t>, MPI_Comm> group_comms_;  // CommOf
  // Sends and receives between two ranks run in the same order on both (the coordinator's),
  // so both count them alike: the k-th send from a to b is b's k-th receive from a. Each
  // one's messages carry that count in their tag (from kPairTagBase, RunSendRecv), so a
  // message that comes after its receive gave up (a timed-out recv, whose sender was late)
  // matches no later receive: with one tag for all it was taken by the pair's next one,
  // whose data it then was, or which MPI failed as truncated, ending the process.
  std::vector<uint64_t> sends_to_, receives_from_;  // by data rank
  int pair_tags_ = 0;                               // how many tags the counts cycle through
  // When every rank is on this machine (and WEFT_SHARED_MEMORY_BYTES is not 0).
  std::unique_ptr<SharedSegment> shared_segment_;
  std::optional<SharedCollectives> shared_;  // in shared_segment_
  // Rank 0's tuners (TunerFor): out of place, then in place; set up once the direct way is
  // known to be there or not.
  std::vector<Tuner> way_tuners_;
  // The allreduces run a way rank 0 picked, counted alike on every rank (RunAllreduce).
  uint64_t tuned_ops_ = 0;
  // On rank 0, the last of them whose span its tuner has not taken yet: at the next one's
  // pick where every rank's times are there by then, else once that one has run
  // (RecordLastTimed).
  struct TimedOp {
    uint64_t op, tag;
    bool in_place;
    size_t bytes;
    int way;
  };
  std::optional<TimedOp> last_timed_;
};

MpiPlane::MpiPlane(const Context& ctx, Timeline* timeline, PeerTransport* peers,
                   std::function<void(int64_t since)> idle)
    : ctx_(ctx),
      timeline_(timeline),
      peers_(peers),
      idle_(std::move(idle)),
      sends_to_(static_cast<size_t>(ctx.size)),
      receives_from_(static_cast<size_t>(ctx.size)) {
  // MPI guarantees tags up to 32767; Open MPI's ob1 allows 2^31 - 1.
  int* tag_ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(ctx.data, MPI_TAG_UB, &tag_ub, &found);
  const int64_t upper = found != 0 && tag_ub != nullptr ? *tag_ub : 32767;
  pair_tags_ = static_cast<int>(std::min<int64_t>(upper - kPairTagBase + 1, int64_t{1} << 30));
  if (ctx.size < 2 || ctx.local_size != ctx.size) return;
  std::string why;
  shared_segment_ =
      SharedSegment::Map(ctx.local, ctx.local_rank, SharedCollectives::Footprint(ctx.size),
                         "collectives", kSharedMemoryBytes.Get() != 0, &why);
  if (!why.empty()) {
    WEFT_LOG(Warning) << "collectives go through MPI, not shared memory: " << why;
  }
  if (shared_segment_ != nullptr) {
    const int64_t stream = kSharedMemoryStream.Get();
    std::optional<CopyMode> copies;
    if (stream >= 0) copies = stream == 1 ? CopyMode::kStream : CopyMode::kPlain;
    shared_.emplace(shared_segment_->data(), ctx.size, ctx.rank, copies);
    // The segment's ranks are the job's, in the same order (local_rank == rank).
    std::vector<int64_t> pids;
    bool writes = false;
    const bool wanted = kCrossMemoryAttachBytes.Get() != 0;
    if (wanted && ctx.local_rank == ctx.rank &&
        ProbeDirectReads(ctx.local, ctx.size, ctx.rank, &pids, &writes)) {
      shared_->EnableDirectReads(std::move(pids), writes);
      if (!writes && ctx.rank == 0) {
        WEFT_LOG(Info) << "allreduces go through shared memory or MPI: the ranks can read but "
                          "not write each other's memory (process_vm_writev)";
      }
    } else if (wanted && ctx.rank == 0) {
      WEFT_LOG(Info) << "allreduces, allgathers, broadcasts and neighbor allreduces go through "
                        "shared memory or MPI: the ranks cannot read each other's memory "
                        "(process_vm_readv)";
    }
    const int ways = shared_->direct_writes() ? kWayDirect + 1 : kWayMpi + 1;
    way_tuners_ = std::vector<Tuner>(2 * kTunedSizes, WayTuner(ways));
  }
}

std::optional<Status> MpiPlane::Run(const Response& response, Group& group) {
  switch (response.op) {
    case OpType::kAllreduce:
      return RunAllreduce(group, response);
    case OpType::kBroadcast:
      return RunBroadcast(group);
    case OpType::kAllgather:
      return RunAllgather(group, response);
    case OpType::kNeighborAllgather:
      return RunNeighborAllgather(group[0], response.first_dims.at(0));
    case OpType::kNeighborAllreduce:
      return RunNeighborAllreduce(group);
    case OpType::kHierarchicalNeighborAllreduce:
      return RunHierarchical(group);
    case OpType::kPairGossip:
      return RunPairGossip(group);
    case OpType::kSendRecv:
      return RunSendRecv(group, response);
    default:
      return Internal(OpName(response.op), " is not a data op");
  }
}

void MpiPlane::Close() {
  for (auto& [ranks, comm] : group_comms_) MPI_Comm_free(&comm);
  group_comms_.clear();
}

void* MpiPlane::Pack(Group& group, size_t* count) {
  const int64_t start = TraceStart(timeline_);
  if (group.size() == 1) {
    Request& r = *group[0];
    *count = static_cast<size_t>(r.in.numel());
    if (r.out.data() != r.in.data()) std::memcpy(r.out.data(), r.in.data(), r.in.nbytes());
    return r.out.data();
  }
  size_t bytes = 0;
  for (auto& r : group) bytes += r->in.nbytes();
  if (fusion_.size() < bytes) fusion_.resize(bytes);
  size_t offset = 0;
  for (auto& r : group) {
    std::memcpy(fusion_.data() + offset, r->in.data(), r->in.nbytes());
    offset += r->in.nbytes();
  }
  *count = bytes / group[0]->in.itemsize();
  Trace(group, "fuse", start);
  return fusion_.data();
}

void MpiPlane::Unpack(Group& group, const void* buffer) {
  if (group.size() == 1) return;  // computed in place in the output
  size_t offset = 0;
  for (auto& r : group) {
    std::memcpy(r->out.data(), static_cast<const char*>(buffer) + offset, r->out.nbytes());
    offset += r->out.nbytes();
  }
}

StatusOr<MPI_Comm> MpiPlane::CommOf(const std::vector<int32_t>& ranks) {
  if (ranks.empty()) return ctx_.data;
  auto it = group_comms_.find(ranks);
  if (it != group_comms_.end()) return it->second;
  MPI_Group world, members;
  MPI_Comm_group(ctx_.data, &world);
  MPI_Group_incl(world, static_cast<int>(ranks.size()), ranks.data(), &members);
  MPI_Comm comm = MPI_COMM_NULL;
  const int code = MPI_Comm_create_group(ctx_.data, members, /*tag=*/kDataTag, &comm);
  MPI_Group_free(&members);
  MPI_Group_free(&world);
  WEFT_RETURN_IF_ERROR(MpiCheck(code, "MPI_Comm_create_group"));
  group_comms_.emplace(ranks, comm);
  return comm;
}

int MpiPlane::IndexIn(const std::vector<int32_t>& ranks, int rank) {
  return static_cast<int>(std::lower_bound(ranks.begin(), ranks.end(), rank) - ranks.begin());
}

Status MpiPlane::RunSendRecv(Group& group, const Response& response) {
  Request& r = *group[0];
  const int64_t start = TraceStart(timeline_);
  const bool sending = !r.send.empty();
  const int peer = sending ? r.send[0].first : r.recv[0].first;
  // Counted first, whatever happens to the op below: the peer counts it too.
  uint64_t& count = (sending ? sends_to_ : receives_from_)[static_cast<size_t>(peer)];
  const int tag = kPairTagBase + static_cast<int>(count++ % static_cast<uint64_t>(pair_tags_));
  Status allocated = OkStatus();
  ScratchOutput scratch;
  size_t bytes = 0;
  char* data = nullptr;
  if (!sending && r.alloc) {
    // The coordinator passed on the sender's shape and dtype (protocol.h).
    if (response.first_dims.size() != 2 || response.first_dims[1].size() != 1) {
      return Internal(Describe(r.desc), ": the coordinator did not send the sender's shape");
    }
    const std::vector<int64_t>& shape = response.first_dims[0];
    const DType dtype = static_cast<DType>(response.first_dims[1][0]);
    allocated = TakeOutput(r, dtype, shape, Device{});  // CPU only
    if (!allocated.ok()) {
      // As in RunAllgather: the sender would wait for this rank to take its data, so it
      // does, chunk after chunk into the same scratch memory, then fails.
      bytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
      data = scratch.Take(std::min(bytes, kMaxChunk));
      if (data == nullptr) return NoScratch(allocated, std::min(bytes, kMaxChunk));
    }
  }
  if (allocated.ok()) {
    data = static_cast<char*>(sending ? r.in.data() : r.out.data());
    bytes = sending ? r.in.nbytes() : r.out.nbytes();
  }
  // Both ranks submitted the op, so the peer's data is due now. A peer that dies after
  // submitting would leave a blocking call waiting forever; with a stall timeout the
  // transfer fails after it instead (the rest of the job is then in doubt anyway).
  const double timeout_s = Engine::stall_timeout_s();
  for (size_t done = 0; done < bytes || done == 0; done += kMaxChunk) {
    const int n = static_cast<int>(std::min(kMaxChunk, bytes - done));
    char* at = allocated.ok() ? data + done : data;
    MPI_Request req;
    WEFT_RETURN_IF_ERROR(MpiCheck(sending ? MPI_Isend(at, n, MPI_BYTE, peer, tag, ctx_.data, &req)
                                          : MPI_Irecv(at, n, MPI_BYTE, peer, tag, ctx_.data, &req),
                                  sending ? "MPI_Isend" : "MPI_Irecv"));
    const int64_t posted = Timeline::NowMicros();
    const int64_t deadline = posted + static_cast<int64_t>(timeout_s * 1e6);
    for (;;) {
      int finished = 0;
      WEFT_RETURN_IF_ERROR(MpiCheck(MPI_Test(&req, &finished, MPI_STATUS_IGNORE), "MPI_Test"));
      if (finished) break;
      if (timeout_s > 0 && Timeline::NowMicros() > deadline) {
        // A receive is taken back, so that MPI writes into its buffer no more (a message
        // on its way completes it instead); the buffer may then be freed or reused, weft's
        // memory for an allocated output among it. A send cannot be (MPI may not cancel
        // one): it stays with MPI, and so does its buffer, which is why the op fails
        // rather than completing; scratch memory MPI may still write into is left to it.
        if (!sending && !Withdraw(&req)) scratch.Abandon();
        return DeadlineExceeded(Describe(r.desc), ": rank ", peer, " agreed to it but its data ",
                                sending ? "was not taken" : "did not arrive", " within ", timeout_s,
                                " s (WEFT_STALL_TIMEOUT_SECONDS); did rank ", peer, " die?");
      }
      IdleWait(posted, /*polled_mpi=*/true);
    }
    if (bytes == 0) break;
  }
  Trace(group, "communicate", start);
  return allocated;
}

MpiPlane::AllreducePath MpiPlane::AllreducePathOf(const Response& response,
                                                  const Group& group) const {
  const std::vector<int32_t>& ranks = group[0]->desc.group;
  const int members = ranks.empty() ? ctx_.size : static_cast<int>(ranks.size());
  size_t bytes = 0;
  for (auto& r : group) bytes += r->in.nbytes();
  // A fused group reads its packed buffer in place.
  const bool out_of_place = response.out_of_place && group.size() == 1;
  // Rank 0's tuner may send a lone op to MPI's allreduce or to the direct way instead
  // (Preference); every rank goes by the agreed pick alone.
  const int tuned = group.size() == 1 ? response.tuned_way : -1;
  if (tuned == kWayDirect) return {false, false, true};
  if (tuned < 0 && DirectAllreduceTakes(bytes, ranks.empty(), group.size() == 1,
                                        group[0]->in.device().type == Device::Type::kCPU)) {
    return {false, false, true};
  }
  const bool shared = tuned != kWayMpi && SegmentTakes(bytes, ranks.empty());
  return {shared, UseRing(peers_->kind(), ctx_.machine_size, members, bytes, out_of_place, shared)};
}

MpiPlane::BroadcastWay MpiPlane::BroadcastWayOf(size_t bytes, bool whole, bool lone) const {
  if (!shared_.has_value() || !whole) return BroadcastWay::kMpi;
  const bool direct = lone && shared_->direct_reads() && bytes >= kDirectBroadcastFromBytes &&
                      UseDirectReads(bytes, kDirectBroadcastBytes);
  // Below the direct reads' floor the segment keeps the broadcasts it takes by default.
  if (direct ? UseSharedMemory(bytes, /*any_size=*/false, kDirectBroadcastFromBytes - 1)
             : UseSharedMemory(bytes, AnySize())) {
    return BroadcastWay::kShared;
  }
  return direct ? BroadcastWay::kDirect : BroadcastWay::kMpi;
}

MpiPlane::BroadcastWay MpiPlane::BroadcastWayOf(const Group& group) const {
  size_t bytes = 0;
  for (auto& r : group) bytes += r->out.nbytes();
  return BroadcastWayOf(bytes, group[0]->desc.group.empty(), group.size() == 1);
}

bool MpiPlane::SegmentTakes(size_t bytes, bool whole) const {
  return shared_.has_value() && whole && UseSharedMemory(bytes, AnySize());
}

bool MpiPlane::DirectAllreduceTakes(size_t bytes, bool whole, bool lone, bool cpu) const {
  // A ring asked for explicitly (WEFT_RING_ALLREDUCE_BYTES) keeps the ops it takes.
  return ctx_.oversubscribed && whole && lone && cpu && kRingAllreduceBytes.Get() < 0 &&
         shared_.has_value() && shared_->direct_writes() &&
         bytes >= kDirectAllreduceSharedCpusFromBytes &&
         UseDirectReads(bytes, kDirectAllreduceSharedCpusBytes) &&
         !UseSharedMemory(bytes, /*any_size=*/false, kDirectAllreduceSharedCpusFromBytes - 1);
}

MpiPlane::GatherWay MpiPlane::AllgatherWay(size_t total) const {
  if (!shared_.has_value()) return GatherWay::kMpi;
  // Not AnySize(): two ranks with a CPU each keep a limit (UseSharedMemory says why).
  const bool direct = shared_->direct_reads() &&
                      UseDirectReads(total, ctx_.oversubscribed ? kDirectAllgatherSharedCpusBytes
                                                                : kDirectAllgatherBytes);
  const int64_t segment_up_to = !direct               ? kSharedMemoryDefaultBytes
                                : ctx_.oversubscribed ? kDirectAllgatherAboveBytes
                                                      : kDirectAllgatherOwnCpusAboveBytes;
  if (UseSharedMemory(total, ctx_.oversubscribed && !direct, segment_up_to)) {
    return GatherWay::kShared;
  }
  return direct ? GatherWay::kDirect : GatherWay::kMpi;
}

bool MpiPlane::MeetsFirst(const Response& response, const Group& group) const {
  switch (response.op) {
    case OpType::kAllreduce: {
      const AllreducePath path = AllreducePathOf(response, group);
      return path.direct || (path.shared && !path.ring);
    }
    case OpType::kBroadcast:
      return BroadcastWayOf(group) != BroadcastWay::kMpi;
    case OpType::kAllgather: {
      const Request& r = *group[0];
      const size_t row_bytes = static_cast<size_t>(RowElements(r.in.shape())) * r.in.itemsize();
      size_t total = 0;
      for (int64_t rows : response.first_dims.at(0)) total += static_cast<size_t>(rows) * row_bytes;
      return AllgatherWay(total) != GatherWay::kMpi;
    }
    case OpType::kNeighborAllreduce:
      return NeighborExchangeWay(group) != ExchangeWay::kTransport;
    default:
      return false;
  }
}

bool MpiPlane::Tuned(const Request& r) const {
  return r.desc.op == OpType::kAllreduce && shared_.has_value() && ctx_.size == 2 &&
         !ctx_.oversubscribed && r.desc.group.empty() && r.in.device().type == Device::Type::kCPU &&
         r.in.nbytes() >=
             (shared_->direct_writes() ? kTunedAllreduceFromBytes : kTunedWithoutDirectFromBytes) &&
         kSharedMemoryBytes.Get() < 0 && kTuneWays.Get();
}

Tuner& MpiPlane::TunerFor(bool in_place, size_t bytes) {
  int k = 0;
  while (k + 1 < kTunedSizes && bytes >= kTunedAllreduceFromBytes << (k + 1)) ++k;
  return way_tuners_[(in_place ? kTunedSizes : 0) + k];
}

int MpiPlane::Preference(const Request& r) {
  if (!Tuned(r)) return -1;
  if (ctx_.rank != 0) return 0;
  // The last tuned op's span, where every rank's times are there already (the usual case:
  // they publish them as they leave it), so that this pick follows from it.
  RecordLastTimed();
  return TunerFor(r.desc.in_place, r.in.nbytes()).next();
}

void MpiPlane::RecordLastTimed() {
  if (!last_timed_.has_value()) return;
  const int64_t span = shared_->OpSpan(last_timed_->op, last_timed_->tag);
  if (span <= 0) return;  // a rank's times are not there yet
  TunerFor(last_timed_->in_place, last_timed_->bytes)
      .Record(last_timed_->way, span, last_timed_->bytes);
  last_timed_.reset();
}

Staged MpiPlane::Stage(Request& r, bool tuned) {
  if (tuned) {
    // Its way is not known yet: only what the direct way posts before its first meeting
    // (nothing else writes ahead).
    if (shared_.has_value() && shared_->direct_writes()) {
      shared_->StageDirect(r.in.data(), nullptr, r.out.data());
    }
    return r.desc.in_place ? Staged::kTunedInPlace : Staged::kTunedOutOfPlace;
  }
  if (!shared_.has_value() || !r.desc.group.empty()) return Staged::kNone;
  const size_t bytes = r.in.nbytes();
  const DType dtype = r.in.dtype();
  auto pieces = [&] {
    return std::vector<SharedCollectives::Piece>{
        {r.in.data(), r.out.data(), static_cast<size_t>(r.in.numel())}};
  };
  auto segment = [](bool staged) { return staged ? Staged::kSegment : Staged::kNone; };
  switch (r.desc.op) {
    case OpType::kAllreduce:
      if (DirectAllreduceTakes(bytes, /*whole=*/true, /*lone=*/true,
                               r.in.device().type == Device::Type::kCPU)) {
        return shared_->StageDirect(r.in.data(), nullptr, r.out.data()) ? Staged::kDirectReads
                                                                        : Staged::kNone;
      }
      // The ring, which a setting may still choose for an op out of place on some rank,
      // takes the op unstaged (Ahead).
      if (!SegmentTakes(bytes, /*whole=*/true)) return Staged::kNone;
      return segment(shared_->StageAllreduce(pieces(), dtype, idle_));
    case OpType::kBroadcast:
      switch (BroadcastWayOf(r.out.nbytes(), /*whole=*/true, /*lone=*/true)) {
        case BroadcastWay::kShared:
          return segment(shared_->StageBroadcast(pieces(), r.out.itemsize(), r.desc.root, idle_));
        case BroadcastWay::kDirect:
          // Only the root's address is read; the others post theirs all the same.
          return shared_->StageDirect(r.in.data(), nullptr) ? Staged::kDirectReads : Staged::kNone;
        case BroadcastWay::kMpi:
          return Staged::kNone;
      }
      return Staged::kNone;
    case OpType::kAllgather:
      // Its way depends on every rank's part: staged for equal parts, and run staged where
      // the parts agreed come to the same way.
      switch (AllgatherWay(bytes * static_cast<size_t>(ctx_.size))) {
        case GatherWay::kShared:
          return segment(shared_->StageAllgather(r.in.data(), bytes, idle_));
        case GatherWay::kDirect:
          return shared_->StageDirect(r.in.data(), nullptr) ? Staged::kDirectReads : Staged::kNone;
        case GatherWay::kMpi:
          return Staged::kNone;
      }
      return Staged::kNone;
    case OpType::kNeighborAllreduce:
      switch (NeighborExchangeWay(bytes, /*whole=*/true)) {
        case ExchangeWay::kShared:
          return segment(shared_->StageExchange(pieces(), dtype, r.send, idle_));
        case ExchangeWay::kDirect:
          return shared_->StageDirect(r.in.data(), &r.send) ? Staged::kDirectReads : Staged::kNone;
        case ExchangeWay::kTransport:
          return Staged::kNone;
      }
      return Staged::kNone;
    default:
      return Staged::kNone;
  }
}

Status MpiPlane::RunAllreduce(Group& group, const Response& response) {
  // The ops rank 0 picked a way for (Preference): every rank times them, and rank 0's tuner
  // takes each one's span over the ranks (SharedCollectives::OpSpan) at the next one's pick
  // or end.
  if (group.size() != 1 || response.tuned_way < 0 || !shared_.has_value()) {
    return AllreduceOnce(group, response);
  }
  const uint64_t op = tuned_ops_++;
  const int64_t start = SharedCollectives::NowNanos();
  Status done = AllreduceOnce(group, response);
  const auto tag = static_cast<uint64_t>(group[0]->turn);
  if (done.ok()) shared_->PublishOpTimes(op, tag, start, SharedCollectives::NowNanos());
  if (ctx_.rank != 0) return done;
  const size_t bytes = group[0]->in.nbytes();
  if (!done.ok()) {
    last_timed_.reset();
    // It failed on every rank alike (AllreduceDirect).
    TunerFor(group[0]->desc.in_place, bytes).Fail(response.tuned_way);
    return done;
  }
  // The op before, where its span was not there yet when this one was picked. Every rank
  // published it before it joined this op, and none can have run the next one with the
  // same slots without rank 0.
  RecordLastTimed();
  last_timed_ = TimedOp{op, tag, group[0]->desc.in_place, bytes, response.tuned_way};
  return done;
}

Status MpiPlane::AllreduceOnce(Group& group, const Response& response) {
  InitTypes();
  const DType dtype = group[0]->in.dtype();
  const std::vector<int32_t>& ranks = group[0]->desc.group;
  WEFT_ASSIGN_OR_RETURN(MPI_Comm comm, CommOf(ranks));
  const int members = ranks.empty() ? ctx_.size : static_cast<int>(ranks.size());
  const AllreducePath path = AllreducePathOf(response, group);
  const bool use_ring = path.ring;
  if (path.direct) {
    // Each rank sums its slice from the others' inputs and writes it into their outputs.
    Request& r = *group[0];
    const int64_t start = TraceStart(timeline_);
    const Status status = shared_->AllreduceDirect(
        r.in.data(), r.out.data(), static_cast<size_t>(r.in.numel()), dtype, r.desc.average, idle_,
        IsTuned(r.staged) || Ahead(group, Staged::kDirectReads));
    r.backend = "CMA";
    Trace(group, "communicate", start);
    return status;
  }
  if (!use_ring && path.shared) {
    // Every rank's tensors are in this machine's memory: each is read where it is and
    // written where it goes, with no fusion buffer.
    const int64_t start = TraceStart(timeline_);
    shared_->Allreduce(SharedPieces(group), dtype, group[0]->desc.average, idle_,
                       Ahead(group, Staged::kSegment));
    Trace(group, "communicate", start);
    return OkStatus();
  }
  // A lone op reduces straight from its input into its output (no copy); a fused group
  // reduces its packed buffer in place.
  size_t count = static_cast<size_t>(group[0]->in.numel());
  const void* send = group[0]->in.data();
  void* buf = group[0]->out.data();
  if (group.size() > 1) send = buf = Pack(group, &count);
  int64_t start = TraceStart(timeline_);
  if (use_ring) {
    std::vector<int> ring(ranks.begin(), ranks.end());
    if (ranks.empty()) {
      for (int r = 0; r < ctx_.size; ++r) ring.push_back(r);
    }
    const int me = ranks.empty() ? ctx_.rank : IndexIn(ranks, ctx_.rank);
    WEFT_RETURN_IF_ERROR(RingAllreduceSum(*peers_, ring, me, send, buf, count, dtype,
                                          kRingChunkBytes, &ring_scratch_));
    for (auto& member : group) member->backend = peers_->name();
  } else {
    WEFT_RETURN_IF_ERROR(AllreduceSum(send, buf, count, dtype, comm));
  }
  Trace(group, "communicate", start);
  start = TraceStart(timeline_);
  if (group[0]->desc.average && members > 1) Divide(buf, dtype, count, members);
  Unpack(group, buf);
  Trace(group, "combine", start);
  return OkStatus();
}

Status MpiPlane::RunBroadcast(Group& group) {
  const int root = group[0]->desc.root;
  const std::vector<int32_t>& ranks = group[0]->desc.group;
  WEFT_ASSIGN_OR_RETURN(MPI_Comm comm, CommOf(ranks));
  const BroadcastWay way = BroadcastWayOf(group);
  if (way == BroadcastWay::kShared) {
    const int64_t start = TraceStart(timeline_);
    shared_->Broadcast(SharedPieces(group), group[0]->out.itemsize(), root, idle_,
                       Ahead(group, Staged::kSegment));
    Trace(group, "communicate", start);
    return OkStatus();
  }
  if (way == BroadcastWay::kDirect) {
    Request& r = *group[0];
    const int64_t start = TraceStart(timeline_);
    r.backend = "CMA";
    const Status read = shared_->BroadcastDirect(r.in.data(), r.out.data(), r.out.nbytes(), root,
                                                 idle_, Ahead(group, Staged::kDirectReads));
    Trace(group, "communicate", start);
    return read.ok() ? read : Annotate(read, Describe(r.desc));
  }
  const int root_in_comm = ranks.empty() ? root : IndexIn(ranks, root);
  size_t count = 0;
  void* buf;
  if (ctx_.rank == root) {
    buf = Pack(group, &count);
  } else if (group.size() == 1) {
    buf = group[0]->out.data();
    count = static_cast<size_t>(group[0]->out.numel());
  } else {
    size_t bytes = 0;
    for (auto& r : group) bytes += r->out.nbytes();
    if (fusion_.size() < bytes) fusion_.resize(bytes);
    buf = fusion_.data();
    count = bytes / group[0]->out.itemsize();
  }
  const int64_t start = TraceStart(timeline_);
  WEFT_RETURN_IF_ERROR(Bcast(buf, count * group[0]->out.itemsize(), root_in_comm, comm));
  Trace(group, "communicate", start);
  Unpack(group, buf);
  return OkStatus();
}

Status MpiPlane::RunAllgather(Group& group, const Response& response) {
  Request& r = *group[0];
  const std::vector<int64_t>& dims = response.first_dims.at(0);
  const size_t row_bytes = static_cast<size_t>(RowElements(r.in.shape())) * r.in.itemsize();
  std::vector<int64_t> shape(r.in.shape().begin(), r.in.shape().end());
  shape[0] = 0;
  // On the stack for up to 8 ranks: no allocation for them in each op.
  absl::InlinedVector<int, 8> counts(ctx_.size), displs(ctx_.size);
  size_t total = 0;
  for (int i = 0; i < ctx_.size; ++i) {
    shape[0] += dims[i];
    const size_t bytes = static_cast<size_t>(dims[i]) * row_bytes;
    if (total + bytes > static_cast<size_t>(INT_MAX)) {
      return Unimplemented(Describe(r.desc), ": outputs over 2 GiB are not supported");
    }
    counts[i] = static_cast<int>(bytes);
    displs[i] = static_cast<int>(total);
    total += bytes;
  }
  // A rank whose allocator fails still takes its part, with no output (or scratch memory),
  // then fails: the others would wait for it otherwise, and where they count the op's first
  // meeting without waiting (staged), they would run on a meeting ahead of it, reading and
  // overwriting areas out of step from then on.
  const Status allocated = TakeOutput(r, r.in.dtype(), shape, r.in.device());
  void* gathered = allocated.ok() ? r.out.data() : nullptr;
  const int64_t start = TraceStart(timeline_);
  const GatherWay way = AllgatherWay(total);
  if (way != GatherWay::kMpi) {
    const std::vector<size_t> parts(counts.begin(), counts.end());
    Status read = OkStatus();
    if (way == GatherWay::kShared) {
      r.backend = "SHM";
      shared_->Allgather(r.in.data(), gathered, parts, idle_, Ahead(group, Staged::kSegment));
    } else {
      r.backend = "CMA";
      read = shared_->AllgatherDirect(r.in.data(), gathered, parts, idle_,
                                      Ahead(group, Staged::kDirectReads));
    }
    Trace(group, "communicate", start);
    if (!allocated.ok()) return allocated;
    return read.ok() ? read : Annotate(read, Describe(r.desc));
  }
  ScratchOutput scratch;
  if (!allocated.ok()) {
    gathered = scratch.Take(total);
    if (gathered == nullptr) return NoScratch(allocated, total);
  }
  // Equal parts are the common case, and MPI's algorithms for it are better tuned.
  const bool equal = std::all_of(counts.begin(), counts.end(), [&](int c) { return c == counts[0]; });
  if (equal) {
    WEFT_RETURN_IF_ERROR(MpiCheck(
        MPI_Allgather(r.in.data(), counts[0], MPI_BYTE, gathered, counts[0], MPI_BYTE, ctx_.data),
        "MPI_Allgather"));
  } else {
    WEFT_RETURN_IF_ERROR(MpiCheck(MPI_Allgatherv(r.in.data(), counts[ctx_.rank], MPI_BYTE, gathered,
                                                 counts.data(), displs.data(), MPI_BYTE, ctx_.data),
                                  "MPI_Allgatherv"));
  }
  Trace(group, "communicate", start);
  return allocated;
}

Status MpiPlane::RunNeighborAllgather(std::shared_ptr<Request>& rp,
                                      const std::vector<int64_t>& dims) {
  Request& r = *rp;
  const size_t row_bytes = static_cast<size_t>(RowElements(r.in.shape())) * r.in.itemsize();
  std::vector<int64_t> shape(r.in.shape().begin(), r.in.shape().end());
  shape[0] = 0;
  for (const auto& src : r.recv) shape[0] += dims[src.first];
  size_t total = 0;
  for (const auto& src : r.recv) total += static_cast<size_t>(dims[src.first]) * row_bytes;
  // Checked before anything is sent or allocated; a rank over the limit fails alone, and
  // its peers wait for it (as they do for any rank that cannot take its part).
  if (r.in.nbytes() > static_cast<size_t>(INT_MAX) || total > static_cast<size_t>(INT_MAX)) {
    return Unimplemented(Describe(r.desc), ": tensors over 2 GiB are not supported");
  }
  // As in RunAllgather: a rank whose allocator fails still sends and receives (into scratch
  // memory), or its peers would wait for it.
  const Status allocated = TakeOutput(r, r.in.dtype(), shape, r.in.device());
  ScratchOutput scratch;
  char* gathered = static_cast<char*>(allocated.ok() ? r.out.data() : scratch.Take(total));
  if (!allocated.ok() && gathered == nullptr) return NoScratch(allocated, total);
  const int64_t start = TraceStart(timeline_);
  std::vector<MPI_Request> reqs;
  size_t offset = 0;
  for (const auto& src : r.recv) {
    const size_t bytes = static_cast<size_t>(dims[src.first]) * row_bytes;
    reqs.emplace_back();
    MPI_Irecv(gathered + offset, static_cast<int>(bytes), MPI_BYTE, src.first, kDataTag, ctx_.data,
              &reqs.back());
    offset += bytes;
  }
  for (const auto& dst : r.send) {
    reqs.emplace_back();
    MPI_Isend(r.in.data(), static_cast<int>(r.in.nbytes()), MPI_BYTE, dst.first, kDataTag,
              ctx_.data, &reqs.back());
  }
  WEFT_RETURN_IF_ERROR(
      MpiCheck(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE),
               "neighbor exchange"));
  Trace(Group{rp}, "communicate", start);
  return allocated;
}

Status MpiPlane::Exchange(const std::vector<int>* to_data, const void* send_buf, size_t count,
                          DType dtype, const std::vector<std::pair<int, double>>& send,
                          const std::vector<std::pair<int, double>>& recv,
                          const std::function<void(size_t, size_t)>& arrived) {
  using Ticket = PeerTransport::Ticket;
  const size_t item = DTypeSize(dtype), bytes = count * item;
  auto data_rank = [&](int peer) { return to_data == nullptr ? peer : (*to_data)[peer]; };
  // Elements per chunk: every message is cut the same way on both sides.
  const size_t chunk =
      arrived ? std::max<size_t>(1, kExchangeChunkBytes / item) : std::max<size_t>(count, 1);
  const size_t chunks = (count + chunk - 1) / chunk;
  auto chunk_end = [&](size_t c) { return std::min(count, (c + 1) * chunk); };
  std::vector<std::vector<Ticket>> recv_tickets(recv.size()), send_tickets(send.size());
  if (recv_scratch_.size() < recv.size()) recv_scratch_.resize(recv.size());
  // Every transfer is posted even after one fails to post (a broken pair), so that the
  // exchanges with the other peers complete whole and their streams stay in step.
  Status status;
  auto post = [&](StatusOr<Ticket> ticket, std::vector<Ticket>* tickets) {
    if (ticket.ok()) {
      tickets->push_back(*ticket);
    } else if (status.ok()) {
      status = ticket.status();
    }
  };
  for (size_t k = 0; k < recv.size(); ++k) {
    if (recv_scratch_[k].size() < bytes) recv_scratch_[k].resize(bytes);
    for (size_t c = 0; c < chunks; ++c) {
      post(peers_->Recv(data_rank(recv[k].first), recv_scratch_[k].data() + c * chunk * item,
                        (chunk_end(c) - c * chunk) * item),
           &recv_tickets[k]);
    }
  }
  size_t scaled = 0;  // one copy per destination whose scale is not 1
  for (size_t d = 0; d < send.size(); ++d) {
    const auto& [dst, scale] = send[d];
    const char* data = static_cast<const char*>(send_buf);
    if (scale != 1.0) {
      if (send_scratch_.size() <= scaled) send_scratch_.resize(scaled + 1);
      AlignedVector<char>& copy = send_scratch_[scaled++];
      if (copy.size() < bytes) copy.resize(bytes);
      WeightedSum(copy.data(), dtype, count, {{send_buf, scale}});
      data = copy.data();
    }
    for (size_t c = 0; c < chunks; ++c) {
      post(peers_->Send(data_rank(dst), data + c * chunk * item, (chunk_end(c) - c * chunk) * item),
           &send_tickets[d]);
    }
  }
  // Chunk by chunk, once it has arrived from every peer and left for every peer (the
  // caller may write over what it sent): the caller combines it while the rest travels.
  for (size_t c = 0; c < chunks && status.ok() && arrived; ++c) {
    for (auto& tickets : recv_tickets) {
      if (status.ok()) status = peers_->Wait(tickets[c]);
    }
    for (auto& tickets : send_tickets) {
      if (status.ok()) status = peers_->Wait(tickets[c]);
    }
    if (status.ok()) arrived(c * chunk, chunk_end(c));
  }
  // Even after an error, every posted transfer completes before the buffers are reused.
  Status rest = peers_->WaitAll();
  return status.ok() ? Annotate(rest, "neighbor exchange") : status;
}

Status MpiPlane::ExchangeAndCombine(Group& group, const std::vector<std::pair<int, double>>& recv,
                                    ExchangeWay way) {
  Request& r = *group[0];
  const DType dtype = r.in.dtype();
  const size_t item = DTypeSize(dtype);
  if (way == ExchangeWay::kShared) {
    // Round by round, straight from the senders' halves (or their scaled copies), each
    // tensor of a fused group read and written where it is.
    const std::vector<SharedCollectives::Piece> pieces = SharedPieces(group);
    const size_t count = SharedCollectives::Elements(pieces);
    const Readers peers =
        PeersToRead(recv, std::min(count, shared_->ExchangeRoundElements(item)) * item);
    std::vector<WeightedTerm> terms;
    const int64_t start = TraceStart(timeline_);
    shared_->Exchange(
        pieces, dtype, r.send, peers.from, peers.into,
        [&](const SharedCollectives::Piece& p, size_t at, size_t n,
            const std::vector<const char*>& received) {
          terms.assign(1, {static_cast<const char*>(p.in) + at * item, r.self_weight});
          for (size_t k = 0; k < received.size(); ++k) {
            terms.push_back({received[k], peers.weights[k]});
          }
          WeightedSum(static_cast<char*>(p.out) + at * item, dtype, n, terms);
        },
        idle_, Ahead(group, Staged::kSegment));
    Trace(group, "communicate", start);
    return OkStatus();
  }
  // A lone op sends straight from its input and combines into its output; a fused group
  // goes through the fusion buffer.
  size_t count = static_cast<size_t>(r.in.numel());
  const char* send_buf = static_cast<const char*>(r.in.data());
  char* out = static_cast<char*>(r.out.data());
  if (group.size() > 1) {
    out = static_cast<char*>(Pack(group, &count));
    send_buf = out;
  }
  int64_t start = TraceStart(timeline_);
  if (way == ExchangeWay::kDirect) {
    // Read every peer's input whole, then combine: `out` may be this rank's input (in
    // place, or a fused group's buffer), which the others read until the second meeting.
    const Readers peers = PeersToRead(recv, count * item);
    std::vector<WeightedTerm> terms = {{send_buf, r.self_weight}};
    for (size_t k = 0; k < peers.from.size(); ++k) {
      terms.push_back({peers.into[k], peers.weights[k]});
    }
    for (auto& member : group) member->backend = "CMA";
    const Status read =
        shared_->ExchangeDirect(send_buf, count, dtype, r.send, peers.from, peers.into, idle_,
                                Ahead(group, Staged::kDirectReads));
    if (!read.ok()) return Annotate(read, Describe(r.desc));
    WeightedSum(out, dtype, count, terms);
  } else {
    // out = self_weight * in + sum_k w_k * recv_k, a chunk at a time as the chunks arrive.
    std::vector<WeightedTerm> terms;
    WEFT_RETURN_IF_ERROR(Exchange(
        /*to_data=*/nullptr, send_buf, count, dtype, r.send, recv, [&](size_t begin, size_t end) {
          terms.assign(1, {send_buf + begin * item, r.self_weight});
          for (size_t k = 0; k < recv.size(); ++k) {
            if (recv[k].second == 0.0) continue;
            terms.push_back({recv_scratch_[k].data() + begin * item, recv[k].second});
          }
          WeightedSum(out + begin * item, dtype, end - begin, terms);
        }));
    for (auto& member : group) member->backend = peers_->name();
  }
  Trace(group, "communicate", start);
  start = TraceStart(timeline_);
  Unpack(group, out);
  Trace(group, "combine", start);
  return OkStatus();
}

MpiPlane::Readers MpiPlane::PeersToRead(const std::vector<std::pair<int, double>>& recv,
                                        size_t bytes) {
  if (recv_scratch_.size() < recv.size()) recv_scratch_.resize(recv.size());
  Readers peers;
  for (size_t k = 0; k < recv.size(); ++k) {
    if (recv[k].second == 0.0) continue;
    if (recv_scratch_[k].size() < bytes) recv_scratch_[k].resize(bytes);
    peers.from.push_back(recv[k].first);
    peers.weights.push_back(recv[k].second);
    peers.into.push_back(recv_scratch_[k].data());
  }
  return peers;
}

MpiPlane::ExchangeWay MpiPlane::NeighborExchangeWay(const Group& group) const {
  size_t bytes = 0;
  for (const auto& r : group) bytes += r->in.nbytes();
  return NeighborExchangeWay(bytes, group[0]->desc.group.empty());
}

MpiPlane::ExchangeWay MpiPlane::NeighborExchangeWay(size_t bytes, bool whole) const {
  // What decides is the same on every rank: the ranks all on this machine (the segment
  // mapped), the op over all of them (every rank meets), the exchange on MPI (the default
  // on one machine; tcp or ucx chosen explicitly keeps its traffic), and the bytes.
  if (!shared_.has_value() || peers_->kind() != PeerTransportKind::kMpi || !whole) {
    return ExchangeWay::kTransport;
  }
  const bool direct = shared_->direct_reads() && bytes >= kDirectExchangeFromBytes &&
                      UseDirectReads(bytes, kDirectExchangeBytes);
  const int64_t segment_up_to =
      direct && !ctx_.oversubscribed ? kSharedExchangeOwnCpusBytes : kSharedExchangeBytes;
  if (UseSharedMemory(bytes, /*any_size=*/false, segment_up_to)) return ExchangeWay::kShared;
  if (direct) return ExchangeWay::kDirect;
  if (kSharedMemoryBytes.Get() < 0 && bytes > static_cast<uint64_t>(kSharedExchangeAboveBytes)) {
    return ExchangeWay::kShared;
  }
  return ExchangeWay::kTransport;
}

Status MpiPlane::RunNeighborAllreduce(Group& group) {
  return ExchangeAndCombine(group, group[0]->recv, NeighborExchangeWay(group));
}

Status MpiPlane::RunHierarchical(Group& group) {
  InitTypes();
  Request& r = *group[0];
  const DType dtype = r.in.dtype();
  size_t count = 0;
  void* buf = Pack(group, &count);
  int64_t start = TraceStart(timeline_);
  WEFT_RETURN_IF_ERROR(AllreduceSum(buf, buf, count, dtype, ctx_.local));
  if (ctx_.local_rank == 0) {
    WEFT_RETURN_IF_ERROR(
        Exchange(&ctx_.cross_ranks, buf, count, dtype, r.send, r.recv, /*arrived=*/nullptr));
    std::vector<WeightedTerm> terms = {{buf, r.self_weight}};
    for (size_t k = 0; k < r.recv.size(); ++k) {
      terms.push_back({recv_scratch_[k].data(), r.recv[k].second});
    }
    WeightedSum(buf, dtype, count, terms);
  }
  WEFT_RETURN_IF_ERROR(Bcast(buf, count * DTypeSize(dtype), 0, ctx_.local));
  Trace(group, "communicate", start);
  start = TraceStart(timeline_);
  if (ctx_.local_size > 1) Divide(buf, dtype, count, ctx_.local_size);
  Unpack(group, buf);
  Trace(group, "combine", start);
  return OkStatus();
}

Status MpiPlane::RunPairGossip(Group& group) {
  return ExchangeAndCombine(group, group[0]->recv);  // recv = {peer: pair_weight}
}

}  // namespace

std::unique_ptr<HostPlane> MakeHostPlane(const Context& ctx, Timeline* timeline,
                                         PeerTransport* peers,
                                         std::function<void(int64_t since)> idle) {
  return std::make_unique<MpiPlane>(ctx, timeline, peers, std::move(idle));
}

}  // namespace comm
}  // namespace weft
