// The LibTorch adapter: at::Tensor in, weft TensorViews to comm/, at::Tensor out.
//
// Only the headers this file uses (ATen/core/Tensor.h and a few single-op headers), not
// <ATen/ATen.h> or <torch/torch.h>: this is the only LibTorch translation unit of the
// library and CI compiles it on two cores.
#include "comm/torch/torch_comm.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <exception>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/refuse.h"

namespace weft {
namespace torch_api {

// What a nonblocking op holds: the tensors weft reads and writes (alive until it completes)
// and, once it has, its result.
struct GatherSlot {
  std::mutex mu;
  at::Tensor tensor;  // what the Allocator returned (set on weft's background thread)
};

struct TorchHandle::State {
  const char* op = "";
  Handle handle;
  at::Tensor input;   // contiguous, what weft reads
  at::Tensor output;  // contiguous, what weft writes (may be `input`)
  at::Tensor target;  // in place on a non-contiguous tensor: the tensor to copy back into
  std::shared_ptr<GatherSlot> gathered;  // allgather ops

  std::mutex mu;
  bool finished = false;
  Status status;
  at::Tensor result;

  // Records the op's final status and result; `mu` held. Runs once.
  void Finish(const Status& op_status);
};

namespace {

// --- errors --------------------------------------------------------------------------------

// Runs `f`, turning LibTorch exceptions into a Status naming the op.
template <typename F>
Status Guarded(const char* op, F&& f) {
  try {
    return f();
  } catch (const c10::Error& e) {
    return Internal(op, ": LibTorch failed: ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Internal(op, ": LibTorch failed: ", e.what());
  }
}

std::string SupportedDTypes() {
  std::string out;
  for (int i = 0; i < kNumDTypes; ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ", ", DTypeName(static_cast<DType>(i)));
  }
  return out;
}

Status DTypeError(at::ScalarType type, const char* op) {
  std::string hint;
  if (at::isComplexType(type)) {
    hint = "; at::view_as_real(t) views a complex tensor as a real one with a trailing "
           "dimension of 2, which every op here handles";
  } else if (type == at::kBool) {
    hint = "; convert it first, e.g. with t.to(at::kByte)";
  } else {
    hint = "; convert it first, e.g. with t.to(at::kFloat)";
  }
  return Unimplemented(op, ": tensors of dtype ", c10::toString(type),
                       " are not supported; weft supports ", SupportedDTypes(), hint);
}

// Everything about a tensor that rules it out, before anything is allocated or sent.
// CUDA tensors are allowed only when `allow_cuda` (ToView); the ops need the NCCL backend.
Status CheckTensor(const at::Tensor& t, const char* op, bool allow_cuda) {
  if (!t.defined()) {
    return InvalidArgument(op, ": the tensor is undefined (a default-constructed at::Tensor "
                               "has no data); pass a tensor");
  }
  const at::Device device = t.device();
  if (device.is_cuda() && !allow_cuda) {
    return Unimplemented(op, ": the tensor is on ", device.str(),
                         "; CUDA tensors need weft's NCCL backend, which this build does not "
                         "include (move the tensor to the CPU with t.cpu())");
  }
  if (!device.is_cpu() && !device.is_cuda()) {
    return Unimplemented(op, ": the tensor is on ", device.str(),
                         "; weft supports CPU tensors (and CUDA ones with its NCCL backend)");
  }
  if (t.layout() != at::kStrided || t.is_nested()) {
    return Unimplemented(op, ": ", t.is_nested() ? std::string("nested") : c10::str(t.layout()),
                         " tensors are not supported; pass a dense (strided) tensor, e.g. "
                         "t.to_dense()");
  }
  if (!ToDType(t.scalar_type()).ok()) return DTypeError(t.scalar_type(), op);
  if (t.is_neg()) {
    return InvalidArgument(op, ": the tensor is a lazy negation view (its negative bit is "
                               "set); call t.resolve_neg() first");
  }
  return OkStatus();
}

StatusOr<TensorView> MakeView(const at::Tensor& t, const char* op, bool allow_cuda) {
  WEFT_RETURN_IF_ERROR(CheckTensor(t, op, allow_cuda));
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  // LibTorch calls a tensor contiguous whatever the strides of its size-1 dimensions (and of
  // an empty tensor); canonical strides describe the same memory.
  std::vector<int64_t> strides = t.is_contiguous()
                                     ? ContiguousStrides(shape)
                                     : std::vector<int64_t>(t.strides().begin(), t.strides().end());
  const Device device = t.device().is_cuda() ? Device::CUDA(t.device().has_index() ? t.device().index() : 0)
                                             : Device::CPU();
  return TensorView(t.data_ptr(), *ToDType(t.scalar_type()), std::move(shape),
                    std::move(strides), device);
}

// --- launching ops ----------------------------------------------------------------------------

comm::OpIdentity Identity(comm::OpType op, const std::string& name,
                          const std::vector<int>& ranks = {}) {
  comm::OpIdentity id;
  id.op = op;
  id.name = name;
  id.ranks = ranks;
  return id;
}

comm::OpIdentity PeerIdentity(bool sending, int peer, const std::string& name) {
  comm::OpIdentity id = Identity(comm::OpType::kSendRecv, name);
  (sending ? id.send_to : id.recv_from) = peer;
  return id;
}

// Ops with an output of the input's shape: `submit(in, out)` starts the weft op. A tensor
// refused here is refused as the op `id` (comm/refuse.h), as weft's own checks do.
template <typename Submit>
StatusOr<TorchHandle> LaunchSameShape(const char* op, const at::Tensor& t, bool in_place,
                                      const comm::OpIdentity& id, Submit&& submit) {
  auto state = std::make_shared<TorchHandle::State>();
  state->op = op;
  TensorView in, out;
  Status prepared = [&]() -> Status {
    WEFT_RETURN_IF_ERROR(CheckTensor(t, op, /*allow_cuda=*/false));
    WEFT_RETURN_IF_ERROR(Guarded(op, [&]() -> Status {
      c10::NoGradGuard no_grad;
      if (!in_place) {
        state->input = t.contiguous();
        state->output =
            at::empty(t.sizes(), at::TensorOptions().dtype(t.scalar_type()).device(t.device()));
      } else if (t.is_contiguous()) {
        state->input = state->output = t;
      } else {
        if (at::has_internal_overlap(t) == at::MemOverlap::Yes) {
          return InvalidArgument(op,
                                 ": cannot write in place into a tensor whose elements "
                                 "share memory (e.g. from expand()); use the out-of-place "
                                 "form or t.clone() first");
        }
        state->input = state->output = t.contiguous();
        state->target = t;
      }
      return OkStatus();
    }));
    WEFT_ASSIGN_OR_RETURN(in, MakeView(state->input, op, false));
    WEFT_ASSIGN_OR_RETURN(out, MakeView(state->output, op, false));
    return OkStatus();
  }();
  if (!prepared.ok()) return comm::RefuseOp(id, std::move(prepared));
  WEFT_ASSIGN_OR_RETURN(state->handle, submit(in, out));
  // The engine keeps what it reads and writes alive even if every TorchHandle is dropped.
  state->handle.keep_alive(std::make_shared<const std::pair<at::Tensor, at::Tensor>>(
      state->input, state->output));
  return TorchHandle(std::move(state));
}

// An Allocator that creates the op's output on `device` and keeps it in the state's slot.
Allocator GatherInto(TorchHandle::State& state, at::Device device) {
  auto slot = std::make_shared<GatherSlot>();
  state.gathered = slot;
  const char* op = state.op;
  // Called on weft's background thread; captures the slot, not the state (the state holds
  // the handle, which holds this allocator).
  return [slot, op, device](DType dtype,
                            const std::vector<int64_t>& shape) -> StatusOr<TensorView> {
    at::Tensor out;
    WEFT_RETURN_IF_ERROR(Guarded(op, [&]() -> Status {
      out = at::empty(shape, at::TensorOptions().dtype(ToScalarType(dtype)).device(device));
      return OkStatus();
    }));
    WEFT_ASSIGN_OR_RETURN(TensorView view, MakeView(out, op, false));
    std::lock_guard<std::mutex> lock(slot->mu);
    slot->tensor = std::move(out);
    return view;
  };
}

// Ops whose output weft allocates once the ranks agree on its shape:
// `submit(in, allocator)` starts the weft op.
template <typename Submit>
StatusOr<TorchHandle> LaunchGather(const char* op, const at::Tensor& t, const comm::OpIdentity& id,
                                   Submit&& submit) {
  auto state = std::make_shared<TorchHandle::State>();
  state->op = op;
  TensorView in;
  Status prepared = [&]() -> Status {
    WEFT_RETURN_IF_ERROR(CheckTensor(t, op, /*allow_cuda=*/false));
    WEFT_RETURN_IF_ERROR(Guarded(op, [&]() -> Status {
      state->input = t.contiguous();
      return OkStatus();
    }));
    WEFT_ASSIGN_OR_RETURN(in, MakeView(state->input, op, false));
    return OkStatus();
  }();
  if (!prepared.ok()) return comm::RefuseOp(id, std::move(prepared));
  WEFT_ASSIGN_OR_RETURN(state->handle, submit(in, GatherInto(*state, t.device())));
  // The output lives in the slot, which the allocator (owned by the op) holds.
  state->handle.keep_alive(std::make_shared<const at::Tensor>(state->input));
  return TorchHandle(std::move(state));
}

template <typename T>
StatusOr<T> Wait(StatusOr<TorchHandle> h) {
  if (!h.ok()) return h.status();
  return h->wait();
}
Status WaitStatus(StatusOr<TorchHandle> h) {
  if (!h.ok()) return h.status();
  return h->wait().status();
}

}  // namespace

// --- conversions ---------------------------------------------------------------------------

StatusOr<TensorView> ToView(const at::Tensor& tensor) {
  return MakeView(tensor, "ToView", /*allow_cuda=*/true);
}

StatusOr<DType> ToDType(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return DType::kFloat32;
    case at::kDouble: return DType::kFloat64;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kInt: return DType::kInt32;
    case at::kLong: return DType::kInt64;
    case at::kChar: return DType::kInt8;
    case at::kByte: return DType::kUInt8;
    case at::kShort:
      return DType::kInt16;
    default: return DTypeError(type, "ToDType");
  }
}

at::ScalarType ToScalarType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return at::kFloat;
    case DType::kFloat64: return at::kDouble;
    case DType::kFloat16: return at::kHalf;
    case DType::kBFloat16: return at::kBFloat16;
    case DType::kInt32: return at::kInt;
    case DType::kInt64: return at::kLong;
    case DType::kInt8: return at::kChar;
    case DType::kUInt8: return at::kByte;
    case DType::kInt16:
      return at::kShort;
  }
  return at::kFloat;  // unreachable: every DType is listed
}

