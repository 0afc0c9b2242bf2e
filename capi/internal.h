// What the C entry points share: status translation, the thread-local last error and
// returned strings, tensor and array conversions. Internal to capi/ (not installed).
#ifndef WEFT_CAPI_INTERNAL_H_
#define WEFT_CAPI_INTERNAL_H_

#include <cstring>
#include <exception>
#include <map>
#include <new>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/refuse.h"
#include "comm/topology.h"
#include "core/status.h"
#include "core/tensor.h"
#include "weft/weft.h"

// The opaque topology handle of the C ABI.
struct weft_topology {
  weft::Topology topo;
};

namespace weft {
namespace capi {

// The integer a C caller stored in an enum-typed argument or field. C lets any int through
// (WEFT_PIPE_STRATEGY_EVEN + 5 included), but in C++ reading an enum outside its
// enumerators' range is undefined behaviour, so the checks read the bytes instead.
template <typename Enum>
int EnumValue(const Enum& e) {
  static_assert(sizeof(Enum) == sizeof(int), "C enums are int-sized here");
  int value;
  std::memcpy(&value, &e, sizeof value);
  return value;
}

// Records `status` as this thread's last error and returns its code (WEFT_OK for OK).
weft_status Fail(const Status& status);
weft_status FailInvalid(const std::string& message);
// The Status code a weft_status stands for (the inverse of what Fail returns).
absl::StatusCode StatusCodeOf(weft_status code);

// Keeps `text` in thread-local storage until the next call that returns a string.
const char* KeepString(std::string text);

// Runs `body` (returning Status) and translates its result; no exception escapes.
template <typename Body>
weft_status Guard(const char* function, Body&& body) noexcept {
  try {
    Status status = body();
    return status.ok() ? WEFT_OK : Fail(status);
  } catch (const std::bad_alloc&) {
    return Fail(absl::ResourceExhaustedError(absl::StrCat(function, ": out of memory")));
  } catch (const std::exception& e) {
    return Fail(Internal(function, ": unexpected exception: ", e.what()));
  } catch (...) {
    return Fail(Internal(function, ": unexpected exception"));
  }
}

// Wraps a started op in a new request for the caller (capi_comm.cc).
Status EmitRequest(weft_request** request, StatusOr<Handle> handle);

// weft_<x>_options_init: writes `defaults` (the library's, for the struct's current
// version) into *options for a caller compiled against `version`. Every struct is at its
// first version, so the whole struct is written; a later version will write only the
// fields an older caller's struct has.
template <typename T>
weft_status InitOptions(T* options, unsigned int version, unsigned int current,
                        const char* function, const char* version_macro, const T& defaults) {
  return Guard(function, [&]() -> Status {
    if (options == nullptr) return InvalidArgument(function, ": options is NULL");
    if (version < 1 || version > current) {
      return InvalidArgument(function, ": version is ", version, ", expected 1..", current,
                             "; pass ", version_macro, " from the header you compiled with");
    }
    *options = defaults;
    options->version = version;
    return OkStatus();
  });
}

// A versioned option struct: `version` must be 1..current; the error names the _INIT macro.
Status CheckVersion(unsigned int version, unsigned int current, const char* function,
                    const char* type, const char* init);

// (ranks[k], weights[k]) pairs as a map; duplicate ranks are an error (a map would keep one
// of them silently). `weights` NULL means 1 for each rank.
StatusOr<std::map<int, double>> WeightMap(const int* ranks, const double* weights, size_t n,
                                          const char* function, const char* what);

// A required pointer argument; the error names the function and the argument.
Status Required(const void* pointer, const char* function, const char* argument);

// A DLTensor borrowed as a view.
StatusOr<TensorView> View(const DLTensor* tensor, const char* function, const char* argument);

inline const char* NameOrEmpty(const char* name) { return name == nullptr ? "" : name; }

// What identifies an op across ranks, for refusing it in its place (comm/refuse.h).
inline comm::OpIdentity Identity(comm::OpType op, const char* name, const int* ranks = nullptr,
                                 size_t num_ranks = 0) {
  comm::OpIdentity id;
  id.op = op;
  id.name = NameOrEmpty(name);
  if (ranks != nullptr) id.ranks.assign(ranks, ranks + num_ranks);
  return id;
}

// Copies `values` into a caller buffer and sets *count. A NULL buffer with capacity 0 only
// asks for the count; a buffer too small fails, writing nothing.
template <typename T>
Status CopyOut(const std::vector<T>& values, T* buffer, size_t capacity, size_t* count,
               const char* function) {
  if (count == nullptr) return InvalidArgument(function, ": count is NULL");
  *count = values.size();
  if (buffer == nullptr && capacity == 0) return OkStatus();
  if (values.size() > capacity) {
    return absl::OutOfRangeError(absl::StrCat(function, ": the buffer holds ", capacity,
                                              " elements but ", values.size(),
                                              " are needed (call with capacity ",
                                              values.size(), ")"));
  }
  if (!values.empty()) {
    if (buffer == nullptr) return InvalidArgument(function, ": the buffer is NULL");
    std::memcpy(buffer, values.data(), values.size() * sizeof(T));
  }
  return OkStatus();
}

}  // namespace capi
}  // namespace weft

namespace weft {
namespace pipe {
struct Plan;
}
namespace capi {
// The plan's summary as the C ABI reports it (capi_pipe.cc; the trainer reports its own
// plan the same way).
void FillPlanInfo(const pipe::Plan& plan, weft_pipe_plan_info* info);
}  // namespace capi
}  // namespace weft

#endif  // WEFT_CAPI_INTERNAL_H_
