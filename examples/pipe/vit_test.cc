#include <ATen/ATen.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/autograd.h>
#include <torch/utils.h>

#include <cstdint>
#include <vector>

#include "examples/pipe/synthetic.h"
#include "examples/pipe/vit.h"
#include "gtest/gtest.h"

namespace weft {
namespace examples {
namespace {

// Small enough to run in milliseconds, but with the demo's structure.
VitConfig SmallConfig() {
  VitConfig config;
  config.image = 8;
  config.patch = 4;
  config.dim = 16;
  config.depth = 3;
  config.heads = 2;
  config.mlp = 32;
  config.classes = 6;
  return config;
}

TEST(VitTest, GroupCountIsTwoPerBlockPlusEmbeddingAndHead) {
  for (int depth : {1, 3, 8}) {
    VitConfig config = SmallConfig();
    config.depth = depth;
    EXPECT_EQ(MakeVit(config, 1)->size(), static_cast<size_t>(2 * depth + 2));
    EXPECT_EQ(config.groups(), 2 * depth + 2);
  }
  // The demo's default splits into 8 pipeline stages.
  EXPECT_GE(VitConfig().groups(), 16);
}

TEST(VitTest, EveryGroupMapsOneTensorToTheExpectedShape) {
  const VitConfig config = SmallConfig();
  torch::nn::Sequential model = MakeVit(config, 1);
  torch::NoGradGuard no_grad;
  at::Tensor x = at::randn({5, config.channels, config.image, config.image});
  int group = 0;
  for (auto it = model->begin(); it != model->end(); ++it, ++group) {
    x = it->forward(x);
    if (group + 1 < config.groups()) {
      EXPECT_EQ(x.sizes(), (std::vector<int64_t>{5, config.tokens(), config.dim}))
          << "group " << group;
    } else {
      EXPECT_EQ(x.sizes(), (std::vector<int64_t>{5, config.classes})) << "group " << group;
    }
    EXPECT_TRUE(x.isfinite().all().item<bool>()) << "group " << group;
  }
  EXPECT_EQ(config.tokens(), 5);  // 2 x 2 patches + the class token
}

TEST(VitTest, EveryGroupHasParameters) {
  torch::nn::Sequential model = MakeVit(SmallConfig(), 1);
  for (size_t g = 0; g < model->size(); ++g) {
    EXPECT_FALSE(model[g]->parameters().empty()) << "group " << g;
  }
}

// TokenLinear is nn::Linear computed as a convolution (for speed): same values, same
// gradients.
TEST(VitTest, TokenLinearMatchesLinear) {
  torch::manual_seed(3);
  TokenLinear layer(8, 12);
  at::Tensor x = at::randn({4, 5, 8}).requires_grad_(true);
  at::Tensor y = layer->forward(x);
  at::Tensor expected = at::linear(x, layer->weight(), layer->named_parameters()["bias"]);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{4, 5, 12}));
  EXPECT_TRUE(at::allclose(y, expected, 1e-5, 1e-5));
  at::Tensor seed_grad = at::randn({4, 5, 12});
  at::Tensor grad = torch::autograd::grad({y}, {x}, {seed_grad})[0];
  at::Tensor expected_grad = torch::autograd::grad({expected}, {x}, {seed_grad})[0];
  EXPECT_TRUE(at::allclose(grad, expected_grad, 1e-5, 1e-5));
}

TEST(VitTest, InitializationDependsOnlyOnTheSeed) {
  auto a = MakeVit(SmallConfig(), 7)->parameters();
  auto b = MakeVit(SmallConfig(), 7)->parameters();
  auto c = MakeVit(SmallConfig(), 8)->parameters();
  ASSERT_EQ(a.size(), b.size());
  bool any_different = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(a[i].equal(b[i])) << "parameter " << i;
    if (!a[i].equal(c[i])) any_different = true;
  }
  EXPECT_TRUE(any_different);
}

TEST(SyntheticImagesTest, SameIdsGiveTheSameSamples) {
  const VitConfig config = SmallConfig();
  SyntheticImages data(100, config, 3);
  SyntheticImages again(100, config, 3);
  at::Tensor images, labels, images2, labels2;
  data.Get({4, 17, 99, 4}, &images, &labels);
  again.Get({99, 4}, &images2, &labels2);
  EXPECT_EQ(images.sizes(), (std::vector<int64_t>{4, config.channels, 8, 8}));
  EXPECT_EQ(labels.sizes(), (std::vector<int64_t>{4}));
  EXPECT_EQ(images.scalar_type(), at::kFloat);
  EXPECT_EQ(labels.scalar_type(), at::kLong);
  EXPECT_TRUE(images[0].equal(images[3]));
  EXPECT_TRUE(images[2].equal(images2[0]));
  EXPECT_TRUE(images[0].equal(images2[1]));
  EXPECT_EQ(labels[2].item<int64_t>(), labels2[0].item<int64_t>());
  EXPECT_FALSE(images[0].equal(images[1]));
}

TEST(SyntheticImagesTest, SplitsAndSeedsDiffer) {
  const VitConfig config = SmallConfig();
  at::Tensor train, test, other, labels;
  SyntheticImages(10, config, 3, SyntheticImages::Split::kTrain).Get({0}, &train, &labels);
  SyntheticImages(10, config, 3, SyntheticImages::Split::kTest).Get({0}, &test, &labels);
  SyntheticImages(10, config, 4, SyntheticImages::Split::kTrain).Get({0}, &other, &labels);
  EXPECT_FALSE(train.equal(test));
  EXPECT_FALSE(train.equal(other));
}

TEST(SyntheticImagesTest, LabelsCoverEveryClassAndMeanPixelIsUninformative) {
  const VitConfig config = SmallConfig();
  SyntheticImages data(3000, config, 5);
  std::vector<int64_t> ids(data.size());
  for (int64_t i = 0; i < data.size(); ++i) ids[i] = i;
  at::Tensor images, labels;
  data.Get(ids, &images, &labels);
  EXPECT_EQ(labels.min().item<int64_t>(), 0);
  EXPECT_EQ(labels.max().item<int64_t>(), config.classes - 1);
  // Per class, the mean over images of each channel's mean pixel stays near zero: the
  // prototypes have zero mean per channel, so brightness does not give the class away.
  at::Tensor channel_means = images.mean({2, 3});  // [n, C]
  for (int c = 0; c < config.classes; ++c) {
    at::Tensor of_class = channel_means.index({labels.eq(c)});
    ASSERT_GT(of_class.size(0), 100);
    EXPECT_LT(of_class.mean(0).abs().max().item<float>(), 0.02f) << "class " << c;
  }
}

}  // namespace
}  // namespace examples
}  // namespace weft
