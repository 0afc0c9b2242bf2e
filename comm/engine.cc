#include "comm/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "comm/data_plane.h"
#include "comm/spin.h"
#include "comm/window.h"
#include "core/config.h"
#include "core/logging.h"

namespace weft {
namespace comm {
namespace {

const config::IntSetting kFusionThreshold(
    "WEFT_FUSION_THRESHOLD_BYTES", 64 << 20,
    "Largest buffer that consecutive small ops of one kind are fused into (0: no fusion).",
    /*min=*/0, /*max=*/int64_t{1} << 40);
const config::DoubleSetting kStallWarning(
    "WEFT_STALL_WARNING_SECONDS", 60,
    "Warn (on rank 0) when some ranks have waited this long for others to submit an op.",
    /*min=*/0, /*max=*/1e6);
const config::DoubleSetting kStallTimeout(
    "WEFT_STALL_TIMEOUT_SECONDS", 0,
    "Fail an op that some ranks have waited this long for; also, plus a margin, the longest "
    "an op may spend in its transfers (MPI or weft's TCP transport) before the watchdog "
    "aborts the job (0: wait forever).",
    /*min=*/0, /*max=*/1e6);
const config::IntSetting kSpinMicros(
    "WEFT_ENGINE_SPIN_MICROS", 1000,
    "How long the engine thread, or a thread waiting for its op, polls without sleeping "
    "after activity (latency vs CPU).",
    /*min=*/0, /*max=*/10000000);
const config::IntSetting kMaxSleepMicros("WEFT_ENGINE_MAX_SLEEP_MICROS", 1000,
                                         "Longest sleep between polls while ops are outstanding.",
                                         /*min=*/0, /*max=*/1000000);

const config::BoolSetting kDirectAgreement(
    "WEFT_DIRECT_AGREEMENT", true,
    "When every rank is on one machine: an allreduce, broadcast, allgather or "
    "neighbor_allreduce, named or unnamed, blocking or started alone, that every rank calls "
    "alike while nothing else is in flight runs without waiting for the coordinator's answer "
    "(0: every op waits for it).");

// How long a blocking op waits for the other ranks to count in before it goes to the
// coordinator after all, whose stall warnings and timeouts then watch it.
constexpr int64_t kDirectWaitMicros = 100000;

const config::IntSetting kWaitSpinMaxMicros(
    "WEFT_ENGINE_WAIT_SPIN_MAX_MICROS", 5000,
    "A thread waiting for its op polls up to twice as long as the last op took to run, at "
    "most this long (0: only WEFT_ENGINE_SPIN_MICROS).",
    /*min=*/0, /*max=*/10000000);

// How long the engine thread sleeps when it finds a caller driving; the caller wakes it
// sooner when it stops with work left.
constexpr int64_t kDrivenSleepMicros = 50000;

// Where the machine's ranks outnumber its CPUs, nonblocking submissions (and the end of a
// group) do not wake the engine thread: woken, it took a CPU from a rank, which cost a
// burst of 64 nonblocking 4 KiB allreduces on 4 ranks sharing 2 CPUs 20-35% of its time
// (bench/README.md); a caller that waits runs the engine itself anyway. The idle thread
// instead looks this often, so an op nobody waits on yet still starts within this long.
constexpr int64_t kSharedCpuIdleMicros = 1000;

int64_t NowMicros() { return Timeline::NowMicros(); }

// The two bits of a rank's own fact in the direct agreement (rows and in place, for ops
// other than dynamic neighbor allreduces) that carry rank 0's way for an op whose way it
// picks by timing (HostPlane::Preference); the rows stay under 2^40.
constexpr int kTunedWayShift = 61;
constexpr int64_t kTunedWayMask = 3;

// Set while this thread runs Progress(): code it calls (an Allocator) must not wait.
thread_local bool t_making_progress = false;

// What tells ops apart under one number of the direct agreement: an unnamed op's number, or
// (top bit set) a hash of the name, FNV-1a 64 with a final mix, the same in every process
// (std::hash and absl::Hash need not be). Two names whose hashes collide would be taken for
// one op only if some ranks called one and the rest the other at the same place, with the
// same op, dtype, shape and options besides: 2^-63 for any such pair.
uint64_t OpIdentity(const Descriptor& d) {
  if (d.number >= 0) return static_cast<uint64_t>(d.number);
  uint64_t h = 0xcbf29ce484222325u;
  for (unsigned char c : d.key) h = (h ^ c) * 0x100000001b3u;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdu;
  h ^= h >> 33;
  return h | (uint64_t{1} << 63);
}

}  // namespace

double Engine::stall_timeout_s() { return kStallTimeout.Get(); }

void Request::Complete(Status s) {
  std::lock_guard<std::mutex> lock(mu);
  status = std::move(s);
  done.store(true, std::memory_order_release);
  cv.notify_all();
}

Engine::Engine(const Context& ctx, Timeline* timeline)
    : ctx_(ctx),
      timeline_(timeline),
      order_thread_(std::this_thread::get_id()),
      control_(ControlChannel::Open(ctx)) {
  if (ctx_.rank == 0) coordinator_ = std::make_unique<Coordinator>(ctx_.size);
}

Engine::~Engine() {
  if (thread_.joinable()) thread_.join();
  StopWatchdog();
}

void Engine::Start() {
  host_ = MakeHostPlane(ctx_, timeline_, peers.get(), [this](int64_t since) {
    const bool windows_open = windows.load() > 0;
    if (windows_open) ProgressWindowTransports();
    IdleWait(since, /*polled_mpi=*/windows_open);
  });
  device_ = MakeDevicePlane(
      ctx_, timeline_, host_.get(),
      [this](const std::shared_ptr<Request>& r, Status s) { Finish(r, std::move(s)); });
  thread_ = std::thread([this] { Loop(); });
  watchdog_ = std::thread([this] { Watchdog(); });
}

void Engine::Join() {
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(progress_mu_);  // a driving caller has left
  StopWatchdog();
}

void Engine::StopWatchdog() {
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    watch_stop_ = true;
  }
  watch_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

Engine::Running::Running(Engine* engine, const Request& r, size_t fused_with)
    // Without a timeout there is no watchdog to tell: nothing on the op's path.
    : engine_(kStallTimeout.Get() > 0 ? engine : nullptr) {
  if (engine_ == nullptr) return;
  std::lock_guard<std::mutex> lock(engine_->watch_mu_);
  engine_->running_ = &r;  // alive until this scope ends
  engine_->running_fused_with_ = fused_with;
  engine_->running_since_us_.store(NowMicros());
}

Engine::Running::~Running() {
  if (engine_ == nullptr) return;
  std::lock_guard<std::mutex> lock(engine_->watch_mu_);
  engine_->running_ = nullptr;
  engine_->running_since_us_.store(0);
}

void Engine::Watchdog() {
  std::unique_lock<std::mutex> lock(watch_mu_);
  while (!watch_stop_) {
    watch_cv_.wait_for(lock, std::chrono::milliseconds(200));
    if (watch_stop_) break;
    const double timeout_s = kStallTimeout.Get();
    if (!(timeout_s > 0)) continue;
    const int64_t now = NowMicros();
    const int64_t timeout_us = static_cast<int64_t>(timeout_s * 1e6);
    // The margin lets weft's own timeouts (the coordinator's, a point-to-point transfer's),
    // which end an op with an error the program can handle, come first.
    const int64_t margin_us = std::max<int64_t>(2000000, timeout_us / 2);
    std::string why;
    const int64_t since = running_since_us_.load();
    if (running_ != nullptr && since != 0 && now - since > timeout_us + margin_us) {
      const std::string fused = running_fused_with_ > 0
                                    ? absl::StrCat(" (fused with ", running_fused_with_, " more)")
                                    : "";
      why = absl::StrCat(Describe(running_->desc), fused, " has been in its transfers for ",
                         (now - since) / 1000000, " s, longer than WEFT_STALL_TIMEOUT_SECONDS (",
                         timeout_s,
                         " s) and a margin: a rank or the network between ranks is likely gone");
    }
    // The coordinator answers every op within the timeout (the op, or its timeout error),
    // once it gets to its stall check: rank 0 may itself be held in ops that end by their
    // own timeouts first (seen: a transfer from a dead rank delayed the answer to 6 s with
    // a 3 s timeout). So only a silence of three timeouts and the margin means rank 0, or
    // the link to it, is gone.
    const int64_t answered = last_answer_us_.load();
    if (why.empty() && ctx_.rank != 0 && awaiting_answer_.load() && answered != 0 &&
        now - answered > 3 * timeout_us + margin_us) {
      why = absl::StrCat("no answer from rank 0 (the coordinator) for ", (now - answered) / 1000000,
                         " s while ops wait for it, over three times WEFT_STALL_TIMEOUT_SECONDS (",
                         timeout_s, " s): rank 0 or the link to it is likely gone");
    }
    if (why.empty()) continue;
    lock.unlock();
    WEFT_LOG(Error) << "watchdog: " << why << "; aborting the job";
    std::fflush(stderr);
    // MPI_Abort asks Open MPI to end every rank; if it cannot reach the launcher (the link
    // is gone), this process still ends.
    std::thread([] { MPI_Abort(MPI_COMM_WORLD, 70); }).detach();
    std::this_thread::sleep_for(std::chrono::seconds(10));
    std::_Exit(70);
  }
}

Status Engine::AssignKey(Request& r, bool refusing) {
  Descriptor& d = r.desc;
  // A process set's ops are matched among its ranks only: their keys carry the set, and
  // unnamed ones count calls per set (the other ranks never see them). Messages name the op
  // from the key (Describe), so nothing else is built here for an op that goes well.
  if (d.key.empty()) {
    // Call order is only defined on one thread: unnamed ops from two threads would be
    // numbered in whatever order the threads happen to reach this point, differently on
    // each rank, and pair with other ranks' different ops without any error. So the order
    // that counts is the init() thread's (or the thread that claimed it since, see
    // claim_call_order), and every rank refuses the same calls.
    if (std::this_thread::get_id() != order_thread_.load()) {
      const bool nameless = d.op == OpType::kBarrier || d.op == OpType::kSetTopology;
      return InvalidArgument(
          Describe(d),
          ": unnamed ops are matched across ranks by their order on the thread "
          "that called init() (or claimed that order since), and this call comes from "
          "another thread, where that order "
          "is not the same on every rank; ",
          nameless ? "call it from the thread that called init()"
                   : "give the op a name (named ops are matched by name, from any thread)");
    }
    if (d.group.empty()) {
      d.number = next_unnamed_++;
      d.key = UnnamedKey(d.number, "");
    } else {
      d.number = next_unnamed_in_group_[d.group]++;
      d.key = UnnamedKey(d.number, KeyScope(d.group));
    }
  } else if (d.key[0] != '#') {  // '#': internal ops with a fixed key (shutdown, window ops)
    d.key += KeyScope(d.group);
    if (!refusing && !names_in_flight_.insert(d.key).second) {
      return InvalidArgument(Describe(d), ": an op with this name is already in flight ",
                             d.group.empty() ? "" : "in this process set ", "on rank ", ctx_.rank,
                             "; wait for it before reusing the name");
    }
  } else {
    return OkStatus();
  }
  if (d.group.empty()) r.turn = next_turn_++;
  return OkStatus();
}

StatusOr<Handle> Engine::Submit(std::shared_ptr<Request> r, bool caller_waits, bool blocking) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (stopping_) {
      return FailedPrecondition(OpName(r->desc.op),
                                ": weft is shutting down; no new ops are accepted");
    }
    Descriptor& d = r->desc;
    if (t_making_progress) {
      // Refused before it takes a place, whichever thread makes the progress, so that every
      // rank refuses alike.
      return FailedPrecondition(OpName(d.op),
                                ": called while this thread runs weft's engine (from an output "
                                "Allocator?); start ops outside the allocator");
    }
    WEFT_RETURN_IF_ERROR(AssignKey(*r, /*refusing=*/false));
    r->blocking = blocking;
    if (d.op == OpType::kSetTopology) d.in_flight = in_flight_.load();
    if (d.op == OpType::kShutdown) stopping_ = true;
    r->submitted_us = TraceStart(timeline_);
    r->engine = weak_from_this();
    in_flight_.fetch_add(1);
    // Only the first request of a burst wakes a sleeping engine thread (it drains the whole
    // queue); a futex wake per request was measurable in 64-op bursts. Where ranks share
    // CPUs none does (kSharedCpuIdleMicros).
    wake = !caller_waits && !ctx_.oversubscribed && TakeWakeUp();
    queue_.push_back(r);
  }
  if (wake) queue_cv_.notify_one();
  return MakeHandle(std::move(r));
}

