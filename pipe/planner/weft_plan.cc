// weft-plan: see pipe/planner/README.md or `weft-plan --help`.
#include <iostream>
#include <string>
#include <vector>

#include "pipe/planner/tool.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  return weft::planner::RunWeftPlan(args, std::cout, std::cerr);
}
