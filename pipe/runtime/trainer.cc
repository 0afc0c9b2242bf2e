// The elastic pipeline trainer (trainer.h). The third LibTorch translation unit of
// pipe/runtime.
//
// Who holds what. Every rank keeps the whole model and one optimizer per layer, and the
// trainer tracks, identically on every rank, which ranks hold an up-to-date copy of each
// layer (`fresh_`): after an epoch, a trainable layer is up to date only on the ranks whose
// stage ran it (the replicas' copies are equal: their gradients are averaged); a frozen
// layer never changes again. At a transition, a rank that needs a layer it does not hold
// up to date receives its parameters, buffers and (for trainable layers) optimizer state
// from a rank that does, over point-to-point ops; nothing touches the file system.
#include "pipe/runtime/trainer.h"

#include <ATen/ops/argmax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/comm.h"
#include "comm/torch/torch_comm.h"
#include "optim/optim.h"
#include "pipe/cache/cache.h"
#include "pipe/freeze/freeze.h"
#include "pipe/freeze/torch_grad_norms.h"
#include "pipe/runtime/placement.h"

namespace weft {
namespace pipe {
namespace {

namespace ta = ::weft::torch_api;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Status WaitAll(std::vector<ta::TorchHandle>& handles) {
  Status first;
  for (auto& h : handles) {
    Status s = h.wait().status();
    if (first.ok() && !s.ok()) first = s;
  }
  handles.clear();
  return first;
}

// The machines the ranks run on, as the planner sees them: every machine's ranks (from
// comm's machine detection), in rank order, when all machines hold the same number of
// ranks; otherwise one machine of all ranks (placement is then rank order). Collective.
StatusOr<Cluster> DetectCluster(const std::string& name, int world, int me) {
  at::Tensor machine_of = at::zeros({world}, at::kLong);
  machine_of[me] = machine_rank();
  WEFT_RETURN_IF_ERROR(ta::allreduce_(machine_of, /*average=*/false, name + ".machines"));
  const int machines = machine_size();
  std::vector<std::vector<int>> ranks_on(machines);
  const int64_t* m = machine_of.data_ptr<int64_t>();
  for (int r = 0; r < world; ++r) {
    if (m[r] < 0 || m[r] >= machines) {
      return Internal("ElasticTrainer: rank ", r, " reports machine ", m[r], " of ", machines);
    }
    ranks_on[m[r]].push_back(r);
  }
  Cluster cluster{1, world, {}};
  for (const auto& on : ranks_on) {
    if (static_cast<int>(on.size()) * machines != world) return cluster;
  }
  cluster.machines = machines;
  cluster.devices_per_machine = world / machines;
  for (const auto& on : ranks_on) cluster.ranks.insert(cluster.ranks.end(), on.begin(), on.end());
  bool in_order = true;
  for (int d = 0; d < world; ++d) in_order = in_order && cluster.ranks[d] == d;
  if (in_order) cluster.ranks.clear();
  return cluster;
}

}  // namespace

StatusOr<TensorDataset> TensorDataset::Create(at::Tensor inputs, at::Tensor targets,
                                              bool random_augmentation) {
  if (!inputs.defined() || !targets.defined()) {
    return InvalidArgument("TensorDataset: inputs and targets must both be given");
  }
  if (inputs.dim() < 1 || targets.dim() < 1) {
    return InvalidArgument("TensorDataset: inputs and targets need a sample dimension (dim 0)");
  }
  if (inputs.size(0) != targets.size(0)) {
    return InvalidArgument("TensorDataset: ", inputs.size(0), " inputs but ", targets.size(0),
                           " targets");
  }
  TensorDataset data;
  data.inputs_ = std::move(inputs);
  data.targets_ = std::move(targets);
  data.augmentation_ = random_augmentation;
  return data;
}

int64_t TensorDataset::size() const { return inputs_.defined() ? inputs_.size(0) : 0; }

Status TensorDataset::Get(const std::vector<int64_t>& ids, at::Tensor* inputs,
                          at::Tensor* targets) const {
  for (int64_t id : ids) {
    if (id < 0 || id >= size()) {
      return InvalidArgument("TensorDataset: sample ", id, " is not in [0, ", size(), ")");
    }
  }
  const at::Tensor index =
      at::from_blob(const_cast<int64_t*>(ids.data()), {static_cast<int64_t>(ids.size())},
                    at::kLong)
          .clone();
  if (inputs != nullptr) *inputs = inputs_.index_select(0, index);
  if (targets != nullptr) *targets = targets_.index_select(0, index);
  return OkStatus();
}

std::string EpochMetrics::ToLine() const {
  std::string line = absl::StrCat(
      "PIPE epoch=", epoch, " frozen=", frozen, " k=", k, " replicas=", replicas,
      " micro_batches=", micro_batches, " stage_layers=", absl::StrJoin(stage_layers, ","),
      " stage_costs=",
      absl::StrJoin(stage_costs, ",",
                    [](std::string* out, double c) { absl::StrAppend(out, c); }),
      " bubble=", bubble_fraction, " train_s=", train_seconds, " samples=", samples,
      " samples_per_s=", samples_per_second, " loss=", loss, " syncs_per_s=", syncs_per_second,
      " cache_hit_rate=", cache_hit_rate);
  if (transitioned) {
    absl::StrAppend(&line, " next_frozen=", next_frozen, " next_k=", next_k,
                    " next_replicas=", next_replicas,
                    " newly_active=", newly_active.empty() ? "-" : absl::StrJoin(newly_active, ","),
                    " transition_s=", transition_seconds, " transition_bytes=", transition_bytes);
  }
  return line;
}

struct ElasticTrainer::Impl {
  LayerList model;
  TrainerOptions options;
  int world = 1, me = 0, layers = 0;
  std::vector<double> sizes;
  PlanOptions plan_options;
  Plan plan;
  int initial_replicas = 1;
  int epoch = 0;
  int freeze_points = 0;  // T of the last freeze point
  int evaluations = 0;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers;  // per layer; null: no params
  std::vector<std::vector<char>> fresh;  // [rank][layer]
  std::unique_ptr<ActivationCache> cache;
  bool cache_checked = false;
  GradNormAccumulator norms{1};

