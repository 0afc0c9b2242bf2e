// The C++ API's one-sided windows: creation and freeing (collective), puts, gets,
// accumulates, updates, versions and mutexes, each checked and handed to the engine.
#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/comm.h"
#include "comm/front.h"
#include "comm/refuse.h"
#include "comm/window.h"
#include "core/logging.h"

namespace weft {

using comm::Begin;
using comm::CallerWaits;
using comm::CheckRank;
using comm::CheckTensor;
using comm::Current;
using comm::NewRequest;
using comm::OpType;
using comm::Request;
using comm::State;
using comm::Submit;
using comm::Topo;
using comm::WinCreateKey;

// --- windows ---------------------------------------------------------------------------

namespace {

StatusOr<std::shared_ptr<comm::Window>> FindWindow(State& state, const char* op,
                                                   const std::string& name) {
  if (name.empty()) return InvalidArgument(op, ": the window name is empty");
  std::lock_guard<std::mutex> lock(state.win_mu);
  auto it = state.windows.find(name);
  if (it == state.windows.end()) {
    return absl::NotFoundError(absl::StrCat(op, ": there is no window named '", name, "' on rank ",
                                            state.ctx.rank, " (win_create it first)"));
  }
  return it->second;
}

Status CheckWindowTensor(const comm::Window& w, const TensorView& x, const char* op) {
  WEFT_RETURN_IF_ERROR(CheckTensor(x, op, "input"));
  const TensorView& t = w.tensor();
  if (x.dtype() != t.dtype() || x.shape() != t.shape() || x.device().type != t.device().type) {
    return InvalidArgument(op, " '", w.name(), "': the tensor is ", x.ToString(),
                           " but the window holds ", t.ToString());
  }
  return OkStatus();
}

// Explicit (rank -> weight) pairs, each checked with `valid`, or the defaults with weight 1.
StatusOr<std::vector<std::pair<int, double>>> WindowRanks(
    const std::optional<std::map<int, double>>& given, const std::vector<int>& defaults,
    const std::function<bool(int)>& valid, const std::string& op, const char* what,
    const char* relation) {
  std::vector<std::pair<int, double>> out;
  if (!given.has_value()) {
    for (int r : defaults) out.emplace_back(r, 1.0);
    return out;
  }
  for (const auto& [r, w] : *given) {
    if (!std::isfinite(w))
      return InvalidArgument(op, ": ", what, " gives rank ", r, " the weight ", w);
    if (!valid(r)) {
      return InvalidArgument(op, ": ", what, " names rank ", r, ", which is not ", relation,
                             " in the topology the window was created with");
    }
    out.emplace_back(r, w);
  }
  return out;
}

StatusOr<Handle> SubmitWindowOp(State& state, std::string display,
                                std::function<std::optional<Status>()> action,
                                const comm::Window* moves_data = nullptr) {
  auto r = std::make_shared<Request>();
  r->desc.rank = state.ctx.rank;
  r->desc.op = OpType::kWinLocal;
  r->desc.key = "#win";
  r->desc.display = std::move(display);
  r->action = std::move(action);
  if (moves_data != nullptr && moves_data->transport() == comm::Transport::kUcx) {
    r->backend = "UCX";
  }
  return Submit(state, r);
}

// An op guarded by window mutexes: takes them (retrying at later rounds of progress while
// another rank holds one), runs `body`, releases them.
std::function<std::optional<Status>()> WithMutexes(std::shared_ptr<comm::Window> w,
                                                   std::vector<int> ranks, bool require,
                                                   std::function<Status()> body) {
  std::sort(ranks.begin(), ranks.end());
  return [w, ranks, require, body]() -> std::optional<Status> {
    if (require) {
      auto all = w->TryLockMutexes(ranks);
      if (!all.ok()) return all.status();
      if (!*all) return std::nullopt;
    }
    Status s = body();
    if (require) {
      Status unlocked = w->UnlockMutexes(ranks);
      if (s.ok()) s = unlocked;
    }
    return s;
  };
}

StatusOr<Handle> WinPut(const TensorView& x, const std::string& name, const WinPutOptions& options,
                        bool accumulate) {
  const char* op = accumulate ? "win_accumulate" : "win_put";
  WEFT_ASSIGN_OR_RETURN(auto state, Begin(op, name));
  WEFT_ASSIGN_OR_RETURN(auto w, FindWindow(*state, op, name));
  WEFT_RETURN_IF_ERROR(CheckWindowTensor(*w, x, op));
  const std::string display = absl::StrCat(op, " '", name, "'");
  if (!std::isfinite(options.self_weight)) {
    return InvalidArgument(display, ": self_weight is ", options.self_weight);
  }
  const int self = state->ctx.rank;
  WEFT_ASSIGN_OR_RETURN(auto dsts, WindowRanks(
                                       options.dst_weights, w->out_neighbors(),
                                       [&](int r) { return w->HasSlot(r, self); }, display,
                                       "dst_weights", "an out-neighbor of this rank"));
  std::vector<int> ranks;
  for (const auto& d : dsts) ranks.push_back(d.first);
  const double self_weight = options.self_weight;
  return SubmitWindowOp(*state, display,
                        WithMutexes(w, ranks, options.require_mutex,
                                    [w, x, dsts, accumulate, self_weight] {
                                      return w->PutAndScale(x, dsts, accumulate, self_weight);
                                    }),
                        w.get());
}

// Runs a local window op now (the caller drives the engine) and returns its status.
Status RunWindowOp(State& state, std::string display, std::function<Status()> body) {
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h,
                        SubmitWindowOp(state, std::move(display),
                                       [body]() -> std::optional<Status> { return body(); }));
  return wait(h);
}

}  // namespace

