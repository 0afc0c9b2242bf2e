// The public C++ API: process model, topology state, argument checks, and the ops, each a
// validated request handed to the engine.
#include "comm/comm.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdlib>
#include <cstring>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "comm/engine.h"
#include "comm/refuse.h"
#ifdef WEFT_WITH_NCCL
#include "comm/nccl/nccl_ops.h"
#endif
#include "comm/window.h"
#ifdef WEFT_WITH_UCX
#include "comm/ucx_context.h"
#endif
#include "core/codec.h"
#include "core/config.h"
#include "core/logging.h"
#include "core/timeline.h"

namespace weft {
namespace {

using comm::Descriptor;
using comm::OpType;
using comm::Request;

const config::StringSetting kTimelinePath(
    "WEFT_TIMELINE", "",
    "Write a Chrome trace of every op's phases here (one file per rank: NAME.rank<R>.json "
    "when several ranks run; '%r' in the path is replaced by the rank).");
const config::IntSetting kRanksPerMachine(
    "WEFT_RANKS_PER_MACHINE", 0,
    "Treat every N consecutive ranks as one machine (0: machines are found from shared "
    "memory). For testing hierarchical ops on one host.",
    /*min=*/0, /*max=*/std::numeric_limits<int64_t>::max(), config::Agreement::kSameOnEveryRank);

struct State {
  comm::Context ctx;
  Timeline timeline;
  std::shared_ptr<comm::Engine> engine;  // requests hold weak references
  std::mutex topo_mu;
  std::shared_ptr<const Topology> topology;
  bool weighted = false;
  std::shared_ptr<const Topology> machine_topology;
  bool machine_weighted = false;
  std::mutex win_mu;
  std::map<std::string, std::shared_ptr<comm::Window>> windows;  // win_mu
};

std::mutex g_mu;
std::shared_ptr<State> g_state;  // set between init() and shutdown()
bool g_own_mpi = false;
bool g_atexit_registered = false;

std::shared_ptr<State> Current() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_state;
}

Status NotInitialized(const char* what) {
  return FailedPrecondition(what, ": weft is not initialized; call init() first");
}

void AtExit() {
  Status s = finalize();
  if (!s.ok()) WEFT_LOG(Warning) << "shutdown at exit: " << s;
}

std::string TimelineFile(const std::string& path, int rank, int size) {
  std::string out = path;
  const size_t at = out.find("%r");
  if (at != std::string::npos) return out.replace(at, 2, std::to_string(rank));
  if (size == 1) return out;
  const size_t dot = out.rfind('.');
  const size_t slash = out.rfind('/');
  const std::string suffix = absl::StrCat(".rank", rank);
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return out + suffix;
  return out.insert(dot, suffix);
}

Status CheckTensor(const TensorView& t, const char* op, const char* which) {
  if (!t.defined()) return InvalidArgument(op, ": the ", which, " tensor has no data");
  if (t.device().type != Device::Type::kCPU) {
#ifdef WEFT_WITH_NCCL
    // The same code as a build without NCCL: CUDA ops cannot run in this process.
    const std::string why = comm::nccl::DeviceUnavailable(t.device().index);
    if (!why.empty()) {
      return Unimplemented(op, ": the ", which, " tensor is on ", t.device().ToString(),
                           " but no such CUDA device is usable here: ", why);
    }
#else
    return Unimplemented(op, ": the ", which, " tensor is on ", t.device().ToString(),
                         "; CUDA tensors need weft's NCCL backend, which this build does not "
                         "include (move the tensor to the CPU)");
#endif
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
    return InvalidArgument(op, ": the output must be on the input's device: input ",
                           in.ToString(), ", output ", out.ToString());
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
                    const char* what, const char* unit, bool self_allowed = false) {
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

void AppendBits(std::string* out, double v) {
  char bytes[sizeof(double)];
  std::memcpy(bytes, &v, sizeof(v));
  out->append(bytes, sizeof(bytes));
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
    for (int j : topo.out_neighbors(self)) r->send.emplace_back(j, 1.0);
    const std::vector<int>& in = topo.in_neighbors(self);
    if (src_weights.has_value()) {
      for (const auto& [j, w] : *src_weights) {
        if (!std::binary_search(in.begin(), in.end(), j)) {
          return InvalidArgument(op, ": ", src_name, " names ", unit, " ", j,
                                 ", which is not an in-neighbor of ", unit, " ", self,
                                 " in the topology (in-neighbors: ",
                                 in.empty() ? "none" : absl::StrJoin(in, ", "),
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
    return InvalidArgument(op, ": names starting with '#' are reserved for unnamed ops: '",
                           name, "'");
  }
  return state;
}

// What matches a window's creation across ranks (its refusals included).
std::string WinCreateKey(const std::string& name) { return "win_create:" + name; }

std::shared_ptr<Request> NewRequest(const State& state, OpType op, const TensorView& in,
                                    const TensorView& out, const std::string& name) {
  auto r = std::make_shared<Request>();
  r->in = in;
  r->out = out;
  r->desc.rank = state.ctx.rank;
  r->desc.op = op;
  r->desc.key = name;
  r->desc.dtype = in.dtype();
  r->desc.device = in.device();
  r->desc.shape = in.shape();
  r->desc.machine = state.ctx.machine_rank;
  r->desc.local_rank = state.ctx.local_rank;
  return r;
}

// Set while a blocking form submits its op: it waits at once, so it drives the engine itself.
thread_local bool t_caller_waits = false;
struct CallerWaits {
  CallerWaits() { t_caller_waits = true; }
  ~CallerWaits() { t_caller_waits = false; }
};

StatusOr<Handle> Submit(State& state, std::shared_ptr<Request> r) {
  return state.engine->Submit(std::move(r), t_caller_waits);
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

}  // namespace

TensorView Handle::output() const { return request_ ? request_->out : TensorView(); }

void Handle::keep_alive(std::shared_ptr<const void> owner) const {
  if (!request_) return;
  std::lock_guard<std::mutex> lock(request_->mu);
  request_->owners.push_back(std::move(owner));
}

namespace {

// Settings that choose how ops run (declared Agreement::kSameOnEveryRank) must be the same
// on every rank: a rank on UCX windows among ranks on MPI ones, or one staging an op
// through MPI while the others run it on NCCL, would wait for the others forever.
// Collective over MPI_COMM_WORLD: every rank gets the same answer. Every rank links the
// same settings, so the lists line up.
Status CheckSettingsAgree() {
  const std::vector<const config::Setting*> same = config::Registry::Global().SameOnEveryRank();
  const int count = static_cast<int>(same.size());
  // Per setting, the least and the greatest hash of its value over the ranks.
  std::vector<std::string> texts(count);
  std::vector<uint64_t> least(count), most(count);
  for (int i = 0; i < count; ++i) {
    texts[i] = same[i]->text();
    // Stable across processes and builds (std::hash need not be).
    least[i] = most[i] = codec::Fingerprint().Str(texts[i]).value();
  }
  MPI_Allreduce(MPI_IN_PLACE, least.data(), count, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, most.data(), count, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  std::vector<std::string> differing;
  for (int i = 0; i < count; ++i) {
    if (least[i] != most[i]) {
      differing.push_back(absl::StrCat(same[i]->name(), " (here '", texts[i], "')"));
    }
  }
  if (differing.empty()) return OkStatus();
  return InvalidArgument(
      "init: these settings differ across ranks: ", absl::StrJoin(differing, ", "),
      "; every rank must see the same value (weftrun forwards every WEFT_* "
      "variable to every rank)");
}

}  // namespace

Status init() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_state != nullptr) {
    return FailedPrecondition("init: weft is already initialized; call shutdown() first");
  }
  Status config_status = config::Registry::Global().Reload();
  if (!config_status.ok()) return Annotate(config_status, "init: invalid configuration");
  log::Refresh();

  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) return FailedPrecondition("init: MPI was already finalized in this process");
  if (!initialized) {
    // Open MPI 4.1 prefers osc/rdma for windows, which over the vader BTL crashes under
    // contention (segfaults in mca_btl_vader_emu_acswap and poll_handle_frag, seen with
    // concurrent locks and compare-and-swap on one window). osc/ucx is only considered
    // when listed, so list it first and rank rdma last: Open MPI then uses UCX for windows
    // (rdma only if it was built without UCX). A user's own settings win; a program that
    // initializes MPI itself decides alone (comm/README.md).
    setenv("OMPI_MCA_osc", "ucx,sm,rdma", /*overwrite=*/0);
    setenv("OMPI_MCA_osc_rdma_priority", "1", /*overwrite=*/0);
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
      return Internal("init: MPI_Init_thread failed");
    }
    g_own_mpi = true;
  }
  if (!g_atexit_registered) {
    std::atexit(AtExit);
    g_atexit_registered = true;
  }
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    return FailedPrecondition(
        "init: MPI runs at thread level ", provided,
        ", but weft's engine thread needs MPI_THREAD_MULTIPLE: initialize MPI with "
        "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or let weft initialize it");
  }

  auto state = std::make_shared<State>();
  comm::Context& ctx = state->ctx;
  MPI_Comm_rank(MPI_COMM_WORLD, &ctx.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ctx.size);
  MPI_Comm_dup(MPI_COMM_WORLD, &ctx.control);
  MPI_Comm_dup(MPI_COMM_WORLD, &ctx.data);
  if (Status agree = CheckSettingsAgree(); !agree.ok()) {
    MPI_Comm_free(&ctx.control);
    MPI_Comm_free(&ctx.data);
    return agree;
  }
  const int64_t per_machine = kRanksPerMachine.Get();
  // Bluefog's BLUEFOG_NODES_PER_MACHINE leaves the last machine short when the ranks do not
  // fill it (its tests set 2 and run on 1 or 3 ranks); weft's own setting must divide.
  const bool from_bluefog = config::Registry::Global().FromAlias(kRanksPerMachine.name());
  if (per_machine > 0 && ctx.size % per_machine != 0 && from_bluefog) {
    if (ctx.rank == 0) {
      WEFT_LOG(Warning) << "BLUEFOG_NODES_PER_MACHINE=" << per_machine << " does not divide the "
                        << ctx.size << " ranks: the last machine gets "
                        << ctx.size % per_machine << " (WEFT_RANKS_PER_MACHINE would refuse it)";
    }
  } else if (per_machine > 0 && ctx.size % per_machine != 0) {
    MPI_Comm_free(&ctx.control);
    MPI_Comm_free(&ctx.data);
    return InvalidArgument("init: WEFT_RANKS_PER_MACHINE=", per_machine, " does not divide the ",
                           ctx.size, " ranks into machines of equal size");
  }
  if (per_machine > 0) {
    MPI_Comm_split(MPI_COMM_WORLD, static_cast<int>(ctx.rank / per_machine), ctx.rank,
                   &ctx.local);
  } else {
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, ctx.rank, MPI_INFO_NULL,
                        &ctx.local);
  }
  MPI_Comm_rank(ctx.local, &ctx.local_rank);
  MPI_Comm_size(ctx.local, &ctx.local_size);
  MPI_Comm_split(MPI_COMM_WORLD, ctx.local_rank, ctx.rank, &ctx.cross);
  int machine[2] = {0, 0};
  if (ctx.local_rank == 0) {
    MPI_Comm_rank(ctx.cross, &machine[0]);
    MPI_Comm_size(ctx.cross, &machine[1]);
  }
  MPI_Bcast(machine, 2, MPI_INT, 0, ctx.local);
  ctx.machine_rank = machine[0];
  ctx.machine_size = machine[1];
  // Every rank fails init() when one cannot write its timeline file (a directory missing on
  // one host): a job that runs on without the timeline it asked for, or with some ranks
  // gone, is worse than one that stops at once and says why. The setting may differ across
  // ranks (only some write a timeline), so every rank takes part, in the allreduce below.
  const std::string timeline = kTimelinePath.Get();
  Status timeline_status = timeline.empty()
                               ? OkStatus()
                               : state->timeline.Open(TimelineFile(timeline, ctx.rank, ctx.size),
                                                      ctx.rank, absl::StrCat("rank ", ctx.rank));
  // Homogeneous: the same local_size everywhere (min == max) and rank = machine * local_size
  // + local_rank on every rank. The last entry: the lowest rank whose timeline failed.
  int shape[4] = {ctx.local_size, -ctx.local_size,
                  ctx.rank == ctx.machine_rank * ctx.local_size + ctx.local_rank ? 1 : 0,
                  timeline_status.ok() ? ctx.size : ctx.rank};
  MPI_Allreduce(MPI_IN_PLACE, shape, 4, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  ctx.homogeneous = shape[0] == -shape[1] && shape[2] == 1;
  if (const int first_failed = shape[3]; first_failed < ctx.size) {
    state->timeline.Close();
    for (MPI_Comm* c : {&ctx.control, &ctx.data, &ctx.local, &ctx.cross}) MPI_Comm_free(c);
    if (!timeline_status.ok()) return Annotate(timeline_status, "init: WEFT_TIMELINE");
    return InvalidArgument("init: WEFT_TIMELINE: rank ", first_failed,
                           " cannot write its timeline file (see its error); fix the "
                           "path or unset the variable");
  }

  log::SetPrefix(absl::StrCat("weft ", ctx.rank, "/", ctx.size));
  WEFT_LOG(Debug) << "settings in force:\n" << config::Registry::Global().Describe();
  for (const std::string& name : config::Registry::Global().UnknownEnvironment()) {
    WEFT_LOG(Warning) << name << " is set but is not a weft setting (a typo?)";
  }
  for (const std::string& name : config::Registry::IgnoredBluefogEnvironment()) {
    WEFT_LOG(Info) << name << " is set but weft has no counterpart for it; ignored";
  }

  auto topo = ExponentialGraph(ctx.size);
  auto machine_topo = ExponentialGraph(ctx.machine_size);
  state->topology = std::make_shared<const Topology>(std::move(*topo));
  state->machine_topology = std::make_shared<const Topology>(std::move(*machine_topo));

  state->engine = std::make_shared<comm::Engine>(ctx, &state->timeline);
  auto transport = comm::DefaultTransport();
  if (!transport.ok()) return transport.status();
  const bool ucx_exchange = comm::ExchangeTransport() == comm::Transport::kUcx;
  if (*transport == comm::Transport::kUcx || ucx_exchange) {
#ifdef WEFT_WITH_UCX
    // Collective, so made here where every rank is (a pair gossip's first exchange involves
    // two ranks only).
    auto ucx = comm::UcxContext::Get(ctx.data);
    if (!ucx.ok()) return Annotate(ucx.status(), "init: UCX transport");
    state->engine->ucx_exchange = ucx_exchange;
#else
    return Unimplemented("init: WEFT_TRANSPORT or WEFT_EXCHANGE_TRANSPORT is ucx, but this "
                         "build has no UCX (UCX was not found when weft was built; "
                         "WEFT_UCX_HOME)");
#endif
  }
  State* raw = state.get();
  state->engine->on_set_topology = [raw](const Request& r) {
    std::lock_guard<std::mutex> lock(raw->topo_mu);
    raw->topology = r.new_topology;
    raw->weighted = r.new_topology_weighted;
  };
  state->engine->Start();
  g_state = std::move(state);
  return OkStatus();
}

Status shutdown() {
  auto state = Current();
  if (state == nullptr) return NotInitialized("shutdown");
  auto r = std::make_shared<Request>();
  r->desc.rank = state->ctx.rank;
  r->desc.op = OpType::kShutdown;
  r->desc.key = "#shutdown";
  Status status;
  auto handle = state->engine->Submit(r, /*caller_waits=*/true);
  if (!handle.ok()) return handle.status();  // another thread is shutting down
  status = wait(*handle);
  state->engine->Join();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_state.reset();
  }
  // Windows still alive: every rank is here (shutdown is collective) and frees them in the
  // same (name) order.
  for (auto& [name, window] : state->windows) {
    Status s = window->Free();
    if (!s.ok()) WEFT_LOG(Warning) << "shutdown: freeing window '" << name << "': " << s;
  }
  state->windows.clear();
  comm::Context& ctx = state->ctx;
  for (MPI_Comm* c : {&ctx.control, &ctx.data, &ctx.local, &ctx.cross}) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
  state->timeline.Close();
  log::SetPrefix("weft");
  return status;
}

bool is_initialized() { return Current() != nullptr; }

void claim_call_order() {
  if (auto state = Current()) state->engine->ClaimCallOrder();
}

Status finalize() {
  Status status;
  if (Current() != nullptr) status = shutdown();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    // A rank never shut down (it died, or stalls): MPI_Finalize would wait for it forever.
    WEFT_LOG(Error) << "finalize: not finalizing MPI, since not every rank shut down ("
                    << status.message() << "); the process exits without it";
    return status;
  }
  if (g_own_mpi && !finalized) MPI_Finalize();
  return status;
}

