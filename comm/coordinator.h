// The negotiation logic run by rank 0: collects every rank's descriptors, decides what is
// ready (every rank submitted it), checks that the ranks agree (op, dtype, device, shape,
// root, neighbor pattern, topology), fuses consecutive compatible ops, and watches for
// stalls. Pure code: the engine feeds it messages; the tests feed it directly.
#ifndef WEFT_COMM_COORDINATOR_H_
#define WEFT_COMM_COORDINATOR_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "comm/protocol.h"

namespace weft {
namespace comm {

class Coordinator {
 public:
  explicit Coordinator(int size) : size_(size) {}

  // Each rank's descriptor of an op, in rank order (a rank's burst of like ops shares one:
  // KeyedDescriptor).
  using ByRank = absl::InlinedVector<std::pair<int, std::shared_ptr<const Descriptor>>, 4>;

  // Records one rank's descriptor of the op `kd.key` (or of each op of the run kd stands
  // for), received at `now_us`. A refused one (refused_code set) fails the key on every
  // other rank of the op.
  void Add(KeyedDescriptor kd, int64_t now_us);
  void Add(Descriptor d, int64_t now_us);

  // Responses for every key that all ranks have submitted, in the order they became
  // ready, with consecutive compatible small ops fused up to `fusion_threshold` bytes;
  // errors for requests that cannot run. Every rank must run them in this order.
  std::vector<Response> TakeReady(int64_t fusion_threshold);

  struct StallReport {
    std::vector<std::string> warnings;  // to log
    std::vector<Response> errors;       // to send (each to the ranks it names)
  };
  // Warns (again every `warning_s`) about keys some ranks submitted and others did not
  // for longer than `warning_s`; with timeout_s > 0, fails them after `timeout_s`. A rank
  // that submits a failed key later gets the same error at once. An unnamed op that times
  // out ends call-order matching in its scope (every rank, or one process set): a rank that
  // skipped it counts one call fewer than the others from then on, and pairing by number
  // would combine different ops. So the scope's unnamed ops still pending fail, and every
  // later one fails at once on the rank that submits it; named ops go on working.
  StallReport CheckStalls(int64_t now_us, double warning_s, double timeout_s);

  // Keys some ranks submitted and others did not.
  size_t pending() const { return pending_.size() + unnamed_keys_; }

 private:
  struct Entry {
    ByRank by_rank;
    int64_t first_seen_us = 0;
    int64_t last_warned_us = 0;
    // Unnamed ops only: the entry stands for this many consecutive ones, which the same
    // ranks submitted with the same descriptors (a run).
    int64_t count = 1;
  };
  // A scope's unnamed ops that wait for ranks, by number; entries never overlap.
  using Unnamed = std::map<int64_t, Entry>;
  struct Failed {
    Response error;
    std::set<int> owed;  // ranks that have not submitted it yet
  };

  // Add for one op (kd.count == 1), whatever its key and state.
  void AddOne(KeyedDescriptor kd, int64_t now_us);
  // Records `desc`'s rank for the unnamed ops `first` .. `first + count - 1` of `scope`,
  // splitting entries where the run starts and ends, and moving those that every rank has
  // submitted now to ready_.
  void AddUnnamed(absl::string_view scope, int64_t first, int64_t count,
                  const std::shared_ptr<const Descriptor>& desc, int64_t now_us);
  // How many ranks submit an op of process set `group` (every rank for an empty one). Keys
  // carry the set (the engine scopes them), so every descriptor of an entry names the same
  // set; ranks that disagree on it submit different keys and show up as a stall of each.
  size_t RankCount(const std::vector<int32_t>& group) const;
  // The error for rank d.rank's second submission of `key` while its first still waits.
  Response SubmittedTwice(const Descriptor& d, const std::string& key) const;
  // Makes `number` the first op of its entry in `ops`, if an entry holds it.
  static void SplitAt(Unnamed& ops, int64_t number);
  // Removes the op `key` from the pending ones and returns its entry (an empty one if none).
  Entry TakePending(const std::string& key);
  // Checks agreement across ranks; empty string when they agree. `key`: the entry's.
  std::string Validate(const std::string& key, const Entry& e) const;
  // Whether `e` holds, rank for rank, the very descriptors of the last entry that passed
  // Validate (the later ops of a burst): Validate's outcome depends only on the ranks and
  // their descriptors (the key appears only in its messages), so it is skipped. last_valid_
  // owns its descriptors, so an address cannot be reused for another one meanwhile.
  bool KnownValid(const Entry& e) const;
  std::string MissingRanks(const Entry& e) const;
  // The ranks an entry's op runs on: its process set, or every rank.
  std::vector<int> Members(const Entry& e) const;
  std::vector<int> Members(const std::vector<int32_t>& group) const;
  // A rank refused `d` (keyed: its key is the op's) locally: the ranks that submitted it get
  // the refusal now, the others when they submit it.
  void Refuse(const Descriptor& d);
  static bool Fusable(OpType op);
  bool CanFuse(const Entry& a, const Entry& b) const;
  Response ErrorFor(const std::vector<std::string>& keys, OpType op, absl::StatusCode code,
                    const std::string& message, std::vector<int32_t> ranks) const;

  // Pending keys in key order, so that warnings and errors come out the same every time
  // (runs split into one entry per op first).
  std::vector<std::pair<std::string, Entry*>> SortedPending();

  int size_;
  absl::flat_hash_map<std::string, Entry> pending_;      // named and internal ops
  std::map<std::string, Unnamed, std::less<>> unnamed_;  // unnamed ops, by scope (KeyScope)
  size_t unnamed_keys_ = 0;                              // the ops in unnamed_'s entries
  std::deque<std::pair<std::string, Entry>> ready_;
  std::map<std::string, Failed> failed_;
  // Scopes ("" or "@ranks") whose call order was lost, with the timeout that lost it.
  std::map<std::string, std::string> lost_order_;
  std::vector<Response> immediate_;  // errors decided in Add
  ByRank last_valid_;                // the descriptors of the last entry that passed Validate
};

// "v1 on ranks 0-1, 3; v2 on rank 2", or "" when every value is the same.
std::string DescribeDisagreement(const std::vector<std::pair<int, std::string>>& by_rank);

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_COORDINATOR_H_