Status Engine::Refuse(std::shared_ptr<Request> r, Status why) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (stopping_) return why;
    Descriptor& d = r->desc;
    // An op that cannot take a place in the call order (from another thread) has nothing
    // to tell the others: every rank refuses it alike.
    if (!AssignKey(*r, /*refusing=*/true).ok()) return why;
    d.refused_code = static_cast<int32_t>(why.code());
    d.refused_message = std::string(why.message());
    r->submitted_us = TraceStart(timeline_);
    // The other ranks wait for this message: the engine thread sends it even if nothing
    // else happens on this rank.
    wake = TakeWakeUp();
    queue_.push_back(std::move(r));
  }
  if (wake) queue_cv_.notify_one();
  return why;
}

bool Engine::Busy() const {
  return !outstanding_.empty() || control_->sending() || !local_.empty() || device_->busy() ||
         (coordinator_ != nullptr && coordinator_->pending() > 0) || direct_ != nullptr;
}

void Engine::Loop() {
  int64_t last_progress_us = NowMicros();  // it spins after its own progress, not a caller's
  for (;;) {
    bool progressed = false;
    bool busy = false;
    bool driven = false;  // a waiting caller is making progress
    {
      std::unique_lock<std::mutex> lock(progress_mu_, std::try_to_lock);
      if (lock.owns_lock()) {
        if (shutdown_done_) break;
        progressed = Progress();
        if (shutdown_done_) break;
        busy = Busy();
      } else {
        driven = true;
      }
    }
    const int64_t now = NowMicros();
    if (progressed) {
      last_progress_us = now;
      continue;
    }
    if (busy && now - last_progress_us < kSpinMicros.Get()) {
      std::this_thread::yield();
      continue;
    }
    // Back off: short sleeps while ops are outstanding or a caller drives (spinning beside
    // it would only take its core), long ones when idle. A new submission, or a caller
    // that stops driving, wakes the thread at once.
    int64_t sleep_us = 0;
    if (driven) {
      // A caller runs the engine (its own op, typically). It kicks this thread when it
      // stops and leaves work behind (DriveUntilDone, TryProgress), so there is nothing to
      // poll for: waking every WEFT_ENGINE_MAX_SLEEP_MICROS only took the core from the
      // ranks (2 ranks on 2 cores: 10% of a 1 MiB allreduce).
      sleep_us = kDrivenSleepMicros;
    } else if (busy) {
      // From the last progress on any thread: a caller that polled for its op until it
      // gave up has waited that long already.
      sleep_us = BusySleepMicros(now - last_progress_us_.load(std::memory_order_relaxed),
                                 kMaxSleepMicros.Get());
    } else if (windows.load() > 0) {
      sleep_us = kMaxSleepMicros.Get();  // others' one-sided ops may need our progress
    } else {
      // Rank 0 still watches for stalls; where ranks share CPUs, submissions are not
      // announced and wait for this thread's next look.
      sleep_us = ctx_.oversubscribed ? kSharedCpuIdleMicros : ctx_.rank == 0 ? 10000 : 100000;
    }
    std::unique_lock<std::mutex> lock(queue_mu_);
    sleeping_ = true;
    queue_cv_.wait_for(lock, std::chrono::microseconds(sleep_us), [this] {
      if (!queue_.empty() || kick_) return true;
      // Woken for requests a driving caller took first (or not at all): the wake-up is
      // spent, and the next submission must send another.
      wake_sent_ = false;
      return false;
    });
    sleeping_ = false;
    wake_sent_ = false;
    kick_ = false;
  }
  // Let the last messages (the shutdown response) reach their ranks. A rank that died
  // never drains its queue: with a stall timeout, give up on it after that long.
  std::lock_guard<std::mutex> lock(progress_mu_);
  const double timeout_s = kStallTimeout.Get();
  const int64_t deadline = NowMicros() + static_cast<int64_t>(timeout_s * 1e6);
  while (!control_->Flush()) {
    if (timeout_s > 0 && NowMicros() > deadline) {
      WEFT_LOG(Warning) << "shutdown: messages to other ranks never left; a rank may have died";
      break;
    }
    std::this_thread::yield();
  }
  host_->Close();
}

