// window_bench: one-sided window puts and accumulates through weft on both transports
// (MPI RMA and UCX) against the same bytes moved by raw MPI RMA and by a plain
// MPI_Isend/MPI_Irecv exchange, in one run. "ucx/mpi" is the UCX transport's speed-up. Run on 2 ranks (bench/run_window_bench.sh): both ranks send to each other at
// once, as neighbors do in decentralized training.
//
// For each size: warm up, agree on an iteration count, barrier, time the loop, report the
// max over ranks of the mean per op. weft's put includes what it adds to a put: the
// version counter and the associated p in the same lock epoch, and the scaling when a
// weight is not 1 (the benchmark uses weight 1).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/topology.h"
#include "core/tensor.h"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Check(const weft::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "window_bench: %s: %s\n", what, std::string(s.message()).c_str());
    std::exit(1);
  }
}

// Mean seconds per call of `op` over enough iterations for ~0.2 s, slowest rank.
template <typename Op>
double Time(size_t bytes, Op&& op, MPI_Comm comm) {
  for (int i = 0; i < 3; ++i) op();
  MPI_Barrier(comm);
  double t = Now();
  op();
  double one = Now() - t;
  MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_DOUBLE, MPI_MAX, comm);
  int iters = static_cast<int>(std::clamp(0.2 / std::max(one, 1e-7), 5.0, 20000.0));
  if (bytes >= (16u << 20)) iters = std::min(iters, 20);
  MPI_Barrier(comm);
  t = Now();
  for (int i = 0; i < iters; ++i) op();
  MPI_Barrier(comm);  // every put has landed, every message arrived
  double mean = (Now() - t) / iters;
  MPI_Allreduce(MPI_IN_PLACE, &mean, 1, MPI_DOUBLE, MPI_MAX, comm);
  return mean;
}

}  // namespace

int main() {
  Check(weft::init(), "init");
  const int rank = weft::rank(), size = weft::size();
  if (size != 2) {
    if (rank == 0) std::fprintf(stderr, "window_bench: run on 2 ranks\n");
    (void)weft::shutdown();
    return 2;
  }
  const int peer = 1 - rank;
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  Check(weft::set_topology(*weft::RingGraph(2)), "set_topology");

  constexpr size_t kMax = 16u << 20;
  std::vector<float> src(kMax / 4, 1.0f), dst(kMax / 4);
  // The raw RMA baseline: one window of the largest size, lock/put/unlock per op.
  float* base = nullptr;
  MPI_Win raw;
  MPI_Win_allocate(static_cast<MPI_Aint>(kMax), 1, MPI_INFO_NULL, comm, &base, &raw);

  if (rank == 0) {
    std::printf("# window_bench, 2 ranks, both sending to each other; us per op (max over "
                "ranks), GB/s = bytes / time\n");
    std::printf("%-10s %10s | %10s %10s %10s %10s | %8s %8s %8s %8s | %7s\n", "op", "bytes",
                "mpi us", "ucx us", "rawRMA us", "isend us", "mpi", "ucx", "rawRMA", "isend",
                "ucx/mpi");
  }
  for (const char* op : {"put", "accumulate"}) {
    const bool acc = std::string(op) == "accumulate";
    for (size_t bytes = 8; bytes <= kMax; bytes *= (bytes < 4096 ? 8 : 4)) {
      const int64_t n = static_cast<int64_t>(bytes / 4);
      const int count = static_cast<int>(n);
      std::vector<float> x(src.begin(), src.begin() + n);
      weft::TensorView view(x.data(), weft::DType::kFloat32, {n});
      auto weft_time = [&](const char* transport) {
        const std::string name =
            std::string("bench.") + op + "." + transport + "." + std::to_string(bytes);
        weft::WinCreateOptions options;
        options.zero_init = true;
        options.transport = transport;
        Check(weft::win_create(view, name, options), "win_create");
        const double s = Time(bytes, [&] {
          Check(acc ? weft::win_accumulate(view, name) : weft::win_put(view, name), op);
        }, comm);
        Check(weft::win_free(name), "win_free");
        return s;
      };
      const double weft_s = weft_time("mpi");
      const double ucx_s = weft_time("ucx");

      const double raw_s = Time(bytes, [&] {
        MPI_Win_lock(MPI_LOCK_SHARED, peer, 0, raw);
        if (acc) {
          MPI_Accumulate(src.data(), count, MPI_FLOAT, peer, 0, count, MPI_FLOAT, MPI_SUM, raw);
        } else {
          MPI_Put(src.data(), count, MPI_FLOAT, peer, 0, count, MPI_FLOAT, raw);
        }
        MPI_Win_unlock(peer, raw);
      }, comm);

      const double isend_s = Time(bytes, [&] {
        MPI_Request reqs[2];
        MPI_Irecv(dst.data(), count, MPI_FLOAT, peer, 5, comm, &reqs[0]);
        MPI_Isend(src.data(), count, MPI_FLOAT, peer, 5, comm, &reqs[1]);
        MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE);
      }, comm);

      if (rank == 0) {
        auto gbps = [&](double s) { return static_cast<double>(bytes) / s / 1e9; };
        std::printf("%-10s %10zu | %10.2f %10.2f %10.2f %10.2f | %8.3f %8.3f %8.3f %8.3f | %7.2f\n",
                    op, bytes, weft_s * 1e6, ucx_s * 1e6, raw_s * 1e6, isend_s * 1e6,
                    gbps(weft_s), gbps(ucx_s), gbps(raw_s), gbps(isend_s), weft_s / ucx_s);
        std::printf("RESULT {\"op\": \"%s\", \"bytes\": %zu, \"weft_mpi_us\": %.3f, "
                    "\"weft_ucx_us\": %.3f, \"raw_rma_us\": %.3f, \"isend_us\": %.3f}\n",
                    op, bytes, weft_s * 1e6, ucx_s * 1e6, raw_s * 1e6, isend_s * 1e6);
        std::fflush(stdout);
      }
    }
  }
  MPI_Win_free(&raw);
  MPI_Comm_free(&comm);
  Check(weft::set_topology(*weft::ExponentialGraph(2)), "set_topology");
  Check(weft::shutdown(), "shutdown");
  return 0;
}
