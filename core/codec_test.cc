#include "core/codec.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace weft {
namespace codec {
namespace {

enum class Color : uint8_t { kRed = 1, kBlue = 7 };

bool Says(const Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

TEST(Codec, WritesLittleEndianFixedWidthValues) {
  std::string bytes;
  Writer w(&bytes);
  w.Put<uint32_t>(0x01020304u);
  w.Put<int16_t>(-2);
  w.Put(true);
  w.Put(Color::kBlue);
  w.Put(1.0);  // IEEE-754: 0x3FF0000000000000
  EXPECT_EQ(bytes, std::string("\x04\x03\x02\x01"
                               "\xFE\xFF"
                               "\x01"
                               "\x07"
                               "\x00\x00\x00\x00\x00\x00\xF0\x3F",
                               16));
}

TEST(Codec, ReadsBackEverythingItWrote) {
  std::string bytes;
  Writer w(&bytes);
  w.Put<int64_t>(std::numeric_limits<int64_t>::min());
  w.Put<uint64_t>(0xDEADBEEFCAFEF00Dull);
  w.Put(-0.0);
  w.Put(std::numeric_limits<double>::infinity());
  w.Put(1.5f);
  w.Put(false);
  w.Put(Color::kRed);
  w.Str("weft");
  w.Str("");
  w.Vec(std::vector<int32_t>{3, -1, 2});
  w.Vec(std::vector<int64_t>{});
  w.Bytes("xy", 2);

  Reader r(bytes, "test message");
  int64_t a = 0;
  uint64_t b = 0;
  double c = 1, d = 0;
  float e = 0;
  bool f = true;
  Color g = Color::kBlue;
  std::string s, empty = "x";
  std::vector<int32_t> v;
  std::vector<int64_t> none = {1};
  char xy[2];
  ASSERT_TRUE(r.Get("a", &a).ok());
  ASSERT_TRUE(r.Get("b", &b).ok());
  ASSERT_TRUE(r.Get("c", &c).ok());
  ASSERT_TRUE(r.Get("d", &d).ok());
  ASSERT_TRUE(r.Get("e", &e).ok());
  ASSERT_TRUE(r.Get("f", &f).ok());
  ASSERT_TRUE(r.Get("g", &g).ok());
  ASSERT_TRUE(r.Str("s", &s).ok());
  ASSERT_TRUE(r.Str("empty", &empty).ok());
  ASSERT_TRUE(r.Vec("v", &v).ok());
  ASSERT_TRUE(r.Vec("none", &none).ok());
  ASSERT_TRUE(r.Bytes("xy", xy, 2).ok());
  EXPECT_TRUE(r.Done().ok());
  EXPECT_EQ(a, std::numeric_limits<int64_t>::min());
  EXPECT_EQ(b, 0xDEADBEEFCAFEF00Dull);
  EXPECT_TRUE(c == 0.0 && std::signbit(c));
  EXPECT_TRUE(std::isinf(d));
  EXPECT_EQ(e, 1.5f);
  EXPECT_FALSE(f);
  EXPECT_EQ(g, Color::kRed);
  EXPECT_EQ(s, "weft");
  EXPECT_EQ(empty, "");
  EXPECT_EQ(v, (std::vector<int32_t>{3, -1, 2}));
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(std::string(xy, 2), "xy");
}

TEST(Codec, RefusesShortInputCountsThatCannotFitAndTrailingBytes) {
  std::string bytes;
  Writer w(&bytes);
  w.Put<uint32_t>(7);
  Reader r(bytes, "frame");
  uint64_t too_big;
  Status st = r.Get("the size", &too_big);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Says(st, "truncated frame: expected 8 bytes for the size at offset 0, found 4"))
      << st;
  EXPECT_EQ(too_big, 0u);  // a failed read leaves a defined value

  // A string or vector count larger than the rest: no allocation, an error.
  std::string lying;
  Writer(&lying).Put<uint32_t>(0xFFFFFFFFu);
  std::string s;
  st = Reader(lying, "frame").Str("the name", &s);
  EXPECT_TRUE(Says(st, "the name is 4294967295 but only 0 bytes remain")) << st;
  std::vector<int64_t> v;
  st = Reader(lying, "frame").Vec("the shape", &v);
  EXPECT_TRUE(Says(st, "the shape is 4294967295 but only 0 bytes remain")) << st;
  EXPECT_TRUE(v.empty());
  // Elements are read unchecked once the count is: one element short fails before any is
  // read, an exact fit reads them all.
  std::string short_vec;
  Writer sv(&short_vec);
  sv.Put<uint32_t>(3);
  sv.Put<int64_t>(-5);
  sv.Put<int64_t>(6);
  st = Reader(short_vec, "frame").Vec("the shape", &v);
  EXPECT_TRUE(Says(st, "the shape is 3 but only 16 bytes remain")) << st;
  EXPECT_TRUE(v.empty());
  sv.Put<int64_t>(int64_t{1} << 40);
  Reader exact(short_vec, "frame");
  ASSERT_TRUE(exact.Vec("the shape", &v).ok());
  EXPECT_EQ(v, (std::vector<int64_t>{-5, 6, int64_t{1} << 40}));
  EXPECT_TRUE(exact.Done().ok());

  // Room kept for what follows.
  std::string counted;
  Writer c(&counted);
  c.Put<uint32_t>(1);
  c.Put<uint32_t>(0xAAAAAAAAu);
  uint32_t n = 0;
  EXPECT_TRUE(Reader(counted, "frame").Count("count", 4, 0, &n).ok());
  EXPECT_FALSE(Reader(counted, "frame").Count("count", 4, 4, &n).ok());
  // A count the format writes signed: a negative one is named as such.
  std::string negative;
  Writer(&negative).Put<int32_t>(-1);
  int32_t signed_n;
  st = Reader(negative, "frame").Count("the rows", 4, 0, &signed_n);
  EXPECT_TRUE(Says(st, "corrupt frame: the rows is -1, expected a count >= 0")) << st;

  Reader rest(counted, "frame");
  ASSERT_TRUE(rest.Get("count", &n).ok());
  st = rest.Done();
  EXPECT_TRUE(Says(st, "corrupt frame: 4 trailing byte(s) after 4")) << st;

  // Any non-zero byte reads as true (never an invalid bool).
  std::string two(1, '\x02');
  bool flag = false;
  ASSERT_TRUE(Reader(two, "frame").Get("flag", &flag).ok());
  EXPECT_TRUE(flag);
}

TEST(Codec, Crc32IsZlibs) {
  EXPECT_EQ(Crc32("123456789", 9), 0xCBF43926u);  // the standard check value
  EXPECT_EQ(Crc32("", 0), 0u);
  EXPECT_EQ(Crc32("a", 1), 0xE8B7BE43u);
}

TEST(Codec, FingerprintIsFnv1a64OverTheEncodedBytes) {
  EXPECT_EQ(Fingerprint().value(), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fingerprint().Str("a").value(), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fingerprint().Str("foobar").value(), 0x85944171f73967e8ull);
  // A value hashes as its little-endian bytes, the same on every platform.
  std::string bytes;
  Writer(&bytes).Put<uint64_t>(0x0102030405060708ull);
  EXPECT_EQ(Fingerprint().Put<uint64_t>(0x0102030405060708ull).value(),
            Fingerprint().Bytes(bytes.data(), bytes.size()).value());
  EXPECT_NE(Fingerprint().Put<int32_t>(1).value(), Fingerprint().Put<int64_t>(1).value());
}

}  // namespace
}  // namespace codec
}  // namespace weft
