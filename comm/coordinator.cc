#include "comm/coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"

namespace weft {
namespace comm {

std::string DescribeDisagreement(const std::vector<std::pair<int, std::string>>& by_rank) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;  // in order of first rank
  for (const auto& [rank, value] : by_rank) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == value; });
    if (it == groups.end()) {
      groups.push_back({value, {rank}});
    } else {
      it->second.push_back(rank);
    }
  }
  if (groups.size() <= 1) return "";
  std::vector<std::string> parts;
  for (const auto& g : groups) {
    parts.push_back(absl::StrCat(g.first, " on rank", g.second.size() > 1 ? "s " : " ",
                                 RankList(g.second)));
  }
  return absl::StrJoin(parts, "; ");
}

namespace {

std::string ScopeOf(const std::string& key) {
  const size_t at = key.find('@');
  return at == std::string::npos ? "" : key.substr(at);
}

std::string LostOrderMessage(const std::string& display, const std::string& cause) {
  return absl::StrCat(display, ": unnamed ops can no longer be matched across ranks, since ", cause,
                      ": a rank that skipped it counts its unnamed calls one behind the others, "
                      "and matching by number would combine different ops. Named ops still "
                      "work; to use unnamed ones again, shut down and re-initialize weft");
}

// Messages name an op from its descriptor's key; a burst's shared descriptor has its first
// op's.
std::string DescribeAs(const Descriptor& d, const std::string& key) {
  if (d.key == key) return Describe(d);
  Descriptor keyed = d;
  keyed.key = key;
  return Describe(keyed);
}

// Where `rank` is or would go in `by_rank` (in rank order).
template <typename ByRank>
auto RankAt(ByRank& by_rank, int rank) {
  return std::lower_bound(by_rank.begin(), by_rank.end(), rank,
                          [](const auto& entry, int r) { return entry.first < r; });
}

bool Has(const Coordinator::ByRank& by_rank, int rank) {
  auto at = RankAt(by_rank, rank);
  return at != by_rank.end() && at->first == rank;
}

}  // namespace

void Coordinator::Add(Descriptor d, int64_t now_us) {
  std::string key = d.key;
  Add(KeyedDescriptor{std::move(key), std::make_shared<const Descriptor>(std::move(d))}, now_us);
}

void Coordinator::Add(KeyedDescriptor kd, int64_t now_us) {
  int64_t first = 0;
  absl::string_view scope;  // in kd.key
  if (!ParseUnnamedKey(kd.key, &first, &scope)) {
    AddOne(std::move(kd), now_us);  // runs are unnamed ops only
    return;
  }
  // A run is recorded as a whole, unless its ops need their own treatment: a refusal, or
  // faults that may have failed some of them already (failed_ and lost_order_ are empty but
  // after faults).
  if (kd.desc->refused_code == 0 && failed_.empty() && lost_order_.empty()) {
    AddUnnamed(scope, first, kd.count, kd.desc, now_us);
    return;
  }
  const std::shared_ptr<const Descriptor> desc = kd.desc;
  const std::string run_scope(scope);  // kd.key moves
  const int64_t count = kd.count;
  kd.count = 1;
  AddOne(std::move(kd), now_us);
  for (int64_t i = 1; i < count; ++i) AddOne({UnnamedKey(first + i, run_scope), desc}, now_us);
}

