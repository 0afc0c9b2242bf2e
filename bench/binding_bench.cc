// binding_bench (C++ side): the per-call time of weft::allreduce and
// weft::neighbor_allreduce called from C++, the baseline that bench/binding_bench.py and
// the Go benchmark are compared with. bench/run_binding_bench.sh runs them all in one go
// and prints the table.
//
// Protocol (shared by every language): per op and size, 20 warm-up calls, then 5
// repetitions of K calls; a repetition's time is the slowest rank's mean per call; the
// reported figure is the median of the 5. Output: one "BENCH ..." line per figure.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "core/tensor.h"

namespace {

constexpr int kWarmup = 20;
constexpr int kRepetitions = 5;

int CallsFor(size_t bytes) { return bytes >= (16 << 20) ? 20 : bytes >= (1 << 20) ? 200 : 2000; }

void Check(const weft::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "binding_bench: %s: %s\n", what, std::string(s.message()).c_str());
    std::exit(1);
  }
}

template <typename Op>
double MedianMicros(size_t bytes, Op&& op) {
  for (int i = 0; i < kWarmup; ++i) op();
  const int calls = CallsFor(bytes);
  std::vector<double> reps;
  for (int rep = 0; rep < kRepetitions; ++rep) {
    Check(weft::barrier(), "barrier");
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) op();
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count() / calls;
    // The slowest rank's mean decides the repetition.
    double slowest = us;
    weft::TensorView v(&slowest, weft::DType::kFloat64, {1});
    std::vector<double> all(weft::size());
    auto gathered = weft::allgather(v, [&](weft::DType, const std::vector<int64_t>& shape)
                                           -> weft::StatusOr<weft::TensorView> {
      return weft::TensorView(all.data(), weft::DType::kFloat64, shape);
    });
    Check(gathered.status(), "allgather");
    reps.push_back(*std::max_element(all.begin(), all.end()));
  }
  std::sort(reps.begin(), reps.end());
  return reps[reps.size() / 2];
}

}  // namespace

int main() {
  Check(weft::init(), "init");
  const std::vector<size_t> sizes = {4, 4096, 1 << 20, 16 << 20};
  for (const char* op : {"allreduce", "neighbor_allreduce"}) {
    for (size_t bytes : sizes) {
      std::vector<float> in(bytes / sizeof(float), 1.0f), out(in.size());
      weft::TensorView x(in.data(), weft::DType::kFloat32, {static_cast<int64_t>(in.size())});
      weft::TensorView y(out.data(), weft::DType::kFloat32, {static_cast<int64_t>(out.size())});
      const bool allreduce = std::string(op) == "allreduce";
      const double us = MedianMicros(bytes, [&] {
        Check(allreduce ? weft::allreduce(x, y) : weft::neighbor_allreduce(x, y), op);
      });
      if (weft::rank() == 0) {
        std::printf("BENCH lang=c++ input=TensorView op=%s bytes=%zu us=%.2f\n", op, bytes, us);
        std::fflush(stdout);
      }
    }
  }
  Check(weft::shutdown(), "shutdown");
  return 0;
}
