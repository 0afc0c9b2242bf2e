// Topologies and dynamic schedules in the C ABI: thin wrappers over comm/topology.h.
#include <memory>
#include <utility>

#include "capi/internal.h"
#include "comm/topology.h"


struct weft_schedule {
  std::unique_ptr<weft::DynamicSchedule> schedule;
  weft::SendRecvRanks current;
  bool started = false;
};

namespace weft {
namespace capi {
namespace {

// Stores a generated topology in *out (which stays untouched on failure).
Status Emit(weft_topology** out, StatusOr<Topology> topo, const char* function) {
  WEFT_RETURN_IF_ERROR(Required(out, function, "out"));
  if (!topo.ok()) return Annotate(topo.status(), function);
  *out = new weft_topology{std::move(*topo)};
  return OkStatus();
}

Status EmitSchedule(weft_schedule** out, StatusOr<std::unique_ptr<DynamicSchedule>> schedule,
                    const char* function) {
  WEFT_RETURN_IF_ERROR(Required(out, function, "out"));
  if (!schedule.ok()) return Annotate(schedule.status(), function);
  auto s = std::make_unique<weft_schedule>();
  s->schedule = std::move(*schedule);
  *out = s.release();
  return OkStatus();
}

Status CheckRankOf(const weft_topology* topo, int rank, const char* function) {
  WEFT_RETURN_IF_ERROR(Required(topo, function, "topo"));
  if (rank < 0 || rank >= topo->topo.size()) {
    return InvalidArgument(function, ": rank ", rank, " is out of range for a topology of ",
                           topo->topo.size(), " ranks (expected 0..", topo->topo.size() - 1,
                           ")");
  }
  return OkStatus();
}

Status CopyWeights(const RecvWeights& w, double* self_weight, int* ranks, double* weights,
                   size_t capacity, size_t* count, const char* function) {
  WEFT_RETURN_IF_ERROR(Required(self_weight, function, "self_weight"));
  WEFT_RETURN_IF_ERROR(Required(count, function, "count"));
  *count = w.neighbor_weights.size();
  *self_weight = w.self_weight;
  if (ranks == nullptr && weights == nullptr && capacity == 0) return OkStatus();
  if (*count > capacity) {
    return absl::OutOfRangeError(absl::StrCat(function, ": the buffers hold ", capacity,
                                              " entries but ", *count, " are needed"));
  }
  if (*count > 0 && (ranks == nullptr || weights == nullptr)) {
    return InvalidArgument(function, ": ranks or weights is NULL");
  }
  size_t i = 0;
  for (const auto& [rank, weight] : w.neighbor_weights) {
    ranks[i] = rank;
    weights[i] = weight;
    ++i;
  }
  *self_weight = w.self_weight;
  return OkStatus();
}

Status CopyRanks(const weft_schedule* s, bool send, int* ranks, size_t capacity, size_t* count,
                 const char* function) {
  WEFT_RETURN_IF_ERROR(Required(s, function, "schedule"));
  if (!s->started) {
    return FailedPrecondition(function, ": the schedule has no current step yet; call "
                              "weft_schedule_next first");
  }
  return CopyOut(send ? s->current.send_ranks : s->current.recv_ranks, ranks, capacity, count,
                 function);
}

}  // namespace
}  // namespace capi
}  // namespace weft

using weft::Status;
using weft::capi::Guard;
using weft::capi::Required;

extern "C" {

weft_status weft_topology_create(weft_topology** out, int size) {
  return Guard("weft_topology_create", [&]() -> Status {
    if (size < 1) {
      return weft::InvalidArgument("weft_topology_create: size must be at least 1, got ", size);
    }
    return weft::capi::Emit(out, weft::Topology(size), "weft_topology_create");
  });
}

weft_status weft_topology_from_weight_matrix(weft_topology** out, int size,
                                             const double* weights) {
  const char* fn = "weft_topology_from_weight_matrix";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(weights, fn, "weights"));
    if (size < 1) return weft::InvalidArgument(fn, ": size must be at least 1, got ", size);
    std::vector<std::vector<double>> w(size, std::vector<double>(size));
    for (int i = 0; i < size; ++i) {
      for (int j = 0; j < size; ++j) w[i][j] = weights[static_cast<size_t>(i) * size + j];
    }
    return weft::capi::Emit(out, weft::Topology::FromWeightMatrix(w), fn);
  });
}

weft_status weft_topology_exponential(weft_topology** out, int size, int base) {
  return Guard("weft_topology_exponential", [&] {
    return weft::capi::Emit(out, weft::ExponentialGraph(size, base), "weft_topology_exponential");
  });
}