void Coordinator::AddOne(KeyedDescriptor kd, int64_t now_us) {
  // Alive until the end: kd.desc holds it, and once moved into the entry, the entry does.
  const Descriptor& d = *kd.desc;
  const std::string& key = kd.key;
  // A key that failed before this rank submitted it (it timed out, or a rank refused it):
  // this submission is the owed one and fails the same way. A rank that is not owed (it
  // refused the op, then submits the same name again) starts a new round instead.
  // (failed_ and lost_order_ are empty but after faults: every op passes here.)
  auto failed = failed_.empty() ? failed_.end() : failed_.find(key);
  if (failed != failed_.end() && failed->second.owed.count(d.rank)) {
    if (d.refused_code == 0) {
      Response error = failed->second.error;
      error.ranks = {d.rank};
      immediate_.push_back(std::move(error));
    }
    failed->second.owed.erase(d.rank);
    if (failed->second.owed.empty()) failed_.erase(failed);
    return;
  }
  if (!lost_order_.empty() && IsUnnamedKey(key)) {
    auto lost = lost_order_.find(ScopeOf(key));
    if (lost != lost_order_.end()) {
      // A refusing rank already has its own error; nobody waits for this key.
      if (d.refused_code == 0) {
        immediate_.push_back(ErrorFor({key}, d.op, absl::StatusCode::kFailedPrecondition,
                                      LostOrderMessage(DescribeAs(d, key), lost->second),
                                      {d.rank}));
      }
      return;
    }
  }
  if (d.refused_code != 0) {
    Descriptor keyed = d;
    keyed.key = key;
    Refuse(keyed);
    return;
  }
  int64_t number = 0;
  absl::string_view scope;
  if (ParseUnnamedKey(key, &number, &scope)) {
    AddUnnamed(scope, number, 1, kd.desc, now_us);
    return;
  }
  auto pending = pending_.try_emplace(key).first;
  Entry& e = pending->second;
  if (e.by_rank.empty()) {
    e.first_seen_us = now_us;
    e.by_rank.reserve(RankCount(d.group));
  }
  auto at = RankAt(e.by_rank, d.rank);
  if (at != e.by_rank.end() && at->first == d.rank) {
    immediate_.push_back(SubmittedTwice(d, key));
    return;
  }
  // Kept in rank order by insertion: linear per rank, which stays small next to the rest of
  // an op's work up to hundreds of ranks.
  e.by_rank.emplace(at, d.rank, std::move(kd.desc));
  if (e.by_rank.size() == RankCount(e.by_rank.front().second->group)) {
    auto node = pending_.extract(pending);
    ready_.emplace_back(std::move(node.key()), std::move(node.mapped()));
  }
}

void Coordinator::AddUnnamed(absl::string_view scope, int64_t first, int64_t count,
                             const std::shared_ptr<const Descriptor>& desc, int64_t now_us) {
  const Descriptor& d = *desc;
  auto scoped = unnamed_.find(scope);
  if (scoped == unnamed_.end()) scoped = unnamed_.emplace(std::string(scope), Unnamed()).first;
  Unnamed& ops = scoped->second;
  const int64_t end = first + count;
  // Entries of other ranks' runs now begin or end at the run's ends, and lie inside it or
  // outside: each one inside gets this rank (and is ready once it has every rank); the gaps
  // between them become entries of this rank alone.
  SplitAt(ops, first);
  SplitAt(ops, end);
  const size_t expected = RankCount(d.group);
  auto it = ops.lower_bound(first);
  for (int64_t at = first; at < end;) {
    if (it == ops.end() || it->first != at) {
      const int64_t next = it != ops.end() && it->first < end ? it->first : end;
      Entry e;
      e.first_seen_us = now_us;
      e.count = next - at;
      e.by_rank.reserve(expected);
      e.by_rank.emplace_back(d.rank, desc);
      if (expected == 1) {
        ready_.emplace_back(UnnamedKey(at, scope), std::move(e));
      } else {
        ops.emplace_hint(it, at, std::move(e));
        unnamed_keys_ += static_cast<size_t>(next - at);
      }
      at = next;
      continue;
    }
    Entry& e = it->second;
    const int64_t n = e.count;
    auto rank_at = RankAt(e.by_rank, d.rank);
    if (rank_at != e.by_rank.end() && rank_at->first == d.rank) {
      for (int64_t number = at; number < at + n; ++number) {
        immediate_.push_back(SubmittedTwice(d, UnnamedKey(number, scope)));
      }
      ++it;
    } else {
      e.by_rank.emplace(rank_at, d.rank, desc);
      if (e.by_rank.size() == expected) {
        ready_.emplace_back(UnnamedKey(at, scope), std::move(e));
        it = ops.erase(it);
        unnamed_keys_ -= static_cast<size_t>(n);
      } else {
        ++it;
      }
    }
    at += n;
  }
}

size_t Coordinator::RankCount(const std::vector<int32_t>& group) const {
  return group.empty() ? static_cast<size_t>(size_) : group.size();
}

