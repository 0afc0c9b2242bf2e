// The weft-plan command line, as a library function so that tests can run it in-process.
#ifndef WEFT_PIPE_PLANNER_TOOL_H_
#define WEFT_PIPE_PLANNER_TOOL_H_

#include <iosfwd>
#include <string>
#include <vector>

#include "core/status.h"
#include "pipe/planner/planner.h"

namespace weft {
namespace planner {

struct CommandLine {
  bool help = false;
  bool list_models = false;
  bool compare = false;
  bool ablation = false;  // --ablation
  std::string model;   // --model NAME
  std::string layers;  // --layers FILE
  std::string svg;     // --svg FILE
  PlannerOptions options;
};

// Exit codes of weft-plan.
constexpr int kExitOk = 0;
constexpr int kExitError = 1;  // the input or the plan is invalid
constexpr int kExitUsage = 2;  // the command line does not parse

// Parses the arguments after the program name. InvalidArgument for an unknown option, a
// missing or malformed value, or --model and --layers together / neither.
StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& args);

std::string HelpText();

// Runs weft-plan: the report on `out`, errors on `err`; returns the exit code.
int RunWeftPlan(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace planner
}  // namespace weft

#endif  // WEFT_PIPE_PLANNER_TOOL_H_
