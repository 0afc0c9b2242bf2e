// The process model, the process's topology, requests and every comm op in the C ABI.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "capi/internal.h"
#include "comm/comm.h"
#include "comm/refuse.h"
#include "comm/topology.h"
#include "core/host_pool.h"

namespace weft {
namespace capi {

// An output weft allocates (allgather's, once the ranks agree on its shape, and
// weft_tensor_empty_like's), handed to the caller as a DLManagedTensor whose deleter frees
// it. One malloc'd block holds the header, the shape and, below HostPool's cached sizes,
// the data (inside it, aligned as HostPool aligns its blocks); larger data comes from the
// process's HostPool, which keeps freed blocks for the next output of their size. Small
// outputs take one plain malloc: glibc (2.36) serves posix_memalign of 64-byte alignment on
// its slow path, past its per-thread cache, and with the header and the shape allocated
// apart a 4 KiB output took 0.42-0.70 us from Python (weft_tensor_empty_like) on the
// development VM, 0.28 in one block.
struct ManagedOutput {
  DLManagedTensor managed;
  void* data = nullptr;
  size_t bytes = 0;
  bool pooled = false;  // data from HostPool (else inside this block)

  absl::Span<const int64_t> shape() const {
    return {managed.dl_tensor.shape, static_cast<size_t>(managed.dl_tensor.ndim)};
  }

  static StatusOr<ManagedOutput*> New(DType dtype, absl::Span<const int64_t> shape) {
    constexpr size_t kAlign = HostPool::kAlignment;
    const size_t bytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
    const bool pooled = bytes >= HostPool::kMinCachedBytes;
    const size_t header = sizeof(ManagedOutput) + shape.size() * sizeof(int64_t);
    // Never a NULL data pointer: an empty result still gets a valid one.
    const size_t total = header + (pooled ? 0 : kAlign - 1 + std::max<size_t>(bytes, 1));
    void* block = std::malloc(total);
    void* data = nullptr;
    if (block != nullptr) {
      const auto inside = reinterpret_cast<uintptr_t>(block) + header;
      data = pooled ? HostPool::Global().Allocate(bytes)
                    : reinterpret_cast<void*>((inside + kAlign - 1) / kAlign * kAlign);
    }
    if (data == nullptr) {
      std::free(block);
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes for the op's output"));
    }
    auto* out = new (block) ManagedOutput();
    auto* dims = reinterpret_cast<int64_t*>(out + 1);
    std::copy(shape.begin(), shape.end(), dims);
    out->data = data;
    out->bytes = bytes;
    out->pooled = pooled;
    DLTensor& dl = out->managed.dl_tensor;
    dl.data = data;
    dl.device = DLDevice{kDLCPU, 0};
    dl.ndim = static_cast<int32_t>(shape.size());
    dl.dtype = ToDLDataType(dtype);
    dl.shape = dims;
    dl.strides = nullptr;  // contiguous
    dl.byte_offset = 0;
    out->managed.manager_ctx = out;
    out->managed.deleter = &ManagedOutput::Delete;
    return out;
  }