void abort_job(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (auto state = Current()) state->timeline.Close();  // a complete trace file
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort returned (it should not), or there is no MPI job
}

Status timeline_start(const std::string& path) {
  auto state = Current();
  if (state == nullptr) return NotInitialized("timeline_start");
  if (path.empty()) return InvalidArgument("timeline_start: the path is empty");
  return state->timeline.Open(TimelineFile(path, state->ctx.rank, state->ctx.size),
                              state->ctx.rank, absl::StrCat("rank ", state->ctx.rank));
}

Status timeline_stop() {
  auto state = Current();
  if (state == nullptr) return NotInitialized("timeline_stop");
  state->timeline.Close();
  return OkStatus();
}

Status timeline_start_activity(const std::string& tensor_name, const std::string& activity) {
  auto state = Current();
  if (state == nullptr) return NotInitialized("timeline_start_activity");
  if (tensor_name.empty() || activity.empty()) {
    return InvalidArgument("timeline_start_activity: the tensor name and activity must be "
                           "non-empty");
  }
  return Annotate(state->timeline.BeginActivity(tensor_name, activity),
                  "timeline_start_activity");
}

Status timeline_end_activity(const std::string& tensor_name) {
  auto state = Current();
  if (state == nullptr) return NotInitialized("timeline_end_activity");
  return Annotate(state->timeline.EndActivity(tensor_name), "timeline_end_activity");
}