  // The plan helpers (placement.h) with this trainer's choices.
  Placement placement() const {
    return Placement{options.autodp, initial_replicas, options.cache, options.micro_batches};
  }
  int Replicas(const Plan& p) const { return ActiveReplicas(p, placement()); }
  Role RoleOf(const Plan& p, int r) const { return ActiveRole(p, placement(), r); }
  std::vector<int> Needs(const Plan& p, int r) const { return NeededLayers(p, placement(), r); }
  std::vector<int> StageRanks(const Plan& p, int stage) const {
    return pipe::StageRanks(p, placement(), stage);
  }
  int MicroBatches(const Plan& p, int64_t samples) const {
    return MicroBatchCount(p, placement(), samples);
  }

  // This rank's part of its replica's pipeline for `samples` samples.
  StageSpec SpecFor(const Plan& p, Role role, int64_t samples, std::string tag) const {
    StageSpec spec;
    spec.ranks = p.ReplicaRanks(role.replica);
    spec.boundaries = p.partition.boundaries;
    spec.stage = role.stage;
    spec.frozen = p.frozen;
    spec.schedule = options.schedule;
    spec.micro_batches = MicroBatches(p, samples);
    spec.tag = std::move(tag);
    return spec;
  }

  Status CheckCache(const Dataset& data);
  StatusOr<at::Tensor> FrozenPrefix(const Dataset& data, const std::vector<int64_t>& ids,
                                    int frozen, int64_t* hits);
  Status Transition(const Plan& next, EpochMetrics* metrics);
  Status SetFrozen(int frozen);

