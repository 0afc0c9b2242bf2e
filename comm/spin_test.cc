#include "comm/spin.h"

#include "core/config.h"
#include "gtest/gtest.h"

namespace weft {
namespace comm {
namespace {

TEST(YieldsWhenIdle, AutoYieldsOnlyWhenRanksOutnumberCpus) {
  EXPECT_FALSE(YieldsWhenIdle("auto", 2, 2, false));
  EXPECT_FALSE(YieldsWhenIdle("auto", 1, 64, false));
  EXPECT_TRUE(YieldsWhenIdle("auto", 4, 2, false));
  EXPECT_TRUE(YieldsWhenIdle("auto", 3, 2, false));
}

TEST(YieldsWhenIdle, AutoLeavesTheYieldToMpiWhenItsPollsYield) {
  EXPECT_FALSE(YieldsWhenIdle("auto", 4, 2, true));
  EXPECT_FALSE(YieldsWhenIdle("auto", 2, 2, true));
}

TEST(YieldsWhenIdle, OnAndOffDecideAlone) {
  EXPECT_TRUE(YieldsWhenIdle("on", 1, 64, false));
  EXPECT_TRUE(YieldsWhenIdle("on", 4, 2, true));
  EXPECT_FALSE(YieldsWhenIdle("off", 8, 2, false));
}

TEST(ChooseIdleWait, FollowsTheSetting) {
  auto& registry = config::Registry::Global();
  ASSERT_TRUE(registry.Set("WEFT_ENGINE_YIELD_WHEN_IDLE", "off").ok());
  EXPECT_FALSE(ChooseIdleWait(8, 2, false));
  ASSERT_TRUE(registry.Set("WEFT_ENGINE_YIELD_WHEN_IDLE", "ON").ok());  // any case
  EXPECT_TRUE(ChooseIdleWait(1, 64, true));
  registry.Unset("WEFT_ENGINE_YIELD_WHEN_IDLE");
  EXPECT_FALSE(ChooseIdleWait(2, 2, false));
  EXPECT_TRUE(ChooseIdleWait(3, 2, false));
  EXPECT_FALSE(ChooseIdleWait(3, 2, true));
  EXPECT_FALSE(registry.Set("WEFT_ENGINE_YIELD_WHEN_IDLE", "sometimes").ok());
}

}  // namespace
}  // namespace comm
}  // namespace weft
