// RunPipelineStep in one process: the K = 1 pipeline, which needs no communication (and no
// weft::init()). Multi-rank pipelines: tests/pipe/pipeline_test.cc.
#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "pipe/runtime/runtime.h"
#include "pipe/runtime/testing.h"

namespace weft {
namespace pipe {
namespace {

using testing::MaxDiff;
using testing::Mse;

constexpr int kLayers = 6;

torch::nn::Sequential MakeModel() {
  torch::manual_seed(11);
  return torch::nn::Sequential(torch::nn::Linear(4, 6), torch::nn::Tanh(), torch::nn::Linear(6, 6),
                               torch::nn::Tanh(), torch::nn::Linear(6, 5), torch::nn::Linear(5, 2));
}

StageSpec OneStage(int micro_batches, ScheduleKind schedule, const std::string& tag) {
  StageSpec spec;
  spec.ranks = {0};
  spec.boundaries = {0, kLayers};
  spec.micro_batches = micro_batches;
  spec.schedule = schedule;
  spec.tag = tag;
  return spec;
}

struct Data {
  at::Tensor inputs = at::randn({9, 4});
  at::Tensor targets = at::randn({9, 2});
};

double ReferenceStep(const LayerList& model, const Data& data, int frozen) {
  return testing::ReferenceStep(model, data.inputs, data.targets, frozen);
}

TEST(RunPipelineStepOneStage, EqualsPlainAutogradForEverySplit) {
  torch::manual_seed(1);
  const Data data;
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
    for (int m : {1, 2, 4, 9}) {
      SCOPED_TRACE(std::string(ScheduleName(kind)) + " M=" + std::to_string(m));
      torch::nn::Sequential seq = MakeModel(), ref_seq = MakeModel();
      LayerList model = *LayerList::FromSequential(seq);
      LayerList ref = *LayerList::FromSequential(ref_seq);
      const double ref_loss = ReferenceStep(ref, data, 0);
      StatusOr<StepResult> result =
          RunPipelineStep(model, OneStage(m, kind, "t"), data.inputs, data.targets, Mse);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_NEAR(result->loss, ref_loss, 1e-5);
      EXPECT_EQ(result->samples, 9);
      EXPECT_FALSE(result->outputs.defined());
      for (int layer = 0; layer < kLayers; ++layer) {
        const auto params = model.Parameters(layer), ref_params = ref.Parameters(layer);
        for (size_t i = 0; i < params.size(); ++i) {
          ASSERT_TRUE(params[i].grad().defined());
          EXPECT_LE(MaxDiff(params[i].grad(), ref_params[i].grad()), 1e-5);
        }
      }
    }
  }
}

TEST(RunPipelineStepOneStage, AccumulatesIntoExistingGradients) {
  torch::manual_seed(2);
  const Data data;
  torch::nn::Sequential seq = MakeModel(), ref_seq = MakeModel();
  LayerList model = *LayerList::FromSequential(seq);
  LayerList ref = *LayerList::FromSequential(ref_seq);
  ReferenceStep(ref, data, 0);
  for (const at::Tensor& p : model.Parameters(0)) p.mutable_grad() = at::ones_like(p);
  ASSERT_TRUE(RunPipelineStep(model, OneStage(3, ScheduleKind::kOneFOneB, "t"), data.inputs,
                              data.targets, Mse)
                  .ok());
  const auto params = model.Parameters(0), ref_params = ref.Parameters(0);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_LE(MaxDiff(params[i].grad(), ref_params[i].grad() + 1), 1e-5);
  }
}

TEST(RunPipelineStepOneStage, FrozenPrefixAndCachedInputs) {
  torch::manual_seed(3);
  const Data data;
  for (int input_depth : {0, 2, 3}) {
    SCOPED_TRACE("input_depth=" + std::to_string(input_depth));
    torch::nn::Sequential seq = MakeModel(), ref_seq = MakeModel();
    LayerList model = *LayerList::FromSequential(seq);
    LayerList ref = *LayerList::FromSequential(ref_seq);
    const double ref_loss = ReferenceStep(ref, data, 3);
    at::Tensor inputs = data.inputs;
    {
      at::NoGradGuard no_grad;
      for (int layer = 0; layer < input_depth; ++layer) inputs = ref.Forward(layer, inputs);
    }
    StageSpec spec = OneStage(2, ScheduleKind::kGPipe, "t");
    spec.frozen = 3;
    spec.input_depth = input_depth;
    StatusOr<StepResult> result = RunPipelineStep(model, spec, inputs, data.targets, Mse);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_NEAR(result->loss, ref_loss, 1e-5);
    for (int layer = 0; layer < kLayers; ++layer) {
      const auto params = model.Parameters(layer), ref_params = ref.Parameters(layer);
      for (size_t i = 0; i < params.size(); ++i) {
        if (layer < 3) {
          EXPECT_FALSE(params[i].grad().defined()) << "layer " << layer;
        } else {
          ASSERT_TRUE(params[i].grad().defined());
          EXPECT_LE(MaxDiff(params[i].grad(), ref_params[i].grad()), 1e-5);
        }
      }
    }
  }
}

TEST(RunPipelineStepOneStage, ForwardOnlyKeepsOutputsAndTouchesNoGradient) {
  torch::manual_seed(4);
  const Data data;
  torch::nn::Sequential seq = MakeModel();
  LayerList model = *LayerList::FromSequential(seq);
  StepOptions options;
  options.backward = false;
  options.keep_outputs = true;
  StatusOr<StepResult> result = RunPipelineStep(model, OneStage(4, ScheduleKind::kOneFOneB, "t"),
                                                data.inputs, data.targets, Mse, options);
  ASSERT_TRUE(result.ok()) << result.status();
  const at::Tensor expected = seq->forward(data.inputs);
  ASSERT_TRUE(result->outputs.defined());
  EXPECT_FALSE(result->outputs.requires_grad());
  EXPECT_LE(MaxDiff(result->outputs, expected), 1e-6);
  EXPECT_NEAR(result->loss, Mse(expected, data.targets).item<double>(), 1e-5);
  for (const at::Tensor& p : seq->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(RunPipelineStepOneStage, BadSpecsAreInvalid) {
  const Data data;
  torch::nn::Sequential seq = MakeModel();
  LayerList model = *LayerList::FromSequential(seq);
  auto expect_invalid = [&](const StageSpec& spec, const at::Tensor& inputs,
                            const at::Tensor& targets, const std::string& why) {
    StatusOr<StepResult> result = RunPipelineStep(model, spec, inputs, targets, Mse);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument)
        << why << ": " << result.status();
  };
  const StageSpec good = OneStage(2, ScheduleKind::kGPipe, "t");
  StageSpec spec = good;
  spec.boundaries = {0, kLayers - 1};
  expect_invalid(spec, data.inputs, data.targets, "boundaries short of L");
  spec.boundaries = {0, 2, kLayers};
  expect_invalid(spec, data.inputs, data.targets, "K + 2 boundaries");
  spec = good;
  spec.ranks = {1};
  expect_invalid(spec, data.inputs, data.targets, "rank 1 in a world of 1");
  spec = good;
  spec.stage = 1;
  expect_invalid(spec, data.inputs, data.targets, "stage out of range");
  spec = good;
  spec.micro_batches = 10;
  expect_invalid(spec, data.inputs, data.targets, "more micro-batches than samples");
  spec.micro_batches = 0;
  expect_invalid(spec, data.inputs, data.targets, "no micro-batches");
  spec = good;
  spec.frozen = kLayers + 1;
  expect_invalid(spec, data.inputs, data.targets, "frozen above L");
  spec.frozen = -1;
  expect_invalid(spec, data.inputs, data.targets, "negative frozen");
  spec = good;
  spec.frozen = 2;
  spec.input_depth = 3;
  expect_invalid(spec, data.inputs, data.targets, "input_depth above frozen");
  expect_invalid(good, at::Tensor(), data.targets, "no inputs");
  expect_invalid(good, data.inputs, at::Tensor(), "no targets");
  expect_invalid(good, data.inputs, data.targets.narrow(0, 0, 8), "8 targets for 9 inputs");
  // Nothing above touched a gradient.
  for (const at::Tensor& p : seq->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(RunPipelineStepOneStage, SeveralStagesNeedComm) {
  const Data data;
  LayerList model = *LayerList::FromSequential(MakeModel());
  StageSpec spec = OneStage(1, ScheduleKind::kGPipe, "t");
  spec.ranks = {0, 1};
  spec.boundaries = {0, 3, kLayers};
  StatusOr<StepResult> result = RunPipelineStep(model, spec, data.inputs, data.targets, Mse);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
}

TEST(RunPipelineStepOneStage, LayerAndLossErrorsBecomeStatus) {
  const Data data;
  LayerList model = *LayerList::FromSequential(MakeModel());
  // Inputs of the wrong width: the first Linear throws.
  StatusOr<StepResult> result = RunPipelineStep(model, OneStage(1, ScheduleKind::kGPipe, "t"),
                                                at::randn({9, 3}), data.targets, Mse);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal) << result.status();
  // A loss that is not one value per micro-batch.
  result = RunPipelineStep(
      model, OneStage(1, ScheduleKind::kGPipe, "t"), data.inputs, data.targets,
      [](const at::Tensor& out, const at::Tensor& target) { return (out - target).pow(2); });
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
}

}  // namespace
}  // namespace pipe
}  // namespace weft