Status Engine::DriveUntilDone(Request& r) {
  if (t_making_progress) {
    return FailedPrecondition(
        "wait: called while this thread runs weft's engine (from an output Allocator?); "
        "it would wait for itself");
  }
  // Done since the caller looked (wait() returns at once for an op done before): nothing
  // to drive, and nothing was taken from the engine thread to hand back.
  if (r.is_done()) return OkStatus();
  int64_t last_progress_us = NowMicros();
  while (!r.is_done()) {
    bool progressed = false;
    {
      // Blocks (without spinning) while another thread makes progress, typically the
      // engine thread already running this very op: spinning beside it would take its core.
      std::lock_guard<std::mutex> lock(progress_mu_);
      if (shutdown_done_) break;
      progressed = Progress();
    }
    if (progressed) {
      last_progress_us = NowMicros();
    } else if (NowMicros() - last_progress_us >= WaitSpinMicros()) {
      break;  // a long wait: sleep instead, and let the engine thread poll
    } else {
      // spin.h: yields only when ranks share cores
      IdleWait(last_progress_us, control_->polls_mpi() || windows.load() > 0);
    }
  }
  // Hand progress back to the engine thread, unless nothing is left to make (waking it for
  // nothing would take a core from the ranks).
  {
    std::unique_lock<std::mutex> lock(progress_mu_, std::try_to_lock);
    if (lock.owns_lock() && !shutdown_done_) {
      control_->Flush();  // small messages have left by now; only real work warrants a wake-up
      if (!Busy()) return OkStatus();
    }
  }
  HandBack();
  return OkStatus();
}

