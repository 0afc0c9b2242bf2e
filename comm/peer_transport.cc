// The peer transports on MPI and UCX, and the factory: the one place that chooses among the
// transports this build has.
#include "comm/peer_transport.h"

#include <climits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/mpi_util.h"
#include "comm/tcp_transport.h"
#include "core/config.h"
#ifdef WEFT_WITH_UCX
#include "comm/ucx_context.h"
#endif

namespace weft {
namespace comm {
namespace {

const config::StringSetting kExchangeTransport(
    "WEFT_EXCHANGE_TRANSPORT", "auto",
    "How neighbor_allreduce, pair_gossip and the ring allreduce move data between ranks: "
    "mpi (MPI point-to-point), ucx (UCX tagged messages; needs a build with UCX), tcp "
    "(weft's own TCP connections), or auto: tcp when the job spans several machines, mpi "
    "on one. The same on every rank.",
    {"auto", "mpi", "ucx", "tcp"}, config::Agreement::kSameOnEveryRank);

constexpr int kPeerTag = 4;

class MpiTransport : public PeerTransport {
 public:
  explicit MpiTransport(MPI_Comm comm) : comm_(comm) {}
  PeerTransportKind kind() const override { return PeerTransportKind::kMpi; }
  const char* name() const override { return "MPI"; }
  StatusOr<Ticket> Send(int peer, const void* data, size_t bytes) override {
    WEFT_RETURN_IF_ERROR(Fits(bytes));
    requests_.push_back(MPI_REQUEST_NULL);
    WEFT_RETURN_IF_ERROR(MpiCheck(MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, kPeerTag,
                                            comm_, &requests_.back()),
                                  "MPI_Isend"));
    return requests_.size() - 1;
  }
  StatusOr<Ticket> Recv(int peer, void* data, size_t bytes) override {
    WEFT_RETURN_IF_ERROR(Fits(bytes));
    requests_.push_back(MPI_REQUEST_NULL);
    WEFT_RETURN_IF_ERROR(MpiCheck(MPI_Irecv(data, static_cast<int>(bytes), MPI_BYTE, peer, kPeerTag,
                                            comm_, &requests_.back()),
                                  "MPI_Irecv"));
    return requests_.size() - 1;
  }
  Status Wait(Ticket ticket) override {
    return MpiCheck(MPI_Wait(&requests_.at(ticket), MPI_STATUS_IGNORE), "MPI_Wait");
  }
  Status WaitAll() override {
    const int code =
        MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
    requests_.clear();
    return MpiCheck(code, "MPI_Waitall");
  }

 private:
  static Status Fits(size_t bytes) {
    if (bytes <= static_cast<size_t>(INT_MAX)) return OkStatus();
    return Unimplemented("a message of ", bytes, " bytes over MPI: over 2 GiB is not supported");
  }
  MPI_Comm comm_;
  std::vector<MPI_Request> requests_;  // completed ones become MPI_REQUEST_NULL
};

#ifdef WEFT_WITH_UCX
class UcxTransport : public PeerTransport {
 public:
  explicit UcxTransport(UcxContext* ucx) : ucx_(ucx) {}
  PeerTransportKind kind() const override { return PeerTransportKind::kUcx; }
  const char* name() const override { return "UCX"; }
  StatusOr<Ticket> Send(int peer, const void* data, size_t bytes) override {
    return Posted(ucx_->TagSend(peer, data, bytes), "ucp_tag_send_nbx to rank ", peer);
  }
  StatusOr<Ticket> Recv(int peer, void* data, size_t bytes) override {
    return Posted(ucx_->TagRecv(peer, data, bytes), "ucp_tag_recv_nbx from rank ", peer);
  }
  Status Wait(Ticket ticket) override {
    ucs_status_ptr_t& request = requests_.at(ticket);
    Status status = ucx_->Wait(request, "UCX transfer");
    request = nullptr;  // freed
    return status;
  }
  Status WaitAll() override {
    Status first;
    for (Ticket t = 0; t < requests_.size(); ++t) {
      Status s = Wait(t);
      if (first.ok()) first = s;
    }
    requests_.clear();
    return first;
  }

 private:
  StatusOr<Ticket> Posted(ucs_status_ptr_t request, const char* what, int peer) {
    if (UCS_PTR_IS_ERR(request)) {
      return UcsError(UCS_PTR_STATUS(request), absl::StrCat(what, peer));
    }
    requests_.push_back(request);  // null: already complete
    return requests_.size() - 1;
  }
  UcxContext* ucx_;
  std::vector<ucs_status_ptr_t> requests_;
};
#endif  // WEFT_WITH_UCX

}  // namespace

PeerTransportKind ExchangeTransport(int machine_size) {
  const std::string value = kExchangeTransport.Get();
  if (value == "mpi") return PeerTransportKind::kMpi;
  if (value == "ucx") return PeerTransportKind::kUcx;
  if (value == "tcp") return PeerTransportKind::kTcp;
  return machine_size > 1 ? PeerTransportKind::kTcp : PeerTransportKind::kMpi;
}

StatusOr<std::unique_ptr<PeerTransport>> MakePeerTransport(
    PeerTransportKind kind, MPI_Comm data, std::function<double()> stall_timeout_s) {
  switch (kind) {
    case PeerTransportKind::kMpi:
      return std::unique_ptr<PeerTransport>(new MpiTransport(data));
    case PeerTransportKind::kTcp: {
      WEFT_ASSIGN_OR_RETURN(auto tcp, TcpTransport::Create(data, std::move(stall_timeout_s)));
      return std::unique_ptr<PeerTransport>(std::move(tcp));
    }
    case PeerTransportKind::kUcx: {
#ifdef WEFT_WITH_UCX
      WEFT_ASSIGN_OR_RETURN(UcxContext * ucx, UcxContext::Get(data));
      return std::unique_ptr<PeerTransport>(new UcxTransport(ucx));
#else
      return Unimplemented(
          "WEFT_EXCHANGE_TRANSPORT is ucx, but this build has no UCX (UCX was not found when "
          "weft was built; WEFT_UCX_HOME)");
#endif
    }
  }
  return Internal("unknown peer transport");
}

}  // namespace comm
}  // namespace weft
