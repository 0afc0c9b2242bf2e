#include "pipe/planner/json.h"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/str_format.h"

namespace weft {
namespace planner {

const JsonValue* JsonValue::Find(absl::string_view key) const {
  for (const auto& member : object) {
    if (member.first == key) return &member.second;
  }
  return nullptr;
}

const char* JsonTypeName(JsonValue::Type type) {
  switch (type) {
    case JsonValue::Type::kNull:
      return "null";
    case JsonValue::Type::kBool:
      return "true or false";
    case JsonValue::Type::kNumber:
      return "a number";
    case JsonValue::Type::kString:
      return "a string";
    case JsonValue::Type::kArray:
      return "an array";
    case JsonValue::Type::kObject:
      return "an object";
  }
  return "?";
}

namespace {

constexpr int kMaxDepth = 512;

class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  StatusOr<JsonValue> Document() {
    // A UTF-8 byte order mark is allowed (RFC 8259 lets a parser ignore it).
    if (text_.substr(0, 3) == "\xEF\xBB\xBF") pos_ = 3;
    SkipSpace();
    if (AtEnd()) return Error("expected a JSON value (the file is empty)");
    JsonValue value;
    WEFT_RETURN_IF_ERROR(Value(&value, 0));
    SkipSpace();
    if (!AtEnd()) {
      return Error("expected the end of the document after the top-level value, found ", Found());
    }
    return value;
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return text_[pos_]; }

  // Advances one byte, keeping line and column (columns count code points, so a UTF-8
  // continuation byte does not move the column).
  void Advance() {
    const unsigned char c = static_cast<unsigned char>(text_[pos_++]);
    if (c == '\n') {
      ++line_;
      column_ = 1;
    } else if ((c & 0xC0) != 0x80) {
      ++column_;
    }
  }

  void SkipSpace() {
    while (!AtEnd() && (Peek() == ' ' || Peek() == '\t' || Peek() == '\n' || Peek() == '\r')) {
      Advance();
    }
  }

  // How to show the character at the current position in an error.
  std::string Found() const {
    if (AtEnd()) return "the end of the file";
    const unsigned char c = static_cast<unsigned char>(Peek());
    if (c < 0x20 || c == 0x7F) return absl::StrFormat("the control character 0x%02x", c);
    if (c >= 0x80) return "a non-ASCII character";
    return absl::StrFormat("'%c'", c);
  }

  template <typename... Args>
  Status Error(const Args&... args) const {
    return ErrorAt(line_, column_, args...);
  }
  template <typename... Args>
  Status ErrorAt(int line, int column, const Args&... args) const {
    return InvalidArgument("line ", line, ", column ", column, ": ", args...);
  }

  Status Value(JsonValue* out, int depth) {
    if (depth > kMaxDepth) {
      return Error("expected at most ", kMaxDepth, " levels of nested arrays and objects");
    }
    out->line = line_;
    out->column = column_;
    if (AtEnd()) return Error("expected a value, found the end of the file");
    switch (Peek()) {
      case '{':
        return Object(out, depth);
      case '[':
        return Array(out, depth);
      case '"':
        out->type = JsonValue::Type::kString;
        return String(&out->string);
      case 't':
        out->type = JsonValue::Type::kBool;
        out->boolean = true;
        return Literal("true");
      case 'f':
        out->type = JsonValue::Type::kBool;
        return Literal("false");
      case 'n':
        out->type = JsonValue::Type::kNull;
        return Literal("null");
      default:
        if (Peek() == '-' || (Peek() >= '0' && Peek() <= '9')) {
          out->type = JsonValue::Type::kNumber;
          return Number(&out->number);
        }
        return Error(
            "expected a value (object, array, string, number, true, false or null), "
            "found ",
            Found());
    }
  }

  Status Literal(absl::string_view word) {
    const int line = line_, column = column_;
    for (char c : word) {
      if (AtEnd() || Peek() != c) {
        return ErrorAt(line, column, "expected '", word, "', found ", Found(),
                       " (JSON literals are lowercase true, false and null)");
      }
      Advance();
    }
    return OkStatus();
  }

  static bool IsDigit(char c) { return c >= '0' && c <= '9'; }

  Status Number(double* out) {
    const int line = line_, column = column_;
    const size_t start = pos_;
    if (Peek() == '-') Advance();
    if (AtEnd() || !IsDigit(Peek())) return Error("expected a digit, found ", Found());
    if (Peek() == '0') {
      Advance();
      if (!AtEnd() && IsDigit(Peek())) {
        return Error("expected '.', 'e' or the end of the number after a leading 0, found ",
                     Found(), " (JSON numbers have no leading zeros)");
      }
    } else {
      while (!AtEnd() && IsDigit(Peek())) Advance();
    }
    if (!AtEnd() && Peek() == '.') {
      Advance();
      if (AtEnd() || !IsDigit(Peek())) {
        return Error("expected a digit after the decimal point, found ", Found());
      }
      while (!AtEnd() && IsDigit(Peek())) Advance();
    }
    if (!AtEnd() && (Peek() == 'e' || Peek() == 'E')) {
      Advance();
      if (!AtEnd() && (Peek() == '+' || Peek() == '-')) Advance();
      if (AtEnd() || !IsDigit(Peek())) {
        return Error("expected a digit in the exponent, found ", Found());
      }
      while (!AtEnd() && IsDigit(Peek())) Advance();
    }
    const std::string literal(text_.substr(start, pos_ - start));
    errno = 0;
    char* end = nullptr;
    const double value = std::strtod(literal.c_str(), &end);
    if (end != literal.c_str() + literal.size()) {
      return ErrorAt(line, column, "expected a number, found '", literal, "'");
    }
    if (!std::isfinite(value)) {
      return ErrorAt(line, column, "expected a number a double can hold, found ", literal,
                     " (out of range)");
    }
    *out = value;
    return OkStatus();
  }

