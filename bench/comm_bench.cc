// comm_bench: weft's ops against the same ops written directly with MPI, in the style of
// nccl-tests. Run under mpirun (see bench/run.sh and bench/README.md).
//
// For each op and size: warm up, agree on an iteration count, barrier, time the loop,
// report the max over ranks of the per-rank average. Then poison the output, run the op
// once more and check a result element, so no number is ever reported for a wrong result.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/reduce.h"
#include "comm/topology.h"
#include "core/aligned.h"
#include "core/tensor.h"
#include "tools/cli/flags.h"

namespace {

constexpr float kPoison = -12345.0f;
constexpr int kRawTag = 77;

// --- options -----------------------------------------------------------------------------

struct Options {
  int64_t min_bytes = 4;
  int64_t max_bytes = 64ll << 20;
  int iters = 0;  // 0: adaptive
  int warmup = 5;
  bool warmup_given = false;
  double target_seconds = 0.2;
  int min_iters = 5;
  int max_iters = 1000;
  std::vector<std::string> ops;
  std::string weft_version = "unknown";
  bool fresh_inputs = false;
};

const char* const kAllOps[] = {
    "allreduce", "allreduce_inplace", "allreduce_float16",  "allreduce_bfloat16",
    "broadcast", "allgather",         "neighbor_allreduce", "neighbor_allreduce_onepeer",
    "fused"};
// Run only when named: it needs several machines of several ranks each.
const char* const kNamedOnlyOps[] = {"hierarchical_neighbor_allreduce"};

int g_rank = 0;
int g_size = 1;
Options g_opt;

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "comm_bench: rank %d: FATAL: %s\n", g_rank, msg.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

void Check(const weft::Status& s, const std::string& what) {
  if (!s.ok()) Die(what + ": weft returned " + s.ToString());
}

void CheckMpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  Die(std::string(what) + " failed: " + std::string(text, len));
}

