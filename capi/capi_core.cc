// Status codes, errors, version, configuration and timeline control of the C ABI.
#include <string>

#include "capi/internal.h"
#include "comm/comm.h"
#include "core/config.h"

namespace weft {
namespace capi {
namespace {

thread_local std::string t_last_error;
thread_local std::string t_returned;

// weft_status k stands for kCodes[k]; Fail maps absl's other codes as CodeOf says.
constexpr absl::StatusCode kCodes[] = {
    absl::StatusCode::kOk,                 absl::StatusCode::kInvalidArgument,
    absl::StatusCode::kFailedPrecondition, absl::StatusCode::kNotFound,
    absl::StatusCode::kOutOfRange,         absl::StatusCode::kUnimplemented,
    absl::StatusCode::kDeadlineExceeded,   absl::StatusCode::kAborted,
    absl::StatusCode::kUnavailable,        absl::StatusCode::kResourceExhausted,
    absl::StatusCode::kInternal,           absl::StatusCode::kUnknown};
static_assert(sizeof kCodes / sizeof kCodes[0] == WEFT_ERR_UNKNOWN + 1, "one code per status");

weft_status CodeOf(absl::StatusCode code) {
  if (code == absl::StatusCode::kCancelled) return WEFT_ERR_ABORTED;
  if (code == absl::StatusCode::kDataLoss) return WEFT_ERR_INTERNAL;
  for (int k = 0; k <= WEFT_ERR_UNKNOWN; ++k) {
    if (kCodes[k] == code) return static_cast<weft_status>(k);
  }
  return WEFT_ERR_UNKNOWN;
}

}  // namespace

weft_status Fail(const Status& status) {
  if (status.ok()) return WEFT_OK;
  t_last_error.assign(status.message().data(), status.message().size());
  return CodeOf(status.code());
}

absl::StatusCode StatusCodeOf(weft_status code) {
  const int k = EnumValue(code);
  return k >= 0 && k <= WEFT_ERR_UNKNOWN ? kCodes[k] : absl::StatusCode::kUnknown;
}

weft_status FailInvalid(const std::string& message) { return Fail(InvalidArgument(message)); }

const char* KeepString(std::string text) {
  t_returned = std::move(text);
  return t_returned.c_str();
}

Status CheckVersion(unsigned int version, unsigned int current, const char* function,
                    const char* type, const char* init) {
  if (version >= 1 && version <= current) return OkStatus();
  return InvalidArgument(function, ": ", type, ".version is ", version, ", expected 1..",
                         current, "; initialize the struct with ", init);
}

StatusOr<std::map<int, double>> WeightMap(const int* ranks, const double* weights, size_t n,
                                          const char* function, const char* what) {
  if (n > 0 && ranks == nullptr) {
    return InvalidArgument(function, ": ", n, " ", what, " given but the rank array is NULL");
  }
  std::map<int, double> map;
  for (size_t k = 0; k < n; ++k) {
    if (!map.emplace(ranks[k], weights == nullptr ? 1.0 : weights[k]).second) {
      return InvalidArgument(function, ": rank ", ranks[k], " appears twice in ", what);
    }
  }
  return map;
}

Status Required(const void* pointer, const char* function, const char* argument) {
  if (pointer != nullptr) return OkStatus();
  return InvalidArgument(function, ": ", argument, " is NULL");
}

StatusOr<TensorView> View(const DLTensor* tensor, const char* function, const char* argument) {
  WEFT_RETURN_IF_ERROR(Required(tensor, function, argument));
  auto view = TensorView::FromDLTensor(*tensor);
  if (!view.ok()) return Annotate(view.status(), absl::StrCat(function, ": ", argument));
  return view;
}

}  // namespace capi
}  // namespace weft

using weft::capi::Guard;
using weft::capi::Required;

