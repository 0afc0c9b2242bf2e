// Memory that every rank of one machine maps: the negotiation's rings and the direct
// agreement (control_channel.h), and the collectives through shared memory
// (shared_collectives.h). Internal to comm/.
#ifndef WEFT_COMM_SHARED_SEGMENT_H_
#define WEFT_COMM_SHARED_SEGMENT_H_

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace weft {
namespace comm {

class SharedSegment {
 public:
  // Collective over `local` (every rank of one machine calls it, local rank 0 among them):
  // local rank 0 makes a segment of `bytes`, zeroed, named /weft-`purpose`-PID-CLOCK; the
  // others map it, and it is unlinked once every one has, so that nothing is left in
  // /dev/shm whatever becomes of the job. Its memory is reserved at once (a full /dev/shm
  // fails here, not with SIGBUS at a later write). Returns the mapping on every rank, or
  // null on every rank when one of them passed `wanted` false or could not map it; `why`
  // then holds this rank's reason, if it had one (empty when another rank's decided).
  // `prepare`, if given, runs on local rank 0 over the new memory before any other rank can
  // see it.
  static std::unique_ptr<SharedSegment> Map(
      MPI_Comm local, int local_rank, size_t bytes, const char* purpose, bool wanted,
      std::string* why, const std::function<void(char* memory)>& prepare = nullptr);
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  char* data() const { return static_cast<char*>(memory_); }
  size_t size() const { return bytes_; }

 private:
  SharedSegment(void* memory, size_t bytes) : memory_(memory), bytes_(bytes) {}
  void* memory_;
  size_t bytes_;
};

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_SHARED_SEGMENT_H_