Response Coordinator::SubmittedTwice(const Descriptor& d, const std::string& key) const {
  return ErrorFor({key}, d.op, absl::StatusCode::kInvalidArgument,
                  absl::StrCat(DescribeAs(d, key), ": rank ", d.rank,
                               " submitted it twice before it completed"),
                  {d.rank});
}

void Coordinator::SplitAt(Unnamed& ops, int64_t number) {
  auto it = ops.upper_bound(number);
  if (it == ops.begin()) return;
  --it;
  Entry& e = it->second;
  if (it->first == number || it->first + e.count <= number) return;
  Entry tail = e;  // the same ranks and descriptors
  tail.count = it->first + e.count - number;
  e.count = number - it->first;
  ops.emplace_hint(std::next(it), number, std::move(tail));
}

Coordinator::Entry Coordinator::TakePending(const std::string& key) {
  Entry taken;
  int64_t number = 0;
  absl::string_view scope;
  if (ParseUnnamedKey(key, &number, &scope)) {
    auto scoped = unnamed_.find(scope);
    if (scoped == unnamed_.end()) return taken;
    Unnamed& ops = scoped->second;
    SplitAt(ops, number);
    SplitAt(ops, number + 1);
    auto it = ops.find(number);
    if (it == ops.end()) return taken;
    taken = std::move(it->second);
    ops.erase(it);
    --unnamed_keys_;
    return taken;
  }
  auto it = pending_.find(key);
  if (it == pending_.end()) return taken;
  taken = std::move(it->second);
  pending_.erase(it);
  return taken;
}

void Coordinator::Refuse(const Descriptor& d) {
  std::vector<int32_t> present;
  for (const auto& entry : TakePending(d.key).by_rank) present.push_back(entry.first);
  Response error = ErrorFor({d.key}, d.op, static_cast<absl::StatusCode>(d.refused_code),
                            absl::StrCat(Describe(d), " failed on rank ", d.rank,
                                         ", which refused it: ", d.refused_message),
                            present);
  std::set<int> owed;
  for (int r : Members(d.group)) {
    if (r != d.rank && std::find(present.begin(), present.end(), r) == present.end()) {
      owed.insert(r);
    }
  }
  if (!present.empty()) immediate_.push_back(error);
  if (!owed.empty()) failed_[d.key] = Failed{std::move(error), std::move(owed)};
}

Response Coordinator::ErrorFor(const std::vector<std::string>& keys, OpType op,
                               absl::StatusCode code, const std::string& message,
                               std::vector<int32_t> ranks) const {
  Response r;
  r.op = op;
  r.keys = keys;
  r.error_code = static_cast<int32_t>(code);
  r.error_message = message;
  r.ranks = std::move(ranks);
  return r;
}

namespace {

// "" when `key` agrees on every rank; otherwise who has what, shown with `show`. The
// strings are only built for a disagreement: this runs for every op on rank 0.
template <typename Key, typename Show>
std::string Disagreement(const Coordinator::ByRank& by_rank, Key key, Show show) {
  const auto& first = key(*by_rank.front().second);
  bool same = true;
  for (const auto& entry : by_rank) same = same && key(*entry.second) == first;
  if (same) return "";
  std::vector<std::pair<int, std::string>> values;
  for (const auto& [rank, d] : by_rank) values.emplace_back(rank, show(*d));
  return DescribeDisagreement(values);
}

// Every dimension but the first (a view into `shape`).
absl::Span<const int64_t> Tail(absl::Span<const int64_t> shape) {
  return shape.subspan(shape.empty() ? 0 : 1);
}

}  // namespace

