// The elastic pipeline trainer (pipe/runtime/trainer.h) behind the C ABI: a TorchScript
// model file, options as plain data (optimizer and loss picked from enums), the training set
// as DLPack tensors. The only C ABI translation unit that needs LibTorch.
#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "capi/internal.h"
#include "comm/comm.h"
#include "comm/torch/torch_comm.h"
#include "core/tensor.h"
#include "pipe/runtime/runtime.h"
#include "pipe/runtime/trainer.h"
#include "weft/trainer.h"

struct weft_pipe_trainer {
  std::unique_ptr<weft::pipe::ElasticTrainer> trainer;
  weft::pipe::LayerList model;
  weft_pipe_loss_kind loss = WEFT_PIPE_LOSS_CROSS_ENTROPY;
  at::ScalarType dtype = at::kFloat;  // the model's floating type (of its first parameter)
  std::string last_line;
};

using weft::capi::CheckVersion;
using weft::capi::FillPlanInfo;
using weft::capi::Guard;
using weft::capi::Required;

namespace {

namespace pipe = weft::pipe;

std::string Shape(at::IntArrayRef sizes) {
  return absl::StrCat("[", absl::StrJoin(sizes.begin(), sizes.end(), ", "), "]");
}

weft::Status Named(const weft::Status& status, const char* fn) {
  return weft::Annotate(status, fn);
}

weft::Status NeedInit(const char* fn) {
  if (weft::is_initialized()) return weft::OkStatus();
  return weft::FailedPrecondition(fn, ": weft is not initialized; call weft_init() first");
}

weft::Status NeedTrainer(const weft_pipe_trainer* trainer, const char* fn) {
  WEFT_RETURN_IF_ERROR(Required(trainer, fn, "trainer"));
  if (trainer->trainer == nullptr) {
    return weft::FailedPrecondition(fn, ": the trainer was not created");
  }
  return weft::OkStatus();
}

bool Bool(int v, const char* fn, const char* what, weft::Status* status) {
  if (v != 0 && v != 1 && status->ok()) {
    *status = weft::InvalidArgument(fn, ": options->", what, " is ", v, "; expected 0 or 1");
  }
  return v != 0;
}

// The C options as TrainerOptions (optimizer and loss from their kinds), or what is wrong.
weft::Status ToTrainerOptions(const weft_pipe_trainer_options& c, const char* fn,
                              pipe::TrainerOptions* o) {
  weft::Status status;
  if (c.k0 < 0) return weft::InvalidArgument(fn, ": options->k0 is ", c.k0, "; expected >= 0");
  o->k0 = c.k0;
  o->freeze = Bool(c.freeze, fn, "freeze", &status);
  if (!(c.alpha > 0 && c.alpha <= 1)) {
    return weft::InvalidArgument(fn, ": options->alpha is ", c.alpha, "; expected (0, 1]");
  }
  o->alpha = c.alpha;
  o->gradient_aware = Bool(c.gradient_aware, fn, "gradient_aware", &status);
  if (c.freeze_every_epochs < 1) {
    return weft::InvalidArgument(fn, ": options->freeze_every_epochs is ",
                                 c.freeze_every_epochs, "; expected >= 1");
  }
  o->freeze_every_epochs = c.freeze_every_epochs;
  o->autopipe = Bool(c.autopipe, fn, "autopipe", &status);
  o->autodp = Bool(c.autodp, fn, "autodp", &status);
  o->cache = Bool(c.cache, fn, "cache", &status);
  WEFT_RETURN_IF_ERROR(status);
  o->cache_dir = c.cache_dir == nullptr ? "" : c.cache_dir;
  switch (weft::capi::EnumValue(c.schedule)) {
    case WEFT_PIPE_SCHEDULE_GPIPE: o->schedule = pipe::ScheduleKind::kGPipe; break;
    case WEFT_PIPE_SCHEDULE_1F1B: o->schedule = pipe::ScheduleKind::kOneFOneB; break;
    default:
      return weft::InvalidArgument(fn, ": options->schedule is ", weft::capi::EnumValue(c.schedule),
                                   "; expected WEFT_PIPE_SCHEDULE_GPIPE or _1F1B");
  }
  if (c.micro_batches < 0) {
    return weft::InvalidArgument(fn, ": options->micro_batches is ", c.micro_batches,
                                 "; expected >= 0 (0: 2 K)");
  }
  o->micro_batches = c.micro_batches;
  if (c.batch_size < 1) {
    return weft::InvalidArgument(fn, ": options->batch_size is ", c.batch_size,
                                 "; expected >= 1");
  }
  o->batch_size = c.batch_size;
  o->seed = c.seed;
  if (!(c.lr > 0) || !std::isfinite(c.lr)) {
    return weft::InvalidArgument(fn, ": options->lr is ", c.lr, "; expected > 0");
  }
  if (!(c.momentum >= 0) || !std::isfinite(c.momentum)) {
    return weft::InvalidArgument(fn, ": options->momentum is ", c.momentum, "; expected >= 0");
  }
  if (!(c.weight_decay >= 0) || !std::isfinite(c.weight_decay)) {
    return weft::InvalidArgument(fn, ": options->weight_decay is ", c.weight_decay,
                                 "; expected >= 0");
  }
  const double lr = c.lr, momentum = c.momentum, decay = c.weight_decay;
  switch (weft::capi::EnumValue(c.optimizer)) {
    case WEFT_PIPE_OPTIMIZER_SGD:
      o->make_optimizer = [=](std::vector<at::Tensor> params) {
        return std::unique_ptr<torch::optim::Optimizer>(new torch::optim::SGD(
            params, torch::optim::SGDOptions(lr).momentum(momentum).weight_decay(decay)));
      };
      break;
    case WEFT_PIPE_OPTIMIZER_ADAM:
      o->make_optimizer = [=](std::vector<at::Tensor> params) {
        return std::unique_ptr<torch::optim::Optimizer>(
            new torch::optim::Adam(params, torch::optim::AdamOptions(lr).weight_decay(decay)));
      };
      break;
    case WEFT_PIPE_OPTIMIZER_ADAMW:
      o->make_optimizer = [=](std::vector<at::Tensor> params) {
        return std::unique_ptr<torch::optim::Optimizer>(new torch::optim::AdamW(
            params, torch::optim::AdamWOptions(lr).weight_decay(decay)));
      };
      break;
    default:
      return weft::InvalidArgument(fn, ": options->optimizer is ",
                                   weft::capi::EnumValue(c.optimizer),
                                   "; expected WEFT_PIPE_OPTIMIZER_SGD, _ADAM or _ADAMW");
  }
  switch (weft::capi::EnumValue(c.loss)) {
    case WEFT_PIPE_LOSS_CROSS_ENTROPY:
      o->loss = [](const at::Tensor& out, const at::Tensor& y) {
        return at::cross_entropy_loss(out, y);
      };
      break;
    case WEFT_PIPE_LOSS_MSE:
      o->loss = [](const at::Tensor& out, const at::Tensor& y) { return at::mse_loss(out, y); };
      break;
    default:
      return weft::InvalidArgument(fn, ": options->loss is ", weft::capi::EnumValue(c.loss),
                                   "; expected WEFT_PIPE_LOSS_CROSS_ENTROPY or _MSE");
  }
  o->name = (c.name == nullptr || c.name[0] == '\0') ? "pipe" : c.name;
  if (c.decentralized != 0 && c.decentralized != 1) {
    return weft::InvalidArgument(fn, ": options->decentralized is ", c.decentralized,
                                 "; use 0 or 1");
  }
  o->sync = c.decentralized ? pipe::TrainerOptions::ReplicaSync::kGossip
                            : pipe::TrainerOptions::ReplicaSync::kAllreduce;
  return weft::OkStatus();
}

// A DLTensor borrowed as an at::Tensor (no copy): a host tensor of float32, float64, int64
// or int32 with at least one dimension.
weft::StatusOr<at::Tensor> Borrow(const DLTensor* t, const char* fn, const char* what) {
  // The C ABI's DLTensor checks: device, dtype, shape, the bytes it spans.
  WEFT_ASSIGN_OR_RETURN(weft::TensorView v, weft::capi::View(t, fn, what));
  if (v.device().type != weft::Device::Type::kCPU) {
    return weft::InvalidArgument(fn, ": ", what, " is on ", v.device().ToString(),
                                 "; the trainer takes CPU tensors");
  }
  if (v.ndim() < 1) {
    return weft::InvalidArgument(fn, ": ", what,
                                 " has 0 dimensions; it needs a sample dimension (dim 0)");
  }
  const weft::DType dtype = v.dtype();
  if (dtype != weft::DType::kFloat32 && dtype != weft::DType::kFloat64 &&
      dtype != weft::DType::kInt64 && dtype != weft::DType::kInt32) {
    return weft::InvalidArgument(fn, ": ", what, " is ", weft::DTypeName(dtype),
                                 "; expected float32, float64, int64 or int32");
  }
  // LibTorch's own limits beyond those: no negative strides; the dims' product, taken in
  // order, must fit in int64 even when a later dim is 0; and so must the storage's bytes,
  // counted to the end of the last element (past them, from_blob ends the process).
  const absl::Span<const int64_t> sizes = v.shape();
  const absl::Span<const int64_t> strides = v.strides();
  for (int64_t s : strides) {
    if (s < 0) return weft::InvalidArgument(fn, ": ", what, " has a negative stride");
  }
  int64_t numel = 1;
  bool overflow = false;
  for (int64_t d : sizes) overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
  if (!overflow && numel > 0) {
    int64_t storage = 1;  // elements from the first to the end of the last
    for (size_t i = 0; i < sizes.size() && !overflow; ++i) {
      int64_t step = 0;
      overflow = __builtin_mul_overflow(sizes[i] - 1, strides[i], &step) ||
                 __builtin_add_overflow(storage, step, &storage);
    }
    overflow =
        overflow || __builtin_mul_overflow(storage, static_cast<int64_t>(v.itemsize()), &storage);
  }
  if (overflow) {
    return weft::InvalidArgument(fn, ": ", what, " has shape ", weft::ShapeToString(sizes),
                                 " and strides ", weft::ShapeToString(strides),
                                 ": more elements or bytes than an int64 counts");
  }
  if (numel > 0 && v.data() == nullptr) {
    return weft::InvalidArgument(fn, ": ", what, "->data is NULL");
  }
  return at::from_blob(v.data(), at::IntArrayRef(sizes.data(), sizes.size()),
                       at::IntArrayRef(strides.data(), strides.size()),
                       at::TensorOptions().dtype(weft::torch_api::ToScalarType(dtype)));
}

// The training or evaluation set, converted only where the model or loss needs another
// type. The same checks on every rank (each holds the whole set), so every rank fails
// alike, before any communication.
weft::StatusOr<pipe::TensorDataset> MakeData(const weft_pipe_trainer& t, const DLTensor* inputs,
                                             const DLTensor* targets, bool classes,
                                             const char* fn) {
  WEFT_ASSIGN_OR_RETURN(at::Tensor x, Borrow(inputs, fn, "inputs"));
  WEFT_ASSIGN_OR_RETURN(at::Tensor y, Borrow(targets, fn, "targets"));
  if (!at::isFloatingType(x.scalar_type())) {
    return weft::InvalidArgument(fn, ": inputs are ", at::toString(x.scalar_type()),
                                 "; expected float32 or float64");
  }
  if (x.scalar_type() != t.dtype) x = x.to(t.dtype);
  if (classes) {
    if (at::isFloatingType(y.scalar_type())) {
      return weft::InvalidArgument(
          fn, ": targets are ", at::toString(y.scalar_type()),
          "; cross-entropy and accuracy need class indices (int64 or int32)");
    }
    if (y.scalar_type() != at::kLong) y = y.to(at::kLong);
  } else {
    if (!at::isFloatingType(y.scalar_type())) {
      return weft::InvalidArgument(fn, ": targets are ", at::toString(y.scalar_type()),
                                   "; the MSE loss needs float32 or float64 targets");
    }
    if (y.scalar_type() != t.dtype) y = y.to(t.dtype);
  }
  if (x.size(0) != y.size(0)) {
    return weft::InvalidArgument(fn, ": ", x.size(0), " inputs but ", y.size(0),
                                 " targets; dim 0 is the sample");
  }
  if (x.size(0) == 0) return weft::InvalidArgument(fn, ": the data set is empty");
  // One sample through the whole model (evaluation mode, no autograd): a model that does
  // not fit the data fails here on every rank, instead of on one stage mid-pipeline.
  pipe::LayerList model = t.model;  // shares the modules
  try {
    c10::NoGradGuard no_grad;
    model.Train(false);
    at::Tensor out = x.narrow(0, 0, 1);
    for (int l = 0; l < model.size(); ++l) out = model.Forward(l, out);
    model.Train(true);
    if (!classes) {
      (void)at::mse_loss(out, y.narrow(0, 0, 1));
    } else if (out.dim() != 2) {
      return weft::InvalidArgument(fn, ": the model's output has shape ", Shape(out.sizes()),
                                   " for one sample; class scores [N, C] are needed");
    } else {
      (void)at::cross_entropy_loss(out, y.narrow(0, 0, 1));
    }
  } catch (const std::exception& e) {
    model.Train(true);
    std::string what = e.what();
    // c10's messages carry a C++ backtrace after the first line: keep the first.
    const size_t end = what.find('\n');
    if (end != std::string::npos) what.resize(end);
    return weft::InvalidArgument(fn, ": the model does not fit the data (inputs ",
                                 Shape(x.sizes()), ", targets ", Shape(y.sizes()), "): ", what);
  }
  WEFT_ASSIGN_OR_RETURN(auto data, pipe::TensorDataset::Create(x, y));
  return data;
}

}  // namespace