#define WEFT_QUERY(fn, field)            \
  int fn() {                             \
    auto s = Current();                  \
    return s ? s->ctx.field : -1;        \
  }
WEFT_QUERY(rank, rank)
WEFT_QUERY(size, size)
WEFT_QUERY(local_rank, local_rank)
WEFT_QUERY(local_size, local_size)
WEFT_QUERY(machine_rank, machine_rank)
WEFT_QUERY(machine_size, machine_size)
#undef WEFT_QUERY

int is_homogeneous() {
  auto s = Current();
  return s ? (s->ctx.homogeneous ? 1 : 0) : -1;
}

StatusOr<bool> unified_mpi_window_model() {
  if (Current() == nullptr) return NotInitialized("unified_mpi_window_model");
  void* base = nullptr;
  MPI_Win win = MPI_WIN_NULL;
  if (MPI_Win_allocate(8, 1, MPI_INFO_NULL, MPI_COMM_SELF, &base, &win) != MPI_SUCCESS) {
    return Internal("unified_mpi_window_model: MPI_Win_allocate failed");
  }
  int* model = nullptr;
  int found = 0;
  MPI_Win_get_attr(win, MPI_WIN_MODEL, &model, &found);
  const bool unified = found && model != nullptr && *model == MPI_WIN_UNIFIED;
  MPI_Win_free(&win);
  return unified;
}