  static void Delete(DLManagedTensor* self) {
    auto* owner = static_cast<ManagedOutput*>(self->manager_ctx);
    if (owner->pooled) HostPool::Global().Release(owner->data, owner->bytes);
    owner->~ManagedOutput();
    std::free(owner);
  }
};
static_assert(alignof(ManagedOutput) >= alignof(int64_t), "the shape follows the header");

// Where the allocator leaves the output until the caller takes it.
struct OutputSlot {
  std::mutex mu;
  ManagedOutput* output = nullptr;  // owned until taken
  bool taken = false;
  ~OutputSlot() {
    if (output != nullptr) ManagedOutput::Delete(&output->managed);
  }
  DLManagedTensor* Take() {
    std::lock_guard<std::mutex> lock(mu);
    return TakeLocked();
  }
  DLManagedTensor* TakeLocked() {  // requires mu
    ManagedOutput* out = output;
    output = nullptr;
    taken = true;
    return out == nullptr ? nullptr : &out->managed;
  }
};

Allocator SlotAllocator(const std::shared_ptr<OutputSlot>& slot) {
  return [slot](DType dtype, const std::vector<int64_t>& shape) -> StatusOr<TensorView> {
    WEFT_ASSIGN_OR_RETURN(ManagedOutput * out, ManagedOutput::New(dtype, shape));
    TensorView view(out->data, dtype, out->shape());
    std::lock_guard<std::mutex> lock(slot->mu);
    if (slot->output != nullptr) ManagedOutput::Delete(&slot->output->managed);
    slot->output = out;
    return view;
  };
}

namespace {

StatusOr<NeighborAllreduceOptions> ToOptions(const weft_neighbor_allreduce_options* o,
                                             const char* fn) {
  NeighborAllreduceOptions options;
  if (o == nullptr) return options;
  WEFT_RETURN_IF_ERROR(CheckVersion(o->version, WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_VERSION, fn,
                                    "weft_neighbor_allreduce_options",
                                    "WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_INIT"));
  if (o->has_weights) {
    if (o->num_src > 0 && o->src_weights == nullptr) {
      return InvalidArgument(fn, ": num_src is ", o->num_src, " but src_weights is NULL");
    }
    options.self_weight = o->self_weight;
    WEFT_ASSIGN_OR_RETURN(options.src_weights,
                          WeightMap(o->src_ranks, o->src_weights, o->num_src, fn, "src_ranks"));
  } else if (o->num_src > 0) {
    return InvalidArgument(fn, ": src_ranks given without has_weights = 1 (self_weight and "
                           "src_weights go together)");
  }
  if (o->has_dst) {
    WEFT_ASSIGN_OR_RETURN(options.dst_weights,
                          WeightMap(o->dst_ranks, o->dst_weights, o->num_dst, fn, "dst_ranks"));
  } else if (o->num_dst > 0) {
    return InvalidArgument(fn, ": dst_ranks given without has_dst = 1");
  }
  options.enable_topo_check = o->enable_topo_check != 0;
  return options;
}

StatusOr<NeighborAllgatherOptions> ToOptions(const weft_neighbor_allgather_options* o,
                                             const char* fn) {
  NeighborAllgatherOptions options;
  if (o == nullptr) return options;
  WEFT_RETURN_IF_ERROR(CheckVersion(o->version, WEFT_NEIGHBOR_ALLGATHER_OPTIONS_VERSION, fn,
                                    "weft_neighbor_allgather_options",
                                    "WEFT_NEIGHBOR_ALLGATHER_OPTIONS_INIT"));
  if (!o->has_ranks) {
    if (o->num_src > 0 || o->num_dst > 0) {
      return InvalidArgument(fn, ": src_ranks/dst_ranks given without has_ranks = 1");
    }
    return options;
  }
  if ((o->num_src > 0 && o->src_ranks == nullptr) || (o->num_dst > 0 && o->dst_ranks == nullptr)) {
    return InvalidArgument(fn, ": a rank count is non-zero but its array is NULL");
  }
  options.src_ranks = std::vector<int>(o->src_ranks, o->src_ranks + o->num_src);
  options.dst_ranks = std::vector<int>(o->dst_ranks, o->dst_ranks + o->num_dst);
  return options;
}

StatusOr<HierarchicalNeighborAllreduceOptions> ToOptions(const weft_hierarchical_options* o,
                                                         const char* fn) {
  HierarchicalNeighborAllreduceOptions options;
  if (o == nullptr) return options;
  WEFT_RETURN_IF_ERROR(CheckVersion(o->version, WEFT_HIERARCHICAL_OPTIONS_VERSION, fn,
                                    "weft_hierarchical_options",
                                    "WEFT_HIERARCHICAL_OPTIONS_INIT"));
  if (o->has_weights) {
    if (o->num_src > 0 && o->src_machine_weights == nullptr) {
      return InvalidArgument(fn, ": num_src is ", o->num_src,
                             " but src_machine_weights is NULL");
    }
    options.self_weight = o->self_weight;
    WEFT_ASSIGN_OR_RETURN(options.src_machine_weights,
                          WeightMap(o->src_machines, o->src_machine_weights, o->num_src, fn,
                                    "src_machines"));
  } else if (o->num_src > 0) {
    return InvalidArgument(fn, ": src_machines given without has_weights = 1");
  }
  if (o->has_dst) {
    WEFT_ASSIGN_OR_RETURN(options.dst_machine_weights,
                          WeightMap(o->dst_machines, o->dst_machine_weights, o->num_dst, fn,
                                    "dst_machines"));
  } else if (o->num_dst > 0) {
    return InvalidArgument(fn, ": dst_machines given without has_dst = 1");
  }
  return options;
}

// A process set from (ranks, num_ranks); num_ranks = 0 is every rank. The C++ layer checks
// the ranks themselves (range, duplicates, the caller among them).
StatusOr<std::vector<int>> ProcessSet(const int* ranks, size_t num_ranks, const char* fn) {
  if (num_ranks > 0 && ranks == nullptr) {
    return InvalidArgument(fn, ": num_ranks is ", num_ranks, " but ranks is NULL");
  }
  return std::vector<int>(ranks, ranks + num_ranks);
}

}  // namespace
}  // namespace capi
}  // namespace weft

struct weft_request {
  weft::Handle handle;
  std::shared_ptr<weft::capi::OutputSlot> output;  // allgather ops and recv_any only
};

using weft::Status;
using weft::StatusOr;
using weft::TensorView;
using weft::capi::Guard;
using weft::capi::Identity;
using weft::capi::NameOrEmpty;
using weft::capi::ProcessSet;
using weft::capi::Required;
using weft::capi::ToOptions;
using weft::capi::View;
using weft::comm::OpIdentity;
using weft::comm::OpType;