Status win_create(const TensorView& x, const std::string& name, bool zero_init) {
  WinCreateOptions options;
  options.zero_init = zero_init;
  return win_create(x, name, options);
}

Status win_create(const TensorView& x, const std::string& name, const WinCreateOptions& options) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("win_create", name));
  const bool zero_init = options.zero_init;
  auto r = NewRequest(*state, OpType::kWinCreate, x, TensorView(), WinCreateKey(name));
  // Every refusal below takes the op's place, so that the other ranks' win_create fails
  // with this rank's reason instead of waiting for it.
  comm::Transport transport = comm::Transport::kMpi;
  Status checks;
  if (options.transport.empty()) {
    StatusOr<comm::Transport> chosen = comm::DefaultTransport();
    checks = chosen.status();
    if (chosen.ok()) transport = *chosen;
  } else if (options.transport == "mpi" || options.transport == "ucx") {
    transport = options.transport == "ucx" ? comm::Transport::kUcx : comm::Transport::kMpi;
  } else {
    checks = InvalidArgument("win_create '", name, "': transport '", options.transport,
                             "' is not one of mpi, ucx");
  }
  if (checks.ok() && name.empty()) checks = InvalidArgument("win_create: the window needs a name");
  if (checks.ok()) checks = CheckTensor(x, "win_create", "input");
  if (checks.ok()) {
    std::lock_guard<std::mutex> lock(state->win_mu);
    if (state->windows.count(name)) {
      checks = InvalidArgument("win_create: a window named '", name, "' exists already on rank ",
                               state->ctx.rank);
    }
  }
  if (!checks.ok()) return state->engine->Refuse(r, std::move(checks));
  // The coordinator checks that every rank chose the same transport (they run different
  // collectives).
  r->desc.root = static_cast<int32_t>(transport);
  std::shared_ptr<const Topology> topo = Topo(*state).first;
  State* raw = state.get();
  r->action = [raw, x, name, zero_init, topo, transport]() -> std::optional<Status> {
    // A tensor on a CUDA device: the window is created over a host copy of it (every rank
    // has the same device type: the coordinator checked).
    TensorView host_x = x;
    std::shared_ptr<std::vector<char>> host;
    comm::HostCopier copy;
    if (x.device().type != Device::Type::kCPU) {
      Status staged = [&]() -> Status {
        WEFT_ASSIGN_OR_RETURN(copy, raw->engine->DeviceCopier(x.device()));
        host = std::make_shared<std::vector<char>>(x.nbytes());
        WEFT_RETURN_IF_ERROR(copy(host->data(), x.data(), x.nbytes(), /*to_device=*/false));
        host_x = TensorView(host->data(), x.dtype(), x.shape());
        return OkStatus();
      }();
      // Window creation is collective: a rank that could not copy must not leave the
      // others waiting in it.
      int ok = staged.ok() ? 1 : 0;
      MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, raw->ctx.data);
      if (!staged.ok()) return Annotate(staged, "win_create '" + name + "': host staging");
      if (!ok) {
        return FailedPrecondition("win_create '", name,
                                  "': another rank could not copy its "
                                  "CUDA tensor to host memory (see its error)");
      }
    }
    auto w = comm::Window::Create(raw->ctx.data, name, host_x, *topo, zero_init, transport);
    if (!w.ok()) return w.status();
    if (copy) (*w)->StageThrough(x, copy, host);
    std::lock_guard<std::mutex> lock(raw->win_mu);
    raw->windows[name] = *w;
    raw->engine->windows.fetch_add(1);
    return OkStatus();
  };
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h, Submit(*state, r));
  return wait(h);
}

