// What ranks tell the coordinator about each request (Descriptor), what the coordinator
// tells every rank to run (Response), and their wire format. Pure code: the coordinator
// and these messages are unit-tested without MPI.
#ifndef WEFT_COMM_PROTOCOL_H_
#define WEFT_COMM_PROTOCOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/status.h"
#include "core/tensor.h"

namespace weft {
namespace comm {

enum class OpType : uint8_t {
  kAllreduce = 0,
  kBroadcast = 1,
  kAllgather = 2,
  kNeighborAllgather = 3,
  kNeighborAllreduce = 4,
  kHierarchicalNeighborAllreduce = 5,
  kPairGossip = 6,
  kBarrier = 7,
  kSetTopology = 8,
  kShutdown = 9,
  kWinCreate = 10,  // collective, negotiated like the others
  kWinFree = 11,
  kWinLocal = 12,   // one-sided window ops: never negotiated, run where submitted
  kSendRecv = 13,   // point to point: the sender and the receiver, as a set of two
};
// Whether `op` travels between ranks (kWinLocal never does): parsers reject the rest.
bool IsWireOp(uint8_t op);
const char* OpName(OpType op);

// One rank's account of one request.
struct Descriptor {
  int32_t rank = 0;
  OpType op = OpType::kAllreduce;
  std::string key;  // what matches requests across ranks: the name, or "#<seq>"
  // An unnamed op's number in its scope, as its key gives it (the engine sets both); -1 for
  // other ops, and for descriptors read from the wire. Not sent: it spares the sender
  // parsing its own keys (Classify), and tells direct agreement's ops apart (engine.cc).
  int64_t number = -1;
  // For messages, where Describe's words do not fit (window ops); usually empty, and
  // Describe names the op from its key.
  std::string display;
  DType dtype = DType::kFloat32;
  Device device;
  Dims shape;

  // Must agree across ranks.
  int32_t root = -1;     // broadcast: the root; win_create: the transport (comm::Transport)
  bool average = false;  // allreduce

  // allreduce: this rank's output is its input. Not checked across ranks: it only decides,
  // with the others', whether the op may read its inputs where they are (Response).
  bool in_place = false;

  // Point-to-point pattern (neighbor ops, pair gossip): ranks; for the hierarchical op,
  // machine indices (only local rank 0's count).
  std::vector<int32_t> send_ranks;
  std::vector<int32_t> recv_ranks;
  int32_t machine = 0;
  int32_t local_rank = 0;

  // The process set the op runs in: sorted, distinct ranks; empty = every rank. Keys are
  // scoped by it (the engine appends it), so disjoint sets never meet in the coordinator.
  std::vector<int32_t> group;
  // kSendRecv, receiving into memory from an Allocator: the shape is the sender's.
  bool shape_from_peer = false;

  // Two requests of one rank fuse only if their signatures are equal and non-empty:
  // it encodes everything besides the data that the execution depends on (weights...).
  std::string fusion_signature;

  // set_topology
  uint64_t fingerprint = 0;
  int64_t in_flight = 0;

  // Non-zero: this rank refused the op before running it (a bad argument, say) and told
  // the others, so that the op still takes its place in the call order and fails on every
  // rank instead of leaving the others waiting, or pairing their later ops with the wrong
  // ones. Only key, display, op and group are meaningful then.
  int32_t refused_code = 0;  // absl::StatusCode
  std::string refused_message;

