// Where a seccomp filter refuses process_vm_writev and allows process_vm_readv (a profile
// can allow one and not the other), init() finds that the ranks can read each other's
// memory but not write it: allgathers still read the others' parts where they are, and the
// allreduces that would write their sums into the others' outputs (tuned from 16 KiB on 2
// ranks with a CPU each, from 64 KiB where ranks share CPUs) go another way, with the right
// sums, in place and out of place. The filter is the process's for good: this test has a
// binary of its own. Where the ranks have a CPU each on 4 ranks, no allreduce here would
// take the direct way anyway: that case checks only the sums.
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "gtest/gtest.h"
#include "tests/comm/test_util.h"

namespace weft {
namespace {

#if defined(__x86_64__)
constexpr uint32_t kArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr uint32_t kArch = AUDIT_ARCH_AARCH64;
#else
constexpr uint32_t kArch = 0;
#endif

// Installs, on every thread of this process, a filter under which process_vm_writev fails
// with EPERM and every other call runs. Empty on success, else why not.
std::string RefuseProcessMemoryWrites() {
  if (kArch == 0) return "no filter written for this architecture";
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_writev, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return "PR_SET_NO_NEW_PRIVS refused";
  const long done =
      syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &program);
  if (done < 0) return std::string("seccomp refused: ") + std::strerror(errno);
  if (done > 0) return "thread " + std::to_string(done) + " could not take the filter";
  return "";
}

TEST(NoWriteAccess, AllgathersReadAndAllreducesGoAnotherWay) {
  const std::string refused = RefuseProcessMemoryWrites();
  if (!refused.empty()) GTEST_SKIP() << "the filter this test needs: " << refused;
  // The filter holds: a write into this very process fails, as the filter says.
  ASSERT_FALSE(testing::CanWriteProcessMemory());
  ASSERT_EQ(errno, EPERM);

  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  ASSERT_TRUE(init().ok());
  const int me = rank(), n = size();
  ASSERT_TRUE(timeline_start(dir + "/no_write.%r.json").ok());
  testing::Arena arena;
  testing::Buffer part(DType::kFloat32, {(1 << 18) / n});  // 1 MiB of output
  part.Fill(me + 1);
  ASSERT_TRUE(barrier().ok());
  auto gathered = allgather(part.view(), arena.allocator(), "gather");
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  // Lone ops of sizes the direct way would take, 20 of each size and placement: on 2 ranks
  // its tuner would try the direct way from the 14th to the 16th on (after 5 through shared
  // memory, 3 to 5 of MPI's and 5 of the way kept).
  for (int64_t count : {int64_t{1} << 14, int64_t{1} << 20}) {  // 64 KiB, 4 MiB
    for (int k = 0; k < 40; ++k) {
      const bool in_place = k % 2 == 0, average = k % 3 == 0;
      testing::Buffer x(DType::kFloat32, {count}), y(DType::kFloat32, {count});
      for (int64_t i = 0; i < count; ++i) x.Set(i, me + 1 + static_cast<double>(i % 7));
      testing::Buffer& out = in_place ? x : y;
      const std::string name = "sum." + std::to_string(count) + "." + std::to_string(k);
      ASSERT_TRUE(barrier().ok());
      ASSERT_TRUE(allreduce(x.view(), out.view(), average, name).ok()) << name;
      for (int64_t i : {int64_t{0}, count / 2 + 3, count - 1}) {
        const double sum = n * (n + 1) / 2.0 + n * static_cast<double>(i % 7);
        EXPECT_EQ(out.Get(i), average ? sum / n : sum) << name << " element " << i;
      }
    }
  }
  ASSERT_TRUE(timeline_stop().ok());
  ASSERT_TRUE(shutdown().ok());
  if (n == 1) return;  // nothing to reach on one rank
  // Each op's transfer, one event on a line of its own, named for the way it took.
  std::ifstream in(dir + "/no_write." + std::to_string(me) + ".json");
  std::string line;
  int read_gathers = 0;
  std::map<std::string, int> sums;  // "MPI 'sum.1048576.", ...
  while (std::getline(in, line)) {
    if (line.rfind("{\"name\": \"CMA_ALLGATHER\"", 0) == 0) ++read_gathers;
    for (const char* way : {"SHM", "MPI", "CMA"}) {
      if (line.rfind(std::string("{\"name\": \"") + way + "_ALLREDUCE\"", 0) != 0) continue;
      for (const char* size : {"'sum.16384.", "'sum.1048576."}) {
        if (line.find(size) != std::string::npos) ++sums[std::string(way) + " " + size];
      }
    }
  }
  if (read_gathers == 0)
    GTEST_SKIP() << "the kernel does not let the ranks read each other's memory";
  EXPECT_EQ(read_gathers, 1) << "the ranks still read each other's memory";
  for (const char* size : {"'sum.16384.", "'sum.1048576."}) {
    const std::string s(size);
    EXPECT_EQ(sums["CMA " + s], 0) << "no allreduce may write another rank's memory: " << s;
    EXPECT_EQ(sums["SHM " + s] + sums["MPI " + s], 40) << "every op's transfer: " << s;
  }
  const bool own_cpus = testing::RanksHaveACpuEach(n);
  if (n == 2 && own_cpus) {
    // Tuned from 1 MiB only, between shared memory and MPI's (a trial of MPI's for each
    // placement: at least its first three ops, however slow); the 64 KiB ops are not tuned
    // and stay in shared memory.
    EXPECT_EQ(sums["MPI 'sum.16384."], 0);
    EXPECT_GE(sums["MPI 'sum.1048576."], 4);
  } else {
    // Where the ranks share CPUs the direct way would have taken every one of these.
    EXPECT_EQ(sums["MPI 'sum.16384."] + sums["MPI 'sum.1048576."], 0);
  }
}

}  // namespace
}  // namespace weft
