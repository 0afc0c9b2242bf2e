// The data plane for CUDA tensors: NCCL, or the host plane through host memory
// (WEFT_<OP>_BY_MPI, process sets, 16-bit integers), and the checks of device tensors. The
// one file that knows whether this build has the NCCL backend (WEFT_WITH_NCCL); the engine,
// the host plane and the front ends use it without conditions.
#include <mpi.h>

#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/data_plane.h"
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

namespace {

#ifdef WEFT_WITH_NCCL
// NCCL, or MPI through host memory where NCCL cannot run the op (process sets, 16-bit
// integers) or WEFT_<OP>_BY_MPI says so.
class NcclPlane : public DevicePlane {
 public:
  NcclPlane(const Context& ctx, Timeline* timeline, HostPlane* host, Finisher finish)
      : ctx_(ctx), timeline_(timeline), host_(host), finish_(std::move(finish)) {}

  // Completes the group itself: at once when it fails or runs through host memory, from a
  // later Poll() when it was enqueued on the device.
  std::optional<Status> Run(const Response& response, Group& group) override;
  bool Poll() override;
  void Drain() override;
  bool busy() const override { return !on_device_.empty(); }
  StatusOr<HostCopier> Copier(const Device& device) override;

 private:
  // No CUDA call before the first op or copy: NCCL is bootstrapped then.
  nccl::NcclBackend& Backend() {
    if (nccl_ == nullptr) {
      nccl_ = std::make_shared<nccl::NcclBackend>(ctx_.data, ctx_.local, ctx_.cross);
    }
    return *nccl_;
  }
  // Enqueues one request's op on the NCCL backend.
  Status Enqueue(const Response& response, Request& r);
  // WEFT_<OP>_BY_MPI and what NCCL cannot run: copies the inputs to host memory, runs the
  // host plane, copies back.
  Status RunStaged(const Response& response, Group& group);
  void Finish(const Group& group, const Status& status) {
    for (auto& r : group) finish_(r, Annotate(status, Describe(r->desc)));
  }

  const Context ctx_;
  Timeline* const timeline_;
  HostPlane* const host_;
  const Finisher finish_;
  std::shared_ptr<nccl::NcclBackend> nccl_;
  // Ops enqueued on the device, completed by Poll() when their completion fires, so the
  // engine never blocks on the device. Declared after nccl_: destroyed before it.
  struct Work {
    Group group;
    std::function<std::optional<Status>()> poll;  // no value while the device works
    int64_t start_us = 0;
  };
  std::deque<Work> on_device_;
};

StatusOr<HostCopier> NcclPlane::Copier(const Device& device) {
  Backend();
  std::shared_ptr<nccl::NcclBackend> backend = nccl_;
  return HostCopier([backend, device](void* dst, const void* src, size_t bytes, bool to_device) {
    return to_device ? backend->CopyToDevice(dst, src, bytes, device)
                     : backend->CopyToHost(dst, src, bytes, device);
  });
}

std::optional<Status> NcclPlane::Run(const Response& response, Group& group) {
  nccl::NcclBackend& nccl = Backend();
  // NCCL's communicators span every rank: process sets go through host memory on MPI.
  // Point to point needs no set of its own (ncclSend/ncclRecv on the global communicator).
  const bool process_set = !group[0]->desc.group.empty() && response.op != OpType::kSendRecv;
  // NCCL has no 16-bit integer type.
  const bool int16 =
      group[0]->in.dtype() == DType::kInt16 || group[0]->out.dtype() == DType::kInt16;
  if (ForcedToMpi(response.op) || process_set || int16) {
    Finish(group, RunStaged(response, group));
    return std::nullopt;
  }
  const int64_t start = TraceStart(timeline_);
  // No fusion on the device: a fused group runs as its members, one after the other (the
  // same order on every rank), under one completion. Saves the packing copies' kernels.
  Status status;
  for (auto& r : group) {
    status = Enqueue(response, *r);
    if (!status.ok()) break;
  }
  StatusOr<std::unique_ptr<nccl::Completion>> recorded =
      status.ok() ? nccl.Record() : StatusOr<std::unique_ptr<nccl::Completion>>(status);
  if (!recorded.ok()) {
    // Members enqueued before the failure still run: let them finish with the buffers.
    nccl.Synchronize().IgnoreError();
    Finish(group, recorded.status());
    return std::nullopt;
  }
  std::shared_ptr<nccl::Completion> completion(std::move(*recorded));
  on_device_.push_back(Work{group, [completion] { return completion->Poll(); }, start});
  return std::nullopt;
}

bool NcclPlane::Poll() {
  bool progressed = false;
  for (auto it = on_device_.begin(); it != on_device_.end();) {
    std::optional<Status> result = it->poll();
    if (!result.has_value()) {
      ++it;
      continue;
    }
    Work work = std::move(*it);
    it = on_device_.erase(it);
    for (auto& r : work.group) r->backend = "NCCL";
    TraceGroup(timeline_, work.group, "communicate", work.start_us);
    Finish(work.group, *result);
    progressed = true;
  }
  return progressed;
}

void NcclPlane::Drain() {
  // Polls (rather than waiting on the stream) so that an asynchronous NCCL error still
  // completes the work, with that error.
  while (!on_device_.empty()) {
    if (!Poll()) std::this_thread::yield();
  }
}

Status NcclPlane::Enqueue(const Response& response, Request& r) {
  const Device& device = r.in.device();
  const DType dtype = r.in.dtype();
  const size_t count = static_cast<size_t>(r.in.numel());
  switch (response.op) {
    case OpType::kAllreduce:
      return Backend().Allreduce(r.in.data(), r.out.data(), count, dtype, r.desc.average, device);
    case OpType::kBroadcast:
      return Backend().Broadcast(r.in.data(), r.out.data(), r.in.nbytes(), r.desc.root, device);
    case OpType::kAllgather:
    case OpType::kNeighborAllgather: {
      // Never fused: the response's dims are this op's.
      const std::vector<int64_t>& dims = response.first_dims.at(0);
      const size_t row_bytes = static_cast<size_t>(RowElements(r.in.shape())) * r.in.itemsize();
      std::vector<int64_t> shape(r.in.shape().begin(), r.in.shape().end());
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
        return Backend().Allgather(r.in.data(), r.out.data(), bytes_per_rank, device);
      }
      std::vector<int> send;
      for (const auto& dst : r.send) send.push_back(dst.first);
      return Backend().NeighborAllgather(r.in.data(), r.in.nbytes(), r.out.data(), recv, send,
                                         device);
    }
    case OpType::kSendRecv:  // a neighbor allgather with one peer, one way
      if (!r.send.empty()) {
        return Backend().NeighborAllgather(r.in.data(), r.in.nbytes(), nullptr, {},
                                           {r.send[0].first}, device);
      }
      return Backend().NeighborAllgather(nullptr, 0, r.out.data(),
                                         {{r.recv[0].first, r.out.nbytes()}}, {}, device);
    case OpType::kNeighborAllreduce:
    case OpType::kPairGossip:  // recv = {peer: pair_weight}, send = {peer: 1}
      return Backend().NeighborAllreduce(r.in.data(), r.out.data(), count, dtype, r.self_weight,
                                         r.send, r.recv, device);
    case OpType::kHierarchicalNeighborAllreduce:
      return Backend().Hierarchical(r.in.data(), r.out.data(), count, dtype, r.self_weight, r.send,
                                    r.recv, ctx_.local_rank, ctx_.local_size, device);
    default:
      return Internal(OpName(response.op), " has no NCCL implementation");
  }
}