int64_t Engine::WaitSpinMicros() const {
  const int64_t spin = kSpinMicros.Get();
  if (spin == 0) return 0;
  return std::max(
      spin, std::min(2 * last_run_us_.load(std::memory_order_relaxed), kWaitSpinMaxMicros.Get()));
}

bool Engine::TakeWakeUp() {
  if (!sleeping_ || wake_sent_) return false;
  wake_sent_ = true;
  return true;
}

void Engine::Wake() {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    wake = !ctx_.oversubscribed && !queue_.empty() && TakeWakeUp();
  }
  if (wake) queue_cv_.notify_one();
}

void Engine::HandBack() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    kick_ = true;
  }
  queue_cv_.notify_one();
}

void Engine::TryProgress() {
  bool left_work = false;
  {
    std::unique_lock<std::mutex> lock(progress_mu_, std::try_to_lock);
    if (!lock.owns_lock() || shutdown_done_) return;
    Progress();
    left_work = Busy();
  }
  // The engine thread may have found this thread driving and gone to sleep: hand back.
  if (left_work) HandBack();
}

bool Engine::Progress() {
  t_making_progress = true;
  struct Reset {
    ~Reset() { t_making_progress = false; }
  } reset;
  bool progressed = false;
  std::vector<std::shared_ptr<Request>>& batch = drained_;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    batch.swap(queue_);
  }
  if (!batch.empty()) {
    std::vector<const Descriptor*> descriptors;  // in `batch`
    descriptors.reserve(batch.size());
    const int64_t now = TraceStart(timeline_);
    for (auto& r : batch) {
      r->dequeued_us = now;
      if (timeline_->enabled()) {
        Span(*r, "queue", r->submitted_us, now, r->in.ToString());
      }
      if (r->desc.op == OpType::kWinLocal) {
        local_.push_back(r);
        continue;
      }
      if (direct_ != nullptr) {
        // An op this rank started before this one waits to be agreed directly: it is
        // decided now, run or sent to the coordinator ahead of this one, so that the
        // coordinator hears of this rank's ops in the order they were started (a barrier
        // then completes after the nonblocking ops its thread started before it).
        if (!descriptors.empty()) SendDescriptors(descriptors);
        descriptors.clear();
        SettleDirect(/*must=*/true);
      }
      // Direct agreement numbers the ops of every rank (no process set) only.
      if (r->turn >= 0 && control_->agreement() != nullptr && TryDirect(r, batch.size() == 1)) {
        continue;
      }
      descriptors.push_back(&r->desc);
      // A refused op runs nothing here: only the others are told.
      if (r->desc.refused_code == 0) outstanding_[r->desc.key] = r;
    }
    if (!descriptors.empty()) SendDescriptors(descriptors);
    // outstanding_ owns them now; holding them here would outlive their completion below
    // (and with it whatever Handle::keep_alive tied to them).
    batch.clear();
    progressed = true;
  }
  if (direct_ != nullptr) progressed |= SettleDirect(/*must=*/false);
  progressed |= RunLocal();
  // Windows on transports that move only when driven (UCX) progress here too, so a put
  // aimed at this rank completes while it computes.
  if (windows.load() > 0) progressed |= ProgressWindowTransports();
  progressed |= device_->Poll();
  if (coordinator_ != nullptr) {
    // The coordinator answers what is ready before each probe and after each message, so
    // that no probe stands between an op's last descriptor (this rank's own, drained above,
    // included) and its answer (ControlChannel::ReceiveMpi says why).
    progressed |= RunCoordinator();
    if (!shutdown_done_ && PollDescriptors()) {
      RunCoordinator();
      progressed = true;
    }
  } else {
    progressed |= PollResponses();
  }
  control_->Flush();
  if (coordinator_ == nullptr) {
    const bool awaiting = !outstanding_.empty();
    // The clock starts when ops begin to wait, not at the last answer before them.
    if (awaiting && !awaiting_answer_.load()) last_answer_us_.store(NowMicros());
    awaiting_answer_.store(awaiting);
  }
  if (progressed) last_progress_us_.store(NowMicros(), std::memory_order_relaxed);
  return progressed;
}

