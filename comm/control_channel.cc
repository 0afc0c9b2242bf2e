#include "comm/control_channel.h"

#include <algorithm>

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
  std::string why;  // this rank's reason for MPI, when the setting did not decide it
  // The rings are ready before any other rank sees them; the agreement's memory starts
  // zeroed, as the segment does.
  auto init_rings = [&](char* memory) {
    for (size_t at = 0; at + ring_bytes <= rings_bytes; at += ring_bytes) {
      ByteRing::Initialize(memory + at);
    }
  };
  channel->segment_ = SharedSegment::Map(ctx.local, ctx.local_rank, segment_bytes, "control",
                                         kControlSharedMemory.Get(), &why, init_rings);
  if (!why.empty()) {
    WEFT_LOG(Warning) << "negotiation messages go through MPI, not shared memory: " << why;
  }
  if (channel->segment_ == nullptr) {
    WEFT_LOG(Debug) << "negotiation messages with rank 0 go as MPI messages"
                    << (kControlSharedMemory.Get()
                            ? " (another rank of this machine has WEFT_CONTROL_SHARED_MEMORY "
                              "off, or could not map shared memory)"
                            : " (WEFT_CONTROL_SHARED_MEMORY is off)");
    return channel;
  }
  char* memory = channel->segment_->data();
  WEFT_LOG(Debug) << "negotiation messages with rank 0 go through shared memory (" << ctx.local_size
                  << " ranks on its machine)";
  if (agreement) {
    channel->agreement_ = std::make_unique<Agreement>(memory + rings_bytes, ctx.size, ctx.rank);
  }
  for (int local = 1; local < ctx.local_size; ++local) {
    char* up = memory + 2 * ring_bytes * (local - 1);
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

ControlChannel::~ControlChannel() = default;

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