namespace {

// Wraps a started op in a request for the caller.
Status Emit(weft_request** request, StatusOr<weft::Handle> handle, const char* function,
            std::shared_ptr<weft::capi::OutputSlot> output = nullptr) {
  if (!handle.ok()) return handle.status();
  auto r = std::make_unique<weft_request>();
  r->handle = std::move(*handle);
  r->output = std::move(output);
  *request = r.release();
  return weft::OkStatus();
}

}  // namespace

Status weft::capi::EmitRequest(weft_request** request, StatusOr<weft::Handle> handle) {
  return Emit(request, std::move(handle), "");
}

namespace {

// An option struct the C ABI refuses, refused as the op it belongs to.
template <typename T>
StatusOr<T> Refusing(StatusOr<T> value, const OpIdentity& id) {
  if (!value.ok()) return weft::comm::RefuseOp(id, value.status());
  return value;
}

OpIdentity PeerIdentity(bool sending, int peer, const char* name) {
  OpIdentity id = Identity(OpType::kSendRecv, name);
  (sending ? id.send_to : id.recv_from) = peer;
  return id;
}

// The common shape of ops with an input and a same-layout output.
template <typename Start>
weft_status InOutOp(const char* fn, weft_request** request, const DLTensor* in, DLTensor* out,
                    const OpIdentity& id, Start&& start) {
  return Guard(fn, [&]() -> Status {
    if (request != nullptr) *request = nullptr;
    StatusOr<TensorView> input = View(in, fn, "in");
    if (!input.ok()) return weft::comm::RefuseOp(id, input.status());
    StatusOr<TensorView> output = View(out, fn, "out");
    if (!output.ok()) return weft::comm::RefuseOp(id, output.status());
    return start(*input, *output);
  });
}

// The tensor of a send or recv, refused as that op when the C ABI cannot describe it.
StatusOr<TensorView> PeerView(const DLTensor* tensor, const char* fn, const OpIdentity& id) {
  StatusOr<TensorView> view = View(tensor, fn, id.send_to >= 0 ? "in" : "out");
  if (!view.ok()) return weft::comm::RefuseOp(id, view.status());
  return view;
}

// Ops whose output weft allocates (allgather ops, recv_any): run, then hand the
// library-allocated result to the caller.
template <typename Run>
weft_status AllocatingOp(const char* fn, DLManagedTensor** out, Run&& run) {
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(out, fn, "out"));
    *out = nullptr;
    auto slot = std::make_shared<weft::capi::OutputSlot>();
    WEFT_RETURN_IF_ERROR(run(weft::capi::SlotAllocator(slot)).status());
    *out = slot->Take();
    return weft::OkStatus();
  });
}

template <typename Start>
weft_status AllocatingOpNonblocking(const char* fn, weft_request** request, Start&& start) {
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(request, fn, "request"));
    *request = nullptr;
    auto slot = std::make_shared<weft::capi::OutputSlot>();
    StatusOr<weft::Handle> handle = start(weft::capi::SlotAllocator(slot));
    if (handle.ok()) handle->keep_alive(slot);
    return Emit(request, std::move(handle), fn, slot);
  });
}

// Allgather ops: the same, with an input.
template <typename Run>
weft_status GatherOp(const char* fn, DLManagedTensor** out, const DLTensor* in,
                     const OpIdentity& id, Run&& run) {
  return AllocatingOp(fn, out, [&](weft::Allocator alloc) -> StatusOr<TensorView> {
    StatusOr<TensorView> input = View(in, fn, "in");
    if (!input.ok()) return weft::comm::RefuseOp(id, input.status());
    return run(*input, std::move(alloc));
  });
}

template <typename Start>
weft_status GatherOpNonblocking(const char* fn, weft_request** request, const DLTensor* in,
                                const OpIdentity& id, Start&& start) {
  return AllocatingOpNonblocking(fn, request, [&](weft::Allocator alloc) -> StatusOr<weft::Handle> {
    StatusOr<TensorView> input = View(in, fn, "in");
    if (!input.ok()) return weft::comm::RefuseOp(id, input.status());
    return start(*input, std::move(alloc));
  });
}

Status TopologyOut(weft_topology** out, weft::Topology topo, const char* fn) {
  WEFT_RETURN_IF_ERROR(Required(out, fn, "out"));
  if (!weft::is_initialized()) {
    return weft::FailedPrecondition(fn, ": weft is not initialized; call init() first");
  }
  *out = new weft_topology{std::move(topo)};
  return weft::OkStatus();
}

}  // namespace

