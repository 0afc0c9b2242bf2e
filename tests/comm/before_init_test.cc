// Calls before init() and after shutdown() are clear errors, never crashes; init works
// again after shutdown.
#include <cstdlib>
#include <string>

#include "comm/comm.h"
#include "gtest/gtest.h"
#include "tests/comm/test_util.h"

namespace weft {
namespace {

void ExpectNotInitialized(const Status& st) {
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(std::string(st.message()).find("call init() first"), std::string::npos) << st;
}

void ExpectEverythingRefused() {
  testing::Buffer x(DType::kFloat32, {2});
  testing::Arena arena;
  EXPECT_EQ(rank(), -1);
  EXPECT_EQ(size(), -1);
  EXPECT_FALSE(is_initialized());
  ExpectNotInitialized(allreduce(x.view(), x.view()));
  ExpectNotInitialized(broadcast(x.view(), x.view(), 0));
  ExpectNotInitialized(allgather(x.view(), arena.allocator()).status());
  ExpectNotInitialized(neighbor_allgather(x.view(), arena.allocator()).status());
  ExpectNotInitialized(neighbor_allreduce(x.view(), x.view()));
  ExpectNotInitialized(hierarchical_neighbor_allreduce(x.view(), x.view()));
  ExpectNotInitialized(pair_gossip(x.view(), x.view(), 0));
  ExpectNotInitialized(barrier());
  ExpectNotInitialized(set_topology(*RingGraph(2)));
  ExpectNotInitialized(shutdown());
  EXPECT_EQ(load_topology().size(), 0);
  EXPECT_FALSE(wait(Handle()).ok());
}

TEST(Lifecycle, BeforeInitAfterShutdownAndAgain) {
  ExpectEverythingRefused();
  ASSERT_TRUE(init().ok());
  testing::Buffer x(DType::kFloat32, {2});
  x.Fill(1);
  ASSERT_TRUE(allreduce(x.view(), x.view(), false).ok());
  EXPECT_EQ(x.Get(0), size());
  ASSERT_TRUE(shutdown().ok());
  ExpectEverythingRefused();
  ASSERT_TRUE(init().ok());  // a second life in the same process
  ASSERT_TRUE(allreduce(x.view(), x.view(), false).ok());
  EXPECT_EQ(x.Get(0), size() * size());
  ASSERT_TRUE(shutdown().ok());
}

TEST(Lifecycle, InvalidSettingFailsInit) {
  setenv("WEFT_FUSION_THRESHOLD_BYTES", "lots", 1);
  Status st = init();
  unsetenv("WEFT_FUSION_THRESHOLD_BYTES");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find("WEFT_FUSION_THRESHOLD_BYTES='lots'"),
            std::string::npos)
      << st;
  EXPECT_FALSE(is_initialized());
}

TEST(Lifecycle, SettingsOutOfRangeFailInit) {
  for (const char* timeout : {"inf", "nan", "-1", "1e13", "0x10"}) {
    setenv("WEFT_STALL_TIMEOUT_SECONDS", timeout, 1);
    Status st = init();
    unsetenv("WEFT_STALL_TIMEOUT_SECONDS");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << timeout << ": " << st;
    EXPECT_NE(std::string(st.message()).find("a number from 0 to 1e+06"), std::string::npos) << st;
    EXPECT_FALSE(is_initialized());
  }
  // Machines of equal size: N + 1 ranks per machine never divides N ranks.
  const char* world = std::getenv("OMPI_COMM_WORLD_SIZE");
  const int n = world != nullptr ? std::atoi(world) : 1;
  setenv("WEFT_RANKS_PER_MACHINE", std::to_string(n + 1).c_str(), 1);
  Status st = init();
  unsetenv("WEFT_RANKS_PER_MACHINE");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find("does not divide"), std::string::npos) << st;
  EXPECT_FALSE(is_initialized());
  ASSERT_TRUE(init().ok());  // and nothing is left half made
  ASSERT_TRUE(shutdown().ok());
}

}  // namespace
}  // namespace weft
