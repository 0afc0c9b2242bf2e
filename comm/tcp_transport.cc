#include "comm/tcp_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "comm/mpi_util.h"
#include "core/codec.h"
#include "core/config.h"
#include "core/logging.h"
#include "core/timeline.h"

namespace weft {
namespace comm {
namespace {

constexpr uint32_t kMagic = 0x74666577;  // "weft", little-endian
constexpr uint32_t kVersion = 1;

const config::StringSetting kSocketIfname(
    "WEFT_SOCKET_IFNAME", "",
    "Which network interfaces' IPv4 addresses weft's TCP transport offers to ranks on other "
    "machines: interface name prefixes separated by commas (eth,ib), or after a ^ the "
    "prefixes to leave out (^docker,virbr). Empty: every interface that is up, except "
    "loopback and names starting with docker or virbr. Ranks in one network namespace "
    "always connect over loopback.");
const config::DoubleSetting kConnectTimeout(
    "WEFT_SOCKET_CONNECT_TIMEOUT_SECONDS", 20,
    "How long weft's TCP transport tries each of a peer's addresses before the next one.",
    /*min=*/0.01, /*max=*/1e6);
int64_t NowMicros() { return Timeline::NowMicros(); }

std::string ErrnoText(int code) { return std::strerror(code); }

// Where loopback reaches: the host name and the network namespace of this process.
std::string NamespaceKey() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  struct stat st;
  if (stat("/proc/self/ns/net", &st) == 0) {
    return absl::StrCat(host, "/", st.st_dev, ":", st.st_ino);
  }
  return host;
}

std::vector<std::string> OfferedAddresses(const std::string& spec) {
  std::vector<std::string> out;
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (struct ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    if (!SocketInterfaceOffered(i->ifa_name, spec)) continue;
    char text[INET_ADDRSTRLEN] = {0};
    const auto* in = reinterpret_cast<const struct sockaddr_in*>(i->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) out.push_back(text);
  }
  freeifaddrs(list);
  return out;
}

std::string EncodeGreeting(uint64_t job, int from, int to) {
  std::string out;
  codec::Writer w(&out);
  w.Put(kMagic);
  w.Put(kVersion);
  w.Put(job);
  w.Put(static_cast<uint32_t>(from));
  w.Put(static_cast<uint32_t>(to));
  return out;
}

// Empty if `bytes` greets from `rank` (any rank when negative) of job `job`.
// Empty if `bytes` greets `to` from `rank` (any rank when negative) of job `job`.
std::string CheckGreeting(const std::string& bytes, uint64_t job, int rank, int to, int size,
                          int* from) {
  codec::Reader r(bytes, "greeting");
  TcpTransport::Greeting g;
  if (!r.Get("magic", &g.magic).ok() || !r.Get("version", &g.version).ok() ||
      !r.Get("job", &g.job).ok() || !r.Get("rank", &g.rank).ok() || !r.Get("to", &g.to).ok() ||
      g.magic != kMagic) {
    return "not a weft peer";
  }
  if (g.version != kVersion) {
    return absl::StrCat("a weft peer speaking version ", g.version, " (this one: ", kVersion, ")");
  }
  if (g.job != job) return "a weft rank of another job";
  if (g.rank >= static_cast<uint32_t>(size)) return absl::StrCat("rank ", g.rank, " out of range");
  if (rank >= 0 && g.rank != static_cast<uint32_t>(rank)) {
    return absl::StrCat("rank ", g.rank, " of this job, not rank ", rank);
  }
  if (g.to != static_cast<uint32_t>(to)) {
    return absl::StrCat("a greeting for rank ", g.to, ", not rank ", to);
  }
  *from = static_cast<int>(g.rank);
  return "";
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

bool SocketInterfaceOffered(const std::string& ifname, const std::string& spec) {
  if (spec.empty()) {
    return !absl::StartsWith(ifname, "docker") && !absl::StartsWith(ifname, "virbr");
  }
  const bool exclude = spec[0] == '^';
  bool match = false;
  for (absl::string_view prefix :
       absl::StrSplit(exclude ? spec.substr(1) : spec, ',', absl::SkipWhitespace())) {
    if (absl::StartsWith(ifname, prefix)) match = true;
  }
  return exclude ? !match : match;
}

StatusOr<std::unique_ptr<TcpTransport>> TcpTransport::Create(
    MPI_Comm data, std::function<double()> stall_timeout_s) {
  std::unique_ptr<TcpTransport> t(new TcpTransport);
  t->stall_timeout_s_ = std::move(stall_timeout_s);
  MPI_Comm_rank(data, &t->rank_);
  MPI_Comm_size(data, &t->size_);

  // Every rank publishes a record, empty when it could not listen, so that all ranks
  // fail init together.
  std::string failure;
  uint16_t port = 0;
  t->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (t->listen_fd_ < 0) {
    failure = absl::StrCat("socket: ", ErrnoText(errno));
  } else {
    struct sockaddr_in addr;
    std::memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (bind(t->listen_fd_, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) != 0) {
      failure = absl::StrCat("bind: ", ErrnoText(errno));
    } else if (listen(t->listen_fd_, std::max(128, t->size_)) != 0) {
      failure = absl::StrCat("listen: ", ErrnoText(errno));
    } else if (getsockname(t->listen_fd_, reinterpret_cast<struct sockaddr*>(&addr), &len) != 0) {
      failure = absl::StrCat("getsockname: ", ErrnoText(errno));
    } else {
      port = ntohs(addr.sin_port);
    }
  }
  // The machine as MPI sees it (the lowest rank sharing memory with this one): with the
  // host name and network namespace, it tells when loopback reaches a peer (the root
  // namespace's number is the same on every Linux machine). Not the engine's machine_rank,
  // which WEFT_RANKS_PER_MACHINE may split one host into.
  int node = t->rank_;
  {
    MPI_Comm shared = MPI_COMM_NULL;
    MPI_Comm_split_type(data, MPI_COMM_TYPE_SHARED, t->rank_, MPI_INFO_NULL, &shared);
    MPI_Allreduce(&t->rank_, &node, 1, MPI_INT, MPI_MIN, shared);
    MPI_Comm_free(&shared);
  }
  uint64_t job = 0;
  if (t->rank_ == 0) job = std::random_device{}() * uint64_t{0x100000001} ^ NowMicros();
  std::string record;
  if (failure.empty()) {
    codec::Writer w(&record);
    w.Put(kMagic);
    w.Put(job);
    w.Put(port);
    w.Str(absl::StrCat(NamespaceKey(), "@", node));
    const std::vector<std::string> addresses = OfferedAddresses(kSocketIfname.Get());
    w.Put(static_cast<uint32_t>(addresses.size()));
    for (const std::string& a : addresses) w.Str(a);
  } else {
    record = failure;  // not starting with the magic
  }
  WEFT_ASSIGN_OR_RETURN(std::vector<std::string> records,
                        AllgatherBytes(data, record.data(), record.size()));
  t->peers_.resize(t->size_);
  std::vector<std::string> keys(t->size_);
  for (int r = 0; r < t->size_; ++r) {
    codec::Reader in(records[r], "TCP transport address record");
    uint32_t magic = 0, count = 0;
    uint64_t their_job = 0;
    Peer& p = t->peers_[r];
    if (!in.Get("magic", &magic).ok() || magic != kMagic) {
      return Internal("TCP transport: rank ", r,
                      " could not open a listening socket: ", records[r]);
    }
    Status s = in.Get("job", &their_job);
    if (s.ok()) s = in.Get("port", &p.port);
    if (s.ok()) s = in.Str("namespace", &keys[r]);
    if (s.ok()) s = in.Get("addresses", &count);
    for (uint32_t k = 0; s.ok() && k < count; ++k) {
      p.addresses.emplace_back();
      s = in.Str("address", &p.addresses.back());
    }
    if (!s.ok()) return Annotate(s, absl::StrCat("TCP transport: rank ", r, "'s record"));
    if (r == 0) t->job_ = their_job;
  }
  // Every rank checks the same records, so a rank that others cannot reach fails init
  // everywhere alike.
  for (int r = 0; r < t->size_; ++r) {
    if (!t->peers_[r].addresses.empty()) continue;
    for (int s = 0; s < t->size_; ++s) {
      if (keys[s] == keys[r]) continue;
      return FailedPrecondition(
          "TCP transport: rank ", r, " (", keys[r].substr(0, keys[r].find('/')),
          ") has no IPv4 address to offer ranks on other machines (WEFT_SOCKET_IFNAME=\"",
          kSocketIfname.Get(),
          "\" there); set WEFT_SOCKET_IFNAME to an interface that is up, "
          "or WEFT_EXCHANGE_TRANSPORT=mpi");
    }
  }
  const int prev = (t->rank_ + t->size_ - 1) % t->size_;
  const size_t prev_tries = keys[prev] == keys[t->rank_] ? 1 : t->peers_[t->rank_].addresses.size();
  for (int r = 0; r < t->size_; ++r) {
    Peer& p = t->peers_[r];
    p.same_namespace = keys[r] == keys[t->rank_];
    if (p.same_namespace) p.addresses = {"127.0.0.1"};
  }
  if (pipe2(t->wake_, O_NONBLOCK | O_CLOEXEC) != 0) {
    return Internal("TCP transport: pipe2: ", ErrnoText(errno));
  }
  TcpTransport* raw = t.get();
  t->acceptor_ = std::thread([raw] { raw->AcceptLoop(); });
  WEFT_RETURN_IF_ERROR(t->ConnectRing(data, prev_tries));
  return t;
}

Status TcpTransport::ConnectRing(MPI_Comm data, size_t prev_tries) {
  // Each rank connects to the next one, so that an address or port that cannot be reached
  // fails init on every rank, with the reason, instead of a later op on some ranks only.
  std::string failure;
  if (size_ > 1) {
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    StartConnect(next);
    // This rank tries next's addresses while prev tries this rank's: wait for the longer.
    const size_t tries = std::max<size_t>({1, peers_[next].addresses.size(), prev_tries});
    const int64_t deadline =
        NowMicros() + static_cast<int64_t>((kConnectTimeout.Get() * tries + 5) * 1e6);
    auto connected = [&] {
      return peers_[next].out == Link::kReady || !peers_[next].broken.empty();
    };
    while ((!connected() || peers_[prev].in_fd < 0) && NowMicros() < deadline) Step(100);
    if (!peers_[next].broken.empty()) {
      failure = absl::StrCat("rank ", rank_, " could not connect to rank ", next, ": ",
                             peers_[next].broken);
    } else if (!connected()) {
      failure = absl::StrCat("rank ", rank_, " could not connect to rank ", next, ": ",
                             peers_[next].attempts, " (timed out)");
    }
  }
  WEFT_ASSIGN_OR_RETURN(std::vector<std::string> failures,
                        AllgatherBytes(data, failure.data(), failure.size()));
  for (const std::string& f : failures) {
    if (!f.empty()) {
      return FailedPrecondition("TCP transport: ", f,
                                " (WEFT_SOCKET_IFNAME chooses the interfaces; a "
                                "firewall must let the ranks connect to each other's ports)");
    }
  }
  return OkStatus();
}

TcpTransport::~TcpTransport() {
  if (acceptor_.joinable()) {
    stop_.store(true);
    acceptor_.join();  // within its 100 ms poll
  }
  for (Peer& p : peers_) {
    if (p.out_fd >= 0) close(p.out_fd);
    if (p.in_fd >= 0) close(p.in_fd);
  }
  for (int fd : wake_) {
    if (fd >= 0) close(fd);
  }
  for (const auto& [rank, fd] : arrived_) close(fd);
  if (listen_fd_ >= 0) close(listen_fd_);
}

Status TcpTransport::Check(int peer, const char* what) const {
  if (peer < 0 || peer >= size_)
    return Internal("TCP transport: ", what, " rank ", peer, " of ", size_);
  if (peer == rank_) return Internal("TCP transport: ", what, " this rank itself");
  if (!peers_[peer].broken.empty()) {
    return Aborted("the TCP connection between ranks ", rank_, " and ", peer,
                   " failed earlier in this job (", peers_[peer].broken,
                   "), so the two cannot exchange data any more");
  }
  return OkStatus();
}

StatusOr<PeerTransport::Ticket> TcpTransport::Post(int peer, char* data, size_t bytes, bool send) {
  WEFT_RETURN_IF_ERROR(Check(peer, send ? "a send to" : "a receive from"));
  const Ticket ticket = transfers_.size();
  Transfer x;
  x.peer = peer;
  x.data = data;
  x.bytes = bytes;
  x.send = send;
  x.complete = bytes == 0;  // nothing goes on the wire
  transfers_.push_back(std::move(x));
  if (bytes == 0) return ticket;
  ++pending_;
  Peer& p = peers_[peer];
  (send ? p.sends : p.recvs).push_back(ticket);
  if (send && p.out == Link::kNone) StartConnect(peer);
  return ticket;
}

StatusOr<PeerTransport::Ticket> TcpTransport::Send(int peer, const void* data, size_t bytes) {
  return Post(peer, const_cast<char*>(static_cast<const char*>(data)), bytes, /*send=*/true);
}

StatusOr<PeerTransport::Ticket> TcpTransport::Recv(int peer, void* data, size_t bytes) {
  return Post(peer, static_cast<char*>(data), bytes, /*send=*/false);
}

void TcpTransport::StartConnect(int peer) {
  Peer& p = peers_[peer];
  while (p.next_address < p.addresses.size()) {
    const std::string& address = p.addresses[p.next_address];
    struct sockaddr_in addr;
    std::memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_port = htons(p.port);
    if (inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) {
      ConnectFailed(peer, "not an IPv4 address");
      continue;
    }
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      Break(peer, absl::StrCat("socket: ", ErrnoText(errno)));
      return;
    }
    SetNoDelay(fd);
    p.out_fd = fd;
    p.out = Link::kConnecting;
    p.greeting_in.clear();
    p.attempt_deadline_us = NowMicros() + static_cast<int64_t>(kConnectTimeout.Get() * 1e6);
    if (connect(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) == 0 ||
        errno == EINPROGRESS) {
      return;  // Step() finishes it
    }
    ConnectFailed(peer, ErrnoText(errno));
  }
  Break(peer, absl::StrCat(
                  "could not connect to it on port ", p.port, ": ",
                  p.attempts.empty() ? "it offers no address (WEFT_SOCKET_IFNAME)" : p.attempts));
}

void TcpTransport::ConnectFailed(int peer, const std::string& why) {
  Peer& p = peers_[peer];
  if (p.out_fd >= 0) close(p.out_fd);
  p.out_fd = -1;
  p.out = Link::kNone;
  absl::StrAppend(&p.attempts, p.attempts.empty() ? "" : "; ", p.addresses[p.next_address], ": ",
                  why);
  ++p.next_address;
}

void TcpTransport::Break(int peer, const std::string& why) {
  Peer& p = peers_[peer];
  if (p.broken.empty()) p.broken = why;
  if (p.out_fd >= 0) close(p.out_fd);
  if (p.in_fd >= 0) close(p.in_fd);
  p.out_fd = p.in_fd = -1;
  p.out = Link::kNone;
  const Status status =
      Aborted("TCP transfer between ranks ", rank_, " and ", peer, " failed: ", p.broken);
  for (std::deque<Ticket>* queue : {&p.sends, &p.recvs}) {
    for (Ticket t : *queue) {
      transfers_[t].complete = true;
      transfers_[t].status = status;
      --pending_;
    }
    queue->clear();
  }
}

bool TcpTransport::Pump(int peer, bool sending) {
  Peer& p = peers_[peer];
  std::deque<Ticket>& queue = sending ? p.sends : p.recvs;
  bool moved = false;
  while (!queue.empty() && (sending ? p.out == Link::kReady : p.in_fd >= 0)) {
    Transfer& x = transfers_[queue.front()];
    const ssize_t n =
        sending ? ::send(p.out_fd, x.data + x.done, x.bytes - x.done, MSG_DONTWAIT | MSG_NOSIGNAL)
                : ::recv(p.in_fd, x.data + x.done, x.bytes - x.done, MSG_DONTWAIT);
    if (n > 0) {
      moved = true;
      if (!sending) p.received_any = true;
      x.done += static_cast<size_t>(n);
      if (x.done == x.bytes) {
        x.complete = true;
        --pending_;
        queue.pop_front();
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    Break(peer, !sending && n == 0
                    ? std::string("the rank closed the connection (its process ended?)")
                    : absl::StrCat(sending ? "sending: " : "receiving: ", ErrnoText(errno)));
    return true;
  }
  return moved;
}

void TcpTransport::AcceptLoop() {
  // Connections are introduced here, on a thread of their own, so that a rank answers a
  // peer's greeting at once even while it computes or waits in another call; the engine's
  // thread only installs what arrived (InstallArrived).
  std::vector<Newcomer> newcomers;
  const int64_t greeting_limit_us = static_cast<int64_t>(kConnectTimeout.Get() * 1e6);
  while (!stop_.load()) {
    std::vector<struct pollfd> fds = {{listen_fd_, POLLIN, 0}};
    for (const Newcomer& n : newcomers) fds.push_back({n.fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), /*timeout_ms=*/100) < 0) continue;
    const int64_t now = NowMicros();
    std::vector<Newcomer> kept;
    for (size_t k = 0; k < newcomers.size(); ++k) {
      Newcomer& n = newcomers[k];
      if (fds[k + 1].revents != 0 && Introduce(n)) continue;  // introduced or dropped
      if (now - n.since_us > greeting_limit_us) {
        WEFT_LOG(Debug) << "TCP transport: dropped a connection that never greeted";
        close(n.fd);
        continue;
      }
      kept.push_back(std::move(n));
    }
    newcomers.swap(kept);
    if (fds[0].revents == 0) continue;
    for (;;) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        break;  // EAGAIN, or out of descriptors: tried again at the next readiness
      }
      SetNoDelay(fd);
      newcomers.push_back({fd, "", now});
    }
  }
  for (Newcomer& n : newcomers) close(n.fd);
}

std::string TcpTransport::ReadGreetingInto(int fd, std::string* buffer) {
  char bytes[kGreetingBytes];
  while (buffer->size() < kGreetingBytes) {
    const ssize_t n = ::recv(fd, bytes, kGreetingBytes - buffer->size(), MSG_DONTWAIT);
    if (n > 0) {
      buffer->append(bytes, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return "";
    return n == 0 ? "closed before greeting" : ErrnoText(errno);
  }
  return "";
}

bool TcpTransport::Introduce(Newcomer& n) {
  const std::string error = ReadGreetingInto(n.fd, &n.greeting);
  if (error.empty() && n.greeting.size() < kGreetingBytes) return false;
  int from = -1;
  const std::string bad =
      error.empty() ? CheckGreeting(n.greeting, job_, /*rank=*/-1, rank_, size_, &from) : error;
  // The reply: who this rank is. It always fits in a new socket's buffer.
  const std::string reply = EncodeGreeting(job_, rank_, from);
  if (!bad.empty() || from == rank_ ||
      ::send(n.fd, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL) !=
          static_cast<ssize_t>(reply.size())) {
    WEFT_LOG(Debug) << "TCP transport: dropped a connection: " << (bad.empty() ? "reply" : bad);
    close(n.fd);
    return true;
  }
  {
    std::lock_guard<std::mutex> lock(arrived_mu_);
    arrived_.emplace_back(from, n.fd);
  }
  const char byte = 1;
  [[maybe_unused]] ssize_t ignored = ::write(wake_[1], &byte, 1);  // full pipe: already due
  return true;
}

bool TcpTransport::InstallArrived() {
  char drain[64];
  while (::read(wake_[0], drain, sizeof(drain)) > 0) {
  }
  std::vector<std::pair<int, int>> arrived;
  {
    std::lock_guard<std::mutex> lock(arrived_mu_);
    arrived.swap(arrived_);
  }
  for (const auto& [from, fd] : arrived) {
    Peer& p = peers_[from];
    if (!p.broken.empty()) {
      close(fd);  // the pair is not used again
      continue;
    }
    if (p.in_fd >= 0) {
      if (p.received_any) {
        // Bytes came on the first connection: where this one's stream begins is unknown.
        close(fd);
        Break(from, "it connected a second time after its first connection carried data");
        continue;
      }
      // Its first attempt reached this rank but not its reply in time (it then tried its
      // next address): nothing came on that one, so the new connection replaces it.
      close(p.in_fd);
    }
    p.in_fd = fd;
  }
  return !arrived.empty();
}

void TcpTransport::Abandon(int peer, const std::string& why) {
  if (peer >= 0 && peer < size_ && peer != rank_) Break(peer, why);
}

bool TcpTransport::Step(int timeout_ms) {
  bool moved = InstallArrived();
  for (int r = 0; r < size_; ++r) {
    if (!peers_[r].sends.empty()) moved |= Pump(r, /*sending=*/true);
    if (!peers_[r].recvs.empty()) moved |= Pump(r, /*sending=*/false);
  }
  if (moved) return true;

  // Reused across rounds: a wait runs many of them.
  std::vector<struct pollfd>& fds = poll_fds_;
  std::vector<std::pair<PollKind, int>>& what = poll_what_;
  fds.clear();
  what.clear();
  auto add = [&](int fd, short events, PollKind kind, int index) {
    fds.push_back({fd, events, 0});
    what.emplace_back(kind, index);
  };
  add(wake_[0], POLLIN, PollKind::kWake, 0);
  const int64_t now = NowMicros();
  int64_t wait_us = int64_t{timeout_ms} * 1000;
  for (int r = 0; r < size_; ++r) {
    Peer& p = peers_[r];
    if (p.out == Link::kConnecting) {
      add(p.out_fd, POLLOUT, PollKind::kOut, r);
      wait_us = std::min(wait_us, std::max<int64_t>(0, p.attempt_deadline_us - now));
    } else if (p.out == Link::kGreeting) {
      add(p.out_fd, POLLIN, PollKind::kOut, r);
      wait_us = std::min(wait_us, std::max<int64_t>(0, p.attempt_deadline_us - now));
    } else if (p.out == Link::kReady && !p.sends.empty()) {
      add(p.out_fd, POLLOUT, PollKind::kOut, r);
    }
    if (p.in_fd >= 0 && !p.recvs.empty()) add(p.in_fd, POLLIN, PollKind::kIn, r);
  }
  const int ready = poll(fds.data(), fds.size(), static_cast<int>((wait_us + 999) / 1000));
  if (ready < 0) return moved;  // EINTR: the caller loops

  for (size_t k = 0; k < fds.size(); ++k) {
    const auto [kind, index] = what[k];
    if (kind == PollKind::kOut) {
      Peer& p = peers_[index];
      if (p.out == Link::kConnecting || p.out == Link::kGreeting) {
        const bool timed_out = NowMicros() >= p.attempt_deadline_us;
        if (fds[k].revents == 0) {
          if (timed_out) {
            ConnectFailed(index, "timed out (WEFT_SOCKET_CONNECT_TIMEOUT_SECONDS)");
            StartConnect(index);
            moved = true;
          }
          continue;
        }
      }
      if (fds[k].revents == 0) continue;
      moved = true;
      if (p.out == Link::kConnecting) {
        int error = 0;
        socklen_t len = sizeof(error);
        getsockopt(p.out_fd, SOL_SOCKET, SO_ERROR, &error, &len);
        const std::string hello = EncodeGreeting(job_, rank_, index);
        if (error != 0) {
          ConnectFailed(index, ErrnoText(error));
          StartConnect(index);
        } else if (::send(p.out_fd, hello.data(), hello.size(), MSG_DONTWAIT | MSG_NOSIGNAL) !=
                   static_cast<ssize_t>(hello.size())) {
          ConnectFailed(index, "could not greet");
          StartConnect(index);
        } else {
          p.out = Link::kGreeting;
        }
      } else if (p.out == Link::kGreeting) {
        std::string error = ReadGreetingInto(p.out_fd, &p.greeting_in);
        if (error.empty() && p.greeting_in.size() < kGreetingBytes) continue;
        int from = -1;
        if (error.empty()) error = CheckGreeting(p.greeting_in, job_, index, rank_, size_, &from);
        if (!error.empty()) {
          ConnectFailed(index, absl::StrCat("reached ", error));
          StartConnect(index);
        } else {
          p.out = Link::kReady;
          Pump(index, /*sending=*/true);
        }
      } else {
        Pump(index, /*sending=*/true);
      }
    } else if (kind == PollKind::kIn) {
      if (fds[k].revents != 0) moved |= Pump(index, /*sending=*/false);
    } else if (fds[k].revents != 0) {  // kWake: connections arrived
      moved |= InstallArrived();
    }
  }
  return moved;
}

template <typename Done>
void TcpTransport::Drive(Done done) {
  const double timeout_s = stall_timeout_s_ ? stall_timeout_s_() : 0;
  int64_t last_move = NowMicros();
  while (!done()) {
    if (Step(/*timeout_ms=*/100)) {
      last_move = NowMicros();
      continue;
    }
    if (timeout_s > 0 && NowMicros() - last_move > static_cast<int64_t>(timeout_s * 1e6)) {
      for (int r = 0; r < size_; ++r) {
        Peer& p = peers_[r];
        if (p.sends.empty() && p.recvs.empty()) continue;
        Break(r, absl::StrCat("no data moved for ", timeout_s,
                              " s (WEFT_STALL_TIMEOUT_SECONDS): the rank or the network to "
                              "it is likely gone"));
      }
    }
  }
}

Status TcpTransport::Wait(Ticket ticket) {
  if (ticket >= transfers_.size()) return Internal("TCP transport: unknown transfer ", ticket);
  Drive([&] { return transfers_[ticket].complete; });
  return transfers_[ticket].status;
}

Status TcpTransport::WaitAll() {
  Drive([&] { return pending_ == 0; });
  Status first;
  for (const Transfer& x : transfers_) {
    if (first.ok() && !x.status.ok()) first = x.status;
  }
  transfers_.clear();
  return first;
}

}  // namespace comm
}  // namespace weft
