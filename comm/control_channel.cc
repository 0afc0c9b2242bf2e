#include "comm/control_channel.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "comm/engine.h"
#include "comm/mpi_util.h"
#include "core/config.h"
#include "core/logging.h"

namespace weft {
namespace comm {
namespace {

const config::BoolSetting kControlSharedMemory(
    "WEFT_CONTROL_SHARED_MEMORY", true,
    "Whether the ranks on rank 0's machine exchange the negotiation's messages with it "
    "through shared memory (0: as MPI messages, as ranks on other machines do).");

// Per ring. A message that does not fit goes in pieces; a burst of 64 like ops sends about
// 1 KiB of descriptors (repeats travel as a rank, a marker and a key).
constexpr size_t kRingBytes = size_t{128} << 10;

constexpr int kDescriptorTag = 1;
constexpr int kResponseTag = 2;

}  // namespace

ControlChannel::ControlChannel(const Context& ctx)
    : rank_(ctx.rank), size_(ctx.size), comm_(ctx.control) {
  senders_.resize(size_);
  receivers_.resize(size_);
  mpi_peers_ = rank_ == 0 && size_ > 1;  // until Open gives rank 0's machine rings
}

std::unique_ptr<ControlChannel> ControlChannel::Open(const Context& ctx) {
  std::unique_ptr<ControlChannel> channel(new ControlChannel(ctx));
  // Machine 0 holds rank 0 (machines are numbered by their lowest rank), as local rank 0.
  if (ctx.machine_rank != 0 || ctx.local_size < 2) return channel;
  std::vector<int> ranks(ctx.local_size);  // by local rank
  MPI_Allgather(&ctx.rank, 1, MPI_INT, ranks.data(), 1, MPI_INT, ctx.local);
  const size_t ring_bytes = ByteRing::Footprint(kRingBytes);
  const size_t rings_bytes = (2 * ring_bytes * (ctx.local_size - 1) + 63) / 64 * 64;
  // When every rank is on this machine, the segment holds their direct agreement too.
  const bool agreement = ctx.local_size == ctx.size;
  const size_t segment_bytes = rings_bytes + (agreement ? Agreement::Footprint(ctx.size) : 0);
  int ok = kControlSharedMemory.Get() ? 1 : 0;
  std::string why;  // this rank's reason for MPI, when the setting did not decide it
  char name[64] = {};
  void* memory = MAP_FAILED;
  if (ctx.rank == 0 && ok) {
    // Unique among the processes alive on this host (the pid), and across inits and a dead
    // job's leftover of the same pid (the clock; O_EXCL refuses a name that exists).
    int fd = -1;
    for (int attempt = 0; attempt < 3 && fd < 0; ++attempt) {
      std::snprintf(name, sizeof(name), "/weft-control-%ld-%llx", static_cast<long>(getpid()),
                    static_cast<unsigned long long>(
                        std::chrono::steady_clock::now().time_since_epoch().count()));
      fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
      why = absl::StrCat("shm_open(", name, "): ", std::strerror(errno));
      name[0] = '\0';
    } else {
      // tmpfs reserves no memory for a file's size: a full /dev/shm would end the job with
      // SIGBUS at the first write into an untouched page. Reserve it now, or use MPI.
      int reserved = ftruncate(fd, static_cast<off_t>(segment_bytes)) == 0 ? 0 : errno;
      if (reserved == 0) reserved = posix_fallocate(fd, 0, static_cast<off_t>(segment_bytes));
      if (reserved != 0) {
        why = absl::StrCat("reserving ", segment_bytes, " bytes for ", name, ": ",
                           std::strerror(reserved));
      } else {
        memory = mmap(nullptr, segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (memory == MAP_FAILED) why = absl::StrCat("mmap(", name, "): ", std::strerror(errno));
      }
      close(fd);
    }
    if (memory == MAP_FAILED) {
      if (name[0] != '\0') shm_unlink(name);
      name[0] = '\0';
      ok = 0;
    } else {
      // The agreement's memory starts zeroed, as the file's pages do.
      for (size_t at = 0; at + ring_bytes <= rings_bytes; at += ring_bytes) {
        ByteRing::Initialize(static_cast<char*>(memory) + at);
      }
    }
  }
  MPI_Bcast(name, sizeof(name), MPI_CHAR, 0, ctx.local);
  if (ctx.rank != 0 && ok && name[0] != '\0') {
    const int fd = shm_open(name, O_RDWR, 0);
    struct stat st;
    if (fd < 0) {
      why = absl::StrCat("shm_open(", name, "): ", std::strerror(errno));
    } else if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != segment_bytes) {
      why = absl::StrCat(name, " is not the segment rank 0 made");
    } else {
      memory = mmap(nullptr, segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (memory == MAP_FAILED) why = absl::StrCat("mmap(", name, "): ", std::strerror(errno));
    }
    if (fd >= 0) close(fd);
    if (memory == MAP_FAILED) ok = 0;
  }
  // Every rank of the machine has mapped it, or none uses it.
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, ctx.local);
  if (ctx.rank == 0 && name[0] != '\0') shm_unlink(name);
  if (!why.empty()) {
    WEFT_LOG(Warning) << "negotiation messages go through MPI, not shared memory: " << why;
  }
  if (!ok) {
    if (memory != MAP_FAILED) munmap(memory, segment_bytes);
    WEFT_LOG(Debug) << "negotiation messages with rank 0 go as MPI messages"
                    << (kControlSharedMemory.Get()
                            ? " (another rank of this machine has WEFT_CONTROL_SHARED_MEMORY "
                              "off, or could not map shared memory)"
                            : " (WEFT_CONTROL_SHARED_MEMORY is off)");
    return channel;
  }
  WEFT_LOG(Debug) << "negotiation messages with rank 0 go through shared memory (" << ctx.local_size
                  << " ranks on its machine)";
  channel->segment_ = memory;
  channel->segment_bytes_ = segment_bytes;
  if (agreement) {
    channel->agreement_ =
        std::make_unique<Agreement>(static_cast<char*>(memory) + rings_bytes, ctx.size, ctx.rank);
  }
  for (int local = 1; local < ctx.local_size; ++local) {
    char* up = static_cast<char*>(memory) + 2 * ring_bytes * (local - 1);
    char* down = up + ring_bytes;
    const int r = ranks[local];
    if (ctx.rank == 0) {
      channel->receivers_[r] = std::make_unique<RingReceiver>(ByteRing(up, kRingBytes));
      channel->senders_[r] = std::make_unique<RingSender>(ByteRing(down, kRingBytes));
      channel->ring_ranks_.push_back(r);
      channel->rings_out_.push_back(channel->senders_[r].get());
    } else if (ctx.rank == r) {
      channel->senders_[0] = std::make_unique<RingSender>(ByteRing(up, kRingBytes));
      channel->receivers_[0] = std::make_unique<RingReceiver>(ByteRing(down, kRingBytes));
      channel->rings_out_.push_back(channel->senders_[0].get());
    }
  }
  channel->mpi_peers_ = ctx.rank == 0 && ctx.size > ctx.local_size;
  return channel;
}

ControlChannel::~ControlChannel() {
  if (segment_ != nullptr) munmap(segment_, segment_bytes_);
}

void ControlChannel::SendToCoordinator(std::shared_ptr<const std::string> bytes) {
  if (senders_[0] != nullptr) {
    senders_[0]->Send(std::move(bytes));
  } else {
    SendMpi(0, kDescriptorTag, std::move(bytes));
  }
}

void ControlChannel::SendToAll(const std::shared_ptr<const std::string>& bytes) {
  for (int r = 1; r < size_; ++r) {
    if (senders_[r] != nullptr) {
      senders_[r]->Send(bytes);
    } else {
      SendMpi(r, kResponseTag, bytes);
    }
  }
}

void ControlChannel::SendMpi(int to, int tag, std::shared_ptr<const std::string> bytes) {
  MPI_Request req;
  MPI_Isend(bytes->data(), static_cast<int>(bytes->size()), MPI_BYTE, to, tag, comm_, &req);
  mpi_sends_.emplace_back(req, std::move(bytes));
}

bool ControlChannel::ReceiveDescriptors(int* from, std::string* bytes) {
  // The rings in turn, and MPI's messages (the other machines') in turn with them.
  if (mpi_first_) {
    mpi_first_ = false;
    if (ReceiveMpi(MPI_ANY_SOURCE, kDescriptorTag, from, bytes)) return true;
  }
  const size_t n = ring_ranks_.size();
  for (size_t i = 0; i < n; ++i) {
    const size_t at = (next_ring_ + i) % n;
    const int r = ring_ranks_[at];
    if (receivers_[r]->Receive(bytes)) {
      *from = r;
      next_ring_ = (at + 1) % n;
      mpi_first_ = mpi_peers_;
      return true;
    }
  }
  return mpi_peers_ && ReceiveMpi(MPI_ANY_SOURCE, kDescriptorTag, from, bytes);
}

bool ControlChannel::ReceiveResponses(std::string* bytes) {
  if (receivers_[0] != nullptr) return receivers_[0]->Receive(bytes);
  int from = 0;
  return ReceiveMpi(0, kResponseTag, &from, bytes);
}

bool ControlChannel::ReceiveMpi(int source, int tag, int* from, std::string* bytes) {
  // One message per call: the caller acts on it (the coordinator answers, an answered op
  // completes) before probing again. A probe that finds nothing yields inside Open MPI
  // where mpi_yield_when_idle is on (ranks outnumber cores), and draining until one did
  // put that yield between an op's last descriptor and its answer on rank 0, and between
  // the answer and the caller's return on the others: a scheduling turn of all the ranks
  // per op (bench/README.md, "Waiting between polls").
  int flag = 0;
  MPI_Status status;
  MPI_Iprobe(source, tag, comm_, &flag, &status);
  if (!flag) return false;
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  bytes->assign(static_cast<size_t>(count), '\0');
  MPI_Recv(&(*bytes)[0], count, MPI_BYTE, status.MPI_SOURCE, tag, comm_, MPI_STATUS_IGNORE);
  *from = status.MPI_SOURCE;
  return true;
}

bool ControlChannel::Flush() {
  for (RingSender* ring : rings_out_) ring->Flush();
  const bool done = RingsIdle();
  if (!done) MpiProgress();  // the reader may be in MPI, waiting for this rank (header)
  for (size_t i = 0; i < mpi_sends_.size();) {
    int finished = 0;
    MPI_Test(&mpi_sends_[i].first, &finished, MPI_STATUS_IGNORE);
    if (finished) {
      mpi_sends_[i] = std::move(mpi_sends_.back());
      mpi_sends_.pop_back();
    } else {
      ++i;
    }
  }
  return done && mpi_sends_.empty();
}

bool ControlChannel::Delivered(const std::vector<int32_t>& ranks) {
  Flush();
  if (ranks.empty()) return RingsIdle();
  return std::all_of(ranks.begin(), ranks.end(),
                     [this](int32_t r) { return senders_[r] == nullptr || senders_[r]->idle(); });
}

bool ControlChannel::sending() const { return !mpi_sends_.empty() || !RingsIdle(); }

bool ControlChannel::RingsIdle() const {
  return std::all_of(rings_out_.begin(), rings_out_.end(),
                     [](const RingSender* ring) { return ring->idle(); });
}

}  // namespace comm
}  // namespace weft
