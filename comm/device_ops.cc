// The data plane for CUDA tensors: NCCL, or MPI through host memory (WEFT_<OP>_BY_MPI,
// process sets, 16-bit integers), and the checks of device tensors. The one file that
// knows whether this build has the NCCL backend (WEFT_WITH_NCCL); the engine, the MPI data
// plane and the front ends call it without conditions.
#include <mpi.h>

#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/engine.h"
#include "core/config.h"
#ifdef WEFT_WITH_NCCL
#include "comm/nccl/nccl_ops.h"
#endif

namespace weft {
namespace comm {
namespace {

// CUDA tensors run on NCCL unless these force the MPI path (through host memory). Declared
// in every build so that a job's environment means the same everywhere; every rank must
// see the same values (they choose which collectives run: init() checks).
const config::BoolSetting kAllreduceByMpi(
    "WEFT_ALLREDUCE_BY_MPI", false,
    "CUDA tensors: run allreduce on MPI, staged through host memory, instead of NCCL.",
    config::Agreement::kSameOnEveryRank);
const config::BoolSetting kBroadcastByMpi(
    "WEFT_BROADCAST_BY_MPI", false,
    "CUDA tensors: run broadcast on MPI, staged through host memory, instead of NCCL.",
    config::Agreement::kSameOnEveryRank);
const config::BoolSetting kAllgatherByMpi(
    "WEFT_ALLGATHER_BY_MPI", false,
    "CUDA tensors: run allgather on MPI, staged through host memory, instead of NCCL.",
    config::Agreement::kSameOnEveryRank);
const config::BoolSetting kNeighborAllgatherByMpi(
    "WEFT_NEIGHBOR_ALLGATHER_BY_MPI", false,
    "CUDA tensors: run neighbor_allgather on MPI, staged through host memory, instead of "
    "NCCL.",
    config::Agreement::kSameOnEveryRank);
const config::BoolSetting kNeighborAllreduceByMpi(
    "WEFT_NEIGHBOR_ALLREDUCE_BY_MPI", false,
    "CUDA tensors: run neighbor_allreduce on MPI, staged through host memory, instead of "
    "NCCL.",
    config::Agreement::kSameOnEveryRank);
const config::BoolSetting kHierarchicalByMpi(
    "WEFT_HIERARCHICAL_NEIGHBOR_ALLREDUCE_BY_MPI", false,
    "CUDA tensors: run hierarchical_neighbor_allreduce on MPI, staged through host memory, "
    "instead of NCCL.",
    config::Agreement::kSameOnEveryRank);
const config::BoolSetting kSendRecvByMpi(
    "WEFT_SEND_RECV_BY_MPI", false,
    "CUDA tensors: run send/recv on MPI, staged through host memory, instead of NCCL.",
    config::Agreement::kSameOnEveryRank);
const config::BoolSetting kPairGossipByMpi(
    "WEFT_PAIR_GOSSIP_BY_MPI", false,
    "CUDA tensors: run pair_gossip on MPI, staged through host memory, instead of NCCL.",
    config::Agreement::kSameOnEveryRank);

[[maybe_unused]] bool ForcedToMpi(OpType op) {
  switch (op) {
    case OpType::kAllreduce: return kAllreduceByMpi.Get();
    case OpType::kBroadcast: return kBroadcastByMpi.Get();
    case OpType::kAllgather: return kAllgatherByMpi.Get();
    case OpType::kNeighborAllgather: return kNeighborAllgatherByMpi.Get();
    case OpType::kNeighborAllreduce: return kNeighborAllreduceByMpi.Get();
    case OpType::kHierarchicalNeighborAllreduce: return kHierarchicalByMpi.Get();
    case OpType::kPairGossip: return kPairGossipByMpi.Get();
    case OpType::kSendRecv: return kSendRecvByMpi.Get();
    default: return true;  // no tensors on a device
  }
}

}  // namespace

bool NcclBuilt() {
#ifdef WEFT_WITH_NCCL
  return true;
#else
  return false;
#endif
}

Status DeviceUsable(const Device& device, const char* op, const char* which) {
#ifdef WEFT_WITH_NCCL
  // The same code as a build without NCCL: CUDA ops cannot run in this process.
  const std::string why = nccl::DeviceUnavailable(device.index);
  if (!why.empty()) {
    return Unimplemented(op, ": the ", which, " tensor is on ", device.ToString(),
                         " but no such CUDA device is usable here: ", why);
  }
  return OkStatus();
#else
  return Unimplemented(op, ": the ", which, " tensor is on ", device.ToString(),
                       "; CUDA tensors need weft's NCCL backend, which this build does not "
                       "include (move the tensor to the CPU)");
#endif
}

StatusOr<std::function<Status(void*, const void*, size_t, bool)>> Engine::DeviceCopier(
    const Device& device) {
#ifdef WEFT_WITH_NCCL
  if (nccl_ == nullptr) {
    nccl_ = std::make_shared<nccl::NcclBackend>(ctx_.data, ctx_.local, ctx_.cross);
  }
  std::shared_ptr<nccl::NcclBackend> backend = nccl_;
  return [backend, device](void* dst, const void* src, size_t bytes, bool to_device) {
    return to_device ? backend->CopyToDevice(dst, src, bytes, device)
                     : backend->CopyToHost(dst, src, bytes, device);
  };
#else
  return Unimplemented("tensors on ", device.ToString(),
                       " need weft's NCCL backend, which this build does not include");
#endif
}

void Engine::ExecuteOnDevice(const Response& response,
                             std::vector<std::shared_ptr<Request>>& group) {
#ifndef WEFT_WITH_NCCL
  // The front ends refuse CUDA tensors in such builds; should one come through, it fails.
  for (auto& r : group) {
    Finish(r, Unimplemented(r->desc.display,
                            ": CUDA tensors need weft's NCCL backend, which this build does "
                            "not include"));
  }
  (void)response;
#else
  if (nccl_ == nullptr) {
    // No CUDA call yet: NCCL is bootstrapped at the first op that runs on it.
    nccl_ = std::make_shared<nccl::NcclBackend>(ctx_.data, ctx_.local, ctx_.cross);
  }
  // NCCL's communicators span every rank: process sets go through host memory on MPI.
  // Point to point needs no set of its own (ncclSend/ncclRecv on the global communicator).
  const bool process_set = !group[0]->desc.group.empty() && response.op != OpType::kSendRecv;
  // NCCL has no 16-bit integer type.
  const bool int16 =
      group[0]->in.dtype() == DType::kInt16 || group[0]->out.dtype() == DType::kInt16;
  if (ForcedToMpi(response.op) || process_set || int16) {
    const Status status = RunStaged(response, group);
    for (auto& r : group) Finish(r, Annotate(status, r->desc.display));
    return;
  }
  const int64_t start = Timeline::NowMicros();
  // No fusion on the device: a fused group runs as its members, one after the other (the
  // same order on every rank), under one completion. Saves the packing copies' kernels.
  Status status;
  for (auto& r : group) {
    status = EnqueueOnNccl(response, *r);
    if (!status.ok()) break;
  }
  StatusOr<std::unique_ptr<nccl::Completion>> recorded =
      status.ok() ? nccl_->Record() : StatusOr<std::unique_ptr<nccl::Completion>>(status);
  if (!recorded.ok()) {
    // Members enqueued before the failure still run: let them finish with the buffers.
    nccl_->Synchronize().IgnoreError();
    for (auto& r : group) Finish(r, Annotate(recorded.status(), r->desc.display));
    return;
  }
  // The device list owns them now; FailAll must not complete them a second time.
  for (auto& r : group) outstanding_.erase(r->desc.key);
  std::shared_ptr<nccl::Completion> completion(std::move(*recorded));
  on_device_.push_back(DeviceWork{group, [completion] { return completion->Poll(); }, start});
#endif  // WEFT_WITH_NCCL
}

bool Engine::PollDevice() {
  bool progressed = false;
  for (auto it = on_device_.begin(); it != on_device_.end();) {
    std::optional<Status> result = it->poll();
    if (!result.has_value()) {
      ++it;
      continue;
    }
    DeviceWork work = std::move(*it);
    it = on_device_.erase(it);
    for (auto& r : work.group) r->backend = "NCCL";
    Trace(work.group, "communicate", work.start_us);
    for (auto& r : work.group) Finish(r, Annotate(*result, r->desc.display));
    progressed = true;
  }
  return progressed;
}

void Engine::DrainDevice() {
  // Polls (rather than waiting on the stream) so that an asynchronous NCCL error still
  // completes the work, with that error.
  while (!on_device_.empty()) {
    if (!PollDevice()) std::this_thread::yield();
  }
}

#ifdef WEFT_WITH_NCCL
Status Engine::EnqueueOnNccl(const Response& response, Request& r) {
  const Device& device = r.in.device();
  const DType dtype = r.in.dtype();
  const size_t count = static_cast<size_t>(r.in.numel());
  switch (response.op) {
    case OpType::kAllreduce:
      return nccl_->Allreduce(r.in.data(), r.out.data(), count, dtype, r.desc.average, device);
    case OpType::kBroadcast:
      return nccl_->Broadcast(r.in.data(), r.out.data(), r.in.nbytes(), r.desc.root, device);
    case OpType::kAllgather:
    case OpType::kNeighborAllgather: {
      // Never fused: the response's dims are this op's.
      const std::vector<int64_t>& dims = response.first_dims.at(0);
      const size_t row_bytes = static_cast<size_t>(RowElements(r.in.shape())) * r.in.itemsize();
      std::vector<int64_t> shape = r.in.shape();
      shape[0] = 0;
      std::vector<size_t> bytes_per_rank;
      std::vector<std::pair<int, size_t>> recv;
      if (response.op == OpType::kAllgather) {
        for (int64_t d : dims) {
          shape[0] += d;
          bytes_per_rank.push_back(static_cast<size_t>(d) * row_bytes);
        }
      } else {
        for (const auto& src : r.recv) {
          shape[0] += dims[src.first];
          recv.emplace_back(src.first, static_cast<size_t>(dims[src.first]) * row_bytes);
        }
      }
      auto out = r.alloc(dtype, shape);
      WEFT_RETURN_IF_ERROR(CheckAllocated(out, dtype, shape, device));
      r.out = *out;
      if (response.op == OpType::kAllgather) {
        return nccl_->Allgather(r.in.data(), r.out.data(), bytes_per_rank, device);
      }
      std::vector<int> send;
      for (const auto& dst : r.send) send.push_back(dst.first);
      return nccl_->NeighborAllgather(r.in.data(), r.in.nbytes(), r.out.data(), recv, send, device);
    }
    case OpType::kSendRecv:  // a neighbor allgather with one peer, one way
      if (!r.send.empty()) {
        return nccl_->NeighborAllgather(r.in.data(), r.in.nbytes(), nullptr, {}, {r.send[0].first},
                                        device);
      }
      return nccl_->NeighborAllgather(nullptr, 0, r.out.data(), {{r.recv[0].first, r.out.nbytes()}},
                                      {}, device);
    case OpType::kNeighborAllreduce:
    case OpType::kPairGossip:  // recv = {peer: pair_weight}, send = {peer: 1}
      return nccl_->NeighborAllreduce(r.in.data(), r.out.data(), count, dtype, r.self_weight,
                                      r.send, r.recv, device);
    case OpType::kHierarchicalNeighborAllreduce:
      return nccl_->Hierarchical(r.in.data(), r.out.data(), count, dtype, r.self_weight, r.send,
                                 r.recv, ctx_.local_rank, ctx_.local_size, device);
    default:
      return Internal(OpName(response.op), " has no NCCL implementation");
  }
}

Status Engine::RunStaged(const Response& response, std::vector<std::shared_ptr<Request>>& group) {
  const int64_t start = Timeline::NowMicros();
  // Each request's device views are swapped for host buffers while the MPI path runs.
  struct Staged {
    TensorView in, out;  // the caller's, on the device
    Allocator alloc;
    std::vector<char> host_in, host_out;
  };
  std::vector<Staged> staged(group.size());  // not resized below: the allocators point in
  Status status;
  for (size_t i = 0; i < group.size(); ++i) {
    Request& r = *group[i];
    Staged& st = staged[i];
    st.in = r.in;
    st.out = r.out;
    st.alloc = r.alloc;
    st.host_in.resize(r.in.nbytes());
    if (status.ok() && r.in.nbytes() > 0) {
      status =
          Annotate(nccl_->CopyToHost(st.host_in.data(), r.in.data(), r.in.nbytes(), r.in.device()),
                   "staging through host memory (WEFT_*_BY_MPI)");
    }
    r.in = TensorView(st.host_in.data(), r.in.dtype(), r.in.shape());
    if (st.alloc) {
      Staged* target = &st;
      r.alloc = [target](DType dtype, const std::vector<int64_t>& shape) -> StatusOr<TensorView> {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        target->host_out.resize(static_cast<size_t>(n) * DTypeSize(dtype));
        return TensorView(target->host_out.data(), dtype, shape);
      };
    } else if (st.out.data() == st.in.data()) {
      r.out = r.in;  // in place stays in place
    } else {
      st.host_out.resize(r.out.nbytes());
      r.out = TensorView(st.host_out.data(), r.out.dtype(), r.out.shape());
    }
  }
  // A rank that could not stage must not leave the others waiting in the collective.
  int ok = status.ok() ? 1 : 0;
  StatusOr<MPI_Comm> comm = CommOf(group[0]->desc.group);
  if (!comm.ok()) return comm.status();
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, *comm);
  if (!ok && status.ok()) {
    status = FailedPrecondition(
        "another rank could not copy its CUDA tensor to host memory "
        "(see its error)");
  }
  if (status.ok()) {
    Trace(group, "stage", start);
    status = RunOnMpi(response, group);
  }
  for (size_t i = 0; i < group.size(); ++i) {
    Request& r = *group[i];
    Staged& st = staged[i];
    const TensorView host_out = r.out;
    r.in = st.in;
    r.out = st.out;
    r.alloc = st.alloc;
    if (!status.ok()) continue;
    if (st.alloc) {
      auto out = st.alloc(host_out.dtype(), host_out.shape());
      status = CheckAllocated(out, host_out.dtype(), host_out.shape(), st.in.device());
      if (status.ok()) {
        r.out = *out;
        status =
            nccl_->CopyToDevice(r.out.data(), host_out.data(), host_out.nbytes(), st.in.device());
      }
    } else {
      status =
          nccl_->CopyToDevice(st.out.data(), host_out.data(), host_out.nbytes(), st.in.device());
    }
  }
  return status;
}
#endif  // WEFT_WITH_NCCL

}  // namespace comm
}  // namespace weft