bool nccl_built() {
#ifdef WEFT_WITH_NCCL
  return true;
#else
  return false;
#endif
}

bool timeline_active() {
  auto s = Current();
  return s != nullptr && s->timeline.enabled();
}

Status set_topology(const Topology& topo, bool is_weighted) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("set_topology", ""));
  auto r = NewRequest(*state, OpType::kSetTopology, TensorView(), TensorView(), "");
  if (topo.size() != state->ctx.size) {
    return state->engine->Refuse(r, InvalidArgument("set_topology: the topology has ",
                                                    topo.size(), " ranks but weft runs ",
                                                    state->ctx.size));
  }
  {
    // Windows are collective, so every rank refuses alike.
    std::lock_guard<std::mutex> lock(state->win_mu);
    if (!state->windows.empty()) {
      std::vector<std::string> names;
      for (const auto& entry : state->windows) names.push_back(entry.first);
      return state->engine->Refuse(
          r, FailedPrecondition("set_topology: windows exist (", absl::StrJoin(names, ", "),
                                "); their buffers follow the topology they were created "
                                "with: win_free them first"));
    }
  }
  r->new_topology = std::make_shared<const Topology>(topo);
  r->new_topology_weighted = is_weighted;
  r->desc.fingerprint = topo.AdjacencyFingerprint();
  WEFT_ASSIGN_OR_RETURN(Handle h, state->engine->Submit(r, /*caller_waits=*/true));
  return wait(h);
}