// --- TorchHandle ----------------------------------------------------------------------------

void TorchHandle::State::Finish(const Status& op_status) {
  if (finished) return;
  finished = true;
  status = op_status;
  if (status.ok()) {
    if (gathered != nullptr) {
      std::lock_guard<std::mutex> lock(gathered->mu);
      result = gathered->tensor;
      if (!result.defined()) status = Internal(op, ": the op completed without an output");
    } else if (target.defined()) {
      status = Guarded(op, [&]() -> Status {
        c10::NoGradGuard no_grad;
        target.copy_(output);
        return OkStatus();
      });
      result = target;
    } else {
      result = output;
    }
  }
  // Done with the buffers; `result` keeps what the caller gets.
  input = at::Tensor();
  output = at::Tensor();
  target = at::Tensor();
  if (!status.ok()) result = at::Tensor();
}

bool TorchHandle::poll() const {
  if (state_ == nullptr) return true;
  if (!::weft::poll(state_->handle)) return false;
  const Status s = ::weft::wait(state_->handle);  // done: returns at once
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->Finish(s);
  return true;
}

StatusOr<at::Tensor> TorchHandle::wait() const {
  if (state_ == nullptr) return InvalidArgument("wait: the handle is empty");
  const Status s = ::weft::wait(state_->handle);
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->Finish(s);
  if (!state_->status.ok()) return state_->status;
  return state_->result;
}

