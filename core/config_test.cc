#include "core/config.h"

#include <algorithm>
#include <cstdlib>

#include "gtest/gtest.h"

namespace weft {
namespace config {
namespace {

const IntSetting kTestInt("WEFT_TEST_INT", 7, "An integer for this test.");
const BoolSetting kTestBool("WEFT_TEST_BOOL", false, "A flag for this test.");
const DoubleSetting kTestDouble("WEFT_TEST_DOUBLE", 1.5, "A number for this test.");
const IntSetting kTestCount("WEFT_TEST_COUNT", 4, "A bounded integer for this test.", 0, 100);
const DoubleSetting kTestSeconds("WEFT_TEST_SECONDS", 2, "A bounded number for this test.", 0, 1e6);
const StringSetting kTestChoice("WEFT_TEST_CHOICE", "b", "A choice for this test.",
                                {"a", "b", "c"});
const BoolSetting kTestSame("WEFT_TEST_SAME", false, "A flag every rank must share.",
                            Agreement::kSameOnEveryRank);

TEST(Config, DefaultsWithoutEnvironment) {
  unsetenv("WEFT_TEST_INT");
  ASSERT_TRUE(Registry::Global().Reload().ok());
  EXPECT_EQ(kTestInt.Get(), 7);
  EXPECT_FALSE(kTestBool.Get());
  EXPECT_DOUBLE_EQ(kTestDouble.Get(), 1.5);
  EXPECT_EQ(kTestChoice.Get(), "b");
  EXPECT_FALSE(kTestInt.is_set());
}

TEST(Config, EnvironmentIsReadAtReload) {
  setenv("WEFT_TEST_INT", " 42 ", 1);
  setenv("WEFT_TEST_BOOL", "yes", 1);
  setenv("WEFT_TEST_CHOICE", "C", 1);
  ASSERT_TRUE(Registry::Global().Reload().ok());
  EXPECT_EQ(kTestInt.Get(), 42);
  EXPECT_TRUE(kTestBool.Get());
  EXPECT_EQ(kTestChoice.Get(), "c");
  unsetenv("WEFT_TEST_INT");
  unsetenv("WEFT_TEST_BOOL");
  unsetenv("WEFT_TEST_CHOICE");
  ASSERT_TRUE(Registry::Global().Reload().ok());
}

TEST(Config, InvalidValueIsAnErrorNamingTheSettingAndKeepsTheDefault) {
  setenv("WEFT_TEST_INT", "lots", 1);
  setenv("WEFT_TEST_CHOICE", "z", 1);
  Status st = Registry::Global().Reload();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("WEFT_TEST_INT='lots'"), std::string::npos) << st;
  EXPECT_NE(st.message().find("an integer"), std::string::npos) << st;
  EXPECT_NE(st.message().find("one of a, b, c"), std::string::npos) << st;
  EXPECT_EQ(kTestInt.Get(), 7);
  unsetenv("WEFT_TEST_INT");
  unsetenv("WEFT_TEST_CHOICE");
  ASSERT_TRUE(Registry::Global().Reload().ok());
}

TEST(Config, SetOverridesEnvironmentAndRejectsBadValues) {
  setenv("WEFT_TEST_INT", "3", 1);
  ASSERT_TRUE(Registry::Global().Reload().ok());
  ASSERT_TRUE(Registry::Global().Set("WEFT_TEST_INT", "11").ok());
  EXPECT_EQ(kTestInt.Get(), 11);
  EXPECT_EQ(*Registry::Global().GetText("WEFT_TEST_INT"), "11");
  Status bad = Registry::Global().Set("WEFT_TEST_INT", "x");
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(kTestInt.Get(), 11);  // unchanged by the rejected value
  EXPECT_FALSE(Registry::Global().Set("WEFT_NO_SUCH_SETTING", "1").ok());
  Registry::Global().Unset("WEFT_TEST_INT");
  EXPECT_EQ(kTestInt.Get(), 3);
  unsetenv("WEFT_TEST_INT");
  ASSERT_TRUE(Registry::Global().Reload().ok());
}

// Numbers that would overflow a conversion, or are out of a setting's range, are refused
// with the range in the message, and leave the value in force unchanged.
TEST(Config, NumbersMustBeFiniteDecimalAndInRange) {
  Registry& r = Registry::Global();
  for (const char* bad : {"inf", "-inf", "nan", "1e13", "-1", "0x10", "1e400", ""}) {
    Status st = r.Set("WEFT_TEST_SECONDS", bad);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("a number from 0 to 1e+06"), std::string::npos) << st;
  }
  EXPECT_EQ(kTestSeconds.Get(), 2);
  ASSERT_TRUE(r.Set("WEFT_TEST_SECONDS", "2.5e3").ok());
  EXPECT_EQ(kTestSeconds.Get(), 2500);
  r.Unset("WEFT_TEST_SECONDS");
  for (const char* bad : {"-3", "101", "1.5", "9223372036854775808"}) {
    Status st = r.Set("WEFT_TEST_COUNT", bad);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("an integer from 0 to 100"), std::string::npos) << st;
  }
  ASSERT_TRUE(r.Set("WEFT_TEST_COUNT", "100").ok());
  EXPECT_EQ(kTestCount.Get(), 100);
  r.Unset("WEFT_TEST_COUNT");
  // An unbounded double still refuses what is not a finite number.
  EXPECT_FALSE(r.Set("WEFT_TEST_DOUBLE", "nan").ok());
  EXPECT_TRUE(r.Set("WEFT_TEST_DOUBLE", "-7.25").ok());
  r.Unset("WEFT_TEST_DOUBLE");
  setenv("WEFT_TEST_SECONDS", "inf", 1);
  Status st = r.Reload();
  EXPECT_NE(st.message().find("WEFT_TEST_SECONDS='inf'"), std::string::npos) << st;
  unsetenv("WEFT_TEST_SECONDS");
  ASSERT_TRUE(r.Reload().ok());
}