Topology load_topology() {
  auto s = Current();
  return s ? *Topo(*s).first : Topology();
}

bool is_topo_weighted() {
  auto s = Current();
  return s ? Topo(*s).second : false;
}

std::vector<int> in_neighbor_ranks() {
  auto s = Current();
  return s ? Topo(*s).first->in_neighbors(s->ctx.rank) : std::vector<int>();
}

std::vector<int> out_neighbor_ranks() {
  auto s = Current();
  return s ? Topo(*s).first->out_neighbors(s->ctx.rank) : std::vector<int>();
}

Status set_machine_topology(const Topology& topo, bool is_weighted) {
  auto state = Current();
  if (state == nullptr) return NotInitialized("set_machine_topology");
  if (topo.size() != state->ctx.machine_size) {
    return InvalidArgument("set_machine_topology: the topology has ", topo.size(),
                           " machines but weft runs on ", state->ctx.machine_size);
  }
  std::lock_guard<std::mutex> lock(state->topo_mu);
  state->machine_topology = std::make_shared<const Topology>(topo);
  state->machine_weighted = is_weighted;
  return OkStatus();
}

Topology load_machine_topology() {
  auto s = Current();
  if (!s) return Topology();
  std::lock_guard<std::mutex> lock(s->topo_mu);
  return *s->machine_topology;
}

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
                           comm::RankList(ranks), "); only the ranks of a process set call "
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
  r->desc.fusion_signature = average ? "avg" : "sum";
  r->desc.group = std::move(set);
  Status checks = CheckTensor(in, "allreduce", "input");
  if (checks.ok()) checks = CheckSameLayout(in, out, "allreduce");
  return SubmitOrRefuse(*state, r, std::move(checks));
}

