#include "comm/window.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "comm/mpi_util.h"
#include "comm/reduce.h"
#include "core/config.h"

namespace weft {
namespace comm {
namespace {

constexpr size_t kMaxBytes = static_cast<size_t>(INT_MAX);

const config::StringSetting kTransport(
    "WEFT_TRANSPORT", "mpi",
    "How windows move data: mpi (MPI RMA) or ucx (UCX RDMA puts, gets and atomics; needs a "
    "build with UCX). The same on every rank.",
    {"mpi", "ucx"}, config::Agreement::kSameOnEveryRank);

// MPI RMA, passive target: each rank allocates one window for its memory (data_win_) and
// exposes its tensor through a second one (self_win_) for win_get.
class MpiWindow : public Window {
 public:
  static StatusOr<std::shared_ptr<Window>> Create(MPI_Comm comm, const std::string& name,
                                                  const TensorView& x, const Topology& topo,
                                                  bool zero_init);
  Status Free() override;
  bool freed() const override { return data_win_ == MPI_WIN_NULL; }
  Transport transport() const override { return Transport::kMpi; }
  Status Put(const TensorView& x, const std::vector<std::pair<int, double>>& dsts,
             bool accumulate) override;
  Status Get(const std::vector<std::pair<int, double>>& srcs) override;
  StatusOr<bool> TryLockMutexes(const std::vector<int>& ranks) override;
  Status UnlockMutexes(const std::vector<int>& ranks) override;

 protected:
  char* memory() const override { return base_; }
  // Both windows: the buffers (puts) and x (gets).
  Status LockLocal() override;
  Status UnlockLocal() override;

 private:
  // Local access to this rank's own window memory.
  Status LockSelf();
  Status UnlockSelf();