const Handle& TorchHandle::handle() const {
  static const Handle* const kEmpty = new Handle();
  return state_ == nullptr ? *kEmpty : state_->handle;
}

// --- nonblocking ops -------------------------------------------------------------------------

StatusOr<TorchHandle> allreduce_nonblocking(const at::Tensor& tensor, bool average,
                                            const std::string& name,
                                            const std::vector<int>& ranks) {
  return LaunchSameShape("allreduce", tensor, false,
                         Identity(comm::OpType::kAllreduce, name, ranks),
                         [&](const TensorView& in, const TensorView& out) {
                           return ::weft::allreduce_nonblocking(in, out, average, name, ranks);
                         });
}

StatusOr<TorchHandle> allreduce_nonblocking_(const at::Tensor& tensor, bool average,
                                             const std::string& name,
                                             const std::vector<int>& ranks) {
  return LaunchSameShape("allreduce_", tensor, true,
                         Identity(comm::OpType::kAllreduce, name, ranks),
                         [&](const TensorView& in, const TensorView& out) {
                           return ::weft::allreduce_nonblocking(in, out, average, name, ranks);
                         });
}

StatusOr<TorchHandle> broadcast_nonblocking(const at::Tensor& tensor, int root_rank,
                                            const std::string& name,
                                            const std::vector<int>& ranks) {
  return LaunchSameShape("broadcast", tensor, false,
                         Identity(comm::OpType::kBroadcast, name, ranks),
                         [&](const TensorView& in, const TensorView& out) {
                           return ::weft::broadcast_nonblocking(in, out, root_rank, name, ranks);
                         });
}