Status win_free(const std::string& name) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("win_free", name));
  auto r = NewRequest(*state, OpType::kWinFree, TensorView(), TensorView(),
                      "win_free:" + (name.empty() ? std::string("*") : name));
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> lock(state->win_mu);
    if (name.empty()) {
      for (const auto& entry : state->windows) names.push_back(entry.first);
    } else if (state->windows.count(name)) {
      names.push_back(name);
    }
  }
  if (!name.empty() && names.empty()) {
    // Refused in the op's place: the ranks that have the window are told, not left waiting.
    return state->engine->Refuse(
        r, absl::NotFoundError(absl::StrCat("win_free: there is no window named '", name,
                                            "' on rank ", state->ctx.rank)));
  }
  State* raw = state.get();
  r->action = [raw, names]() -> std::optional<Status> {
    Status status;
    for (const std::string& n : names) {
      std::shared_ptr<comm::Window> w;
      {
        std::lock_guard<std::mutex> lock(raw->win_mu);
        auto it = raw->windows.find(n);
        if (it == raw->windows.end()) continue;
        w = it->second;
        raw->windows.erase(it);
      }
      raw->engine->windows.fetch_sub(1);
      Status s = w->Free();
      if (status.ok()) status = s;
    }
    return status;
  };
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h, Submit(*state, r));
  return wait(h);
}

StatusOr<Handle> win_put_nonblocking(const TensorView& x, const std::string& name,
                                     const WinPutOptions& options) {
  return WinPut(x, name, options, /*accumulate=*/false);
}

Status win_put(const TensorView& x, const std::string& name, const WinPutOptions& options) {
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h, WinPut(x, name, options, false));
  return wait(h);
}

StatusOr<Handle> win_accumulate_nonblocking(const TensorView& x, const std::string& name,
                                            const WinPutOptions& options) {
  return WinPut(x, name, options, /*accumulate=*/true);
}

Status win_accumulate(const TensorView& x, const std::string& name, const WinPutOptions& options) {
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h, WinPut(x, name, options, true));
  return wait(h);
}

StatusOr<Handle> win_get_nonblocking(const std::string& name, const WinGetOptions& options) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("win_get", name));
  WEFT_ASSIGN_OR_RETURN(auto w, FindWindow(*state, "win_get", name));
  const std::string display = absl::StrCat("win_get '", name, "'");
  const int self = state->ctx.rank;
  WEFT_ASSIGN_OR_RETURN(auto srcs, WindowRanks(
                                       options.src_weights, w->in_neighbors(),
                                       [&](int r) { return w->HasSlot(self, r); }, display,
                                       "src_weights", "an in-neighbor of this rank"));
  std::vector<int> ranks;
  for (const auto& s : srcs) ranks.push_back(s.first);
  return SubmitWindowOp(
      *state, display,
      WithMutexes(w, ranks, options.require_mutex, [w, srcs] { return w->Get(srcs); }), w.get());
}

Status win_get(const std::string& name, const WinGetOptions& options) {
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h, win_get_nonblocking(name, options));
  return wait(h);
}

Status win_update(const std::string& name, const WinUpdateOptions& options) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("win_update", name));
  WEFT_ASSIGN_OR_RETURN(auto w, FindWindow(*state, "win_update", name));
  const std::string display = absl::StrCat("win_update '", name, "'");
  if (options.self_weight.has_value() != options.neighbor_weights.has_value()) {
    return InvalidArgument(display,
                           ": self_weight and neighbor_weights go together: pass "
                           "both or neither");
  }
  const int self = state->ctx.rank;
  double self_weight = 1.0 / static_cast<double>(w->in_neighbors().size() + 1);
  // Without weights: the topology's receive weights when it was set weighted (as for
  // neighbor_allreduce; windows keep the topology they were created under, which cannot
  // change while they live), else the uniform average.
  std::optional<std::map<int, double>> defaults;
  if (options.self_weight.has_value()) {
    self_weight = *options.self_weight;
    if (!std::isfinite(self_weight)) {
      return InvalidArgument(display, ": self_weight is ", self_weight);
    }
  } else if (auto [topo, weighted] = Topo(*state); weighted) {
    RecvWeights rw = GetRecvWeights(*topo, self);
    self_weight = rw.self_weight;
    defaults.emplace();
    for (int r : w->in_neighbors()) (*defaults)[r] = 0.0;
    for (const auto& [r, weight] : rw.neighbor_weights) (*defaults)[r] = weight;
  } else {
    defaults.emplace();
    for (int r : w->in_neighbors()) (*defaults)[r] = self_weight;
  }
  WEFT_ASSIGN_OR_RETURN(
      auto neighbors, WindowRanks(
                          options.self_weight.has_value() ? options.neighbor_weights : defaults, {},
                          [&](int r) { return w->HasSlot(self, r); }, display, "neighbor_weights",
                          "an in-neighbor of this rank"));
  const bool reset = options.reset;
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h, SubmitWindowOp(*state, display,
                                                 WithMutexes(w, {self}, options.require_mutex,
                                                             [w, self_weight, neighbors, reset] {
                                                               return w->Update(self_weight,
                                                                                neighbors, reset);
                                                             })));
  return wait(h);
}

