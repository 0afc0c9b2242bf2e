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

std::atomic<bool> g_yield{true};
thread_local int64_t t_last_yield_us = 0;

// A few hundred cycles: long enough to leave an SMT sibling the core's resources, short
// next to a poll. A PAUSE's length varies by CPU: on the development VM (AMD EPYC) one takes
// about 26 ns, so 16 of them (410-750 ns measured) delayed the moment a waiting caller saw
// its answer, on each hop of an op's negotiation; with four, 2 ranks' small ops take
// about 0.5-1 us less (bench/README.md).
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

bool YieldsWhenIdle(const std::string& mode, int ranks_on_host, int cpus,
                    const std::function<bool()>& mpi_yields) {
  return mode == "on" || (mode == "auto" && ranks_on_host > cpus && !mpi_yields());
}

bool ChooseIdleWait(int ranks_on_host, int cpus, const std::function<bool()>& mpi_yields) {
  const bool yield = YieldsWhenIdle(kYieldWhenIdle.Get(), ranks_on_host, cpus, mpi_yields);
  g_yield.store(yield, std::memory_order_relaxed);
  return yield;
}

void IdleWait(int64_t idle_since_us) {
  if (!g_yield.load(std::memory_order_relaxed)) {
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
