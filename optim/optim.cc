#include "optim/optim.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/comm.h"
#include "comm/torch/torch_comm.h"
#include "core/codec.h"
#include "core/logging.h"

namespace weft {
namespace optim {

const char* AlgorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::kAdaptWithCombine: return "adapt-with-combine";
    case Algorithm::kAdaptThenCombine: return "adapt-then-combine";
    case Algorithm::kGradientAllreduce: return "gradient allreduce";
    case Algorithm::kWinPut: return "window put";
    case Algorithm::kPushSum: return "push-sum";
  }
  return "?";
}

const char* CommunicationTypeName(CommunicationType c) {
  switch (c) {
    case CommunicationType::kNeighborAllreduce: return "neighbor_allreduce";
    case CommunicationType::kHierarchicalNeighborAllreduce:
      return "hierarchical_neighbor_allreduce";
    case CommunicationType::kAllreduce: return "allreduce";
    case CommunicationType::kEmpty: return "empty";
  }
  return "?";
}

namespace {

bool CountsBackward(Algorithm a) {
  return a == Algorithm::kAdaptThenCombine || a == Algorithm::kGradientAllreduce;
}
bool UsesWindows(Algorithm a) { return a == Algorithm::kWinPut || a == Algorithm::kPushSum; }

std::atomic<int64_t> g_next_id{0};

std::string Describe(const std::string& name, const at::Tensor& t) {
  return absl::StrCat(name, " [", absl::StrJoin(t.sizes(), ", "), "] ",
                      c10::toString(t.scalar_type()));
}

// The same on every process, unlike std::hash.
uint64_t Fingerprint(const std::string& text) { return codec::Fingerprint().Str(text).value(); }

TensorView ViewOf(const at::Tensor& t) {
  auto v = torch_api::ToView(t);
  return v.ok() ? *v : TensorView();
}

}  // namespace

struct DistributedOptimizer::Param {
  std::string name;
  at::Tensor tensor;  // the model's parameter
  // Backward counting: the gradient accumulator and our hook on it.
  std::shared_ptr<torch::autograd::Node> accumulator;
  uintptr_t hook_key = 0;
  bool launched = false;     // this round's communication started
  torch_api::TorchHandle handle;  // collectives in flight
  Handle window_handle;            // window put / accumulate in flight
  std::string window;              // window optimizers
  at::Tensor numerator;            // push-sum: x (the parameter is x / p)
};

// Runs after a parameter's gradient was accumulated. Holds a shared pointer that the
// optimizer clears when it goes away, so a hook left behind does nothing.
class DistributedOptimizer::AccumulateHook : public torch::autograd::FunctionPostHook {
 public:
  AccumulateHook(std::shared_ptr<DistributedOptimizer*> owner, size_t index)
      : owner_(std::move(owner)), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    if (*owner_ != nullptr) (*owner_)->OnGradientReady(index_);
    return outputs;
  }

 private:
  std::shared_ptr<DistributedOptimizer*> owner_;
  size_t index_;
};

DistributedOptimizer::DistributedOptimizer(Algorithm algorithm,
                                           std::shared_ptr<torch::optim::Optimizer> optimizer,
                                           std::shared_ptr<torch::nn::Module> model,
                                           const Options& options, StepCounter counter)
    : algorithm_(algorithm),
      optimizer_(std::move(optimizer)),
      model_(std::move(model)),
      options_(options),
      counter_(std::move(counter)),
      owner_(std::make_shared<DistributedOptimizer*>(this)) {}