extern "C" {

weft_status weft_pipe_trainer_options_init(weft_pipe_trainer_options* options,
                                           unsigned int version) {
  // The fields the C++ trainer has come from its TrainerOptions; the optimizer, learning
  // rate and loss exist only at this level.
  const pipe::TrainerOptions cc;
  weft_pipe_trainer_options d = WEFT_PIPE_TRAINER_OPTIONS_INIT;
  d.k0 = cc.k0;
  d.freeze = cc.freeze ? 1 : 0;
  d.alpha = cc.alpha;
  d.gradient_aware = cc.gradient_aware ? 1 : 0;
  d.freeze_every_epochs = cc.freeze_every_epochs;
  d.autopipe = cc.autopipe ? 1 : 0;
  d.autodp = cc.autodp ? 1 : 0;
  d.cache = cc.cache ? 1 : 0;
  d.schedule = cc.schedule == pipe::ScheduleKind::kOneFOneB ? WEFT_PIPE_SCHEDULE_1F1B
                                                            : WEFT_PIPE_SCHEDULE_GPIPE;
  d.micro_batches = cc.micro_batches;
  d.batch_size = cc.batch_size;
  d.seed = cc.seed;
  d.decentralized = cc.sync == pipe::TrainerOptions::ReplicaSync::kGossip ? 1 : 0;
  return weft::capi::InitOptions(options, version, WEFT_PIPE_TRAINER_OPTIONS_VERSION,
                                 "weft_pipe_trainer_options_init",
                                 "WEFT_PIPE_TRAINER_OPTIONS_VERSION", d);
}

weft_status weft_pipe_trainer_create(weft_pipe_trainer** out, const char* torchscript_path,
                                     const weft_pipe_trainer_options* options) {
  static const char* fn = "weft_pipe_trainer_create";
  return Guard(fn, [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(out, fn, "out"));
    *out = nullptr;
    WEFT_RETURN_IF_ERROR(Required(torchscript_path, fn, "torchscript_path"));
    WEFT_RETURN_IF_ERROR(NeedInit(fn));
    const weft_pipe_trainer_options defaults = WEFT_PIPE_TRAINER_OPTIONS_INIT;
    if (options != nullptr) {
      WEFT_RETURN_IF_ERROR(CheckVersion(options->version, WEFT_PIPE_TRAINER_OPTIONS_VERSION,
                                        fn, "weft_pipe_trainer_options",
                                        "WEFT_PIPE_TRAINER_OPTIONS_INIT"));
    }
    const weft_pipe_trainer_options& c = options != nullptr ? *options : defaults;
    pipe::TrainerOptions o;
    weft::Status local = ToTrainerOptions(c, fn, &o);
    auto trainer = std::make_unique<weft_pipe_trainer>();
    if (local.ok()) {
      trainer->loss = c.loss;  // checked by ToTrainerOptions
      auto model = pipe::LayerList::Load(torchscript_path);
      if (model.ok()) {
        trainer->model = *std::move(model);
      } else {
        local = Named(model.status(), fn);
      }
    }
    // A file one rank cannot read must not leave the others waiting in Create's
    // broadcasts: every rank learns how many failed.
    at::Tensor failed = at::full({1}, local.ok() ? 0.0 : 1.0, at::kDouble);
    const std::string name = (c.name == nullptr || c.name[0] == '\0') ? "pipe" : c.name;
    WEFT_RETURN_IF_ERROR(Named(
        weft::torch_api::allreduce_(failed, false, absl::StrCat(name, ".create.check")), fn));
    if (!local.ok()) return local;
    const int others = static_cast<int>(failed.item<double>());
    if (others > 0) {
      return weft::FailedPrecondition(fn, ": ", others, " other rank(s) could not load \"",
                                      torchscript_path,
                                      "\" or refused the options; see their errors");
    }
    for (int l = 0; l < trainer->model.size(); ++l) {
      bool found = false;
      for (const at::Tensor& p : trainer->model.Parameters(l)) {
        if (at::isFloatingType(p.scalar_type())) {
          trainer->dtype = p.scalar_type();
          found = true;
          break;
        }
      }
      if (found) break;
    }
    auto created = pipe::ElasticTrainer::Create(trainer->model, o);
    if (!created.ok()) return Named(created.status(), fn);
    trainer->trainer = *std::move(created);
    *out = trainer.release();
    return weft::OkStatus();
  });
}

