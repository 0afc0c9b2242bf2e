// The C++ API's ops: each validated, resolved into a request and handed to the engine
// (nonblocking forms), and the blocking forms that wait for them.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/comm.h"
#include "comm/front.h"
#include "comm/refuse.h"

namespace weft {

using comm::Begin;
using comm::CallerWaits;
using comm::CheckRank;
using comm::CheckSameLayout;
using comm::CheckTensor;
using comm::NewRequest;
using comm::OpType;
using comm::PatternSignature;
using comm::Request;
using comm::ResolveNeighborWeights;
using comm::State;
using comm::Submit;
using comm::SubmitOrRefuse;
using comm::Topo;
using comm::WinCreateKey;

namespace {

// A process set as the engine keys it: sorted, distinct, the caller among them; the whole
// world is the empty set, so that ranks passing {} and ranks listing everyone agree.
StatusOr<std::vector<int32_t>> ProcessSet(const State& state, const std::vector<int>& ranks,
                                          const char* op) {
  std::vector<int32_t> set(ranks.begin(), ranks.end());
  std::sort(set.begin(), set.end());
  for (size_t i = 0; i < set.size(); ++i) {
    WEFT_RETURN_IF_ERROR(CheckRank(set[i], state.ctx.size, op, "rank in `ranks`"));
    if (i > 0 && set[i] == set[i - 1]) {
      return InvalidArgument(op, ": rank ", set[i], " appears twice in `ranks`");
    }
  }
  if (!set.empty() && !std::binary_search(set.begin(), set.end(), state.ctx.rank)) {
    return InvalidArgument(op, ": rank ", state.ctx.rank, " called it but is not in `ranks` (",
                           comm::RankList(ranks),
                           "); only the ranks of a process set call "
                           "its ops");
  }
  if (static_cast<int>(set.size()) == state.ctx.size) set.clear();
  return set;
}

}  // namespace

StatusOr<Handle> allreduce_nonblocking(const TensorView& in, const TensorView& out, bool average,
                                       const std::string& name, const std::vector<int>& ranks) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("allreduce", name));
  WEFT_ASSIGN_OR_RETURN(auto set, ProcessSet(*state, ranks, "allreduce"));
  auto r = NewRequest(*state, OpType::kAllreduce, in, out, name);
  r->desc.average = average;
  r->desc.in_place = in.data() == out.data();
  r->desc.fusion_signature = average ? "avg" : "sum";
  r->desc.group = std::move(set);
  Status checks = CheckTensor(in, "allreduce", "input");
  if (checks.ok()) checks = CheckSameLayout(in, out, "allreduce");
  return SubmitOrRefuse(*state, std::move(r), std::move(checks));
}

StatusOr<Handle> broadcast_nonblocking(const TensorView& in, const TensorView& out, int root_rank,
                                       const std::string& name, const std::vector<int>& ranks) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("broadcast", name));
  WEFT_ASSIGN_OR_RETURN(auto set, ProcessSet(*state, ranks, "broadcast"));
  auto r = NewRequest(*state, OpType::kBroadcast, in, out, name);
  r->desc.root = root_rank;
  r->desc.fusion_signature = absl::StrCat("root", root_rank);
  r->desc.group = set;
  Status checks = CheckTensor(in, "broadcast", "input");
  if (checks.ok()) checks = CheckSameLayout(in, out, "broadcast");
  if (checks.ok()) checks = CheckRank(root_rank, state->ctx.size, "broadcast", "root_rank");
  if (checks.ok() && !set.empty() && !std::binary_search(set.begin(), set.end(), root_rank)) {
    checks = InvalidArgument("broadcast: root_rank ", root_rank, " is not in `ranks` (",
                             comm::RankList(ranks), ")");
  }
  return SubmitOrRefuse(*state, std::move(r), std::move(checks));
}

namespace {

StatusOr<std::shared_ptr<Request>> PointToPoint(State& state, const char* op, int peer,
                                                const TensorView& in, const TensorView& out,
                                                const std::string& name) {
  WEFT_RETURN_IF_ERROR(CheckRank(peer, state.ctx.size, op, op[0] == 's' ? "dst" : "src"));
  if (peer == state.ctx.rank) {
    return InvalidArgument(op, ": rank ", peer, " cannot ", op, " ", op[0] == 's' ? "to" : "from",
                           " itself");
  }
  auto r = NewRequest(state, OpType::kSendRecv, in, out, name);
  const int self = state.ctx.rank;
  r->desc.group = {std::min(self, peer), std::max(self, peer)};
  return r;
}

}  // namespace