// Errors and --help are printed by rank 0 only; every rank parses the same arguments.
Options ParseArgs(int argc, char** argv) {
  Options o;
  std::string ops;
  weft::cli::FlagSet flags(
      "comm_bench",
      "Times weft's ops against the same operations written with MPI, in one run "
      "(bench/README.md).\nops: allreduce, allreduce_inplace, allreduce_float16 and "
      "allreduce_bfloat16 (out of place; raw MPI, which has no such types: float32 of the same "
      "bytes), broadcast, allgather, "
      "neighbor_allreduce (static exponential graph), neighbor_allreduce_onepeer (dynamic "
      "one-peer schedule), fused (64 x 4 KiB allreduce); default: all of these; and, when named, "
      "hierarchical_neighbor_allreduce (several machines of several ranks)");
  flags.Int("--min-bytes", &o.min_bytes, "smallest size (at least 4); sizes double", 0)
      .Alias("-b")
      .Int("--max-bytes", &o.max_bytes, "largest size", 0)
      .Alias("-e")
      .Int("--iters", &o.iters, "timed iterations per size (0: adaptive, 5..1000)", 0)
      .Alias("-n")
      .Int("--warmup", &o.warmup, "untimed iterations first", 0)
      .Alias("-w")
      .Real("--target-seconds", &o.target_seconds, "adaptive: seconds per size and side", 0)
      .String("--ops", &ops, "comma-separated ops (see above; default: all)")
      .Set("--fresh-inputs", &o.fresh_inputs, true,
           "every rank rewrites its input before each call, on both sides, as a training "
           "step writes its tensors, and the time of the rewrite alone (timed in the same "
           "rounds) is taken off both; for allreduce (out of place), broadcast, allgather "
           "and the neighbor allreduces (the others ignore it)")
      .String("--weft-version", &o.weft_version, "printed in the header");
  const weft::Status parsed = flags.Parse(std::vector<std::string>(argv + 1, argv + argc));
  if (!parsed.ok()) {
    if (g_rank == 0)
      std::fprintf(stderr, "comm_bench: %s\n", std::string(parsed.message()).c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (flags.help_requested()) {
    if (g_rank == 0) std::fputs(flags.Help().c_str(), stdout);
    (void)weft::shutdown();
    std::exit(0);
  }
  o.warmup_given = flags.given("--warmup");
  std::stringstream ss(ops);
  std::string op;
  while (std::getline(ss, op, ',')) {
    if (op.empty()) continue;
    bool known = false;
    for (const char* k : kAllOps) known |= op == k;
    for (const char* k : kNamedOnlyOps) known |= op == k;
    if (!known) {
      if (g_rank == 0) std::fprintf(stderr, "comm_bench: unknown op '%s'\n", op.c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    o.ops.push_back(op);
  }
  if (o.ops.empty()) o.ops.assign(std::begin(kAllOps), std::end(kAllOps));
  if (o.min_bytes < 4) o.min_bytes = 4;
  if (o.max_bytes < o.min_bytes) o.max_bytes = o.min_bytes;
  return o;
}

bool Wants(const std::string& op) {
  return std::find(g_opt.ops.begin(), g_opt.ops.end(), op) != g_opt.ops.end();
}

// --- timing ------------------------------------------------------------------------------

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double MaxOverRanks(double v) {
  double out = 0;
  CheckMpi(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce(MAX)");
  return out;
}

int MaxOverRanks(int v) {
  int out = 0;
  CheckMpi(MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce(MAX)");
  return out;
}

void Barrier() { CheckMpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

struct Timing {
  double seconds = 0;  // the median over the rounds of the per-call average (max over ranks)
  double fastest = 0, slowest = 0;  // the rounds' extremes
  int iters = 0;                    // timed calls, over all rounds
  int warmup = 0;
};

// Timed calls of each implementation are split into this many rounds (MeasureInterleaved).
constexpr int kRounds = 5;

// Warms `fn` up and picks its number of timed calls (t.iters). Every decision here is taken
// from values all ranks agree on (MAX allreduces), so every rank calls `fn` the same number
// of times (weft matches unnamed ops by call order).
Timing Prepare(const std::function<void()>& fn) {
  Timing t;
  double estimate = 0;
  const int warmup = g_opt.warmup;
  if (warmup > 0 || g_opt.iters == 0) {  // at least one probe for the adaptive count
    Barrier();
    double start = Now();
    fn();
    const double first = MaxOverRanks(Now() - start);
    int rest = std::max(0, warmup - 1);
    // Large sizes: keep the default warmup to about 0.1 s (at least one iteration).
    if (!g_opt.warmup_given && first > 0.02) rest = std::min(rest, static_cast<int>(0.1 / first));
    estimate = first;
    if (rest > 0) {
      Barrier();
      start = Now();
      for (int i = 0; i < rest; ++i) fn();
      estimate = MaxOverRanks((Now() - start) / rest);
    }
    t.warmup = 1 + rest;
  }
  if (g_opt.iters > 0) {
    t.iters = g_opt.iters;
  } else {
    const double want = estimate > 0 ? std::ceil(g_opt.target_seconds / estimate) : g_opt.max_iters;
    t.iters = static_cast<int>(std::min<double>(g_opt.max_iters, std::max<double>(g_opt.min_iters, want)));
  }
  return t;
}

// Times the implementations of one case (weft's, raw MPI's...) in rounds that alternate
// between them, each round a barrier and then 1/kRounds of an implementation's calls, the
// order reversed every other round; each implementation's time is the median of its
// rounds' per-call averages (max over ranks). This machine's speed drifts by 2x and more,
// between runs and within one: timed one after the other in one block each, one side
// could land in a slow stretch and the other not, and the ratio say so.
std::vector<Timing> MeasureInterleaved(const std::vector<std::function<void()>>& fns) {
  std::vector<Timing> t;
  for (const auto& fn : fns) t.push_back(Prepare(fn));
  int rounds = kRounds;
  for (const Timing& x : t) rounds = std::min(rounds, x.iters);
  std::vector<int> per_round(fns.size());
  std::vector<std::vector<double>> averages(fns.size());
  for (size_t k = 0; k < fns.size(); ++k) {
    per_round[k] = t[k].iters / rounds;
    t[k].iters = per_round[k] * rounds;
  }
  for (int round = 0; round < rounds; ++round) {
    for (size_t j = 0; j < fns.size(); ++j) {
      const size_t k = round % 2 == 0 ? j : fns.size() - 1 - j;
      Barrier();
      const double start = Now();
      for (int i = 0; i < per_round[k]; ++i) fns[k]();
      averages[k].push_back(MaxOverRanks((Now() - start) / per_round[k]));
    }
  }
  for (size_t k = 0; k < fns.size(); ++k) {
    std::vector<double>& a = averages[k];
    std::sort(a.begin(), a.end());
    t[k].seconds =
        a.size() % 2 == 1 ? a[a.size() / 2] : (a[a.size() / 2 - 1] + a[a.size() / 2]) / 2;
    t[k].fastest = a.front();
    t[k].slowest = a.back();
  }
  return t;
}

// --- buffers -----------------------------------------------------------------------------

// Every buffer starts on a 64-byte boundary, as PyTorch's CPU allocator places tensors. A
// std::vector's start depends on the heap (16 or 32 bytes past a boundary, or on one), and
// on such buffers Open MPI's out-of-place allreduce took 1.5-1.7 times as long from 2 MiB:
// raw MPI looked slower than PyTorch users see it (bench/README.md, "Buffer alignment").
using FloatBuffer = weft::AlignedVector<float>;

struct Buffers {
  FloatBuffer in, out;
  std::vector<FloatBuffer> recv;  // raw neighbor_allreduce receive buffers
};

weft::TensorView View(float* p, size_t count) {
  return weft::TensorView(p, weft::DType::kFloat32, {static_cast<int64_t>(count)});
}

bool Near(float got, double want) {
  return std::fabs(static_cast<double>(got) - want) <= 1e-5 * std::max(1.0, std::fabs(want));
}

// Checks out[idx] against `want` on every rank; any mismatch aborts the whole run.
void Verify(const std::string& what, const float* out, const std::vector<size_t>& idx,
            const std::function<double(size_t)>& want) {
  for (size_t i : idx) {
    const double w = want(i);
    if (!Near(out[i], w)) {
      std::ostringstream m;
      m << "wrong result: " << what << ": element " << i << " is " << out[i] << ", expected "
        << w;
      Die(m.str());
    }
  }
}

// --- one row -----------------------------------------------------------------------------

struct Row {
  std::string op;
  size_t bytes = 0;
  size_t elements = 0;
  double weft_us = 0, mpi_us = 0;
  // The fastest and slowest of the rounds (MeasureInterleaved), in us: the spread in a run.
  double weft_fastest_us = 0, weft_slowest_us = 0, mpi_fastest_us = 0, mpi_slowest_us = 0;
  double weft_algbw = 0, mpi_algbw = 0, weft_busbw = 0, mpi_busbw = 0;
  int weft_iters = 0, mpi_iters = 0;
  int in_degree = -1;
  double weft_blocking_us = -1;  // fused case only: weft with 64 blocking calls
  double weft_grouped_us = -1;   // fused case only: the 64 nonblocking calls in a group
  double mpi_one_buffer_us = -1;  // fused case only: one MPI_Allreduce of all 64
};

std::vector<Row> g_rows;

void PrintTableHeader(const char* title) {
  if (g_rank != 0) return;
  std::printf("#\n# %s\n", title);
  std::printf("# %-26s %10s %10s |%s|%s|\n", "", "", "", "------------ weft ------------",
              "---------- raw MPI -----------");
  std::printf("# %-26s %10s %10s | %10s %8s %8s | %10s %8s %8s | %6s\n", "op", "bytes",
              "elements", "time(us)", "algbw", "busbw", "time(us)", "algbw", "busbw", "ratio");
  std::printf("# %-26s %10s %10s | %10s %8s %8s | %10s %8s %8s | %6s\n", "", "", "", "",
              "(GB/s)", "(GB/s)", "", "(GB/s)", "(GB/s)", "mpi/wft");
  std::fflush(stdout);
}

void PrintRow(const Row& r) {
  if (g_rank != 0) return;
  std::printf("  %-26s %10zu %10zu | %10.2f %8.3f %8.3f | %10.2f %8.3f %8.3f | %6.2f\n",
              r.op.c_str(), r.bytes, r.elements, r.weft_us, r.weft_algbw, r.weft_busbw,
              r.mpi_us, r.mpi_algbw, r.mpi_busbw, r.mpi_us / r.weft_us);
  std::fflush(stdout);
}

// A benchmark case: the two implementations of one op at one size, and its check.
struct Case {
  std::string op;
  size_t bytes;      // the size the bandwidths are computed on
  size_t elements;   // elements per rank input
  double bus_factor; // busbw = algbw * bus_factor
  int in_degree = -1;
  std::function<void()> weft, raw;
  // Rewrites this rank's input (the values it already holds): --fresh-inputs.
  std::function<void()> touch;
  std::function<void()> poison;                  // sets the output to kPoison
  std::function<void(const std::string&)> check; // checks the output of the last call
  // Checks the raw side's output where it is not weft's (empty: `check` does).
  std::function<void(const std::string&)> check_raw;
};

void SetSpread(Row& row, const Timing& weft, const Timing& mpi) {
  row.weft_fastest_us = weft.fastest * 1e6;
  row.weft_slowest_us = weft.slowest * 1e6;
  row.mpi_fastest_us = mpi.fastest * 1e6;
  row.mpi_slowest_us = mpi.slowest * 1e6;
}

void RunCase(const Case& c) {
  Row row;
  row.op = c.op;
  row.bytes = c.bytes;
  row.elements = c.elements;
  row.in_degree = c.in_degree;
  std::vector<Timing> t;
  if (g_opt.fresh_inputs && c.touch) {
    // Each call after its rewrite, and the rewrite alone, which comes off both: what is
    // left includes what a call costs the rewrite after it (taking back the lines the
    // other ranks read), as it costs a training step.
    const auto touch = c.touch, weft = c.weft, raw = c.raw;
    t = MeasureInterleaved({[=] {
                              touch();
                              weft();
                            },
                            [=] {
                              touch();
                              raw();
                            },
                            touch});
    for (int k = 0; k < 2; ++k) {
      t[k].seconds = std::max(t[k].seconds - t[2].seconds, 1e-9);
      t[k].fastest = std::max(t[k].fastest - t[2].seconds, 1e-9);
      t[k].slowest = std::max(t[k].slowest - t[2].seconds, 1e-9);
    }
  } else {
    t = MeasureInterleaved({c.weft, c.raw});
  }
  const Timing& w = t[0];
  const Timing& m = t[1];
  c.poison();
  c.weft();
  c.check("weft " + c.op + " " + std::to_string(c.bytes) + " B");
  c.poison();
  c.raw();
  (c.check_raw ? c.check_raw : c.check)("raw MPI " + c.op + " " + std::to_string(c.bytes) + " B");
  row.weft_us = w.seconds * 1e6;
  row.mpi_us = m.seconds * 1e6;
  SetSpread(row, w, m);
  row.weft_iters = w.iters;
  row.mpi_iters = m.iters;
  row.weft_algbw = static_cast<double>(c.bytes) / w.seconds / 1e9;
  row.mpi_algbw = static_cast<double>(c.bytes) / m.seconds / 1e9;
  row.weft_busbw = row.weft_algbw * c.bus_factor;
  row.mpi_busbw = row.mpi_algbw * c.bus_factor;
  PrintRow(row);
  g_rows.push_back(row);
}

std::vector<size_t> Sizes() {
  std::vector<size_t> sizes;
  for (int64_t b = g_opt.min_bytes; b <= g_opt.max_bytes; b *= 2) sizes.push_back(static_cast<size_t>(b));
  return sizes;
}

std::vector<size_t> CheckIndices(size_t count) {
  std::vector<size_t> idx = {0, count / 2, count - 1};
  idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
  return idx;
}

// --- the ops -----------------------------------------------------------------------------

// Out of place, or in place (whose timed loops sum the buffer into itself over and over:
// it overflows to infinity, which costs the same; the check starts again from every rank's
// own value).
void BenchAllreduce(Buffers& b, bool in_place) {
  PrintTableHeader(in_place ? "allreduce_inplace: sum, float32, in place; busbw = algbw * 2(n-1)/n"
                            : "allreduce: sum, float32, out of place; busbw = algbw * 2(n-1)/n");
  const double n = g_size;
  for (size_t bytes : Sizes()) {
    const size_t count = bytes / sizeof(float);
    float* in = in_place ? b.out.data() : b.in.data();
    float* out = b.out.data();
    Case c;
    c.op = in_place ? "allreduce_inplace" : "allreduce";
    c.bytes = count * sizeof(float);
    c.elements = count;
    c.bus_factor = 2.0 * (n - 1) / n;
    c.weft = [=] { Check(weft::allreduce(View(in, count), View(out, count), false), "weft::allreduce"); };
    c.raw = [=] {
      CheckMpi(MPI_Allreduce(in_place ? MPI_IN_PLACE : in, out, static_cast<int>(count), MPI_FLOAT,
                             MPI_SUM, MPI_COMM_WORLD),
               "MPI_Allreduce");
    };
    if (!in_place) c.touch = [=] { std::fill(in, in + count, static_cast<float>(g_rank + 1)); };
    c.poison = [=] { std::fill(out, out + count, in_place ? g_rank + 1 : kPoison); };
    c.check = [=](const std::string& what) {
      Verify(what, out, CheckIndices(count), [&](size_t) { return n * (n + 1) / 2; });
    };
    RunCase(c);
  }
}

// A 16-bit float dtype, which MPI has no type for: weft sums it in float with an MPI op of
// its own, and the raw side is what MPI offers nearest to it, MPI_Allreduce of float32 over
// the same bytes (half as many elements): the same traffic, summed by MPI_SUM.
void BenchAllreduce16(Buffers& b, weft::DType dtype) {
  const bool half = dtype == weft::DType::kFloat16;
  PrintTableHeader(half ? "allreduce_float16: sum, float16, out of place; raw MPI: float32 of "
                          "the same bytes; elements: float16; busbw = algbw * 2(n-1)/n"
                        : "allreduce_bfloat16: sum, bfloat16, out of place; raw MPI: float32 "
                          "of the same bytes; elements: bfloat16; busbw = algbw * 2(n-1)/n");
  auto to16 = [half](float v) { return half ? weft::FloatToHalf(v) : weft::FloatToBFloat16(v); };
  auto from16 = [half](uint16_t v) {
    return half ? weft::HalfToFloat(v) : weft::BFloat16ToFloat(v);
  };
  const size_t max_count = b.in.size() * 2;
  weft::AlignedVector<uint16_t> in16(max_count, to16(static_cast<float>(g_rank + 1)));
  weft::AlignedVector<uint16_t> out16(max_count, 0);
  const double n = g_size;
  for (size_t bytes : Sizes()) {
    const size_t count = bytes / 2;
    const size_t count32 = bytes / 4;
    uint16_t* in = in16.data();
    uint16_t* out = out16.data();
    float* raw_in = b.in.data();
    float* raw_out = b.out.data();
    Case c;
    c.op = half ? "allreduce_float16" : "allreduce_bfloat16";
    c.bytes = count * 2;
    c.elements = count;
    c.bus_factor = 2.0 * (n - 1) / n;
    c.weft = [=] {
      const std::vector<int64_t> shape = {static_cast<int64_t>(count)};
      Check(weft::allreduce(weft::TensorView(in, dtype, shape), weft::TensorView(out, dtype, shape),
                            false),
            "weft::allreduce");
    };
    c.raw = [=] {
      CheckMpi(MPI_Allreduce(raw_in, raw_out, static_cast<int>(count32), MPI_FLOAT, MPI_SUM,
                             MPI_COMM_WORLD),
               "MPI_Allreduce");
    };
    c.poison = [=] {
      std::fill(out, out + count, to16(kPoison));
      std::fill(raw_out, raw_out + count32, kPoison);
    };
    // Sums of whole numbers up to 36 (8 ranks) are exact in both formats.
    const double want = n * (n + 1) / 2;
    c.check = [=](const std::string& what) {
      for (size_t i : CheckIndices(count)) {
        if (from16(out[i]) != want) {
          Die("wrong result: " + what + ": element " + std::to_string(i) + " is " +
              std::to_string(from16(out[i])) + ", expected " + std::to_string(want));
        }
      }
    };
    c.check_raw = [=](const std::string& what) {
      if (count32 > 0) Verify(what, raw_out, CheckIndices(count32), [&](size_t) { return want; });
    };
    RunCase(c);
  }
}

void BenchBroadcast(Buffers& b) {
  PrintTableHeader("broadcast: root 0, float32, out of place; busbw = algbw");
  for (size_t bytes : Sizes()) {
    const size_t count = bytes / sizeof(float);
    float* in = b.in.data();
    float* out = b.out.data();
    Case c;
    c.op = "broadcast";
    c.bytes = count * sizeof(float);
    c.elements = count;
    c.bus_factor = 1.0;
    // Both are timed as synchronized calls, one barrier after each: in a loop of plain
    // MPI_Bcast the root returns as soon as its data is on its way and the next broadcast
    // overlaps this one, while weft's next call negotiates first.
    c.weft = [=] {
      Check(weft::broadcast(View(in, count), View(out, count), 0), "weft::broadcast");
      CheckMpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    };
    // MPI_Bcast is in place: the root sends from its input (as weft's root does after
    // copying it to the output, which is what the raw root does here too).
    c.raw = [=] {
      if (g_rank == 0) std::memcpy(out, in, count * sizeof(float));
      CheckMpi(MPI_Bcast(out, static_cast<int>(count), MPI_FLOAT, 0, MPI_COMM_WORLD), "MPI_Bcast");
      CheckMpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    };
    c.touch = [=] { std::fill(in, in + count, static_cast<float>(g_rank + 1)); };
    c.poison = [=] { std::fill(out, out + count, kPoison); };
    c.check = [=](const std::string& what) {
      Verify(what, out, CheckIndices(count), [](size_t) { return 1.0; });
    };
    RunCase(c);
  }
}

void BenchAllgather(Buffers& b) {
  PrintTableHeader(
      "allgather: equal sizes, float32; bytes = total output (as nccl-tests), elements = per "
      "rank; busbw = algbw * (n-1)/n");
  const int n = g_size;
  size_t last_total = 0;
  for (size_t bytes : Sizes()) {
    const size_t count = std::max<size_t>(1, bytes / (sizeof(float) * n));
    const size_t total = count * n;
    if (total * sizeof(float) == last_total) continue;  // the same row again
    if (total > b.out.size()) continue;
    last_total = total * sizeof(float);
    float* in = b.in.data();
    float* out = b.out.data();
    Case c;
    c.op = "allgather";
    c.bytes = total * sizeof(float);
    c.elements = count;
    c.bus_factor = static_cast<double>(n - 1) / n;
    c.weft = [=] {
      weft::Allocator alloc = [=](weft::DType dtype, const std::vector<int64_t>& shape)
          -> weft::StatusOr<weft::TensorView> {
        if (dtype != weft::DType::kFloat32 || shape.size() != 1 ||
            shape[0] != static_cast<int64_t>(total)) {
          return weft::Internal("comm_bench: unexpected allgather output ",
                                weft::ShapeToString(shape));
        }
        return View(out, total);
      };
      auto r = weft::allgather(View(in, count), alloc);
      Check(r.status(), "weft::allgather");
      if (r->data() != out) Die("weft::allgather returned a view that is not the allocator's");
    };
    c.raw = [=] {
      CheckMpi(MPI_Allgather(in, static_cast<int>(count), MPI_FLOAT, out, static_cast<int>(count),
                             MPI_FLOAT, MPI_COMM_WORLD),
               "MPI_Allgather");
    };
    c.touch = [=] { std::fill(in, in + count, static_cast<float>(g_rank + 1)); };
    c.poison = [=] { std::fill(out, out + total, kPoison); };
    c.check = [=](const std::string& what) {
      Verify(what, out, {0, count - 1, total - count, total - 1},
             [=](size_t i) { return static_cast<double>(i / count + 1); });
    };
    RunCase(c);
  }
}

// The raw neighbor exchange: receive from `recv`, send to `send`, then the weighted sum with
// the kernel weft's combine step uses (comm/reduce.h), so that the two columns differ by
// what weft adds around the exchange, not by the arithmetic. `out` may be `in` (the sum
// overwrites it only once every send is done).
void RawNeighborAllreduce(const float* in, float* out, size_t count, const std::vector<int>& send,
                          const std::vector<int>& recv, double self_weight,
                          const std::vector<double>& recv_weights, std::vector<FloatBuffer>& bufs,
                          MPI_Comm comm = MPI_COMM_WORLD) {
  std::vector<MPI_Request> reqs(send.size() + recv.size());
  size_t k = 0;
  for (size_t j = 0; j < recv.size(); ++j) {
    CheckMpi(MPI_Irecv(bufs[j].data(), static_cast<int>(count), MPI_FLOAT, recv[j], kRawTag, comm,
                       &reqs[k++]),
             "MPI_Irecv");
  }
  for (int dst : send) {
    CheckMpi(MPI_Isend(in, static_cast<int>(count), MPI_FLOAT, dst, kRawTag, comm, &reqs[k++]),
             "MPI_Isend");
  }
  CheckMpi(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE),
           "MPI_Waitall");
  std::vector<weft::comm::WeightedTerm> terms = {{in, self_weight}};
  for (size_t j = 0; j < recv.size(); ++j) terms.push_back({bufs[j].data(), recv_weights[j]});
  weft::comm::WeightedSum(out, weft::DType::kFloat32, count, terms);
}

void BenchNeighborStatic(Buffers& b) {
  const std::vector<int> in_nbrs = weft::in_neighbor_ranks();
  const std::vector<int> out_nbrs = weft::out_neighbor_ranks();
  const int max_in = MaxOverRanks(static_cast<int>(in_nbrs.size()));
  {
    std::ostringstream t;
    t << "neighbor_allreduce: static ExponentialGraph(" << g_size
      << ") (the default topology), uniform weights 1/(in-degree+1); busbw = algbw * "
         "in-degree (max over ranks: "
      << max_in << ")";
    PrintTableHeader(t.str().c_str());
  }
  if (weft::is_topo_weighted()) Die("the default topology is unexpectedly weighted");
  const double w = 1.0 / static_cast<double>(in_nbrs.size() + 1);
  const std::vector<double> weights(in_nbrs.size(), w);
  double want = (g_rank + 1) * w;
  for (int j : in_nbrs) want += (j + 1) * w;
  for (size_t bytes : Sizes()) {
    const size_t count = bytes / sizeof(float);
    float* in = b.in.data();
    float* out = b.out.data();
    Case c;
    c.op = "neighbor_allreduce";
    c.bytes = count * sizeof(float);
    c.elements = count;
    c.bus_factor = max_in;
    c.in_degree = max_in;
    c.weft = [=] {
      Check(weft::neighbor_allreduce(View(in, count), View(out, count)), "weft::neighbor_allreduce");
    };
    c.raw = [=, &b] {
      RawNeighborAllreduce(in, out, count, out_nbrs, in_nbrs, w, weights, b.recv);
    };
    c.touch = [=] { std::fill(in, in + count, static_cast<float>(g_rank + 1)); };
    c.poison = [=] { std::fill(out, out + count, kPoison); };
    c.check = [=](const std::string& what) {
      Verify(what, out, CheckIndices(count), [=](size_t) { return want; });
    };
    RunCase(c);
  }
}

std::unique_ptr<weft::DynamicSchedule> MakeOnePeer() {
  auto graph = weft::ExponentialTwoGraph(g_size);
  Check(graph.status(), "ExponentialTwoGraph");
  auto sched = weft::OnePeerSchedule(*graph, g_rank);
  Check(sched.status(), "OnePeerSchedule");
  return std::move(*sched);
}

void BenchNeighborOnePeer(Buffers& b) {
  // The in-degree of a step: the max over ranks and over the schedule's period (the
  // out-degree of ExponentialTwoGraph is at most log2(n)+1 steps; 64 steps cover it).
  int max_in = 0;
  {
    auto probe = MakeOnePeer();
    for (int k = 0; k < 64; ++k) max_in = std::max(max_in, static_cast<int>(probe->Next().recv_ranks.size()));
    max_in = MaxOverRanks(max_in);
  }
  {
    std::ostringstream t;
    t << "neighbor_allreduce_onepeer: dynamic OnePeerSchedule(ExponentialTwoGraph(" << g_size
      << ")), self 0.5, src 0.5/|recv|, dst 1.0; busbw = algbw * in-degree per step (max: "
      << max_in << ")";
    PrintTableHeader(t.str().c_str());
  }
  // Each implementation walks its own copy of the schedule; every rank calls Next() once
  // per op, so the ranks stay in step. The last step's expected value is kept for the check.
  struct Last {
    double want = 0;
  };
  auto weft_sched = std::shared_ptr<weft::DynamicSchedule>(MakeOnePeer());
  auto raw_sched = std::shared_ptr<weft::DynamicSchedule>(MakeOnePeer());
  auto last = std::make_shared<Last>();
  auto expected = [](const weft::SendRecvRanks& step) {
    double want = 0.5 * (g_rank + 1);
    for (int j : step.recv_ranks) want += 0.5 / step.recv_ranks.size() * (j + 1);
    return want;
  };
  for (size_t bytes : Sizes()) {
    const size_t count = bytes / sizeof(float);
    float* in = b.in.data();
    float* out = b.out.data();
    Case c;
    c.op = "neighbor_allreduce_onepeer";
    c.bytes = count * sizeof(float);
    c.elements = count;
    c.bus_factor = max_in;
    c.in_degree = max_in;
    c.weft = [=] {
      const weft::SendRecvRanks step = weft_sched->Next();
      weft::NeighborAllreduceOptions o;
      o.self_weight = 0.5;
      std::map<int, double> src, dst;
      for (int j : step.recv_ranks) src[j] = 0.5 / step.recv_ranks.size();
      for (int j : step.send_ranks) dst[j] = 1.0;
      o.src_weights = std::move(src);
      o.dst_weights = std::move(dst);
      Check(weft::neighbor_allreduce(View(in, count), View(out, count), o),
            "weft::neighbor_allreduce (dynamic)");
      last->want = expected(step);
    };
    c.raw = [=, &b] {
      const weft::SendRecvRanks step = raw_sched->Next();
      const std::vector<double> weights(step.recv_ranks.size(), 0.5 / std::max<size_t>(1, step.recv_ranks.size()));
      RawNeighborAllreduce(in, out, count, step.send_ranks, step.recv_ranks, 0.5, weights, b.recv);
      last->want = expected(step);
    };
    c.touch = [=] { std::fill(in, in + count, static_cast<float>(g_rank + 1)); };
    c.poison = [=] { std::fill(out, out + count, kPoison); };
    c.check = [=](const std::string& what) {
      const double want = last->want;
      Verify(what, out, CheckIndices(count), [=](size_t) { return want; });
    };
    RunCase(c);
  }
}

// The raw hierarchical op: sum inside the machine, the machines' sums averaged over the
// machine topology (uniform weights) by one rank per machine, broadcast inside the
// machine, divided by the ranks per machine: what weft's op computes.
void BenchHierarchical(Buffers& b) {
  MPI_Comm local = MPI_COMM_NULL, cross = MPI_COMM_NULL;
  CheckMpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &local),
           "MPI_Comm_split_type");
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(local, &local_rank);
  MPI_Comm_size(local, &local_size);
  CheckMpi(MPI_Comm_split(MPI_COMM_WORLD, local_rank, g_rank, &cross), "MPI_Comm_split");
  if (local_size != weft::local_size() || weft::machine_size() < 2 || local_size < 2) {
    Die("hierarchical_neighbor_allreduce needs several machines of several ranks, as "
        "Open MPI and weft see them alike");
  }
  const weft::Topology machines = weft::load_machine_topology();
  const int me = weft::machine_rank();
  const std::vector<int> in_m = machines.in_neighbors(me);
  const std::vector<int> out_m = machines.out_neighbors(me);
  const int max_in = MaxOverRanks(static_cast<int>(in_m.size()));
  {
    std::ostringstream t;
    t << "hierarchical_neighbor_allreduce: " << weft::machine_size() << " machines x " << local_size
      << " ranks, machine topology ExponentialGraph(" << weft::machine_size()
      << "), uniform weights; busbw = algbw * machine in-degree (max: " << max_in << ")";
    PrintTableHeader(t.str().c_str());
  }
  // Expected: rank r holds r + 1; machine m's sum over its ranks (as weft detects them).
  std::vector<int> machine_of(g_size, 0);
  const int mine = me;
  CheckMpi(MPI_Allgather(&mine, 1, MPI_INT, machine_of.data(), 1, MPI_INT, MPI_COMM_WORLD),
           "MPI_Allgather");
  auto machine_sum = [&](int m) {
    double s = 0;
    for (int r = 0; r < g_size; ++r) s += machine_of[r] == m ? r + 1 : 0;
    return s;
  };
  const double w = 1.0 / static_cast<double>(in_m.size() + 1);
  double want = w * machine_sum(me);
  for (int m : in_m) want += w * machine_sum(m);
  want /= local_size;
  const std::vector<double> weights(in_m.size(), w);
  if (b.recv.size() < in_m.size()) {
    b.recv.resize(in_m.size(), FloatBuffer(b.in.size(), 0.0f));
  }
  for (size_t bytes : Sizes()) {
    const size_t count = bytes / sizeof(float);
    float* in = b.in.data();
    float* out = b.out.data();
    Case c;
    c.op = "hierarchical_neighbor_allreduce";
    c.bytes = count * sizeof(float);
    c.elements = count;
    c.bus_factor = max_in;
    c.in_degree = max_in;
    c.weft = [=] {
      Check(weft::hierarchical_neighbor_allreduce(View(in, count), View(out, count)),
            "weft::hierarchical_neighbor_allreduce");
    };
    c.raw = [=, &b] {
      CheckMpi(MPI_Allreduce(in, out, static_cast<int>(count), MPI_FLOAT, MPI_SUM, local),
               "MPI_Allreduce (machine)");
      if (local_rank == 0) {
        // The machine ranks of the cross communicator are weft's machine ranks (both
        // order machines by their lowest rank). The machine's sum is combined in place, as
        // weft combines it, with the same kernel.
        RawNeighborAllreduce(out, out, count, out_m, in_m, w, weights, b.recv, cross);
      }
      CheckMpi(MPI_Bcast(out, static_cast<int>(count), MPI_FLOAT, 0, local), "MPI_Bcast");
      weft::comm::Divide(out, weft::DType::kFloat32, count, static_cast<double>(local_size));
    };
    c.poison = [=] { std::fill(out, out + count, kPoison); };
    c.check = [=](const std::string& what) {
      Verify(what, out, CheckIndices(count), [=](size_t) { return want; });
    };
    RunCase(c);
  }
  MPI_Comm_free(&cross);
  MPI_Comm_free(&local);
}

void BenchFused() {
  constexpr int kTensors = 64;
  constexpr size_t kCount = 4096 / sizeof(float);
  std::vector<FloatBuffer> ins(kTensors, FloatBuffer(kCount, static_cast<float>(g_rank + 1)));
  std::vector<FloatBuffer> outs(kTensors, FloatBuffer(kCount, 0.0f));
  const double n = g_size;
  auto poison = [&] {
    for (auto& o : outs) std::fill(o.begin(), o.end(), kPoison);
  };
  auto check = [&](const std::string& what) {
    for (int t = 0; t < kTensors; ++t) {
      Verify(what + " tensor " + std::to_string(t), outs[t].data(), CheckIndices(kCount),
             [=](size_t) { return n * (n + 1) / 2; });
    }
  };
  // 64 nonblocking allreduces, then their waits; `grouped`: started in a group
  // (group_start/group_end), which hands them to the engine together.
  auto burst = [&](bool grouped) {
    std::vector<weft::Handle> handles;
    handles.reserve(kTensors);
    if (grouped) weft::group_start();
    for (int t = 0; t < kTensors; ++t) {
      auto h = weft::allreduce_nonblocking(View(ins[t].data(), kCount),
                                           View(outs[t].data(), kCount), false);
      Check(h.status(), "weft::allreduce_nonblocking");
      handles.push_back(*h);
    }
    if (grouped) Check(weft::group_end(), "weft::group_end");
    for (auto& h : handles) Check(weft::wait(h), "weft::wait (fused allreduce)");
  };
  auto weft_fused = [&] { burst(false); };
  auto weft_grouped = [&] { burst(true); };
  auto weft_blocking = [&] {
    for (int t = 0; t < kTensors; ++t) {
      Check(weft::allreduce(View(ins[t].data(), kCount), View(outs[t].data(), kCount), false),
            "weft::allreduce (64 blocking)");
    }
  };
  auto raw = [&] {
    for (int t = 0; t < kTensors; ++t) {
      CheckMpi(MPI_Allreduce(ins[t].data(), outs[t].data(), static_cast<int>(kCount), MPI_FLOAT,
                             MPI_SUM, MPI_COMM_WORLD),
               "MPI_Allreduce");
    }
  };
  // The ideal: the 64 tensors already in one buffer, one MPI_Allreduce (no packing).
  FloatBuffer whole_in(kTensors * kCount, static_cast<float>(g_rank + 1));
  FloatBuffer whole_out(kTensors * kCount, 0.0f);
  auto ideal = [&] {
    CheckMpi(MPI_Allreduce(whole_in.data(), whole_out.data(), static_cast<int>(whole_in.size()),
                           MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
             "MPI_Allreduce (one buffer)");
  };
  const std::vector<Timing> times =
      MeasureInterleaved({weft_fused, weft_grouped, weft_blocking, raw, ideal});
  const Timing& tf = times[0];
  const Timing& tg = times[1];
  const Timing& tb = times[2];
  const Timing& tr = times[3];
  const Timing& ti = times[4];
  poison();
  weft_fused();
  check("weft fused allreduce");
  poison();
  weft_grouped();
  check("weft grouped fused allreduce");
  poison();
  weft_blocking();
  check("weft 64 blocking allreduce");
  poison();
  raw();
  check("raw MPI 64 blocking allreduce");

  const size_t bytes = kTensors * kCount * sizeof(float);
  Row row;
  row.op = "fused_allreduce_64x4KiB";
  row.bytes = bytes;
  row.elements = kTensors * kCount;
  row.weft_us = tf.seconds * 1e6;
  row.mpi_us = tr.seconds * 1e6;
  SetSpread(row, tf, tr);
  row.weft_iters = tf.iters;
  row.mpi_iters = tr.iters;
  row.weft_algbw = bytes / tf.seconds / 1e9;
  row.mpi_algbw = bytes / tr.seconds / 1e9;
  row.weft_busbw = row.weft_algbw * 2.0 * (n - 1) / n;
  row.mpi_busbw = row.mpi_algbw * 2.0 * (n - 1) / n;
  row.weft_blocking_us = tb.seconds * 1e6;
  row.weft_grouped_us = tg.seconds * 1e6;
  row.mpi_one_buffer_us = ti.seconds * 1e6;
  g_rows.push_back(row);
  if (g_rank == 0) {
    std::printf("#\n# fused: 64 tensors of 4 KiB, allreduce sum float32 (bytes = all 64)\n");
    std::printf("  weft  64 x allreduce_nonblocking + wait: %10.2f us\n", tf.seconds * 1e6);
    std::printf("  weft  the same in a group:               %10.2f us\n", tg.seconds * 1e6);
    std::printf("  weft  64 x blocking allreduce:          %10.2f us   (for reference)\n",
                tb.seconds * 1e6);
    std::printf("  raw   64 x blocking MPI_Allreduce:      %10.2f us\n", tr.seconds * 1e6);
    std::printf("  raw   1 MPI_Allreduce of all 64 (ideal): %9.2f us\n", ti.seconds * 1e6);
    std::printf("  speedup (raw / weft nonblocking):       %10.2f x\n", tr.seconds / tf.seconds);
    std::printf("  weft nonblocking vs weft blocking:      %10.2f x\n", tb.seconds / tf.seconds);
    std::fflush(stdout);
  }
}

// --- report --------------------------------------------------------------------------------

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

void PrintResults() {
  if (g_rank != 0) return;
  std::printf("#\n# machine-readable results\n");
  for (const Row& r : g_rows) {
    std::printf(
        "RESULT {\"op\": %s, \"ranks\": %d, \"bytes\": %zu, \"elements\": %zu, "
        "\"weft_us\": %.3f, \"weft_algbw_gbps\": %.6f, \"weft_busbw_gbps\": %.6f, "
        "\"mpi_us\": %.3f, \"mpi_algbw_gbps\": %.6f, \"mpi_busbw_gbps\": %.6f, "
        "\"ratio\": %.4f, \"weft_iters\": %d, \"mpi_iters\": %d, \"weft_us_rounds\": [%.3f, "
        "%.3f], \"mpi_us_rounds\": [%.3f, %.3f]",
        JsonString(r.op).c_str(), g_size, r.bytes, r.elements, r.weft_us, r.weft_algbw,
        r.weft_busbw, r.mpi_us, r.mpi_algbw, r.mpi_busbw, r.mpi_us / r.weft_us, r.weft_iters,
        r.mpi_iters, r.weft_fastest_us, r.weft_slowest_us, r.mpi_fastest_us, r.mpi_slowest_us);
    if (r.in_degree >= 0) std::printf(", \"in_degree\": %d", r.in_degree);
    if (r.weft_blocking_us >= 0) std::printf(", \"weft_blocking_us\": %.3f", r.weft_blocking_us);
    if (r.weft_grouped_us >= 0) std::printf(", \"weft_grouped_us\": %.3f", r.weft_grouped_us);
    if (r.mpi_one_buffer_us >= 0) {
      std::printf(", \"mpi_one_buffer_us\": %.3f", r.mpi_one_buffer_us);
    }
    std::printf("}\n");
  }
  std::fflush(stdout);
}

std::string MpiLibraryFirstLine() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string s(text, len);
  const size_t nl = s.find_first_of("\r\n");
  if (nl != std::string::npos) s = s.substr(0, nl);
  while (!s.empty() && (s.back() == ',' || s.back() == ' ' || s.back() == '\0')) s.pop_back();
  return s;
}

// The 1-minute load average when the run starts: on a shared machine it says how much of
// the noise in the numbers came from other work.
std::string LoadAverage() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (f == nullptr) return "unknown";
  char buf[64] = {0};
  const bool ok = std::fgets(buf, sizeof(buf), f) != nullptr;
  std::fclose(f);
  if (!ok) return "unknown";
  std::string s(buf);
  return s.substr(0, s.find(' '));
}

const char* ThreadLevel(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  const weft::Status init = weft::init();
  if (!init.ok()) {
    std::fprintf(stderr, "comm_bench: weft::init() failed: %s\n", init.ToString().c_str());
    return 1;
  }
  g_rank = weft::rank();
  g_size = weft::size();
  g_opt = ParseArgs(argc, argv);

  int provided = 0;
  MPI_Query_thread(&provided);
  int mpi_major = 0, mpi_minor = 0;
  MPI_Get_version(&mpi_major, &mpi_minor);
  if (g_rank == 0) {
    std::printf("# comm_bench: weft vs raw MPI\n");
    std::printf("# ranks: %d (local_size %d, machines %d); host: %ld cores, load average %s\n",
                g_size, weft::local_size(), weft::machine_size(), sysconf(_SC_NPROCESSORS_ONLN),
                LoadAverage().c_str());
    std::printf("# weft: %s\n", g_opt.weft_version.c_str());
    std::printf("# MPI: %s (MPI %d.%d, %s)\n", MpiLibraryFirstLine().c_str(), mpi_major,
                mpi_minor, ThreadLevel(provided));
    std::printf(
        "# sizes: %lld .. %lld bytes, doubling; float32 (but allreduce_float16 and "
        "allreduce_bfloat16)\n",
        static_cast<long long>(g_opt.min_bytes), static_cast<long long>(g_opt.max_bytes));
    if (g_opt.fresh_inputs) {
      std::printf(
          "# inputs: rewritten by their rank before each call, on both sides; the rewrite's "
          "own time is taken off (allreduce, broadcast, allgather, neighbor allreduces)\n");
    }
    if (g_opt.iters > 0) {
      std::printf("# iterations: %d per size\n", g_opt.iters);
    } else {
      std::printf("# iterations: adaptive, ~%.2f s per size and implementation, %d..%d\n",
                  g_opt.target_seconds, g_opt.min_iters, g_opt.max_iters);
    }
    std::printf("# warmup: %d%s\n", g_opt.warmup,
                g_opt.warmup_given ? "" : " (fewer, at least 1, where one op takes > 20 ms)");
    std::printf(
        "# time: per op, in %d rounds alternating between weft and raw MPI (a barrier, "
        "then 1/%d of the calls; max over ranks), the median round; algbw = bytes / "
        "time; ratio = raw MPI time / weft time (> 1: weft faster)\n",
        kRounds, kRounds);
    std::fflush(stdout);
  }

  Buffers b;
  const size_t max_count = static_cast<size_t>(g_opt.max_bytes) / sizeof(float);
  b.in.assign(max_count, static_cast<float>(g_rank + 1));
  b.out.assign(max_count, 0.0f);
  size_t max_recv = std::max<size_t>(1, weft::in_neighbor_ranks().size());
  if (Wants("neighbor_allreduce_onepeer")) {
    auto probe = MakeOnePeer();
    for (int k = 0; k < 64; ++k) max_recv = std::max(max_recv, probe->Next().recv_ranks.size());
  }
  if (Wants("neighbor_allreduce") || Wants("neighbor_allreduce_onepeer")) {
    b.recv.assign(max_recv, FloatBuffer(max_count, 0.0f));
  }
  if (Wants("hierarchical_neighbor_allreduce")) BenchHierarchical(b);

  if (Wants("allreduce")) BenchAllreduce(b, /*in_place=*/false);
  if (Wants("allreduce_inplace")) BenchAllreduce(b, /*in_place=*/true);
  if (Wants("allreduce_float16")) BenchAllreduce16(b, weft::DType::kFloat16);
  if (Wants("allreduce_bfloat16")) BenchAllreduce16(b, weft::DType::kBFloat16);
  if (Wants("broadcast")) BenchBroadcast(b);
  if (Wants("allgather")) BenchAllgather(b);
  if (Wants("neighbor_allreduce")) BenchNeighborStatic(b);
  if (Wants("neighbor_allreduce_onepeer")) BenchNeighborOnePeer(b);
  if (Wants("fused")) BenchFused();
  PrintResults();

  const weft::Status down = weft::shutdown();
  if (!down.ok()) {
    std::fprintf(stderr, "comm_bench: rank %d: weft::shutdown() failed: %s\n", g_rank,
                 down.ToString().c_str());
    return 1;
  }
  return 0;
}
