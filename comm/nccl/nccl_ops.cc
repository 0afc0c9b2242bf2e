#include "comm/nccl/nccl_ops.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "comm/nccl/kernels.h"

namespace weft {
namespace comm {
namespace nccl {
namespace {

Status CudaError(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return OkStatus();
  return Internal(what, " failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
}

// NCCL's generic text plus its detail for this communicator (ncclGetLastError).
Status NcclError(ncclResult_t res, ncclComm_t comm, const char* what) {
  if (res == ncclSuccess) return OkStatus();
  const char* detail = ncclGetLastError(comm);
  return Internal(what, " failed: ", ncclGetErrorString(res),
                  detail != nullptr && *detail != '\0' ? absl::StrCat(" (", detail, ")") : "");
}

#define WEFT_CUDA_OR_RETURN(expr) WEFT_RETURN_IF_ERROR(CudaError((expr), #expr))

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kInt8: return ncclInt8;
    case DType::kUInt8: return ncclUint8;
    case DType::kInt16:
      break;  // none: the engine stages int16 through MPI
  }
  return ncclUint8;
}

// kernels.h numbers its types as DType does.
// kernels.h repeats DType's numbering (nvcc does not see core/): keep the two in step.
#define WEFT_SAME_NUMBER(name)                                                \
  static_assert(static_cast<int>(DType::name) == static_cast<int>(DeviceType::name), \
                "kernels.h DeviceType must number " #name " as DType does")
WEFT_SAME_NUMBER(kFloat32);
WEFT_SAME_NUMBER(kFloat64);
WEFT_SAME_NUMBER(kFloat16);
WEFT_SAME_NUMBER(kBFloat16);
WEFT_SAME_NUMBER(kInt32);
WEFT_SAME_NUMBER(kInt64);
WEFT_SAME_NUMBER(kInt8);
WEFT_SAME_NUMBER(kUInt8);
WEFT_SAME_NUMBER(kInt16);
#undef WEFT_SAME_NUMBER
static_assert(kNumDTypes == 9, "a new DType needs a DeviceType and kernels.cu support");

DeviceType KernelType(DType dtype) { return static_cast<DeviceType>(static_cast<int>(dtype)); }

int CommRank(MPI_Comm comm) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  return r;
}

int CommSize(MPI_Comm comm) {
  int n = 1;
  MPI_Comm_size(comm, &n);
  return n;
}

}  // namespace

std::string DeviceUnavailable(int index) {
  static const std::pair<int, std::string> found = [] {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      return std::make_pair(0, absl::StrCat("cudaGetDeviceCount failed: ", cudaGetErrorString(err)));
    }
    return std::make_pair(count, std::string());
  }();
  if (!found.second.empty()) return found.second;
  if (index < 0 || index >= found.first) {
    return absl::StrCat("this process sees ", found.first, " CUDA device",
                        found.first == 1 ? "" : "s", ", so there is no cuda:", index);
  }
  return "";
}

struct NcclBackend::Comm {
  MPI_Comm mpi = MPI_COMM_NULL;
  ncclComm_t nccl = nullptr;
  bool tried = false;  // bootstrapped once: a failure is not retried (ranks would disagree)
  Status failed;       // why the bootstrap failed
};

struct NcclBackend::State {
  Comm data, local, cross;
  int device = -1;  // bound at the first op
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> free_events;
  // The first asynchronous NCCL error: its communicator is aborted, so the backend is
  // unusable and every later op reports it.
  Status async_error;
  std::vector<std::pair<void*, size_t>> recv_scratch, send_scratch;
};

Completion::~Completion() { backend_->ReturnEvent(event_); }

std::optional<Status> Completion::Poll() {
  const cudaError_t q = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  // An aborted communicator may still let the event fire, over wrong data: its error wins.
  Status async = backend_->AsyncError();
  if (!async.ok()) return async;
  if (q == cudaSuccess) return OkStatus();
  if (q == cudaErrorNotReady) return std::nullopt;
  return CudaError(q, "the op on the device");
}

NcclBackend::NcclBackend(MPI_Comm data, MPI_Comm local, MPI_Comm cross)
    : state_(std::make_unique<State>()) {
  state_->data.mpi = data;
  state_->local.mpi = local;
  state_->cross.mpi = cross;
}

NcclBackend::~NcclBackend() {
  State& s = *state_;
  if (s.stream == nullptr) return;  // never bound: no CUDA call at all (no device needed)
  cudaSetDevice(s.device);
  cudaStreamSynchronize(s.stream);
  for (Comm* c : {&s.data, &s.local, &s.cross}) {
    if (c->nccl != nullptr) ncclCommDestroy(c->nccl);
  }
  for (auto* pool : {&s.recv_scratch, &s.send_scratch}) {
    for (auto& buf : *pool) cudaFree(buf.first);
  }
  for (cudaEvent_t e : s.free_events) cudaEventDestroy(e);
  cudaStreamDestroy(s.stream);
}

Status NcclBackend::Bind(const Device& device) {
  State& s = *state_;
  if (device.type != Device::Type::kCUDA) {
    return Internal("the NCCL backend was given a tensor on ", device.ToString());
  }
  if (s.device >= 0 && device.index != s.device) {
    return FailedPrecondition("weft's NCCL backend on this rank is bound to cuda:", s.device,
                              " (the device of its first CUDA op) but got a tensor on ",
                              device.ToString(), "; use one CUDA device per rank");
  }
  // Whichever thread makes progress runs the ops, and the current device is per thread.
  WEFT_CUDA_OR_RETURN(cudaSetDevice(device.index));
  if (s.stream == nullptr) {
    // A blocking stream (not cudaStreamNonBlocking): ordered with the legacy default stream.
    WEFT_CUDA_OR_RETURN(cudaStreamCreateWithFlags(&s.stream, cudaStreamDefault));
    s.device = device.index;
  }
  return OkStatus();
}

Status NcclBackend::Ready(Comm& comm, const Device& device) {
  if (!state_->async_error.ok()) return state_->async_error;
  Status bound = Bind(device);
  if (comm.nccl != nullptr || comm.tried) return bound.ok() ? comm.failed : bound;
  comm.tried = true;
  // The bootstrap is collective over comm.mpi. Every step's outcome is agreed first, so
  // the ranks either all call ncclCommInitRank or all fail with an error (never a hang
  // because one rank had no usable device).
  int ok = bound.ok() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm.mpi);
  if (!ok) {
    comm.failed = bound.ok() ? FailedPrecondition("setting up NCCL: another rank could not "
                                                  "use its CUDA device (see its error)")
                             : Annotate(bound, "setting up NCCL");
    return comm.failed;
  }
  const int rank = CommRank(comm.mpi);
  const int size = CommSize(comm.mpi);
  struct {
    ncclUniqueId id;
    int ok;
  } hello{};
  Status made;
  if (rank == 0) {
    made = NcclError(ncclGetUniqueId(&hello.id), nullptr, "ncclGetUniqueId");
    hello.ok = made.ok() ? 1 : 0;
  }
  MPI_Bcast(&hello, sizeof(hello), MPI_BYTE, 0, comm.mpi);
  if (!hello.ok) {
    comm.failed = rank == 0 ? Annotate(made, "setting up NCCL")
                            : Internal("setting up NCCL: rank 0 could not create the "
                                       "communicator's id (see its error)");
    return comm.failed;
  }
  Status init = NcclError(ncclCommInitRank(&comm.nccl, size, hello.id, rank), nullptr,
                          "ncclCommInitRank");
  ok = init.ok() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm.mpi);
  if (!ok) {
    if (comm.nccl != nullptr) ncclCommAbort(comm.nccl);
    comm.nccl = nullptr;
    comm.failed = init.ok() ? Internal("setting up NCCL: ncclCommInitRank failed on another "
                                       "rank (see its error)")
                            : Annotate(init, "setting up NCCL");
    return comm.failed;
  }
  return OkStatus();
}