  MPI_Win data_win_ = MPI_WIN_NULL;
  MPI_Win self_win_ = MPI_WIN_NULL;  // over x_, for win_get
  char* base_ = nullptr;             // this rank's data window memory
  std::vector<char> scratch_;
};

}  // namespace

const char* TransportName(Transport t) { return t == Transport::kUcx ? "ucx" : "mpi"; }

StatusOr<Transport> DefaultTransport() {
  return kTransport.Get() == "ucx" ? Transport::kUcx : Transport::kMpi;
}

Status Window::Init(MPI_Comm comm, const std::string& name, const TensorView& x,
                    const Topology& topo) {
  name_ = name;
  comm_ = comm;
  MPI_Comm_rank(comm, &rank_);
  x_ = x;
  topo_ = std::make_shared<const Topology>(topo);
  in_ = topo.in_neighbors(rank_);
  out_ = topo.out_neighbors(rank_);
  nbytes_ = x.nbytes();
  if (nbytes_ > kMaxBytes) {
    // Every rank has the same shape, so every rank fails here, before any collective.
    return InvalidArgument("win_create '", name, "': ", x.ToString(), " is ", nbytes_,
                           " bytes; windows hold at most ", kMaxBytes, " bytes");
  }
  return OkStatus();
}

size_t Window::TotalBytes() const {
  const int k = static_cast<int>(in_.size());
  return SlotOffset(k, k);
}

void Window::InitMemory(char* base, bool zero_init) const {
  const int k = static_cast<int>(in_.size());
  std::memset(base, 0, SlotOffset(k, 0));
  // A neighbor slot holds no pushed mass until a put or accumulate writes it: its p starts
  // at 0 (as in Bluefog), whether or not its tensor starts as a copy of x.
  const double p_init = 0.0;
  const double p_self = 1.0;
  std::memcpy(base + kPSelfOffset, &p_self, 8);
  for (int s = 0; s < k; ++s) {
    std::memcpy(base + POffset(k, s), &p_init, 8);
    char* slot = base + SlotOffset(k, s);
    if (zero_init) {
      std::memset(slot, 0, nbytes_);
    } else if (nbytes_ > 0) {
      std::memcpy(slot, x_.data(), nbytes_);
    }
  }
}

StatusOr<std::shared_ptr<Window>> Window::Create(MPI_Comm comm, const std::string& name,
                                                 const TensorView& x, const Topology& topo,
                                                 bool zero_init, Transport transport) {
  if (transport == Transport::kUcx) {
#ifdef WEFT_WITH_UCX
    return CreateUcxWindow(comm, name, x, topo, zero_init);
#else
    // Every rank asked for the same transport (the coordinator checked), so every rank
    // fails here, before any collective.
    return Unimplemented("win_create '", name, "': the UCX transport is not in this build "
                         "(UCX was not found when weft was built; WEFT_UCX_HOME)");
#endif
  }
  return MpiWindow::Create(comm, name, x, topo, zero_init);
}

Status Window::CheckAlive() const {
  if (!freed()) return OkStatus();
  return FailedPrecondition("window '", name_, "' was freed before this op ran");
}

Status Window::UpdateThenCollect() {
  std::vector<std::pair<int, double>> all;
  for (int src : in_) all.emplace_back(src, 1.0);
  return Update(1.0, all, /*reset=*/true);
}

void Window::StoreFetched(int src, const void* fetched, double weight, double p) {
  char* base = memory();
  const int k = static_cast<int>(in_.size());
  const int slot = SlotAt(rank_, src);
  WeightedSum(base + SlotOffset(k, slot), x_.dtype(), static_cast<size_t>(x_.numel()),
              {{fetched, weight}});
  const double wp = weight * p;
  std::memcpy(base + POffset(k, slot), &wp, 8);
  int64_t version = 0;
  std::memcpy(&version, base + VersionOffset(slot), 8);
  ++version;
  std::memcpy(base + VersionOffset(slot), &version, 8);
}

namespace {
std::atomic<bool> g_associated_p_ops{true};
}  // namespace

void Window::SetAssociatedPOps(bool on) { g_associated_p_ops.store(on); }
bool Window::AssociatedPOps() { return g_associated_p_ops.load(); }

Status Window::Update(double self_weight, const std::vector<std::pair<int, double>>& neighbors,
                      bool reset) {
  const bool with_p = AssociatedPOps();
  return Locally([&] {
    char* base = memory();
    const int k = static_cast<int>(in_.size());
    std::vector<WeightedTerm> terms{{x_.data(), self_weight}};
    double p = 0;
    std::memcpy(&p, base + kPSelfOffset, 8);
    if (with_p) p *= self_weight;
    for (const auto& [src, weight] : neighbors) {
      const int slot = SlotAt(rank_, src);
      terms.push_back({base + SlotOffset(k, slot), weight});
      double ps = 0;
      std::memcpy(&ps, base + POffset(k, slot), 8);
      if (with_p) p += weight * ps;
    }
    WeightedSum(x_.data(), x_.dtype(), static_cast<size_t>(x_.numel()), terms);
    std::memcpy(base + kPSelfOffset, &p, 8);
    const int64_t zero = 0;
    const double zero_p = 0;
    for (const auto& entry : neighbors) {
      const int slot = SlotAt(rank_, entry.first);
      std::memcpy(base + VersionOffset(slot), &zero, 8);
      if (reset) {
        std::memset(base + SlotOffset(k, slot), 0, nbytes_);
        std::memcpy(base + POffset(k, slot), &zero_p, 8);
      }
    }
    }, Staging::kPullPush);
}

Status Window::ScaleSelf(const TensorView& x, double factor) {
  WEFT_RETURN_IF_ERROR(CheckAlive());
  if (factor == 1.0) return OkStatus();
  // The window's own host copy was refreshed from the device by the put just before
  // (PutAndScale): only the scaled result goes back.
  const bool with_p = AssociatedPOps();
  return Locally([&] {
    Scale(x.data(), x.dtype(), static_cast<size_t>(x.numel()), factor);
    if (!with_p) return;
    double p = 0;
    std::memcpy(&p, memory() + kPSelfOffset, 8);
    p *= factor;
    std::memcpy(memory() + kPSelfOffset, &p, 8);
  }, x.data() == x_.data() ? Staging::kPush : Staging::kNone);
}

void Window::StageThrough(const TensorView& device_x, DeviceCopy copy,
                          std::shared_ptr<void> host) {
  device_x_ = device_x;
  copy_ = std::move(copy);
  host_ = std::move(host);
}

Status Window::PutAndScale(const TensorView& x, const std::vector<std::pair<int, double>>& dsts,
                           bool accumulate, double self_weight) {
  if (x.device().type == Device::Type::kCPU) {
    WEFT_RETURN_IF_ERROR(Put(x, dsts, accumulate));
    return ScaleSelf(x, self_weight);
  }
  if (!staged()) {
    return Internal("window '", name_, "' was given ", x.ToString(), " but holds host memory");
  }
  if (x.data() == device_x_.data()) {
    // The window's own tensor: refresh the host copy (neighbors' gets read it too), put
    // from it, and scale it (ScaleSelf copies it back to the device).
    WEFT_RETURN_IF_ERROR(Locally([] {}, Staging::kPull));
    WEFT_RETURN_IF_ERROR(Put(x_, dsts, accumulate));
    return ScaleSelf(x_, self_weight);
  }
  // Another tensor on the device: a host copy for this put, written back when scaled.
  std::vector<char> host(nbytes_);
  WEFT_RETURN_IF_ERROR(copy_(host.data(), x.data(), nbytes_, false));
  const TensorView staged_x(host.data(), x.dtype(), x.shape());
  WEFT_RETURN_IF_ERROR(Put(staged_x, dsts, accumulate));
  if (self_weight == 1.0) return OkStatus();
  WEFT_RETURN_IF_ERROR(ScaleSelf(staged_x, self_weight));
  return copy_(x.data(), host.data(), nbytes_, true);
}

StatusOr<std::map<int, int64_t>> Window::Versions() {
  std::map<int, int64_t> versions;
  WEFT_RETURN_IF_ERROR(Locally([&] {
    for (size_t s = 0; s < in_.size(); ++s) {
      int64_t v = 0;
      std::memcpy(&v, memory() + VersionOffset(static_cast<int>(s)), 8);
      versions[in_[s]] = v;
    }
  }));
  return versions;
}

StatusOr<double> Window::AssociatedP() {
  double p = 0;
  WEFT_RETURN_IF_ERROR(Locally([&] { std::memcpy(&p, memory() + kPSelfOffset, 8); }));
  return p;
}

bool ProgressWindowTransports() {
  // Open MPI's RMA: the engine's polls for messages stay out of MPI where the negotiation
  // goes through shared memory (control_channel.h).
  MpiProgress();
#ifdef WEFT_WITH_UCX
  return ProgressUcxWindows();
#else
  return false;
#endif
}

StatusOr<std::shared_ptr<Window>> MpiWindow::Create(MPI_Comm comm, const std::string& name,
                                                    const TensorView& x, const Topology& topo,
                                                    bool zero_init) {
  std::shared_ptr<MpiWindow> w(new MpiWindow());
  WEFT_RETURN_IF_ERROR(w->Init(comm, name, x, topo));
  int code = MPI_Win_allocate(static_cast<MPI_Aint>(w->TotalBytes()), 1, MPI_INFO_NULL, comm,
                              &w->base_, &w->data_win_);
  WEFT_RETURN_IF_ERROR(MpiCheck(code, "MPI_Win_allocate"));
  MPI_Win_set_errhandler(w->data_win_, MPI_ERRORS_RETURN);
  code = MPI_Win_create(w->nbytes_ > 0 ? x.data() : nullptr,
                        static_cast<MPI_Aint>(w->nbytes_), 1, MPI_INFO_NULL, comm,
                        &w->self_win_);
  WEFT_RETURN_IF_ERROR(MpiCheck(code, "MPI_Win_create"));
  MPI_Win_set_errhandler(w->self_win_, MPI_ERRORS_RETURN);
  // Initialize before any neighbor can put: the barrier below orders it.
  w->InitMemory(w->base_, zero_init);
  WEFT_RETURN_IF_ERROR(MpiCheck(MPI_Barrier(comm), "MPI_Barrier"));
  return std::shared_ptr<Window>(w);
}

// Free() is collective; a window dropped without it (a failed process) leaks its MPI
// windows rather than calling a collective from a destructor.
Status MpiWindow::Free() {
  Status status;
  if (self_win_ != MPI_WIN_NULL) status = MpiCheck(MPI_Win_free(&self_win_), "MPI_Win_free");
  if (data_win_ != MPI_WIN_NULL) {
    Status s = MpiCheck(MPI_Win_free(&data_win_), "MPI_Win_free");
    if (status.ok()) status = s;
  }
  base_ = nullptr;
  return status;
}

size_t Window::SlotOffset(int k, int slot) const {
  const size_t meta = 24 + 16 * static_cast<size_t>(k);
  const size_t start = (meta + 63) / 64 * 64;
  return start + nbytes_ * static_cast<size_t>(slot);
}

int Window::SlotAt(int dst, int src) const {
  const std::vector<int>& in = topo_->in_neighbors(dst);
  auto it = std::lower_bound(in.begin(), in.end(), src);
  if (it == in.end() || *it != src) return -1;
  return static_cast<int>(it - in.begin());
}

bool Window::HasSlot(int dst, int src) const {
  return dst >= 0 && dst < topo_->size() && SlotAt(dst, src) >= 0;
}

Status MpiWindow::LockSelf() {
  return MpiCheck(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rank_, 0, data_win_), "MPI_Win_lock");
}

Status MpiWindow::UnlockSelf() {
  return MpiCheck(MPI_Win_unlock(rank_, data_win_), "MPI_Win_unlock");
}

Status MpiWindow::LockLocal() {
  // Others read x (win_get) under a shared lock on the self window, and put into the
  // buffers under a shared lock on the data window.
  WEFT_RETURN_IF_ERROR(
      MpiCheck(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rank_, 0, self_win_), "MPI_Win_lock"));
  Status st = LockSelf();
  if (!st.ok()) MPI_Win_unlock(rank_, self_win_);
  return st;
}

