#include "pipe/planner/tool.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace weft {
namespace planner {
namespace {

struct Result {
  int code;
  std::string out;
  std::string err;
};

Result WeftPlan(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = RunWeftPlan(args, out, err);
  return {code, out.str(), err.str()};
}

TEST(ToolTest, HelpDocumentsEveryOptionAndTheCostModel) {
  const Result r = WeftPlan({"--help"});
  EXPECT_EQ(r.code, kExitOk);
  for (const char* option :
       {"--model",   "--layers", "--list-models", "--machines",      "--devices",
        "--k0",      "--alpha",  "--epochs",      "--micro-batches", "--strategy",
        "--compare", "--lambda", "--cache",       "--schedule",      "--batch",
        "--tokens",  "--flops",  "--bandwidth",   "--svg",           "--help"}) {
    EXPECT_TRUE(absl::StrContains(r.out, option)) << option;
  }
  EXPECT_TRUE(absl::StrContains(r.out, "2 x params x tokens / flops"));
  EXPECT_TRUE(absl::StrContains(r.out, "(M + K - 1)"));
  EXPECT_TRUE(absl::StrContains(r.out, "2 (R - 1) / R x 4 bytes"));
  EXPECT_TRUE(absl::StrContains(r.out, "Not modelled"));
  EXPECT_EQ(WeftPlan({"-h"}).out, r.out);
}

TEST(ToolTest, ListsThePresets) {
  const Result r = WeftPlan({"--list-models"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  for (const std::string& name : PresetNames()) EXPECT_TRUE(absl::StrContains(r.out, name));
  EXPECT_TRUE(absl::StrContains(r.out, "86.57M"));
}

TEST(ToolTest, PlansAPresetWithInlineValues) {
  const Result r = WeftPlan({"--model", "gpt2", "--machines=2", "--alpha=1/3", "--epochs", "4",
                             "--micro-batches", "16", "--strategy", "greedy"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "GPT-2 small")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "strategy greedy"));
  EXPECT_TRUE(absl::StrContains(r.out, "PLAN epoch=3 "));
  EXPECT_TRUE(absl::StrContains(r.out, "micro_batches=16 "));
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST(ToolTest, PlansALayerFile) {
  const Result r =
      WeftPlan({"--layers", "pipe/planner/testdata/tiny.csv", "--devices", "4", "--epochs", "3"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "measured times"));
  EXPECT_TRUE(absl::StrContains(r.out, "PLAN_SUMMARY epochs=3 units=6 "));
}

TEST(ToolTest, ComparesStrategies) {
  const Result r = WeftPlan({"--model", "bert-base", "--machines", "2", "--compare"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "COMPARE strategy=optimal"));
  EXPECT_TRUE(absl::StrContains(r.out, "COMPARE strategy=greedy"));
  EXPECT_TRUE(absl::StrContains(r.out, "COMPARE strategy=even"));
}

TEST(ToolTest, WritesTheSvg) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/tool_test.svg";
  const Result r = WeftPlan({"--model", "vit-b16", "--svg", path, "--schedule", "1f1b"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  std::ifstream in(path);
  std::stringstream svg;
  svg << in.rdbuf();
  EXPECT_TRUE(absl::StartsWith(svg.str(), "<?xml version=\"1.0\""));
  EXPECT_TRUE(absl::StrContains(svg.str(), "<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_TRUE(absl::StrContains(svg.str(), "1F1B schedule"));
  EXPECT_TRUE(absl::EndsWith(svg.str(), "</svg>\n"));
  EXPECT_TRUE(absl::StrContains(r.err, "drew the plan in"));

  const Result bad = WeftPlan({"--model", "vit-b16", "--svg", "/nonexistent-dir/x.svg"});
  EXPECT_EQ(bad.code, kExitError);
  EXPECT_TRUE(absl::StrContains(bad.err, "cannot write the picture to /nonexistent-dir/x.svg"));
}

struct Bad {
  std::vector<std::string> args;
  int code;
  const char* expected;
};

TEST(ToolTest, BadCommandLinesAndInputsExitNonZeroAndSayWhy) {
  const Bad cases[] = {
      {{}, kExitUsage, "expected --model NAME or --layers FILE, found neither"},
      {{"--model", "vit-b16", "--layers", "x.csv"}, kExitUsage, "found both"},
      {{"--model"}, kExitUsage, "missing value after --model"},
      {{"--model", "vit-b16", "--bogus"},
       kExitUsage,
       "unknown option --bogus (weft-plan --help lists them)"},
      {{"--model", "vit-b16", "--k0", "0"}, kExitUsage, "--k0: 0 is out of range; expected >= 1"},
      {{"--model", "vit-b16", "--k0", "two"}, kExitUsage, "--k0: expected an integer, got 'two'"},
      {{"--model", "vit-b16", "--alpha", "third"},
       kExitUsage,
       "--alpha: expected a number or a fraction (such as 0.25, 1e14 or 1/3), got 'third'"},
      {{"--model", "vit-b16", "--alpha", "1/0"},
       kExitUsage,
       "--alpha: expected a number or a fraction"},
      {{"--model", "vit-b16", "--tokens", "0"},
       kExitUsage,
       "--tokens: 0 is out of range; expected > 0"},
      {{"--model", "vit-b16", "--strategy", "best"},
       kExitUsage,
       "--strategy: expected one of optimal, greedy, even, got 'best'"},
      {{"--model", "vit-b16", "--schedule", "zb"},
       kExitUsage,
       "--schedule: expected one of gpipe, 1f1b, got 'zb'"},
      {{"--model", "vit-b16", "--cache=yes"}, kExitUsage, "--cache takes no value"},
      {{"--model", "vit-b16", "--alpha", "0"}, kExitError, "expected --alpha in (0, 1]"},
      {{"--model", "vit-b16", "--alpha", "1.01"}, kExitError, "expected --alpha in (0, 1]"},
      {{"--model", "vit-b16", "--machines", "-2"}, kExitError, "expected --machines in [1, 16384]"},
      {{"--model", "vit-b16", "--batch", "-1"}, kExitError, "expected --batch > 0"},
      {{"--model", "vit-b16", "--k0", "16"}, kExitError, "expected --k0 <= the world (1 machine"},
      {{"--model", "vit-b16", "--machines", "4", "--k0", "32"},
       kExitError,
       "expected at most as many stages as units, found K0 = 32 stages for 26 units"},
      {{"--model", "resnet"}, kExitError, "unknown model 'resnet'"},
      {{"--layers", "pipe/planner/testdata/bad_syntax.json"},
       kExitError,
       "pipe/planner/testdata/bad_syntax.json: line 3, column 40: expected a key after ','"},
      {{"--layers", "pipe/planner/testdata/bad_params.csv"},
       kExitError,
       "bad_params.csv: line 3: expected params >= 0 (a parameter count), found -4000000"},
      {{"--layers", "pipe/planner/testdata/missing.csv"},
       kExitError,
       "cannot open the layer file pipe/planner/testdata/missing.csv"},
  };
  for (const Bad& c : cases) {
    const Result r = WeftPlan(c.args);
    std::string args;
    for (const std::string& a : c.args) args += a + " ";
    EXPECT_EQ(r.code, c.code) << args << "\n" << r.err;
    EXPECT_TRUE(absl::StartsWith(r.err, "weft-plan: ")) << args << "\n" << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, c.expected))
        << args << "\n  got: " << r.err << "  wanted a part: " << c.expected;
    EXPECT_TRUE(r.out.empty()) << args;
  }
}

}  // namespace
}  // namespace planner
}  // namespace weft
