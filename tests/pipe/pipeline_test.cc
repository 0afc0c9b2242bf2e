// RunPipelineStep across ranks: a pipeline of K stages on the first K ranks must give the
// loss and gradients of plain autograd on one process (each rank computes that reference
// locally, on its own copy of the model built from the same seed).
#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/comm.h"
#include "gtest/gtest.h"
#include "pipe/runtime/runtime.h"
#include "pipe/runtime/testing.h"
#include "tests/comm/test_util.h"

namespace weft {
namespace pipe {
namespace {

const auto* const kEnv = weft::testing::InitWeftForAllTests();

using testing::MaxDiff;
using testing::Mse;

constexpr int kLayers = 8;
constexpr int kSamples = 10;  // 4 micro-batches: 3, 3, 2, 2

// Linear/Tanh groups; the last two Linears are adjacent so that some stage boundaries cut
// between two parameterized layers.
torch::nn::Sequential MakeModel() {
  torch::manual_seed(42);
  return torch::nn::Sequential(torch::nn::Linear(5, 8), torch::nn::Tanh(), torch::nn::Linear(8, 8),
                               torch::nn::Tanh(), torch::nn::Linear(8, 6), torch::nn::Tanh(),
                               torch::nn::Linear(6, 6), torch::nn::Linear(6, 3));
}

struct Data {
  at::Tensor inputs, targets;
};
Data MakeData() {
  torch::manual_seed(7);
  Data data;
  data.inputs = at::randn({kSamples, 5});
  data.targets = at::randn({kSamples, 3});
  return data;
}

// Uneven stages; with K = 4, stage 0 holds layers 0-1 and stage 1 only layer 2.
std::vector<int> Boundaries(int k) {
  switch (k) {
    case 1:
      return {0, kLayers};
    case 2:
      return {0, 3, kLayers};
    default:
      return {0, 2, 3, 6, kLayers};
  }
}

// This rank's spec in the pipeline over ranks 0 .. k-1; false when it is not among them.
bool SpecFor(int k, int micro_batches, ScheduleKind kind, const std::string& tag, StageSpec* spec) {
  if (rank() >= k) return false;
  for (int r = 0; r < k; ++r) spec->ranks.push_back(r);
  spec->boundaries = Boundaries(k);
  spec->stage = rank();
  spec->schedule = kind;
  spec->micro_batches = micro_batches;
  spec->tag = tag;
  return true;
}

double ReferenceStep(const LayerList& ref, const Data& data, int frozen) {
  return testing::ReferenceStep(ref, data.inputs, data.targets, frozen);
}

// The frozen prefix's output, as AutoCache would hand it to stage 0.
at::Tensor PrefixOutput(const LayerList& model, at::Tensor x, int depth) {
  at::NoGradGuard no_grad;
  for (int layer = 0; layer < depth; ++layer) x = model.Forward(layer, x);
  return x;
}

// Layers this stage holds get the reference's gradient (trainable ones) or none (frozen);
// layers it does not hold are never touched.
void ExpectGradients(const LayerList& model, const LayerList& ref, const StageSpec& spec) {
  for (int layer = 0; layer < kLayers; ++layer) {
    const bool held =
        layer >= spec.boundaries[spec.stage] && layer < spec.boundaries[spec.stage + 1];
    const auto params = model.Parameters(layer);
    const auto ref_params = ref.Parameters(layer);
    ASSERT_EQ(params.size(), ref_params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (!held || layer < spec.frozen) {
        EXPECT_FALSE(params[i].grad().defined())
            << "layer " << layer << (held ? " is frozen" : " is not on this stage");
        continue;
      }
      ASSERT_TRUE(params[i].grad().defined()) << "layer " << layer;
      EXPECT_LE(MaxDiff(params[i].grad(), ref_params[i].grad()), 1e-5) << "layer " << layer;
    }
  }
}

void RunAndCompare(int k, int m, ScheduleKind kind, int frozen, int input_depth,
                   const std::string& tag) {
  SCOPED_TRACE(absl::StrCat(tag, ": K=", k, " M=", m, " ", ScheduleName(kind), " frozen=", frozen,
                            " input_depth=", input_depth, " rank ", rank()));
  StageSpec spec;
  if (!SpecFor(k, m, kind, tag, &spec)) return;
  spec.frozen = frozen;
  spec.input_depth = input_depth;
  const Data data = MakeData();
  torch::nn::Sequential seq = MakeModel(), ref_seq = MakeModel();
  const LayerList model = *LayerList::FromSequential(seq);
  const LayerList ref = *LayerList::FromSequential(ref_seq);
  const double ref_loss = ReferenceStep(ref, data, frozen);

  const bool first = spec.stage == 0, last = spec.stage == k - 1;
  const at::Tensor inputs = first ? PrefixOutput(model, data.inputs, input_depth) : at::Tensor();
  const at::Tensor targets = last ? data.targets : at::Tensor();
  StatusOr<StepResult> result = RunPipelineStep(model, spec, inputs, targets, Mse);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NEAR(result->loss, ref_loss, 1e-5);
  EXPECT_EQ(result->samples, kSamples);
  ExpectGradients(model, ref, spec);
}

const ScheduleKind kKinds[] = {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB};

TEST(Pipeline, EqualsOneProcessAutograd) {
  for (int k : {1, 2, 4}) {
    if (k > size()) continue;
    for (int m : {1, 2, 4}) {
      for (ScheduleKind kind : kKinds) {
        RunAndCompare(k, m, kind, 0, 0,
                      absl::StrCat("equal.k", k, ".m", m, ".", ScheduleName(kind)));
      }
    }
  }
}

TEST(Pipeline, FrozenPrefixGetsNoGradient) {
  // frozen = 2: with K = 4 stage 0 is all frozen (forward only) and stage 1 sends no
  // gradient back; frozen = 3 also freezes stage 1 (a single layer).
  for (int k : {1, 2, 4}) {
    if (k > size()) continue;
    for (int frozen : {2, 3}) {
      for (ScheduleKind kind : kKinds) {
        RunAndCompare(k, 4, kind, frozen, 0,
                      absl::StrCat("frozen.k", k, ".f", frozen, ".", ScheduleName(kind)));
      }
    }
  }
}

TEST(Pipeline, StageZeroFedThePrefixOutput) {
  // input_depth = 3 with K = 4: stages 0 and 1 run no layer and only pass data on.
  for (int k : {1, 2, 4}) {
    if (k > size()) continue;
    for (int depth : {2, 3}) {
      for (ScheduleKind kind : kKinds) {
        RunAndCompare(k, 2, kind, 3, depth,
                      absl::StrCat("cached.k", k, ".d", depth, ".", ScheduleName(kind)));
      }
    }
  }
}

TEST(Pipeline, AllFrozenRunsForwardOnly) {
  for (int k : {2, 4}) {
    if (k > size()) continue;
    RunAndCompare(k, 2, ScheduleKind::kOneFOneB, kLayers, 0, absl::StrCat("allfrozen.k", k));
  }
}

TEST(Pipeline, GradientsAccumulate) {
  const int k = size() >= 2 ? 2 : 1;
  StageSpec spec;
  if (!SpecFor(k, 3, ScheduleKind::kOneFOneB, "accumulate", &spec)) return;
  const Data data = MakeData();
  torch::nn::Sequential seq = MakeModel(), ref_seq = MakeModel();
  const LayerList model = *LayerList::FromSequential(seq);
  const LayerList ref = *LayerList::FromSequential(ref_seq);
  ReferenceStep(ref, data, 0);
  // The stage's first layer with parameters.
  int held = spec.boundaries[spec.stage];
  while (model.Parameters(held).empty()) ++held;
  for (const at::Tensor& p : model.Parameters(held)) p.mutable_grad() = at::full_like(p, 0.5);
  StatusOr<StepResult> result =
      RunPipelineStep(model, spec, spec.stage == 0 ? data.inputs : at::Tensor(),
                      spec.stage == k - 1 ? data.targets : at::Tensor(), Mse);
  ASSERT_TRUE(result.ok()) << result.status();
  const auto params = model.Parameters(held), ref_params = ref.Parameters(held);
  ASSERT_FALSE(params.empty());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_LE(MaxDiff(params[i].grad(), ref_params[i].grad() + 0.5), 1e-5);
  }
}

TEST(Pipeline, ForwardOnlyKeepsOutputs) {
  for (int k : {1, 2, 4}) {
    if (k > size()) continue;
    for (ScheduleKind kind : kKinds) {
      const std::string tag = absl::StrCat("forward.k", k, ".", ScheduleName(kind));
      SCOPED_TRACE(tag);
      StageSpec spec;
      if (!SpecFor(k, 4, kind, tag, &spec)) continue;
      const Data data = MakeData();
      torch::nn::Sequential seq = MakeModel();
      const LayerList model = *LayerList::FromSequential(seq);
      StepOptions options;
      options.backward = false;
      options.keep_outputs = true;
      const bool last = spec.stage == k - 1;
      StatusOr<StepResult> result =
          RunPipelineStep(model, spec, spec.stage == 0 ? data.inputs : at::Tensor(),
                          last ? data.targets : at::Tensor(), Mse, options);
      ASSERT_TRUE(result.ok()) << result.status();
      at::NoGradGuard no_grad;
      const at::Tensor expected = seq->forward(data.inputs);
      EXPECT_NEAR(result->loss, Mse(expected, data.targets).item<double>(), 1e-5);
      if (last) {
        ASSERT_TRUE(result->outputs.defined());
        EXPECT_FALSE(result->outputs.requires_grad());
        EXPECT_LE(MaxDiff(result->outputs, expected), 1e-6);
      } else {
        EXPECT_FALSE(result->outputs.defined());
      }
      for (const at::Tensor& p : seq->parameters()) EXPECT_FALSE(p.grad().defined());
    }
  }
}

TEST(Pipeline, ReplicasRunSideBySide) {
  // Two pipelines of two stages (ranks 0-1 and 2-3), as AutoDP places them, each with its
  // own tag, at the same time.
  if (size() < 4) return;
  const int replica = rank() / 2;
  if (replica > 1) return;
  StageSpec spec;
  spec.ranks = {2 * replica, 2 * replica + 1};
  spec.boundaries = Boundaries(2);
  spec.stage = rank() % 2;
  spec.schedule = ScheduleKind::kOneFOneB;
  spec.micro_batches = 4;
  spec.tag = absl::StrCat("replica", replica);
  const Data data = MakeData();
  torch::nn::Sequential seq = MakeModel(), ref_seq = MakeModel();
  const LayerList model = *LayerList::FromSequential(seq);
  const LayerList ref = *LayerList::FromSequential(ref_seq);
  const double ref_loss = ReferenceStep(ref, data, 0);
  StatusOr<StepResult> result =
      RunPipelineStep(model, spec, spec.stage == 0 ? data.inputs : at::Tensor(),
                      spec.stage == 1 ? data.targets : at::Tensor(), Mse);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NEAR(result->loss, ref_loss, 1e-5);
  ExpectGradients(model, ref, spec);
}

TEST(Pipeline, BadSpecsFailBeforeCommunicating) {
  // Every rank forms a pipeline over the whole world and passes inputs and targets, so
  // each can check the sample counts too.
  const int k = size();
  const Data data = MakeData();
  torch::nn::Sequential seq = MakeModel();
  const LayerList model = *LayerList::FromSequential(seq);
  const std::string tag = "bad";
  StageSpec good;
  ASSERT_TRUE(SpecFor(k, 2, ScheduleKind::kGPipe, tag, &good));
  good.boundaries = Boundaries(k);
  auto expect_invalid = [&](const StageSpec& spec, const std::string& why) {
    StatusOr<StepResult> result = RunPipelineStep(model, spec, data.inputs, data.targets, Mse);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument)
        << why << ": " << result.status();
  };
  StageSpec spec = good;
  spec.boundaries.back() = kLayers - 1;
  expect_invalid(spec, "boundaries short of the model");
  spec.boundaries = {0, kLayers};
  if (k > 1) expect_invalid(spec, "one stage's boundaries for several ranks");
  spec = good;
  if (k > 1) {
    spec.boundaries[1] = spec.boundaries[2];
    expect_invalid(spec, "an empty stage");
    spec = good;
    spec.stage = (spec.stage + 1) % k;
    expect_invalid(spec, "another rank's stage");
    spec = good;
    spec.ranks[(rank() + 1) % k] = rank();
    expect_invalid(spec, "a repeated rank");
  }
  spec = good;
  spec.ranks[k - 1] = k;
  expect_invalid(spec, "a rank outside the world");
  spec = good;
  spec.micro_batches = kSamples + 1;
  expect_invalid(spec, "more micro-batches than samples");
  spec.micro_batches = 0;
  expect_invalid(spec, "no micro-batches");
  spec = good;
  spec.frozen = kLayers + 1;
  expect_invalid(spec, "frozen above L");
  spec.frozen = -1;
  expect_invalid(spec, "negative frozen");
  spec = good;
  spec.frozen = 2;
  spec.input_depth = 3;
  expect_invalid(spec, "input_depth above frozen");

  // Had any of the calls above posted an op, its name would collide with this step's
  // (same tag, same pairs); so a correct step with that tag also shows none did.
  const LayerList ref = *LayerList::FromSequential(MakeModel());
  const double ref_loss = ReferenceStep(ref, data, 0);
  StatusOr<StepResult> result = RunPipelineStep(model, good, data.inputs, data.targets, Mse);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NEAR(result->loss, ref_loss, 1e-5);
  ExpectGradients(model, ref, good);
}

}  // namespace
}  // namespace pipe
}  // namespace weft