std::string Coordinator::Validate(const std::string& key, const Entry& e) const {
  const Descriptor& first = *e.by_rank.front().second;
  const auto what = [&] { return DescribeAs(first, key); };  // for errors only
  const auto& all = e.by_rank;
  std::string diff = Disagreement(
      all, [](const Descriptor& d) { return d.op; },
      [](const Descriptor& d) { return std::string(OpName(d.op)); });
  if (!diff.empty()) {
    const std::string label =
        key[0] == '#' ? absl::StrCat("unnamed op ", key) : absl::StrCat("'", key, "'");
    return absl::StrCat(label, ": ranks submitted different operations: ", diff);
  }
  // A receiver with an Allocator takes whatever dtype and shape come.
  ByRank fixed_only;
  if (first.op == OpType::kSendRecv) {
    for (const auto& entry : all) {
      if (!entry.second->shape_from_peer) fixed_only.push_back(entry);
    }
  }
  const auto& fixed = first.op == OpType::kSendRecv ? fixed_only : all;
  diff = Disagreement(
      fixed, [](const Descriptor& d) { return d.dtype; },
      [](const Descriptor& d) { return std::string(DTypeName(d.dtype)); });
  if (!diff.empty()) return absl::StrCat(what(), ": dtype differs across ranks: ", diff);
  diff = Disagreement(
      all, [](const Descriptor& d) { return d.device.type; },
      [](const Descriptor& d) { return d.device.ToString(); });
  // The kind of device must agree (one backend runs the op everywhere); its index need not:
  // with one GPU per process, rank r usually holds cuda:r.
  if (!diff.empty()) return absl::StrCat(what(), ": device type differs across ranks: ", diff);
  const OpType op = first.op;
  if (op == OpType::kAllgather || op == OpType::kNeighborAllgather) {
    diff = Disagreement(
        all, [](const Descriptor& d) { return Tail(d.shape); },
        [](const Descriptor& d) {
          const absl::Span<const int64_t> tail = Tail(d.shape);
          return absl::StrCat("[*", tail.empty() ? "" : ", ", absl::StrJoin(tail, ", "), "]");
        });
    if (!diff.empty()) {
      return absl::StrCat(what(), ": shapes must agree in every dimension but the first: ", diff);
    }
    // The gathered tensor (at most every rank's rows) must have a representable size; an
    // empty one (no rows, or rows without elements) has none, whatever its other dims.
    const absl::Span<const int64_t> tail = Tail(first.shape);
    const bool empty_rows = std::find(tail.begin(), tail.end(), 0) != tail.end();
    int64_t row_bytes = empty_rows ? 0 : static_cast<int64_t>(DTypeSize(first.dtype));
    for (int64_t d : tail) {
      if (empty_rows) break;
      if (__builtin_mul_overflow(row_bytes, d, &row_bytes)) row_bytes = -1;
      if (row_bytes < 0) break;
    }
    int64_t rows = 0;
    for (const auto& [rank, d] : all) {
      const int64_t mine = d->rows();
      if (rows >= 0 && __builtin_add_overflow(rows, mine, &rows)) rows = -1;
    }
    int64_t total = 0;
    if (rows != 0 &&
        (row_bytes < 0 || rows < 0 || __builtin_mul_overflow(rows, row_bytes, &total))) {
      return absl::StrCat(what(), ": the gathered tensor would have more than 2^63 bytes");
    }
  } else if (op == OpType::kSendRecv) {
    if (fixed.size() > 1) {
      diff = Disagreement(
          fixed, [](const Descriptor& d) -> const Dims& { return d.shape; },
          [](const Descriptor& d) { return ShapeToString(d.shape); });
      if (!diff.empty()) {
        return absl::StrCat(what(), ": the receiver's tensor does not have the sent shape: ", diff);
      }
    }
  } else if (op != OpType::kBarrier && op != OpType::kSetTopology &&
             op != OpType::kShutdown && op != OpType::kWinFree) {
    diff = Disagreement(
        all, [](const Descriptor& d) -> const Dims& { return d.shape; },
        [](const Descriptor& d) { return ShapeToString(d.shape); });
    if (!diff.empty()) return absl::StrCat(what(), ": shape differs across ranks: ", diff);
  }
  if (op == OpType::kBroadcast) {
    diff = Disagreement(
        all, [](const Descriptor& d) { return d.root; },
        [](const Descriptor& d) { return absl::StrCat("root ", d.root); });
    if (!diff.empty()) return absl::StrCat(what(), ": root rank differs across ranks: ", diff);
  }
  if (op == OpType::kWinCreate) {
    diff = Disagreement(
        all, [](const Descriptor& d) { return d.root; },
        [](const Descriptor& d) { return std::string(d.root == 1 ? "ucx" : "mpi"); });
    if (!diff.empty()) {
      return absl::StrCat(what(),
                          ": the window transport (WEFT_TRANSPORT) differs across ranks: ", diff);
    }
  }
  if (op == OpType::kAllreduce) {
    diff = Disagreement(
        all, [](const Descriptor& d) { return d.average; },
        [](const Descriptor& d) { return std::string(d.average ? "average" : "sum"); });
    if (!diff.empty()) return absl::StrCat(what(), ": average/sum differs across ranks: ", diff);
  }
  if (op == OpType::kSetTopology) {
    std::vector<int> busy;
    for (const auto& [rank, d] : e.by_rank) {
      if (d->in_flight > 0) busy.push_back(rank);
    }
    if (!busy.empty()) {
      return absl::StrCat("set_topology: ops are still in flight on rank",
                          busy.size() > 1 ? "s " : " ", RankList(busy),
                          "; wait for them before changing the topology");
    }
    diff = Disagreement(
        all, [](const Descriptor& d) { return d.fingerprint; },
        [](const Descriptor& d) { return absl::StrCat("graph #", d.fingerprint); });
    if (!diff.empty()) {
      return absl::StrCat("set_topology: ranks passed topologies that are not equivalent "
                          "(different edges): ",
                          diff);
    }
  }

  // Point-to-point patterns: what each rank expects to receive must be exactly what the
  // others send it, or the exchange would hang.
  const bool ranks_pattern = op == OpType::kNeighborAllgather ||
                             op == OpType::kNeighborAllreduce || op == OpType::kPairGossip ||
                             op == OpType::kSendRecv;
  const bool machine_pattern = op == OpType::kHierarchicalNeighborAllreduce;
  if (ranks_pattern || machine_pattern) {
    std::map<int, const Descriptor*> nodes;  // rank or machine -> its descriptor
    for (const auto& [rank, d] : e.by_rank) {
      if (ranks_pattern) {
        nodes[rank] = d.get();
      } else if (d->local_rank == 0) {
        nodes[d->machine] = d.get();
      }
    }
    const char* unit = ranks_pattern ? "rank" : "machine";
    std::map<int, std::set<int>> senders_to;
    for (const auto& [node, d] : nodes) {
      for (int to : d->send_ranks) senders_to[to].insert(node);
    }
    std::vector<std::string> problems;
    for (const auto& [node, d] : nodes) {
      std::set<int> expected(d->recv_ranks.begin(), d->recv_ranks.end());
      const std::set<int>& actual = senders_to[node];
      for (int from : expected) {
        if (!actual.count(from)) {
          problems.push_back(absl::StrCat(unit, " ", node, " expects to receive from ", unit,
                                          " ", from, ", which does not send to it"));
        }
      }
      for (int from : actual) {
        if (!expected.count(from)) {
          problems.push_back(absl::StrCat(unit, " ", from, " sends to ", unit, " ", node,
                                          ", which does not expect it"));
        }
      }
    }
    for (const auto& [to, from] : senders_to) {
      if (!nodes.count(to)) {
        problems.push_back(absl::StrCat(unit, " ", RankList({from.begin(), from.end()}),
                                        " sends to ", unit, " ", to, ", which does not exist"));
      }
    }
    if (!problems.empty()) {
      const size_t shown = std::min<size_t>(problems.size(), 8);
      std::vector<std::string> head(problems.begin(), problems.begin() + shown);
      return absl::StrCat(
          what(), ": send and receive ranks do not match: ", absl::StrJoin(head, "; "),
          problems.size() > shown ? absl::StrCat(" (and ", problems.size() - shown, " more)") : "");
    }
  }
  return "";
}

