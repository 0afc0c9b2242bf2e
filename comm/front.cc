#include "comm/front.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/engine.h"

namespace weft {
namespace comm {
namespace {

void AppendBits(std::string* out, double v) {
  char bytes[sizeof(double)];
  std::memcpy(bytes, &v, sizeof(v));
  out->append(bytes, sizeof(bytes));
}

}  // namespace

std::mutex g_mu;
std::shared_ptr<State> g_state;

std::shared_ptr<State> Current() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_state;
}

Status NotInitialized(const char* what) {
  return FailedPrecondition(what, ": weft is not initialized; call init() first");
}

Status CheckTensor(const TensorView& t, const char* op, const char* which) {
  if (!t.defined()) return InvalidArgument(op, ": the ", which, " tensor has no data");
  if (t.device().type != Device::Type::kCPU) {
    WEFT_RETURN_IF_ERROR(DeviceUsable(t.device(), op, which));
  }
  if (!t.is_contiguous()) {
    return InvalidArgument(op, ": the ", which, " tensor ", t.ToString(),
                           " is not contiguous; pass a contiguous tensor (the LibTorch "
                           "adapter copies for you)");
  }
  return OkStatus();
}

Status CheckSameLayout(const TensorView& in, const TensorView& out, const char* op) {
  WEFT_RETURN_IF_ERROR(CheckTensor(out, op, "output"));
  if (in.dtype() != out.dtype() || in.shape() != out.shape()) {
    return InvalidArgument(op, ": the output must have the input's dtype and shape: input ",
                           in.ToString(), ", output ", out.ToString());
  }
  if (in.device() != out.device()) {
    return InvalidArgument(op, ": the output must be on the input's device: input ", in.ToString(),
                           ", output ", out.ToString());
  }
  // The same memory is in place; memory shared in part would be read after it was written.
  const auto i = reinterpret_cast<uintptr_t>(in.data());
  const auto o = reinterpret_cast<uintptr_t>(out.data());
  const size_t n = in.nbytes();
  if (i != o && n > 0 && i < o + n && o < i + n) {
    return InvalidArgument(op, ": the output overlaps the input without being the same memory (",
                           in.ToString(), ", the output starting ", static_cast<int64_t>(o - i),
                           " bytes from the input); pass the same tensor twice for in place, or "
                           "separate tensors");
  }
  return OkStatus();
}

Status CheckRank(int r, int size, const char* op, const char* what) {
  if (r < 0 || r >= size) {
    return InvalidArgument(op, ": ", what, " ", r, " is out of range: ranks are 0..", size - 1);
  }
  return OkStatus();
}

Status CheckWeights(const std::map<int, double>& weights, int size, int self, const char* op,
                    const char* what, const char* unit, bool self_allowed) {
  for (const auto& [r, w] : weights) {
    if (r < 0 || r >= size) {
      return InvalidArgument(op, ": ", what, " names ", unit, " ", r, ", out of range 0..",
                             size - 1);
    }
    if (r == self && !self_allowed) {
      return InvalidArgument(op, ": ", what, " names this ", unit, " (", self,
                             "); give its weight as self_weight");
    }
    if (!std::isfinite(w)) {
      return InvalidArgument(op, ": ", what, " gives ", unit, " ", r, " the weight ", w);
    }
  }
  return OkStatus();
}

std::string PatternSignature(const char* tag, double self_weight,
                             const std::vector<std::pair<int, double>>& send,
                             const std::vector<std::pair<int, double>>& recv) {
  std::string sig = tag;
  AppendBits(&sig, self_weight);
  for (const auto& [r, w] : send) {
    sig += absl::StrCat("s", r);
    AppendBits(&sig, w);
  }
  for (const auto& [r, w] : recv) {
    sig += absl::StrCat("r", r);
    AppendBits(&sig, w);
  }
  return sig;
}

// Resolves neighbor weights into the request: who to send to (with the sender-side
// scale) and receive from (with the receiver-side weight), for ranks or machines.
Status ResolveNeighborWeights(Request* r, const Topology& topo, bool weighted, int self,
                              std::optional<double> self_weight,
                              const std::optional<std::map<int, double>>& src_weights,
                              const std::optional<std::map<int, double>>& dst_weights,
                              const char* op, const char* unit, const char* src_name,
                              const char* dst_name) {
  const int n = topo.size();
  if (self_weight.has_value() != src_weights.has_value()) {
    return InvalidArgument(op, ": self_weight and ", src_name,
                           " go together: pass both or neither");
  }
  if (dst_weights.has_value() && !self_weight.has_value()) {
    return InvalidArgument(op, ": ", dst_name, " needs self_weight and ", src_name);
  }
  if (self_weight.has_value() && !std::isfinite(*self_weight)) {
    return InvalidArgument(op, ": self_weight is ", *self_weight);
  }
  // A dynamic exchange may name this rank (machine) on both sides, as a schedule computed
  // for every rank alike does when it wraps around to the caller (one machine, say): that
  // is a message to itself, which adds its weights to self_weight.
  const bool to_self =
      dst_weights.has_value() && src_weights->count(self) != 0 && dst_weights->count(self) != 0;
  if (src_weights) {
    WEFT_RETURN_IF_ERROR(CheckWeights(*src_weights, n, self, op, src_name, unit, to_self));
  }
  if (dst_weights) {
    WEFT_RETURN_IF_ERROR(CheckWeights(*dst_weights, n, self, op, dst_name, unit, to_self));
  }

  r->send.clear();
  r->recv.clear();
  if (dst_weights.has_value()) {  // dynamic: exactly these ranks, this call only
    r->self_weight = *self_weight;
    if (to_self) r->self_weight += src_weights->at(self) * dst_weights->at(self);
    for (const auto& e : *dst_weights) {
      if (e.first != self) r->send.push_back(e);
    }
    for (const auto& e : *src_weights) {
      if (e.first != self) r->recv.push_back(e);
    }
  } else {
    r->topology_pattern = true;
    for (int j : topo.out_neighbors(self)) r->send.emplace_back(j, 1.0);
    const std::vector<int>& in = topo.in_neighbors(self);
    if (src_weights.has_value()) {
      for (const auto& [j, w] : *src_weights) {
        if (!std::binary_search(in.begin(), in.end(), j)) {
          return InvalidArgument(
              op, ": ", src_name, " names ", unit, " ", j, ", which is not an in-neighbor of ",
              unit, " ", self,
              " in the topology (in-neighbors: ", in.empty() ? "none" : absl::StrJoin(in, ", "),
              "); pass dst_weights for a dynamic exchange");
        }
      }
      // Every in-neighbor sends under a static topology; those not named weigh 0.
      r->self_weight = *self_weight;
      for (int j : in) {
        auto it = src_weights->find(j);
        r->recv.emplace_back(j, it == src_weights->end() ? 0.0 : it->second);
      }
    } else if (weighted) {
      RecvWeights rw = GetRecvWeights(topo, self);
      r->self_weight = rw.self_weight;
      for (const auto& e : rw.neighbor_weights) r->recv.push_back(e);
    } else {
      const double w = 1.0 / static_cast<double>(in.size() + 1);
      r->self_weight = w;
      for (int j : in) r->recv.emplace_back(j, w);
    }
  }
  for (const auto& e : r->send) r->desc.send_ranks.push_back(e.first);
  for (const auto& e : r->recv) r->desc.recv_ranks.push_back(e.first);
  return OkStatus();
}

StatusOr<std::shared_ptr<State>> Begin(const char* op, const std::string& name) {
  auto state = Current();
  if (state == nullptr) return NotInitialized(op);
  if (!name.empty() && name[0] == '#') {
    return InvalidArgument(op, ": names starting with '#' are reserved for unnamed ops: '", name,
                           "'");
  }
  return state;
}

// What matches a window's creation across ranks (its refusals included).
std::string WinCreateKey(const std::string& name) { return "win_create:" + name; }

std::shared_ptr<Request> NewRequest(const State& state, OpType op, const TensorView& in,
                                    const TensorView& out, const std::string& name) {
  auto r = std::make_shared<Request>(in, out);
  r->desc.rank = state.ctx.rank;
  r->desc.op = op;
  r->desc.key = name;
  r->desc.dtype = in.dtype();
  r->desc.device = in.device();
  r->desc.shape.assign(in.shape().begin(), in.shape().end());
  r->desc.machine = state.ctx.machine_rank;
  r->desc.local_rank = state.ctx.local_rank;
  return r;
}

thread_local bool t_caller_waits = false;
thread_local int t_group_depth = 0;

StatusOr<Handle> Submit(State& state, std::shared_ptr<Request> r) {
  // In a group the ops wait for group_end (or this thread's wait) to reach the engine.
  return state.engine->Submit(std::move(r), t_caller_waits || t_group_depth > 0,
                              t_caller_waits && t_group_depth == 0);
}

// Hands a request to the engine, or, when this rank's own checks refused its arguments,
// has the engine tell the other ranks (Engine::Refuse): the op still takes its place in
// the call order, and the ranks that called it correctly fail with this rank's reason
// instead of waiting for it, or pairing their later unnamed ops with the wrong ones.
// Checks that run before the op's process set is known cannot be told (the others key
// the op by its set) and return at once instead.
StatusOr<Handle> SubmitOrRefuse(State& state, std::shared_ptr<Request> r, Status checks) {
  if (!checks.ok()) return state.engine->Refuse(std::move(r), std::move(checks));
  return Submit(state, std::move(r));
}

std::pair<std::shared_ptr<const Topology>, bool> Topo(State& s) {
  std::lock_guard<std::mutex> lock(s.topo_mu);
  return {s.topology, s.weighted};
}

}  // namespace comm

TensorView Handle::output() const { return request_ ? request_->out : TensorView(); }

void Handle::keep_alive(std::shared_ptr<const void> owner) const {
  if (!request_) return;
  std::lock_guard<std::mutex> lock(request_->mu);
  request_->owners.push_back(std::move(owner));
}

}  // namespace weft
