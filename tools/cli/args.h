// Option values for weft's command-line programs (the examples, the benchmarks): the whole
// argument must be a number of the expected kind and range, else an error that names the
// option and the text. One policy for every program; atoi and atof read "abc" as 0 and
// "8x" as 8 without a word.
#ifndef WEFT_TOOLS_CLI_ARGS_H_
#define WEFT_TOOLS_CLI_ARGS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "core/status.h"

namespace weft {
namespace cli {

namespace internal {

// The number as text alone: no spaces, no leading '+', no hexadecimal (which the absl
// readers would otherwise take: " 8", "+8", "0x10").
inline bool Plain(absl::string_view text) {
  if (text.empty() || text[0] == '+') return false;
  if (std::any_of(text.begin(), text.end(), absl::ascii_isspace)) return false;
  absl::string_view digits = text[0] == '-' ? text.substr(1) : text;
  return !(digits.size() > 1 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X'));
}

// The shortest text that reads back as `v` (1281167, not 1.28117e+06).
inline std::string ShowReal(double v) {
  for (int digits = 6; digits < 17; ++digits) {
    std::string text = absl::StrFormat("%.*g", digits, v);
    if (std::strtod(text.c_str(), nullptr) == v) return text;
  }
  return absl::StrFormat("%.17g", v);
}
inline std::string Show(int64_t v) { return absl::StrCat(v); }
inline std::string Show(double v) { return ShowReal(v); }

// What an out-of-range value should have been: "1..10", ">= 1" (no upper bound but the
// type's), "<= 10".
template <typename T>
std::string RangeText(T min, T max, T lowest, T highest) {
  if (min == lowest && max != highest) return absl::StrCat("<= ", Show(max));
  if (max == highest && min != lowest) return absl::StrCat(">= ", Show(min));
  return absl::StrCat(Show(min), "..", Show(max));
}

template <typename T>
Status OutOfRange(absl::string_view option, T v, T min, T max, T lowest, T highest) {
  return InvalidArgument(option, ": ", Show(v), " is out of range; expected ",
                         RangeText(min, max, lowest, highest));
}

}  // namespace internal

// A decimal integer in [min, max].
inline StatusOr<int64_t> Int(absl::string_view option, absl::string_view text,
                             int64_t min = std::numeric_limits<int64_t>::min(),
                             int64_t max = std::numeric_limits<int64_t>::max()) {
  int64_t v = 0;
  if (!internal::Plain(text) || !absl::SimpleAtoi(text, &v)) {
    return InvalidArgument(option, ": expected an integer, got '", text, "'");
  }
  if (v < min || v > max) {
    return internal::OutOfRange(option, v, min, max, std::numeric_limits<int64_t>::min(),
                                std::numeric_limits<int64_t>::max());
  }
  return v;
}

// A finite number in [min, max].
inline StatusOr<double> Real(absl::string_view option, absl::string_view text,
                             double min = -std::numeric_limits<double>::max(),
                             double max = std::numeric_limits<double>::max()) {
  double v = 0;
  if (!internal::Plain(text) || !absl::SimpleAtod(text, &v) || !std::isfinite(v)) {
    return InvalidArgument(option, ": expected a number, got '", text, "'");
  }
  if (v < min || v > max) {
    return internal::OutOfRange(option, v, min, max, -std::numeric_limits<double>::max(),
                                std::numeric_limits<double>::max());
  }
  return v;
}

// A finite number in [min, max], given as a decimal number or as a fraction of two ("1/3"
// for a third, which no decimal states exactly).
inline StatusOr<double> Fraction(absl::string_view option, absl::string_view text,
                                 double min = -std::numeric_limits<double>::max(),
                                 double max = std::numeric_limits<double>::max()) {
  const size_t slash = text.find('/');
  double v = 0;
  bool ok = false;
  if (slash == absl::string_view::npos) {
    ok = internal::Plain(text) && absl::SimpleAtod(text, &v) && std::isfinite(v);
  } else {
    double num = 0, den = 0;
    ok = internal::Plain(text.substr(0, slash)) && internal::Plain(text.substr(slash + 1)) &&
         absl::SimpleAtod(text.substr(0, slash), &num) &&
         absl::SimpleAtod(text.substr(slash + 1), &den) && std::isfinite(num) &&
         std::isfinite(den) && den != 0;
    v = ok ? num / den : 0;
    ok = ok && std::isfinite(v);
  }
  if (!ok) {
    return InvalidArgument(
        option, ": expected a number or a fraction (such as 0.25, 1e14 or 1/3), got '", text, "'");
  }
  if (v < min || v > max) {
    return internal::OutOfRange(option, v, min, max, -std::numeric_limits<double>::max(),
                                std::numeric_limits<double>::max());
  }
  return v;
}

}  // namespace cli
}  // namespace weft

#endif  // WEFT_TOOLS_CLI_ARGS_H_