bool Coordinator::Fusable(OpType op) {
  return op == OpType::kAllreduce || op == OpType::kBroadcast ||
         op == OpType::kNeighborAllreduce || op == OpType::kHierarchicalNeighborAllreduce ||
         op == OpType::kPairGossip;
}

bool Coordinator::CanFuse(const Entry& a, const Entry& b) const {
  const Descriptor& da = *a.by_rank.front().second;
  const Descriptor& db = *b.by_rank.front().second;
  if (da.op != db.op || !Fusable(da.op) || da.dtype != db.dtype || da.device != db.device ||
      da.group != db.group || a.by_rank.size() != b.by_rank.size()) {
    return false;
  }
  // The same ranks in the same order: both keys carry the same process set.
  for (size_t i = 0; i < a.by_rank.size(); ++i) {
    const Descriptor& d = *a.by_rank[i].second;
    const Descriptor& other = *b.by_rank[i].second;
    if (a.by_rank[i].first != b.by_rank[i].first || d.fusion_signature.empty() ||
        (&d != &other && d.fusion_signature != other.fusion_signature)) {
      return false;
    }
  }
  return true;
}

bool Coordinator::KnownValid(const Entry& e) const { return e.by_rank == last_valid_; }

std::vector<Response> Coordinator::TakeReady(int64_t fusion_threshold) {
  std::vector<Response> out = std::move(immediate_);
  immediate_.clear();
  const Entry* group_head = nullptr;  // first entry of the open fused group
  int64_t group_bytes = 0;
  for (auto& [first_key, entry] : ready_) {
    const Descriptor& d = *entry.by_rank.front().second;
    // A run answers for each of its ops, numbered on from its first.
    int64_t first = 0;
    absl::string_view scope_view;
    if (entry.count > 1) ParseUnnamedKey(first_key, &first, &scope_view);
    const std::string scope(scope_view);  // first_key moves into the first op's response
    for (int64_t i = 0; i < entry.count; ++i) {
      std::string key = i == 0 ? std::move(first_key) : UnnamedKey(first + i, scope);
      if (!KnownValid(entry)) {
        const std::string problem = Validate(key, entry);
        if (!problem.empty()) {
          out.push_back(
              ErrorFor({key}, d.op, absl::StatusCode::kInvalidArgument, problem, d.group));
          group_head = nullptr;
          continue;
        }
        last_valid_ = entry.by_rank;
      }
      const int64_t bytes = static_cast<int64_t>(d.nbytes());
      if (group_head != nullptr && CanFuse(*group_head, entry) &&
          group_bytes + bytes <= fusion_threshold) {
        out.back().keys.push_back(std::move(key));  // ready_ is cleared below
        group_bytes += bytes;
        continue;
      }
      Response r;
      r.op = d.op;
      if (entry.count - i > 1 && Fusable(d.op)) {
        // The rest of the run, as far as the threshold lets it fuse.
        const int64_t fit = bytes > 0 ? fusion_threshold / bytes : entry.count - i;
        r.keys.reserve(static_cast<size_t>(std::max<int64_t>(1, std::min(entry.count - i, fit))));
      }
      r.keys.push_back(std::move(key));
      r.ranks = d.group;
      if (d.op == OpType::kSendRecv) {
        for (const auto& [rank, rd] : entry.by_rank) {
          if (rd->send_ranks.empty()) continue;
          r.first_dims.emplace_back(rd->shape.begin(), rd->shape.end());
          r.first_dims.push_back({static_cast<int64_t>(rd->dtype)});
        }
      }
      if (d.op == OpType::kAllreduce) {
        r.out_of_place = std::none_of(entry.by_rank.begin(), entry.by_rank.end(),
                                      [](const auto& rd) { return rd.second->in_place; });
      }
      if (d.op == OpType::kAllgather || d.op == OpType::kNeighborAllgather) {
        std::vector<int64_t> dims(size_);
        for (const auto& [rank, rd] : entry.by_rank) {
          dims[rank] = rd->rows();
        }
        r.first_dims.push_back(std::move(dims));
      }
      out.push_back(std::move(r));
      group_head = Fusable(d.op) ? &entry : nullptr;
      group_bytes = bytes;
    }
  }
  ready_.clear();
  return out;
}