Status MpiWindow::UnlockLocal() {
  Status st = UnlockSelf();
  Status unlocked = MpiCheck(MPI_Win_unlock(rank_, self_win_), "MPI_Win_unlock");
  return st.ok() ? unlocked : st;
}

Status MpiWindow::Put(const TensorView& x, const std::vector<std::pair<int, double>>& dsts,
                   bool accumulate) {
  WEFT_RETURN_IF_ERROR(CheckAlive());
  const size_t count = static_cast<size_t>(x.numel());
  const DType dtype = x.dtype();
  // Only this rank writes its p (updates and scaling run on this rank's engine, one at a
  // time), so reading it needs no lock; an exclusive self lock here would wait for every
  // neighbor's put into this window and serialize two ranks putting to each other (it
  // halved the put bandwidth).
  double p_self = 0;
  std::memcpy(&p_self, base_ + kPSelfOffset, 8);
  // MPI_Accumulate's element-wise atomic sum needs a predefined type and an MPI_SUM that is
  // right for it (MpiSumType); the other dtypes take the get-add-put path under an
  // exclusive lock.
  const MPI_Datatype acc_type = MpiSumType(dtype);
  std::vector<char> fetched;
  for (const auto& [dst, weight] : dsts) {
    const int slot = SlotAt(dst, rank_);
    const int k = static_cast<int>(topo_->in_neighbors(dst).size());
    const void* data = x.data();
    if (weight != 1.0) {
      scratch_.resize(nbytes_);
      WeightedSum(scratch_.data(), dtype, count, {{x.data(), weight}});
      data = scratch_.data();
    }
    const MPI_Aint slot_at = static_cast<MPI_Aint>(SlotOffset(k, slot));
    const int n = static_cast<int>(nbytes_);
    const double p = weight * p_self;
    const int64_t one = 1;
    // Get-add-put (see acc_type) needs the target to itself.
    const bool exclusive = accumulate && acc_type == MPI_DATATYPE_NULL;
    WEFT_RETURN_IF_ERROR(
        MpiCheck(MPI_Win_lock(exclusive ? MPI_LOCK_EXCLUSIVE : MPI_LOCK_SHARED, dst, 0, data_win_),
                 "MPI_Win_lock"));
    Status st;
    if (!accumulate) {
      st = MpiCheck(MPI_Put(data, n, MPI_BYTE, dst, slot_at, n, MPI_BYTE, data_win_), "MPI_Put");
      if (st.ok()) {
        st =
            MpiCheck(MPI_Accumulate(&p, 1, MPI_DOUBLE, dst, static_cast<MPI_Aint>(POffset(k, slot)),
                                    1, MPI_DOUBLE, MPI_REPLACE, data_win_),
                     "MPI_Accumulate");
      }
    } else if (!exclusive) {
      const int elems = static_cast<int>(count);
      st = MpiCheck(
          MPI_Accumulate(data, elems, acc_type, dst, slot_at, elems, acc_type, MPI_SUM, data_win_),
          "MPI_Accumulate");
      if (st.ok()) {
        st =
            MpiCheck(MPI_Accumulate(&p, 1, MPI_DOUBLE, dst, static_cast<MPI_Aint>(POffset(k, slot)),
                                    1, MPI_DOUBLE, MPI_SUM, data_win_),
                     "MPI_Accumulate");
      }
    } else {
      fetched.resize(nbytes_);
      st = MpiCheck(MPI_Get(fetched.data(), n, MPI_BYTE, dst, slot_at, n, MPI_BYTE, data_win_),
                    "MPI_Get");
      if (st.ok()) st = MpiCheck(MPI_Win_flush(dst, data_win_), "MPI_Win_flush");
      if (st.ok()) {
        AddInPlace(fetched.data(), data, dtype, count);
        st = MpiCheck(MPI_Put(fetched.data(), n, MPI_BYTE, dst, slot_at, n, MPI_BYTE, data_win_),
                      "MPI_Put");
      }
      if (st.ok()) {
        st =
            MpiCheck(MPI_Accumulate(&p, 1, MPI_DOUBLE, dst, static_cast<MPI_Aint>(POffset(k, slot)),
                                    1, MPI_DOUBLE, MPI_SUM, data_win_),
                     "MPI_Accumulate");
      }
    }
    if (st.ok()) {
      st = MpiCheck(
          MPI_Accumulate(&one, 1, MPI_INT64_T, dst, static_cast<MPI_Aint>(VersionOffset(slot)), 1,
                         MPI_INT64_T, MPI_SUM, data_win_),
          "MPI_Accumulate");
    }
    Status unlocked = MpiCheck(MPI_Win_unlock(dst, data_win_), "MPI_Win_unlock");
    WEFT_RETURN_IF_ERROR(st);
    WEFT_RETURN_IF_ERROR(unlocked);
  }
  return OkStatus();
}