StatusOr<std::unique_ptr<DistributedOptimizer>> DistributedOptimizer::Create(
    Algorithm algorithm, std::shared_ptr<torch::optim::Optimizer> optimizer,
    std::shared_ptr<torch::nn::Module> model, const Options& options) {
  const std::string what = absl::StrCat("distributed optimizer (", AlgorithmName(algorithm), ")");
  if (!is_initialized()) {
    return FailedPrecondition(what, ": weft is not initialized; call init() first");
  }
  if (optimizer == nullptr) return InvalidArgument(what, ": the optimizer is null");
  if (model == nullptr) return InvalidArgument(what, ": the model is null");
  // Counted per pass of the model (forward) or per parameter (backward); the unit count is
  // fixed below once the parameters are known.
  int units = 1;
  if (CountsBackward(algorithm)) {
    units = 0;
    for (const auto& p : model->parameters()) units += p.requires_grad() ? 1 : 0;
  }
  auto counter = StepCounter::Create(
      options.num_steps_per_communication,
      CountsBackward(algorithm) ? StepCounter::Counts::kBackward : StepCounter::Counts::kForward,
      std::max(units, 1));
  if (!counter.ok()) return Annotate(counter.status(), what);
  std::unique_ptr<DistributedOptimizer> opt(new DistributedOptimizer(
      algorithm, std::move(optimizer), std::move(model), options, std::move(*counter)));
  WEFT_RETURN_IF_ERROR(Annotate(opt->Init(), what));
  return opt;
}

Status DistributedOptimizer::Init() {
  id_ = g_next_id.fetch_add(1);
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    auto p = std::make_unique<Param>();
    p->name = item.key();
    p->tensor = item.value();
    params_.push_back(std::move(p));
  }
  if (params_.empty()) {
    return InvalidArgument("the model has no parameter that requires grad: there is nothing "
                           "to train or to communicate");
  }
  std::set<const void*> held;
  for (const auto& group : optimizer_->param_groups()) {
    for (const auto& t : group.params()) held.insert(t.unsafeGetTensorImpl());
  }
  std::string signature;
  for (const auto& p : params_) {
    if (!held.count(p->tensor.unsafeGetTensorImpl())) {
      return InvalidArgument("the wrapped optimizer does not hold the model's trainable "
                             "parameter ", Describe(p->name, p->tensor),
                             "; build it from model->parameters()");
    }
    if (p->tensor.device().type() != c10::DeviceType::CPU &&
        p->tensor.device().type() != c10::DeviceType::CUDA) {
      return InvalidArgument("parameter ", Describe(p->name, p->tensor), " is on ",
                             p->tensor.device().str(), ", which weft does not support");
    }
    absl::StrAppend(&signature, Describe(p->name, p->tensor), ";");
  }

  // Every rank must train the same parameters, or names would match tensors of other
  // shapes (or never match). One allgather of a fingerprint finds out.
  at::Tensor mine = at::full({1}, static_cast<int64_t>(Fingerprint(signature)), at::kLong);
  WEFT_ASSIGN_OR_RETURN(at::Tensor all,
                        torch_api::allgather(mine, absl::StrCat("weft.opt", id_, ".check")));
  std::vector<int> differ;
  for (int r = 0; r < all.size(0); ++r) {
    if (all[r].item<int64_t>() != mine[0].item<int64_t>()) differ.push_back(r);
  }
  if (!differ.empty()) {
    std::vector<std::string> first;
    for (size_t i = 0; i < params_.size() && i < 4; ++i) {
      first.push_back(Describe(params_[i]->name, params_[i]->tensor));
    }
    return InvalidArgument(
        "the trainable parameters (names, shapes, dtypes) differ across ranks: rank ",
        rank(), " and rank(s) ", absl::StrJoin(differ, ", "), " disagree. Rank ", rank(),
        " has ", params_.size(), ": ", absl::StrJoin(first, ", "),
        params_.size() > first.size() ? ", ..." : "", ". Every rank must build the same model");
  }

  if (CountsBackward(algorithm_)) {
    for (size_t i = 0; i < params_.size(); ++i) {
      Param& p = *params_[i];
      p.accumulator = torch::autograd::impl::grad_accumulator(p.tensor);
      if (p.accumulator == nullptr) {
        return InvalidArgument("parameter ", Describe(p.name, p.tensor),
                               " has no gradient accumulator (is it a leaf?)");
      }
      p.hook_key = p.accumulator->add_post_hook(std::make_unique<AccumulateHook>(owner_, i));
    }
  }
  if (UsesWindows(algorithm_)) {
    for (auto& p : params_) {
      if (!p->tensor.is_contiguous()) {
        return InvalidArgument("parameter ", Describe(p->name, p->tensor),
                               " is not contiguous; window optimizers need contiguous "
                               "parameters");
      }
      p->window = OpName(*p);
      const bool push_sum = algorithm_ == Algorithm::kPushSum;
      if (push_sum) p->numerator = p->tensor.detach().clone();
      // Push-sum starts from empty buffers (their p is 0 too); window put from copies.
      WEFT_RETURN_IF_ERROR(win_create(ViewOf(push_sum ? p->numerator : p->tensor.detach()),
                                      p->window, /*zero_init=*/push_sum));
      windows_.push_back(p->window);
    }
  }
  return OkStatus();
}

