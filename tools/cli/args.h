// Option values for weft's command-line programs (the examples, the benchmarks): the whole
// argument must be a number of the expected kind and range, else an error that names the
// option and the text. One policy for every program; atoi and atof read "abc" as 0 and
// "8x" as 8 without a word.
#ifndef WEFT_TOOLS_CLI_ARGS_H_
#define WEFT_TOOLS_CLI_ARGS_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "core/status.h"

namespace weft {
namespace cli {

// A decimal integer in [min, max].
inline StatusOr<int64_t> Int(absl::string_view option, absl::string_view text,
                             int64_t min = std::numeric_limits<int64_t>::min(),
                             int64_t max = std::numeric_limits<int64_t>::max()) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(text, &v)) {
    return InvalidArgument(option, ": expected an integer, got '", text, "'");
  }
  if (v < min || v > max) {
    return InvalidArgument(option, ": ", v, " is out of range; expected ", min, "..", max);
  }
  return v;
}

// A finite number in [min, max].
inline StatusOr<double> Real(absl::string_view option, absl::string_view text,
                             double min = -std::numeric_limits<double>::max(),
                             double max = std::numeric_limits<double>::max()) {
  double v = 0;
  if (!absl::SimpleAtod(text, &v) || !std::isfinite(v)) {
    return InvalidArgument(option, ": expected a number, got '", text, "'");
  }
  if (v < min || v > max) {
    return InvalidArgument(option, ": ", v, " is out of range; expected ", min, "..", max);
  }
  return v;
}

}  // namespace cli
}  // namespace weft

#endif  // WEFT_TOOLS_CLI_ARGS_H_