Status MpiWindow::Get(const std::vector<std::pair<int, double>>& srcs) {
  WEFT_RETURN_IF_ERROR(CheckAlive());
  std::vector<char> fetched(nbytes_);
  const int n = static_cast<int>(nbytes_);
  for (const auto& [src, weight] : srcs) {
    double p = 0;
    WEFT_RETURN_IF_ERROR(
        MpiCheck(MPI_Win_lock(MPI_LOCK_SHARED, src, 0, self_win_), "MPI_Win_lock"));
    Status st = n == 0
                    ? OkStatus()
                    : MpiCheck(MPI_Get(fetched.data(), n, MPI_BYTE, src, 0, n, MPI_BYTE, self_win_),
                               "MPI_Get");
    Status unlocked = MpiCheck(MPI_Win_unlock(src, self_win_), "MPI_Win_unlock");
    WEFT_RETURN_IF_ERROR(st);
    WEFT_RETURN_IF_ERROR(unlocked);
    WEFT_RETURN_IF_ERROR(
        MpiCheck(MPI_Win_lock(MPI_LOCK_SHARED, src, 0, data_win_), "MPI_Win_lock"));
    st = MpiCheck(MPI_Get(&p, 1, MPI_DOUBLE, src, kPSelfOffset, 1, MPI_DOUBLE, data_win_),
                  "MPI_Get");
    unlocked = MpiCheck(MPI_Win_unlock(src, data_win_), "MPI_Win_unlock");
    WEFT_RETURN_IF_ERROR(st);
    WEFT_RETURN_IF_ERROR(unlocked);

    WEFT_RETURN_IF_ERROR(
        Locally([&, src = src, weight = weight] { StoreFetched(src, fetched.data(), weight, p); }));
  }
  return OkStatus();
}