StatusOr<TorchHandle> broadcast_nonblocking_(const at::Tensor& tensor, int root_rank,
                                             const std::string& name,
                                             const std::vector<int>& ranks) {
  return LaunchSameShape("broadcast_", tensor, true,
                         Identity(comm::OpType::kBroadcast, name, ranks),
                         [&](const TensorView& in, const TensorView& out) {
                           return ::weft::broadcast_nonblocking(in, out, root_rank, name, ranks);
                         });
}

StatusOr<TorchHandle> send_nonblocking(const at::Tensor& tensor, int dst,
                                       const std::string& name) {
  const char* op = "send";
  auto state = std::make_shared<TorchHandle::State>();
  state->op = op;
  TensorView in;
  Status prepared = [&]() -> Status {
    WEFT_RETURN_IF_ERROR(CheckTensor(tensor, op, /*allow_cuda=*/false));
    WEFT_RETURN_IF_ERROR(Guarded(op, [&]() -> Status {
      state->input = state->output = tensor.contiguous();
      return OkStatus();
    }));
    WEFT_ASSIGN_OR_RETURN(in, MakeView(state->input, op, false));
    return OkStatus();
  }();
  if (!prepared.ok()) return comm::RefuseOp(PeerIdentity(true, dst, name), std::move(prepared));
  WEFT_ASSIGN_OR_RETURN(state->handle, ::weft::send_nonblocking(in, dst, name));
  state->handle.keep_alive(std::make_shared<const at::Tensor>(state->input));
  return TorchHandle(std::move(state));
}

