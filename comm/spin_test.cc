#include "comm/spin.h"

#include <algorithm>
#include <cstdint>
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
  EXPECT_FALSE(YieldsWhenIdle("auto", 2, 2, true, no.fn()));
  EXPECT_FALSE(YieldsWhenIdle("auto", 1, 64, true, no.fn()));
  EXPECT_EQ(no.asked, 0);  // MPI is asked only where its answer decides
  EXPECT_TRUE(YieldsWhenIdle("auto", 4, 2, true, no.fn()));
  EXPECT_TRUE(YieldsWhenIdle("auto", 3, 2, true, no.fn()));
  EXPECT_EQ(no.asked, 2);
}

TEST(YieldsWhenIdle, AutoLeavesTheYieldToMpiWhenItsPollsYield) {
  MpiAnswer yes{true};
  EXPECT_FALSE(YieldsWhenIdle("auto", 4, 2, true, yes.fn()));
  EXPECT_FALSE(YieldsWhenIdle("auto", 2, 2, true, yes.fn()));
  EXPECT_EQ(yes.asked, 1);
}

TEST(YieldsWhenIdle, PollsOutsideMpiYieldThemselvesWhenRanksOutnumberCpus) {
  MpiAnswer yes{true};
  EXPECT_TRUE(YieldsWhenIdle("auto", 4, 2, false, yes.fn()));
  EXPECT_FALSE(YieldsWhenIdle("auto", 2, 2, false, yes.fn()));
  EXPECT_FALSE(YieldsWhenIdle("off", 4, 2, false, yes.fn()));
  EXPECT_EQ(yes.asked, 0);  // MPI's polls are not theirs
}

TEST(YieldsWhenIdle, OnAndOffDecideAlone) {
  MpiAnswer yes{true}, no{false};
  EXPECT_TRUE(YieldsWhenIdle("on", 1, 64, true, no.fn()));
  EXPECT_TRUE(YieldsWhenIdle("on", 4, 2, true, yes.fn()));
  EXPECT_FALSE(YieldsWhenIdle("off", 8, 2, true, no.fn()));
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
  EXPECT_FALSE(IdleWaitYields(true));
  EXPECT_TRUE(IdleWaitYields(false));  // polls outside MPI yield themselves
  EXPECT_EQ(yes.asked, 1);
  EXPECT_EQ(no.asked, 1);
  EXPECT_FALSE(registry.Set("WEFT_ENGINE_YIELD_WHEN_IDLE", "sometimes").ok());
}

TEST(BusySleepMicros, IsAnEighthOfTheWaitWithinItsBounds) {
  EXPECT_EQ(BusySleepMicros(0, 1000), 10);
  EXPECT_EQ(BusySleepMicros(80, 1000), 10);
  EXPECT_EQ(BusySleepMicros(1000, 1000), 125);
  EXPECT_EQ(BusySleepMicros(4000, 1000), 500);
  EXPECT_EQ(BusySleepMicros(8000, 1000), 1000);
  EXPECT_EQ(BusySleepMicros(1000000, 1000), 1000);
  EXPECT_EQ(BusySleepMicros(1000000, 50), 50);
  EXPECT_EQ(BusySleepMicros(1000, 0), 0);  // WEFT_ENGINE_MAX_SLEEP_MICROS=0: poll at once
  // However long ranks have waited, a message is seen at most an eighth of that late, so
  // a late rank's next op starts closer to the others' than this one did.
  for (int64_t idle = 0; idle <= 100000; idle += 37) {
    EXPECT_LE(BusySleepMicros(idle, 1000000), std::max<int64_t>(idle / 8, 10)) << idle;
  }
}

}  // namespace
}  // namespace comm
}  // namespace weft
