// How a thread that polls for progress and finds none waits before it polls again: a caller
// waiting for its op (it runs the engine itself, engine.h) and a transfer waiting on its
// peer (mpi_plane.cc). Giving up the core (sched_yield) lets another process that shares it
// run, the rank whose message is awaited among them, but costs a system call each time
// (1.1-1.5 us on the development VM, where yielding at every poll made a 4 B allreduce on 2
// ranks take 9-19 us instead of 5-7); when every rank has a CPU of its own, pausing on the
// CPU is cheaper. Internal to comm/.
#ifndef WEFT_COMM_SPIN_H_
#define WEFT_COMM_SPIN_H_

#include <cstdint>
#include <functional>
#include <string>

namespace weft {
namespace comm {

// Whether idle polls yield under WEFT_ENGINE_YIELD_WHEN_IDLE=`mode` ("on", "off", or "auto":
// when this host's ranks outnumber the CPUs they may run on, unless the poll called MPI
// (`polls_mpi`: MPI_Iprobe, MPI_Test) and `mpi_yields()`). Where MPI's progress itself
// yields when it finds nothing (Open MPI's mpi_yield_when_idle, which mpirun turns on when
// it knows it oversubscribes a host), a second yield per poll only adds context switches: on
// 4 ranks sharing 2 cores a 4 B allreduce took 88-99 us that way and 62-76 us pausing
// (bench/README.md). A poll that stays out of MPI (the negotiation's messages through shared
// memory, control_channel.h) has nobody else to yield for it. `mpi_yields` is called only
// where its answer decides (asking MPI is slow: mpi_util.h).
bool YieldsWhenIdle(const std::string& mode, int ranks_on_host, int cpus, bool polls_mpi,
                    const std::function<bool()>& mpi_yields);
// Decides it for this process, at init(), from the setting in force, for both kinds of
// polls; until then idle polls yield. Returns the choice for polls that call MPI.
bool ChooseIdleWait(int ranks_on_host, int cpus, const std::function<bool()>& mpi_yields);
// The choice in force for polls that call MPI (`polled_mpi`) or do not.
bool IdleWaitYields(bool polled_mpi);

// Between two polls that found nothing, the first of them at `idle_since_us`
// (Timeline::NowMicros), `polled_mpi` saying whether they call MPI: sched_yield, or, when not
// yielding, a short pause on the CPU, and a yield once the polls have found nothing for
// 100 us and every 100 us after, so that another thread wanting the core gets it.
void IdleWait(int64_t idle_since_us, bool polled_mpi);

// How long the engine thread sleeps before it polls again, while ops are outstanding and no
// caller drives, `idle_us` after the last progress (by any thread): an eighth of that, from
// 10 us up to `max_us` (WEFT_ENGINE_MAX_SLEEP_MICROS), so that a message is seen at most an
// eighth of the wait late and one late rank does not keep the others late (comm/README.md).
int64_t BusySleepMicros(int64_t idle_us, int64_t max_us);

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_SPIN_H_