StatusOr<Handle> send_nonblocking(const TensorView& in, int dst, const std::string& name) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("send", name));
  WEFT_ASSIGN_OR_RETURN(auto r, PointToPoint(*state, "send", dst, in, TensorView(), name));
  r->send = {{dst, 1.0}};
  r->desc.send_ranks = {dst};
  return SubmitOrRefuse(*state, std::move(r), CheckTensor(in, "send", "input"));
}

StatusOr<Handle> recv_nonblocking(const TensorView& out, int src, const std::string& name) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("recv", name));
  WEFT_ASSIGN_OR_RETURN(auto r, PointToPoint(*state, "recv", src, out, out, name));
  r->recv = {{src, 1.0}};
  r->desc.recv_ranks = {src};
  return SubmitOrRefuse(*state, std::move(r), CheckTensor(out, "recv", "output"));
}

StatusOr<Handle> recv_nonblocking(Allocator alloc, int src, const std::string& name) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("recv", name));
  WEFT_ASSIGN_OR_RETURN(auto r,
                        PointToPoint(*state, "recv", src, TensorView(), TensorView(), name));
  const bool has_alloc = static_cast<bool>(alloc);
  r->alloc = std::move(alloc);
  r->recv = {{src, 1.0}};
  r->desc.recv_ranks = {src};
  r->desc.shape_from_peer = true;
  r->desc.shape.clear();
  return SubmitOrRefuse(
      *state, r, has_alloc ? OkStatus() : InvalidArgument("recv: no output allocator given"));
}

StatusOr<Handle> allgather_nonblocking(const TensorView& in, Allocator alloc,
                                       const std::string& name) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("allgather", name));
  Status checks = CheckTensor(in, "allgather", "input");
  if (checks.ok() && in.ndim() == 0) {
    checks = InvalidArgument(
        "allgather: the input must have at least one dimension (it is "
        "concatenated along dim 0); got a scalar");
  }
  if (checks.ok() && !alloc) checks = InvalidArgument("allgather: no output allocator given");
  auto r = NewRequest(*state, OpType::kAllgather, in, TensorView(), name);
  r->alloc = std::move(alloc);
  return SubmitOrRefuse(*state, std::move(r), std::move(checks));
}

StatusOr<Handle> neighbor_allgather_nonblocking(const TensorView& in, Allocator alloc,
                                                const NeighborAllgatherOptions& options,
                                                const std::string& name) {
  const char* op = "neighbor_allgather";
  WEFT_ASSIGN_OR_RETURN(auto state, Begin(op, name));
  auto r = NewRequest(*state, OpType::kNeighborAllgather, in, TensorView(), name);
  const int self = state->ctx.rank;
  Status checks = [&]() -> Status {
    WEFT_RETURN_IF_ERROR(CheckTensor(in, op, "input"));
    if (in.ndim() == 0) {
      return InvalidArgument(op, ": the input must have at least one dimension; got a scalar");
    }
    if (!alloc) return InvalidArgument(op, ": no output allocator given");
    if (options.src_ranks.has_value() != options.dst_ranks.has_value()) {
      return InvalidArgument(op, ": src_ranks and dst_ranks go together: pass both or neither");
    }
    if (!options.src_ranks.has_value()) return OkStatus();
    for (const auto* list : {&*options.src_ranks, &*options.dst_ranks}) {
      std::set<int> seen;
      const char* what = list == &*options.src_ranks ? "src_ranks" : "dst_ranks";
      for (int j : *list) {
        WEFT_RETURN_IF_ERROR(CheckRank(j, state->ctx.size, op, what));
        if (j == self) return InvalidArgument(op, ": ", what, " names this rank (", self, ")");
        if (!seen.insert(j).second) {
          return InvalidArgument(op, ": ", what, " names rank ", j, " twice");
        }
      }
    }
    return OkStatus();
  }();
  if (!checks.ok()) return state->engine->Refuse(r, std::move(checks));
  r->alloc = std::move(alloc);
  if (options.src_ranks.has_value()) {
    for (int j : *options.src_ranks) r->recv.emplace_back(j, 1.0);
    for (int j : *options.dst_ranks) r->send.emplace_back(j, 1.0);
  } else {
    auto topo = Topo(*state).first;
    for (int j : topo->in_neighbors(self)) r->recv.emplace_back(j, 1.0);
    for (int j : topo->out_neighbors(self)) r->send.emplace_back(j, 1.0);
  }
  for (const auto& e : r->send) r->desc.send_ranks.push_back(e.first);
  for (const auto& e : r->recv) r->desc.recv_ranks.push_back(e.first);
  return Submit(*state, std::move(r));
}