Status NcclBackend::AsyncError() const {
  State& s = *state_;
  if (!s.async_error.ok()) return s.async_error;
  for (Comm* c : {&s.data, &s.local, &s.cross}) {
    if (c->nccl == nullptr) continue;
    ncclResult_t async = ncclSuccess;
    ncclResult_t res = ncclCommGetAsyncError(c->nccl, &async);
    if (res != ncclSuccess) async = res;
    if (async == ncclSuccess || async == ncclInProgress) continue;
    s.async_error = NcclError(async, c->nccl, "a NCCL operation");
    // Abort, or the kernels waiting for a failed peer would hold the device forever.
    ncclCommAbort(c->nccl);
    c->nccl = nullptr;
    return s.async_error;
  }
  return OkStatus();
}

StatusOr<void*> NcclBackend::Scratch(std::vector<std::pair<void*, size_t>>& pool, size_t index,
                                     size_t bytes) {
  if (pool.size() <= index) pool.resize(index + 1, {nullptr, 0});
  auto& buf = pool[index];
  if (buf.second < bytes) {
    // cudaFree waits for the device, so earlier ops still reading the old buffer finish.
    if (buf.first != nullptr) WEFT_CUDA_OR_RETURN(cudaFree(buf.first));
    buf = {nullptr, 0};
    WEFT_CUDA_OR_RETURN(cudaMalloc(&buf.first, bytes));
    buf.second = bytes;
  }
  return buf.first;
}