extern "C" {

const char* weft_status_string(weft_status status) {
  switch (weft::capi::EnumValue(status)) {  // any int a C caller passed
    case WEFT_OK: return "ok";
    case WEFT_ERR_INVALID_ARGUMENT: return "invalid argument";
    case WEFT_ERR_FAILED_PRECONDITION: return "failed precondition";
    case WEFT_ERR_NOT_FOUND: return "not found";
    case WEFT_ERR_OUT_OF_RANGE: return "out of range";
    case WEFT_ERR_UNIMPLEMENTED: return "unimplemented";
    case WEFT_ERR_DEADLINE_EXCEEDED: return "deadline exceeded";
    case WEFT_ERR_ABORTED: return "aborted";
    case WEFT_ERR_UNAVAILABLE: return "unavailable";
    case WEFT_ERR_RESOURCE_EXHAUSTED: return "resource exhausted";
    case WEFT_ERR_INTERNAL: return "internal error";
    case WEFT_ERR_UNKNOWN: return "unknown error";
  }
  return "unknown status code";
}

const char* weft_last_error(void) { return weft::capi::t_last_error.c_str(); }

#define WEFT_STRINGIFY_(x) #x
#define WEFT_STRINGIFY(x) WEFT_STRINGIFY_(x)
const char* weft_version(void) {
  return WEFT_STRINGIFY(WEFT_VERSION_MAJOR) "." WEFT_STRINGIFY(
      WEFT_VERSION_MINOR) "." WEFT_STRINGIFY(WEFT_VERSION_PATCH);
}

int weft_version_number(void) { return WEFT_VERSION_NUMBER; }

weft_status weft_config_set(const char* name, const char* value) {
  return Guard("weft_config_set", [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(name, "weft_config_set", "name"));
    WEFT_RETURN_IF_ERROR(Required(value, "weft_config_set", "value"));
    return weft::config::Registry::Global().Set(name, value);
  });
}

weft_status weft_config_unset(const char* name) {
  return Guard("weft_config_unset", [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(name, "weft_config_unset", "name"));
    // Unset of an unknown name would silently do nothing: say it is not a setting.
    WEFT_RETURN_IF_ERROR(weft::config::Registry::Global().GetText(name).status());
    weft::config::Registry::Global().Unset(name);
    return weft::OkStatus();
  });
}

weft_status weft_config_get(const char** value, const char* name) {
  return Guard("weft_config_get", [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(value, "weft_config_get", "value"));
    WEFT_RETURN_IF_ERROR(Required(name, "weft_config_get", "name"));
    WEFT_ASSIGN_OR_RETURN(std::string text, weft::config::Registry::Global().GetText(name));
    *value = weft::capi::KeepString(std::move(text));
    return weft::OkStatus();
  });
}

const char* weft_config_describe(void) {
  try {
    return weft::capi::KeepString(weft::config::Registry::Global().Describe());
  } catch (...) {
    return "";
  }
}

weft_status weft_timeline_start(const char* path) {
  return Guard("weft_timeline_start", [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(path, "weft_timeline_start", "path"));
    return weft::timeline_start(path);
  });
}

weft_status weft_timeline_stop(void) {
  return Guard("weft_timeline_stop", [&] { return weft::timeline_stop(); });
}

weft_status weft_timeline_start_activity(const char* tensor_name, const char* activity) {
  return Guard("weft_timeline_start_activity", [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(tensor_name, "weft_timeline_start_activity", "tensor_name"));
    WEFT_RETURN_IF_ERROR(Required(activity, "weft_timeline_start_activity", "activity"));
    return weft::timeline_start_activity(tensor_name, activity);
  });
}

weft_status weft_timeline_end_activity(const char* tensor_name) {
  return Guard("weft_timeline_end_activity", [&]() -> weft::Status {
    WEFT_RETURN_IF_ERROR(Required(tensor_name, "weft_timeline_end_activity", "tensor_name"));
    return weft::timeline_end_activity(tensor_name);
  });
}

int weft_timeline_active(void) { return weft::timeline_active() ? 1 : 0; }

}  // extern "C"