StatusOr<Handle> neighbor_allreduce_nonblocking(const TensorView& in, const TensorView& out,
                                                const NeighborAllreduceOptions& options,
                                                const std::string& name) {
  const char* op = "neighbor_allreduce";
  WEFT_ASSIGN_OR_RETURN(auto state, Begin(op, name));
  auto r = NewRequest(*state, OpType::kNeighborAllreduce, in, out, name);
  auto [topo, weighted] = Topo(*state);
  Status checks = CheckTensor(in, op, "input");
  if (checks.ok()) checks = CheckSameLayout(in, out, op);
  if (checks.ok()) {
    checks = ResolveNeighborWeights(r.get(), *topo, weighted, state->ctx.rank, options.self_weight,
                                    options.src_weights, options.dst_weights, op, "rank",
                                    "src_weights", "dst_weights");
  }
  r->desc.fusion_signature = PatternSignature("nar", r->self_weight, r->send, r->recv);
  return SubmitOrRefuse(*state, std::move(r), std::move(checks));
}

StatusOr<Handle> hierarchical_neighbor_allreduce_nonblocking(
    const TensorView& in, const TensorView& out,
    const HierarchicalNeighborAllreduceOptions& options, const std::string& name) {
  const char* op = "hierarchical_neighbor_allreduce";
  WEFT_ASSIGN_OR_RETURN(auto state, Begin(op, name));
  auto r = NewRequest(*state, OpType::kHierarchicalNeighborAllreduce, in, out, name);
  std::shared_ptr<const Topology> topo;
  bool weighted;
  {
    std::lock_guard<std::mutex> lock(state->topo_mu);
    topo = state->machine_topology;
    weighted = state->machine_weighted;
  }
  Status checks = CheckTensor(in, op, "input");
  if (checks.ok()) checks = CheckSameLayout(in, out, op);
  if (checks.ok()) {
    checks = ResolveNeighborWeights(r.get(), *topo, weighted, state->ctx.machine_rank,
                                    options.self_weight, options.src_machine_weights,
                                    options.dst_machine_weights, op, "machine",
                                    "src_machine_weights", "dst_machine_weights");
  }
  r->desc.fusion_signature = PatternSignature("hnar", r->self_weight, r->send, r->recv);
  return SubmitOrRefuse(*state, std::move(r), std::move(checks));
}

StatusOr<Handle> pair_gossip_nonblocking(const TensorView& in, const TensorView& out, int peer,
                                         double self_weight, double pair_weight,
                                         const std::string& name) {
  const char* op = "pair_gossip";
  WEFT_ASSIGN_OR_RETURN(auto state, Begin(op, name));
  auto r = NewRequest(*state, OpType::kPairGossip, in, out, name);
  Status checks = CheckTensor(in, op, "input");
  if (checks.ok()) checks = CheckSameLayout(in, out, op);
  if (checks.ok()) checks = CheckRank(peer, state->ctx.size, op, "peer");
  if (checks.ok() && peer == state->ctx.rank) {
    checks = InvalidArgument(op, ": rank ", peer, " cannot gossip with itself");
  }
  if (checks.ok() && (!std::isfinite(self_weight) || !std::isfinite(pair_weight))) {
    checks = InvalidArgument(op, ": weights must be finite: self_weight ", self_weight,
                             ", pair_weight ", pair_weight);
  }
  if (!checks.ok()) return state->engine->Refuse(r, std::move(checks));
  r->self_weight = self_weight;
  r->send = {{peer, 1.0}};
  r->recv = {{peer, pair_weight}};
  r->desc.send_ranks = {peer};
  r->desc.recv_ranks = {peer};
  r->desc.fusion_signature = PatternSignature("gossip", self_weight, r->send, r->recv);
  return Submit(*state, std::move(r));
}