extern "C" {

void weft_abort(int code) { weft::abort_job(code); }

void weft_comm_claim_call_order(void) { weft::claim_call_order(); }

weft_status weft_neighbor_allreduce_options_init(weft_neighbor_allreduce_options* options,
                                                 unsigned int version) {
  return weft::capi::InitOptions(
      options, version, WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_VERSION,
      "weft_neighbor_allreduce_options_init", "WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_VERSION",
      weft_neighbor_allreduce_options WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_INIT);
}

weft_status weft_neighbor_allgather_options_init(weft_neighbor_allgather_options* options,
                                                 unsigned int version) {
  return weft::capi::InitOptions(
      options, version, WEFT_NEIGHBOR_ALLGATHER_OPTIONS_VERSION,
      "weft_neighbor_allgather_options_init", "WEFT_NEIGHBOR_ALLGATHER_OPTIONS_VERSION",
      weft_neighbor_allgather_options WEFT_NEIGHBOR_ALLGATHER_OPTIONS_INIT);
}

weft_status weft_hierarchical_options_init(weft_hierarchical_options* options,
                                           unsigned int version) {
  return weft::capi::InitOptions(options, version, WEFT_HIERARCHICAL_OPTIONS_VERSION,
                                 "weft_hierarchical_options_init",
                                 "WEFT_HIERARCHICAL_OPTIONS_VERSION",
                                 weft_hierarchical_options WEFT_HIERARCHICAL_OPTIONS_INIT);
}

weft_status weft_init(void) {
  return Guard("weft_init", [] { return weft::init(); });
}

weft_status weft_shutdown(void) {
  return Guard("weft_shutdown", [] { return weft::shutdown(); });
}

weft_status weft_finalize(void) {
  return Guard("weft_finalize", [] { return weft::finalize(); });
}

int weft_is_initialized(void) { return weft::is_initialized() ? 1 : 0; }
int weft_rank(void) { return weft::rank(); }
int weft_size(void) { return weft::size(); }
int weft_local_rank(void) { return weft::local_rank(); }
int weft_local_size(void) { return weft::local_size(); }
int weft_machine_rank(void) { return weft::machine_rank(); }
int weft_machine_size(void) { return weft::machine_size(); }
int weft_is_homogeneous(void) { return weft::is_homogeneous(); }
int weft_nccl_built(void) { return weft::nccl_built() ? 1 : 0; }

weft_status weft_unified_mpi_window_model(int* result) {
  return Guard("weft_unified_mpi_window_model", [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(result, "weft_unified_mpi_window_model", "result"));
    WEFT_ASSIGN_OR_RETURN(bool unified, weft::unified_mpi_window_model());
    *result = unified ? 1 : 0;
    return weft::OkStatus();
  });
}

weft_status weft_comm_set_topology(const weft_topology* topo, int is_weighted) {
  return Guard("weft_comm_set_topology", [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(topo, "weft_comm_set_topology", "topo"));
    return weft::set_topology(topo->topo, is_weighted != 0);
  });
}

weft_status weft_comm_load_topology(weft_topology** out) {
  return Guard("weft_comm_load_topology", [&] {
    return TopologyOut(out, weft::load_topology(), "weft_comm_load_topology");
  });
}

int weft_comm_is_topo_weighted(void) { return weft::is_topo_weighted() ? 1 : 0; }

weft_status weft_comm_in_neighbor_ranks(int* ranks, size_t capacity, size_t* count) {
  const char* fn = "weft_comm_in_neighbor_ranks";
  return Guard(fn, [&]() -> Status {
    if (!weft::is_initialized()) {
      return weft::FailedPrecondition(fn, ": weft is not initialized; call init() first");
    }
    return weft::capi::CopyOut(weft::in_neighbor_ranks(), ranks, capacity, count, fn);
  });
}

weft_status weft_comm_out_neighbor_ranks(int* ranks, size_t capacity, size_t* count) {
  const char* fn = "weft_comm_out_neighbor_ranks";
  return Guard(fn, [&]() -> Status {
    if (!weft::is_initialized()) {
      return weft::FailedPrecondition(fn, ": weft is not initialized; call init() first");
    }
    return weft::capi::CopyOut(weft::out_neighbor_ranks(), ranks, capacity, count, fn);
  });
}

weft_status weft_comm_set_machine_topology(const weft_topology* topo, int is_weighted) {
  return Guard("weft_comm_set_machine_topology", [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(topo, "weft_comm_set_machine_topology", "topo"));
    return weft::set_machine_topology(topo->topo, is_weighted != 0);
  });
}

weft_status weft_comm_load_machine_topology(weft_topology** out) {
  return Guard("weft_comm_load_machine_topology", [&] {
    return TopologyOut(out, weft::load_machine_topology(), "weft_comm_load_machine_topology");
  });
}

weft_status weft_request_poll(int* done, const weft_request* request) {
  return Guard("weft_request_poll", [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(done, "weft_request_poll", "done"));
    WEFT_RETURN_IF_ERROR(Required(request, "weft_request_poll", "request"));
    *done = weft::poll(request->handle) ? 1 : 0;
    return weft::OkStatus();
  });
}