DistributedOptimizer::~DistributedOptimizer() {
  *owner_ = nullptr;
  for (auto& p : params_) {
    if (p->accumulator != nullptr) p->accumulator->del_post_hook(p->hook_key);
  }
  if (!closed_ && is_initialized()) {
    Status s = close();
    if (!s.ok()) WEFT_LOG(Warning) << "distributed optimizer: closing: " << s;
  }
}

std::string DistributedOptimizer::OpName(const Param& p) const {
  return absl::StrCat("weft.opt", id_, ".", p.name);
}

void DistributedOptimizer::Counted(StatusOr<StepCounter::Event> event, size_t index) {
  if (!event.ok()) {
    if (deferred_.ok()) deferred_ = event.status();
    return;
  }
  switch (*event) {
    case StepCounter::Event::kCommunicate: {
      if (!options_.overlap) break;  // step() launches everything
      Status s;
      if (CountsBackward(algorithm_)) {
        if (algorithm_ == Algorithm::kAdaptThenCombine) StepOnly(index);
        s = Launch(index);
      } else {
        for (size_t i = 0; i < params_.size() && s.ok(); ++i) s = Launch(i);
      }
      if (!s.ok() && deferred_.ok()) deferred_ = s;
      break;
    }
    case StepCounter::Event::kMisuse:
      ++misuse_warnings_;
      WEFT_LOG(Warning) << counter_.MisuseWarning();
      break;
    default:
      break;
  }
}

void DistributedOptimizer::CountForward() {
  if (CountsBackward(algorithm_) || closed_) return;
  bool counted = torch::autograd::GradMode::is_enabled();
  if (counted) {
    counted = std::any_of(params_.begin(), params_.end(),
                          [](const auto& p) { return p->tensor.requires_grad(); });
  }
  Counted(counter_.OnComputation(0, counted), 0);
}

void DistributedOptimizer::OnGradientReady(size_t index) {
  if (closed_) return;
  Counted(counter_.OnComputation(static_cast<int>(index), true), index);
}

void DistributedOptimizer::StepOnly(size_t index) {
  Param& p = *params_[index];
  if (!p.tensor.grad().defined()) return;
  std::vector<std::pair<at::Tensor, at::Tensor>> hidden;
  for (auto& group : optimizer_->param_groups()) {
    for (auto& q : group.params()) {
      if (q.unsafeGetTensorImpl() == p.tensor.unsafeGetTensorImpl()) continue;
      if (!q.grad().defined()) continue;
      hidden.emplace_back(q, q.grad());
      q.mutable_grad() = at::Tensor();
    }
  }
  optimizer_->step();
  for (auto& [q, g] : hidden) q.mutable_grad() = g;
}

