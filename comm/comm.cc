// The C++ API's process model: init, shutdown and finalize, the process queries, the
// timeline and the process topology. The ops are in ops.cc, the windows in window_api.cc,
// what they share in front.h.
#include "comm/comm.h"

#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "comm/engine.h"
#include "comm/front.h"
#include "comm/mpi_util.h"
#include "comm/refuse.h"
#include "comm/spin.h"
#include "comm/window.h"
#ifdef WEFT_WITH_UCX
#include "comm/ucx_context.h"
#endif
#include "core/codec.h"
#include "core/config.h"
#include "core/logging.h"
#include "core/timeline.h"
namespace weft {

using comm::Begin;
using comm::Current;
using comm::g_mu;
using comm::g_state;
using comm::NewRequest;
using comm::NotInitialized;
using comm::OpType;
using comm::Request;
using comm::State;
using comm::Submit;
using comm::Topo;

namespace {

const config::StringSetting kTimelinePath(
    "WEFT_TIMELINE", "",
    "Write a Chrome trace of every op's phases here (one file per rank: NAME.rank<R>.json "
    "when several ranks run; '%r' in the path is replaced by the rank).");
const config::IntSetting kRanksPerMachine(
    "WEFT_RANKS_PER_MACHINE", 0,
    "Treat every N consecutive ranks as one machine (0: machines are found from shared "
    "memory). For testing hierarchical ops on one host.",
    /*min=*/0, /*max=*/std::numeric_limits<int64_t>::max(), config::Agreement::kSameOnEveryRank);

bool g_own_mpi = false;
bool g_atexit_registered = false;

// How many ranks share this host, and how many CPUs they may run on together: the union of
// their affinity masks (the online CPUs where a mask cannot be read). `local` holds this
// host's ranks unless WEFT_RANKS_PER_MACHINE made it a simulated machine. Collective.
std::pair<int, int> RanksAndCpusOnHost(MPI_Comm local, bool simulated) {
  MPI_Comm host = local;
  if (simulated) {
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host);
  }
  int ranks = 1;
  MPI_Comm_size(host, &ranks);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof cpus, &cpus) != 0) {  // over CPU_SETSIZE CPUs
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    for (long c = 0; c < online && c < CPU_SETSIZE; ++c) CPU_SET(c, &cpus);
  }
  MPI_Allreduce(MPI_IN_PLACE, &cpus, static_cast<int>(sizeof cpus), MPI_BYTE, MPI_BOR, host);
  if (simulated) MPI_Comm_free(&host);
  return {ranks, CPU_COUNT(&cpus)};
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
  int cross_size = 0;
  MPI_Comm_size(ctx.cross, &cross_size);
  ctx.cross_ranks.resize(cross_size);
  MPI_Allgather(&ctx.rank, 1, MPI_INT, ctx.cross_ranks.data(), 1, MPI_INT, ctx.cross);
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

  const auto [ranks_on_host, cpus_on_host] = RanksAndCpusOnHost(ctx.local, per_machine > 0);
  ctx.oversubscribed = ranks_on_host > cpus_on_host;
  bool mpi_yields = false;  // asked only where the answer decides
  const bool yield = comm::ChooseIdleWait(ranks_on_host, cpus_on_host, [&mpi_yields] {
    return mpi_yields = comm::MpiYieldsWhenIdle();
  });
  WEFT_LOG(Debug) << ranks_on_host << " rank(s) on this host, on " << cpus_on_host
                  << " CPU(s): waiting callers " << (yield ? "yield" : "pause")
                  << " between polls that call MPI" << (mpi_yields ? " (MPI's polls yield)" : "")
                  << ", " << (comm::IdleWaitYields(false) ? "yield" : "pause")
                  << " between those that do not";

  state->engine = std::make_shared<comm::Engine>(ctx, &state->timeline);
  auto transport = comm::DefaultTransport();
  if (!transport.ok()) return transport.status();
  if (*transport == comm::Transport::kUcx) {
#ifdef WEFT_WITH_UCX
    // Collective, so made here where every rank is (the first UCX window may involve some
    // ranks only).
    auto ucx = comm::UcxContext::Get(ctx.data);
    if (!ucx.ok()) return Annotate(ucx.status(), "init: UCX transport");
#else
    return Unimplemented(
        "init: WEFT_TRANSPORT is ucx, but this build has no UCX (UCX was "
        "not found when weft was built; WEFT_UCX_HOME)");
#endif
  }
  // Collective: the TCP and UCX transports connect the ranks here.
  auto peers = comm::MakePeerTransport(comm::ExchangeTransport(ctx.machine_size), ctx.data,
                                       &comm::Engine::stall_timeout_s);
  if (!peers.ok()) return Annotate(peers.status(), "init: WEFT_EXCHANGE_TRANSPORT");
  state->engine->peers = std::move(*peers);
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

void group_start() { ++comm::t_group_depth; }

Status group_end() {
  if (comm::t_group_depth == 0) {
    return FailedPrecondition(
        "group_end: no group is open on this thread (group_start and group_end must pair, on "
        "one thread)");
  }
  if (--comm::t_group_depth == 0) {
    if (auto state = Current()) state->engine->Wake();
  }
  return OkStatus();
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

bool nccl_built() { return comm::NcclBuilt(); }

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

}  // namespace weft