weft_status weft_request_wait(weft_request* request) {
  return Guard("weft_request_wait", [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(request, "weft_request_wait", "request"));
    return weft::wait(request->handle);
  });
}

weft_status weft_request_take_output(DLManagedTensor** out, weft_request* request) {
  const char* fn = "weft_request_take_output";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(out, fn, "out"));
    *out = nullptr;
    WEFT_RETURN_IF_ERROR(Required(request, fn, "request"));
    if (request->output == nullptr) {
      return weft::InvalidArgument(fn, ": this request's op writes into the caller's output; "
                                   "only allgather ops and weft_comm_recv_any have an output "
                                   "to take");
    }
    if (!weft::poll(request->handle)) {
      return weft::FailedPrecondition(fn, ": the op has not completed; call "
                                      "weft_request_wait first");
    }
    WEFT_RETURN_IF_ERROR(weft::wait(request->handle));
    // Checked and taken under one lock: two threads taking at once get the output once,
    // and the other this error (not a null output reported as taken).
    std::lock_guard<std::mutex> lock(request->output->mu);
    if (request->output->taken) {
      return weft::FailedPrecondition(fn, ": the output was already taken");
    }
    *out = request->output->TakeLocked();
    return weft::OkStatus();
  });
}

weft_status weft_request_keep_alive(weft_request* request, void* owner,
                                    void (*release)(void* owner)) {
  return Guard("weft_request_keep_alive", [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(request, "weft_request_keep_alive", "request"));
    WEFT_RETURN_IF_ERROR(
        Required(reinterpret_cast<const void*>(release), "weft_request_keep_alive", "release"));
    request->handle.keep_alive(std::shared_ptr<void>(owner, release));
    return weft::OkStatus();
  });
}

void weft_request_free(weft_request* request) { delete request; }

weft_status weft_comm_allreduce(const DLTensor* in, DLTensor* out, int average,
                                const char* name) {
  return InOutOp("weft_comm_allreduce", nullptr, in, out, Identity(OpType::kAllreduce, name),
                 [&](const TensorView& i, const TensorView& o) {
                   return weft::allreduce(i, o, average != 0, NameOrEmpty(name));
                 });
}

weft_status weft_comm_allreduce_nonblocking(weft_request** request, const DLTensor* in,
                                            DLTensor* out, int average, const char* name) {
  const char* fn = "weft_comm_allreduce_nonblocking";
  if (request == nullptr) return weft::capi::FailInvalid(std::string(fn) + ": request is NULL");
  return InOutOp(fn, request, in, out, Identity(OpType::kAllreduce, name),
                 [&](const TensorView& i, const TensorView& o) {
                   return Emit(request,
                               weft::allreduce_nonblocking(i, o, average != 0, NameOrEmpty(name)),
                               fn);
                 });
}

weft_status weft_comm_broadcast(const DLTensor* in, DLTensor* out, int root_rank,
                                const char* name) {
  return InOutOp("weft_comm_broadcast", nullptr, in, out, Identity(OpType::kBroadcast, name),
                 [&](const TensorView& i, const TensorView& o) {
                   return weft::broadcast(i, o, root_rank, NameOrEmpty(name));
                 });
}

weft_status weft_comm_broadcast_nonblocking(weft_request** request, const DLTensor* in,
                                            DLTensor* out, int root_rank, const char* name) {
  const char* fn = "weft_comm_broadcast_nonblocking";
  if (request == nullptr) return weft::capi::FailInvalid(std::string(fn) + ": request is NULL");
  return InOutOp(fn, request, in, out, Identity(OpType::kBroadcast, name),
                 [&](const TensorView& i, const TensorView& o) {
                   return Emit(request,
                               weft::broadcast_nonblocking(i, o, root_rank, NameOrEmpty(name)), fn);
                 });
}

weft_status weft_comm_allreduce_ranks(const DLTensor* in, DLTensor* out, int average,
                                      const int* ranks, size_t num_ranks, const char* name) {
  const char* fn = "weft_comm_allreduce_ranks";
  return InOutOp(fn, nullptr, in, out, Identity(OpType::kAllreduce, name, ranks, num_ranks),
                 [&](const TensorView& i, const TensorView& o) -> Status {
                   WEFT_ASSIGN_OR_RETURN(auto set, ProcessSet(ranks, num_ranks, fn));
                   return weft::allreduce(i, o, average != 0, NameOrEmpty(name), set);
                 });
}

