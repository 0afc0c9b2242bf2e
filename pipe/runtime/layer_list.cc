// LayerList over the two kinds of models weft runs: a C++ torch::nn::Sequential and a
// TorchScript module loaded from a file. One of the two LibTorch translation units of
// pipe/runtime (with pipeline.cc): narrow headers rather than <torch/torch.h>, to keep
// their compile time down.
#include <c10/util/Exception.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstddef>
#include <exception>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "pipe/runtime/runtime.h"

namespace weft {
namespace pipe {

// Exactly one of the two representations is filled. Copies of a LayerList share one Impl,
// so they share the modules (and their parameters) as the header promises.
struct LayerList::Impl {
  // From a Sequential: the root (for Train) and its children as type-erased modules, whose
  // forward takes and returns one tensor.
  std::shared_ptr<torch::nn::Module> root;
  std::vector<torch::nn::AnyModule> any;

  // From TorchScript: the loaded module and its direct children. jit::Module is a handle
  // to a shared object, so these copies alias the loaded module's children.
  bool scripted = false;
  torch::jit::Module script_root;
  std::vector<torch::jit::Module> script_children;
};

StatusOr<LayerList> LayerList::FromSequential(const torch::nn::Sequential& seq) {
  if (seq.is_empty() || seq->size() == 0) {
    return InvalidArgument("LayerList::FromSequential: the Sequential has no layers");
  }
  auto impl = std::make_shared<Impl>();
  impl->root = seq.ptr();
  // AnyModule copies share the wrapped module; they only copy the type-erasing holder.
  for (auto it = seq->begin(); it != seq->end(); ++it) impl->any.push_back(*it);
  LayerList list;
  list.impl_ = std::move(impl);
  return list;
}

StatusOr<LayerList> LayerList::Load(const std::string& path) {
  // torch::jit::load reports a missing file and a corrupt one with the same exception;
  // checking first gives the caller a NotFound it can act on.
  if (!std::ifstream(path, std::ios::binary).good()) {
    return absl::NotFoundError(
        absl::StrCat("LayerList::Load: cannot open TorchScript file \"", path, "\""));
  }
  auto impl = std::make_shared<Impl>();
  impl->scripted = true;
  try {
    impl->script_root = torch::jit::load(path);
  } catch (const c10::Error& e) {
    return InvalidArgument("LayerList::Load: \"", path,
                           "\" is not a readable TorchScript module: ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    return InvalidArgument("LayerList::Load: \"", path,
                           "\" is not a readable TorchScript module: ", e.what());
  }
  for (const torch::jit::Module& child : impl->script_root.children()) {
    impl->script_children.push_back(child);
  }
  if (impl->script_children.empty()) {
    return InvalidArgument("LayerList::Load: the module in \"", path,
                           "\" has no child modules (expected e.g. a scripted "
                           "torch.nn.Sequential; a frozen or traced-flat module has none)");
  }
  LayerList list;
  list.impl_ = std::move(impl);
  return list;
}

int LayerList::size() const {
  if (impl_ == nullptr) return 0;
  return static_cast<int>(impl_->scripted ? impl_->script_children.size() : impl_->any.size());
}

at::Tensor LayerList::Forward(int layer, const at::Tensor& x) const {
  TORCH_CHECK(layer >= 0 && layer < size(), "LayerList::Forward: layer ", layer,
              " out of range [0, ", size(), ")");
  if (impl_->scripted) {
    return impl_->script_children[static_cast<size_t>(layer)].forward({x}).toTensor();
  }
  return impl_->any[static_cast<size_t>(layer)].forward(x);
}

std::vector<std::pair<std::string, at::Tensor>> LayerList::NamedParameters(int layer) const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (layer < 0 || layer >= size()) return out;
  // Both orders are registration order (recursively), fixed by the model's definition,
  // hence the same on every rank building or loading the same model.
  if (impl_->scripted) {
    for (const auto& item :
         impl_->script_children[static_cast<size_t>(layer)].named_parameters(true)) {
      out.emplace_back(item.name, item.value);
    }
  } else {
    for (const auto& item : impl_->any[static_cast<size_t>(layer)].ptr()->named_parameters(true)) {
      out.emplace_back(item.key(), item.value());
    }
  }
  return out;
}

std::vector<at::Tensor> LayerList::Parameters(int layer) const {
  std::vector<at::Tensor> out;
  for (auto& named : NamedParameters(layer)) out.push_back(std::move(named.second));
  return out;
}

std::vector<at::Tensor> LayerList::Buffers(int layer) const {
  std::vector<at::Tensor> out;
  if (layer < 0 || layer >= size()) return out;
  if (impl_->scripted) {
    for (const auto& item :
         impl_->script_children[static_cast<size_t>(layer)].named_buffers(true)) {
      out.push_back(item.value);
    }
  } else {
    for (const auto& item : impl_->any[static_cast<size_t>(layer)].ptr()->named_buffers(true)) {
      out.push_back(item.value());
    }
  }
  return out;
}

std::vector<double> LayerList::ParameterCounts() const {
  std::vector<double> counts;
  for (int layer = 0; layer < size(); ++layer) {
    double count = 0;
    for (const at::Tensor& p : Parameters(layer)) count += static_cast<double>(p.numel());
    counts.push_back(count);
  }
  return counts;
}

void LayerList::Train(bool on) {
  if (impl_ == nullptr) return;
  // The roots recurse into every layer (and set their own flag, which a scripted root's
  // forward would read if someone ran it whole).
  if (impl_->scripted) {
    impl_->script_root.train(on);
  } else {
    impl_->root->train(on);
  }
}

}  // namespace pipe
}  // namespace weft