void weft_pipe_trainer_destroy(weft_pipe_trainer* trainer) {
  try {
    delete trainer;
  } catch (...) {
  }
}

weft_status weft_pipe_trainer_train_epoch(weft_pipe_epoch_metrics* metrics,
                                          weft_pipe_trainer* trainer, const DLTensor* inputs,
                                          const DLTensor* targets) {
  static const char* fn = "weft_pipe_trainer_train_epoch";
  return Guard(fn, [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(NeedTrainer(trainer, fn));
    if (metrics != nullptr) {
      WEFT_RETURN_IF_ERROR(CheckVersion(metrics->version, WEFT_PIPE_EPOCH_METRICS_VERSION, fn,
                                        "weft_pipe_epoch_metrics",
                                        "WEFT_PIPE_EPOCH_METRICS_INIT"));
    }
    WEFT_RETURN_IF_ERROR(NeedInit(fn));
    WEFT_ASSIGN_OR_RETURN(
        auto data,
        MakeData(*trainer, inputs, targets, trainer->loss == WEFT_PIPE_LOSS_CROSS_ENTROPY, fn));
    auto result = trainer->trainer->TrainEpoch(data);
    if (!result.ok()) return Named(result.status(), fn);
    const pipe::EpochMetrics& m = *result;
    trainer->last_line = m.ToLine();
    if (metrics != nullptr) {
      metrics->epoch = m.epoch;
      metrics->frozen = m.frozen;
      metrics->k = m.k;
      metrics->replicas = m.replicas;
      metrics->micro_batches = m.micro_batches;
      metrics->bubble_fraction = m.bubble_fraction;
      metrics->train_seconds = m.train_seconds;
      metrics->samples = m.samples;
      metrics->samples_per_second = m.samples_per_second;
      metrics->loss = m.loss;
      metrics->syncs_per_second = m.syncs_per_second;
      metrics->cache_hit_rate = m.cache_hit_rate;
      metrics->transitioned = m.transitioned ? 1 : 0;
      metrics->next_frozen = m.next_frozen;
      metrics->next_k = m.next_k;
      metrics->next_replicas = m.next_replicas;
      metrics->transition_seconds = m.transition_seconds;
      metrics->transition_bytes = m.transition_bytes;
    }
    return weft::OkStatus();
  });
}

