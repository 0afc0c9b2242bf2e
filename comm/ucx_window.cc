// Windows over UCX (UCP): RDMA puts, gets and 64-bit atomics on registered memory. Built
// only when the build found UCX (WEFT_WITH_UCX). Here it runs over UCX's shared-memory and
// TCP transports (UCX_TLS); on a cluster the same code uses InfiniBand or RoCE.
//
// One UCP context and worker per process, made at the first UCX window (worker addresses
// are exchanged through MPI, an endpoint per rank, this one included). Each window
// registers its memory (the layout of window.h) and the tensor x, and exchanges the
// remote keys through MPI. UCP has no lock epochs, so the window's rwlock word does that
// job: a put or get holds the target shared (fetch-add 1, backing off while the writer bit
// is set), an update holds its own window exclusively (compare-and-swap 0 -> writer).
// Window operations run on the thread making the engine's progress. Some UCP operations
// need the target to make progress too (atomics that UCX emulates with active messages,
// on TCP), while the target may sit in a blocking MPI collective of the engine: so a
// progress thread per process drives the worker every millisecond (ucx_context.h).
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "comm/reduce.h"
#include "comm/ucx_context.h"
#include "comm/window.h"

namespace weft {
namespace comm {
namespace {

constexpr uint64_t kWriter = uint64_t{1} << 62;

// One registered region and every rank's key and address for it.
struct Region {
  ucp_mem_h memh = nullptr;
  std::vector<uint64_t> addresses;    // by rank
  std::vector<ucp_rkey_h> rkeys;      // by rank (null for empty regions)
};

// Registers [base, base + length) and exchanges keys and addresses with every rank. With
// `*base` null, UCX allocates the memory itself (and sets *base): then it can come from a
// shared-memory segment, which peers on the machine map directly, so puts are copies and
// atomics CPU atomics, instead of cross-process copies and atomics emulated by messages.
Status Register(UcxContext* ucx, MPI_Comm comm, void** base, size_t length, Region* region) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  void* packed = nullptr;
  size_t packed_len = 0;
  if (length > 0) {
    ucp_mem_map_params_t params;
    std::memset(&params, 0, sizeof(params));
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = *base;
    params.length = length;
    if (*base == nullptr) {
      params.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
      params.flags = UCP_MEM_MAP_ALLOCATE;
    }
    ucs_status_t st = ucp_mem_map(ucx->context(), &params, &region->memh);
    if (st != UCS_OK) return UcsError(st, "ucp_mem_map");
    if (*base == nullptr) {
      ucp_mem_attr_t attr;
      attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
      st = ucp_mem_query(region->memh, &attr);
      if (st != UCS_OK) return UcsError(st, "ucp_mem_query");
      *base = attr.address;
    }
    st = ucp_rkey_pack(ucx->context(), region->memh, &packed, &packed_len);
    if (st != UCS_OK) return UcsError(st, "ucp_rkey_pack");
  }
  const uint64_t address = reinterpret_cast<uint64_t>(*base);
  region->addresses.resize(size);
  WEFT_RETURN_IF_ERROR(MpiCheck(MPI_Allgather(&address, 1, MPI_UINT64_T,
                                              region->addresses.data(), 1, MPI_UINT64_T, comm),
                                "MPI_Allgather"));
  auto keys = AllgatherBytes(comm, packed, packed_len);
  if (packed != nullptr) ucp_rkey_buffer_release(packed);
  if (!keys.ok()) return keys.status();
  region->rkeys.assign(size, nullptr);
  for (int r = 0; r < size; ++r) {
    if ((*keys)[r].empty()) continue;  // an empty region has no key
    ucs_status_t st = ucp_ep_rkey_unpack(ucx->ep(r), (*keys)[r].data(), &region->rkeys[r]);
    if (st != UCS_OK) return UcsError(st, absl::StrCat("ucp_ep_rkey_unpack from rank ", r));
  }
  return OkStatus();
}

void Release(UcxContext* ucx, Region* region) {
  for (ucp_rkey_h key : region->rkeys) {
    if (key != nullptr) ucp_rkey_destroy(key);
  }
  region->rkeys.clear();
  if (region->memh != nullptr) ucp_mem_unmap(ucx->context(), region->memh);
  region->memh = nullptr;
}

class UcxWindow : public Window {
 public:
  static StatusOr<std::shared_ptr<Window>> Create(MPI_Comm comm, const std::string& name,
                                                  const TensorView& x, const Topology& topo,
                                                  bool zero_init);
  ~UcxWindow() override = default;  // the memory belongs to UCX (unmapped by Free)
  Status Free() override;
  bool freed() const override { return freed_; }
  Transport transport() const override { return Transport::kUcx; }
  Status Put(const TensorView& x, const std::vector<std::pair<int, double>>& dsts,
             bool accumulate) override;
  Status Get(const std::vector<std::pair<int, double>>& srcs) override;
  StatusOr<bool> TryLockMutexes(const std::vector<int>& ranks) override;
  Status UnlockMutexes(const std::vector<int>& ranks) override;