StatusOr<bool> MpiWindow::TryLockMutexes(const std::vector<int>& ranks) {
  WEFT_RETURN_IF_ERROR(CheckAlive());
  const int64_t mine = rank_ + 1;
  for (int r : ranks) {
    if (std::binary_search(held_.begin(), held_.end(), r)) continue;
    const int64_t free_value = 0;
    int64_t found = -1;
    if (r == rank_) {
      // Our own word: under the exclusive self lock no other rank's compare-and-swap can
      // run, so a plain read-modify-write is atomic. (Open MPI 4.1's osc/rdma over the
      // vader BTL crashes on an atomic aimed at the calling process itself.)
      WEFT_RETURN_IF_ERROR(LockSelf());
      std::memcpy(&found, base_, 8);
      if (found == 0) std::memcpy(base_, &mine, 8);
      WEFT_RETURN_IF_ERROR(UnlockSelf());
      if (found != 0) return false;
      held_.insert(std::upper_bound(held_.begin(), held_.end(), r), r);
      continue;
    }
    WEFT_RETURN_IF_ERROR(MpiCheck(MPI_Win_lock(MPI_LOCK_SHARED, r, 0, data_win_), "MPI_Win_lock"));
    Status st =
        MpiCheck(MPI_Compare_and_swap(&mine, &free_value, &found, MPI_INT64_T, r, 0, data_win_),
                 "MPI_Compare_and_swap");
    Status unlocked = MpiCheck(MPI_Win_unlock(r, data_win_), "MPI_Win_unlock");
    WEFT_RETURN_IF_ERROR(st);
    WEFT_RETURN_IF_ERROR(unlocked);
    if (found != 0) return false;  // held by rank found - 1; keep what we have, retry
    held_.insert(std::upper_bound(held_.begin(), held_.end(), r), r);
  }
  return true;
}