StatusOr<TorchHandle> recv_nonblocking_(const at::Tensor& tensor, int src,
                                        const std::string& name) {
  return LaunchSameShape("recv_", tensor, true, PeerIdentity(false, src, name),
                         [&](const TensorView&, const TensorView& out) {
                           return ::weft::recv_nonblocking(out, src, name);
                         });
}

StatusOr<TorchHandle> recv_nonblocking(int src, const std::string& name) {
  auto state = std::make_shared<TorchHandle::State>();
  state->op = "recv";
  WEFT_ASSIGN_OR_RETURN(state->handle, ::weft::recv_nonblocking(
                                           GatherInto(*state, at::Device(at::kCPU)), src, name));
  return TorchHandle(std::move(state));
}

StatusOr<TorchHandle> allgather_nonblocking(const at::Tensor& tensor, const std::string& name) {
  return LaunchGather("allgather", tensor, Identity(comm::OpType::kAllgather, name),
                      [&](const TensorView& in, Allocator alloc) {
                        return ::weft::allgather_nonblocking(in, std::move(alloc), name);
                      });
}

StatusOr<TorchHandle> neighbor_allgather_nonblocking(const at::Tensor& tensor,
                                                     const NeighborAllgatherOptions& options,
                                                     const std::string& name) {
  return LaunchGather(
      "neighbor_allgather", tensor, Identity(comm::OpType::kNeighborAllgather, name),
      [&](const TensorView& in, Allocator alloc) {
        return ::weft::neighbor_allgather_nonblocking(in, std::move(alloc), options, name);
      });
}

StatusOr<TorchHandle> neighbor_allreduce_nonblocking(const at::Tensor& tensor,
                                                     const NeighborAllreduceOptions& options,
                                                     const std::string& name) {
  return LaunchSameShape("neighbor_allreduce", tensor, false,
                         Identity(comm::OpType::kNeighborAllreduce, name),
                         [&](const TensorView& in, const TensorView& out) {
                           return ::weft::neighbor_allreduce_nonblocking(in, out, options, name);
                         });
}

StatusOr<TorchHandle> neighbor_allreduce_nonblocking_(const at::Tensor& tensor,
                                                      const NeighborAllreduceOptions& options,
                                                      const std::string& name) {
  return LaunchSameShape("neighbor_allreduce_", tensor, true,
                         Identity(comm::OpType::kNeighborAllreduce, name),
                         [&](const TensorView& in, const TensorView& out) {
                           return ::weft::neighbor_allreduce_nonblocking(in, out, options, name);
                         });
}

StatusOr<TorchHandle> hierarchical_neighbor_allreduce_nonblocking(
    const at::Tensor& tensor, const HierarchicalNeighborAllreduceOptions& options,
    const std::string& name) {
  return LaunchSameShape("hierarchical_neighbor_allreduce", tensor, false,
                         Identity(comm::OpType::kHierarchicalNeighborAllreduce, name),
                         [&](const TensorView& in, const TensorView& out) {
                           return ::weft::hierarchical_neighbor_allreduce_nonblocking(
                               in, out, options, name);
                         });
}

StatusOr<TorchHandle> pair_gossip_nonblocking(const at::Tensor& tensor, int peer,
                                              double self_weight, double pair_weight,
                                              const std::string& name) {
  return LaunchSameShape("pair_gossip", tensor, false, Identity(comm::OpType::kPairGossip, name),
                         [&](const TensorView& in, const TensorView& out) {
                           return ::weft::pair_gossip_nonblocking(in, out, peer, self_weight,
                                                                  pair_weight, name);
                         });
}

// --- blocking ops: launch and wait -----------------------------------------------------------

StatusOr<at::Tensor> allreduce(const at::Tensor& tensor, bool average, const std::string& name,
                               const std::vector<int>& ranks) {
  return Wait<at::Tensor>(allreduce_nonblocking(tensor, average, name, ranks));
}

