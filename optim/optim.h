// Distributed optimizers over LibTorch optimizers (optim/README.md).
//
// A DistributedOptimizer wraps any torch::optim::Optimizer and the model it trains, and
// decides when parameters (or gradients) are communicated, counting computations with the
// step counter of optim/step_counter.h (num_steps_per_communication, J):
//
//   auto opt = weft::optim::DistributedOptimizer::Create(
//       weft::optim::Algorithm::kAdaptWithCombine,
//       std::make_shared<torch::optim::SGD>(model->parameters(), 0.1), model.ptr());
//   for (...) {
//     (*opt)->zero_grad();
//     auto out = (*opt)->forward([&] { return model->forward(x); });   // counted
//     loss_fn(out, y).backward();
//     weft::Status s = (*opt)->step();                                 // S or s
//   }
//
// LibTorch modules have no forward hooks, so the optimizers that count forward
// computations (adapt-with-combine, window put, push-sum) see them through forward(fn);
// a step() before any counted computation is an error (FailedPrecondition), so forgetting
// it cannot silently train locally. The optimizers that count backward computations
// (adapt-then-combine, gradient allreduce) hook each parameter's gradient accumulator and
// launch its communication as soon as its gradient is ready, overlapping the rest of the
// backward pass; forward(fn) is then just fn().
//
// Every rank must construct the same optimizers in the same order (construction is
// collective: it checks that the trainable parameters agree across ranks).
#ifndef WEFT_OPTIM_OPTIM_H_
#define WEFT_OPTIM_OPTIM_H_

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "optim/step_counter.h"

namespace weft {
namespace optim {

enum class Algorithm {
  // x <- W x - lr g(x): the parameters' communication starts after the counted forward
  // that completes a round (overlapping backward); step() installs W x, then the local
  // update from the pre-combine gradient. Counts forward computations.
  kAdaptWithCombine,
  // x <- W (x - lr g(x)): each parameter's local update and communication start inside
  // its gradient hook. Counts backward computations.
  kAdaptThenCombine,
  // Data parallel: gradients averaged over all ranks (launched per parameter as each is
  // ready), then the local update. Counts backward computations.
  kGradientAllreduce,
  // Asynchronous: after the counted forward, win_put of the parameters to the
  // out-neighbors; step() does win_update under the window mutex, then the local update.
  // Counts forward computations.
  kWinPut,
  // For directed (column-stochastic) mixing: [x, p] pushed with win_accumulate, x / p used
  // as the parameters. Counts forward computations.
  kPushSum,
};
const char* AlgorithmName(Algorithm a);

// How adapt-with-combine and adapt-then-combine combine.
enum class CommunicationType {
  kNeighborAllreduce,
  kHierarchicalNeighborAllreduce,
  kAllreduce,
  kEmpty,  // no communication: local training
};
const char* CommunicationTypeName(CommunicationType c);

struct Options {
  CommunicationType communication_type = CommunicationType::kNeighborAllreduce;
  int64_t num_steps_per_communication = 1;
  // Start each round's communication as soon as its computation allows (after the counted
  // forward, or in each gradient hook). false starts it in step() instead, with nothing to
  // overlap: the same results, for measuring what the overlap hides.
  bool overlap = true;
};

// Per-round weights, read when a round's communication is launched; unset = the
// topology's. A training loop following a dynamic schedule sets them before each round.
// neighbor_allreduce: self_weight, src_weights, dst_weights (comm.h's rules).
// hierarchical: self_weight, src_machine_weights, dst_machine_weights.
// window put: dst_weights for the put; self_weight with src_weights for the update.
// push-sum: dst_weights (their count is the out-degree; every weight is 1/(out-degree+1)).
struct RoundWeights {
  std::optional<double> self_weight;
  std::optional<std::map<int, double>> src_weights;
  std::optional<std::map<int, double>> dst_weights;
  std::optional<std::map<int, double>> src_machine_weights;
  std::optional<std::map<int, double>> dst_machine_weights;
};

class DistributedOptimizer {
 public:
  // Collective. InvalidArgument for J < 1, a model with no parameter that requires grad,
  // a trainable parameter the optimizer does not hold, or trainable parameters that differ
  // (names, shapes, dtypes) across ranks; FailedPrecondition before weft::init(). Window
  // optimizers create one window per parameter here.
  static StatusOr<std::unique_ptr<DistributedOptimizer>> Create(
      Algorithm algorithm, std::shared_ptr<torch::optim::Optimizer> optimizer,
      std::shared_ptr<torch::nn::Module> model, const Options& options = {});
  // Frees the windows of a window optimizer (a collective, as close()); waits for the
  // communication still in flight.
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // Runs the model's forward `fn` and counts it (forward-counting optimizers; not under
  // no-grad). Returns fn()'s result. An error launching the communication is returned by
  // the next step().
  template <typename Fn>
  auto forward(Fn&& fn) -> decltype(fn()) {
    auto result = fn();
    CountForward();
    return result;
  }