bool Engine::TryDirect(const std::shared_ptr<Request>& r, bool alone) {
  Agreement& agreement = *control_->agreement();
  const Descriptor& d = r->desc;
  // A neighbor_allreduce over the topology: the coordinator's check of every rank's sends
  // against the others' receives holds by construction (set_topology agrees on the graph).
  // A dynamic one (dst_weights) carries its send and receive sets as this rank's own facts
  // (bit masks, so up to 32 ranks), which SettleDirect checks against each other.
  const bool dynamic = d.op == OpType::kNeighborAllreduce && !r->topology_pattern;
  const bool kind = d.op == OpType::kAllreduce || d.op == OpType::kBroadcast ||
                    d.op == OpType::kAllgather || d.op == OpType::kNeighborAllreduce;
  // Every other op of this rank has completed (no answer pending that the coordinator could
  // order before this one), the facts fit, and the op is either blocking or came alone: a
  // nonblocking op drained with others is most likely part of a burst, which the
  // coordinator fuses.
  if (!((r->blocking || alone) && kind && d.refused_code == 0 &&
        d.device.type == Device::Type::kCPU && direct_ == nullptr && outstanding_.empty() &&
        local_.empty() && !device_->busy() && d.shape.size() + 2 <= Agreement::kAgreedWords &&
        r->in.nbytes() < (uint64_t{1} << 40) && d.root >= -1 && d.root + 1 < (1 << 20) &&
        (!dynamic || ctx_.size <= 32) && kDirectAgreement.Get())) {
    agreement.Skip(r->turn);
    return false;
  }
  // Which op it is (the coordinator matches keys), then what the coordinator would check
  // (Coordinator::Validate): the op, dtype, device type, shape (but allgather's first
  // dimension), root, average. (Neighbor weights are each rank's own.)
  Agreement::Facts facts;
  const bool gather = d.op == OpType::kAllgather;
  facts.agreed[0] = OpIdentity(d);
  facts.agreed[1] = static_cast<uint64_t>(d.op) | static_cast<uint64_t>(d.dtype) << 8 |
                    static_cast<uint64_t>(d.device.type) << 16 |
                    static_cast<uint64_t>(d.average) << 24 |
                    static_cast<uint64_t>(d.shape.size()) << 32 |
                    static_cast<uint64_t>(dynamic) << 40 | static_cast<uint64_t>(d.root + 1) << 44;
  for (size_t i = gather ? 1 : 0; i < d.shape.size(); ++i) {
    facts.agreed[2 + i] = static_cast<uint64_t>(d.shape[i]);
  }
  facts.agreed_words = 2 + static_cast<int>(d.shape.size());
  // The op's first round written ahead, where it can be: the agreement then stands for
  // that round's meeting, if every rank staged alike (a fact they agree on). An op whose way
  // rank 0 picks by timing writes no round (its way is not known yet), only what the direct
  // reads post, and says so, and whether it is in place (kTunedInPlace, kTunedOutOfPlace),
  // so that ranks that answered otherwise (in place on some ranks only, or a setting
  // changed meanwhile) send the op to the coordinator, whose answer runs the default way.
  const int pick = dynamic ? -1 : host_->Preference(*r);
  {
    Running running(this, *r, 0);  // staging may wait for ranks still reading an op before
    direct_staged_ = host_->Stage(*r, /*tuned=*/pick >= 0);
  }
  facts.agreed[1] |= static_cast<uint64_t>(direct_staged_) << 41;
  if (dynamic) {
    uint64_t sends = 0, receives = 0;
    for (int32_t to : d.send_ranks) sends |= uint64_t{1} << to;
    for (int32_t from : d.recv_ranks) receives |= uint64_t{1} << from;
    facts.own = static_cast<int64_t>(sends | receives << 32);
  } else {
    // The rows (under 2^40 bytes, so they fit) and whether the op is in place; from rank 0
    // also the way it picks for an op whose way it picks by timing.
    facts.own = d.rows() * 2 + (d.in_place ? 1 : 0);
    if (pick > 0) facts.own |= (pick & kTunedWayMask) << kTunedWayShift;
  }
  const Agreement::Decision decision = agreement.Arrive(r->turn, facts);
  if (decision == Agreement::Decision::kNegotiate) return false;
  direct_ = r;
  // kRun (this rank counted in last): SettleDirect runs it, after this round's descriptors
  // have left. The decision is kept: the word may be reused once every rank has decided.
  direct_runs_ = decision == Agreement::Decision::kRun;
  if (!direct_runs_) direct_since_us_ = NowMicros();  // the wait's clock
  return true;
}