Status DistributedOptimizer::Launch(size_t index) {
  Param& p = *params_[index];
  if (p.launched) return OkStatus();
  p.launched = true;
  torch::NoGradGuard no_grad;
  const std::string name = OpName(p);
  const at::Tensor x = p.tensor.detach();
  switch (algorithm_) {
    case Algorithm::kAdaptWithCombine:
    case Algorithm::kAdaptThenCombine:
      switch (options_.communication_type) {
        case CommunicationType::kNeighborAllreduce: {
          NeighborAllreduceOptions o;
          o.self_weight = weights_.self_weight;
          o.src_weights = weights_.src_weights;
          o.dst_weights = weights_.dst_weights;
          WEFT_ASSIGN_OR_RETURN(p.handle, torch_api::neighbor_allreduce_nonblocking(x, o, name));
          break;
        }
        case CommunicationType::kHierarchicalNeighborAllreduce: {
          HierarchicalNeighborAllreduceOptions o;
          o.self_weight = weights_.self_weight;
          o.src_machine_weights = weights_.src_machine_weights;
          o.dst_machine_weights = weights_.dst_machine_weights;
          WEFT_ASSIGN_OR_RETURN(
              p.handle, torch_api::hierarchical_neighbor_allreduce_nonblocking(x, o, name));
          break;
        }
        case CommunicationType::kAllreduce: {
          WEFT_ASSIGN_OR_RETURN(p.handle, torch_api::allreduce_nonblocking(x, true, name));
          break;
        }
        case CommunicationType::kEmpty:
          break;
      }
      return OkStatus();
    case Algorithm::kGradientAllreduce: {
      // A copy: a (mistaken) further backward would otherwise add into what is being sent.
      const at::Tensor g = p.tensor.grad().defined() ? p.tensor.grad().detach().clone()
                                                     : at::zeros_like(x);
      WEFT_ASSIGN_OR_RETURN(p.handle, torch_api::allreduce_nonblocking(g, true, name));
      return OkStatus();
    }
    case Algorithm::kWinPut: {
      WinPutOptions o;
      o.dst_weights = weights_.dst_weights;
      o.require_mutex = true;
      WEFT_ASSIGN_OR_RETURN(p.window_handle, win_put_nonblocking(ViewOf(x), p.window, o));
      return OkStatus();
    }
    case Algorithm::kPushSum: {
      WEFT_ASSIGN_OR_RETURN(double ps, win_associated_p(p.window));
      p.numerator.copy_(x * ps);
      std::map<int, double> dsts;
      if (weights_.dst_weights.has_value()) {
        for (const auto& entry : *weights_.dst_weights) dsts[entry.first] = 0;
      } else {
        for (int r : out_neighbor_ranks()) dsts[r] = 0;
      }
      const double w = 1.0 / static_cast<double>(dsts.size() + 1);
      for (auto& entry : dsts) entry.second = w;
      WinPutOptions o;
      o.self_weight = w;
      o.dst_weights = dsts;
      o.require_mutex = true;
      WEFT_ASSIGN_OR_RETURN(p.window_handle,
                            win_accumulate_nonblocking(ViewOf(p.numerator), p.window, o));
      return OkStatus();
    }
  }
  return OkStatus();
}