weft_status weft_comm_allreduce_ranks_nonblocking(weft_request** request, const DLTensor* in,
                                                  DLTensor* out, int average, const int* ranks,
                                                  size_t num_ranks, const char* name) {
  const char* fn = "weft_comm_allreduce_ranks_nonblocking";
  if (request == nullptr) return weft::capi::FailInvalid(std::string(fn) + ": request is NULL");
  return InOutOp(fn, request, in, out, Identity(OpType::kAllreduce, name, ranks, num_ranks),
                 [&](const TensorView& i, const TensorView& o) -> Status {
                   WEFT_ASSIGN_OR_RETURN(auto set, ProcessSet(ranks, num_ranks, fn));
                   return Emit(
                       request,
                       weft::allreduce_nonblocking(i, o, average != 0, NameOrEmpty(name), set), fn);
                 });
}

weft_status weft_comm_broadcast_ranks(const DLTensor* in, DLTensor* out, int root_rank,
                                      const int* ranks, size_t num_ranks, const char* name) {
  const char* fn = "weft_comm_broadcast_ranks";
  return InOutOp(fn, nullptr, in, out, Identity(OpType::kBroadcast, name, ranks, num_ranks),
                 [&](const TensorView& i, const TensorView& o) -> Status {
                   WEFT_ASSIGN_OR_RETURN(auto set, ProcessSet(ranks, num_ranks, fn));
                   return weft::broadcast(i, o, root_rank, NameOrEmpty(name), set);
                 });
}

weft_status weft_comm_broadcast_ranks_nonblocking(weft_request** request, const DLTensor* in,
                                                  DLTensor* out, int root_rank,
                                                  const int* ranks, size_t num_ranks,
                                                  const char* name) {
  const char* fn = "weft_comm_broadcast_ranks_nonblocking";
  if (request == nullptr) return weft::capi::FailInvalid(std::string(fn) + ": request is NULL");
  return InOutOp(fn, request, in, out, Identity(OpType::kBroadcast, name, ranks, num_ranks),
                 [&](const TensorView& i, const TensorView& o) -> Status {
                   WEFT_ASSIGN_OR_RETURN(auto set, ProcessSet(ranks, num_ranks, fn));
                   return Emit(request,
                               weft::broadcast_nonblocking(i, o, root_rank, NameOrEmpty(name), set),
                               fn);
                 });
}

weft_status weft_tensor_empty_like(DLManagedTensor** out, const DLTensor* like) {
  const char* fn = "weft_tensor_empty_like";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(out, fn, "out"));
    *out = nullptr;
    WEFT_ASSIGN_OR_RETURN(TensorView view, View(like, fn, "like"));
    if (view.device().type != weft::Device::Type::kCPU) {
      return weft::InvalidArgument(fn, ": like is on ", view.device().ToString(),
                                   "; weft allocates host (CPU) outputs only");
    }
    WEFT_ASSIGN_OR_RETURN(weft::capi::ManagedOutput * output,
                          weft::capi::ManagedOutput::New(view.dtype(), view.shape()));
    *out = &output->managed;
    return weft::OkStatus();
  });
}

weft_status weft_comm_allgather(DLManagedTensor** out, const DLTensor* in, const char* name) {
  return GatherOp("weft_comm_allgather", out, in, Identity(OpType::kAllgather, name),
                  [&](const TensorView& i, weft::Allocator alloc) {
                    return weft::allgather(i, std::move(alloc), NameOrEmpty(name));
                  });
}

weft_status weft_comm_allgather_nonblocking(weft_request** request, const DLTensor* in,
                                            const char* name) {
  return GatherOpNonblocking("weft_comm_allgather_nonblocking", request, in,
                             Identity(OpType::kAllgather, name),
                             [&](const TensorView& i, weft::Allocator alloc) {
                               return weft::allgather_nonblocking(i, std::move(alloc),
                                                                  NameOrEmpty(name));
                             });
}

weft_status weft_comm_neighbor_allgather(DLManagedTensor** out, const DLTensor* in,
                                         const weft_neighbor_allgather_options* options,
                                         const char* name) {
  const char* fn = "weft_comm_neighbor_allgather";
  return GatherOp(fn, out, in, Identity(OpType::kNeighborAllgather, name),
                  [&](const TensorView& i, weft::Allocator alloc) -> StatusOr<TensorView> {
                    WEFT_ASSIGN_OR_RETURN(auto opts,
                                          Refusing(ToOptions(options, fn),
                                                   Identity(OpType::kNeighborAllgather, name)));
                    return weft::neighbor_allgather(i, std::move(alloc), opts, NameOrEmpty(name));
                  });
}

weft_status weft_comm_neighbor_allgather_nonblocking(
    weft_request** request, const DLTensor* in, const weft_neighbor_allgather_options* options,
    const char* name) {
  const char* fn = "weft_comm_neighbor_allgather_nonblocking";
  return GatherOpNonblocking(
      fn, request, in, Identity(OpType::kNeighborAllgather, name),
      [&](const TensorView& i, weft::Allocator alloc) -> StatusOr<weft::Handle> {
        WEFT_ASSIGN_OR_RETURN(auto opts, Refusing(ToOptions(options, fn),
                                                  Identity(OpType::kNeighborAllgather, name)));
        return weft::neighbor_allgather_nonblocking(i, std::move(alloc), opts, NameOrEmpty(name));
      });
}