weft_status weft_pipe_trainer_last_line(char* buf, size_t cap, size_t* needed,
                                        const weft_pipe_trainer* trainer) {
  static const char* fn = "weft_pipe_trainer_last_line";
  return Guard(fn, [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(needed, fn, "needed"));
    WEFT_RETURN_IF_ERROR(NeedTrainer(trainer, fn));
    const std::string& line = trainer->last_line;
    *needed = line.size() + 1;
    if (buf == nullptr && cap == 0) return weft::OkStatus();
    if (cap < line.size() + 1) {
      return absl::OutOfRangeError(absl::StrCat(fn, ": the buffer holds ", cap,
                                                " bytes but ", line.size() + 1,
                                                " are needed (call with cap ", line.size() + 1,
                                                ")"));
    }
    if (buf == nullptr) return weft::InvalidArgument(fn, ": buf is NULL");
    std::memcpy(buf, line.c_str(), line.size() + 1);
    return weft::OkStatus();
  });
}

weft_status weft_pipe_trainer_evaluate(double* accuracy, weft_pipe_trainer* trainer,
                                       const DLTensor* inputs, const DLTensor* targets) {
  static const char* fn = "weft_pipe_trainer_evaluate";
  return Guard(fn, [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(accuracy, fn, "accuracy"));
    WEFT_RETURN_IF_ERROR(NeedTrainer(trainer, fn));
    if (trainer->loss != WEFT_PIPE_LOSS_CROSS_ENTROPY) {
      return weft::FailedPrecondition(
          fn, ": accuracy compares the argmax output with class indices; this trainer's loss "
              "is MSE (use a WEFT_PIPE_LOSS_CROSS_ENTROPY trainer)");
    }
    WEFT_RETURN_IF_ERROR(NeedInit(fn));
    WEFT_ASSIGN_OR_RETURN(auto data, MakeData(*trainer, inputs, targets, true, fn));
    auto result = trainer->trainer->Evaluate(data);
    if (!result.ok()) return Named(result.status(), fn);
    *accuracy = *result;
    return weft::OkStatus();
  });
}