StatusOr<Handle> broadcast_nonblocking(const TensorView& in, const TensorView& out,
                                       int root_rank, const std::string& name,
                                       const std::vector<int>& ranks) {
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
  return SubmitOrRefuse(*state, r, std::move(checks));
}

namespace {

StatusOr<std::shared_ptr<Request>> PointToPoint(State& state, const char* op, int peer,
                                                const TensorView& in, const TensorView& out,
                                                const std::string& name) {
  WEFT_RETURN_IF_ERROR(CheckRank(peer, state.ctx.size, op, op[0] == 's' ? "dst" : "src"));
  if (peer == state.ctx.rank) {
    return InvalidArgument(op, ": rank ", peer, " cannot ", op, " ",
                           op[0] == 's' ? "to" : "from", " itself");
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
  return SubmitOrRefuse(*state, r, CheckTensor(in, "send", "input"));
}

StatusOr<Handle> recv_nonblocking(const TensorView& out, int src, const std::string& name) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("recv", name));
  WEFT_ASSIGN_OR_RETURN(auto r, PointToPoint(*state, "recv", src, out, out, name));
  r->recv = {{src, 1.0}};
  r->desc.recv_ranks = {src};
  return SubmitOrRefuse(*state, r, CheckTensor(out, "recv", "output"));
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
  return SubmitOrRefuse(*state, r,
                        has_alloc ? OkStatus()
                                  : InvalidArgument("recv: no output allocator given"));
}