weft_status weft_topology_exponential_two(weft_topology** out, int size) {
  return Guard("weft_topology_exponential_two", [&] {
    return weft::capi::Emit(out, weft::ExponentialTwoGraph(size),
                            "weft_topology_exponential_two");
  });
}

weft_status weft_topology_symmetric_exponential(weft_topology** out, int size, int base) {
  return Guard("weft_topology_symmetric_exponential", [&] {
    return weft::capi::Emit(out, weft::SymmetricExponentialGraph(size, base),
                            "weft_topology_symmetric_exponential");
  });
}

weft_status weft_topology_mesh_grid_2d(weft_topology** out, int size, int rows, int cols) {
  const char* fn = "weft_topology_mesh_grid_2d";
  return Guard(fn, [&]() -> Status {
    std::optional<std::pair<int, int>> shape;
    if (rows != 0 || cols != 0) shape = std::make_pair(rows, cols);
    return weft::capi::Emit(out, weft::MeshGrid2DGraph(size, shape), fn);
  });
}

weft_status weft_topology_star(weft_topology** out, int size, int center) {
  return Guard("weft_topology_star", [&] {
    return weft::capi::Emit(out, weft::StarGraph(size, center), "weft_topology_star");
  });
}

weft_status weft_topology_ring(weft_topology** out, int size, int style) {
  return Guard("weft_topology_ring", [&] {
    return weft::capi::Emit(out, weft::RingGraph(size, style), "weft_topology_ring");
  });
}

weft_status weft_topology_fully_connected(weft_topology** out, int size) {
  return Guard("weft_topology_fully_connected", [&] {
    return weft::capi::Emit(out, weft::FullyConnectedGraph(size),
                            "weft_topology_fully_connected");
  });
}

weft_status weft_topology_clone(weft_topology** out, const weft_topology* topo) {
  return Guard("weft_topology_clone", [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(topo, "weft_topology_clone", "topo"));
    return weft::capi::Emit(out, topo->topo, "weft_topology_clone");
  });
}

void weft_topology_destroy(weft_topology* topo) { delete topo; }

weft_status weft_topology_add_edge(weft_topology* topo, int from, int to, double weight) {
  return Guard("weft_topology_add_edge", [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(topo, "weft_topology_add_edge", "topo"));
    return weft::Annotate(topo->topo.AddEdge(from, to, weight), "weft_topology_add_edge");
  });
}

weft_status weft_topology_set_self_weight(weft_topology* topo, int rank, double weight) {
  return Guard("weft_topology_set_self_weight", [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(topo, "weft_topology_set_self_weight", "topo"));
    return weft::Annotate(topo->topo.SetSelfWeight(rank, weight),
                          "weft_topology_set_self_weight");
  });
}

int weft_topology_size(const weft_topology* topo) {
  return topo == nullptr ? -1 : topo->topo.size();
}

weft_status weft_topology_weight(double* weight, const weft_topology* topo, int from, int to) {
  const char* fn = "weft_topology_weight";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(weight, fn, "weight"));
    WEFT_RETURN_IF_ERROR(weft::capi::CheckRankOf(topo, from, fn));
    WEFT_RETURN_IF_ERROR(weft::capi::CheckRankOf(topo, to, fn));
    *weight = topo->topo.weight(from, to);
    return weft::OkStatus();
  });
}

weft_status weft_topology_in_neighbors(int* ranks, size_t capacity, size_t* count,
                                       const weft_topology* topo, int rank) {
  const char* fn = "weft_topology_in_neighbors";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(weft::capi::CheckRankOf(topo, rank, fn));
    return weft::capi::CopyOut(topo->topo.in_neighbors(rank), ranks, capacity, count, fn);
  });
}

weft_status weft_topology_out_neighbors(int* ranks, size_t capacity, size_t* count,
                                        const weft_topology* topo, int rank) {
  const char* fn = "weft_topology_out_neighbors";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(weft::capi::CheckRankOf(topo, rank, fn));
    return weft::capi::CopyOut(topo->topo.out_neighbors(rank), ranks, capacity, count, fn);
  });
}

weft_status weft_topology_weight_matrix(double* weights, size_t capacity, size_t* count,
                                        const weft_topology* topo) {
  const char* fn = "weft_topology_weight_matrix";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(topo, fn, "topo"));
    std::vector<double> flat;
    flat.reserve(static_cast<size_t>(topo->topo.size()) * topo->topo.size());
    for (const auto& row : topo->topo.ToWeightMatrix()) flat.insert(flat.end(), row.begin(), row.end());
    return weft::capi::CopyOut(flat, weights, capacity, count, fn);
  });
}

