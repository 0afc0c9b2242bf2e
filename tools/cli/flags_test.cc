#include "tools/cli/flags.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace weft {
namespace cli {
namespace {

struct Options {
  int64_t samples = 8192;
  int epochs = 8;
  uint64_t seed = 1;
  double lr = 0.05;
  std::string optimizer = "awc";
  std::string cache_dir;
  bool dynamic = true;
  bool quiet = false;
};

class FlagSetTest : public ::testing::Test {
 protected:
  FlagSetTest() : flags_("train", "Trains an MLP.") {
    flags_.Int("--samples", &o_.samples, "samples per rank", 1)
        .Int("--epochs", &o_.epochs, "epochs", 1, 1000)
        .Alias("-e")
        .Uint("--seed", &o_.seed, "random seed")
        .Real("--lr", &o_.lr, "learning rate", 0)
        .String("--optimizer", &o_.optimizer, "the optimizer", {"awc", "atc"})
        .String("--cache-dir", &o_.cache_dir, "where to spill")
        .Set("--static", &o_.dynamic, false, "the static topology")
        .Set("--quiet", &o_.quiet, true, "machine-readable lines");
  }
  Status Parse(std::vector<std::string> args) { return flags_.Parse(args); }
  static std::string Message(const Status& s) { return std::string(s.message()); }

  Options o_;
  FlagSet flags_;
};

TEST_F(FlagSetTest, ReadsEveryKindInBothSpellings) {
  ASSERT_TRUE(Parse({"--samples", "100", "--epochs=3", "--seed", "7", "--lr=1e-3", "--optimizer",
                     "atc", "--cache-dir", "/tmp/x", "--static", "--quiet"})
                  .ok());
  EXPECT_EQ(o_.samples, 100);
  EXPECT_EQ(o_.epochs, 3);
  EXPECT_EQ(o_.seed, 7u);
  EXPECT_DOUBLE_EQ(o_.lr, 1e-3);
  EXPECT_EQ(o_.optimizer, "atc");
  EXPECT_EQ(o_.cache_dir, "/tmp/x");
  EXPECT_FALSE(o_.dynamic);
  EXPECT_TRUE(o_.quiet);
  EXPECT_TRUE(flags_.given("--epochs"));
  EXPECT_FALSE(flags_.help_requested());
}

TEST_F(FlagSetTest, KeepsDefaultsAndAcceptsAliases) {
  ASSERT_TRUE(Parse({"-e", "5"}).ok());
  EXPECT_EQ(o_.epochs, 5);
  EXPECT_TRUE(flags_.given("--epochs"));
  EXPECT_FALSE(flags_.given("--samples"));
  EXPECT_EQ(o_.samples, 8192);
  EXPECT_TRUE(o_.dynamic);
}

TEST_F(FlagSetTest, RefusesBadValuesNamingTheOption) {
  EXPECT_EQ(Message(Parse({"--epochs", "abc"})), "--epochs: expected an integer, got 'abc'");
  EXPECT_EQ(Message(Parse({"--samples", "64x"})), "--samples: expected an integer, got '64x'");
  EXPECT_EQ(Message(Parse({"--epochs", "0"})), "--epochs: 0 is out of range; expected 1..1000");
  EXPECT_EQ(Message(Parse({"--lr", "fast"})), "--lr: expected a number, got 'fast'");
  EXPECT_EQ(Message(Parse({"--lr", "-1"})).find("--lr: -1 is out of range"), 0u);
  EXPECT_EQ(Message(Parse({"--seed", "-1"})).find("--seed: -1 is out of range"), 0u);
  EXPECT_EQ(Message(Parse({"--optimizer", "sgd"})),
            "--optimizer: expected one of awc, atc, got 'sgd'");
  EXPECT_EQ(Message(Parse({"--epochs"})), "missing value after --epochs");
  EXPECT_EQ(Message(Parse({"--static=1"})), "--static takes no value");
  EXPECT_EQ(Message(Parse({"--bogus", "1"})), "unknown option --bogus (train --help lists them)");
  EXPECT_EQ(Message(Parse({"stray"})), "unknown option stray (train --help lists them)");
}

TEST_F(FlagSetTest, HelpListsOptionsWithDefaults) {
  ASSERT_TRUE(Parse({"--epochs", "2", "--help", "--bogus"}).ok());
  EXPECT_TRUE(flags_.help_requested());
  const std::string help = flags_.Help();
  EXPECT_EQ(help.find("Trains an MLP.\n\nOptions:\n"), 0u);
  EXPECT_NE(help.find("--epochs, -e N"), std::string::npos);
  EXPECT_NE(help.find("epochs (default 8)"), std::string::npos);  // declared defaults
  EXPECT_NE(help.find("--optimizer awc|atc"), std::string::npos);
  EXPECT_NE(help.find("where to spill (default none)"), std::string::npos);
  EXPECT_NE(help.find("--static"), std::string::npos);
}

}  // namespace
}  // namespace cli
}  // namespace weft
