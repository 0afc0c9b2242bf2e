#include "pipe/freeze/torch_grad_norms.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace weft {
namespace pipe {
namespace {

at::Tensor Param(std::vector<double> values) {
  return at::tensor(values, at::kDouble).requires_grad_(true);
}

// Gives `param` the gradient `grad` through a real backward pass (loss = sum(param * grad)).
void Backward(const at::Tensor& param, std::vector<double> grad) {
  (param * at::tensor(grad, at::kDouble)).sum().backward();
}

void ExpectInvalid(const Status& status, const std::string& fragment) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find(fragment), std::string::npos)
      << "message \"" << status.message() << "\" lacks \"" << fragment << "\"";
}

TEST(GroupGradNorm, IsTheL2NormOverTheGroupsGradients) {
  at::Tensor a = Param({1, 1});
  at::Tensor b = Param({1, 1, 1});
  at::Tensor c = Param({1});
  Backward(a, {3, 4});
  Backward(b, {2, 4, 4});
  Backward(c, {8});
  EXPECT_DOUBLE_EQ(*GroupGradNorm({a}), 5.0);
  EXPECT_DOUBLE_EQ(*GroupGradNorm({b, c}), 10.0);  // sqrt(6^2 + 8^2)
  EXPECT_DOUBLE_EQ(*GroupGradNorm({}), 0.0);
}

TEST(GroupGradNorm, SkipsParametersWithoutGradients) {
  at::Tensor trained = Param({1, 1});
  at::Tensor frozen = at::ones({4}, at::kDouble);  // requires_grad false
  at::Tensor unused = Param({1, 1, 1});            // no backward reached it
  Backward(trained, {0, 2});
  EXPECT_DOUBLE_EQ(*GroupGradNorm({frozen, trained, unused}), 2.0);
  EXPECT_DOUBLE_EQ(*GroupGradNorm({frozen, unused}), 0.0);
}

TEST(GroupGradNorm, ReducesLowPrecisionGradientsInDouble) {
  // 300^2 overflows float16; the norm must not.
  at::Tensor half = at::ones({4}, at::kHalf).requires_grad_(true);
  half.mutable_grad() = at::full({4}, 300.0, at::kHalf);
  EXPECT_DOUBLE_EQ(*GroupGradNorm({half}), 600.0);
}

TEST(GroupGradNorm, RejectsAnUndefinedParameter) {
  ExpectInvalid(GroupGradNorm({Param({1}), at::Tensor()}).status(), "parameter 1");
}

TEST(AddGradNorms, AccumulatesTheSumOfNormsNotTheLastGradient) {
  at::Tensor first = Param({1, 1});
  at::Tensor second = Param({1});
  GradNormAccumulator acc(2);
  Backward(first, {3, 4});  // norm 5
  Backward(second, {2});    // norm 2
  ASSERT_TRUE(AddGroupGradNorms({{first}, {second}}, &acc).ok());
  acc.EndIteration();
  first.mutable_grad().zero_();
  second.mutable_grad().zero_();
  Backward(first, {0, 1});  // norm 1
  Backward(second, {3});    // norm 3
  ASSERT_TRUE(AddGroupGradNorms({{first}, {second}}, &acc).ok());
  acc.EndIteration();
  // 5 + 1 and 2 + 3: not the last norms (1, 3), nor the norms of the summed gradients.
  EXPECT_EQ(acc.sums(), (std::vector<double>{6.0, 5.0}));
  EXPECT_EQ(acc.iterations(), 2);
  // Changing the gradients afterwards does not change what was accumulated.
  first.mutable_grad().fill_(100.0);
  EXPECT_EQ(acc.Take(), (std::vector<double>{6.0, 5.0}));
}

TEST(AddGradNorms, WritesFromFirstLayer) {
  at::Tensor p = Param({1, 1});
  Backward(p, {6, 8});
  GradNormAccumulator acc(4);
  ASSERT_TRUE(AddGroupGradNorms({{p}, {}}, &acc, /*first_layer=*/2).ok());
  EXPECT_EQ(acc.sums(), (std::vector<double>{0, 0, 10, 0}));
  ExpectInvalid(AddGroupGradNorms({{p}, {p}}, &acc, 3), "do not fit an accumulator of 4");
  ExpectInvalid(AddGroupGradNorms({{p}}, &acc, -1), "first_layer >= 0");
  ExpectInvalid(AddGroupGradNorms({{p}}, nullptr), "accumulator is null");
}

TEST(AddGradNorms, ANonFiniteGradientLeavesTheAccumulatorUnchanged) {
  at::Tensor good = Param({1});
  at::Tensor bad = Param({1, 1});
  Backward(good, {1});
  Backward(bad, {std::numeric_limits<double>::quiet_NaN(), 1});
  GradNormAccumulator acc(2);
  ExpectInvalid(AddGroupGradNorms({{good}, {bad}}, &acc), "group 1 (layer 1)");
  EXPECT_EQ(acc.sums(), (std::vector<double>{0, 0}));
}

TEST(AddModuleGradNorms, UsesEachModulesParameters) {
  torch::nn::Linear attention(torch::nn::LinearOptions(2, 1));
  torch::nn::Linear mlp(torch::nn::LinearOptions(2, 1).bias(false));
  attention->to(at::kDouble);
  mlp->to(at::kDouble);
  const at::Tensor x = at::tensor(std::vector<double>{3, 4}, at::kDouble).reshape({1, 2});
  // d(sum(W x + b))/dW = x, /db = 1: norms sqrt(9 + 16 + 1) and 5.
  (attention->forward(x).sum() + mlp->forward(x).sum()).backward();
  GradNormAccumulator acc(2);
  ASSERT_TRUE(AddModuleGradNorms({attention.get(), mlp.get()}, &acc).ok());
  EXPECT_DOUBLE_EQ(acc.sums()[0], std::sqrt(26.0));
  EXPECT_DOUBLE_EQ(acc.sums()[1], 5.0);
  ExpectInvalid(AddModuleGradNorms({attention.get(), nullptr}, &acc), "module 1 (layer 1)");
}

}  // namespace
}  // namespace pipe
}  // namespace weft