std::vector<int> Coordinator::Members(const Entry& e) const {
  return Members(e.by_rank.front().second->group);
}

std::vector<int> Coordinator::Members(const std::vector<int32_t>& group) const {
  if (!group.empty()) return std::vector<int>(group.begin(), group.end());
  std::vector<int> all(size_);
  for (int r = 0; r < size_; ++r) all[r] = r;
  return all;
}

std::string Coordinator::MissingRanks(const Entry& e) const {
  std::vector<int> missing;
  for (int r : Members(e)) {
    if (!Has(e.by_rank, r)) missing.push_back(r);
  }
  return RankList(missing);
}

Coordinator::StallReport Coordinator::CheckStalls(int64_t now_us, double warning_s,
                                                  double timeout_s) {
  StallReport report;
  const int64_t warn_us = static_cast<int64_t>(warning_s * 1e6);
  const int64_t timeout_us = static_cast<int64_t>(timeout_s * 1e6);
  std::vector<std::string> timed_out;
  bool lost_now = false;
  for (const auto& [key, e_p] : SortedPending()) {
    Entry& e = *e_p;
    const int64_t waited = now_us - e.first_seen_us;
    const Descriptor& d = *e.by_rank.front().second;
    std::vector<int> present;
    for (const auto& entry : e.by_rank) present.push_back(entry.first);
    if (timeout_us > 0 && waited >= timeout_us) {
      timed_out.push_back(key);
      continue;
    }
    if (warn_us > 0 && waited >= warn_us && now_us - e.last_warned_us >= warn_us) {
      e.last_warned_us = now_us;
      report.warnings.push_back(absl::StrCat(
          DescribeAs(d, key), " has waited ", waited / 1000000, " s for rank",
          Members(e).size() - present.size() > 1 ? "s " : " ", MissingRanks(e),
          " (submitted by rank", present.size() > 1 ? "s " : " ", RankList(present),
          "): a rank that never calls it stalls every rank; check that all ranks run the same "
          "ops in the same order"));
    }
  }
  for (const std::string& key : timed_out) {
    const Entry e = TakePending(key);
    const Descriptor& d = *e.by_rank.front().second;
    std::vector<int32_t> present;
    std::set<int> owed;
    for (const auto& entry : e.by_rank) present.push_back(entry.first);
    for (int r : Members(e)) {
      if (!Has(e.by_rank, r)) owed.insert(r);
    }
    Response error = ErrorFor({key}, d.op, absl::StatusCode::kDeadlineExceeded,
                              absl::StrCat(DescribeAs(d, key), " timed out after ", timeout_s,
                                           " s (WEFT_STALL_TIMEOUT_SECONDS)", " waiting for rank",
                                           owed.size() > 1 ? "s " : " ", MissingRanks(e)),
                              present);
    report.errors.push_back(error);
    if (IsUnnamedKey(key) && !lost_order_.count(ScopeOf(key))) {
      lost_now = true;
      lost_order_[ScopeOf(key)] = absl::StrCat(DescribeAs(d, key), " timed out waiting for rank",
                                               owed.size() > 1 ? "s " : " ", MissingRanks(e));
    }
    failed_[key] = Failed{error, owed};
  }
  // The scopes' other unnamed ops in flight: their numbers may pair different ops. (Later
  // ones never get here: Add fails them.)
  if (!lost_now) return report;
  std::vector<std::string> lost_keys;
  for (const auto& [key, e_p] : SortedPending()) {
    auto lost = lost_order_.find(ScopeOf(key));
    if (!IsUnnamedKey(key) || lost == lost_order_.end()) continue;
    const Descriptor& d = *e_p->by_rank.front().second;
    std::vector<int32_t> present;
    for (const auto& entry : e_p->by_rank) present.push_back(entry.first);
    report.errors.push_back(ErrorFor({key}, d.op, absl::StatusCode::kFailedPrecondition,
                                     LostOrderMessage(DescribeAs(d, key), lost->second), present));
    lost_keys.push_back(key);
  }
  for (const std::string& key : lost_keys) TakePending(key);
  return report;
}

std::vector<std::pair<std::string, Coordinator::Entry*>> Coordinator::SortedPending() {
  std::vector<std::pair<std::string, Entry*>> sorted;
  sorted.reserve(pending());
  for (auto& [key, e] : pending_) sorted.emplace_back(key, &e);
  for (auto& [scope, ops] : unnamed_) {
    // One entry per op: each waits, is warned about and fails on its own from here on.
    for (auto it = ops.begin(); it != ops.end(); ++it) {
      const int64_t end = it->first + it->second.count;
      for (int64_t number = it->first + 1; number < end; ++number) SplitAt(ops, number);
    }
    for (auto& [number, e] : ops) sorted.emplace_back(UnnamedKey(number, scope), &e);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return sorted;
}

}  // namespace comm
}  // namespace weft
