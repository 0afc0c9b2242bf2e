#include "tools/cli/args.h"

#include <limits>
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
            "--epochs: 0 is out of range; expected >= 1");
  EXPECT_EQ(Message(Int("--dim", "11", 1, 10).status()),
            "--dim: 11 is out of range; expected 1..10");
  EXPECT_EQ(Message(Int("--dim", "11", std::numeric_limits<int64_t>::min(), 10).status()),
            "--dim: 11 is out of range; expected <= 10");
}

TEST(CliArgs, RealsFiniteAndInRange) {
  EXPECT_DOUBLE_EQ(*Real("--lr", "0.05"), 0.05);
  EXPECT_DOUBLE_EQ(*Real("--lr", "1e-3"), 1e-3);
  EXPECT_EQ(Message(Real("--lr", "fast").status()), "--lr: expected a number, got 'fast'");
  EXPECT_FALSE(Real("--lr", "nan").ok());
  EXPECT_FALSE(Real("--lr", "inf").ok());
  EXPECT_FALSE(Real("--lr", "0.1.2").ok());
  EXPECT_EQ(Message(Real("--target", "1.5", 0, 1).status()),
            "--target: 1.5 is out of range; expected 0..1");
  EXPECT_EQ(Message(Real("--lr", "-1", 0).status()), "--lr: -1 is out of range; expected >= 0");
}

TEST(CliArgs, TheNumberAlone) {
  // What the absl readers would take but a number on a command line is not.
  for (const char* text : {"+8", " 8", "8 ", "0x10", "-0x10", ""}) {
    EXPECT_FALSE(Int("--n", text).ok()) << "'" << text << "'";
    EXPECT_FALSE(Real("--x", text).ok()) << "'" << text << "'";
    EXPECT_FALSE(Fraction("--x", text).ok()) << "'" << text << "'";
  }
  EXPECT_FALSE(Fraction("--alpha", " 1/3").ok());
  EXPECT_FALSE(Fraction("--alpha", "1/ 3").ok());
  EXPECT_FALSE(Fraction("--alpha", "1/+3").ok());
  EXPECT_DOUBLE_EQ(*Real("--flops", "1e+10"), 1e10);
  EXPECT_DOUBLE_EQ(*Fraction("--x", "1/-4"), -0.25);
  EXPECT_EQ(*Int("--n", "-0"), 0);
  // Out-of-range numbers are shown as given, not rounded to six digits.
  EXPECT_EQ(Message(Real("--x", "1.0000001", 0, 1).status()),
            "--x: 1.0000001 is out of range; expected 0..1");
}

TEST(CliArgs, FractionsOrNumbers) {
  EXPECT_DOUBLE_EQ(*Fraction("--alpha", "1/3"), 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(*Fraction("--alpha", "0.25"), 0.25);
  EXPECT_DOUBLE_EQ(*Fraction("--flops", "1e14"), 1e14);
  EXPECT_DOUBLE_EQ(*Fraction("--x", "-1/4"), -0.25);
  EXPECT_EQ(Message(Fraction("--alpha", "third").status()),
            "--alpha: expected a number or a fraction (such as 0.25, 1e14 or 1/3), got 'third'");
  EXPECT_FALSE(Fraction("--alpha", "1/0").ok());
  EXPECT_FALSE(Fraction("--alpha", "1/").ok());
  EXPECT_FALSE(Fraction("--alpha", "/3").ok());
  EXPECT_FALSE(Fraction("--alpha", "1/3/4").ok());
  EXPECT_FALSE(Fraction("--alpha", "nan").ok());
  EXPECT_FALSE(Fraction("--alpha", "1e308/1e-308").ok());  // not finite
  EXPECT_EQ(Message(Fraction("--alpha", "3/2", 0, 1).status()),
            "--alpha: 1.5 is out of range; expected 0..1");
}

}  // namespace
}  // namespace cli
}  // namespace weft