Status NcclBackend::Allreduce(const void* in, void* out, size_t count, DType dtype,
                              bool average, const Device& device) {
  State& s = *state_;
  WEFT_RETURN_IF_ERROR(Ready(s.data, device));
  WEFT_RETURN_IF_ERROR(NcclError(
      ncclAllReduce(in, out, count, NcclType(dtype), ncclSum, s.data.nccl, s.stream),
      s.data.nccl, "ncclAllReduce"));
  const int size = CommSize(s.data.mpi);
  if (average && size > 1) {
    // Sum then divide, as the MPI path does (ncclAvg would round integers differently).
    WEFT_RETURN_IF_ERROR(
        CudaError(LaunchDivide(out, KernelType(dtype), count, size, s.stream), "averaging"));
  }
  return OkStatus();
}

Status NcclBackend::Broadcast(const void* in, void* out, size_t bytes, int root,
                              const Device& device) {
  State& s = *state_;
  WEFT_RETURN_IF_ERROR(Ready(s.data, device));
  return NcclError(ncclBroadcast(in, out, bytes, ncclUint8, root, s.data.nccl, s.stream),
                   s.data.nccl, "ncclBroadcast");
}

Status NcclBackend::Allgather(const void* in, void* out, const std::vector<size_t>& bytes_per_rank,
                              const Device& device) {
  State& s = *state_;
  WEFT_RETURN_IF_ERROR(Ready(s.data, device));
  const bool equal = std::all_of(bytes_per_rank.begin(), bytes_per_rank.end(),
                                 [&](size_t b) { return b == bytes_per_rank[0]; });
  if (equal) {
    return NcclError(ncclAllGather(in, out, bytes_per_rank[0], ncclUint8, s.data.nccl, s.stream),
                     s.data.nccl, "ncclAllGather");
  }
  // NCCL's allgather needs equal parts: one broadcast per rank, grouped into one launch.
  const int self = CommRank(s.data.mpi);
  WEFT_RETURN_IF_ERROR(NcclError(ncclGroupStart(), s.data.nccl, "ncclGroupStart"));
  size_t offset = 0;
  Status status;
  for (size_t r = 0; r < bytes_per_rank.size(); ++r) {
    char* dst = static_cast<char*>(out) + offset;
    const void* src = static_cast<int>(r) == self ? in : dst;
    if (status.ok()) {
      status = NcclError(ncclBroadcast(src, dst, bytes_per_rank[r], ncclUint8, static_cast<int>(r),
                                       s.data.nccl, s.stream),
                         s.data.nccl, "ncclBroadcast");
    }
    offset += bytes_per_rank[r];
  }
  Status end = NcclError(ncclGroupEnd(), s.data.nccl, "ncclGroupEnd");  // always close
  return status.ok() ? end : status;
}