Status DistributedOptimizer::Finish(size_t index) {
  Param& p = *params_[index];
  if (!p.launched) return OkStatus();
  p.launched = false;
  torch::NoGradGuard no_grad;
  const at::Tensor x = p.tensor.detach();
  switch (algorithm_) {
    case Algorithm::kAdaptWithCombine:
    case Algorithm::kAdaptThenCombine:
    case Algorithm::kGradientAllreduce: {
      if (!p.handle.valid()) return OkStatus();  // communication type empty
      torch_api::TorchHandle h = std::move(p.handle);
      p.handle = torch_api::TorchHandle();
      WEFT_ASSIGN_OR_RETURN(at::Tensor out, h.wait());
      if (algorithm_ != Algorithm::kGradientAllreduce) {
        x.copy_(out);
      } else if (p.tensor.grad().defined()) {
        p.tensor.mutable_grad().copy_(out);
      } else {
        p.tensor.mutable_grad() = out;
      }
      return OkStatus();
    }
    case Algorithm::kWinPut: {
      WEFT_RETURN_IF_ERROR(wait(p.window_handle));
      p.window_handle = Handle();
      WinUpdateOptions o;
      if (weights_.self_weight.has_value() || weights_.src_weights.has_value()) {
        o.self_weight = weights_.self_weight;
        o.neighbor_weights = weights_.src_weights;
      }
      o.require_mutex = true;
      return win_update(p.window, o);
    }
    case Algorithm::kPushSum: {
      WEFT_RETURN_IF_ERROR(wait(p.window_handle));
      p.window_handle = Handle();
      WEFT_RETURN_IF_ERROR(win_update_then_collect(p.window, /*require_mutex=*/true));
      WEFT_ASSIGN_OR_RETURN(double ps, win_associated_p(p.window));
      x.copy_(p.numerator / ps);
      return OkStatus();
    }
  }
  return OkStatus();
}

Status DistributedOptimizer::step() {
  if (closed_) return FailedPrecondition("step(): the distributed optimizer was closed");
  Status status = deferred_;
  deferred_ = OkStatus();
  StatusOr<bool> communicate = counter_.OnStep();
  if (!communicate.ok()) {
    return Annotate(communicate.status(),
                    CountsBackward(algorithm_)
                        ? "step()"
                        : "step() (run the model's forward through the optimizer: "
                          "opt->forward([&] { return model->forward(x); }))");
  }
  if (!*communicate) {
    if (status.ok()) optimizer_->step();
    return status;
  }
  // An S: everything not launched yet goes now (every rank communicates every parameter),
  // then each result is installed.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i]->launched) continue;
    if (algorithm_ == Algorithm::kAdaptThenCombine) StepOnly(i);
    Status s = Launch(i);
    if (status.ok()) status = s;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    Status s = Finish(i);
    if (status.ok()) status = s;
  }
  if (!status.ok()) return status;
  // Adapt-then-combine updated each parameter before launching it.
  if (algorithm_ != Algorithm::kAdaptThenCombine) optimizer_->step();
  return OkStatus();
}

Status DistributedOptimizer::close() {
  if (closed_) return OkStatus();
  closed_ = true;
  Status status;
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = *params_[i];
    if (!p.launched) continue;
    p.launched = false;
    Status s = p.handle.valid() ? p.handle.wait().status() : OkStatus();
    if (p.window_handle.valid()) s = wait(p.window_handle);
    if (status.ok()) status = s;
  }
  for (const std::string& w : windows_) {
    Status s = win_free(w);
    if (status.ok()) status = s;
  }
  windows_.clear();
  return status;
}

// --- helpers -----------------------------------------------------------------------------

namespace {

template <typename Start>
Status OverAll(const torch::OrderedDict<std::string, torch::Tensor>& params, const char* what,
               Start start) {
  std::vector<torch_api::TorchHandle> handles;
  Status status;
  for (const auto& item : params) {
    auto h = start(item.value().detach(), absl::StrCat("weft.", what, ".", item.key()));
    if (!h.ok()) {
      status = h.status();
      break;
    }
    handles.push_back(*h);
  }
  for (auto& h : handles) {
    Status s = h.wait().status();
    if (status.ok()) status = s;
  }
  return status;
}

}  // namespace

Status broadcast_parameters(const torch::OrderedDict<std::string, torch::Tensor>& params,
                            int root_rank) {
  return OverAll(params, "broadcast_parameters", [root_rank](const at::Tensor& t,
                                                             const std::string& name) {
    return torch_api::broadcast_nonblocking_(t, root_rank, name);
  });
}

Status allreduce_parameters(const torch::OrderedDict<std::string, torch::Tensor>& params) {
  return OverAll(params, "allreduce_parameters",
                 [](const at::Tensor& t, const std::string& name) {
                   return torch_api::allreduce_nonblocking_(t, true, name);
                 });
}

