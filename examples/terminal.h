// Whether an example may draw a progress bar: only when its output ends on a terminal.
#ifndef WEFT_EXAMPLES_TERMINAL_H_
#define WEFT_EXAMPLES_TERMINAL_H_

#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace weft {
namespace examples {

// Open MPI gives every rank a pseudo-terminal even when mpirun's own output goes to a
// file, so a rank's isatty() alone would fill logs with bar frames; weftrun says where its
// output really goes in WEFTRUN_STDOUT_IS_TTY.
inline bool OutputIsATerminal() {
  if (!isatty(STDOUT_FILENO)) return false;
  const char* launcher = std::getenv("WEFTRUN_STDOUT_IS_TTY");
  return launcher == nullptr || std::strcmp(launcher, "0") != 0;
}

}  // namespace examples
}  // namespace weft

#endif  // WEFT_EXAMPLES_TERMINAL_H_