 protected:
  char* memory() const override { return base_; }
  Status LockLocal() override { return AcquireExclusive(); }
  Status UnlockLocal() override { return ReleaseExclusive(); }

 private:
  uint64_t At(int rank, size_t offset) const { return data_.addresses[rank] + offset; }
  Status AcquireShared(int rank);
  Status ReleaseShared(int rank);
  Status AcquireExclusive();
  Status ReleaseExclusive();
  Status PutBytes(int rank, const void* data, size_t length, uint64_t address, ucp_rkey_h key);
  Status GetBytes(int rank, void* data, size_t length, uint64_t address, ucp_rkey_h key);

  UcxContext* ucx_ = nullptr;
  char* base_ = nullptr;
  Region data_;  // the window memory of every rank
  Region self_;  // every rank's tensor x
  bool freed_ = false;
  std::vector<char> scratch_;
};

StatusOr<std::shared_ptr<Window>> UcxWindow::Create(MPI_Comm comm, const std::string& name,
                                                    const TensorView& x, const Topology& topo,
                                                    bool zero_init) {
  std::shared_ptr<UcxWindow> w(new UcxWindow());
  WEFT_RETURN_IF_ERROR(w->Init(comm, name, x, topo));
  WEFT_ASSIGN_OR_RETURN(w->ucx_, UcxContext::Get(comm));
  w->ucx_->StartProgressThread();
  const size_t total = (w->TotalBytes() + 4095) / 4096 * 4096;
  void* base = nullptr;  // UCX allocates it
  WEFT_RETURN_IF_ERROR(Register(w->ucx_, comm, &base, total, &w->data_));
  w->base_ = static_cast<char*>(base);
  w->InitMemory(w->base_, zero_init);
  void* x_data = x.data();
  WEFT_RETURN_IF_ERROR(Register(w->ucx_, comm, &x_data, w->nbytes_, &w->self_));
  // Nobody puts before every rank has initialized its memory.
  WEFT_RETURN_IF_ERROR(MpiCheck(MPI_Barrier(comm), "MPI_Barrier"));
  return std::shared_ptr<Window>(w);
}

Status UcxWindow::Free() {
  if (freed_) return OkStatus();
  // Every rank's operations on this window are done once every rank got here.
  Status status = MpiCheck(MPI_Barrier(comm_), "MPI_Barrier");
  Release(ucx_, &self_);
  Release(ucx_, &data_);
  freed_ = true;
  return status;
}

Status UcxWindow::PutBytes(int rank, const void* data, size_t length, uint64_t address,
                           ucp_rkey_h key) {
  if (length == 0) return OkStatus();
  ucp_request_param_t param;
  param.op_attr_mask = 0;
  return ucx_->Wait(ucp_put_nbx(ucx_->ep(rank), data, length, address, key, &param),
                    "ucp_put_nbx");
}

Status UcxWindow::GetBytes(int rank, void* data, size_t length, uint64_t address,
                           ucp_rkey_h key) {
  if (length == 0) return OkStatus();
  ucp_request_param_t param;
  param.op_attr_mask = 0;
  WEFT_RETURN_IF_ERROR(ucx_->Wait(ucp_get_nbx(ucx_->ep(rank), data, length, address, key,
                                              &param),
                                  "ucp_get_nbx"));
  return ucx_->Flush(rank);  // the data is in `data` once the get is flushed
}

Status UcxWindow::AcquireShared(int rank) {
  for (int attempt = 0;; ++attempt) {
    uint64_t old = 0;
    WEFT_RETURN_IF_ERROR(ucx_->Atomic(rank, UCP_ATOMIC_OP_ADD, 1, &old,
                                      At(rank, kRwLockOffset), data_.rkeys[rank],
                                      "shared lock"));
    if ((old & kWriter) == 0) return OkStatus();
    // The target is updating: step back and retry.
    WEFT_RETURN_IF_ERROR(ucx_->Atomic(rank, UCP_ATOMIC_OP_ADD, static_cast<uint64_t>(-1),
                                      nullptr, At(rank, kRwLockOffset), data_.rkeys[rank],
                                      "shared lock"));
    ucp_worker_progress(ucx_->worker());
    if (attempt > 100) std::this_thread::yield();
  }
}

Status UcxWindow::ReleaseShared(int rank) {
  // Everything done under the lock is complete at the target before it is released.
  WEFT_RETURN_IF_ERROR(ucx_->Flush(rank));
  return ucx_->Atomic(rank, UCP_ATOMIC_OP_ADD, static_cast<uint64_t>(-1), nullptr,
                      At(rank, kRwLockOffset), data_.rkeys[rank], "shared unlock");
}

Status UcxWindow::AcquireExclusive() {
  // Through UCX too, not CPU atomics: a NIC's atomics need not be coherent with the CPU's.
  for (int attempt = 0;; ++attempt) {
    // UCP's compare-and-swap: `buffer` holds the expected value, the reply buffer the new
    // one on the way in and the old one on the way out.
    const uint64_t expected = 0;
    uint64_t swap = kWriter;
    ucp_request_param_t param;
    param.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
    param.datatype = ucp_dt_make_contig(8);
    param.reply_buffer = &swap;
    WEFT_RETURN_IF_ERROR(ucx_->Wait(
        ucp_atomic_op_nbx(ucx_->ep(rank_), UCP_ATOMIC_OP_CSWAP, &expected, 1,
                          At(rank_, kRwLockOffset), data_.rkeys[rank_], &param),
        "exclusive lock"));
    if (swap == 0) return OkStatus();  // it was free: ours now
    ucp_worker_progress(ucx_->worker());
    if (attempt > 100) std::this_thread::yield();
  }
}

Status UcxWindow::ReleaseExclusive() {
  return ucx_->Atomic(rank_, UCP_ATOMIC_OP_ADD, static_cast<uint64_t>(0) - kWriter, nullptr,
                      At(rank_, kRwLockOffset), data_.rkeys[rank_], "exclusive unlock");
}

Status UcxWindow::Put(const TensorView& x, const std::vector<std::pair<int, double>>& dsts,
                      bool accumulate) {
  WEFT_RETURN_IF_ERROR(CheckAlive());
  const size_t count = static_cast<size_t>(x.numel());
  const DType dtype = x.dtype();
  // Only this rank writes its p: no lock needed to read it (see MpiWindow::Put).
  double p_self = 0;
  std::memcpy(&p_self, base_ + kPSelfOffset, 8);
  std::vector<char> fetched;
  for (const auto& [dst, weight] : dsts) {
    const int slot = SlotAt(dst, rank_);
    const int k = InDegree(dst);
    const void* data = x.data();
    if (weight != 1.0) {
      scratch_.resize(nbytes_);
      WeightedSum(scratch_.data(), dtype, count, {{x.data(), weight}});
      data = scratch_.data();
    }
    const ucp_rkey_h key = data_.rkeys[dst];
    double p = weight * p_self;
    WEFT_RETURN_IF_ERROR(AcquireShared(dst));
    Status st;
    // When dst's memory is mapped into this process (shared memory on one machine), UCX
    // gives a local pointer to it: a put is one copy and an accumulate adds in place,
    // instead of a get, an add and a put through UCX (3x slower for 1 MiB).
    void* mapped = nullptr;
    const uint64_t slot_address = At(dst, SlotOffset(k, slot));
    const bool direct = nbytes_ > 0 && ucp_rkey_ptr(key, slot_address, &mapped) == UCS_OK;
    if (direct) {
      double old_p = 0;
      if (accumulate) {
        AddInPlace(mapped, data, dtype, count);
        st = GetBytes(dst, &old_p, 8, At(dst, POffset(k, slot)), key);
      } else {
        std::memcpy(mapped, data, nbytes_);
      }
      p += old_p;
    } else if (accumulate) {
      // Only this rank writes its slot at dst (and dst's own update, which the shared lock
      // keeps out), so a get-add-put is safe here.
      fetched.resize(nbytes_);
      st = GetBytes(dst, fetched.data(), nbytes_, At(dst, SlotOffset(k, slot)), key);
      double old_p = 0;
      if (st.ok()) st = GetBytes(dst, &old_p, 8, At(dst, POffset(k, slot)), key);
      if (st.ok()) {
        AddInPlace(fetched.data(), data, dtype, count);
        p += old_p;
        st = PutBytes(dst, fetched.data(), nbytes_, At(dst, SlotOffset(k, slot)), key);
      }
    } else {
      st = PutBytes(dst, data, nbytes_, slot_address, key);
    }
    if (st.ok()) st = PutBytes(dst, &p, 8, At(dst, POffset(k, slot)), key);
    if (st.ok()) {
      st = ucx_->Atomic(dst, UCP_ATOMIC_OP_ADD, 1, nullptr, At(dst, VersionOffset(slot)), key,
                        "version");
    }
    Status released = ReleaseShared(dst);
    WEFT_RETURN_IF_ERROR(st);
    WEFT_RETURN_IF_ERROR(released);
  }
  return OkStatus();
}

Status UcxWindow::Get(const std::vector<std::pair<int, double>>& srcs) {
  WEFT_RETURN_IF_ERROR(CheckAlive());
  std::vector<char> fetched(nbytes_);
  for (const auto& [src, weight] : srcs) {
    double p = 0;
    WEFT_RETURN_IF_ERROR(AcquireShared(src));
    Status st = GetBytes(src, fetched.data(), nbytes_, self_.addresses[src], self_.rkeys[src]);
    if (st.ok()) st = GetBytes(src, &p, 8, At(src, kPSelfOffset), data_.rkeys[src]);
    Status released = ReleaseShared(src);
    WEFT_RETURN_IF_ERROR(st);
    WEFT_RETURN_IF_ERROR(released);

    WEFT_RETURN_IF_ERROR(
        Locally([&, src = src, weight = weight] { StoreFetched(src, fetched.data(), weight, p); }));
  }
  return OkStatus();
}

StatusOr<bool> UcxWindow::TryLockMutexes(const std::vector<int>& ranks) {
  WEFT_RETURN_IF_ERROR(CheckAlive());
  for (int r : ranks) {
    if (std::binary_search(held_.begin(), held_.end(), r)) continue;
    ucp_request_param_t param;
    param.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
    param.datatype = ucp_dt_make_contig(8);
    const uint64_t expected = 0;                           // free
    uint64_t swap = static_cast<uint64_t>(rank_) + 1;      // in: ours; out: what was there
    param.reply_buffer = &swap;
    WEFT_RETURN_IF_ERROR(ucx_->Wait(ucp_atomic_op_nbx(ucx_->ep(r), UCP_ATOMIC_OP_CSWAP,
                                                      &expected, 1, At(r, kMutexOffset),
                                                      data_.rkeys[r], &param),
                                    "mutex compare-and-swap"));
    if (swap != 0) return false;  // held elsewhere: keep what we have, retry later
    held_.insert(std::upper_bound(held_.begin(), held_.end(), r), r);
  }
  return true;
}

Status UcxWindow::UnlockMutexes(const std::vector<int>& ranks) {
  WEFT_RETURN_IF_ERROR(CheckAlive());
  for (int r : ranks) {
    auto it = std::lower_bound(held_.begin(), held_.end(), r);
    if (it == held_.end() || *it != r) continue;
    uint64_t old = 0;
    WEFT_RETURN_IF_ERROR(ucx_->Atomic(r, UCP_ATOMIC_OP_SWAP, 0, &old, At(r, kMutexOffset),
                                      data_.rkeys[r], "mutex release"));
    held_.erase(it);
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::shared_ptr<Window>> CreateUcxWindow(MPI_Comm comm, const std::string& name,
                                                  const TensorView& x, const Topology& topo,
                                                  bool zero_init) {
  return UcxWindow::Create(comm, name, x, topo, zero_init);
}

bool ProgressUcxWindows() {
  UcxContext* ucx = UcxContext::IfExists();
  return ucx != nullptr && ucp_worker_progress(ucx->worker()) > 0;
}

}  // namespace comm
}  // namespace weft