Status NcclBackend::NeighborAllgather(const void* in, size_t in_bytes, void* out,
                                      const std::vector<std::pair<int, size_t>>& recv,
                                      const std::vector<int>& send, const Device& device) {
  State& s = *state_;
  WEFT_RETURN_IF_ERROR(Ready(s.data, device));
  WEFT_RETURN_IF_ERROR(NcclError(ncclGroupStart(), s.data.nccl, "ncclGroupStart"));
  Status status;
  size_t offset = 0;
  for (const auto& [src, bytes] : recv) {
    if (status.ok()) {
      status = NcclError(ncclRecv(static_cast<char*>(out) + offset, bytes, ncclUint8, src,
                                  s.data.nccl, s.stream),
                         s.data.nccl, "ncclRecv");
    }
    offset += bytes;
  }
  for (int dst : send) {
    if (status.ok()) {
      status = NcclError(ncclSend(in, in_bytes, ncclUint8, dst, s.data.nccl, s.stream),
                         s.data.nccl, "ncclSend");
    }
  }
  Status end = NcclError(ncclGroupEnd(), s.data.nccl, "ncclGroupEnd");
  return status.ok() ? end : status;
}

Status NcclBackend::ExchangeAndCombine(Comm& comm, const void* in, void* out, size_t count,
                                       DType dtype, double self_weight, const Peers& send,
                                       const Peers& recv) {
  State& s = *state_;
  const size_t bytes = count * DTypeSize(dtype);
  // Scaled copies for destinations whose weight is not 1, made before the exchange.
  std::vector<const void*> send_data(send.size(), in);
  size_t scaled = 0;
  for (size_t k = 0; k < send.size(); ++k) {
    if (send[k].second == 1.0) continue;
    WEFT_ASSIGN_OR_RETURN(void* copy, Scratch(s.send_scratch, scaled++, bytes));
    const DeviceTerm term{in, send[k].second};
    WEFT_RETURN_IF_ERROR(CudaError(
        LaunchWeightedSum(copy, KernelType(dtype), count, &term, 1, s.stream), "scaling a send"));
    send_data[k] = copy;
  }
  std::vector<void*> recv_data(recv.size());
  for (size_t k = 0; k < recv.size(); ++k) {
    WEFT_ASSIGN_OR_RETURN(recv_data[k], Scratch(s.recv_scratch, k, bytes));
  }
  // Grouped, so that every send and receive progresses together (no ordering deadlock).
  WEFT_RETURN_IF_ERROR(NcclError(ncclGroupStart(), comm.nccl, "ncclGroupStart"));
  Status status;
  for (size_t k = 0; k < recv.size() && status.ok(); ++k) {
    status = NcclError(ncclRecv(recv_data[k], bytes, ncclUint8, recv[k].first, comm.nccl, s.stream),
                       comm.nccl, "ncclRecv");
  }
  for (size_t k = 0; k < send.size() && status.ok(); ++k) {
    status = NcclError(ncclSend(send_data[k], bytes, ncclUint8, send[k].first, comm.nccl, s.stream),
                       comm.nccl, "ncclSend");
  }
  Status end = NcclError(ncclGroupEnd(), comm.nccl, "ncclGroupEnd");
  WEFT_RETURN_IF_ERROR(status);
  WEFT_RETURN_IF_ERROR(end);
  std::vector<DeviceTerm> terms = {{in, self_weight}};
  for (size_t k = 0; k < recv.size(); ++k) {
    if (recv[k].second != 0.0) terms.push_back({recv_data[k], recv[k].second});
  }
  return CudaError(LaunchWeightedSum(out, KernelType(dtype), count, terms.data(),
                                     static_cast<int>(terms.size()), s.stream),
                   "combining the received tensors");
}