  // An S (wait, combine, update) or an s (local update), as the counter says.
  Status step();
  void zero_grad() { optimizer_->zero_grad(); }

  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  Algorithm algorithm() const { return algorithm_; }
  CommunicationType communication_type() const { return options_.communication_type; }
  RoundWeights& weights() { return weights_; }
  Status set_num_steps_per_communication(int64_t j) {
    return counter_.set_steps_per_communication(j);
  }
  int64_t num_steps_per_communication() const { return counter_.steps_per_communication(); }
  const StepCounter& counter() const { return counter_; }
  // Misuse warnings emitted so far (each is also logged as a warning).
  int64_t misuse_warnings() const { return misuse_warnings_; }
  // Collective for window optimizers: frees their windows (nothing for the others). The
  // optimizer is unusable afterwards.
  Status close();

 private:
  struct Param;
  class AccumulateHook;
  DistributedOptimizer(Algorithm algorithm, std::shared_ptr<torch::optim::Optimizer> optimizer,
                       std::shared_ptr<torch::nn::Module> model, const Options& options,
                       StepCounter counter);
  Status Init();
  void CountForward();
  void OnGradientReady(size_t index);
  // Acts on what the counter said about a computation (of parameter `index` when counting
  // backward).
  void Counted(StatusOr<StepCounter::Event> event, size_t index);
  // Starts parameter i's communication for this round.
  Status Launch(size_t index);
  // Waits for parameter i's communication and installs its result.
  Status Finish(size_t index);
  // The wrapped optimizer's step on parameter i alone (the others' gradients hidden).
  void StepOnly(size_t index);
  std::string OpName(const Param& p) const;

  Algorithm algorithm_;
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  std::shared_ptr<torch::nn::Module> model_;
  Options options_;
  StepCounter counter_;
  RoundWeights weights_;
  std::vector<std::unique_ptr<Param>> params_;
  std::vector<std::string> windows_;  // created and not freed yet
  // Read by the gradient hooks; cleared when this optimizer goes away.
  std::shared_ptr<DistributedOptimizer*> owner_;
  int64_t id_ = 0;  // this process's optimizer number: op and window names
  Status deferred_;  // from a hook or forward(), returned by the next step()
  int64_t misuse_warnings_ = 0;
  bool closed_ = false;
};

// Helpers. `params` as from module.named_parameters() (or named_buffers()); every rank
// passes the same names in the same order. Collective.
Status broadcast_parameters(const torch::OrderedDict<std::string, torch::Tensor>& params,
                            int root_rank);
// Averages the parameters over all ranks, in place.
Status allreduce_parameters(const torch::OrderedDict<std::string, torch::Tensor>& params);
// Makes every rank's optimizer state (per-parameter state and the groups' options, such as
// lr) a copy of root_rank's: SGD, Adam, AdamW, RMSprop, Adagrad, and any optimizer whose
// save/load LibTorch implements. Ranks without state yet get it.
Status broadcast_optimizer_state(torch::optim::Optimizer& optimizer, int root_rank);
// The optimizer's state (per-parameter state and the groups' options) as bytes, and back
// into an optimizer of the same type over parameters of the same shapes, in the same
// groups (InvalidArgument otherwise). Local; what broadcast_optimizer_state sends, and
// what pipe's transitions send to newly active ranks.
StatusOr<std::string> SaveOptimizerState(torch::optim::Optimizer& optimizer);
Status LoadOptimizerState(torch::optim::Optimizer& optimizer, const std::string& bytes);
// sqrt(sum over ranks i of ||x_i - mean||^2 / size) over all the given parameters
// concatenated (mean: the average over ranks). The same value on every rank.
StatusOr<double> consensus_distance(const torch::OrderedDict<std::string, torch::Tensor>& params);

}  // namespace optim
}  // namespace weft

#endif  // WEFT_OPTIM_OPTIM_H_
