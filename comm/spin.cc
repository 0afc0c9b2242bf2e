#include "comm/spin.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>

#include "core/config.h"
#include "core/timeline.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace weft {
namespace comm {
namespace {

const config::StringSetting kYieldWhenIdle(
    "WEFT_ENGINE_YIELD_WHEN_IDLE", "auto",
    "Whether a thread polling for its op's progress gives up its core (sched_yield) between "
    "polls that find nothing, or pauses on it and yields only every 100 us; auto: yield when "
    "this host's ranks outnumber the CPUs they may run on and MPI's own polls do not yield "
    "already (Open MPI's mpi_yield_when_idle).",
    {"auto", "on", "off"});

// While pausing, still yield this often: a thread of the program (or another process) that
// wants this core gets it within a scheduler round, at one system call per interval.
constexpr int64_t kYieldEveryMicros = 100;

std::atomic<bool> g_yield{true};      // after polls that call MPI
std::atomic<bool> g_yield_own{true};  // after polls that do not
thread_local int64_t t_last_yield_us = 0;

// Long enough to leave an SMT sibling the core's resources, short next to a poll: a waiting
// caller sees its answer up to one pause late, on each hop of an op's negotiation. Sized for
// PAUSEs of 25-40 ns (AMD Zen, Intel since Skylake: about 100-160 ns for the four); on CPUs
// with short ones (older Intel, aarch64's `yield`) it is close to a bare spin. Measured in
// bench/README.md ("Waiting between polls").
inline void CpuPause() {
  for (int i = 0; i < 4; ++i) {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
  }
}

}  // namespace

bool YieldsWhenIdle(const std::string& mode, int ranks_on_host, int cpus, bool polls_mpi,
                    const std::function<bool()>& mpi_yields) {
  return mode == "on" || (mode == "auto" && ranks_on_host > cpus && !(polls_mpi && mpi_yields()));
}

bool ChooseIdleWait(int ranks_on_host, int cpus, const std::function<bool()>& mpi_yields) {
  const std::string mode = kYieldWhenIdle.Get();
  const bool yield = YieldsWhenIdle(mode, ranks_on_host, cpus, /*polls_mpi=*/true, mpi_yields);
  g_yield.store(yield, std::memory_order_relaxed);
  g_yield_own.store(YieldsWhenIdle(mode, ranks_on_host, cpus, /*polls_mpi=*/false, mpi_yields),
                    std::memory_order_relaxed);
  return yield;
}

bool IdleWaitYields(bool polled_mpi) {
  return (polled_mpi ? g_yield : g_yield_own).load(std::memory_order_relaxed);
}

void IdleWait(int64_t idle_since_us, bool polled_mpi) {
  if (!IdleWaitYields(polled_mpi)) {
    const int64_t now = Timeline::NowMicros();
    if (now - std::max(idle_since_us, t_last_yield_us) < kYieldEveryMicros) {
      CpuPause();
      return;
    }
    t_last_yield_us = now;
  }
  std::this_thread::yield();
}

int64_t BusySleepMicros(int64_t idle_us, int64_t max_us) {
  return std::min<int64_t>(std::max<int64_t>(idle_us / 8, 10), max_us);
}

}  // namespace comm
}  // namespace weft