Status NcclPlane::RunStaged(const Response& response, Group& group) {
  const int64_t start = TraceStart(timeline_);
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
      status = Annotate(
          Backend().CopyToHost(st.host_in.data(), r.in.data(), r.in.nbytes(), r.in.device()),
          "staging through host memory (WEFT_*_BY_MPI)");
    }
    r.in = TensorView(st.host_in.data(), r.in.dtype(), r.in.shape());
    if (st.alloc) {
      Staged* target = &st;
      r.alloc = [target](DType dtype, const std::vector<int64_t>& shape) -> StatusOr<TensorView> {
        target->host_out.resize(static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype));
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
  // Making the set's communicator is collective over the set: it fails on the members
  // alike, which then skip the agreement below.
  StatusOr<MPI_Comm> comm = host_->CommOf(group[0]->desc.group);
  if (!comm.ok()) {
    status = comm.status();
  } else {
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, *comm);
    if (!ok && status.ok()) {
      status = FailedPrecondition(
          "another rank could not copy its CUDA tensor to host memory "
          "(see its error)");
    }
  }
  if (status.ok()) {
    TraceGroup(timeline_, group, "stage", start);
    std::optional<Status> ran = host_->Run(response, group);
    status = ran.has_value() ? std::move(*ran) : Internal("the host plane completed a staged op");
  }
  // The requests get their own views back, on every path: a failed op leaves no request
  // pointing into the staging buffers.
  for (size_t i = 0; i < group.size(); ++i) {
    Request& r = *group[i];
    Staged& st = staged[i];
    const TensorView host_out = r.out;
    r.in = st.in;
    r.out = st.out;
    r.alloc = st.alloc;
    if (!status.ok()) continue;
    if (st.alloc) {
      auto out = st.alloc(host_out.dtype(),
                          std::vector<int64_t>(host_out.shape().begin(), host_out.shape().end()));
      status = CheckAllocated(out, host_out.dtype(), host_out.shape(), st.in.device());
      if (status.ok()) {
        r.out = *out;
        status = Backend().CopyToDevice(r.out.data(), host_out.data(), host_out.nbytes(),
                                        st.in.device());
      }
    } else {
      status =
          Backend().CopyToDevice(st.out.data(), host_out.data(), host_out.nbytes(), st.in.device());
    }
  }
  return status;
}
#else   // WEFT_WITH_NCCL
// The front ends refuse CUDA tensors in builds without NCCL; should one come through, it
// fails.
class UnbuiltDevicePlane : public DevicePlane {
 public:
  explicit UnbuiltDevicePlane(Finisher finish) : finish_(std::move(finish)) {}

  std::optional<Status> Run(const Response&, Group& group) override {
    for (auto& r : group) {
      finish_(r, Unimplemented(Describe(r->desc),
                               ": CUDA tensors need weft's NCCL backend, which this build does "
                               "not include"));
    }
    return std::nullopt;
  }
  StatusOr<HostCopier> Copier(const Device& device) override {
    return Unimplemented("tensors on ", device.ToString(),
                         " need weft's NCCL backend, which this build does not include");
  }

 private:
  const Finisher finish_;
};
#endif  // WEFT_WITH_NCCL

}  // namespace

std::unique_ptr<DevicePlane> MakeDevicePlane(const Context& ctx, Timeline* timeline,
                                             HostPlane* host, Finisher finish) {
#ifdef WEFT_WITH_NCCL
  return std::make_unique<NcclPlane>(ctx, timeline, host, std::move(finish));
#else
  (void)ctx;
  (void)timeline;
  (void)host;
  return std::make_unique<UnbuiltDevicePlane>(std::move(finish));
#endif
}

}  // namespace comm
}  // namespace weft
