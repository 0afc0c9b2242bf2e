// How a caller waiting for its op spends the polls that find nothing (comm/spin.h): init()
// decides it from the ranks on the host, the CPUs they may run on, and whether Open MPI's
// own polls already yield the core (mpi_yield_when_idle, which the BUILD rule sets both
// ways). Every rank pins itself to the same CPU first, so that the ranks outnumber the CPUs
// on any machine.
#include <mpi.h>
#include <sched.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "gtest/gtest.h"
#include "tests/comm/test_util.h"

namespace weft {
namespace {

// The lowest CPU this process may run on: the same on every rank when mpirun binds none.
int FirstCpu(const cpu_set_t& set) {
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) return c;
  }
  return 0;
}

TEST(IdleWait, InitLeavesTheYieldToMpiWhenItsPollsYield) {
  const char* setting = std::getenv("OMPI_MCA_mpi_yield_when_idle");
  ASSERT_NE(setting, nullptr) << "the BUILD rule sets OMPI_MCA_mpi_yield_when_idle";
  const bool mpi_yields = std::string(setting) == "1";

  cpu_set_t all, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  CPU_ZERO(&one);
  CPU_SET(FirstCpu(all), &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);

  // init(); whether one of its debug lines is `expected`.
  auto init_says = [](const std::string& expected) {
    bool found = false;
    for (const std::string& line : testing::InitDebugLines()) {
      found |= line.find(expected) != std::string::npos;
    }
    return found;
  };
  // One rank on its CPU pauses; several yield after polls that call MPI unless MPI's polls
  // do, which init() asks MPI only then, and always after polls that stay out of MPI. Before
  // init() the job's size is mpirun's word.
  const char* ranks = std::getenv("OMPI_COMM_WORLD_SIZE");
  ASSERT_NE(ranks, nullptr) << "run under Open MPI's mpirun";
  const bool shared = std::string(ranks) != "1";
  const std::string expected =
      std::string(ranks) + " rank(s) on this host, on 1 CPU(s): waiting callers " +
      (shared && !mpi_yields ? "yield" : "pause") + " between polls that call MPI" +
      (shared && mpi_yields ? " (MPI's polls yield)" : "") + ", " + (shared ? "yield" : "pause") +
      " between those that do not";
  EXPECT_TRUE(init_says(expected)) << "no debug line with \"" << expected << "\"";
  // Reading the setting left MPI's thread level alone (Open MPI's MPI_T_init_thread sets it
  // to the level it is given), so the engine thread may still call MPI.
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  EXPECT_EQ(level, MPI_THREAD_MULTIPLE);

  // Ops still complete, and correctly, either way.
  testing::Buffer x(DType::kFloat32, {1000});
  for (int round = 0; round < 20; ++round) {
    x.Fill(rank() + round);
    ASSERT_TRUE(allreduce(x.view(), x.view(), false).ok());
    const double sum = size() * (size() - 1) / 2.0 + size() * round;
    ASSERT_EQ(x.Get(999), sum) << "round " << round;
  }
  ASSERT_TRUE(shutdown().ok());
  // init() again finds MPI as it needs it, and makes the same choice.
  EXPECT_TRUE(init_says(expected)) << "after a shutdown: no debug line with \"" << expected << "\"";
  ASSERT_TRUE(shutdown().ok());
  ASSERT_EQ(sched_setaffinity(0, sizeof all, &all), 0);
}

}  // namespace
}  // namespace weft
