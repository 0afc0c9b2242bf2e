#include "comm/protocol.h"

#include <cstring>
#include <type_traits>

namespace weft {
namespace comm {
namespace {

// A minimal little-endian writer/reader: both ends are the same binary on one cluster.
class Writer {
 public:
  template <typename T>
  void Pod(T v) {
    static_assert(std::is_trivially_copyable<T>::value, "POD only");
    out_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  void Str(const std::string& s) {
    Pod<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  template <typename T>
  void Vec(const std::vector<T>& v) {
    Pod<uint32_t>(static_cast<uint32_t>(v.size()));
    for (const T& x : v) Pod<T>(x);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  template <typename T>
  bool Pod(T* v) {
    if (pos_ + sizeof(T) > in_.size()) return false;
    std::memcpy(v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Str(std::string* s) {
    uint32_t n;
    if (!Pod(&n) || pos_ + n > in_.size()) return false;
    s->assign(in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  template <typename T>
  bool Vec(std::vector<T>* v) {
    uint32_t n;
    if (!Pod(&n) || pos_ + static_cast<size_t>(n) * sizeof(T) > in_.size()) return false;
    v->resize(n);
    for (uint32_t i = 0; i < n; ++i) Pod(&(*v)[i]);
    return true;
  }
  bool done() const { return pos_ == in_.size(); }
  // Whether `n` items of at least `min_bytes` each can still follow: rejects counts that
  // garbage would otherwise turn into huge allocations.
  bool Fits(uint32_t n, size_t min_bytes) const {
    return static_cast<size_t>(n) * min_bytes <= in_.size() - pos_;
  }

 private:
  const std::string& in_;
  size_t pos_ = 0;
};

}  // namespace

const char* OpName(OpType op) {
  switch (op) {
    case OpType::kAllreduce: return "allreduce";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kAllgather: return "allgather";
    case OpType::kNeighborAllgather: return "neighbor_allgather";
    case OpType::kNeighborAllreduce: return "neighbor_allreduce";
    case OpType::kHierarchicalNeighborAllreduce: return "hierarchical_neighbor_allreduce";
    case OpType::kPairGossip: return "pair_gossip";
    case OpType::kBarrier: return "barrier";
    case OpType::kSetTopology: return "set_topology";
    case OpType::kShutdown: return "shutdown";
    case OpType::kWinCreate: return "win_create";
    case OpType::kWinFree: return "win_free";
    case OpType::kWinLocal: return "window op";
    case OpType::kSendRecv: return "send/recv";
  }
  return "unknown op";
}

bool IsWireOp(uint8_t op) {
  return op <= static_cast<uint8_t>(OpType::kSendRecv) &&
         op != static_cast<uint8_t>(OpType::kWinLocal);
}

size_t Descriptor::nbytes() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return static_cast<size_t>(n) * DTypeSize(dtype);
}

Status Response::status() const {
  if (error_code == 0) return OkStatus();
  return Status(static_cast<absl::StatusCode>(error_code), error_message);
}

std::string SerializeDescriptors(const std::vector<Descriptor>& ds) {
  Writer w;
  w.Pod<uint32_t>(static_cast<uint32_t>(ds.size()));
  for (const Descriptor& d : ds) {
    w.Pod(d.rank);
    w.Pod(static_cast<uint8_t>(d.op));
    w.Str(d.key);
    w.Str(d.display);
    w.Pod(static_cast<uint8_t>(d.dtype));
    w.Pod(static_cast<uint8_t>(d.device.type));
    w.Pod<int32_t>(d.device.index);
    w.Vec(d.shape);
    w.Pod(d.root);
    w.Pod<uint8_t>(d.average);
    w.Vec(d.send_ranks);
    w.Vec(d.recv_ranks);
    w.Pod(d.machine);
    w.Pod(d.local_rank);
    w.Str(d.fusion_signature);
    w.Pod(d.fingerprint);
    w.Pod(d.in_flight);
    w.Vec(d.group);
    w.Pod<uint8_t>(d.shape_from_peer);
    w.Pod(d.refused_code);
    w.Str(d.refused_message);
  }
  return w.Take();
}

StatusOr<std::vector<Descriptor>> ParseDescriptors(const std::string& bytes) {
  Reader r(bytes);
  uint32_t n;
  // The smallest encoding of one descriptor: every fixed field, empty strings and vectors.
  constexpr size_t kMinDescriptorBytes = 77;
  if (!r.Pod(&n)) return Internal("truncated descriptor batch");
  if (!r.Fits(n, kMinDescriptorBytes)) return Internal("malformed descriptor batch");
  std::vector<Descriptor> ds(n);
  for (Descriptor& d : ds) {
    uint8_t op, dtype, device_type, average, shape_from_peer;
    int32_t device_index;
    bool ok = r.Pod(&d.rank) && r.Pod(&op) && r.Str(&d.key) && r.Str(&d.display) &&
              r.Pod(&dtype) && r.Pod(&device_type) && r.Pod(&device_index) &&
              r.Vec(&d.shape) && r.Pod(&d.root) && r.Pod(&average) && r.Vec(&d.send_ranks) &&
              r.Vec(&d.recv_ranks) && r.Pod(&d.machine) && r.Pod(&d.local_rank) &&
              r.Str(&d.fusion_signature) && r.Pod(&d.fingerprint) && r.Pod(&d.in_flight) &&
              r.Vec(&d.group) && r.Pod(&shape_from_peer) && r.Pod(&d.refused_code) &&
              r.Str(&d.refused_message);
    if (!ok || !IsWireOp(op) || dtype >= kNumDTypes ||
        device_type > static_cast<uint8_t>(Device::Type::kCUDA)) {
      return Internal("malformed descriptor batch");
    }
    d.op = static_cast<OpType>(op);
    d.dtype = static_cast<DType>(dtype);
    d.device = Device{static_cast<Device::Type>(device_type), device_index};
    d.average = average != 0;
    d.shape_from_peer = shape_from_peer != 0;
  }
  if (!r.done()) return Internal("trailing bytes after descriptor batch");
  return ds;
}

std::string SerializeResponses(const std::vector<Response>& rs) {
  Writer w;
  w.Pod<uint32_t>(static_cast<uint32_t>(rs.size()));
  for (const Response& resp : rs) {
    w.Pod(static_cast<uint8_t>(resp.op));
    w.Pod<uint32_t>(static_cast<uint32_t>(resp.keys.size()));
    for (const auto& k : resp.keys) w.Str(k);
    w.Pod(resp.error_code);
    w.Str(resp.error_message);
    w.Pod<uint32_t>(static_cast<uint32_t>(resp.first_dims.size()));
    for (const auto& dims : resp.first_dims) w.Vec(dims);
    w.Vec(resp.ranks);
  }
  return w.Take();
}

StatusOr<std::vector<Response>> ParseResponses(const std::string& bytes) {
  Reader r(bytes);
  uint32_t n;
  // The smallest encoding of one response: op, key count, code, empty message, first_dims
  // count, empty ranks.
  constexpr size_t kMinResponseBytes = 21;
  if (!r.Pod(&n)) return Internal("truncated response batch");
  if (!r.Fits(n, kMinResponseBytes)) return Internal("malformed response batch");
  std::vector<Response> rs(n);
  for (Response& resp : rs) {
    uint8_t op;
    uint32_t nkeys, ndims;
    if (!r.Pod(&op) || !IsWireOp(op) || !r.Pod(&nkeys) ||
        !r.Fits(nkeys, sizeof(uint32_t))) {
      return Internal("malformed response batch");
    }
    resp.op = static_cast<OpType>(op);
    resp.keys.resize(nkeys);
    for (auto& k : resp.keys) {
      if (!r.Str(&k)) return Internal("malformed response batch");
    }
    if (!r.Pod(&resp.error_code) || !r.Str(&resp.error_message) || !r.Pod(&ndims) ||
        !r.Fits(ndims, sizeof(uint32_t))) {
      return Internal("malformed response batch");
    }
    resp.first_dims.resize(ndims);
    for (auto& dims : resp.first_dims) {
      if (!r.Vec(&dims)) return Internal("malformed response batch");
    }
    if (!r.Vec(&resp.ranks)) return Internal("malformed response batch");
  }
  if (!r.done()) return Internal("trailing bytes after response batch");
  return rs;
}

}  // namespace comm
}  // namespace weft
