#include "tools/cli/args.h"

#include <string>

#include "gtest/gtest.h"

namespace weft {
namespace cli {
namespace {

std::string Message(const Status& s) { return std::string(s.message()); }

TEST(CliArgs, IntegersWholeAndInRange) {
  EXPECT_EQ(*Int("--epochs", "8"), 8);
  EXPECT_EQ(*Int("--seed", "-3"), -3);
  EXPECT_EQ(Message(Int("--epochs", "abc").status()), "--epochs: expected an integer, got 'abc'");
  EXPECT_FALSE(Int("--epochs", "8x").ok());
  EXPECT_FALSE(Int("--epochs", "").ok());
  EXPECT_FALSE(Int("--epochs", "1.5").ok());
  EXPECT_FALSE(Int("--epochs", "99999999999999999999").ok());
  EXPECT_EQ(Message(Int("--epochs", "0", 1).status()),
            "--epochs: 0 is out of range; expected 1..9223372036854775807");
  EXPECT_FALSE(Int("--dim", "11", 1, 10).ok());
}

TEST(CliArgs, RealsFiniteAndInRange) {
  EXPECT_DOUBLE_EQ(*Real("--lr", "0.05"), 0.05);
  EXPECT_DOUBLE_EQ(*Real("--lr", "1e-3"), 1e-3);
  EXPECT_EQ(Message(Real("--lr", "fast").status()), "--lr: expected a number, got 'fast'");
  EXPECT_FALSE(Real("--lr", "nan").ok());
  EXPECT_FALSE(Real("--lr", "inf").ok());
  EXPECT_FALSE(Real("--lr", "0.1.2").ok());
  EXPECT_FALSE(Real("--target", "1.5", 0, 1).ok());
}

}  // namespace
}  // namespace cli
}  // namespace weft
