#include <ATen/ATen.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "pipe/runtime/runtime.h"

namespace weft {
namespace pipe {
namespace {

// Written by the :script_models genrule (testdata/make_script_model.py); tests run in the
// runfiles root of the workspace.
constexpr char kSeqModel[] = "pipe/runtime/testdata/seq.pt";
constexpr char kFlatModel[] = "pipe/runtime/testdata/flat.pt";

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

std::vector<std::string> Names(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  std::vector<std::string> names;
  for (const auto& item : named) names.push_back(item.first);
  return names;
}

at::Tensor ForwardAll(const LayerList& list, at::Tensor x) {
  for (int layer = 0; layer < list.size(); ++layer) x = list.Forward(layer, x);
  return x;
}

torch::nn::Sequential SmallSequential() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(4, 6), torch::nn::Tanh(), torch::nn::Linear(6, 5),
                               torch::nn::BatchNorm1d(5), torch::nn::Linear(5, 3));
}

TEST(LayerListFromSequential, ChildrenAreTheLayersInOrder) {
  torch::nn::Sequential seq = SmallSequential();
  StatusOr<LayerList> list = LayerList::FromSequential(seq);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 5);
  const at::Tensor x = at::randn({7, 4});
  EXPECT_TRUE(at::allclose(ForwardAll(*list, x), seq->forward(x), 0, 0));
}

TEST(LayerListFromSequential, ParametersAreTheModulesOwnPerLayer) {
  torch::nn::Sequential seq = SmallSequential();
  LayerList list = *LayerList::FromSequential(seq);
  EXPECT_EQ(Names(list.NamedParameters(0)), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_TRUE(list.NamedParameters(1).empty());
  EXPECT_EQ(Names(list.NamedParameters(3)), (std::vector<std::string>{"weight", "bias"}));
  // The same tensors as the module's, not copies: optimizers and gradients see them.
  const std::vector<at::Tensor> params = list.Parameters(2);
  ASSERT_EQ(params.size(), 2u);
  EXPECT_TRUE(params[0].is_same(seq[2]->named_parameters()["weight"]));
  EXPECT_EQ(list.Buffers(3).size(), 3u);  // running mean, running variance, batch count
  EXPECT_TRUE(list.Buffers(0).empty());
  EXPECT_EQ(list.ParameterCounts(), (std::vector<double>{30, 0, 35, 10, 18}));
  EXPECT_TRUE(list.NamedParameters(5).empty());
  EXPECT_TRUE(list.NamedParameters(-1).empty());
}

TEST(LayerListFromSequential, TrainSetsEveryLayerAndCopiesShareModules) {
  torch::nn::Sequential seq = SmallSequential();
  LayerList list = *LayerList::FromSequential(seq);
  LayerList copy = list;
  copy.Train(false);
  for (const auto& child : seq->children()) EXPECT_FALSE(child->is_training());
  EXPECT_FALSE(seq->is_training());
  list.Train(true);
  for (const auto& child : seq->children()) EXPECT_TRUE(child->is_training());
}

TEST(LayerListFromSequential, EmptyIsInvalid) {
  StatusOr<LayerList> list = LayerList::FromSequential(torch::nn::Sequential());
  EXPECT_EQ(list.status().code(), absl::StatusCode::kInvalidArgument) << list.status();
}

TEST(LayerListLoad, ForwardMatchesTheScriptedModule) {
  StatusOr<LayerList> list = LayerList::Load(kSeqModel);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 5);
  torch::jit::Module whole = torch::jit::load(kSeqModel);
  const at::Tensor x = at::randn({6, 4});
  // Training mode (batch statistics), then evaluation mode (running statistics).
  whole.train(true);
  list->Train(true);
  EXPECT_TRUE(at::allclose(ForwardAll(*list, x), whole.forward({x}).toTensor(), 0, 0));
  whole.train(false);
  list->Train(false);
  const at::Tensor eval_out = ForwardAll(*list, x);
  EXPECT_TRUE(at::allclose(eval_out, whole.forward({x}).toTensor(), 0, 0));
  list->Train(true);
  EXPECT_FALSE(at::allclose(ForwardAll(*list, x), eval_out));
}

TEST(LayerListLoad, ParametersAndBuffersPerLayer) {
  LayerList list = *LayerList::Load(kSeqModel);
  EXPECT_EQ(Names(list.NamedParameters(0)), (std::vector<std::string>{"weight", "bias"}));
  // Names are relative to the layer, nested modules included.
  EXPECT_EQ(Names(list.NamedParameters(2)),
            (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias"}));
  EXPECT_EQ(list.Buffers(2).size(), 3u);
  EXPECT_EQ(list.ParameterCounts(), (std::vector<double>{30, 0, 45, 0, 18}));
  for (const at::Tensor& p : list.Parameters(4)) EXPECT_TRUE(p.requires_grad());
}

TEST(LayerListLoad, GradientsReachTheLoadedParameters) {
  LayerList list = *LayerList::Load(kSeqModel);
  ForwardAll(list, at::randn({5, 4})).sum().backward();
  for (int layer = 0; layer < list.size(); ++layer) {
    for (const at::Tensor& p : list.Parameters(layer)) EXPECT_TRUE(p.grad().defined());
  }
}

TEST(LayerListLoad, MissingFileIsNotFound) {
  const std::string path = TempPath("no_such_model.pt");
  StatusOr<LayerList> list = LayerList::Load(path);
  EXPECT_EQ(list.status().code(), absl::StatusCode::kNotFound) << list.status();
  EXPECT_NE(std::string(list.status().message()).find(path), std::string::npos);
}

TEST(LayerListLoad, GarbageFileIsInvalid) {
  const std::string path = TempPath("garbage.pt");
  std::ofstream(path) << "not a TorchScript archive";
  StatusOr<LayerList> list = LayerList::Load(path);
  EXPECT_EQ(list.status().code(), absl::StatusCode::kInvalidArgument) << list.status();
  EXPECT_NE(std::string(list.status().message()).find(path), std::string::npos);
}

TEST(LayerListLoad, ModuleWithoutChildrenIsInvalid) {
  StatusOr<LayerList> list = LayerList::Load(kFlatModel);
  EXPECT_EQ(list.status().code(), absl::StatusCode::kInvalidArgument) << list.status();
  EXPECT_NE(std::string(list.status().message()).find(kFlatModel), std::string::npos);
}

}  // namespace
}  // namespace pipe
}  // namespace weft
