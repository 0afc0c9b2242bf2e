// The memory floor under an out-of-place allreduce on one machine: the loop that weft's
// shared-memory allreduce runs for two ranks, without the other rank. Each round of 512 KiB
// copies the input into an area of its own, then sums the input and a second area into the
// output: in place (the output is the input), out of place (a second buffer) and out of
// place with streaming stores (the sums staged in 16 KiB, then written past the caches).
// Every rank runs the loops at once on its own buffers, as the ranks of a collective share
// the memory system; the time is the slowest rank's, the median over the repetitions, the
// three loops taking turns. Build with -c opt; run under mpirun (bench/README.md).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MEMORY_BENCH_STREAM 1
#endif

#include "comm/reduce.h"
#include "core/aligned.h"
#include "tools/cli/flags.h"

namespace {

size_t g_round_bytes = size_t{512} << 10;
constexpr size_t kStageBytes = size_t{16} << 10;

enum Loop { kInPlace, kOutOfPlace, kStreaming, kLoops };

struct Buffers {
  weft::AlignedVector<float> in, out, mine, other, stage;
};

// out = in + other, written with non-temporal stores through a staging block in the cache.
void AddStreaming(float* out, const float* in, const float* other, size_t count, float* stage) {
#ifdef MEMORY_BENCH_STREAM
  const size_t per = kStageBytes / sizeof(float);
  for (size_t k = 0; k < count; k += per) {
    const size_t n = std::min(per, count - k);
    weft::comm::Add(stage, in + k, other + k, weft::DType::kFloat32, n);
    const size_t bytes = n * sizeof(float), body = bytes / 16 * 16;
    char* d = reinterpret_cast<char*>(out + k);
    const char* s = reinterpret_cast<const char*>(stage);
    for (size_t i = 0; i < body; i += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i),
                       _mm_load_si128(reinterpret_cast<const __m128i*>(s + i)));
    }
    std::memcpy(d + body, s + body, bytes - body);
  }
  _mm_sfence();
#else
  weft::comm::Add(out, in, other, weft::DType::kFloat32, count);
  (void)stage;
#endif
}

void Pass(Loop loop, Buffers& b, size_t count) {
  const size_t per_round = g_round_bytes / sizeof(float);
  float* in = b.in.data();
  float* out = loop == kInPlace ? in : b.out.data();
  for (size_t base = 0; base < count; base += per_round) {
    const size_t n = std::min(per_round, count - base);
    std::memcpy(b.mine.data(), in + base, n * sizeof(float));
    if (loop == kStreaming) {
      AddStreaming(out + base, in + base, b.other.data(), n, b.stage.data());
    } else {
      weft::comm::Add(out + base, in + base, b.other.data(), weft::DType::kFloat32, n);
    }
  }
}

double SlowestMicros(Loop loop, Buffers& b, size_t count) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  Pass(loop, b, count);
  double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  double slowest = 0;
  MPI_Allreduce(&us, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int64_t min_bytes = int64_t{1} << 20, max_bytes = int64_t{64} << 20;
  int reps = 21;
  int64_t round_bytes = int64_t{512} << 10;
  weft::cli::FlagSet flags(
      "memory_bench",
      "The memory floor under out-of-place reductions: one rank's reduction loop in place, "
      "out of place and out of place with streaming stores, on every rank at once.");
  flags.Int("--min-bytes", &min_bytes, "smallest buffer per rank; sizes double", 4096)
      .Int("--max-bytes", &max_bytes, "largest buffer per rank", 4096, int64_t{1} << 32)
      .Int("--round-bytes", &round_bytes, "bytes per round (weft's allreduce: 524288)", 4096,
           int64_t{1} << 30)
      .Int("--reps", &reps, "timed passes of each loop per size", 1, 100000);
  const weft::Status parsed = flags.Parse(std::vector<std::string>(argv + 1, argv + argc));
  if (!parsed.ok() || flags.help_requested()) {
    if (rank == 0) {
      std::fputs(parsed.ok() ? flags.Help().c_str() : (parsed.ToString() + "\n").c_str(),
                 parsed.ok() ? stdout : stderr);
    }
    MPI_Finalize();
    return parsed.ok() ? 0 : 2;
  }

  if (rank == 0) {
    std::printf(
        "# memory_bench: %d rank(s) at once; float32; rounds of %zu KiB; us, slowest "
        "rank, median of %d\n",
        size, g_round_bytes >> 10, reps);
    std::printf("| bytes per rank | in place | out of place | ratio | streaming | ratio |\n");
    std::printf("| --- | --- | --- | --- | --- | --- |\n");
  }
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const size_t count = static_cast<size_t>(bytes) / sizeof(float);
    Buffers b;
    b.in.assign(count, 1.0f);
    b.out.assign(count, 0.0f);
    b.mine.assign(g_round_bytes / sizeof(float), 0.0f);
    b.other.assign(g_round_bytes / sizeof(float), 2.0f);
    b.stage.assign(kStageBytes / sizeof(float), 0.0f);
    std::vector<double> times[kLoops];
    for (int loop = 0; loop < kLoops; ++loop) Pass(static_cast<Loop>(loop), b, count);  // warm-up
    for (int r = 0; r < reps; ++r) {
      for (int loop = 0; loop < kLoops; ++loop) {
        times[loop].push_back(SlowestMicros(static_cast<Loop>(loop), b, count));
      }
    }
    double median[kLoops];
    for (int loop = 0; loop < kLoops; ++loop) {
      std::sort(times[loop].begin(), times[loop].end());
      median[loop] = times[loop][times[loop].size() / 2];
    }
    if (rank == 0) {
      std::printf("| %lld | %.0f | %.0f | %.2f | %.0f | %.2f |\n", static_cast<long long>(bytes),
                  median[kInPlace], median[kOutOfPlace], median[kOutOfPlace] / median[kInPlace],
                  median[kStreaming], median[kStreaming] / median[kInPlace]);
    }
  }
  MPI_Finalize();
  return 0;
}