Status win_update_then_collect(const std::string& name, bool require_mutex) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("win_update_then_collect", name));
  WEFT_ASSIGN_OR_RETURN(auto w, FindWindow(*state, "win_update_then_collect", name));
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h,
                        SubmitWindowOp(*state, absl::StrCat("win_update_then_collect '", name, "'"),
                                       WithMutexes(w, {state->ctx.rank}, require_mutex,
                                                   [w] { return w->UpdateThenCollect(); })));
  return wait(h);
}

StatusOr<std::map<int, int64_t>> win_version(const std::string& name) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("win_version", name));
  WEFT_ASSIGN_OR_RETURN(auto w, FindWindow(*state, "win_version", name));
  auto result = std::make_shared<std::map<int, int64_t>>();
  WEFT_RETURN_IF_ERROR(
      RunWindowOp(*state, absl::StrCat("win_version '", name, "'"), [w, result]() -> Status {
        WEFT_ASSIGN_OR_RETURN(*result, w->Versions());
        return OkStatus();
      }));
  return *result;
}

void set_win_associated_p_ops(bool on) { comm::Window::SetAssociatedPOps(on); }
bool win_associated_p_ops() { return comm::Window::AssociatedPOps(); }

StatusOr<double> win_associated_p(const std::string& name) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("win_associated_p", name));
  WEFT_ASSIGN_OR_RETURN(auto w, FindWindow(*state, "win_associated_p", name));
  auto result = std::make_shared<double>(0.0);
  WEFT_RETURN_IF_ERROR(
      RunWindowOp(*state, absl::StrCat("win_associated_p '", name, "'"), [w, result]() -> Status {
        WEFT_ASSIGN_OR_RETURN(*result, w->AssociatedP());
        return OkStatus();
      }));
  return *result;
}

namespace {
StatusOr<std::vector<int>> MutexRanks(const State& state, const char* op,
                                      const std::vector<int>& ranks) {
  if (ranks.empty()) return std::vector<int>{state.ctx.rank};
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    WEFT_RETURN_IF_ERROR(CheckRank(sorted[i], state.ctx.size, op, "rank"));
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      return InvalidArgument(op, ": rank ", sorted[i], " is listed twice");
    }
  }
  return sorted;
}
}  // namespace

Status win_mutex_acquire(const std::string& name, const std::vector<int>& ranks) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("win_mutex_acquire", name));
  WEFT_ASSIGN_OR_RETURN(auto w, FindWindow(*state, "win_mutex_acquire", name));
  WEFT_ASSIGN_OR_RETURN(auto sorted, MutexRanks(*state, "win_mutex_acquire", ranks));
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h,
                        SubmitWindowOp(*state, absl::StrCat("win_mutex_acquire '", name, "'"),
                                       [w, sorted]() -> std::optional<Status> {
                                         auto all = w->TryLockMutexes(sorted);
                                         if (!all.ok()) return all.status();
                                         if (!*all) return std::nullopt;
                                         return OkStatus();
                                       }));
  return wait(h);
}

Status win_mutex_release(const std::string& name, const std::vector<int>& ranks) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("win_mutex_release", name));
  WEFT_ASSIGN_OR_RETURN(auto w, FindWindow(*state, "win_mutex_release", name));
  WEFT_ASSIGN_OR_RETURN(auto sorted, MutexRanks(*state, "win_mutex_release", ranks));
  return RunWindowOp(*state, absl::StrCat("win_mutex_release '", name, "'"),
                     [w, sorted] { return w->UnlockMutexes(sorted); });
}

std::vector<std::string> win_names() {
  std::vector<std::string> names;
  auto state = Current();
  if (state == nullptr) return names;
  std::lock_guard<std::mutex> lock(state->win_mu);
  for (const auto& entry : state->windows) names.push_back(entry.first);
  return names;
}

}  // namespace weft
