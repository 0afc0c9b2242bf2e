// A small strict JSON reader (RFC 8259) for weft-plan's layer files: no comments, no
// trailing commas, no NaN, no duplicate keys, nothing after the value. Every value keeps the
// line and column where it starts, so that a file that parses but means something wrong can
// still point at the place. Errors name the line and column, what was expected and what was
// found.
#ifndef WEFT_PIPE_PLANNER_JSON_H_
#define WEFT_PIPE_PLANNER_JSON_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/status.h"

namespace weft {
namespace planner {

struct JsonValue {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;                                     // kString (UTF-8)
  std::vector<JsonValue> array;                           // kArray
  std::vector<std::pair<std::string, JsonValue>> object;  // kObject, in file order
  int line = 1;                                           // where the value starts, 1-based
  int column = 1;  // 1-based, in characters (UTF-8 code points)

  // The member named `key` of an object, or nullptr.
  const JsonValue* Find(absl::string_view key) const;
};

// "null", "true or false", "a number", "a string", "an array", "an object".
const char* JsonTypeName(JsonValue::Type type);

// Parses one JSON document. InvalidArgument "line L, column C: expected ..., found ..." for
// anything that is not strict JSON. Nesting deeper than 512 levels is refused.
StatusOr<JsonValue> ParseJson(absl::string_view text);

}  // namespace planner
}  // namespace weft

#endif  // WEFT_PIPE_PLANNER_JSON_H_