bool Engine::PatternsMatch(const Agreement& agreement) const {
  // Rank r sends to s exactly when s expects to receive from r.
  for (int r = 0; r < ctx_.size; ++r) {
    const uint64_t sends = static_cast<uint64_t>(agreement.own(r)) & 0xFFFFFFFFu;
    for (int s = 0; s < ctx_.size; ++s) {
      const uint64_t receives = static_cast<uint64_t>(agreement.own(s)) >> 32;
      if (((sends >> s) & 1) != ((receives >> r) & 1)) return false;
    }
  }
  return true;
}

bool Engine::SettleDirect(bool must) {
  Agreement& agreement = *control_->agreement();
  const int64_t number = direct_->turn;
  Agreement::Decision decision = direct_runs_ ? Agreement::Decision::kRun : agreement.Poll(number);
  if (decision == Agreement::Decision::kWait &&
      (must || NowMicros() - direct_since_us_ > kDirectWaitMicros)) {
    decision = agreement.Withdraw(number);
  }
  if (decision == Agreement::Decision::kWait) return false;
  std::shared_ptr<Request> r = std::move(direct_);
  direct_ = nullptr;
  if (decision == Agreement::Decision::kRun && r->desc.op == OpType::kNeighborAllreduce &&
      !r->topology_pattern && !PatternsMatch(agreement)) {
    // Every rank reads the same facts and so comes here too: the coordinator names what
    // does not match.
    decision = Agreement::Decision::kNegotiate;
  }
  if (decision == Agreement::Decision::kNegotiate) {
    outstanding_[r->desc.key] = r;
    SendDescriptors({&r->desc});
    return true;
  }
  // Every rank counted in with the same facts: the answer the coordinator would give.
  Response response;
  response.op = r->desc.op;
  response.keys.push_back(r->desc.key);
  const int64_t rows_mask = (int64_t{1} << kTunedWayShift) - 1;
  // Rank 0's pick, where every rank agreed that it picks one.
  if (IsTuned(direct_staged_)) {
    response.tuned_way = static_cast<int32_t>(agreement.own(0) >> kTunedWayShift & kTunedWayMask);
  }
  if (response.op == OpType::kAllreduce) {
    response.out_of_place = true;
    for (int rank = 0; rank < ctx_.size; ++rank) {
      if (agreement.own(rank) % 2 != 0) response.out_of_place = false;
    }
  } else if (response.op == OpType::kAllgather) {
    std::vector<int64_t> dims(ctx_.size);
    for (int rank = 0; rank < ctx_.size; ++rank) dims[rank] = (agreement.own(rank) & rows_mask) / 2;
    response.first_dims.push_back(std::move(dims));
  }
  // When every rank has a core of its own, every rank enters the op only once every rank
  // has seen that it runs: a rank whose core another process holds then takes the op's
  // wait in this loop, which lets the core go every 100 us, rather than inside MPI, which
  // spins on it until the scheduler takes it away (2 ranks beside a busy program: a 4 B
  // broadcast took 4 ms per op instead of microseconds). When ranks share cores, waiting
  // polls yield anyway, and that wait costs every rank a turn of the scheduler before each
  // op (4 ranks on 2 cores: 4 B broadcasts 6-8 us slower). An op whose first step is a
  // meeting through shared memory already waits so (HostPlane::MeetsFirst), and a second
  // wait before it cost 0.2-0.5 us per small op on 2 ranks. A rank that died meanwhile
  // holds this wait as it would hold the op: the watchdog covers both.
  r->staged = direct_staged_;
  std::vector<std::shared_ptr<Request>> group{std::move(r)};
  Request& request = *group[0];
  Running running(this, request, 0);
  if (!IdleWaitYields(/*polled_mpi=*/false) && !host_->MeetsFirst(response, group)) {
    const int64_t since = NowMicros();
    while (!agreement.SeenByAll(number)) IdleWait(since, /*polled_mpi=*/false);
  }
  if (timeline_->enabled()) {
    Span(request, "negotiate", request.dequeued_us, NowMicros(), "direct");
  }
  const int64_t start = NowMicros();
  Execute(response, group);
  last_run_us_.store(NowMicros() - start, std::memory_order_relaxed);
  return true;
}