weft_status weft_comm_neighbor_allreduce(const DLTensor* in, DLTensor* out,
                                         const weft_neighbor_allreduce_options* options,
                                         const char* name) {
  const char* fn = "weft_comm_neighbor_allreduce";
  return InOutOp(fn, nullptr, in, out, Identity(OpType::kNeighborAllreduce, name),
                 [&](const TensorView& i, const TensorView& o) -> Status {
                   WEFT_ASSIGN_OR_RETURN(auto opts,
                                         Refusing(ToOptions(options, fn),
                                                  Identity(OpType::kNeighborAllreduce, name)));
                   return weft::neighbor_allreduce(i, o, opts, NameOrEmpty(name));
                 });
}

weft_status weft_comm_neighbor_allreduce_nonblocking(
    weft_request** request, const DLTensor* in, DLTensor* out,
    const weft_neighbor_allreduce_options* options, const char* name) {
  const char* fn = "weft_comm_neighbor_allreduce_nonblocking";
  if (request == nullptr) return weft::capi::FailInvalid(std::string(fn) + ": request is NULL");
  return InOutOp(
      fn, request, in, out, Identity(OpType::kNeighborAllreduce, name),
      [&](const TensorView& i, const TensorView& o) -> Status {
        WEFT_ASSIGN_OR_RETURN(auto opts, Refusing(ToOptions(options, fn),
                                                  Identity(OpType::kNeighborAllreduce, name)));
        return Emit(request, weft::neighbor_allreduce_nonblocking(i, o, opts, NameOrEmpty(name)),
                    fn);
      });
}

weft_status weft_comm_hierarchical_neighbor_allreduce(const DLTensor* in, DLTensor* out,
                                                      const weft_hierarchical_options* options,
                                                      const char* name) {
  const char* fn = "weft_comm_hierarchical_neighbor_allreduce";
  return InOutOp(fn, nullptr, in, out, Identity(OpType::kHierarchicalNeighborAllreduce, name),
                 [&](const TensorView& i, const TensorView& o) -> Status {
                   WEFT_ASSIGN_OR_RETURN(
                       auto opts, Refusing(ToOptions(options, fn),
                                           Identity(OpType::kHierarchicalNeighborAllreduce, name)));
                   return weft::hierarchical_neighbor_allreduce(i, o, opts, NameOrEmpty(name));
                 });
}

weft_status weft_comm_hierarchical_neighbor_allreduce_nonblocking(
    weft_request** request, const DLTensor* in, DLTensor* out,
    const weft_hierarchical_options* options, const char* name) {
  const char* fn = "weft_comm_hierarchical_neighbor_allreduce_nonblocking";
  if (request == nullptr) return weft::capi::FailInvalid(std::string(fn) + ": request is NULL");
  return InOutOp(
      fn, request, in, out, Identity(OpType::kHierarchicalNeighborAllreduce, name),
      [&](const TensorView& i, const TensorView& o) -> Status {
        WEFT_ASSIGN_OR_RETURN(auto opts,
                              Refusing(ToOptions(options, fn),
                                       Identity(OpType::kHierarchicalNeighborAllreduce, name)));
        return Emit(
            request,
            weft::hierarchical_neighbor_allreduce_nonblocking(i, o, opts, NameOrEmpty(name)), fn);
      });
}

weft_status weft_comm_pair_gossip(const DLTensor* in, DLTensor* out, int peer,
                                  double self_weight, double pair_weight, const char* name) {
  return InOutOp("weft_comm_pair_gossip", nullptr, in, out, Identity(OpType::kPairGossip, name),
                 [&](const TensorView& i, const TensorView& o) {
                   return weft::pair_gossip(i, o, peer, self_weight, pair_weight,
                                            NameOrEmpty(name));
                 });
}

weft_status weft_comm_pair_gossip_nonblocking(weft_request** request, const DLTensor* in,
                                              DLTensor* out, int peer, double self_weight,
                                              double pair_weight, const char* name) {
  const char* fn = "weft_comm_pair_gossip_nonblocking";
  if (request == nullptr) return weft::capi::FailInvalid(std::string(fn) + ": request is NULL");
  return InOutOp(fn, request, in, out, Identity(OpType::kPairGossip, name),
                 [&](const TensorView& i, const TensorView& o) {
                   return Emit(request,
                               weft::pair_gossip_nonblocking(i, o, peer, self_weight, pair_weight,
                                                             NameOrEmpty(name)),
                               fn);
                 });
}

weft_status weft_comm_send(const DLTensor* in, int dst, const char* name) {
  const char* fn = "weft_comm_send";
  return Guard(fn, [&]() -> Status {
    WEFT_ASSIGN_OR_RETURN(TensorView input, PeerView(in, fn, PeerIdentity(true, dst, name)));
    return weft::send(input, dst, NameOrEmpty(name));
  });
}