StatusOr<Handle> allgather_nonblocking(const TensorView& in, Allocator alloc,
                                       const std::string& name) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("allgather", name));
  Status checks = CheckTensor(in, "allgather", "input");
  if (checks.ok() && in.ndim() == 0) {
    checks = InvalidArgument("allgather: the input must have at least one dimension (it is "
                             "concatenated along dim 0); got a scalar");
  }
  if (checks.ok() && !alloc) checks = InvalidArgument("allgather: no output allocator given");
  auto r = NewRequest(*state, OpType::kAllgather, in, TensorView(), name);
  r->alloc = std::move(alloc);
  return SubmitOrRefuse(*state, r, std::move(checks));
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
  return Submit(*state, r);
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
    checks = ResolveNeighborWeights(r.get(), *topo, weighted, state->ctx.rank,
                                    options.self_weight, options.src_weights,
                                    options.dst_weights, op, "rank", "src_weights",
                                    "dst_weights");
  }
  r->desc.fusion_signature = PatternSignature("nar", r->self_weight, r->send, r->recv);
  return SubmitOrRefuse(*state, r, std::move(checks));
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
  return SubmitOrRefuse(*state, r, std::move(checks));
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
  return Submit(*state, r);
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
    auto p2p = PointToPoint(**state, sending ? "send" : "recv",
                            sending ? id.send_to : id.recv_from, TensorView(), TensorView(),
                            id.name);
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
  return Submit(*state, r);
}

// --- windows ---------------------------------------------------------------------------