  Status Hex4(uint32_t* out) {
    *out = 0;
    for (int i = 0; i < 4; ++i) {
      if (AtEnd()) return Error("expected 4 hex digits after \\u, found the end of the file");
      const char c = Peek();
      uint32_t digit;
      if (c >= '0' && c <= '9') {
        digit = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        digit = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        digit = c - 'A' + 10;
      } else {
        return Error("expected a hex digit in a \\u escape, found ", Found());
      }
      *out = *out * 16 + digit;
      Advance();
    }
    return OkStatus();
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  Status String(std::string* out) {
    const int line = line_, column = column_;
    Advance();  // the opening quote
    out->clear();
    while (true) {
      if (AtEnd()) {
        return ErrorAt(line, column,
                       "expected a closing '\"' for the string that starts here, found the end "
                       "of the file");
      }
      const unsigned char c = static_cast<unsigned char>(Peek());
      if (c == '"') {
        Advance();
        return OkStatus();
      }
      if (c < 0x20) {
        return Error("expected a character of a string, found ", Found(),
                     " (write a newline or tab inside a string as \\n or \\t)");
      }
      if (c != '\\') {
        out->push_back(static_cast<char>(c));
        Advance();
        continue;
      }
      const int escape_line = line_, escape_column = column_;
      Advance();
      if (AtEnd())
        return Error("expected an escape character after '\\', found the end of the file");
      const char e = Peek();
      Advance();
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out->push_back(e);
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t cp;
          WEFT_RETURN_IF_ERROR(Hex4(&cp));
          if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return ErrorAt(escape_line, escape_column,
                           "expected a high surrogate before a low one, found a lone \\u",
                           absl::StrFormat("%04X", cp));
          }
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (text_.substr(pos_, 2) != "\\u") {
              return ErrorAt(escape_line, escape_column,
                             "expected a \\u low surrogate after the high surrogate \\u",
                             absl::StrFormat("%04X", cp), ", found ", Found());
            }
            Advance();
            Advance();
            uint32_t low;
            WEFT_RETURN_IF_ERROR(Hex4(&low));
            if (low < 0xDC00 || low > 0xDFFF) {
              return ErrorAt(escape_line, escape_column,
                             "expected a low surrogate (\\uDC00..\\uDFFF) after \\u",
                             absl::StrFormat("%04X", cp), ", found \\u",
                             absl::StrFormat("%04X", low));
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return ErrorAt(escape_line, escape_column,
                         "expected one of the escapes \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX, "
                         "found \\",
                         std::string(1, e));
      }
    }
  }

  // The file ended inside the array or object that starts at `open`.
  Status Unclosed(const JsonValue& open, char close, const char* what) {
    return ErrorAt(open.line, open.column, "expected '", std::string(1, close),
                   "' to close the ", what, " that starts here, found the end of the file");
  }

  Status Array(JsonValue* out, int depth) {
    out->type = JsonValue::Type::kArray;
    Advance();  // '['
    SkipSpace();
    if (!AtEnd() && Peek() == ']') {
      Advance();
      return OkStatus();
    }
    while (true) {
      SkipSpace();
      if (AtEnd()) return Unclosed(*out, ']', "array");
      out->array.emplace_back();
      WEFT_RETURN_IF_ERROR(Value(&out->array.back(), depth + 1));
      SkipSpace();
      if (AtEnd()) return Unclosed(*out, ']', "array");
      if (Peek() == ']') {
        Advance();
        return OkStatus();
      }
      if (Peek() != ',') return Error("expected ',' or ']' in an array, found ", Found());
      Advance();
      SkipSpace();
      if (!AtEnd() && Peek() == ']') {
        return Error("expected a value after ',', found ']' (JSON allows no trailing comma)");
      }
    }
  }

  Status Object(JsonValue* out, int depth) {
    out->type = JsonValue::Type::kObject;
    Advance();  // '{'
    SkipSpace();
    if (!AtEnd() && Peek() == '}') {
      Advance();
      return OkStatus();
    }
    while (true) {
      SkipSpace();
      if (AtEnd()) return Unclosed(*out, '}', "object");
      if (Peek() != '"') {
        if (Peek() == '}') {
          return Error("expected a key after ',', found '}' (JSON allows no trailing comma)");
        }
        return Error("expected a key in double quotes, found ", Found());
      }
      const int key_line = line_, key_column = column_;
      std::string key;
      WEFT_RETURN_IF_ERROR(String(&key));
      if (out->Find(key) != nullptr) {
        return ErrorAt(key_line, key_column, "expected each key once in an object, found \"", key,
                       "\" twice");
      }
      SkipSpace();
      if (AtEnd() || Peek() != ':') {
        return Error("expected ':' after the key \"", key, "\", found ", Found());
      }
      Advance();
      SkipSpace();
      out->object.emplace_back(key, JsonValue());
      WEFT_RETURN_IF_ERROR(Value(&out->object.back().second, depth + 1));
      SkipSpace();
      if (AtEnd()) return Unclosed(*out, '}', "object");
      if (Peek() == '}') {
        Advance();
        return OkStatus();
      }
      if (Peek() != ',') return Error("expected ',' or '}' in an object, found ", Found());
      Advance();
    }
  }

  absl::string_view text_;
  size_t pos_ = 0;
  int line_ = 1;
  int column_ = 1;
};

}  // namespace

StatusOr<JsonValue> ParseJson(absl::string_view text) { return Parser(text).Document(); }

}  // namespace planner
}  // namespace weft
