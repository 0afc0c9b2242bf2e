#include "comm/spin.h"

#include <functional>

#include "core/config.h"
#include "gtest/gtest.h"

namespace weft {
namespace comm {
namespace {

// Answers `yields` and counts how often it was asked.
struct MpiAnswer {
  bool yields;
  int asked = 0;
  std::function<bool()> fn() {
    return [this] {
      ++asked;
      return yields;
    };
  }
};

TEST(YieldsWhenIdle, AutoYieldsOnlyWhenRanksOutnumberCpus) {
  MpiAnswer no{false};
  EXPECT_FALSE(YieldsWhenIdle("auto", 2, 2, no.fn()));
  EXPECT_FALSE(YieldsWhenIdle("auto", 1, 64, no.fn()));
  EXPECT_EQ(no.asked, 0);  // MPI is asked only where its answer decides
  EXPECT_TRUE(YieldsWhenIdle("auto", 4, 2, no.fn()));
  EXPECT_TRUE(YieldsWhenIdle("auto", 3, 2, no.fn()));
  EXPECT_EQ(no.asked, 2);
}

TEST(YieldsWhenIdle, AutoLeavesTheYieldToMpiWhenItsPollsYield) {
  MpiAnswer yes{true};
  EXPECT_FALSE(YieldsWhenIdle("auto", 4, 2, yes.fn()));
  EXPECT_FALSE(YieldsWhenIdle("auto", 2, 2, yes.fn()));
  EXPECT_EQ(yes.asked, 1);
}

TEST(YieldsWhenIdle, OnAndOffDecideAlone) {
  MpiAnswer yes{true}, no{false};
  EXPECT_TRUE(YieldsWhenIdle("on", 1, 64, no.fn()));
  EXPECT_TRUE(YieldsWhenIdle("on", 4, 2, yes.fn()));
  EXPECT_FALSE(YieldsWhenIdle("off", 8, 2, no.fn()));
  EXPECT_EQ(yes.asked + no.asked, 0);
}

TEST(ChooseIdleWait, FollowsTheSetting) {
  auto& registry = config::Registry::Global();
  MpiAnswer yes{true}, no{false};
  ASSERT_TRUE(registry.Set("WEFT_ENGINE_YIELD_WHEN_IDLE", "off").ok());
  EXPECT_FALSE(ChooseIdleWait(8, 2, no.fn()));
  ASSERT_TRUE(registry.Set("WEFT_ENGINE_YIELD_WHEN_IDLE", "ON").ok());  // any case
  EXPECT_TRUE(ChooseIdleWait(1, 64, yes.fn()));
  EXPECT_EQ(yes.asked + no.asked, 0);
  registry.Unset("WEFT_ENGINE_YIELD_WHEN_IDLE");
  EXPECT_FALSE(ChooseIdleWait(2, 2, no.fn()));
  EXPECT_TRUE(ChooseIdleWait(3, 2, no.fn()));
  EXPECT_FALSE(ChooseIdleWait(3, 2, yes.fn()));
  EXPECT_EQ(yes.asked, 1);
  EXPECT_EQ(no.asked, 1);
  EXPECT_FALSE(registry.Set("WEFT_ENGINE_YIELD_WHEN_IDLE", "sometimes").ok());
}

}  // namespace
}  // namespace comm
}  // namespace weft
