#include "core/config.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace weft {
namespace config {
namespace {

const IntSetting kTestInt("WEFT_TEST_INT", 7, "An integer for this test.");
const BoolSetting kTestBool("WEFT_TEST_BOOL", false, "A flag for this test.");
const DoubleSetting kTestDouble("WEFT_TEST_DOUBLE", 1.5, "A number for this test.");
const StringSetting kTestChoice("WEFT_TEST_CHOICE", "b", "A choice for this test.",
                                {"a", "b", "c"});

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

TEST(Config, DescribeListsEverySettingAndUnknownVariablesAreReported) {
  const std::string table = Registry::Global().Describe();
  EXPECT_NE(table.find("WEFT_TEST_DOUBLE=1.5 (default)"), std::string::npos) << table;
  EXPECT_NE(table.find("WEFT_LOG_LEVEL"), std::string::npos) << table;
  setenv("WEFT_TEST_INTT", "1", 1);
  auto unknown = Registry::Global().UnknownEnvironment();
  EXPECT_NE(std::find(unknown.begin(), unknown.end(), "WEFT_TEST_INTT"), unknown.end());
  unsetenv("WEFT_TEST_INTT");
}

}  // namespace
}  // namespace config
}  // namespace weft
