// One-sided windows on MPI RMA (passive target). Internal to comm/: the public API is in
// comm.h, and the engine runs every method below on the thread making progress, so one
// process never has two RMA epochs open on a window at once.
//
// Each rank exposes, per window, one receive buffer per in-neighbor of the topology in
// force at creation, plus its own tensor (for win_get). Memory of the data window, at
// every rank (K = that rank's in-degree, slots in the order of its sorted in-neighbors):
//
//   [mutex int64][p_self double][version int64 x K][p double x K][pad to 64][slot x K]
//
// A put to rank d writes into the slot of d for this rank and bumps that slot's version
// in one lock epoch; an update locks the rank's own window exclusively, so a put or
// accumulate lands either before or after it, never half inside.
#ifndef WEFT_COMM_WINDOW_H_
#define WEFT_COMM_WINDOW_H_

#include <mpi.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/topology.h"
#include "core/status.h"
#include "core/tensor.h"

namespace weft {
namespace comm {

class Window {
 public:
  // Collective over `comm` (every rank, same name, dtype and shape). `x` is the tensor the
  // window is associated with: it must stay alive until Free(); win_get reads it,
  // win_update writes it. Every buffer starts as a copy of x (zero_init: zeros).
  static StatusOr<std::shared_ptr<Window>> Create(MPI_Comm comm, const std::string& name,
                                                  const TensorView& x, const Topology& topo,
                                                  bool zero_init);
  ~Window();
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;

  // Collective.
  Status Free();

  const std::string& name() const { return name_; }
  const TensorView& tensor() const { return x_; }
  const std::vector<int>& in_neighbors() const { return in_; }
  const std::vector<int>& out_neighbors() const { return out_; }
  // Whether `src` has a buffer at `dst` (src is an in-neighbor of dst at creation).
  bool HasSlot(int dst, int src) const;

  // Writes (accumulate: adds) w * x into the buffer for this rank at each destination, and
  // w * p into its p. `x` has the window's dtype and shape.
  Status Put(const TensorView& x, const std::vector<std::pair<int, double>>& dsts,
             bool accumulate);
  // Reads w * x_j (and w * p_j) of each source into this rank's buffer for j.
  Status Get(const std::vector<std::pair<int, double>>& srcs);
  // x <- self_weight * x + sum_j w_j * buf_j (p likewise); `reset` zeroes the buffers used.
  // The versions of the buffers used return to 0.
  Status Update(double self_weight, const std::vector<std::pair<int, double>>& neighbors,
                bool reset);
  // x <- x + sum_j buf_j, then every buffer is zeroed (p likewise).
  Status UpdateThenCollect();
  // x *= factor (the tensor a put sent, usually the window's own) and p *= factor: a
  // put's self_weight.
  Status ScaleSelf(const TensorView& x, double factor);
  bool freed() const { return data_win_ == MPI_WIN_NULL; }

  // Puts into each buffer since the last update, by in-neighbor.
  StatusOr<std::map<int, int64_t>> Versions();
  StatusOr<double> AssociatedP();

  // One attempt to take the mutex of every rank in `ranks` (sorted, so two processes never
  // wait on each other in opposite orders): true when all are held (those taken stay
  // taken across attempts), false to try again later.
  StatusOr<bool> TryLockMutexes(const std::vector<int>& ranks);
  Status UnlockMutexes(const std::vector<int>& ranks);

 private:
  Window() = default;
  // Byte offsets inside a rank's data window, given its in-degree.
  static size_t VersionOffset(int slot) { return 16 + 8 * static_cast<size_t>(slot); }
  static size_t POffset(int k, int slot) { return 16 + 8 * static_cast<size_t>(k + slot); }
  size_t SlotOffset(int k, int slot) const;
  int SlotAt(int dst, int src) const;  // -1 when src is not an in-neighbor of dst
  Status CheckAlive() const;
  // Local access to this rank's own window memory.
  Status LockSelf();
  Status UnlockSelf();

  std::string name_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  TensorView x_;
  std::shared_ptr<const Topology> topo_;
  std::vector<int> in_, out_;
  size_t nbytes_ = 0;
  MPI_Win data_win_ = MPI_WIN_NULL;
  MPI_Win self_win_ = MPI_WIN_NULL;  // over x_, for win_get
  char* base_ = nullptr;             // this rank's data window memory
  std::vector<char> scratch_;
  std::vector<int> held_;  // mutexes this rank holds (ranks), sorted
};

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_WINDOW_H_