namespace {

StatusOr<std::shared_ptr<comm::Window>> FindWindow(State& state, const char* op,
                                                   const std::string& name) {
  if (name.empty()) return InvalidArgument(op, ": the window name is empty");
  std::lock_guard<std::mutex> lock(state.win_mu);
  auto it = state.windows.find(name);
  if (it == state.windows.end()) {
    return absl::NotFoundError(absl::StrCat(op, ": there is no window named '", name,
                                            "' on rank ", state.ctx.rank,
                                            " (win_create it first)"));
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
    if (!std::isfinite(w)) return InvalidArgument(op, ": ", what, " gives rank ", r, " the weight ", w);
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

StatusOr<Handle> WinPut(const TensorView& x, const std::string& name,
                        const WinPutOptions& options, bool accumulate) {
  const char* op = accumulate ? "win_accumulate" : "win_put";
  WEFT_ASSIGN_OR_RETURN(auto state, Begin(op, name));
  WEFT_ASSIGN_OR_RETURN(auto w, FindWindow(*state, op, name));
  WEFT_RETURN_IF_ERROR(CheckWindowTensor(*w, x, op));
  const std::string display = absl::StrCat(op, " '", name, "'");
  if (!std::isfinite(options.self_weight)) {
    return InvalidArgument(display, ": self_weight is ", options.self_weight);
  }
  const int self = state->ctx.rank;
  WEFT_ASSIGN_OR_RETURN(
      auto dsts, WindowRanks(options.dst_weights, w->out_neighbors(),
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
  WEFT_ASSIGN_OR_RETURN(Handle h, SubmitWindowOp(state, std::move(display),
                                                 [body]() -> std::optional<Status> {
                                                   return body();
                                                 }));
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
    std::function<Status(void*, const void*, size_t, bool)> copy;
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
        return FailedPrecondition("win_create '", name, "': another rank could not copy its "
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

Status win_accumulate(const TensorView& x, const std::string& name,
                      const WinPutOptions& options) {
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(Handle h, WinPut(x, name, options, true));
  return wait(h);
}

StatusOr<Handle> win_get_nonblocking(const std::string& name, const WinGetOptions& options) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("win_get", name));
  WEFT_ASSIGN_OR_RETURN(auto w, FindWindow(*state, "win_get", name));
  const std::string display = absl::StrCat("win_get '", name, "'");
  const int self = state->ctx.rank;
  WEFT_ASSIGN_OR_RETURN(
      auto srcs, WindowRanks(options.src_weights, w->in_neighbors(),
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
    return InvalidArgument(display, ": self_weight and neighbor_weights go together: pass "
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
      auto neighbors,
      WindowRanks(options.self_weight.has_value() ? options.neighbor_weights : defaults, {},
                  [&](int r) { return w->HasSlot(self, r); }, display, "neighbor_weights",
                  "an in-neighbor of this rank"));
  const bool reset = options.reset;
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(
      Handle h, SubmitWindowOp(*state, display,
                               WithMutexes(w, {self}, options.require_mutex,
                                           [w, self_weight, neighbors, reset] {
                                             return w->Update(self_weight, neighbors, reset);
                                           })));
  return wait(h);
}

Status win_update_then_collect(const std::string& name, bool require_mutex) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("win_update_then_collect", name));
  WEFT_ASSIGN_OR_RETURN(auto w, FindWindow(*state, "win_update_then_collect", name));
  CallerWaits blocking;
  WEFT_ASSIGN_OR_RETURN(
      Handle h, SubmitWindowOp(*state, absl::StrCat("win_update_then_collect '", name, "'"),
                               WithMutexes(w, {state->ctx.rank}, require_mutex,
                                           [w] { return w->UpdateThenCollect(); })));
  return wait(h);
}

StatusOr<std::map<int, int64_t>> win_version(const std::string& name) {
  WEFT_ASSIGN_OR_RETURN(auto state, Begin("win_version", name));
  WEFT_ASSIGN_OR_RETURN(auto w, FindWindow(*state, "win_version", name));
  auto result = std::make_shared<std::map<int, int64_t>>();
  WEFT_RETURN_IF_ERROR(RunWindowOp(*state, absl::StrCat("win_version '", name, "'"),
                                   [w, result]() -> Status {
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
  WEFT_RETURN_IF_ERROR(RunWindowOp(*state, absl::StrCat("win_associated_p '", name, "'"),
                                   [w, result]() -> Status {
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
  WEFT_ASSIGN_OR_RETURN(
      Handle h, SubmitWindowOp(*state, absl::StrCat("win_mutex_acquire '", name, "'"),
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
  if (auto engine = r.engine.lock()) WEFT_RETURN_IF_ERROR(engine->DriveUntilDone(r));
  std::unique_lock<std::mutex> lock(r.mu);
  r.cv.wait(lock, [&] { return r.done; });
  return r.status;
}

// Blocking forms: the nonblocking call plus a wait.
Status allreduce(const TensorView& in, const TensorView& out, bool average,
                 const std::string& name, const std::vector<int>& ranks) {
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
