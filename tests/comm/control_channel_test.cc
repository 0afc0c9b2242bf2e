// How the negotiation's messages travel (comm/control_channel.h): through shared memory
// between rank 0 and the ranks of its machine, unless WEFT_CONTROL_SHARED_MEMORY is off on
// any of them; and bursts whose messages outgrow a ring (sent in pieces) still complete
// with the right results, either way.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "core/config.h"
#include "gtest/gtest.h"
#include "tests/comm/test_util.h"

namespace weft {
namespace {

// init(), and its debug line about the negotiation's messages ("" when there is none).
std::string InitAndSayHow() {
  std::vector<std::string> lines;
  for (const std::string& line : testing::InitDebugLines()) {
    if (line.find("negotiation messages") != std::string::npos) lines.push_back(line);
  }
  EXPECT_LE(lines.size(), 1u);
  return lines.empty() ? "" : lines[0];
}

// 5000 allreduces of 1 KiB with 120-character names: the descriptors of the burst take
// about 650 KiB and the answer that fuses them about 600 KiB, several rings' worth, which
// go in pieces as the readers make room.
void LongBurstSumsRight() {
  constexpr int kOps = 5000;
  std::vector<testing::Buffer> xs;
  xs.reserve(kOps);
  std::vector<Handle> handles;
  const std::string padding(110, 'p');
  group_start();
  for (int i = 0; i < kOps; ++i) {
    xs.emplace_back(DType::kFloat32, std::vector<int64_t>{256});
    xs.back().Fill(rank() + i);
    auto h = allreduce_nonblocking(xs.back().view(), xs.back().view(), false,
                                   padding + std::to_string(100000 + i));
    ASSERT_TRUE(h.ok()) << h.status();
    handles.push_back(*h);
  }
  ASSERT_TRUE(group_end().ok());
  for (int i = 0; i < kOps; ++i) {
    ASSERT_TRUE(wait(handles[i]).ok()) << "op " << i;
    const double sum = size() * (size() - 1) / 2.0 + static_cast<double>(size()) * i;
    ASSERT_EQ(xs[i].Get(0), sum) << "op " << i;
    ASSERT_EQ(xs[i].Get(255), sum) << "op " << i;
  }
}

// Rank 0's segment is unlinked once every rank has mapped it: a job leaves nothing in
// /dev/shm, however it ends.
void NothingLeftInDevShm() {
  if (rank() != 0) return;
  const std::string mine = "weft-control-" + std::to_string(getpid()) + "-";
  DIR* dir = opendir("/dev/shm");
  ASSERT_NE(dir, nullptr);
  while (const dirent* entry = readdir(dir)) {
    EXPECT_NE(std::string(entry->d_name).rfind(mine, 0), 0u) << entry->d_name << " is left";
  }
  closedir(dir);
}

TEST(ControlChannel, RankZerosMachineUsesSharedMemory) {
  const std::string how = InitAndSayHow();
  if (size() == 1) {
    EXPECT_EQ(how, "");  // nobody to talk to
  } else {
    EXPECT_NE(how.find("through shared memory (" + std::to_string(size()) + " ranks"),
              std::string::npos)
        << how;
  }
  NothingLeftInDevShm();
  LongBurstSumsRight();
  ASSERT_TRUE(shutdown().ok());
}

TEST(ControlChannel, OneRankWithTheSettingOffSendsEveryoneThroughMpi) {
  // Before init(), the job as mpirun tells it.
  const int64_t ranks = testing::EnvInt("OMPI_COMM_WORLD_SIZE", 0);
  ASSERT_GT(ranks, 0) << "run under Open MPI's mpirun";
  if (ranks == 1) GTEST_SKIP() << "one rank sends no messages";
  // Only the last rank turns it off: the ranks of the machine agree at init.
  if (testing::EnvInt("OMPI_COMM_WORLD_RANK", -1) == ranks - 1) {
    ASSERT_TRUE(config::Registry::Global().Set("WEFT_CONTROL_SHARED_MEMORY", "0").ok());
  }
  const std::string how = InitAndSayHow();
  config::Registry::Global().Unset("WEFT_CONTROL_SHARED_MEMORY");
  EXPECT_NE(how.find("as MPI messages"), std::string::npos) << how;
  LongBurstSumsRight();
  ASSERT_TRUE(shutdown().ok());
  // And back through shared memory at the next init.
  EXPECT_NE(InitAndSayHow().find("through shared memory"), std::string::npos);
  LongBurstSumsRight();
  ASSERT_TRUE(shutdown().ok());
}

// Rank 0 moves the rest of a long answer before it runs the op, and waits for the op's ranks
// to read it. One of them may be inside MPI meanwhile, reading rank 0's window, which needs
// rank 0 in MPI's progress too: rank 0 must not wait outside MPI.
TEST(ControlChannel, LongAnswersWhileRanksReadRankZerosWindow) {
  ASSERT_TRUE(init().ok());
  if (size() == 1) {
    ASSERT_TRUE(shutdown().ok());
    GTEST_SKIP() << "no other rank to read the window";
  }
  testing::Buffer x(DType::kFloat32, std::vector<int64_t>{1 << 16});
  x.Fill(rank());
  ASSERT_TRUE(win_create(x.view(), "control_channel_test").ok());
  std::atomic<bool> stop{false};
  std::atomic<int> gets{0};
  // The ranks whose in-neighbors (the default topology's) include rank 0 read from it.
  const std::vector<int> in = in_neighbor_ranks();
  const bool reads = std::find(in.begin(), in.end(), 0) != in.end();
  std::thread reader;
  if (reads) {
    reader = std::thread([&] {
      WinGetOptions from_zero;
      from_zero.src_weights = std::map<int, double>{{0, 1.0}};
      while (!stop.load()) {
        const Status st = win_get("control_channel_test", from_zero);
        if (!st.ok()) {
          ADD_FAILURE() << st;
          return;
        }
        ++gets;
      }
    });
  }
  for (int round = 0; round < 3; ++round) LongBurstSumsRight();
  stop = true;
  if (reader.joinable()) reader.join();
  if (reads) {
    EXPECT_GT(gets.load(), 0);
  }
  ASSERT_TRUE(barrier().ok());
  ASSERT_TRUE(win_free("control_channel_test").ok());
  ASSERT_TRUE(shutdown().ok());
}

}  // namespace
}  // namespace weft
