// Status and error propagation for all of weft: absl::Status inside, with helpers that
// make every error say what was expected, what was found and what to do.
#ifndef WEFT_CORE_STATUS_H_
#define WEFT_CORE_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace weft {

using Status = absl::Status;
template <typename T>
using StatusOr = absl::StatusOr<T>;

inline Status OkStatus() { return absl::OkStatus(); }

// Each helper concatenates its arguments with absl::StrCat.
template <typename... Args>
Status InvalidArgument(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}
template <typename... Args>
Status FailedPrecondition(const Args&... args) {
  return absl::FailedPreconditionError(absl::StrCat(args...));
}
template <typename... Args>
Status Unimplemented(const Args&... args) {
  return absl::UnimplementedError(absl::StrCat(args...));
}
template <typename... Args>
Status Internal(const Args&... args) {
  return absl::InternalError(absl::StrCat(args...));
}
template <typename... Args>
Status DeadlineExceeded(const Args&... args) {
  return absl::DeadlineExceededError(absl::StrCat(args...));
}
template <typename... Args>
Status Aborted(const Args&... args) {
  return absl::AbortedError(absl::StrCat(args...));
}

// Prefixes a context line to a failed status ("while X: <original>"), keeping its code:
// the breadcrumb NCCLCHECK leaves per frame.
Status Annotate(const Status& status, absl::string_view context);

}  // namespace weft

#define WEFT_STATUS_CONCAT_INNER_(a, b) a##b
#define WEFT_STATUS_CONCAT_(a, b) WEFT_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` yields a non-OK status.
#define WEFT_RETURN_IF_ERROR(expr)                          \
  do {                                                      \
    ::weft::Status weft_status_ = (expr);                   \
    if (!weft_status_.ok()) return weft_status_;            \
  } while (0)

// `WEFT_ASSIGN_OR_RETURN(auto x, MakeX());` unwraps a StatusOr or returns its error.
#define WEFT_ASSIGN_OR_RETURN(lhs, expr) \
  WEFT_ASSIGN_OR_RETURN_IMPL_(WEFT_STATUS_CONCAT_(weft_statusor_, __LINE__), lhs, expr)
#define WEFT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

#endif  // WEFT_CORE_STATUS_H_