weft_status weft_pipe_trainer_role(int* replica, int* stage, const weft_pipe_trainer* trainer) {
  static const char* fn = "weft_pipe_trainer_role";
  return Guard(fn, [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(replica, fn, "replica"));
    WEFT_RETURN_IF_ERROR(Required(stage, fn, "stage"));
    WEFT_RETURN_IF_ERROR(NeedTrainer(trainer, fn));
    const weft::pipe::Role role = trainer->trainer->role();
    *replica = role.replica;
    *stage = role.stage;
    return weft::OkStatus();
  });
}

weft_status weft_pipe_trainer_get_plan_info(weft_pipe_plan_info* info,
                                            const weft_pipe_trainer* trainer) {
  static const char* fn = "weft_pipe_trainer_get_plan_info";
  return Guard(fn, [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(info, fn, "info"));
    WEFT_RETURN_IF_ERROR(CheckVersion(info->version, WEFT_PIPE_PLAN_INFO_VERSION, fn,
                                      "weft_pipe_plan_info", "WEFT_PIPE_PLAN_INFO_INIT"));
    WEFT_RETURN_IF_ERROR(NeedTrainer(trainer, fn));
    FillPlanInfo(trainer->trainer->plan(), info);
    return weft::OkStatus();
  });
}

}  // extern "C"