TEST(Config, DescribeListsEverySettingAndUnknownVariablesAreReported) {
  const std::string table = Registry::Global().Describe();
  EXPECT_NE(table.find("WEFT_TEST_DOUBLE=1.5 (default)"), std::string::npos) << table;
  EXPECT_NE(table.find("WEFT_LOG_LEVEL"), std::string::npos) << table;
  setenv("WEFT_TEST_INTT", "1", 1);
  auto unknown = Registry::Global().UnknownEnvironment();
  EXPECT_NE(std::find(unknown.begin(), unknown.end(), "WEFT_TEST_INTT"), unknown.end());
  unsetenv("WEFT_TEST_INTT");
}

TEST(Config, SettingsDeclareWhetherEveryRankMustAgree) {
  std::vector<std::string> names;
  for (const Setting* s : Registry::Global().SameOnEveryRank()) names.push_back(s->name());
  EXPECT_EQ(names, std::vector<std::string>{"WEFT_TEST_SAME"});  // core declares no other
  EXPECT_EQ(kTestInt.agreement(), Agreement::kPerRank);
}

// Bluefog's variables stand for weft's settings when those are not set themselves.
TEST(Config, BluefogVariablesAreAliases) {
  Registry& r = Registry::Global();
  unsetenv("WEFT_LOG_LEVEL");
  setenv("BLUEFOG_LOG_LEVEL", "FATAL", 1);  // weft's highest level is error
  ASSERT_TRUE(r.Reload().ok());
  EXPECT_EQ(*r.GetText("WEFT_LOG_LEVEL"), "error");
  EXPECT_TRUE(r.FromAlias("WEFT_LOG_LEVEL"));
  setenv("BLUEFOG_LOG_LEVEL", "chatty", 1);  // Bluefog maps what it does not know to warning
  EXPECT_EQ(*r.GetText("WEFT_LOG_LEVEL"), "warning");
  ASSERT_TRUE(r.Set("WEFT_LOG_LEVEL", "info").ok());  // an override wins
  EXPECT_FALSE(r.FromAlias("WEFT_LOG_LEVEL"));
  r.Unset("WEFT_LOG_LEVEL");
  setenv("WEFT_LOG_LEVEL", "debug", 1);  // weft's own wins
  EXPECT_EQ(*r.GetText("WEFT_LOG_LEVEL"), "debug");
  EXPECT_FALSE(r.FromAlias("WEFT_LOG_LEVEL"));
  unsetenv("WEFT_LOG_LEVEL");
  unsetenv("BLUEFOG_LOG_LEVEL");
  ASSERT_TRUE(r.Reload().ok());
  EXPECT_EQ(Registry::AliasOf("WEFT_FUSION_THRESHOLD_BYTES"), "BLUEFOG_FUSION_THRESHOLD");
  EXPECT_EQ(Registry::AliasOf("WEFT_TEST_INT"), "");
  EXPECT_FALSE(r.FromAlias("WEFT_TEST_INT"));

  setenv("BLUEFOG_MAX_WIN_SENT_LENGTH", "10", 1);
  setenv("BLUEFOG_TIMELINE", "/tmp/t", 1);
  auto ignored = Registry::IgnoredBluefogEnvironment();
  EXPECT_NE(std::find(ignored.begin(), ignored.end(), "BLUEFOG_MAX_WIN_SENT_LENGTH"),
            ignored.end());
  EXPECT_EQ(std::find(ignored.begin(), ignored.end(), "BLUEFOG_TIMELINE"), ignored.end());
  unsetenv("BLUEFOG_MAX_WIN_SENT_LENGTH");
  unsetenv("BLUEFOG_TIMELINE");
}

}  // namespace
}  // namespace config
}  // namespace weft
