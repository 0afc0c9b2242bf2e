// One-sided windows. Internal to comm/: the public API is in comm.h, and the engine runs
// every method below on the thread making progress, so one process never runs two window
// operations at once.
//
// Each rank exposes, per window, one receive buffer per in-neighbor of the topology in
// force at creation, plus its own tensor (for win_get). Memory of a window at every rank
// (K = that rank's in-degree, slots in the order of its sorted in-neighbors), the same for
// every transport:
//
//   [mutex int64][p_self double][rwlock int64][version int64 x K][p double x K]
//   [pad to 64][slot x K]
//
// A put to rank d writes into the slot of d for this rank and bumps that slot's version
// while holding d's window shared; an update holds the rank's own window exclusively, so a
// put or accumulate lands either before or after it, never half inside.
//
// Two transports implement it: MPI RMA (passive target; window.cc) and UCX (RDMA puts,
// gets and atomics on registered memory; ucx_window.cc, when the build found UCX).
#ifndef WEFT_COMM_WINDOW_H_
#define WEFT_COMM_WINDOW_H_

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/topology.h"
#include "core/status.h"
#include "core/tensor.h"

namespace weft {
namespace comm {

enum class Transport : int32_t { kMpi = 0, kUcx = 1 };
const char* TransportName(Transport t);
// WEFT_TRANSPORT (mpi or ucx): windows.
StatusOr<Transport> DefaultTransport();

class Window {
 public:
  // Collective over `comm` (every rank: same name, dtype, shape and transport). `x` is the
  // tensor the window is associated with: it must stay alive until Free(); win_get reads
  // it, win_update writes it. Every buffer starts as a copy of x (zero_init: zeros).
  static StatusOr<std::shared_ptr<Window>> Create(MPI_Comm comm, const std::string& name,
                                                  const TensorView& x, const Topology& topo,
                                                  bool zero_init, Transport transport);
  virtual ~Window() = default;
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;

  // Collective.
  virtual Status Free() = 0;
  virtual bool freed() const = 0;
  virtual Transport transport() const = 0;

  const std::string& name() const { return name_; }
  // The tensor the window was created with (on its device).
  const TensorView& tensor() const { return staged() ? device_x_ : x_; }
  const std::vector<int>& in_neighbors() const { return in_; }
  const std::vector<int>& out_neighbors() const { return out_; }
  // Whether `src` has a buffer at `dst` (src is an in-neighbor of dst at creation).
  bool HasSlot(int dst, int src) const;

  // Writes (accumulate: adds) w * x into the buffer for this rank at each destination, and
  // w * p into its p. `x` has the window's dtype and shape.
  virtual Status Put(const TensorView& x, const std::vector<std::pair<int, double>>& dsts,
                     bool accumulate) = 0;
  // Put, then ScaleSelf(x, self_weight): what win_put and win_accumulate do. A tensor on a
  // CUDA device is staged through host memory (and written back when scaled).
  Status PutAndScale(const TensorView& x, const std::vector<std::pair<int, double>>& dsts,
                     bool accumulate, double self_weight);
  // Reads w * x_j (and w * p_j) of each source into this rank's buffer for j.
  virtual Status Get(const std::vector<std::pair<int, double>>& srcs) = 0;
  // The operations below touch only this rank's memory, under LockLocal(): the same for
  // every transport.
  // x <- self_weight * x + sum_j w_j * buf_j (p likewise); `reset` zeroes the buffers used.
  // The versions of the buffers used return to 0.
  Status Update(double self_weight, const std::vector<std::pair<int, double>>& neighbors,
                bool reset);
  // x <- x + sum_j buf_j, then every buffer is zeroed (p likewise).
  Status UpdateThenCollect();
  // x *= factor (the tensor a put sent, usually the window's own) and p *= factor: a put's
  // self_weight. Staged windows: the host copy of x must be current (PutAndScale pulls it).
  Status ScaleSelf(const TensorView& x, double factor);

  // Puts into each buffer since the last update, by in-neighbor.
  StatusOr<std::map<int, int64_t>> Versions();
  StatusOr<double> AssociatedP();
  // Whether updates and a put's self_weight also apply to p (process-wide; default on).
  // Off, p stays as it is, as in Bluefog until turn_on_win_ops_with_associated_p().
  static void SetAssociatedPOps(bool on);
  static bool AssociatedPOps();

  // One attempt to take the mutex of every rank in `ranks` (sorted, so two processes never
  // wait on each other in opposite orders): true when all are held (those taken stay
  // taken across attempts), false to try again later.
  virtual StatusOr<bool> TryLockMutexes(const std::vector<int>& ranks) = 0;
  virtual Status UnlockMutexes(const std::vector<int>& ranks) = 0;