Status MpiWindow::UnlockMutexes(const std::vector<int>& ranks) {
  WEFT_RETURN_IF_ERROR(CheckAlive());
  const int64_t free_value = 0;
  for (int r : ranks) {
    auto it = std::lower_bound(held_.begin(), held_.end(), r);
    if (it == held_.end() || *it != r) continue;
    // Compare-and-swap back, the operation that takes it: MPI promises atomicity only
    // among concurrent operations of one kind on a location.
    const int64_t mine = rank_ + 1;
    int64_t previous = 0;
    if (r == rank_) {  // as in TryLockMutexes
      WEFT_RETURN_IF_ERROR(LockSelf());
      std::memcpy(base_, &free_value, 8);
      WEFT_RETURN_IF_ERROR(UnlockSelf());
      held_.erase(it);
      continue;
    }
    WEFT_RETURN_IF_ERROR(MpiCheck(MPI_Win_lock(MPI_LOCK_SHARED, r, 0, data_win_), "MPI_Win_lock"));
    Status st =
        MpiCheck(MPI_Compare_and_swap(&free_value, &mine, &previous, MPI_INT64_T, r, 0, data_win_),
                 "MPI_Compare_and_swap");
    Status unlocked = MpiCheck(MPI_Win_unlock(r, data_win_), "MPI_Win_unlock");
    WEFT_RETURN_IF_ERROR(st);
    WEFT_RETURN_IF_ERROR(unlocked);
    held_.erase(it);
  }
  return OkStatus();
}

}  // namespace comm
}  // namespace weft