bool Engine::RunLocal() {
  bool progressed = false;
  // In order: a window op waiting for a mutex holds back this rank's later window ops.
  while (!local_.empty()) {
    std::shared_ptr<Request> r = local_.front();
    const int64_t start = NowMicros();
    std::optional<Status> result;
    {
      Running running(this, *r, 0);
      result = r->action();
    }
    if (!result.has_value()) break;
    local_.pop_front();
    if (timeline_->enabled()) {
      Span(*r, "communicate", start, NowMicros());
    }
    Finish(r, std::move(*result));
    progressed = true;
  }
  return progressed;
}

void Engine::SendDescriptors(const std::vector<const Descriptor*>& batch) {
  if (coordinator_ != nullptr) {
    const int64_t now = NowMicros();
    for (KeyedDescriptor& d : ShareRepeats(batch)) coordinator_->Add(std::move(d), now);
    return;
  }
  control_->SendToCoordinator(std::make_shared<const std::string>(SerializeDescriptors(batch)));
}

bool Engine::PollDescriptors() {
  int from = 0;
  std::string bytes;
  if (!control_->ReceiveDescriptors(&from, &bytes)) return false;
  auto parsed = ParseKeyedDescriptors(bytes);
  if (!parsed.ok()) {
    WEFT_LOG(Error) << "dropping a message from rank " << from << ": " << parsed.status();
    return true;
  }
  const int64_t now = NowMicros();
  for (KeyedDescriptor& d : *parsed) coordinator_->Add(std::move(d), now);
  return true;
}

bool Engine::RunCoordinator() {
  std::vector<Response> responses;
  // Stalls need keys that wait for ranks; without them the clock is not read.
  const int64_t now = coordinator_->pending() > 0 ? NowMicros() : 0;
  if (now != 0 && now - last_stall_check_us_ >= 100000) {
    last_stall_check_us_ = now;
    auto report = coordinator_->CheckStalls(now, kStallWarning.Get(), kStallTimeout.Get());
    for (const std::string& w : report.warnings) WEFT_LOG(Warning) << "stall: " << w;
    // Before any rank hears of a timeout, no op may run without the coordinator any more:
    // the ranks the op fails on have given it a number in the agreement that the rank that
    // never called it has not, so the same number now stands for different ops, and every
    // rank that counted in would wait its longest for the others on every op. (After an
    // unnamed op's timeout the coordinator also fails the unnamed ops that follow.)
    if (!report.errors.empty() && control_->agreement() != nullptr) {
      control_->agreement()->Disable();
    }
    for (Response& e : report.errors) {
      WEFT_LOG(Error) << e.error_message;
      responses.push_back(std::move(e));
    }
  }
  std::vector<Response> ready = coordinator_->TakeReady(kFusionThreshold.Get());
  if (responses.empty()) {
    responses = std::move(ready);
  } else {
    for (Response& r : ready) responses.push_back(std::move(r));
  }
  if (responses.empty()) return false;
  if (ctx_.size > 1) {
    control_->SendToAll(std::make_shared<const std::string>(SerializeResponses(responses)));
  }
  Process(responses);
  return true;
}

bool Engine::PollResponses() {
  std::string bytes;
  if (shutdown_done_ || !control_->ReceiveResponses(&bytes)) return false;
  auto parsed = ParseResponses(bytes);
  if (!parsed.ok()) {
    // Without the coordinator's word nothing can run in step with the other ranks.
    FailAll(Internal("corrupt message from the coordinator: ", parsed.status().message()));
    shutdown_done_ = true;
    return true;
  }
  last_answer_us_.store(NowMicros());
  Process(*parsed);
  return true;
}

void Engine::Process(const std::vector<Response>& responses) {
  for (const Response& resp : responses) {
    if (shutdown_done_) return;
    if (!resp.ranks.empty() &&
        std::find(resp.ranks.begin(), resp.ranks.end(), ctx_.rank) == resp.ranks.end()) {
      continue;
    }
    // This rank runs the op (or fails it): the op it counted in for first, if it runs.
    if (direct_ != nullptr) SettleDirect(/*must=*/true);
    std::vector<std::shared_ptr<Request>> group;
    group.reserve(resp.keys.size());
    const int64_t now = TraceStart(timeline_);
    for (const std::string& key : resp.keys) {
      auto it = outstanding_.find(key);
      if (it == outstanding_.end()) {
        WEFT_LOG(Error) << "coordinator named an op this rank has not submitted: " << key;
        continue;
      }
      if (timeline_->enabled()) {
        Span(*it->second, "negotiate", it->second->dequeued_us, now);
      }
      group.push_back(it->second);
    }
    if (resp.op == OpType::kShutdown) {
      // Everything still outstanding can no longer complete on every rank.
      std::shared_ptr<Request> self = group.empty() ? nullptr : group[0];
      if (self) outstanding_.erase(self->desc.key);  // not failed with the rest
      FailAll(FailedPrecondition(
          "weft was shut down before every rank submitted this op"));
      if (self) Finish(self, resp.status());
      shutdown_done_ = true;
      return;
    }
    if (group.empty()) continue;
    if (resp.error_code != 0) {
      for (auto& r : group) Finish(r, resp.status());
      continue;
    }
    Running running(this, *group[0], group.size() - 1);
    const int64_t start = NowMicros();
    if (coordinator_ != nullptr) {
      // Rank 0 runs an op right after answering it. A message longer than the room left in
      // a rank's ring (control_channel.h) is still partly queued, and that rank cannot join
      // the op before it has the whole message, while this one, blocked inside the op,
      // would not move the rest: so the rest goes first, to the op's ranks (a rank outside
      // the op, busy or dead, holds nothing up). They read while they wait for their
      // answer; the watchdog covers one of them that died.
      while (!control_->Delivered(resp.ranks)) IdleWait(start, /*polled_mpi=*/true);
    }
    Execute(resp, group);
    last_run_us_.store(NowMicros() - start, std::memory_order_relaxed);
  }
}