StatusOr<std::string> SaveOptimizerState(torch::optim::Optimizer& optimizer) {
  try {
    // The state as LibTorch serializes it (per-parameter state keyed by position in the
    // parameter groups, and the groups' options).
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    // LibTorch 1.13 saves the groups' options but its load drops them: carry them apart.
    for (size_t i = 0; i < optimizer.param_groups().size(); ++i) {
      torch::serialize::OutputArchive options;
      optimizer.param_groups()[i].options().serialize(options);
      archive.write(absl::StrCat("weft_group_options_", i), options);
    }
    std::ostringstream out;
    archive.save_to(out);
    return out.str();
  } catch (const std::exception& e) {
    return Internal("SaveOptimizerState: LibTorch could not save the optimizer: ", e.what());
  }
}

Status LoadOptimizerState(torch::optim::Optimizer& optimizer, const std::string& bytes) {
  try {
    std::istringstream in(bytes);
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    optimizer.load(archive);
    for (size_t i = 0; i < optimizer.param_groups().size(); ++i) {
      torch::serialize::InputArchive options;
      archive.read(absl::StrCat("weft_group_options_", i), options);
      optimizer.param_groups()[i].options().serialize(options);
    }
  } catch (const std::exception& e) {
    return InvalidArgument("LoadOptimizerState: the state does not fit this optimizer (same "
                           "optimizer type and parameter groups?): ", e.what());
  }
  return OkStatus();
}

Status broadcast_optimizer_state(torch::optim::Optimizer& optimizer, int root_rank) {
  if (!is_initialized()) {
    return FailedPrecondition("broadcast_optimizer_state: weft is not initialized; call "
                              "init() first");
  }
  if (root_rank < 0 || root_rank >= size()) {
    return InvalidArgument("broadcast_optimizer_state: root_rank ", root_rank,
                           " is out of range [0, ", size(), ")");
  }
  std::string bytes;
  if (rank() == root_rank) {
    WEFT_ASSIGN_OR_RETURN(bytes, SaveOptimizerState(optimizer));
  }
  at::Tensor length = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);
  WEFT_RETURN_IF_ERROR(torch_api::broadcast_(length, root_rank, "weft.optimizer_state.size"));
  at::Tensor data = at::empty({length[0].item<int64_t>()}, at::kByte);
  if (rank() == root_rank) std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
  WEFT_RETURN_IF_ERROR(torch_api::broadcast_(data, root_rank, "weft.optimizer_state.bytes"));
  if (rank() == root_rank) return OkStatus();
  const Status loaded = LoadOptimizerState(
      optimizer, std::string(static_cast<const char*>(data.data_ptr()),
                             static_cast<size_t>(data.numel())));
  if (!loaded.ok()) {
    return InvalidArgument("broadcast_optimizer_state: rank ", rank(), " could not load rank ",
                           root_rank, "'s optimizer state: ", loaded.message());
  }
  return OkStatus();
}

StatusOr<double> consensus_distance(
    const torch::OrderedDict<std::string, torch::Tensor>& params) {
  if (params.is_empty()) return InvalidArgument("consensus_distance: no parameters given");
  std::vector<at::Tensor> flat;
  for (const auto& item : params) {
    flat.push_back(item.value().detach().to(at::kCPU, at::kDouble).reshape({-1}));
  }
  const at::Tensor x = at::cat(flat);
  WEFT_ASSIGN_OR_RETURN(at::Tensor mean,
                        torch_api::allreduce(x, true, "weft.consensus_distance.mean"));
  at::Tensor squared = (x - mean).pow(2).sum().reshape({1});
  WEFT_ASSIGN_OR_RETURN(at::Tensor total,
                        torch_api::allreduce(squared, false, "weft.consensus_distance.sum"));
  return std::sqrt(total[0].item<double>() / static_cast<double>(size()));
}

}  // namespace optim
}  // namespace weft