weft_status weft_topology_recv_weights(double* self_weight, int* ranks, double* weights,
                                       size_t capacity, size_t* count,
                                       const weft_topology* topo, int rank) {
  const char* fn = "weft_topology_recv_weights";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(weft::capi::CheckRankOf(topo, rank, fn));
    return weft::capi::CopyWeights(weft::GetRecvWeights(topo->topo, rank), self_weight, ranks,
                                   weights, capacity, count, fn);
  });
}

weft_status weft_topology_send_weights(double* self_weight, int* ranks, double* weights,
                                       size_t capacity, size_t* count,
                                       const weft_topology* topo, int rank) {
  const char* fn = "weft_topology_send_weights";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(weft::capi::CheckRankOf(topo, rank, fn));
    return weft::capi::CopyWeights(weft::GetSendWeights(topo->topo, rank), self_weight, ranks,
                                   weights, capacity, count, fn);
  });
}

weft_status weft_topology_is_regular(int* result, const weft_topology* topo) {
  return Guard("weft_topology_is_regular", [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(result, "weft_topology_is_regular", "result"));
    WEFT_RETURN_IF_ERROR(Required(topo, "weft_topology_is_regular", "topo"));
    *result = weft::IsRegular(topo->topo) ? 1 : 0;
    return weft::OkStatus();
  });
}

weft_status weft_topology_is_equivalent(int* result, const weft_topology* a,
                                        const weft_topology* b) {
  return Guard("weft_topology_is_equivalent", [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(result, "weft_topology_is_equivalent", "result"));
    WEFT_RETURN_IF_ERROR(Required(a, "weft_topology_is_equivalent", "a"));
    WEFT_RETURN_IF_ERROR(Required(b, "weft_topology_is_equivalent", "b"));
    *result = weft::IsEquivalent(a->topo, b->topo) ? 1 : 0;
    return weft::OkStatus();
  });
}

weft_status weft_schedule_one_peer(weft_schedule** out, const weft_topology* topo, int rank) {
  const char* fn = "weft_schedule_one_peer";
  return Guard(fn, [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(topo, fn, "topo"));
    return weft::capi::EmitSchedule(out, weft::OnePeerSchedule(topo->topo, rank), fn);
  });
}

weft_status weft_schedule_machine_exponential_two(weft_schedule** out, int machine_size,
                                                  int machine_rank) {
  const char* fn = "weft_schedule_machine_exponential_two";
  return Guard(fn, [&] {
    return weft::capi::EmitSchedule(
        out, weft::MachineExponentialTwoSchedule(machine_size, machine_rank), fn);
  });
}

weft_status weft_schedule_inner_outer_ring(weft_schedule** out, int world_size, int local_size,
                                           int rank) {
  const char* fn = "weft_schedule_inner_outer_ring";
  return Guard(fn, [&] {
    return weft::capi::EmitSchedule(
        out, weft::InnerOuterRingSchedule(world_size, local_size, rank), fn);
  });
}

weft_status weft_schedule_inner_outer_exponential_two(weft_schedule** out, int world_size,
                                                      int local_size, int rank) {
  const char* fn = "weft_schedule_inner_outer_exponential_two";
  return Guard(fn, [&] {
    return weft::capi::EmitSchedule(
        out, weft::InnerOuterExponentialTwoSchedule(world_size, local_size, rank), fn);
  });
}

void weft_schedule_destroy(weft_schedule* schedule) { delete schedule; }

weft_status weft_schedule_next(weft_schedule* schedule) {
  return Guard("weft_schedule_next", [&]() -> Status {
    WEFT_RETURN_IF_ERROR(Required(schedule, "weft_schedule_next", "schedule"));
    schedule->current = schedule->schedule->Next();
    schedule->started = true;
    return weft::OkStatus();
  });
}

weft_status weft_schedule_send_ranks(int* ranks, size_t capacity, size_t* count,
                                     const weft_schedule* schedule) {
  return Guard("weft_schedule_send_ranks", [&] {
    return weft::capi::CopyRanks(schedule, true, ranks, capacity, count,
                                 "weft_schedule_send_ranks");
  });
}

weft_status weft_schedule_recv_ranks(int* ranks, size_t capacity, size_t* count,
                                     const weft_schedule* schedule) {
  return Guard("weft_schedule_recv_ranks", [&] {
    return weft::capi::CopyRanks(schedule, false, ranks, capacity, count,
                                 "weft_schedule_recv_ranks");
  });
}

}  // extern "C"
