// weft's communication API on LibTorch tensors: pass an at::Tensor (torch::Tensor is the
// same type), get an at::Tensor back. A thin adapter over comm/comm.h; semantics (matching
// by name or call order, topology, weights) are those of comm/comm.h and comm/README.md.
//
//   auto avg = weft::torch_api::allreduce(grad);           // out of place, average
//   weft::Status s = weft::torch_api::allreduce_(param);   // in place
//
// - Out-of-place forms return a new contiguous tensor of the input's dtype and shape and
//   leave the input untouched. In-place forms (trailing underscore) write into the given
//   tensor; a non-contiguous one is computed on a contiguous copy and copied back, so the
//   result lands in its storage with its layout.
// - Supported: CPU dense tensors of float32, float64, float16, bfloat16, int32, int64,
//   int16, int8 and uint8. Other dtypes (bool, complex, quantized...) and devices fail with
//   Unimplemented before anything is sent; an undefined tensor is InvalidArgument. CUDA
//   tensors need weft's NCCL backend, which this build does not include.
// - No autograd: ops run under NoGradGuard (in-place forms work on parameters that
//   require grad, as Bluefog's `p.data` updates do) and outputs do not require grad.
// - A nonblocking op reads its input until it completes: do not modify the input (or, for
//   in-place forms, the tensor) before poll() is true or wait() returned.
#ifndef WEFT_COMM_TORCH_TORCH_COMM_H_
#define WEFT_COMM_TORCH_TORCH_COMM_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "core/status.h"
#include "core/tensor.h"

namespace weft {
namespace torch_api {

// --- conversions -----------------------------------------------------------------------
// A view of the tensor's memory (data pointer at its storage offset, shape, strides in
// elements, device); keep the tensor alive while the view is used. CUDA tensors map to
// CUDA views (the ops below still reject them in this build).
StatusOr<TensorView> ToView(const at::Tensor& tensor);
// Unimplemented for dtypes weft does not support, naming the dtype and the supported list.
StatusOr<DType> ToDType(at::ScalarType type);
at::ScalarType ToScalarType(DType dtype);

// --- nonblocking ops -----------------------------------------------------------------------
// A nonblocking op in flight on LibTorch tensors. Copyable (copies share the op). Holds the
// tensors the op reads and writes; if every copy is dropped before the op completes they are
// kept alive until it does (but an in-place result on a non-contiguous tensor is then never
// copied back: that happens in poll() or wait()).
class TorchHandle {
 public:
  TorchHandle() = default;
  bool valid() const { return state_ != nullptr; }
  // True once the op has completed; for an in-place op on a non-contiguous tensor, the
  // result has then been copied back.
  bool poll() const;
  // Waits for the op and returns its output: the new tensor for out-of-place ops, the given
  // tensor for in-place ones. Waiting again returns the same result.
  StatusOr<at::Tensor> wait() const;
  // The underlying weft handle.
  const Handle& handle() const;