  // Host staging for a tensor on a CUDA device. Windows live in host memory (MPI RMA and
  // UCX register it), so the window is created over a host copy of the device tensor, and
  // StageThrough() makes it keep the two in step: an op that reads or writes x refreshes the
  // copy from the device first and, when it wrote x, copies it back. A neighbor's win_get
  // therefore sees x as of this rank's last window operation. `copy(dst, src, bytes,
  // to_device)` is a synchronous copy ordered after the device's queued work; `host` owns
  // the host copy (the memory the window was created over).
  using DeviceCopy =
      std::function<Status(void* dst, const void* src, size_t bytes, bool to_device)>;
  void StageThrough(const TensorView& device_x, DeviceCopy copy, std::shared_ptr<void> host);
  bool staged() const { return static_cast<bool>(copy_); }

 protected:
  Window() = default;
  // Fills the fields below; `rank` from `comm`.
  Status Init(MPI_Comm comm, const std::string& name, const TensorView& x,
              const Topology& topo);
  Status CheckAlive() const;

  // This rank's window memory, and exclusive access to it and to x: no put lands in the
  // buffers and no get reads x while held.
  virtual char* memory() const = 0;
  virtual Status LockLocal() = 0;
  virtual Status UnlockLocal() = 0;
  // How a body run under LockLocal() uses x when the window stages a device tensor:
  // kPull refreshes the host copy from the device before it, kPush copies it back after.
  enum class Staging { kNone, kPull, kPush, kPullPush };
  // Runs `body` (touching only this rank's memory) under LockLocal(), staging x as asked.
  template <typename Body>
  Status Locally(Body&& body, Staging staging = Staging::kNone) {
    WEFT_RETURN_IF_ERROR(CheckAlive());
    WEFT_RETURN_IF_ERROR(LockLocal());
    const bool pull = staged() && (staging == Staging::kPull || staging == Staging::kPullPush);
    const bool push = staged() && (staging == Staging::kPush || staging == Staging::kPullPush);
    Status s = pull ? copy_(x_.data(), device_x_.data(), nbytes_, false) : OkStatus();
    if (s.ok()) {
      body();
      if (push) s = copy_(device_x_.data(), x_.data(), nbytes_, true);
    }
    Status unlocked = UnlockLocal();
    return s.ok() ? unlocked : s;
  }
  // What a get fetched from src (its x and p) becomes src's buffer: weight * x, weight * p,
  // one more version. Under LockLocal().
  void StoreFetched(int src, const void* fetched, double weight, double p);

  // Byte offsets inside a rank's window memory, given its in-degree k.
  static constexpr size_t kMutexOffset = 0;
  static constexpr size_t kPSelfOffset = 8;
  static constexpr size_t kRwLockOffset = 16;
  static size_t VersionOffset(int slot) { return 24 + 8 * static_cast<size_t>(slot); }
  static size_t POffset(int k, int slot) { return 24 + 8 * static_cast<size_t>(k + slot); }
  size_t SlotOffset(int k, int slot) const;
  size_t TotalBytes() const;  // this rank's window memory
  int SlotAt(int dst, int src) const;  // -1 when src is not an in-neighbor of dst
  int InDegree(int rank) const { return static_cast<int>(topo_->in_neighbors(rank).size()); }
  // Initializes this rank's window memory (meta, p, slots) at `base`.
  void InitMemory(char* base, bool zero_init) const;

  std::string name_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  TensorView x_;
  std::shared_ptr<const Topology> topo_;
  std::vector<int> in_, out_;
  size_t nbytes_ = 0;
  std::vector<int> held_;  // mutexes this rank holds (ranks), sorted
  // Host staging (StageThrough): x_ is the host copy of device_x_.
  TensorView device_x_;
  DeviceCopy copy_;
  std::shared_ptr<void> host_;
};

#ifdef WEFT_WITH_UCX
// ucx_window.cc.
StatusOr<std::shared_ptr<Window>> CreateUcxWindow(MPI_Comm comm, const std::string& name,
                                                  const TensorView& x, const Topology& topo,
                                                  bool zero_init);
// Progress on the UCX worker; false when there was nothing to do.
bool ProgressUcxWindows();
#endif
// Progress for one-sided ops, on the transports that need this rank to drive them (UCX, and
// Open MPI's RMA components); false when there was nothing to do (as far as can be told).
// Called by the engine while windows exist.
bool ProgressWindowTransports();

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_WINDOW_H_