Status allreduce_(const at::Tensor& tensor, bool average, const std::string& name,
                  const std::vector<int>& ranks) {
  return WaitStatus(allreduce_nonblocking_(tensor, average, name, ranks));
}

StatusOr<at::Tensor> broadcast(const at::Tensor& tensor, int root_rank, const std::string& name,
                               const std::vector<int>& ranks) {
  return Wait<at::Tensor>(broadcast_nonblocking(tensor, root_rank, name, ranks));
}

Status broadcast_(const at::Tensor& tensor, int root_rank, const std::string& name,
                  const std::vector<int>& ranks) {
  return WaitStatus(broadcast_nonblocking_(tensor, root_rank, name, ranks));
}

Status send(const at::Tensor& tensor, int dst, const std::string& name) {
  return WaitStatus(send_nonblocking(tensor, dst, name));
}

Status recv_(const at::Tensor& tensor, int src, const std::string& name) {
  return WaitStatus(recv_nonblocking_(tensor, src, name));
}

StatusOr<at::Tensor> recv(int src, const std::string& name) {
  return Wait<at::Tensor>(recv_nonblocking(src, name));
}

StatusOr<at::Tensor> allgather(const at::Tensor& tensor, const std::string& name) {
  return Wait<at::Tensor>(allgather_nonblocking(tensor, name));
}

StatusOr<at::Tensor> neighbor_allgather(const at::Tensor& tensor,
                                        const NeighborAllgatherOptions& options,
                                        const std::string& name) {
  return Wait<at::Tensor>(neighbor_allgather_nonblocking(tensor, options, name));
}

StatusOr<at::Tensor> neighbor_allreduce(const at::Tensor& tensor,
                                        const NeighborAllreduceOptions& options,
                                        const std::string& name) {
  return Wait<at::Tensor>(neighbor_allreduce_nonblocking(tensor, options, name));
}

Status neighbor_allreduce_(const at::Tensor& tensor, const NeighborAllreduceOptions& options,
                           const std::string& name) {
  return WaitStatus(neighbor_allreduce_nonblocking_(tensor, options, name));
}

StatusOr<at::Tensor> hierarchical_neighbor_allreduce(
    const at::Tensor& tensor, const HierarchicalNeighborAllreduceOptions& options,
    const std::string& name) {
  return Wait<at::Tensor>(hierarchical_neighbor_allreduce_nonblocking(tensor, options, name));
}

Status hierarchical_neighbor_allreduce_(const at::Tensor& tensor,
                                        const HierarchicalNeighborAllreduceOptions& options,
                                        const std::string& name) {
  return WaitStatus(LaunchSameShape("hierarchical_neighbor_allreduce_", tensor, true,
                                    Identity(comm::OpType::kHierarchicalNeighborAllreduce, name),
                                    [&](const TensorView& in, const TensorView& out) {
                                      return ::weft::hierarchical_neighbor_allreduce_nonblocking(
                                          in, out, options, name);
                                    }));
}

StatusOr<at::Tensor> pair_gossip(const at::Tensor& tensor, int peer, double self_weight,
                                 double pair_weight, const std::string& name) {
  return Wait<at::Tensor>(pair_gossip_nonblocking(tensor, peer, self_weight, pair_weight, name));
}

Status pair_gossip_(const at::Tensor& tensor, int peer, double self_weight, double pair_weight,
                    const std::string& name) {
  return WaitStatus(LaunchSameShape("pair_gossip_", tensor, true,
                                    Identity(comm::OpType::kPairGossip, name),
                                    [&](const TensorView& in, const TensorView& out) {
                                      return ::weft::pair_gossip_nonblocking(
                                          in, out, peer, self_weight, pair_weight, name);
                                    }));
}

}  // namespace torch_api
}  // namespace weft
