// What the multi-host test (cluster_test.sh) runs on the simulated cluster, one job per mode:
//
//   cluster_check model H1,H2,...  the process model matches the hosts the ranks really run
//                                  on: Hi ranks on the i-th host (in rank order), machines
//                                  found by weft itself (no WEFT_RANKS_PER_MACHINE)
//   cluster_check steps SECONDS    allreduces of 4 MiB under one name per step, for SECONDS
//                                  (the ranks stop together), each result checked; rank 0
//                                  prints "step N" as it goes, so that the test can break a
//                                  link or kill a host in the middle. Exit 0 after SECONDS,
//                                  3 on an op error (the message on stderr), 4 on a wrong
//                                  result.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "tools/cli/args.h"

namespace {

using weft::DType;
using weft::Status;
using weft::TensorView;

constexpr int kName = 64;  // bytes of host name per rank

int Fail(const std::string& what) {
  std::fprintf(stderr, "rank %d: %s\n", weft::rank(), what.c_str());
  return 1;
}

// Every rank's host name and process model, gathered: one row of kName + 5 int64 per rank.
int Model(const std::string& expect) {
  std::vector<int> per_host;
  for (size_t at = 0; at <= expect.size();) {
    size_t comma = expect.find(',', at);
    if (comma == std::string::npos) comma = expect.size();
    const weft::StatusOr<int64_t> ranks = weft::cli::Int("model", expect.substr(at, comma - at), 0);
    if (!ranks.ok()) {
      std::fprintf(stderr, "cluster_check: %s\n", std::string(ranks.status().message()).c_str());
      return 2;
    }
    per_host.push_back(static_cast<int>(*ranks));
    at = comma + 1;
  }
  char host[kName] = {};
  gethostname(host, sizeof(host) - 1);
  const int64_t mine[5] = {weft::rank(), weft::local_rank(), weft::local_size(),
                           weft::machine_rank(), weft::machine_size()};
  std::vector<char> row(kName + sizeof(mine));
  std::memcpy(row.data(), host, kName);
  std::memcpy(row.data() + kName, mine, sizeof(mine));
  std::vector<std::vector<char>> kept;
  auto gathered = weft::allgather(
      TensorView(row.data(), DType::kUInt8, {1, static_cast<int64_t>(row.size())}),
      [&](DType dtype, const std::vector<int64_t>& shape) -> weft::StatusOr<TensorView> {
        kept.emplace_back(static_cast<size_t>(shape[0] * shape[1]));
        return TensorView(kept.back().data(), dtype, shape);
      },
      "model");
  if (!gathered.ok()) return Fail(gathered.status().ToString());
  const char* all = static_cast<const char*>(gathered->data());
  const int n = weft::size();
  // Hosts in order of their first rank, as Open MPI fills -H's slots.
  std::vector<std::string> hosts;
  std::map<std::string, std::vector<int>> ranks_on;
  for (int r = 0; r < n; ++r) {
    const std::string name(all + r * row.size());
    if (!ranks_on.count(name)) hosts.push_back(name);
    ranks_on[name].push_back(r);
  }
  if (hosts.size() != per_host.size()) {
    return Fail("expected " + std::to_string(per_host.size()) + " hosts, ranks run on " +
                std::to_string(hosts.size()));
  }
  for (size_t h = 0; h < hosts.size(); ++h) {
    const std::vector<int>& ranks = ranks_on[hosts[h]];
    if (static_cast<int>(ranks.size()) != per_host[h]) {
      return Fail(hosts[h] + " runs " + std::to_string(ranks.size()) + " ranks, expected " +
                  std::to_string(per_host[h]));
    }
    for (size_t i = 0; i < ranks.size(); ++i) {
      int64_t m[5];
      std::memcpy(m, all + ranks[i] * row.size() + kName, sizeof(m));
      const int64_t want[5] = {ranks[i], static_cast<int64_t>(i),
                               static_cast<int64_t>(ranks.size()), static_cast<int64_t>(h),
                               static_cast<int64_t>(hosts.size())};
      if (std::memcmp(m, want, sizeof(m)) != 0) {
        char msg[256];
        std::snprintf(msg, sizeof(msg),
                      "rank %lld on %s: local_rank %lld local_size %lld machine_rank %lld "
                      "machine_size %lld; expected %lld %lld %lld %lld",
                      (long long)m[0], hosts[h].c_str(), (long long)m[1], (long long)m[2],
                      (long long)m[3], (long long)m[4], (long long)want[1], (long long)want[2],
                      (long long)want[3], (long long)want[4]);
        return Fail(msg);
      }
    }
  }
  if (weft::rank() == 0) {
    std::printf("model ok: %d ranks on %zu hosts (%s)\n", n, hosts.size(), expect.c_str());
  }
  return 0;
}

int Steps(double seconds) {
  const int64_t count = 1 << 20;  // 4 MiB of float32
  std::vector<float> x(count);
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0;; ++step) {
    for (int64_t i = 0; i < count; i += 4096) x[i] = static_cast<float>(weft::rank() + step);
    // Whether to stop is decided together (a rank that stopped on its own clock would
    // leave the others in an op it never calls): any rank past SECONDS votes to stop.
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    x[1] = elapsed > seconds ? 1.0f : 0.0f;
    TensorView v(x.data(), DType::kFloat32, {count});
    Status st = weft::allreduce(v, v, /*average=*/false, "step");
    if (!st.ok()) {
      std::fprintf(stderr, "rank %d: step %d failed: %s\n", weft::rank(), step,
                   st.ToString().c_str());
      return 3;
    }
    const int n = weft::size();
    const float want = static_cast<float>(n * step + n * (n - 1) / 2);
    if (x[0] != want) {
      std::fprintf(stderr, "rank %d: step %d: %g, expected %g\n", weft::rank(), step, x[0],
                   want);
      return 4;
    }
    if (x[1] > 0) {
      if (weft::rank() == 0) std::printf("done after %d steps\n", step + 1);
      return 0;
    }
    if (weft::rank() == 0) {
      std::printf("step %d\n", step);
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: cluster_check model H1,H2,... | steps SECONDS\n");
    return 2;
  }
  Status st = weft::init();
  if (!st.ok()) {
    std::fprintf(stderr, "init: %s\n", st.ToString().c_str());
    return 1;
  }
  const std::string mode = argv[1];
  int rc = 2;
  if (mode == "model") rc = Model(argv[2]);
  if (mode == "steps") {
    const weft::StatusOr<double> seconds = weft::cli::Real("steps", argv[2], 0);
    if (!seconds.ok()) {
      std::fprintf(stderr, "cluster_check: %s\n", std::string(seconds.status().message()).c_str());
      return 2;
    }
    rc = Steps(*seconds);
  }
  if (rc != 0) std::_Exit(rc);  // a failed rank does not wait for the others' shutdown
  st = weft::finalize();
  return st.ok() ? 0 : 1;
}