namespace comm {

Status RefuseOp(const OpIdentity& id, Status why) {
  const char* op = OpName(id.op);
  auto state = Begin(op, id.name);
  if (!state.ok()) return why;
  auto r = NewRequest(**state, id.op, TensorView(), TensorView(),
                      id.op == OpType::kWinCreate ? WinCreateKey(id.name) : id.name);
  if (id.op == OpType::kSendRecv) {
    const bool sending = id.send_to >= 0;
    auto p2p = PointToPoint(**state, sending ? "send" : "recv", sending ? id.send_to : id.recv_from,
                            TensorView(), TensorView(), id.name);
    if (!p2p.ok()) return why;
    r = *p2p;
    (sending ? r->desc.send_ranks : r->desc.recv_ranks) = {sending ? id.send_to : id.recv_from};
  } else if (!id.ranks.empty()) {
    auto set = ProcessSet(**state, id.ranks, op);
    if (!set.ok()) return why;
    r->desc.group = std::move(*set);
  }
  return (*state)->engine->Refuse(r, std::move(why));
}

}  // namespace comm

StatusOr<Handle> barrier_nonblocking() {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("barrier", ""));
  auto r = NewRequest(*state, OpType::kBarrier, TensorView(), TensorView(), "");
  return Submit(*state, std::move(r));
}

bool poll(const Handle& handle) {
  if (!handle.request_) return true;
  comm::Request& r = *handle.request_;
  if (r.is_done()) return true;
  if (auto engine = r.engine.lock()) engine->TryProgress();
  return r.is_done();
}

Status wait(const Handle& handle) {
  if (!handle.request_) return InvalidArgument("wait: the handle is empty");
  comm::Request& r = *handle.request_;
  if (!r.is_done()) {
    if (auto engine = r.engine.lock()) WEFT_RETURN_IF_ERROR(engine->DriveUntilDone(r));
    std::unique_lock<std::mutex> lock(r.mu);
    r.cv.wait(lock, [&] { return r.done.load(std::memory_order_relaxed); });
  }
  return r.status;
}

// Blocking forms: the nonblocking call plus a wait.
Status allreduce(const TensorView& in, const TensorView& out, bool average, const std::string& name,
                 const std::vector<int>& ranks) {
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h, allreduce_nonblocking(in, out, average, name, ranks));
  return wait(h);
}

Status broadcast(const TensorView& in, const TensorView& out, int root_rank,
                 const std::string& name, const std::vector<int>& ranks) {
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h, broadcast_nonblocking(in, out, root_rank, name, ranks));
  return wait(h);
}

Status send(const TensorView& in, int dst, const std::string& name) {
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h, send_nonblocking(in, dst, name));
  return wait(h);
}

Status recv(const TensorView& out, int src, const std::string& name) {
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h, recv_nonblocking(out, src, name));
  return wait(h);
}

StatusOr<TensorView> recv(Allocator alloc, int src, const std::string& name) {
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h, recv_nonblocking(std::move(alloc), src, name));
  WEFT_RETURN_IF_ERROR(wait(h));
  return h.output();
}

StatusOr<TensorView> allgather(const TensorView& in, Allocator alloc, const std::string& name) {
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h, allgather_nonblocking(in, std::move(alloc), name));
  WEFT_RETURN_IF_ERROR(wait(h));
  return h.output();
}

StatusOr<TensorView> neighbor_allgather(const TensorView& in, Allocator alloc,
                                        const NeighborAllgatherOptions& options,
                                        const std::string& name) {
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h,
                        neighbor_allgather_nonblocking(in, std::move(alloc), options, name));
  WEFT_RETURN_IF_ERROR(wait(h));
  return h.output();
}

Status neighbor_allreduce(const TensorView& in, const TensorView& out,
                          const NeighborAllreduceOptions& options, const std::string& name) {
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h, neighbor_allreduce_nonblocking(in, out, options, name));
  return wait(h);
}

Status hierarchical_neighbor_allreduce(const TensorView& in, const TensorView& out,
                                       const HierarchicalNeighborAllreduceOptions& options,
                                       const std::string& name) {
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h,
                        hierarchical_neighbor_allreduce_nonblocking(in, out, options, name));
  return wait(h);
}

Status pair_gossip(const TensorView& in, const TensorView& out, int peer, double self_weight,
                   double pair_weight, const std::string& name) {
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h,
                        pair_gossip_nonblocking(in, out, peer, self_weight, pair_weight, name));
  return wait(h);
}

Status barrier() {
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h, barrier_nonblocking());
  return wait(h);
}

}  // namespace weft