Status NcclBackend::NeighborAllreduce(const void* in, void* out, size_t count, DType dtype,
                                      double self_weight, const Peers& send, const Peers& recv,
                                      const Device& device) {
  WEFT_RETURN_IF_ERROR(Ready(state_->data, device));
  return ExchangeAndCombine(state_->data, in, out, count, dtype, self_weight, send, recv);
}

Status NcclBackend::Hierarchical(const void* in, void* out, size_t count, DType dtype,
                                 double self_weight, const Peers& send, const Peers& recv,
                                 int local_rank, int local_size, const Device& device) {
  State& s = *state_;
  WEFT_RETURN_IF_ERROR(Ready(s.local, device));
  WEFT_RETURN_IF_ERROR(NcclError(
      ncclAllReduce(in, out, count, NcclType(dtype), ncclSum, s.local.nccl, s.stream),
      s.local.nccl, "ncclAllReduce (inside the machine)"));
  if (local_rank == 0) {
    // Only local rank 0s run this: the bootstrap is collective over exactly them.
    WEFT_RETURN_IF_ERROR(Ready(s.cross, device));
    WEFT_RETURN_IF_ERROR(
        ExchangeAndCombine(s.cross, out, out, count, dtype, self_weight, send, recv));
  }
  WEFT_RETURN_IF_ERROR(NcclError(
      ncclBroadcast(out, out, count * DTypeSize(dtype), ncclUint8, 0, s.local.nccl, s.stream),
      s.local.nccl, "ncclBroadcast (inside the machine)"));
  if (local_size > 1) {
    WEFT_RETURN_IF_ERROR(
        CudaError(LaunchDivide(out, KernelType(dtype), count, local_size, s.stream), "averaging"));
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<Completion>> NcclBackend::Record() {
  State& s = *state_;
  cudaEvent_t event = nullptr;
  if (!s.free_events.empty()) {
    event = s.free_events.back();
    s.free_events.pop_back();
  } else {
    WEFT_CUDA_OR_RETURN(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  Status recorded = CudaError(cudaEventRecord(event, s.stream), "cudaEventRecord");
  if (!recorded.ok()) {
    s.free_events.push_back(event);
    return recorded;
  }
  return std::unique_ptr<Completion>(new Completion(this, event));
}

void NcclBackend::ReturnEvent(void* event) {
  state_->free_events.push_back(static_cast<cudaEvent_t>(event));
}

Status NcclBackend::Synchronize() {
  State& s = *state_;
  if (s.stream == nullptr) return OkStatus();
  WEFT_CUDA_OR_RETURN(cudaSetDevice(s.device));
  // Polls rather than cudaStreamSynchronize: a failed peer would otherwise block forever.
  for (;;) {
    const cudaError_t q = cudaStreamQuery(s.stream);
    WEFT_RETURN_IF_ERROR(AsyncError());
    if (q == cudaSuccess) return OkStatus();
    if (q != cudaErrorNotReady) return CudaError(q, "waiting for the device");
    std::this_thread::yield();
  }
}

Status NcclBackend::CopyToHost(void* host, const void* device_ptr, size_t bytes,
                               const Device& device) {
  WEFT_RETURN_IF_ERROR(Bind(device));
  // On the backend's stream, so the copy comes after the ops enqueued before it.
  WEFT_CUDA_OR_RETURN(
      cudaMemcpyAsync(host, device_ptr, bytes, cudaMemcpyDeviceToHost, state_->stream));
  WEFT_CUDA_OR_RETURN(cudaStreamSynchronize(state_->stream));
  return OkStatus();
}

Status NcclBackend::CopyToDevice(void* device_ptr, const void* host, size_t bytes,
                                 const Device& device) {
  WEFT_RETURN_IF_ERROR(Bind(device));
  WEFT_CUDA_OR_RETURN(
      cudaMemcpyAsync(device_ptr, host, bytes, cudaMemcpyHostToDevice, state_->stream));
  WEFT_CUDA_OR_RETURN(cudaStreamSynchronize(state_->stream));
  return OkStatus();
}

}  // namespace nccl
}  // namespace comm
}  // namespace weft
