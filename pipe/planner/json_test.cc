#include "pipe/planner/json.h"

#include <string>

#include "gtest/gtest.h"

namespace weft {
namespace planner {
namespace {

using Type = JsonValue::Type;

TEST(JsonTest, ParsesEveryKindOfValue) {
  StatusOr<JsonValue> v = ParseJson(
      R"( {"a": [1, -2.5e3, 0, 0.125], "b": "x\"\\\/\n\u00e9\ud83d\ude00", "c": true,
           "d": false, "e": null, "f": {}, "g": []} )");
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->type, Type::kObject);
  ASSERT_EQ(v->object.size(), 7u);
  const JsonValue* a = v->Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->array.size(), 4u);
  EXPECT_EQ(a->array[0].number, 1);
  EXPECT_EQ(a->array[1].number, -2500);
  EXPECT_EQ(a->array[2].number, 0);
  EXPECT_EQ(a->array[3].number, 0.125);
  EXPECT_EQ(v->Find("b")->string, "x\"\\/\n\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_TRUE(v->Find("c")->boolean);
  EXPECT_EQ(v->Find("d")->type, Type::kBool);
  EXPECT_FALSE(v->Find("d")->boolean);
  EXPECT_EQ(v->Find("e")->type, Type::kNull);
  EXPECT_EQ(v->Find("f")->type, Type::kObject);
  EXPECT_EQ(v->Find("g")->type, Type::kArray);
  EXPECT_EQ(v->Find("missing"), nullptr);
}

TEST(JsonTest, RecordsWhereEachValueStarts) {
  StatusOr<JsonValue> v = ParseJson("[\n  {\"name\": \"x\",\n   \"params\": 12}\n]");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->line, 1);
  EXPECT_EQ(v->column, 1);
  const JsonValue& layer = v->array[0];
  EXPECT_EQ(layer.line, 2);
  EXPECT_EQ(layer.column, 3);
  EXPECT_EQ(layer.Find("params")->line, 3);
  EXPECT_EQ(layer.Find("params")->column, 14);
}

TEST(JsonTest, ColumnsCountCharactersNotBytes) {
  // "é" is two bytes but one column.
  StatusOr<JsonValue> v = ParseJson("[\"\xC3\xA9\", x]");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(std::string(v.status().message()).find("line 1, column 7"), std::string::npos)
      << v.status();
}

TEST(JsonTest, AcceptsAByteOrderMark) { EXPECT_TRUE(ParseJson("\xEF\xBB\xBF[1]").ok()); }

struct BadCase {
  const char* text;
  const char* expected;  // a part of the message
};

TEST(JsonTest, RefusesWhatIsNotStrictJson) {
  const BadCase cases[] = {
      {"", "line 1, column 1: expected a JSON value (the file is empty)"},
      {"   \n ", "line 2, column 2: expected a JSON value"},
      {"[1, 2,]", "line 1, column 7: expected a value after ',', found ']'"},
      {"{\"a\": 1,}", "line 1, column 9: expected a key after ',', found '}'"},
      {"{\"a\": 1 \"b\": 2}", "line 1, column 9: expected ',' or '}' in an object, found '\"'"},
      {"[1 2]", "line 1, column 4: expected ',' or ']' in an array, found '2'"},
      {"{a: 1}", "line 1, column 2: expected a key in double quotes, found 'a'"},
      {"{\"a\" 1}", "line 1, column 6: expected ':' after the key \"a\", found '1'"},
      {"{\"a\": 1, \"a\": 2}", "line 1, column 10: expected each key once in an object"},
      {"[01]", "line 1, column 3: expected '.', 'e' or the end of the number"},
      {"[1.]", "line 1, column 4: expected a digit after the decimal point, found ']'"},
      {"[1e]", "line 1, column 4: expected a digit in the exponent"},
      {"[-]", "line 1, column 3: expected a digit, found ']'"},
      {"[+1]", "line 1, column 2: expected a value"},
      {"[1e999]", "line 1, column 2: expected a number a double can hold"},
      {"[NaN]", "line 1, column 2: expected a value"},
      {"[True]", "line 1, column 2: expected a value"},
      {"[tru]", "line 1, column 2: expected 'true', found ']'"},
      {"[\"abc", "line 1, column 2: expected a closing '\"'"},
      {"[\"a\nb\"]",
       "line 1, column 4: expected a character of a string, found the control "
       "character 0x0a"},
      {"[\"\\x\"]", "line 1, column 3: expected one of the escapes"},
      {"[\"\\u12G4\"]", "expected a hex digit in a \\u escape, found 'G'"},
      {"[\"\\ud800\"]", "expected a \\u low surrogate after the high surrogate \\uD800"},
      {"[\"\\udc00\"]", "expected a high surrogate before a low one"},
      {"[1] [2]",
       "line 1, column 5: expected the end of the document after the top-level "
       "value, found '['"},
      {"[1] // comment", "expected the end of the document"},
      {"[\n[\n",
       "line 2, column 1: expected ']' to close the array that starts here, found "
       "the end of the file"},
      {"{\"a\": [1,\n  2", "line 1, column 7: expected ']' to close the array"},
  };
  for (const BadCase& c : cases) {
    StatusOr<JsonValue> v = ParseJson(c.text);
    ASSERT_FALSE(v.ok()) << "accepted: " << c.text;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(v.status().message()).find(c.expected), std::string::npos)
        << "for " << c.text << "\n  got: " << v.status().message()
        << "\n  wanted a part: " << c.expected;
  }
}

TEST(JsonTest, RefusesNestingBeyondTheLimit) {
  const std::string deep = std::string(600, '[') + std::string(600, ']');
  StatusOr<JsonValue> v = ParseJson(deep);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(std::string(v.status().message()).find("levels of nested"), std::string::npos);
  const std::string fine = std::string(100, '[') + std::string(100, ']');
  EXPECT_TRUE(ParseJson(fine).ok());
}

}  // namespace
}  // namespace planner
}  // namespace weft
