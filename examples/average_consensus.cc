// Average consensus, the first program of decentralized computing: every rank starts
// from a random vector and repeatedly averages with its neighbors only. No rank ever
// computes the global average, yet every rank converges to it, geometrically.
//
//   tools/weftrun -np 4 bazel-bin/examples/average_consensus [--iterations N] [--dim D]
//
// Phase 1 uses the static exponential graph (each rank averages with its in-neighbors);
// phase 2 the dynamic one-peer schedule over the same graph (one neighbor per step).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/topology.h"
#include "tools/cli/flags.h"

namespace {

int Fail(const weft::Status& st) {
  std::fprintf(stderr, "average_consensus: %s\n", st.ToString().c_str());
  return 1;
}

weft::TensorView View(std::vector<double>& v) {
  return weft::TensorView(v.data(), weft::DType::kFloat64, {static_cast<int64_t>(v.size())});
}

// sqrt(mean over ranks of ||x_i - mean||^2): the distance to consensus.
weft::StatusOr<double> Distance(std::vector<double>& x, const std::vector<double>& mean) {
  std::vector<double> sq(1, 0.0);
  for (size_t i = 0; i < x.size(); ++i) sq[0] += (x[i] - mean[i]) * (x[i] - mean[i]);
  WEFT_RETURN_IF_ERROR(weft::allreduce(View(sq), View(sq), /*average=*/true));
  return std::sqrt(sq[0]);
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 15;
  int dim = 1000;
  weft::cli::FlagSet flags("average_consensus",
                           "Average consensus over the exponential graph, static then one-peer "
                           "(examples/average_consensus.cc).");
  flags.Int("--iterations", &iterations, "steps of each phase", 1, 1 << 30)
      .Int("--dim", &dim, "doubles in each rank's vector", 1, 1 << 30);
  flags.ParseOrExit(argc, argv);
  if (weft::Status st = weft::init(); !st.ok()) return Fail(st);
  const int rank = weft::rank(), size = weft::size();

  std::mt19937_64 rng(1234 + rank);
  std::normal_distribution<double> normal(rank, 1.0);
  std::vector<double> start(dim);
  for (double& v : start) v = normal(rng);

  // The true average, for measuring only: the algorithm never uses it.
  std::vector<double> mean = start;
  if (weft::Status st = weft::allreduce(View(mean), View(mean), true); !st.ok()) return Fail(st);

  if (rank == 0) {
    std::printf("average consensus on %d ranks, vectors of %d doubles\n", size, dim);
  }
  int status = 0;
  for (int phase = 0; phase < 2 && status == 0; ++phase) {
    std::vector<double> x = start;
    auto schedule = weft::OnePeerSchedule(*weft::ExponentialTwoGraph(size), rank);
    if (!schedule.ok()) return Fail(schedule.status());
    if (rank == 0) {
      std::printf("\n%s\n%5s  %14s  %10s\n",
                  phase == 0 ? "static exponential graph (neighbor_allreduce)"
                             : "dynamic one-peer exponential schedule (dst_weights per step)",
                  "iter", "distance", "ratio");
    }
    auto d0 = Distance(x, mean);
    if (!d0.ok()) return Fail(d0.status());
    double previous = *d0;
    if (rank == 0) std::printf("%5d  %14.6e  %10s\n", 0, previous, "");
    for (int it = 1; it <= iterations; ++it) {
      weft::Status st;
      if (phase == 0) {
        st = weft::neighbor_allreduce(View(x), View(x));
      } else {
        weft::SendRecvRanks step = (*schedule)->Next();
        weft::NeighborAllreduceOptions opts;
        opts.self_weight = 0.5;
        std::map<int, double> src, dst;
        for (int j : step.recv_ranks) src[j] = 0.5 / step.recv_ranks.size();
        for (int j : step.send_ranks) dst[j] = 1.0;
        if (src.empty()) opts.self_weight = 1.0;
        opts.src_weights = src;
        opts.dst_weights = dst;
        st = weft::neighbor_allreduce(View(x), View(x), opts);
      }
      if (!st.ok()) return Fail(st);
      auto d = Distance(x, mean);
      if (!d.ok()) return Fail(d.status());
      if (rank == 0) {
        std::printf("%5d  %14.6e  %10.4f\n", it, *d, previous > 0 ? *d / previous : 0.0);
      }
      previous = *d;
    }
    // Geometric decrease: after the iterations the distance must be 100x smaller.
    if (size > 1 && previous > 1e-2 * *d0) {
      if (rank == 0) std::printf("did not converge: %.3e of the start\n", previous / *d0);
      status = 2;
    }
  }
  if (weft::Status st = weft::shutdown(); !st.ok()) return Fail(st);
  return status;
}
