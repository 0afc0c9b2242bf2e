#include "comm/protocol.h"

#include <algorithm>
#include <cassert>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/codec.h"

namespace weft {
namespace comm {
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

std::string RankList(const std::vector<int>& ranks) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(sorted[i]) : absl::StrCat(sorted[i], "-", sorted[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ", ");
}

bool IsUnnamedKey(const std::string& key) {
  int64_t number = 0;
  absl::string_view scope;
  return ParseUnnamedKey(key, &number, &scope);
}

std::string KeyScope(const std::vector<int32_t>& group) {
  return group.empty() ? std::string() : absl::StrCat("@", absl::StrJoin(group, ","));
}

// Unnamed keys are written and read for every op, several times on its way: by hand,
// since std::to_chars and std::from_chars took 100-200 instructions per key here.
std::string UnnamedKey(int64_t number, absl::string_view scope) {
  char text[20];  // '#' and up to 19 digits, written from the end
  char* const end = text + sizeof text;
  char* first = end;
  uint64_t n = number < 0 ? 0 : static_cast<uint64_t>(number);
  do {
    *--first = static_cast<char>('0' + n % 10);
    n /= 10;
  } while (n != 0);
  *--first = '#';
  std::string key(first, end);
  if (!scope.empty()) key.append(scope.data(), scope.size());
  return key;
}

bool ParseUnnamedKey(absl::string_view key, int64_t* number, absl::string_view* scope) {
  if (key.size() < 2 || key[0] != '#') return false;
  size_t end = 1;
  int64_t n = 0;
  // At most 18 digits: no overflow, and far more ops than a job can run.
  for (; end < key.size() && key[end] >= '0' && key[end] <= '9'; ++end) {
    if (end > 18) return false;
    n = n * 10 + (key[end] - '0');
  }
  if (end == 1 || (end < key.size() && key[end] != '@')) return false;
  *number = n;
  *scope = key.substr(end);
  return true;
}

bool IsNextUnnamedKey(absl::string_view previous, absl::string_view key) {
  int64_t a = 0, b = 0;
  absl::string_view scope_a, scope_b;
  return ParseUnnamedKey(previous, &a, &scope_a) && ParseUnnamedKey(key, &b, &scope_b) &&
         b == a + 1 && scope_a == scope_b;
}

std::string Describe(const Descriptor& d) {
  if (!d.display.empty()) return d.display;
  // "send 'x' to rank 1", "allreduce 'g' over ranks 0, 2".
  absl::string_view what = OpName(d.op);
  std::string where;
  if (d.op == OpType::kSendRecv) {
    const bool sending = !d.send_ranks.empty();
    what = sending ? "send" : "recv";
    const std::vector<int32_t>& peer = sending ? d.send_ranks : d.recv_ranks;
    if (!peer.empty()) where = absl::StrCat(sending ? " to rank " : " from rank ", peer[0]);
  } else if (!d.group.empty()) {
    where = absl::StrCat(" over ranks ", RankList({d.group.begin(), d.group.end()}));
  }
  // The key is the name (or "#<number>") and its KeyScope.
  absl::string_view name = d.key;
  const std::string scope = KeyScope(d.group);
  if (absl::EndsWith(name, scope)) name.remove_suffix(scope.size());
  if (d.key.empty()) return absl::StrCat(what, where);  // not numbered yet
  if (IsUnnamedKey(d.key)) return absl::StrCat("unnamed ", what, " ", name, where);
  if (d.key[0] == '#') return OpName(d.op);  // internal ops
  return absl::StrCat(what, " '", name, "'", where);
}

size_t Descriptor::nbytes() const {
  return static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
}

Status Response::status() const {
  if (error_code == 0) return OkStatus();
  return Status(static_cast<absl::StatusCode>(error_code), error_message);
}

std::string SerializeDescriptors(const std::vector<Descriptor>& ds) {
  std::vector<const Descriptor*> ptrs;
  ptrs.reserve(ds.size());
  for (const Descriptor& d : ds) ptrs.push_back(&d);
  return SerializeDescriptors(ptrs);
}

// What a descriptor with empty strings and vectors takes on the wire.
constexpr size_t kMinDescriptorBytes = 78;
// In the op's place: this descriptor is the one before it with another key (rank, this
// marker, then only the key). Bursts of like ops (64 gradients of one shape) then travel
// in a few bytes each instead of about a hundred; a message of 64 full ones was over Open
// MPI's shared-memory eager limit and arrived several microseconds later, and each took
// the coordinator a full decode.
constexpr uint8_t kRepeatMarker = 0xFF;
// In the place of the ops after it: they are the descriptor before it again, numbered on
// from its key (rank, this marker, then how many). A burst of unnamed ops then travels in
// one descriptor and one count, whatever its length.
constexpr uint8_t kRunMarker = 0xFE;
// rank, marker, key length (or count): the smallest item of a batch.
constexpr size_t kMinItemBytes = sizeof(int32_t) + 1 + sizeof(uint32_t);
// Runs longer than this are corrupt: a batch of that many requests would not fit in memory.
constexpr int64_t kMaxRun = std::numeric_limits<int32_t>::max();

namespace {

// Overwrites the u32 written at `at` (little-endian, as codec::Writer writes it).
void PatchU32(std::string* out, size_t at, uint32_t v) {
  for (size_t i = 0; i < sizeof v; ++i) (*out)[at + i] = static_cast<char>(v >> (8 * i));
}

// One descriptor in full.
void WriteFull(codec::Writer& w, const Descriptor& d) {
  w.Put(d.rank);
  w.Put(static_cast<uint8_t>(d.op));
  w.Str(d.key);
  w.Str(d.display);
  w.Put(static_cast<uint8_t>(d.dtype));
  w.Put(static_cast<uint8_t>(d.device.type));
  w.Put<int32_t>(d.device.index);
  w.Vec(d.shape);
  w.Put(d.root);
  w.Put(d.average);
  w.Put(d.in_place);
  w.Vec(d.send_ranks);
  w.Vec(d.recv_ranks);
  w.Put(d.machine);
  w.Put(d.local_rank);
  w.Str(d.fusion_signature);
  w.Put(d.fingerprint);
  w.Put(d.in_flight);
  w.Vec(d.group);
  w.Put(d.shape_from_peer);
  w.Put(d.refused_code);
  w.Str(d.refused_message);
}

}  // namespace

// Compared field by field rather than as written: writing each descriptor in full to
// compare its bytes took 8 us for a burst of 64, most of a rank's share of the negotiation
// of a fused group. A field added to Descriptor must be added here too (and to WriteFull
// and ReadKeyed); builds with assertions (Bazel's fastbuild, which the tests use) check
// every repeat against the bytes.
// Written out rather than as a std::tie of both (which compiled to a call per field), the
// scalars first.
bool SameButKey(const Descriptor& d, const Descriptor& other) {
  return d.rank == other.rank && d.op == other.op && d.dtype == other.dtype &&
         d.device.type == other.device.type && d.device.index == other.device.index &&
         d.root == other.root && d.average == other.average && d.in_place == other.in_place &&
         d.machine == other.machine && d.local_rank == other.local_rank &&
         d.shape_from_peer == other.shape_from_peer && d.fingerprint == other.fingerprint &&
         d.in_flight == other.in_flight && d.refused_code == other.refused_code &&
         d.shape == other.shape && d.send_ranks == other.send_ranks &&
         d.recv_ranks == other.recv_ranks && d.group == other.group && d.display == other.display &&
         d.fusion_signature == other.fusion_signature && d.refused_message == other.refused_message;
}

namespace {

#ifndef NDEBUG
// The comparison SameButKey stands for: the full encodings, keys aside.
bool SameEncodingButKey(const Descriptor& a, const Descriptor& b) {
  Descriptor a_keyless = a, b_keyless = b;
  a_keyless.key.clear();
  b_keyless.key.clear();
  std::string x, y;
  codec::Writer wx(&x), wy(&y);
  WriteFull(wx, a_keyless);
  WriteFull(wy, b_keyless);
  return x == y;
}
#endif

// How an op of a batch follows the one before it (`previous`, or null).
enum class Follows {
  kNot,     // another descriptor
  kRepeat,  // the same descriptor but for the key
  kNext,    // that, and numbered next: the two are one run
};

Follows Classify(const Descriptor& d, const Descriptor* previous) {
  const bool repeat = previous != nullptr && SameButKey(d, *previous);
  assert(previous == nullptr || repeat == SameEncodingButKey(d, *previous));
  if (!repeat) return Follows::kNot;
  // Equal groups (SameButKey) give equal scopes: the numbers alone tell.
  const bool next = d.number >= 0 && previous->number >= 0 ? d.number == previous->number + 1
                                                           : IsNextUnnamedKey(previous->key, d.key);
  return next ? Follows::kNext : Follows::kRepeat;
}

}  // namespace

std::string SerializeDescriptors(const std::vector<const Descriptor*>& ds) {
  std::string out;
  // Room for short keys and shapes too: a burst's message is written without regrowing.
  out.reserve(sizeof(uint32_t) + ds.size() * (kMinDescriptorBytes + 32));
  codec::Writer w(&out);
  w.Put(uint32_t{0});  // the count of items, written at the end
  uint32_t items = 0;
  for (size_t i = 0; i < ds.size(); ++items) {
    const Descriptor& d = *ds[i];
    switch (Classify(d, i == 0 ? nullptr : ds[i - 1])) {
      case Follows::kNot:
        WriteFull(w, d);
        ++i;
        break;
      case Follows::kRepeat:
        w.Put(d.rank);
        w.Put(kRepeatMarker);
        w.Str(d.key);
        ++i;
        break;
      case Follows::kNext: {
        uint32_t n = 1;  // this op and those numbered on after it
        while (i + n < ds.size() && Classify(*ds[i + n], ds[i + n - 1]) == Follows::kNext) ++n;
        w.Put(d.rank);
        w.Put(kRunMarker);
        w.Put(n);
        i += n;
        break;
      }
    }
  }
  PatchU32(&out, 0, items);
  return out;
}

namespace {

// One item of a batch, given the item before it (null for the batch's first): a
// descriptor in full, a repeat of the one before, which shares its descriptor and has a
// key of its own, or the ops that continue the one before's run (`*merged`: they extend
// `previous`, and `item` is unused).
Status ReadKeyed(codec::Reader& r, KeyedDescriptor* previous, KeyedDescriptor* item, bool* merged) {
  uint8_t op, dtype, device_type;
  int32_t device_index, rank;
  WEFT_RETURN_IF_ERROR(r.Get("rank", &rank));
  WEFT_RETURN_IF_ERROR(r.Get("op", &op));
  if (op == kRepeatMarker || op == kRunMarker) {
    const char* what = op == kRepeatMarker ? "a repeat" : "a run";
    if (previous == nullptr) return InvalidArgument(what, " of nothing (the batch's first)");
    if (rank != previous->desc->rank) {
      return InvalidArgument(what, " of rank ", previous->desc->rank, "'s descriptor from rank ",
                             rank);
    }
    if (op == kRepeatMarker) {
      item->desc = previous->desc;
      return r.Str("key", &item->key);
    }
    uint32_t n = 0;
    WEFT_RETURN_IF_ERROR(r.Get("run length", &n));
    int64_t number;
    absl::string_view scope;
    if (!ParseUnnamedKey(previous->key, &number, &scope)) {
      return InvalidArgument("a run after '", previous->key, "', which is not an unnamed op");
    }
    if (n == 0 || previous->count + n > kMaxRun) {
      return InvalidArgument("a run of ", n, " more after ", previous->count, " ops");
    }
    previous->count += n;
    *merged = true;
    return OkStatus();
  }
  auto d = std::make_shared<Descriptor>();
  d->rank = rank;
  WEFT_RETURN_IF_ERROR(r.Str("key", &d->key));
  WEFT_RETURN_IF_ERROR(r.Str("display", &d->display));
  WEFT_RETURN_IF_ERROR(r.Get("dtype", &dtype));
  WEFT_RETURN_IF_ERROR(r.Get("device type", &device_type));
  WEFT_RETURN_IF_ERROR(r.Get("device index", &device_index));
  WEFT_RETURN_IF_ERROR(r.Vec("shape", &d->shape));
  WEFT_RETURN_IF_ERROR(r.Get("root", &d->root));
  WEFT_RETURN_IF_ERROR(r.Get("average", &d->average));
  WEFT_RETURN_IF_ERROR(r.Get("in place", &d->in_place));
  WEFT_RETURN_IF_ERROR(r.Vec("send ranks", &d->send_ranks));
  WEFT_RETURN_IF_ERROR(r.Vec("recv ranks", &d->recv_ranks));
  WEFT_RETURN_IF_ERROR(r.Get("machine", &d->machine));
  WEFT_RETURN_IF_ERROR(r.Get("local rank", &d->local_rank));
  WEFT_RETURN_IF_ERROR(r.Str("fusion signature", &d->fusion_signature));
  WEFT_RETURN_IF_ERROR(r.Get("fingerprint", &d->fingerprint));
  WEFT_RETURN_IF_ERROR(r.Get("in flight", &d->in_flight));
  WEFT_RETURN_IF_ERROR(r.Vec("group", &d->group));
  WEFT_RETURN_IF_ERROR(r.Get("shape from peer", &d->shape_from_peer));
  WEFT_RETURN_IF_ERROR(r.Get("refused code", &d->refused_code));
  WEFT_RETURN_IF_ERROR(r.Str("refused message", &d->refused_message));
  if (!IsWireOp(op)) return InvalidArgument("op ", static_cast<int>(op), " is not an op");
  if (dtype >= kNumDTypes) return InvalidArgument("dtype ", static_cast<int>(dtype));
  if (device_type > static_cast<uint8_t>(Device::Type::kCUDA)) {
    return InvalidArgument("device type ", static_cast<int>(device_type));
  }
  d->op = static_cast<OpType>(op);
  d->dtype = static_cast<DType>(dtype);
  d->device = Device{static_cast<Device::Type>(device_type), device_index};
  item->key = d->key;
  item->desc = std::move(d);
  return OkStatus();
}

Status ReadResponse(codec::Reader& r, Response* /*previous*/, Response* resp, bool* /*merged*/) {
  uint8_t op;
  uint32_t nkeys, ndims;
  WEFT_RETURN_IF_ERROR(r.Get("op", &op));
  if (!IsWireOp(op)) return InvalidArgument("op ", static_cast<int>(op), " is not an op");
  resp->op = static_cast<OpType>(op);
  WEFT_RETURN_IF_ERROR(r.Count("key count", sizeof(uint32_t), 0, &nkeys));
  resp->keys.resize(nkeys);
  for (auto& k : resp->keys) WEFT_RETURN_IF_ERROR(r.Str("key", &k));
  WEFT_RETURN_IF_ERROR(r.Get("error code", &resp->error_code));
  WEFT_RETURN_IF_ERROR(r.Str("error message", &resp->error_message));
  WEFT_RETURN_IF_ERROR(r.Count("first dims count", sizeof(uint32_t), 0, &ndims));
  resp->first_dims.resize(ndims);
  for (auto& dims : resp->first_dims) WEFT_RETURN_IF_ERROR(r.Vec("first dims", &dims));
  WEFT_RETURN_IF_ERROR(r.Vec("ranks", &resp->ranks));
  return r.Get("out of place", &resp->out_of_place);
}

// A batch: a u32 count of items of at least `min_bytes` each, every item read by `read`
// (given the item before it, or null; an item it merges into that one is not kept), and
// nothing after them. Any fault is Internal (both ends are weft): "malformed <what>: ...".
template <typename T>
StatusOr<std::vector<T>> ParseBatch(const std::string& bytes, const char* what, size_t min_bytes,
                                    Status (*read)(codec::Reader&, T*, T*, bool*)) {
  codec::Reader r(bytes, what);
  uint32_t n = 0;
  Status st = r.Count("the count", min_bytes, 0, &n);
  std::vector<T> items;
  if (st.ok()) {
    items.reserve(n);
    for (uint32_t i = 0; i < n; ++i) {
      T item;
      bool merged = false;
      st = read(r, items.empty() ? nullptr : &items.back(), &item, &merged);
      if (!st.ok()) break;
      if (!merged) items.push_back(std::move(item));
    }
  }
  if (st.ok()) st = r.Done();
  if (!st.ok()) return Internal("malformed ", what, ": ", st.message());
  return items;
}

}  // namespace

StatusOr<std::vector<KeyedDescriptor>> ParseKeyedDescriptors(const std::string& bytes) {
  return ParseBatch<KeyedDescriptor>(bytes, "descriptor batch", kMinItemBytes, ReadKeyed);
}

StatusOr<std::vector<Descriptor>> ParseDescriptors(const std::string& bytes) {
  WEFT_ASSIGN_OR_RETURN(std::vector<KeyedDescriptor> keyed, ParseKeyedDescriptors(bytes));
  std::vector<Descriptor> out;
  out.reserve(keyed.size());
  for (KeyedDescriptor& k : keyed) {
    int64_t number = 0;
    absl::string_view scope;
    if (k.count > 1) ParseUnnamedKey(k.key, &number, &scope);  // runs are unnamed ops
    for (int64_t i = 0; i < k.count; ++i) {
      out.push_back(*k.desc);
      out.back().key = i == 0 ? k.key : UnnamedKey(number + i, scope);
    }
  }
  return out;
}

std::vector<KeyedDescriptor> ShareRepeats(const std::vector<const Descriptor*>& ds) {
  std::vector<KeyedDescriptor> out;
  out.reserve(ds.size());
  const Descriptor* previous = nullptr;
  for (const Descriptor* d : ds) {
    switch (Classify(*d, previous)) {
      case Follows::kNot:
        out.push_back({d->key, std::make_shared<const Descriptor>(*d)});
        break;
      case Follows::kRepeat:
        out.push_back({d->key, out.back().desc});
        break;
      case Follows::kNext:
        ++out.back().count;
        break;
    }
    previous = d;
  }
  return out;
}

std::string SerializeResponses(const std::vector<Response>& rs) {
  std::string out;
  codec::Writer w(&out);
  w.Put(static_cast<uint32_t>(rs.size()));
  for (const Response& resp : rs) {
    w.Put(static_cast<uint8_t>(resp.op));
    w.Put(static_cast<uint32_t>(resp.keys.size()));
    for (const auto& k : resp.keys) w.Str(k);
    w.Put(resp.error_code);
    w.Str(resp.error_message);
    w.Put(static_cast<uint32_t>(resp.first_dims.size()));
    for (const auto& dims : resp.first_dims) w.Vec(dims);
    w.Vec(resp.ranks);
    w.Put(resp.out_of_place);
  }
  return out;
}

StatusOr<std::vector<Response>> ParseResponses(const std::string& bytes) {
  // The smallest encoding of one response: op, key count, code, empty message, first_dims
  // count, empty ranks, out_of_place.
  constexpr size_t kMinResponseBytes = 22;
  return ParseBatch<Response>(bytes, "response batch", kMinResponseBytes, ReadResponse);
}

}  // namespace comm
}  // namespace weft
