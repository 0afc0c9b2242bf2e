// A rank that dies in the middle of a transition: the survivors must fail with a clear
// error, never hang. Run by transition_death_test.sh on 4 ranks.
//
// The fault is injected from the test side: rank --victim's optimizers kill the process
// when asked to save their state, which is what a rank does when it sends a layer's
// optimizer state to a newly active rank, i.e. in the middle of the transition.
#include <ATen/ATen.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "comm/comm.h"
#include "pipe/runtime/trainer.h"
#include "tools/cli/flags.h"

namespace {

bool g_die_on_save = false;

class FragileSgd : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;
  void save(torch::serialize::OutputArchive& archive) const override {
    if (g_die_on_save) {
      std::cerr << "transition_death: rank " << weft::rank() << " dies mid-transition"
                << std::endl;
      std::raise(SIGKILL);
    }
    torch::optim::SGD::save(archive);
  }
};

}  // namespace

int main(int argc, char** argv) {
  int victim = 1;
  weft::cli::FlagSet flags("transition_death", "Kills a rank in the middle of a transition.");
  flags.Int("--victim", &victim, "the rank that dies", 0);
  flags.ParseOrExit(argc, argv);
  weft::Status st = weft::init();
  if (!st.ok()) {
    std::cerr << st << std::endl;
    return 1;
  }
  torch::manual_seed(1);
  torch::nn::Sequential seq;
  for (int l = 0; l < 7; ++l) seq->push_back(torch::nn::Linear(8, 8));
  seq->push_back(torch::nn::Linear(8, 2));
  auto model = weft::pipe::LayerList::FromSequential(seq);
  weft::pipe::TrainerOptions options;
  options.alpha = 0.75;  // freeze fast so that K halves at the first freeze point
  options.batch_size = 16;
  options.micro_batches = 2;
  options.make_optimizer = [](std::vector<at::Tensor> params) {
    return std::make_unique<FragileSgd>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
  };
  options.loss = [](const at::Tensor& out, const at::Tensor& y) {
    return at::cross_entropy_loss(out, y);
  };
  auto trainer = weft::pipe::ElasticTrainer::Create(*model, options);
  if (!trainer.ok()) {
    std::cerr << trainer.status() << std::endl;
    return 1;
  }
  auto data = weft::pipe::TensorDataset::Create(at::randn({64, 8}),
                                                at::randint(0, 2, {64}, at::kLong));
  g_die_on_save = weft::rank() == victim;
  auto metrics = (*trainer)->TrainEpoch(*data);
  if (!metrics.ok()) {
    std::cerr << "rank " << weft::rank() << ": the epoch failed: " << metrics.status()
              << std::endl;
    return 2;
  }
  std::cerr << "rank " << weft::rank() << ": " << metrics->ToLine() << std::endl;
  return 0;
}