weft_status weft_comm_send_nonblocking(weft_request** request, const DLTensor* in, int dst,
                                       const char* name) {
  const char* fn = "weft_comm_send_nonblocking";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(request, fn, "request"));
    *request = nullptr;
    WEFT_ASSIGN_OR_RETURN(TensorView input, PeerView(in, fn, PeerIdentity(true, dst, name)));
    return Emit(request, weft::send_nonblocking(input, dst, NameOrEmpty(name)), fn);
  });
}

weft_status weft_comm_recv(DLTensor* out, int src, const char* name) {
  const char* fn = "weft_comm_recv";
  return Guard(fn, [&]() -> Status {
    WEFT_ASSIGN_OR_RETURN(TensorView output, PeerView(out, fn, PeerIdentity(false, src, name)));
    return weft::recv(output, src, NameOrEmpty(name));
  });
}

weft_status weft_comm_recv_nonblocking(weft_request** request, DLTensor* out, int src,
                                       const char* name) {
  const char* fn = "weft_comm_recv_nonblocking";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(request, fn, "request"));
    *request = nullptr;
    WEFT_ASSIGN_OR_RETURN(TensorView output, PeerView(out, fn, PeerIdentity(false, src, name)));
    return Emit(request, weft::recv_nonblocking(output, src, NameOrEmpty(name)), fn);
  });
}

weft_status weft_comm_recv_any(DLManagedTensor** out, int src, const char* name) {
  return AllocatingOp("weft_comm_recv_any", out, [&](weft::Allocator alloc) {
    return weft::recv(std::move(alloc), src, NameOrEmpty(name));
  });
}

weft_status weft_comm_recv_any_nonblocking(weft_request** request, int src, const char* name) {
  return AllocatingOpNonblocking("weft_comm_recv_any_nonblocking", request,
                                 [&](weft::Allocator alloc) {
                                   return weft::recv_nonblocking(std::move(alloc), src,
                                                                 NameOrEmpty(name));
                                 });
}

weft_status weft_comm_refuse(weft_op op, const char* name, const int* ranks, size_t num_ranks,
                             int peer, weft_status code, const char* message) {
  const char* fn = "weft_comm_refuse";
  const int op_value = weft::capi::EnumValue(op);
  const int code_value = weft::capi::EnumValue(code);
  // Checked before anything is refused: a misused refusal must not take an op's place.
  if (code_value <= WEFT_OK || code_value > WEFT_ERR_UNKNOWN) {
    return weft::capi::Fail(weft::InvalidArgument(
        fn, ": code is ", code_value, "; pass the weft_status (not WEFT_OK) the op fails with"));
  }
  static constexpr OpType kOps[] = {
      OpType::kAllreduce,         OpType::kBroadcast,
      OpType::kAllgather,         OpType::kNeighborAllgather,
      OpType::kNeighborAllreduce, OpType::kHierarchicalNeighborAllreduce,
      OpType::kPairGossip,        OpType::kSendRecv,
      OpType::kSendRecv,          OpType::kWinCreate};
  if (op_value < 0 || op_value > WEFT_OP_WIN_CREATE) {
    return weft::capi::Fail(weft::InvalidArgument(fn, ": op is ", op_value, ", not a weft_op"));
  }
  if (num_ranks > 0 && ranks == nullptr) {
    return weft::capi::Fail(
        weft::InvalidArgument(fn, ": num_ranks is ", num_ranks, " but ranks is NULL"));
  }
  OpIdentity id = Identity(kOps[op_value], name);
  if (op_value == WEFT_OP_ALLREDUCE || op_value == WEFT_OP_BROADCAST) {
    id.ranks.assign(ranks, ranks + num_ranks);
  }
  if (op_value == WEFT_OP_SEND) id.send_to = peer;
  if (op_value == WEFT_OP_RECV) id.recv_from = peer;
  return Guard(fn, [&]() -> Status {
    return weft::comm::RefuseOp(
        id, Status(weft::capi::StatusCodeOf(code), message == nullptr ? "" : message));
  });
}

weft_status weft_comm_group_start(void) {
  return Guard("weft_comm_group_start", [] {
    weft::group_start();
    return weft::OkStatus();
  });
}

weft_status weft_comm_group_end(void) {
  return Guard("weft_comm_group_end", [] { return weft::group_end(); });
}

weft_status weft_comm_barrier(void) {
  return Guard("weft_comm_barrier", [] { return weft::barrier(); });
}

weft_status weft_comm_barrier_nonblocking(weft_request** request) {
  const char* fn = "weft_comm_barrier_nonblocking";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(request, fn, "request"));
    *request = nullptr;
    return Emit(request, weft::barrier_nonblocking(), fn);
  });
}

}  // extern "C"
