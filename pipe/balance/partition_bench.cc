// Times PartitionLayers on 10,000 layers into 64 stages (the size the spec asks to handle
// "well under a second"), for each strategy and a few kinds of costs, with a fixed seed.
// Prints a table and one machine-readable BENCH line per row. Build with -c opt:
//   bazel run -c opt //pipe/balance:partition_bench [-- --layers N --stages N --repeats N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "pipe/balance/balance.h"
#include "tools/cli/flags.h"

namespace {

using weft::pipe::Partition;
using weft::pipe::PartitionLayers;
using weft::pipe::Strategy;
using weft::pipe::StrategyName;

struct Costs {
  const char* name;
  std::vector<double> values;
};

std::vector<Costs> MakeCosts(int layers) {
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<int64_t> params(100000, 10000000);
  std::uniform_real_distribution<double> seconds(1e-4, 1e-2);
  std::vector<Costs> all = {
      {"params", {}}, {"params+frozen", {}}, {"times", {}}, {"wide-range", {}}, {"full-range", {}}};
  for (int i = 0; i < layers; ++i) {
    const double p = static_cast<double>(params(rng));
    all[0].values.push_back(p);
    all[1].values.push_back(i < layers / 2 ? p / 6 : p);  // lambda = 1/6: inexact doubles
    all[2].values.push_back(seconds(rng));
    // Over 40 decades (2^-66 .. 2^66): exact sums need 3 words.
    all[3].values.push_back(std::ldexp(seconds(rng), static_cast<int>(rng() % 133) - 66));
    // Over most of the double range (2^-1000 .. 2^1000): the worst case, 32 words.
    all[4].values.push_back(std::ldexp(seconds(rng), static_cast<int>(rng() % 2001) - 1000));
  }
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  int layers = 10000, stages = 64, repeats = 20;
  weft::cli::FlagSet flags("partition_bench",
                           "Times PartitionLayers for each strategy and a few kinds of costs "
                           "(pipe/balance/partition_bench.cc).");
  flags.Int("--layers", &layers, "layers to partition", 1)
      .Int("--stages", &stages, "stages", 1)
      .Int("--repeats", &repeats, "runs per row (best and median shown)", 1);
  flags.ParseOrExit(argc, argv);
  std::printf("# PartitionLayers: %d layers into %d stages, best and median of %d runs\n", layers,
              stages, repeats);
  std::printf("# %-14s %-8s %12s %12s %14s %6s\n", "costs", "strategy", "best ms", "median ms",
              "max stage", "empty");
  std::vector<std::string> machine;
  for (const Costs& costs : MakeCosts(layers)) {
    for (Strategy strategy : {Strategy::kOptimal, Strategy::kGreedy, Strategy::kEven}) {
      std::vector<double> ms;
      Partition last;
      for (int r = 0; r < repeats; ++r) {
        const auto start = std::chrono::steady_clock::now();
        auto p = PartitionLayers(costs.values, stages, strategy);
        const auto stop = std::chrono::steady_clock::now();
        if (!p.ok()) {
          std::fprintf(stderr, "partition_bench: %s\n", std::string(p.status().message()).c_str());
          return 1;
        }
        last = *std::move(p);
        ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
      }
      std::sort(ms.begin(), ms.end());
      const double best = ms.front(), median = ms[ms.size() / 2];
      std::printf("  %-14s %-8s %12.3f %12.3f %14.6g %6s\n", costs.name, StrategyName(strategy),
                  best, median, last.max_cost, last.has_empty_stage() ? "yes" : "no");
      char line[256];
      std::snprintf(line, sizeof(line),
                    "BENCH partition costs=%s strategy=%s layers=%d stages=%d best_ms=%.3f "
                    "median_ms=%.3f max_cost=%.9g",
                    costs.name, StrategyName(strategy), layers, stages, best, median,
                    last.max_cost);
      machine.push_back(line);
    }
  }
  std::printf("#\n# machine-readable results\n");
  for (const std::string& line : machine) std::printf("%s\n", line.c_str());
  return 0;
}