  // The pieces of TrainEpoch, in the order it runs them.
  struct EpochState;  // what the steps of one epoch share
  // The epoch's sample order, the same on every rank.
  std::vector<int64_t> SampleOrder(int64_t n) const;
  // The configuration part of the metrics: plan, replicas, micro-batches, bubble.
  EpochMetrics PlanMetrics(const Plan& p, int replicas, int64_t replica_samples) const;
  // One optimizer step of this rank's stage: its part of the pipeline, the replicas'
  // gradient average (or, decentralized, the peer's parameter average), the update.
  Status TrainStep(const Dataset& data, EpochState& e, int64_t step);
  // Averages every parameter (or, with `gradients`, every gradient) of `held` over `ranks`,
  // as ops named tag.l<layer>.<index>.
  Status AverageLayers(const std::vector<int>& held, const std::string& tag,
                       const std::vector<int>& ranks, bool gradients);
  // The epoch's loss and cache hit rate over the replicas, and its rates.
  Status FinishMetrics(const EpochState& e, int64_t steps, EpochMetrics* metrics);
  // Which ranks still hold each trainable layer up to date after this epoch.
  void MarkFresh(const Plan& p);
  // A freeze point: the leader's decision (the transition message), the plan every rank
  // derives from it, and the transition.
  Status FreezePoint(EpochMetrics* metrics);
};

ElasticTrainer::ElasticTrainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ElasticTrainer::~ElasticTrainer() = default;

const Plan& ElasticTrainer::plan() const { return impl_->plan; }
int ElasticTrainer::epoch() const { return impl_->epoch; }
Role ElasticTrainer::role() const { return impl_->RoleOf(impl_->plan, impl_->me); }
std::vector<int> ElasticTrainer::held_layers() const {
  return impl_->Needs(impl_->plan, impl_->me);
}
torch::optim::Optimizer& ElasticTrainer::optimizer(int layer) {
  return *impl_->optimizers.at(layer);
}

StatusOr<std::unique_ptr<ElasticTrainer>> ElasticTrainer::Create(const LayerList& model,
                                                                 const TrainerOptions& options) {
  if (!is_initialized()) {
    return FailedPrecondition("ElasticTrainer: weft is not initialized; call init() first");
  }
  auto impl = std::make_unique<Impl>();
  Impl& t = *impl;
  t.model = model;
  t.options = options;
  t.world = size();
  t.me = rank();
  t.layers = model.size();
  if (t.layers < 1) return InvalidArgument("ElasticTrainer: the model has no layers");
  if (!options.make_optimizer) {
    return InvalidArgument("ElasticTrainer: options.make_optimizer is not set");
  }
  if (!options.loss) return InvalidArgument("ElasticTrainer: options.loss is not set");
  if (options.batch_size < 1) {
    return InvalidArgument("ElasticTrainer: batch_size ", options.batch_size, " < 1");
  }
  if (options.freeze_every_epochs < 1) {
    return InvalidArgument("ElasticTrainer: freeze_every_epochs must be at least 1");
  }
  const int k0 = options.k0 > 0 ? options.k0 : std::min(t.world, t.layers);
  if (k0 > t.world) {
    return InvalidArgument("ElasticTrainer: a pipeline of k0 = ", k0, " stages needs ", k0,
                           " ranks; the world has ", t.world);
  }
  if (k0 > t.layers) {
    return InvalidArgument("ElasticTrainer: k0 = ", k0, " stages for a model of ", t.layers,
                           " layers; a stage needs at least one layer");
  }
  t.sizes = model.ParameterCounts();
  WEFT_ASSIGN_OR_RETURN(t.plan_options.cluster, DetectCluster(options.name, t.world, t.me));
  t.plan_options.k0 = k0;
  t.plan_options.lambda = options.cache ? 0.0 : options.lambda;
  t.plan_options.strategy = options.strategy;
  WEFT_ASSIGN_OR_RETURN(t.plan, MakePlan(t.sizes, 0, t.plan_options));
  t.initial_replicas = t.plan.replicas;
  if (options.batch_size < t.plan.replicas) {
    return InvalidArgument("ElasticTrainer: batch_size ", options.batch_size,
                           " cannot be shared by ", t.plan.replicas, " replicas");
  }
  t.norms = GradNormAccumulator(t.layers);
  t.fresh.assign(t.world, std::vector<char>(t.layers, 1));

  // Everyone starts from rank 0's model.
  std::vector<ta::TorchHandle> handles;
  for (int l = 0; l < t.layers; ++l) {
    int i = 0;
    for (const at::Tensor& p : model.Parameters(l)) {
      WEFT_ASSIGN_OR_RETURN(auto h, ta::broadcast_nonblocking_(
                                        p, 0, absl::StrCat(options.name, ".init.l", l, ".p", i++)));
      handles.push_back(std::move(h));
    }
    i = 0;
    for (const at::Tensor& b : model.Buffers(l)) {
      WEFT_ASSIGN_OR_RETURN(auto h, ta::broadcast_nonblocking_(
                                        b, 0, absl::StrCat(options.name, ".init.l", l, ".b", i++)));
      handles.push_back(std::move(h));
    }
  }
  WEFT_RETURN_IF_ERROR(WaitAll(handles));
  t.optimizers.resize(t.layers);
  for (int l = 0; l < t.layers; ++l) {
    std::vector<at::Tensor> params = model.Parameters(l);
    if (params.empty()) continue;
    t.optimizers[l] = options.make_optimizer(params);
    if (t.optimizers[l] == nullptr) {
      return InvalidArgument("ElasticTrainer: make_optimizer returned null for layer ", l);
    }
  }
  return std::unique_ptr<ElasticTrainer>(new ElasticTrainer(std::move(impl)));
}

Status ElasticTrainer::Impl::CheckCache(const Dataset& data) {
  if (!options.cache || cache_checked) return OkStatus();
  cache_checked = true;
  ActivationCache::Options cache_options;
  cache_options.budget_bytes = options.cache_bytes;
  cache_options.spill_dir = options.cache_dir;
  // A directory given is for sharing: the replicas' stage 0s on this machine see each
  // other's entries at once, not only the evicted ones.
  cache_options.write_through = !options.cache_dir.empty();
  cache_options.random_augmentation = data.random_augmentation();
  cache_options.on_augmentation = options.bypass_cache_on_augmentation
                                      ? ActivationCache::OnAugmentation::kBypass
                                      : ActivationCache::OnAugmentation::kRefuse;
  // Every rank sees the same data set, so every rank fails (or bypasses) alike.
  WEFT_ASSIGN_OR_RETURN(cache, ActivationCache::Create(cache_options));
  return OkStatus();
}

Status ElasticTrainer::Impl::SetFrozen(int frozen) {
  for (int l = 0; l < layers; ++l) {
    for (const at::Tensor& p : model.Parameters(l)) {
      if (l < frozen) {
        at::Tensor param = p;
        param.requires_grad_(false);
        param.mutable_grad() = at::Tensor();
      }
    }
  }
  return OkStatus();
}

StatusOr<at::Tensor> ElasticTrainer::Impl::FrozenPrefix(const Dataset& data,
                                                        const std::vector<int64_t>& ids,
                                                        int frozen, int64_t* hits) {
  const size_t n = ids.size();
  std::vector<at::Tensor> rows(n);
  // Samples grouped by the depth they resume from (0: the raw input).
  std::map<int, std::vector<size_t>> by_depth;
  for (size_t i = 0; i < n; ++i) {
    WEFT_ASSIGN_OR_RETURN(auto hit, cache->GetDeepestAtMost(ids[i], frozen));
    if (!hit.has_value()) {
      by_depth[0].push_back(i);
      continue;
    }
    const TensorView v = hit->view();
    at::Tensor row = at::from_blob(const_cast<void*>(v.data()),
                                   at::IntArrayRef(v.shape().data(), v.shape().size()),
                                   at::TensorOptions().dtype(ta::ToScalarType(v.dtype())))
                         .clone();
    ++*hits;  // a full hit, or a resumption from a shallower depth
    rows[i] = row;
    if (hit->depth < frozen) by_depth[hit->depth].push_back(i);
  }
  c10::NoGradGuard no_grad;
  for (auto& [depth, members] : by_depth) {
    at::Tensor x;
    if (depth == 0) {
      std::vector<int64_t> raw_ids;
      for (size_t i : members) raw_ids.push_back(ids[i]);
      WEFT_RETURN_IF_ERROR(data.Get(raw_ids, &x, nullptr));
    } else {
      std::vector<at::Tensor> parts;
      for (size_t i : members) parts.push_back(rows[i]);
      x = at::stack(parts);
    }
    for (int l = depth; l < frozen; ++l) x = model.Forward(l, x);
    x = x.contiguous();
    for (size_t j = 0; j < members.size(); ++j) {
      rows[members[j]] = x[static_cast<int64_t>(j)];
      WEFT_ASSIGN_OR_RETURN(TensorView view, ta::ToView(rows[members[j]].contiguous()));
      WEFT_RETURN_IF_ERROR(cache->Put(ids[members[j]], frozen, view));
    }
  }
  return at::stack(rows);
}

struct ElasticTrainer::Impl::EpochState {
  std::vector<int64_t> order;
  Role role;
  int replicas = 1;
  std::vector<int64_t> shares;  // replica r's samples of a batch: [shares[r], shares[r + 1])
  bool use_cache = false;
  std::vector<int> trainable_held;
  std::vector<int> sync_ranks;  // this rank's stage in every active replica
  double loss_sum = 0;
  int64_t hits = 0, lookups = 0;
};

std::vector<int64_t> ElasticTrainer::Impl::SampleOrder(int64_t n) const {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(options.seed * 1000003ULL + static_cast<uint64_t>(epoch));
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

EpochMetrics ElasticTrainer::Impl::PlanMetrics(const Plan& p, int replicas,
                                               int64_t replica_samples) const {
  EpochMetrics metrics;
  metrics.epoch = epoch;
  metrics.frozen = p.frozen;
  metrics.k = p.k;
  metrics.replicas = replicas;
  for (int s = 0; s < p.k; ++s) metrics.stage_layers.push_back(p.partition.layers(s));
  metrics.stage_costs = p.partition.stage_costs;
  metrics.micro_batches = MicroBatches(p, replica_samples);
  metrics.bubble_fraction =
      static_cast<double>(p.k - 1) / static_cast<double>(metrics.micro_batches + p.k - 1);
  return metrics;
}

Status ElasticTrainer::Impl::AverageLayers(const std::vector<int>& held, const std::string& tag,
                                           const std::vector<int>& ranks, bool gradients) {
  std::vector<ta::TorchHandle> handles;
  for (int l : held) {
    int i = 0;
    for (const at::Tensor& p : model.Parameters(l)) {
      at::Tensor param = p;
      if (gradients && !param.grad().defined()) param.mutable_grad() = at::zeros_like(param);
      WEFT_ASSIGN_OR_RETURN(
          auto h, ta::allreduce_nonblocking_(gradients ? param.grad() : param, true,
                                             absl::StrCat(tag, ".l", l, ".", i++), ranks));
      handles.push_back(std::move(h));
    }
  }
  return WaitAll(handles);
}

Status ElasticTrainer::Impl::TrainStep(const Dataset& data, EpochState& e, int64_t step) {
  const Role role = e.role;
  const int64_t batch = options.batch_size;
  const int64_t first = step * batch + e.shares[role.replica];
  const int64_t count = e.shares[role.replica + 1] - e.shares[role.replica];
  std::vector<int64_t> ids(e.order.begin() + first, e.order.begin() + first + count);
  const std::string step_tag = absl::StrCat(options.name, ".e", epoch, ".s", step);
  StageSpec spec = SpecFor(plan, role, count, absl::StrCat(step_tag, ".r", role.replica));
  // With the cache, stage 0 hands on the frozen prefix's output: every stage skips the
  // frozen layers the partition gave it.
  spec.input_depth = e.use_cache ? plan.frozen : 0;
  at::Tensor inputs, targets;
  const bool first_stage = role.stage == 0, last_stage = role.stage == plan.k - 1;
  if (first_stage && e.use_cache) {
    WEFT_ASSIGN_OR_RETURN(inputs, FrozenPrefix(data, ids, plan.frozen, &e.hits));
    e.lookups += count;
  }
  if ((first_stage && !inputs.defined()) || last_stage) {
    WEFT_RETURN_IF_ERROR(data.Get(ids, first_stage && !inputs.defined() ? &inputs : nullptr,
                                  last_stage ? &targets : nullptr));
  }
  WEFT_ASSIGN_OR_RETURN(StepResult result,
                        RunPipelineStep(model, spec, inputs, targets, options.loss));
  e.loss_sum += result.loss;
  const bool gossip = options.sync == TrainerOptions::ReplicaSync::kGossip;
  const bool several = e.replicas > 1 && !e.trainable_held.empty();
  // Average the gradients of this stage over the replicas (frozen layers have none), under
  // the same names in every replica.
  if (several && !gossip) {
    WEFT_RETURN_IF_ERROR(
        AverageLayers(e.trainable_held, step_tag + ".sync", e.sync_ranks, /*gradients=*/true));
  }
  if (options.gradient_aware && role.replica == 0) {
    std::vector<std::vector<at::Tensor>> groups;
    for (int l : e.trainable_held) groups.push_back(model.Parameters(l));
    if (!groups.empty()) {
      WEFT_RETURN_IF_ERROR(AddGroupGradNorms(groups, &norms, e.trainable_held.front()));
    }
  }
  for (int l : e.trainable_held) {
    try {
      optimizers[l]->step();
    } catch (const std::exception& ex) {
      return Internal("TrainEpoch: the optimizer of layer ", l, " failed: ", ex.what());
    }
    for (const at::Tensor& p : model.Parameters(l)) {
      at::Tensor param = p;
      param.mutable_grad() = at::Tensor();
    }
  }
  // Decentralized: average the parameters with this step's peer replica.
  if (several && gossip) {
    int bits = 0;
    while ((1 << bits) < e.replicas) ++bits;
    const int peer_replica = role.replica ^ (1 << (step % bits));
    if (peer_replica < e.replicas) {
      std::vector<int> pair = {me, plan.ReplicaRanks(peer_replica)[role.stage]};
      std::sort(pair.begin(), pair.end());
      WEFT_RETURN_IF_ERROR(
          AverageLayers(e.trainable_held, step_tag + ".gossip", pair, /*gradients=*/false));
    }
  }
  return OkStatus();
}

Status ElasticTrainer::Impl::FinishMetrics(const EpochState& e, int64_t steps,
                                           EpochMetrics* metrics) {
  const int64_t batch = options.batch_size;
  metrics->samples = steps * batch;
  metrics->samples_per_second = metrics->train_seconds > 0
                                    ? static_cast<double>(metrics->samples) / metrics->train_seconds
                                    : 0;
  metrics->syncs_per_second =
      e.replicas > 1 && metrics->train_seconds > 0 ? steps / metrics->train_seconds : 0;
  // Loss: one contribution per replica (its stage 0); cache: stage 0s' lookups.
  at::Tensor totals = at::zeros({3}, at::kDouble);
  if (e.role.active() && e.role.stage == 0) {
    totals[0] = e.loss_sum;
    totals[1] = static_cast<double>(e.hits);
    totals[2] = static_cast<double>(e.lookups);
  }
  WEFT_RETURN_IF_ERROR(
      ta::allreduce_(totals, false, absl::StrCat(options.name, ".e", epoch, ".totals")));
  metrics->loss = totals[0].item<double>() / static_cast<double>(steps * e.replicas);
  metrics->cache_hit_rate =
      totals[2].item<double>() > 0 ? totals[1].item<double>() / totals[2].item<double>() : 0;
  return OkStatus();
}

void ElasticTrainer::Impl::MarkFresh(const Plan& p) {
  // Until the transition, only the stages that ran a trainable layer hold it up to date;
  // with gossip, only replica 0's (the others differ a little: they take its copy at the
  // transition, after the replicas averaged their parameters).
  const bool gossip = options.sync == TrainerOptions::ReplicaSync::kGossip;
  for (int r = 0; r < world; ++r) {
    std::vector<char> holds(layers, 0);
    const bool counts = !gossip || RoleOf(p, r).replica == 0;
    for (int l : Needs(p, r)) holds[l] = counts;
    for (int l = p.frozen; l < layers; ++l) fresh[r][l] = fresh[r][l] && holds[l];
  }
}

Status ElasticTrainer::Impl::FreezePoint(EpochMetrics* metrics) {
  const double transition_start = Now();
  const Plan& current = plan;
  ++freeze_points;
  // The leader decides; gradient norms come from replica 0's stages.
  std::vector<double> all_norms;
  if (options.gradient_aware) {
    const std::vector<double> mine = norms.Take();
    at::Tensor all = at::from_blob(const_cast<double*>(mine.data()),
                                   {static_cast<int64_t>(mine.size())}, at::kDouble)
                         .clone();
    WEFT_RETURN_IF_ERROR(
        ta::allreduce_(all, false, absl::StrCat(options.name, ".x", freeze_points, ".norms")));
    all_norms.assign(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
  }
  std::string message;
  if (me == 0) {
    FreezeOptions freeze_options;
    freeze_options.alpha = options.alpha;
    freeze_options.gradient_aware = options.gradient_aware;
    WEFT_ASSIGN_OR_RETURN(
        int frozen, NextFrozen(layers, freeze_points, current.frozen, all_norms, freeze_options));
    WEFT_ASSIGN_OR_RETURN(
        Plan next, MakePlan(sizes, frozen, plan_options, options.autopipe ? &current : nullptr));
    TransitionMessage m;
    m.freeze_point = freeze_points;
    m.frozen = next.frozen;
    m.k = next.k;
    m.m0 = next.m0;
    m.newly_active.assign(next.newly_active.begin(), next.newly_active.end());
    m.grad_norms = all_norms;
    message = EncodeTransition(m);
  }
  at::Tensor length = at::full({1}, static_cast<int64_t>(message.size()), at::kLong);
  const std::string tag = absl::StrCat(options.name, ".x", freeze_points);
  WEFT_RETURN_IF_ERROR(ta::broadcast_(length, 0, tag + ".size"));
  at::Tensor bytes = at::empty({length[0].item<int64_t>()}, at::kByte);
  if (me == 0) std::memcpy(bytes.data_ptr(), message.data(), message.size());
  WEFT_RETURN_IF_ERROR(ta::broadcast_(bytes, 0, tag + ".message"));
  WEFT_ASSIGN_OR_RETURN(TransitionMessage m,
                        DecodeTransition(std::string(static_cast<const char*>(bytes.data_ptr()),
                                                     static_cast<size_t>(bytes.numel()))));
  // Every rank derives the plan from the message and checks it agrees with the leader's.
  WEFT_ASSIGN_OR_RETURN(
      Plan next, MakePlan(sizes, m.frozen, plan_options, options.autopipe ? &current : nullptr));
  if (next.k != m.k ||
      std::vector<int32_t>(next.newly_active.begin(), next.newly_active.end()) != m.newly_active) {
    return Internal("transition ", m.freeze_point, ": rank ", me, " derived a plan (K = ", next.k,
                    ") other than the leader's (K = ", m.k, ")");
  }
  WEFT_RETURN_IF_ERROR(Transition(next, metrics));
  WEFT_RETURN_IF_ERROR(barrier());
  metrics->transition_seconds = Now() - transition_start;
  return OkStatus();
}

// One epoch: every replica's optimizer steps over its share of each batch, the metrics, and
// at a freeze point the transition to the next plan.
StatusOr<EpochMetrics> ElasticTrainer::TrainEpoch(const Dataset& data) {
  Impl& t = *impl_;
  WEFT_RETURN_IF_ERROR(t.CheckCache(data));
  const int64_t n = data.size();
  const int64_t batch = t.options.batch_size;
  const int64_t steps = n / batch;
  if (steps < 1) {
    return InvalidArgument("TrainEpoch: ", n, " samples do not make one batch of ", batch);
  }
  const Plan& plan = t.plan;
  Impl::EpochState e;
  e.order = t.SampleOrder(n);
  e.role = t.RoleOf(plan, t.me);
  e.replicas = t.Replicas(plan);
  e.shares = Shares(batch, e.replicas);
  e.use_cache = t.cache != nullptr && t.cache->enabled() && plan.frozen > 0;
  for (int l : t.Needs(plan, t.me)) {
    if (l >= plan.frozen && t.optimizers[l] != nullptr) e.trainable_held.push_back(l);
  }
  if (e.role.active()) e.sync_ranks = t.StageRanks(plan, e.role.stage);
  EpochMetrics metrics = t.PlanMetrics(plan, e.replicas, e.shares[1] - e.shares[0]);

  WEFT_RETURN_IF_ERROR(barrier());  // everyone starts timing together
  t.model.Train(true);
  const double start = Now();
  for (int64_t step = 0; step < steps && e.role.active(); ++step) {
    WEFT_RETURN_IF_ERROR(t.TrainStep(data, e, step));
  }
  WEFT_RETURN_IF_ERROR(barrier());
  metrics.train_seconds = Now() - start;
  WEFT_RETURN_IF_ERROR(t.FinishMetrics(e, steps, &metrics));
  t.MarkFresh(plan);
  ++t.epoch;
  const bool freeze_point = t.options.freeze && t.epoch % t.options.freeze_every_epochs == 0;
  if (!freeze_point) return metrics;
  // Decentralized replicas differ a little: their consensus average first, so that the copy
  // the others take at the transition is everyone's.
  if (t.options.sync == TrainerOptions::ReplicaSync::kGossip && e.replicas > 1 &&
      !e.trainable_held.empty()) {
    WEFT_RETURN_IF_ERROR(t.AverageLayers(e.trainable_held,
                                         absl::StrCat(t.options.name, ".e", t.epoch, ".consensus"),
                                         e.sync_ranks, /*gradients=*/false));
  }
  WEFT_RETURN_IF_ERROR(t.FreezePoint(&metrics));
  return metrics;
}

Status ElasticTrainer::Impl::Transition(const Plan& next, EpochMetrics* metrics) {
  const Plan& prev = plan;
  const int prev_replicas = Replicas(prev);
  // Transfers: (destination, layer) -> source, the same list on every rank.
  struct Transfer {
    int dst, layer, src;
  };
  std::vector<Transfer> transfers;
  for (int r = 0; r < world; ++r) {
    const Role role = RoleOf(next, r);
    for (int l : Needs(next, r)) {
      if (fresh[r][l]) continue;
      // Prefer the rank of the matching old replica that ran the layer; else the lowest
      // up-to-date rank.
      int src = -1;
      const int from_replica = role.replica % std::max(prev_replicas, 1);
      for (int q : prev.ReplicaRanks(from_replica)) {
        if (fresh[q][l]) {
          src = q;
          break;
        }
      }
      for (int q = 0; q < world && src < 0; ++q) {
        if (fresh[q][l]) src = q;
      }
      if (src < 0) {
        return Internal("transition: no rank holds layer ", l, " up to date (a bug)");
      }
      transfers.push_back({r, l, src});
    }
  }
  const std::string tag = absl::StrCat(options.name, ".x", freeze_points);
  std::vector<ta::TorchHandle> handles;
  std::vector<std::pair<int, ta::TorchHandle>> states;  // (layer, received optimizer bytes)
  int64_t bytes_sent = 0;
  for (const Transfer& x : transfers) {
    if (x.src != me && x.dst != me) continue;
    const bool sending = x.src == me;
    const int peer = sending ? x.dst : x.src;
    const std::string base = absl::StrCat(tag, ".l", x.layer);
    int i = 0;
    for (const at::Tensor& p : model.Parameters(x.layer)) {
      const std::string name = absl::StrCat(base, ".p", i++);
      if (sending) bytes_sent += p.numel() * p.element_size();
      WEFT_ASSIGN_OR_RETURN(auto h, sending ? ta::send_nonblocking(p.detach(), peer, name)
                                            : ta::recv_nonblocking_(p, peer, name));
      handles.push_back(std::move(h));
    }
    i = 0;
    for (const at::Tensor& b : model.Buffers(x.layer)) {
      const std::string name = absl::StrCat(base, ".b", i++);
      if (sending) bytes_sent += b.numel() * b.element_size();
      WEFT_ASSIGN_OR_RETURN(auto h, sending ? ta::send_nonblocking(b, peer, name)
                                            : ta::recv_nonblocking_(b, peer, name));
      handles.push_back(std::move(h));
    }
    // A trainable layer's optimizer state moves with it (momentum is not reset).
    if (x.layer >= next.frozen && optimizers[x.layer] != nullptr) {
      const std::string name = base + ".opt";
      if (sending) {
        WEFT_ASSIGN_OR_RETURN(std::string state,
                              optim::SaveOptimizerState(*optimizers[x.layer]));
        at::Tensor blob = at::empty({static_cast<int64_t>(state.size())}, at::kByte);
        std::memcpy(blob.data_ptr(), state.data(), state.size());
        bytes_sent += blob.numel();
        WEFT_ASSIGN_OR_RETURN(auto h, ta::send_nonblocking(blob, peer, name));
        handles.push_back(std::move(h));
      } else {
        WEFT_ASSIGN_OR_RETURN(auto h, ta::recv_nonblocking(peer, name));
        states.emplace_back(x.layer, std::move(h));
      }
    }
  }
  WEFT_RETURN_IF_ERROR(WaitAll(handles));
  for (auto& [layer, h] : states) {
    WEFT_ASSIGN_OR_RETURN(at::Tensor blob, h.wait());
    WEFT_RETURN_IF_ERROR(optim::LoadOptimizerState(
        *optimizers[layer], std::string(static_cast<const char*>(blob.data_ptr()),
                                        static_cast<size_t>(blob.numel()))));
  }
  for (const Transfer& x : transfers) fresh[x.dst][x.layer] = 1;
  WEFT_RETURN_IF_ERROR(SetFrozen(next.frozen));

  at::Tensor moved = at::full({1}, static_cast<double>(bytes_sent), at::kDouble);
  WEFT_RETURN_IF_ERROR(ta::allreduce_(moved, false, tag + ".bytes"));
  metrics->transitioned = true;
  metrics->next_frozen = next.frozen;
  metrics->next_k = next.k;
  metrics->next_replicas = Replicas(next);
  metrics->transition_bytes = static_cast<int64_t>(moved[0].item<double>());
  metrics->newly_active.clear();
  for (int r = 0; r < world; ++r) {
    const Role now = RoleOf(next, r), before = RoleOf(prev, r);
    if (now.active() && (!before.active() || now.replica >= prev_replicas)) {
      metrics->newly_active.push_back(r);
    }
  }
  plan = next;
  return OkStatus();
}

StatusOr<double> ElasticTrainer::Evaluate(const Dataset& data, int64_t batch_size) {
  Impl& t = *impl_;
  if (batch_size < 1) return InvalidArgument("Evaluate: batch_size must be at least 1");
  const Plan& plan = t.plan;
  const Role role = t.RoleOf(plan, t.me);
  const int replicas = t.Replicas(plan);
  const int64_t n = data.size();
  ++t.evaluations;
  t.model.Train(false);
  int64_t correct = 0, total = 0;
  for (int64_t first = 0, step = 0; first < n && role.active(); first += batch_size, ++step) {
    const int64_t count = std::min(batch_size, n - first);
    const std::vector<int64_t> shares = Shares(count, replicas);
    const int64_t mine = shares[role.replica + 1] - shares[role.replica];
    if (mine == 0) continue;  // every stage of this replica skips alike
    std::vector<int64_t> ids(mine);
    std::iota(ids.begin(), ids.end(), first + shares[role.replica]);
    StageSpec spec = t.SpecFor(plan, role, mine,
                               absl::StrCat(t.options.name, ".v", t.evaluations, ".s", step,
                                            ".r", role.replica));
    at::Tensor inputs, targets;
    const bool first_stage = role.stage == 0, last_stage = role.stage == plan.k - 1;
    if (first_stage || last_stage) {
      WEFT_RETURN_IF_ERROR(data.Get(ids, first_stage ? &inputs : nullptr,
                                    last_stage ? &targets : nullptr));
    }
    StepOptions step_options;
    step_options.backward = false;
    step_options.keep_outputs = true;
    WEFT_ASSIGN_OR_RETURN(StepResult result, RunPipelineStep(t.model, spec, inputs, targets,
                                                             t.options.loss, step_options));
    if (last_stage) {
      correct += at::argmax(result.outputs, 1).eq(targets).sum().item<int64_t>();
      total += mine;
    }
  }
  t.model.Train(true);
  at::Tensor counts = at::zeros({2}, at::kDouble);
  counts[0] = static_cast<double>(correct);
  counts[1] = static_cast<double>(total);
  WEFT_RETURN_IF_ERROR(
      ta::allreduce_(counts, false, absl::StrCat(t.options.name, ".v", t.evaluations, ".count")));
  if (counts[1].item<double>() <= 0) return InvalidArgument("Evaluate: the data set is empty");
  return counts[0].item<double>() / counts[1].item<double>();
}

}  // namespace pipe
}  // namespace weft
