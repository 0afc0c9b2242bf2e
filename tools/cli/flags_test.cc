#include "tools/cli/flags.h"

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
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

TEST(FlagSetLayoutTest, SwitchesTakeNoPlaceholderAndTrailingSectionsShow) {
  bool quiet = false;
  FlagSet flags("p", "About.");
  flags.Set("--quiet", &quiet, true, "less output").Value("X").Section("notes");
  const std::string help = flags.Help();
  EXPECT_NE(help.find("  --quiet                   less output\n"), std::string::npos) << help;
  EXPECT_NE(help.find("\nnotes\n"), std::string::npos) << help;
}

TEST(FlagSetLayoutTest, ANewlineInHelpStartsALineUnderTheColumn) {
  int n = 3;
  FlagSet flags("p", "About.");
  flags.Int("--n", &n, "first line\nsecond line");
  EXPECT_NE(flags.Help().find("first line\n" + std::string(28, ' ') + "second line (default 3)\n"),
            std::string::npos)
      << flags.Help();
}

TEST(FlagSetLayoutTest, FractionsSectionsPlaceholdersAndWrapping) {
  double alpha = 1.0 / 3.0;
  int k0 = 0;
  std::string model;
  FlagSet flags("weft-plan", "Plans a pipeline.");
  flags.Section("model")
      .String("--model", &model, "a preset")
      .Value("NAME")
      .Section("plan")
      .Fraction("--alpha", &alpha, "freeze rate", 0, 1)
      .Int("--k0", &k0,
           "the initial pipeline length, a number of stages that the planner caps "
           "at the world and at the number of units of the model",
           1)
      .ShownDefault("--devices")
      .Epilogue("The cost model: ...\n");
  ASSERT_TRUE(flags.Parse({"--alpha", "1/4", "--k0=3", "--model", "gpt2"}).ok());
  EXPECT_DOUBLE_EQ(alpha, 0.25);
  EXPECT_EQ(k0, 3);
  EXPECT_EQ(std::string(flags.Parse({"--alpha", "3/2"}).message()),
            "--alpha: 1.5 is out of range; expected 0..1");
  EXPECT_EQ(std::string(flags.Parse({"--k0", "0"}).message()),
            "--k0: 0 is out of range; expected >= 1");
  const std::string help = flags.Help();
  EXPECT_EQ(help.find("Plans a pipeline.\n\nmodel\n  --model NAME "), 0u) << help;
  EXPECT_NE(help.find("\nplan\n  --alpha X"), std::string::npos) << help;
  // Defaults read back exactly: 1/3 as 0.3333333333333333, not 0.333333.
  EXPECT_NE(help.find("freeze rate (default 0.3333333333333333)"), std::string::npos) << help;
  EXPECT_NE(help.find("(default --devices)"), std::string::npos) << help;
  EXPECT_EQ(help.find("Options:"), std::string::npos) << help;
  EXPECT_NE(help.find("\n\nThe cost model: ...\n"), std::string::npos) << help;
  for (absl::string_view line : absl::StrSplit(help, '\n')) {
    EXPECT_LE(line.size(), 92u) << line;
  }
  // A default without spaces is never split from "(default".
  EXPECT_EQ(help.find("(default\n"), std::string::npos) << help;
  EXPECT_EQ(help.find(" \n"), std::string::npos) << help;  // no trailing spaces
  // The long help continues under its column.
  EXPECT_NE(help.find("\n" + std::string(28, ' ') + "caps at the world"), std::string::npos)
      << help;
  EXPECT_EQ(std::string(flags.Parse({"--k0", "9999999999"}).message()),
            "--k0: 9999999999 is out of range; expected 1..2147483647");
}

}  // namespace
}  // namespace cli
}  // namespace weft
