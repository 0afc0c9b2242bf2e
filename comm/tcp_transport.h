// weft's own TCP transport for the engine's peer-to-peer traffic (peer_transport.h).
//
// Open MPI's TCP transport reached 0.5-0.65 of a shaped 1 Gbit/s link between machines when
// peers change from one message to the next, where plain sockets reach 0.95
// (bench/README.md). This transport keeps one connection per ordered pair of ranks, made
// at the pair's first message and kept for the job, and moves each message with plain
// non-blocking send/recv calls straight between the caller's buffers and the sockets.
//
// Addresses: every rank listens on an ephemeral port of every interface and publishes, at
// init, its IPv4 addresses (WEFT_SOCKET_IFNAME chooses which), its network namespace and
// its machine as MPI sees it. Ranks in the same namespace of the same machine connect over
// loopback; others try the peer's addresses in order. A connection counts only once both
// sides have checked the other's job and rank and that it was meant for them (a greeting
// each way), so an address that leads elsewhere (a bridge that exists on every machine,
// another rank) is skipped rather than used. A thread per process accepts connections and
// answers greetings, so a peer busy elsewhere never makes a connecting rank wait.
//
// Faults: a connection that fails (reset, closed by a dead process, refused) fails every
// transfer waiting on it and every later one between the two ranks, with the reason; with
// WEFT_STALL_TIMEOUT_SECONDS set, transfers that move no byte for that long fail too.
// The pair is not used again in the job (its stream position is lost); the peer's side then
// fails too (its connection closes). Abandon() does the same after an op failed partway.
#ifndef WEFT_COMM_TCP_TRANSPORT_H_
#define WEFT_COMM_TCP_TRANSPORT_H_

#include <mpi.h>
#include <poll.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/peer_transport.h"
#include "core/status.h"

namespace weft {
namespace comm {

class TcpTransport : public PeerTransport {
 public:
  // Collective over `data`. `stall_timeout_s` gives WEFT_STALL_TIMEOUT_SECONDS (0: none).
  static StatusOr<std::unique_ptr<TcpTransport>> Create(MPI_Comm data,
                                                        std::function<double()> stall_timeout_s);
  ~TcpTransport() override;

  PeerTransportKind kind() const override { return PeerTransportKind::kTcp; }
  const char* name() const override { return "TCP"; }
  StatusOr<Ticket> Send(int peer, const void* data, size_t bytes) override;
  StatusOr<Ticket> Recv(int peer, void* data, size_t bytes) override;
  Status Wait(Ticket ticket) override;
  Status WaitAll() override;
  void Abandon(int peer, const std::string& why) override;

  // The greeting each side of a new connection sends: who it is, for which job.
  struct Greeting {
    uint32_t magic = 0, version = 0;
    uint64_t job = 0;
    uint32_t rank = 0;  // who greets
    uint32_t to = 0;    // whom
  };
  static constexpr size_t kGreetingBytes = 24;

 private:
  struct Transfer {
    int peer = -1;
    char* data = nullptr;
    size_t bytes = 0, done = 0;
    bool send = false, complete = false;
    Status status;
  };
  enum class Link { kNone, kConnecting, kGreeting, kReady };
  struct Peer {
    bool same_namespace = false;
    uint16_t port = 0;
    std::vector<std::string> addresses;  // to try, in order
    // This rank's connection to the peer (this rank's sends).
    int out_fd = -1;
    Link out = Link::kNone;
    size_t next_address = 0;  // the address the connection tries now
    int64_t attempt_deadline_us = 0;
    std::string greeting_in;  // the peer's reply, as it arrives
    std::string attempts;     // what each address did, for the error
    // The peer's connection to this rank (this rank's receives).
    int in_fd = -1;
    bool received_any = false;        // a byte came on in_fd
    std::deque<Ticket> sends, recvs;  // pending, in order
    std::string broken;               // non-empty: why the pair is unusable
  };
  // A connection accepted but not yet introduced (the acceptor thread's).
  struct Newcomer {
    int fd = -1;
    std::string greeting;
    int64_t since_us = 0;
  };

  TcpTransport() = default;
  // Collective: connects every rank to the next; fails on every rank if one could not.
  // prev_tries: how many addresses the previous rank tries to reach this one.
  Status ConnectRing(MPI_Comm data, size_t prev_tries);
  Status Check(int peer, const char* what) const;
  StatusOr<Ticket> Post(int peer, char* data, size_t bytes, bool send);
  // Starts a connection attempt to the peer's next address.
  void StartConnect(int peer);
  void ConnectFailed(int peer, const std::string& why);
  void Break(int peer, const std::string& why);
  // One round: moves whatever can move, waiting up to `timeout_ms` for something to.
  // True if a byte, a connection or a greeting moved.
  bool Step(int timeout_ms);
  // Moves bytes of the peer's pending sends (or receives) until the socket would block.
  bool Pump(int peer, bool sending);
  // The acceptor thread: accepts connections, checks their greetings, replies, and hands
  // them to the engine's thread through arrived_.
  void AcceptLoop();
  bool Introduce(Newcomer& n);  // true when done with it (handed over or dropped)
  static std::string ReadGreetingInto(int fd, std::string* buffer);  // error text, or ""
  // The engine's thread: installs the connections the acceptor handed over. True if any.
  bool InstallArrived();
  // Waits until `done()` holds; fails stalled transfers after the stall timeout.
  template <typename Done>
  void Drive(Done done);

  int rank_ = 0, size_ = 1;
  std::function<double()> stall_timeout_s_;
  uint64_t job_ = 0;
  int listen_fd_ = -1;
  std::vector<Peer> peers_;
  std::thread acceptor_;
  std::atomic<bool> stop_{false};
  std::mutex arrived_mu_;
  std::vector<std::pair<int, int>> arrived_;  // arrived_mu_: (rank, connection) introduced
  int wake_[2] = {-1, -1};                    // a byte on wake_ when arrived_ grew
  // Step()'s poll set, kept between rounds.
  enum class PollKind { kWake, kOut, kIn };
  std::vector<struct pollfd> poll_fds_;
  std::vector<std::pair<PollKind, int>> poll_what_;
  std::vector<Transfer> transfers_;
  size_t pending_ = 0;  // transfers_ not complete
};

// Which interfaces are offered under a WEFT_SOCKET_IFNAME value (exposed for the test).
bool SocketInterfaceOffered(const std::string& ifname, const std::string& spec);

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_TCP_TRANSPORT_H_