  size_t nbytes() const;
  // The rows this rank adds to a gather (allgather, neighbor_allgather): dim 0, or 1 for a
  // scalar.
  int64_t rows() const { return shape.empty() ? 1 : shape[0]; }
};

// One unit of work every rank runs, in the order the coordinator sends them.
struct Response {
  OpType op = OpType::kAllreduce;
  std::vector<std::string> keys;  // more than one when fused
  // Non-OK: every listed request completes with this error instead of running.
  int32_t error_code = 0;  // absl::StatusCode
  std::string error_message;
  // allgather, neighbor_allgather: dim 0 of every rank's tensor (index = rank), one list
  // per key. kSendRecv: {the sender's shape, {its DType}}.
  std::vector<std::vector<int64_t>> first_dims;
  // Ranks this response is for (errors for some ranks; a process set's op); empty means
  // every rank.
  std::vector<int32_t> ranks;
  // allreduce: every rank's output is separate from its input, so a lone op (not a fused
  // group, which reduces its packed buffer in place) may run an algorithm that reads the
  // inputs where they are (an in-place one needs a copy first). Every rank must choose the
  // same algorithm, so they choose by this, not by their own op.
  bool out_of_place = false;
  // Which of its ways an op runs where rank 0 picks them by timing (HostPlane::Preference):
  // rank 0's pick, 0 for the default way; -1 where it picked none (the op runs its default
  // way, untimed). Set on every rank alike from what rank 0 told the direct agreement; never
  // sent (an op the coordinator answers has none).
  int32_t tuned_way = -1;

  Status status() const;
};

// The op as messages name it: its display if set, otherwise from the key and the pattern:
// "allreduce 'grad.w'", "unnamed allgather #3 over ranks 0, 2", "send 'x' to rank 1"; before
// an unnamed op has its number, "allgather over ranks 0, 2".
// Built only when needed: every op carries the facts, few ever need the words.
std::string Describe(const Descriptor& d);
// "0-2, 5"
std::string RankList(const std::vector<int>& ranks);
// Unnamed ops' keys are "#<number>" and, in a process set, "#<number>@<ranks>"; internal
// ops' fixed keys ("#shutdown", window ops) have no number.
bool IsUnnamedKey(const std::string& key);
// What a process set's ops append to their keys: "@0,2,3"; "" for every rank.
std::string KeyScope(const std::vector<int32_t>& group);
// An unnamed op's key from its number and scope (KeyScope): "#12", "#3@0,2".
std::string UnnamedKey(int64_t number, absl::string_view scope);
// The number and the scope of an unnamed op's key; false for every other key.
bool ParseUnnamedKey(absl::string_view key, int64_t* number, absl::string_view* scope);
// Whether `key` names the unnamed op numbered right after `previous`'s, in the same scope.
bool IsNextUnnamedKey(absl::string_view previous, absl::string_view key);

// One rank's descriptor of one op as the coordinator keeps it. A burst of like ops (every
// field but the key the same, the wire format's repeats) shares one Descriptor, whose key
// is the burst's first; `key` is this op's. Sharing saves a copy per op and rank, and lets
// the coordinator skip checking again ops whose descriptors it has just checked.
//
// A run of unnamed ops (count > 1): the `count` ops numbered from key's on, in its scope,
// all with this descriptor. A rank numbers its unnamed ops as it calls them, so a burst of
// like calls is one run, and the coordinator matches, checks and answers it as one entry
// (splitting it where another rank's runs start or end) instead of op by op.
struct KeyedDescriptor {
  std::string key;
  std::shared_ptr<const Descriptor> desc;
  int64_t count = 1;
};

// Whether `d` may stand for `other` but for its key: every other field is the same.
bool SameButKey(const Descriptor& d, const Descriptor& other);

std::string SerializeDescriptors(const std::vector<Descriptor>& ds);
// The same encoding, from descriptors held elsewhere (the engine's requests).
std::string SerializeDescriptors(const std::vector<const Descriptor*>& ds);
// A batch as the coordinator reads it: each run of repeats sharing one descriptor, and
// consecutive unnamed ops of a run as one KeyedDescriptor.
StatusOr<std::vector<KeyedDescriptor>> ParseKeyedDescriptors(const std::string& bytes);
// The same batch, one Descriptor per op.
StatusOr<std::vector<Descriptor>> ParseDescriptors(const std::string& bytes);
// Descriptors held elsewhere (rank 0's own), consecutive ones that are SameButKey sharing one
// copy, and consecutive unnamed ones among those as one KeyedDescriptor.
std::vector<KeyedDescriptor> ShareRepeats(const std::vector<const Descriptor*>& ds);
std::string SerializeResponses(const std::vector<Response>& rs);
StatusOr<std::vector<Response>> ParseResponses(const std::string& bytes);

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_PROTOCOL_H_
