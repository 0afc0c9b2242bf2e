// The only LibTorch translation unit of pipe/freeze: single-op ATen headers and the module
// header, not <torch/torch.h>, to keep its compile time small.
#include "pipe/freeze/torch_grad_norms.h"

#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/stack.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <utility>

namespace weft {
namespace pipe {

namespace {

// Runs `f`, turning LibTorch exceptions into a Status.
template <typename F>
auto Guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    return Internal("gradient norms: LibTorch failed: ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Internal("gradient norms: LibTorch failed: ", e.what());
  }
}

StatusOr<double> GroupGradNormUnguarded(const std::vector<at::Tensor>& params) {
  // Per-tensor norms stay on their device and are reduced there, so that a group costs one
  // host synchronization per device rather than one per parameter.
  std::vector<std::pair<c10::Device, std::vector<at::Tensor>>> by_device;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& param = params[i];
    if (!param.defined()) {
      return InvalidArgument("gradient norms: parameter ", i,
                             " of the group is an undefined tensor; pass the group's "
                             "parameters (e.g. module->parameters())");
    }
    const at::Tensor& grad = param.grad();
    if (!grad.defined()) continue;
    const at::Tensor values = grad.is_sparse() ? grad.coalesce().values() : grad;
    // In double: half-precision squares overflow at 256, and a float sum of many squares
    // loses the small layers the policy compares.
    at::Tensor norm = at::linalg_vector_norm(values.detach(), 2, c10::nullopt, false, at::kDouble);
    auto slot = by_device.begin();
    while (slot != by_device.end() && slot->first != norm.device()) ++slot;
    if (slot == by_device.end()) {
      by_device.emplace_back(norm.device(), std::vector<at::Tensor>{});
      slot = by_device.end() - 1;
    }
    slot->second.push_back(std::move(norm));
  }
  double squares = 0.0;
  for (const auto& device_norms : by_device) {
    const double partial = at::linalg_vector_norm(at::stack(device_norms.second), 2).item<double>();
    squares += partial * partial;
  }
  return std::sqrt(squares);
}

Status AddNorms(const std::vector<double>& norms, GradNormAccumulator* accumulator,
                int first_layer) {
  for (size_t i = 0; i < norms.size(); ++i) {
    if (!std::isfinite(norms[i])) {
      return InvalidArgument("gradient norms: group ", i, " (layer ",
                             first_layer + static_cast<int>(i),
                             ") has a non-finite gradient norm (", norms[i],
                             "); check its gradients for NaN/Inf; nothing was accumulated");
    }
  }
  for (size_t i = 0; i < norms.size(); ++i) {
    WEFT_RETURN_IF_ERROR(accumulator->Add(first_layer + static_cast<int>(i), norms[i]));
  }
  return OkStatus();
}

Status CheckRange(size_t groups, const GradNormAccumulator* accumulator, int first_layer) {
  if (accumulator == nullptr) {
    return InvalidArgument("gradient norms: the accumulator is null");
  }
  if (first_layer < 0 ||
      static_cast<int64_t>(first_layer) + static_cast<int64_t>(groups) > accumulator->layers()) {
    return InvalidArgument(
        "gradient norms: ", groups, " groups from layer ", first_layer,
        " do not fit an accumulator of ", accumulator->layers(),
        " layers; expected first_layer >= 0 and first_layer + groups <= ", accumulator->layers());
  }
  return OkStatus();
}

}  // namespace

StatusOr<double> GroupGradNorm(const std::vector<at::Tensor>& params) {
  return Guarded([&]() { return GroupGradNormUnguarded(params); });
}

Status AddGroupGradNorms(const std::vector<std::vector<at::Tensor>>& groups,
                         GradNormAccumulator* accumulator, int first_layer) {
  WEFT_RETURN_IF_ERROR(CheckRange(groups.size(), accumulator, first_layer));
  std::vector<double> norms;
  norms.reserve(groups.size());
  for (const auto& group : groups) {
    WEFT_ASSIGN_OR_RETURN(const double norm, GroupGradNorm(group));
    norms.push_back(norm);
  }
  return AddNorms(norms, accumulator, first_layer);
}

Status AddModuleGradNorms(const std::vector<const torch::nn::Module*>& groups,
                          GradNormAccumulator* accumulator, int first_layer) {
  WEFT_RETURN_IF_ERROR(CheckRange(groups.size(), accumulator, first_layer));
  std::vector<double> norms;
  norms.reserve(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i] == nullptr) {
      return InvalidArgument("gradient norms: module ", i, " (layer ",
                             first_layer + static_cast<int>(i),
                             ") is null; pass one module per layer group");
    }
    WEFT_ASSIGN_OR_RETURN(const double norm, Guarded([&]() -> StatusOr<double> {
                            return GroupGradNormUnguarded(groups[i]->parameters(/*recurse=*/true));
                          }));
    norms.push_back(norm);
  }
  return AddNorms(norms, accumulator, first_layer);
}

}  // namespace pipe
}  // namespace weft