  // Internal: the ops below create handles.
  struct State;
  explicit TorchHandle(std::shared_ptr<State> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<State> state_;
};

// `ranks`: a process set (comm/comm.h); empty = every rank.
StatusOr<TorchHandle> allreduce_nonblocking(const at::Tensor& tensor, bool average = true,
                                            const std::string& name = "",
                                            const std::vector<int>& ranks = {});
StatusOr<TorchHandle> allreduce_nonblocking_(const at::Tensor& tensor, bool average = true,
                                             const std::string& name = "",
                                             const std::vector<int>& ranks = {});
StatusOr<TorchHandle> broadcast_nonblocking(const at::Tensor& tensor, int root_rank,
                                            const std::string& name = "",
                                            const std::vector<int>& ranks = {});
StatusOr<TorchHandle> broadcast_nonblocking_(const at::Tensor& tensor, int root_rank,
                                             const std::string& name = "",
                                             const std::vector<int>& ranks = {});
// Point to point (comm/comm.h). wait() returns: the sent tensor (send), the given tensor
// (recv_), a new CPU tensor of the sender's dtype and shape (recv).
StatusOr<TorchHandle> send_nonblocking(const at::Tensor& tensor, int dst,
                                       const std::string& name = "");
StatusOr<TorchHandle> recv_nonblocking_(const at::Tensor& tensor, int src,
                                        const std::string& name = "");
StatusOr<TorchHandle> recv_nonblocking(int src, const std::string& name = "");
StatusOr<TorchHandle> allgather_nonblocking(const at::Tensor& tensor,
                                            const std::string& name = "");
StatusOr<TorchHandle> neighbor_allgather_nonblocking(
    const at::Tensor& tensor, const NeighborAllgatherOptions& options = {},
    const std::string& name = "");
StatusOr<TorchHandle> neighbor_allreduce_nonblocking(
    const at::Tensor& tensor, const NeighborAllreduceOptions& options = {},
    const std::string& name = "");
StatusOr<TorchHandle> neighbor_allreduce_nonblocking_(
    const at::Tensor& tensor, const NeighborAllreduceOptions& options = {},
    const std::string& name = "");
StatusOr<TorchHandle> hierarchical_neighbor_allreduce_nonblocking(
    const at::Tensor& tensor, const HierarchicalNeighborAllreduceOptions& options = {},
    const std::string& name = "");
StatusOr<TorchHandle> pair_gossip_nonblocking(const at::Tensor& tensor, int peer,
                                              double self_weight = 0.5,
                                              double pair_weight = 0.5,
                                              const std::string& name = "");

// --- blocking ops ------------------------------------------------------------------------
StatusOr<at::Tensor> allreduce(const at::Tensor& tensor, bool average = true,
                               const std::string& name = "",
                               const std::vector<int>& ranks = {});
Status allreduce_(const at::Tensor& tensor, bool average = true, const std::string& name = "",
                  const std::vector<int>& ranks = {});

StatusOr<at::Tensor> broadcast(const at::Tensor& tensor, int root_rank,
                               const std::string& name = "",
                               const std::vector<int>& ranks = {});
Status broadcast_(const at::Tensor& tensor, int root_rank, const std::string& name = "",
                  const std::vector<int>& ranks = {});

Status send(const at::Tensor& tensor, int dst, const std::string& name = "");
// Into `tensor`: its dtype and shape must be the sender's.
Status recv_(const at::Tensor& tensor, int src, const std::string& name = "");
// A new contiguous CPU tensor of the sender's dtype and shape.
StatusOr<at::Tensor> recv(int src, const std::string& name = "");

// Concatenation along dim 0 of every rank's tensor, in rank order; dim 0 may differ.
StatusOr<at::Tensor> allgather(const at::Tensor& tensor, const std::string& name = "");

// Concatenation of the in-neighbors' tensors (ordered by rank, or as options.src_ranks).
StatusOr<at::Tensor> neighbor_allgather(const at::Tensor& tensor,
                                        const NeighborAllgatherOptions& options = {},
                                        const std::string& name = "");

StatusOr<at::Tensor> neighbor_allreduce(const at::Tensor& tensor,
                                        const NeighborAllreduceOptions& options = {},
                                        const std::string& name = "");
Status neighbor_allreduce_(const at::Tensor& tensor,
                           const NeighborAllreduceOptions& options = {},
                           const std::string& name = "");

StatusOr<at::Tensor> hierarchical_neighbor_allreduce(
    const at::Tensor& tensor, const HierarchicalNeighborAllreduceOptions& options = {},
    const std::string& name = "");
Status hierarchical_neighbor_allreduce_(const at::Tensor& tensor,
                                        const HierarchicalNeighborAllreduceOptions& options = {},
                                        const std::string& name = "");

// Both peers end with self_weight * own + pair_weight * peer's.
StatusOr<at::Tensor> pair_gossip(const at::Tensor& tensor, int peer, double self_weight = 0.5,
                                 double pair_weight = 0.5, const std::string& name = "");
Status pair_gossip_(const at::Tensor& tensor, int peer, double self_weight = 0.5,
                    double pair_weight = 0.5, const std::string& name = "");

}  // namespace torch_api
}  // namespace weft

#endif  // WEFT_COMM_TORCH_TORCH_COMM_H_