void Engine::Execute(const Response& response, std::vector<std::shared_ptr<Request>>& group) {
  Status status;
  switch (response.op) {
    case OpType::kAllreduce:
    case OpType::kBroadcast:
    case OpType::kAllgather:
    case OpType::kNeighborAllgather:
    case OpType::kNeighborAllreduce:
    case OpType::kHierarchicalNeighborAllreduce:
    case OpType::kPairGossip:
    case OpType::kSendRecv: {
      // The coordinator checked that every rank's tensors are on the same kind of device.
      DataPlane& plane = group[0]->in.device().type == Device::Type::kCUDA
                             ? static_cast<DataPlane&>(*device_)
                             : *host_;
      std::optional<Status> ran = plane.Run(response, group);
      if (!ran.has_value()) {
        // The plane completes the group (or has): its work may outlive this call, and
        // FailAll must not complete it a second time. No other request can hold one of
        // these keys by now: requests enter outstanding_ only when Progress drains the
        // queue, not while an op runs.
        for (auto& r : group) outstanding_.erase(r->desc.key);
        return;
      }
      status = std::move(*ran);
      break;
    }
    case OpType::kBarrier: {
      const int64_t start = NowMicros();
      MPI_Barrier(ctx_.data);
      Trace(group, "communicate", start);
      break;
    }
    case OpType::kSetTopology:
      if (on_set_topology) on_set_topology(*group[0]);
      break;
    case OpType::kShutdown: break;  // handled in Process
    case OpType::kWinCreate:
    case OpType::kWinFree: {
      const int64_t start = NowMicros();
      status = group[0]->action().value_or(OkStatus());
      Trace(group, "communicate", start);
      break;
    }
    case OpType::kWinLocal: break;  // never negotiated
  }
  for (auto& r : group) Finish(r, status);
}

void Engine::Finish(const std::shared_ptr<Request>& r, Status s) {
  outstanding_.erase(r->desc.key);
  if (r->desc.key[0] != '#') {
    std::lock_guard<std::mutex> lock(queue_mu_);
    names_in_flight_.erase(r->desc.key);
  }
  if (!s.ok() && timeline_->enabled()) {
    timeline_->Instant(Describe(r->desc), "ERROR", "error", NowMicros(), std::string(s.message()));
  }
  in_flight_.fetch_sub(1);
  r->Complete(std::move(s));
}

void Engine::FailAll(const Status& status) {
  device_->Drain();  // started on the device: it completes on its own, with its own status
  if (direct_ != nullptr) {
    // Whatever it says, nothing runs now.
    if (!direct_runs_) control_->agreement()->Withdraw(direct_->turn);
    outstanding_[direct_->desc.key] = std::move(direct_);
    direct_ = nullptr;
  }
  // In key order, the same on every run (outstanding_ is a hash map).
  std::vector<std::shared_ptr<Request>> pending;
  pending.reserve(outstanding_.size());
  for (auto& entry : outstanding_) pending.push_back(std::move(entry.second));
  outstanding_.clear();
  std::sort(pending.begin(), pending.end(),
            [](const auto& a, const auto& b) { return a->desc.key < b->desc.key; });
  for (auto& r : pending) {
    Finish(r, Status(status.code(), absl::StrCat(Describe(r->desc), ": ", status.message())));
  }
  auto local = std::move(local_);
  local_.clear();
  for (auto& r : local) {
    Finish(r, Status(status.code(), absl::StrCat(Describe(r->desc), ": ", status.message())));
  }
}

StatusOr<HostCopier> Engine::DeviceCopier(const Device& device) { return device_->Copier(device); }

void Engine::Span(const Request& r, const char* phase, int64_t start_us, int64_t end_us,
                  const std::string& detail) {
  TraceSpan(timeline_, r, phase, start_us, end_us, detail);
}

void Engine::Trace(const std::vector<std::shared_ptr<Request>>& group, const char* phase,
                   int64_t start_us) {
  TraceGroup(timeline_, group, phase, start_us);
}

}  // namespace comm
}  // namespace weft
