#include "comm/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/casts.h"
#include "gtest/gtest.h"

namespace weft {
namespace comm {
namespace {

const DType kAllDTypes[] = {DType::kFloat32,  DType::kFloat64, DType::kFloat16,
                            DType::kBFloat16, DType::kInt32,   DType::kInt64,
                            DType::kInt8,     DType::kInt16,   DType::kUInt8};

bool IsInteger(DType dtype) { return !IsFloatingPoint(dtype); }

// A typed buffer of `dtype` elements, written and read as doubles. Values used with it are
// exactly representable in the dtype.
class Buffer {
 public:
  Buffer(DType dtype, const std::vector<double>& values)
      : dtype_(dtype), bytes_(values.size() * DTypeSize(dtype)) {
    for (size_t i = 0; i < values.size(); ++i) Set(i, values[i]);
  }
  Buffer(DType dtype, size_t count, double fill) : Buffer(dtype, std::vector<double>(count, fill)) {}

  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  size_t size() const { return bytes_.size() / DTypeSize(dtype_); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

  void Set(size_t i, double v) {
    void* p = bytes_.data() + i * DTypeSize(dtype_);
    switch (dtype_) {
      case DType::kFloat32: Put<float>(p, static_cast<float>(v)); break;
      case DType::kFloat64: Put<double>(p, v); break;
      case DType::kFloat16: Put<uint16_t>(p, FloatToHalf(static_cast<float>(v))); break;
      case DType::kBFloat16: Put<uint16_t>(p, FloatToBFloat16(static_cast<float>(v))); break;
      case DType::kInt32: Put<int32_t>(p, static_cast<int32_t>(v)); break;
      case DType::kInt64: Put<int64_t>(p, static_cast<int64_t>(v)); break;
      case DType::kInt8: Put<int8_t>(p, static_cast<int8_t>(v)); break;
      case DType::kInt16: Put<int16_t>(p, static_cast<int16_t>(v)); break;
      case DType::kUInt8: Put<uint8_t>(p, static_cast<uint8_t>(v)); break;
    }
    EXPECT_EQ(Get(i), v) << DTypeName(dtype_) << " cannot hold " << v;
  }

  double Get(size_t i) const {
    const void* p = bytes_.data() + i * DTypeSize(dtype_);
    switch (dtype_) {
      case DType::kFloat32: return Take<float>(p);
      case DType::kFloat64: return Take<double>(p);
      case DType::kFloat16: return HalfToFloat(Take<uint16_t>(p));
      case DType::kBFloat16: return BFloat16ToFloat(Take<uint16_t>(p));
      case DType::kInt32: return Take<int32_t>(p);
      case DType::kInt64: return static_cast<double>(Take<int64_t>(p));
      case DType::kInt8: return Take<int8_t>(p);
      case DType::kInt16: return Take<int16_t>(p);
      case DType::kUInt8: return Take<uint8_t>(p);
    }
    return NAN;
  }

  std::vector<double> Values() const {
    std::vector<double> out(size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = Get(i);
    return out;
  }

 private:
  template <typename T>
  static void Put(void* p, T v) {
    std::memcpy(p, &v, sizeof(T));
  }
  template <typename T>
  static T Take(const void* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
  }

  DType dtype_;
  std::vector<uint8_t> bytes_;
};

// Round to nearest, halves away from zero (written independently of std::llround).
double RoundHalfAway(double x) {
  const double floor_abs = std::floor(std::fabs(x));
  const double frac = std::fabs(x) - floor_abs;
  const double r = frac >= 0.5 ? floor_abs + 1 : floor_abs;
  return x < 0 ? -r : r;
}

// What out[i] must be for the exact weighted sum `exact`.
double Expected(DType dtype, double exact) { return IsInteger(dtype) ? RoundHalfAway(exact) : exact; }

// Element patterns, small enough that every weighted sum below is exact in every dtype
// (multiples of 1/4 below 16 in magnitude, or non-negative for uint8).
double PatternA(DType dtype, size_t i) {
  return dtype == DType::kUInt8 ? static_cast<double>(i % 16) : static_cast<double>(i % 16) - 8;
}
double PatternB(DType dtype, size_t i) {
  return dtype == DType::kUInt8 ? static_cast<double>(i % 7) : static_cast<double>(i % 7) - 3;
}
double PatternC(DType dtype, size_t i) {
  return dtype == DType::kUInt8 ? static_cast<double>(i % 5) : static_cast<double>(i % 5) - 2;
}

Buffer Pattern(DType dtype, size_t count, double (*f)(DType, size_t)) {
  std::vector<double> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = f(dtype, i);
  return Buffer(dtype, v);
}

// ---------------------------------------------------------------------------------------
// WeightedSum

TEST(WeightedSumTest, OneTwoThreeTermsEveryDType) {
  const double wa = 0.5, wb = 0.25, wc = 1.0;
  for (DType dtype : kAllDTypes) {
    for (size_t count : {size_t{1}, size_t{7}, size_t{2048}, size_t{2049}, size_t{5000}}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " count " << count);
      const Buffer a = Pattern(dtype, count, PatternA);
      const Buffer b = Pattern(dtype, count, PatternB);
      const Buffer c = Pattern(dtype, count, PatternC);
      for (int terms = 1; terms <= 3; ++terms) {
        SCOPED_TRACE(terms);
        std::vector<WeightedTerm> ts = {{a.data(), wa}};
        if (terms >= 2) ts.push_back({b.data(), wb});
        if (terms >= 3) ts.push_back({c.data(), wc});
        Buffer out(dtype, count + 1, 3);  // one sentinel past the end
        WeightedSum(out.data(), dtype, count, ts);
        int wrong = 0;
        for (size_t i = 0; i < count; ++i) {
          double exact = wa * PatternA(dtype, i);
          if (terms >= 2) exact += wb * PatternB(dtype, i);
          if (terms >= 3) exact += wc * PatternC(dtype, i);
          if (out.Get(i) != Expected(dtype, exact) && ++wrong <= 5) {
            ADD_FAILURE() << "element " << i << ": got " << out.Get(i) << ", want "
                          << Expected(dtype, exact) << " (exact " << exact << ")";
          }
        }
        EXPECT_EQ(wrong, 0);
        EXPECT_EQ(out.Get(count), 3) << "wrote past count";
      }
    }
  }
}

TEST(WeightedSumTest, ExactValuesFloat) {
  // 0.75 * a - 2 * b + 0.125 * c
  const std::vector<double> a = {1, -2, 0.5, 8, 0};
  const std::vector<double> b = {0.25, 1, -1.5, 4, 0};
  const std::vector<double> c = {8, -16, 4, 0, 0.5};
  const std::vector<double> want = {1.25, -5.5, 3.875, -2, 0.0625};
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    Buffer ba(dtype, a), bb(dtype, b), bc(dtype, c), out(dtype, 5, 0);
    WeightedSum(out.data(), dtype, 5, {{ba.data(), 0.75}, {bb.data(), -2}, {bc.data(), 0.125}});
    EXPECT_EQ(out.Values(), want);
  }
}

TEST(WeightedSumTest, ExactValuesInteger) {
  // Halves round away from zero; other fractions to nearest.
  for (DType dtype : {DType::kInt32, DType::kInt64, DType::kInt8}) {
    SCOPED_TRACE(DTypeName(dtype));
    {
      Buffer a(dtype, {3, -3, 1, -1, 5, -5, 0, 7}), out(dtype, 8, 9);
      WeightedSum(out.data(), dtype, 8, {{a.data(), 0.5}});
      EXPECT_EQ(out.Values(), (std::vector<double>{2, -2, 1, -1, 3, -3, 0, 4}));
    }
    {
      // 0.25 * a + 0.5 * b: 0.25 + 0.5 = 0.75 -> 1; 0.25 -> 0; -0.25 -> 0; -1.25 -> -1;
      // 1.75 -> 2; 2.5 -> 3; -2.5 -> -3.
      Buffer a(dtype, {1, 1, -1, -1, 3, 2, -2}), b(dtype, {1, 0, 0, -2, 2, 4, -4});
      Buffer out(dtype, 7, 9);
      WeightedSum(out.data(), dtype, 7, {{a.data(), 0.25}, {b.data(), 0.5}});
      EXPECT_EQ(out.Values(), (std::vector<double>{1, 0, 0, -1, 2, 3, -3}));
    }
    {
      // Averages of three: (1 + 2 + 2) / 3 = 1.67 -> 2; (1 + 1 + 2) / 3 = 1.33 -> 1;
      // (-1 - 1 - 2) / 3 -> -1; (3 + 3 + 3) / 3 = 3.
      Buffer a(dtype, {1, 1, -1, 3}), b(dtype, {2, 1, -1, 3}), c(dtype, {2, 2, -2, 3});
      Buffer out(dtype, 4, 9);
      const double third = 1.0 / 3;
      WeightedSum(out.data(), dtype, 4, {{a.data(), third}, {b.data(), third}, {c.data(), third}});
      EXPECT_EQ(out.Values(), (std::vector<double>{2, 1, -1, 3}));
    }
  }
  {
    Buffer a(DType::kUInt8, {3, 1, 255, 254, 0}), out(DType::kUInt8, 5, 9);
    WeightedSum(out.data(), DType::kUInt8, 5, {{a.data(), 0.5}});
    EXPECT_EQ(out.Values(), (std::vector<double>{2, 1, 128, 127, 0}));
  }
  {
    Buffer a(DType::kInt8, {-128, 127, -127}), b(DType::kInt8, {127, -128, 0});
    Buffer out(DType::kInt8, 3, 9);
    WeightedSum(out.data(), DType::kInt8, 3, {{a.data(), 0.5}, {b.data(), 0.5}});
    // -0.5 -> -1; -0.5 -> -1; -63.5 -> -64.
    EXPECT_EQ(out.Values(), (std::vector<double>{-1, -1, -64}));
  }
  {
    // Large int32 values stay exact through the double accumulator.
    Buffer a(DType::kInt32, {2147483647, -2147483647 - 1.0, 1000000001});
    Buffer b(DType::kInt32, {-2147483647 - 1.0, 2147483647, 999999999});
    Buffer out(DType::kInt32, 3, 0);
    WeightedSum(out.data(), DType::kInt32, 3, {{a.data(), 0.5}, {b.data(), 0.5}});
    // -0.5 -> -1 (away from zero) twice; 1000000000 exactly.
    EXPECT_EQ(out.Values(), (std::vector<double>{-1, -1, 1000000000}));
  }
}

TEST(WeightedSumTest, Int32HalfOfExtremes) {
  // (INT32_MAX + INT32_MIN) / 2 = -0.5 -> -1 (away from zero).
  const int32_t a[] = {std::numeric_limits<int32_t>::max(), 7};
  const int32_t b[] = {std::numeric_limits<int32_t>::min(), 8};
  int32_t out[2] = {5, 5};
  WeightedSum(out, DType::kInt32, 2, {{a, 0.5}, {b, 0.5}});
  EXPECT_EQ(out[0], -1);
  EXPECT_EQ(out[1], 8);  // 7.5 -> 8
}

TEST(WeightedSumTest, IntegersJustBelowAHalfRoundDown) {
  // 0.49999999999999994 (the double below 0.5) and its negative round to 0, not away; a
  // rounding that adds 0.5 first would make them 1 and -1.
  const double below_half = std::nextafter(0.5, 0.0);
  for (DType dtype : {DType::kInt32, DType::kInt64, DType::kInt8, DType::kInt16}) {
    SCOPED_TRACE(DTypeName(dtype));
    Buffer a(dtype, {1, -1, 3, -3}), out(dtype, 4, 9);
    WeightedSum(out.data(), dtype, 4, {{a.data(), below_half}});
    EXPECT_EQ(out.Values(), (std::vector<double>{0, 0, 1, -1}));
  }
  // Large int64 values: a weighted sum of two halves, exact in double.
  const int64_t a[] = {int64_t{1} << 62, -(int64_t{1} << 62)};
  const int64_t b[] = {int64_t{1} << 61, -(int64_t{1} << 61)};
  int64_t out[2] = {0, 0};
  WeightedSum(out, DType::kInt64, 2, {{a, 0.5}, {b, 0.5}});
  EXPECT_EQ(out[0], (int64_t{1} << 61) + (int64_t{1} << 60));
  EXPECT_EQ(out[1], -((int64_t{1} << 61) + (int64_t{1} << 60)));
}

TEST(WeightedSumTest, InPlace) {
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const size_t count = 5000;
    Buffer a = Pattern(dtype, count, PatternA);
    const Buffer b = Pattern(dtype, count, PatternB);
    const Buffer c = Pattern(dtype, count, PatternC);
    WeightedSum(a.data(), dtype, count, {{a.data(), 0.5}, {b.data(), 0.25}, {c.data(), 1}});
    int wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      const double exact = 0.5 * PatternA(dtype, i) + 0.25 * PatternB(dtype, i) + PatternC(dtype, i);
      if (a.Get(i) != Expected(dtype, exact) && ++wrong <= 5) {
        ADD_FAILURE() << "element " << i << ": got " << a.Get(i) << ", want "
                      << Expected(dtype, exact);
      }
    }
    EXPECT_EQ(wrong, 0);
  }
}

TEST(WeightedSumTest, InPlaceSingleTerm) {
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    Buffer a = Pattern(dtype, 5000, PatternA);
    WeightedSum(a.data(), dtype, 5000, {{a.data(), 2}});
    for (size_t i = 0; i < 5000; i += 997) EXPECT_EQ(a.Get(i), 2 * PatternA(dtype, i)) << i;
    EXPECT_EQ(a.Get(4999), 2 * PatternA(dtype, 4999));
  }
}

TEST(WeightedSumTest, ZeroTermsGivesZeros) {
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    Buffer out(dtype, 5001, 7);
    WeightedSum(out.data(), dtype, 5000, {});
    std::vector<double> values = out.Values();
    EXPECT_EQ(std::vector<double>(values.begin(), values.end() - 1),
              std::vector<double>(5000, 0.0));
    EXPECT_EQ(values.back(), 7);
    // All bits zero (no negative zero).
    const std::vector<uint8_t>& bytes = out.bytes();
    EXPECT_EQ(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 5000 * DTypeSize(dtype)),
              std::vector<uint8_t>(5000 * DTypeSize(dtype), 0));
  }
}

TEST(WeightedSumTest, ZeroCountWritesNothing) {
  for (DType dtype : kAllDTypes) {
    Buffer a(dtype, 4, 1), out(dtype, 4, 5);
    WeightedSum(out.data(), dtype, 0, {{a.data(), 0.5}, {a.data(), 0.5}});
    WeightedSum(out.data(), dtype, 0, {});
    WeightedSum(out.data(), dtype, 0, {{a.data(), 1}});
    EXPECT_EQ(out.Values(), std::vector<double>(4, 5)) << DTypeName(dtype);
  }
}

TEST(WeightedSumTest, SingleUnitTermIsAnExactCopy) {
  const int64_t big[] = {(int64_t{1} << 53) + 1, std::numeric_limits<int64_t>::max(),
                         std::numeric_limits<int64_t>::min(), -((int64_t{1} << 60) + 3),
                         (int64_t{1} << 62) - 1};
  std::vector<int64_t> src(big, big + 5);
  for (int i = 0; i < 5000; ++i) src.push_back((int64_t{1} << 54) + 2 * i + 1);
  std::vector<int64_t> out(src.size(), 0);
  WeightedSum(out.data(), DType::kInt64, src.size(), {{src.data(), 1.0}});
  EXPECT_EQ(out, src);
  // In place: untouched.
  std::vector<int64_t> same = src;
  WeightedSum(same.data(), DType::kInt64, same.size(), {{same.data(), 1.0}});
  EXPECT_EQ(same, src);
  // Float bit patterns (NaN payloads, negative zero) survive too.
  const uint32_t bits[] = {0x7fc01234u, 0x80000000u, 0x7f800001u, 0x3f800000u};
  uint32_t copy[4] = {};
  WeightedSum(copy, DType::kFloat32, 4, {{bits, 1.0}});
  EXPECT_EQ(std::memcmp(copy, bits, sizeof(bits)), 0);
  const uint16_t half_bits[] = {0x7e01, 0x8000, 0x0001, 0xfbff};
  uint16_t half_copy[4] = {};
  WeightedSum(half_copy, DType::kFloat16, 4, {{half_bits, 1.0}});
  EXPECT_EQ(std::memcmp(half_copy, half_bits, sizeof(half_bits)), 0);
}

TEST(WeightedSumTest, HalfAndBFloatRoundToNearestEven) {
  // 1 + 2^-11 is halfway between the halves 1 and 1 + 2^-10: ties to even (1).
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 and 1 + 2^-9: ties to even (1 + 2^-9).
  const uint16_t one_half = 0x3c00;
  uint16_t out[2];
  const uint16_t ones[2] = {one_half, one_half};
  WeightedSum(out, DType::kFloat16, 2, {{ones, 1.0}, {ones, 0}});
  EXPECT_EQ(out[0], 0x3c00);
  const uint16_t tiny[2] = {0x1000, 0x1000};  // 2^-11
  const uint16_t vals[2] = {one_half, one_half};
  WeightedSum(out, DType::kFloat16, 2, {{vals, 1.0}, {tiny, 1.0}});
  EXPECT_EQ(out[0], 0x3c00);
  WeightedSum(out, DType::kFloat16, 2, {{vals, 1.0}, {tiny, 3.0}});
  EXPECT_EQ(out[0], 0x3c02);

  // bfloat16: 1 + 2^-8 ties to 1; 1 + 3 * 2^-8 ties to 1 + 2^-6.
  const uint16_t one_bf = 0x3f80;
  const uint16_t bf_ones[2] = {one_bf, one_bf};
  const uint16_t bf_tiny[2] = {0x3b80, 0x3b80};  // 2^-8
  WeightedSum(out, DType::kBFloat16, 2, {{bf_ones, 1.0}, {bf_tiny, 1.0}});
  EXPECT_EQ(out[0], 0x3f80);
  WeightedSum(out, DType::kBFloat16, 2, {{bf_ones, 1.0}, {bf_tiny, 3.0}});
  EXPECT_EQ(out[0], 0x3f82);
}

// Uniform weights 1/k are an average: the terms summed in order, then divided by k, bit for
// bit (weighting each term by the rounded 1/k differs in the last bit for some values).
TEST(WeightedSumTest, UniformWeightsSumThenDivide) {
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> dist(-10, 10);
  for (int k : {2, 3, 5, 7}) {
    SCOPED_TRACE(k);
    constexpr size_t kCount = 4096;
    std::vector<std::vector<float>> xs(k, std::vector<float>(kCount));
    for (auto& x : xs) {
      for (float& v : x) v = dist(gen);
    }
    std::vector<WeightedTerm> terms;
    for (const auto& x : xs) terms.push_back({x.data(), 1.0 / k});
    std::vector<float> out(kCount);
    WeightedSum(out.data(), DType::kFloat32, kCount, terms);
    int differs_from_weighting = 0;
    for (size_t i = 0; i < kCount; ++i) {
      float sum = xs[0][i];
      float weighted = static_cast<float>(1.0 / k) * xs[0][i];
      for (int j = 1; j < k; ++j) {
        sum += xs[j][i];
        weighted += static_cast<float>(1.0 / k) * xs[j][i];
      }
      ASSERT_EQ(out[i], sum / static_cast<float>(k)) << i;
      differs_from_weighting += out[i] != weighted;
    }
    if (k != 2) {
      EXPECT_GT(differs_from_weighting, 0);  // the two formulas do differ
    }
  }
  // Integers: the nearest integer to the average.
  Buffer a(DType::kInt32, {1, 2, -7}), b(DType::kInt32, {2, 2, 0}), c(DType::kInt32, {4, 3, 0});
  Buffer out(DType::kInt32, {0, 0, 0});
  WeightedSum(out.data(), DType::kInt32, 3,
              {{a.data(), 1.0 / 3}, {b.data(), 1.0 / 3}, {c.data(), 1.0 / 3}});
  EXPECT_EQ(out.Values(), (std::vector<double>{2, 2, -2}));
}

TEST(DivideTest, AnAverageAfterASum) {
  Buffer f(DType::kFloat32, {3, 1, -6});
  Divide(f.data(), DType::kFloat32, 3, 3);
  EXPECT_EQ(f.Values(), (std::vector<double>{1, 1.0f / 3, -2}));
  Buffer i(DType::kInt64, {7, -7, 6});
  Divide(i.data(), DType::kInt64, 3, 2);
  EXPECT_EQ(i.Values(), (std::vector<double>{4, -4, 3}));  // halves away from zero
}

TEST(DivideTest, Int64IsExactPastTwoToThe53) {
  // 2^60 + 3 has no double; halved it is 2^59 + 1.5, which rounds away from zero.
  const int64_t big = (int64_t{1} << 60) + 3;
  std::vector<int64_t> x = {big, -big, big, (int64_t{1} << 62) + 1, 5, -5, 4, 1, -1};
  const std::vector<int64_t> want = {(int64_t{1} << 59) + 2, -((int64_t{1} << 59) + 2)};
  Divide(x.data(), DType::kInt64, 2, 2);
  EXPECT_EQ(std::vector<int64_t>(x.begin(), x.begin() + 2), want);
  Divide(x.data() + 2, DType::kInt64, 2, 3);
  // (2^60 + 3) / 3 = 384307168202282326.33..; (2^62 + 1) / 3 = 1537228672809129301.66..
  EXPECT_EQ(x[2], 384307168202282326);
  EXPECT_EQ(x[3], 1537228672809129302);
  Divide(x.data() + 4, DType::kInt64, 5, 3);  // 5/3, -5/3, 4/3, 1/3, -1/3
  EXPECT_EQ(std::vector<int64_t>(x.begin() + 4, x.end()), (std::vector<int64_t>{2, -2, 1, 0, 0}));
  std::vector<int64_t> halves = {3, -3, 1, -1};  // / 2: 1.5, -1.5, 0.5, -0.5
  Divide(halves.data(), DType::kInt64, 4, 2);
  EXPECT_EQ(halves, (std::vector<int64_t>{2, -2, 1, -1}));
}

// ---------------------------------------------------------------------------------------
// Scale

TEST(ScaleTest, ExactValuesEveryDType) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    Buffer b(dtype, {1.5, -0.25, 2048, 0, -3});
    Scale(b.data(), dtype, 5, 0.5);
    EXPECT_EQ(b.Values(), (std::vector<double>{0.75, -0.125, 1024, 0, -1.5}));
    Scale(b.data(), dtype, 5, -4);
    EXPECT_EQ(b.Values(), (std::vector<double>{-3, 0.5, -4096, 0, 6}));
  }
  for (DType dtype : {DType::kInt32, DType::kInt64, DType::kInt8}) {
    SCOPED_TRACE(DTypeName(dtype));
    Buffer b(dtype, {3, -3, 1, -1, 10, 11, -11, 0});
    Scale(b.data(), dtype, 8, 0.5);
    EXPECT_EQ(b.Values(), (std::vector<double>{2, -2, 1, -1, 5, 6, -6, 0}));
    Buffer c(dtype, {10, 11, -10, -11, 3});
    Scale(c.data(), dtype, 5, 1.0 / 3);
    EXPECT_EQ(c.Values(), (std::vector<double>{3, 4, -3, -4, 1}));
    Buffer d(dtype, {3, -5});
    Scale(d.data(), dtype, 2, -2.5);
    EXPECT_EQ(d.Values(), (std::vector<double>{-8, 13}));  // -7.5 -> -8, 12.5 -> 13
  }
  Buffer u(DType::kUInt8, {3, 5, 255, 1, 0});
  Scale(u.data(), DType::kUInt8, 5, 0.5);
  EXPECT_EQ(u.Values(), (std::vector<double>{2, 3, 128, 1, 0}));
  Buffer i8(DType::kInt8, {127, -128});
  Scale(i8.data(), DType::kInt8, 2, 0.5);
  EXPECT_EQ(i8.Values(), (std::vector<double>{64, -64}));  // 63.5 -> 64
}

TEST(ScaleTest, LongBuffersEveryDType) {
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const size_t count = 5000;
    Buffer b = Pattern(dtype, count + 1, PatternA);
    const double last = b.Get(count);
    Scale(b.data(), dtype, count, 0.25);
    int wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      const double want = Expected(dtype, 0.25 * PatternA(dtype, i));
      if (b.Get(i) != want && ++wrong <= 5) {
        ADD_FAILURE() << "element " << i << ": got " << b.Get(i) << ", want " << want;
      }
    }
    EXPECT_EQ(wrong, 0);
    EXPECT_EQ(b.Get(count), last) << "scaled past count";
  }
}

TEST(ScaleTest, ByOneAndByZero) {
  std::vector<int64_t> big = {(int64_t{1} << 53) + 1, std::numeric_limits<int64_t>::max(),
                              std::numeric_limits<int64_t>::min() + 1};
  const std::vector<int64_t> before = big;
  Scale(big.data(), DType::kInt64, big.size(), 1.0);
  EXPECT_EQ(big, before);
  for (DType dtype : kAllDTypes) {
    Buffer b = Pattern(dtype, 3000, PatternB);
    Scale(b.data(), dtype, 3000, 0);
    for (double v : b.Values()) {
      ASSERT_EQ(v, 0) << DTypeName(dtype);
    }
  }
}

// ---------------------------------------------------------------------------------------
// AddInPlace

TEST(AddInPlaceTest, ExactValuesEveryDType) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    Buffer dst(dtype, {1.5, -2, 0.25, 1024, -0.5});
    const Buffer src(dtype, {0.5, 3, -0.25, 1024, -0.75});
    AddInPlace(dst.data(), src.data(), dtype, 5);
    EXPECT_EQ(dst.Values(), (std::vector<double>{2, 1, 0, 2048, -1.25}));
    EXPECT_EQ(src.Values(), (std::vector<double>{0.5, 3, -0.25, 1024, -0.75}));
  }
  for (DType dtype : {DType::kInt32, DType::kInt64, DType::kInt8}) {
    SCOPED_TRACE(DTypeName(dtype));
    Buffer dst(dtype, {1, -2, 100, -100, 0});
    const Buffer src(dtype, {2, 5, -100, 27, -128});
    AddInPlace(dst.data(), src.data(), dtype, 5);
    EXPECT_EQ(dst.Values(), (std::vector<double>{3, 3, 0, -73, -128}));
  }
  Buffer u(DType::kUInt8, {200, 1, 0});
  const Buffer us(DType::kUInt8, {55, 2, 0});
  AddInPlace(u.data(), us.data(), DType::kUInt8, 3);
  EXPECT_EQ(u.Values(), (std::vector<double>{255, 3, 0}));

  std::vector<int32_t> big = {2000000000, -2000000000};
  const std::vector<int32_t> big_src = {147483647, -147483648};
  AddInPlace(big.data(), big_src.data(), DType::kInt32, 2);
  EXPECT_EQ(big, (std::vector<int32_t>{2147483647, -2147483647 - 1}));
}

TEST(AddInPlaceTest, IntegersAreExactAndWrapLikeMpiSum) {
  // Past 2^53 a double has no odd integers: a sum through double would drop the low bit.
  const int64_t big = (int64_t{1} << 53) + 1;
  std::vector<int64_t> dst = {big, big, std::numeric_limits<int64_t>::max(), -3};
  const std::vector<int64_t> src = {0, big, 1, 5};
  AddInPlace(dst.data(), src.data(), DType::kInt64, dst.size());
  EXPECT_EQ(dst, (std::vector<int64_t>{big, 2 * big, std::numeric_limits<int64_t>::min(), 2}));
  std::vector<int32_t> i32 = {std::numeric_limits<int32_t>::max()};
  const std::vector<int32_t> one = {1};
  AddInPlace(i32.data(), one.data(), DType::kInt32, 1);
  EXPECT_EQ(i32[0], std::numeric_limits<int32_t>::min());
  std::vector<uint8_t> u8 = {250};
  const std::vector<uint8_t> ten = {10};
  AddInPlace(u8.data(), ten.data(), DType::kUInt8, 1);
  EXPECT_EQ(u8[0], 4);
}

TEST(AddTest, OutOfPlaceLeavesBothInputs) {
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const size_t count = 3001;
    const Buffer a = Pattern(dtype, count, PatternA);
    const Buffer b = Pattern(dtype, count, PatternB);
    Buffer out = Pattern(dtype, count + 1, PatternB);
    const double last = out.Get(count);
    Add(out.data(), a.data(), b.data(), dtype, count);
    int wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      const double want = PatternA(dtype, i) + PatternB(dtype, i);
      if (out.Get(i) != want && ++wrong <= 5) {
        ADD_FAILURE() << "element " << i << ": got " << out.Get(i) << ", want " << want;
      }
      if ((a.Get(i) != PatternA(dtype, i) || b.Get(i) != PatternB(dtype, i)) && ++wrong <= 5) {
        ADD_FAILURE() << "element " << i << ": an input changed";
      }
    }
    EXPECT_EQ(wrong, 0);
    EXPECT_EQ(out.Get(count), last) << "wrote past count";
    // out may alias the second input as well as the first.
    Buffer c = Pattern(dtype, count, PatternB);
    Add(c.data(), a.data(), c.data(), dtype, count);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(c.Get(i), PatternA(dtype, i) + PatternB(dtype, i)) << "element " << i;
    }
  }
}

TEST(AddInPlaceTest, LongBuffersEveryDType) {
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const size_t count = 5000;
    Buffer dst = Pattern(dtype, count + 1, PatternA);
    const Buffer src = Pattern(dtype, count + 1, PatternB);
    const double last = dst.Get(count);
    AddInPlace(dst.data(), src.data(), dtype, count);
    int wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      const double want = PatternA(dtype, i) + PatternB(dtype, i);
      if (dst.Get(i) != want && ++wrong <= 5) {
        ADD_FAILURE() << "element " << i << ": got " << dst.Get(i) << ", want " << want;
      }
    }
    EXPECT_EQ(wrong, 0);
    EXPECT_EQ(dst.Get(count), last) << "wrote past count";
  }
}

TEST(AddInPlaceTest, HalfSumRoundsToNearestEven) {
  // 2048 + 1 is halfway between the halves 2048 and 2050: ties to even (2048).
  // 2050 + 1 ties between 2050 and 2052: to 2052.
  uint16_t dst[3] = {FloatToHalf(2048), FloatToHalf(2050), FloatToHalf(65504)};
  const uint16_t src[3] = {FloatToHalf(1), FloatToHalf(1), FloatToHalf(65504)};
  AddInPlace(dst, src, DType::kFloat16, 3);
  EXPECT_EQ(HalfToFloat(dst[0]), 2048.0f);
  EXPECT_EQ(HalfToFloat(dst[1]), 2052.0f);
  EXPECT_EQ(dst[2], 0x7c00);  // overflow to +inf
  // bfloat16: 256 + 1 ties to 256; 258 + 1 ties to 260.
  uint16_t bdst[2] = {FloatToBFloat16(256), FloatToBFloat16(258)};
  const uint16_t bsrc[2] = {FloatToBFloat16(1), FloatToBFloat16(1)};
  AddInPlace(bdst, bsrc, DType::kBFloat16, 2);
  EXPECT_EQ(BFloat16ToFloat(bdst[0]), 256.0f);
  EXPECT_EQ(BFloat16ToFloat(bdst[1]), 260.0f);
}

// ---------------------------------------------------------------------------------------
// 16-bit floats: the kernels convert eight elements per instruction where the CPU can
// (VectorKernelsAvailable). Every float16 and bfloat16 value, summed with
// a set of others and weighted, must give the bytes of the scalar conversions in
// core/tensor.h, with the vector conversions and without.

// Every 16-bit pattern once.
std::vector<uint16_t> AllPatterns() {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  return all;
}

// Second operands: zeros, the smallest and largest subnormals and normals, ones, the
// largest finite values, infinities, quiet and signaling NaNs of both signs, and random
// patterns.
std::vector<uint16_t> Partners(DType dtype) {
  std::vector<uint16_t> v;
  if (dtype == DType::kFloat16) {
    v = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x83ff, 0x0400, 0x8400, 0x3c00,
         0xbc00, 0x3c01, 0x1000, 0x7bff, 0xfbff, 0x7bfe, 0x7c00, 0xfc00, 0x7e00,
         0xfe00, 0x7c01, 0xfd55, 0x5800, 0xd800, 0x6800, 0x0200};
  } else {
    v = {0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x0080, 0x8080, 0x3f80,
         0xbf80, 0x3f81, 0x3b80, 0x7f7f, 0xff7f, 0x7f7e, 0x7f80, 0xff80,
         0x7fc0, 0xffc0, 0x7f81, 0xffa5, 0x4b00, 0xcb00, 0x5f00};
  }
  std::mt19937 gen(11);
  for (int i = 0; i < 200; ++i) v.push_back(static_cast<uint16_t>(gen()));
  return v;
}

float ToFloat(DType dtype, uint16_t v) {
  return dtype == DType::kFloat16 ? HalfToFloat(v) : BFloat16ToFloat(v);
}
uint16_t FromFloat(DType dtype, float f) {
  return dtype == DType::kFloat16 ? FloatToHalf(f) : FloatToBFloat16(f);
}
bool IsNan(DType dtype, uint16_t v) { return std::isnan(ToFloat(dtype, v)); }

// Runs `kernel` on `count` elements with the eight-at-a-time kernels on (where this CPU has
// them), then off: the two outputs.
template <typename V>
std::pair<std::vector<V>, std::vector<V>> RunBothPaths(const std::function<void(V* out)>& kernel,
                                                       size_t count) {
  std::vector<V> fast(count), scalar(count);
  const bool was = SetVectorKernelsForTesting(true);
  kernel(fast.data());
  SetVectorKernelsForTesting(false);
  kernel(scalar.data());
  SetVectorKernelsForTesting(was);
  return {std::move(fast), std::move(scalar)};
}

// Whether the float32, float16 or bfloat16 element at `p` is NaN.
bool IsNanAt(DType dtype, const void* p) {
  if (dtype == DType::kFloat32) {
    float f;
    std::memcpy(&f, p, sizeof(f));
    return std::isnan(f);
  }
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return IsNan(dtype, v);
}

// Whether two results agree: the same bytes, or NaN on both sides where `nan_only`. With two
// NaN operands, which one a sum carries (sign, payload) depends on how the compiler ordered
// the operands (it differs between the -O1 and -O2 builds), so there both must be NaN.
bool Agree(DType dtype, const void* got, const void* want, bool nan_only) {
  return nan_only ? IsNanAt(dtype, got) && IsNanAt(dtype, want)
                  : std::memcmp(got, want, DTypeSize(dtype)) == 0;
}

// The element at `p` as hex bits.
std::string Hex(DType dtype, const void* p) {
  uint32_t bits = 0;
  std::memcpy(&bits, p, DTypeSize(dtype));  // little-endian
  std::ostringstream out;
  out << "0x" << std::hex << bits;
  return out.str();
}

// Runs `kernel` on `count` elements of `dtype` (V: its storage) with the eight-at-a-time
// kernels on (where this CPU has them) and off; expects `want(i)` from both at every element
// i, or NaN on both where `nan_only(i)` (Agree).
template <typename V>
void ExpectBothPaths(DType dtype, const std::function<void(V* out)>& kernel,
                     const std::function<V(size_t)>& want,
                     const std::function<bool(size_t)>& nan_only, size_t count,
                     const std::string& what) {
  const auto [fast, scalar] = RunBothPaths(kernel, count);
  int wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const V w = want(i);
    const bool ok =
        Agree(dtype, &fast[i], &w, nan_only(i)) && Agree(dtype, &scalar[i], &w, nan_only(i));
    if (!ok && ++wrong <= 5) {
      ADD_FAILURE() << what << ", element " << i << ": vector kernels " << Hex(dtype, &fast[i])
                    << ", scalar " << Hex(dtype, &scalar[i]) << ", want " << Hex(dtype, &w);
    }
  }
  EXPECT_EQ(wrong, 0) << what;
}

TEST(SixteenBitFloatTest, SumsOfEveryValueMatchTheScalarConversions) {
  std::printf("vector kernels on this CPU: %s\n", VectorKernelsAvailable() ? "yes" : "no");
  const std::vector<uint16_t> a = AllPatterns();
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (uint16_t partner : Partners(dtype)) {
      const std::vector<uint16_t> b(a.size(), partner);
      auto want = [&](size_t i) {
        return FromFloat(dtype, ToFloat(dtype, a[i]) + ToFloat(dtype, partner));
      };
      auto nan_only = [&](size_t i) { return IsNan(dtype, a[i]) && IsNan(dtype, partner); };
      std::ostringstream what;
      what << DTypeName(dtype) << " + 0x" << std::hex << partner;
      ExpectBothPaths<uint16_t>(
          dtype, [&](uint16_t* out) { Add(out, a.data(), b.data(), dtype, a.size()); }, want,
          nan_only, a.size(), what.str());
    }
  }
}

// The conversion of the kernels' results, on floats the kernels cannot produce from 16-bit
// inputs too (NaNs with any payload): every 251st float bit pattern (a stride prime to
// every field boundary), and every float at a rounding tie of either format and on both
// sides of it.
TEST(SixteenBitFloatTest, ResultConversionMatchesTheScalarOneOnFloats) {
  std::vector<float> floats;
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 251) {
    floats.push_back(absl::bit_cast<float>(static_cast<uint32_t>(bits)));
  }
  for (uint32_t dropped : {13u, 16u}) {  // float16 keeps 10 of float's 23 mantissa bits,
                                         // bfloat16 7
    for (uint64_t kept = 0; kept < (uint64_t{1} << (32 - dropped)); ++kept) {
      const uint32_t tie = static_cast<uint32_t>(kept << dropped) | (1u << (dropped - 1));
      for (uint32_t bits : {tie - 1, tie, tie + 1}) floats.push_back(absl::bit_cast<float>(bits));
    }
  }
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    ExpectBothPaths<uint16_t>(
        dtype,
        [&](uint16_t* out) { FromFloatsForTesting(dtype, floats.data(), out, floats.size()); },
        [&](size_t i) { return FromFloat(dtype, floats[i]); }, [](size_t) { return false; },
        floats.size(), std::string(DTypeName(dtype)) + " from the float at that element");
  }
}

TEST(SixteenBitFloatTest, WeightedSumsOfEveryValueMatchTheScalarConversions) {
  const std::vector<uint16_t> a = AllPatterns();
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    // Rounding lands everywhere between representable values, and past the largest.
    for (double w : {0.5, 0.1, 3.0, -1.7, 1e-4, 1.0 / 3, 65504.0, 1e30}) {
      std::ostringstream what;
      what << DTypeName(dtype) << " * " << w;
      auto want = [&](size_t i) {
        return FromFloat(dtype, static_cast<float>(w) * ToFloat(dtype, a[i]));
      };
      ExpectBothPaths<uint16_t>(
          dtype,
          [&](uint16_t* out) {
            std::copy(a.begin(), a.end(), out);  // Scale is in place
            Scale(out, dtype, a.size(), w);
          },
          want, [](size_t) { return false; }, a.size(), what.str() + " (Scale)");
      // Out of place with a second term, and the uniform average of two.
      const std::vector<uint16_t> b(a.rbegin(), a.rend());
      auto want2 = [&](size_t i) {
        float acc = static_cast<float>(w) * ToFloat(dtype, a[i]);
        acc += static_cast<float>(0.25) * ToFloat(dtype, b[i]);
        return FromFloat(dtype, acc);
      };
      auto both_nan = [&](size_t i) { return IsNan(dtype, a[i]) && IsNan(dtype, b[i]); };
      ExpectBothPaths<uint16_t>(
          dtype,
          [&](uint16_t* out) {
            WeightedSum(out, dtype, a.size(), {{a.data(), w}, {b.data(), 0.25}});
          },
          want2, both_nan, a.size(), what.str() + " + b * 0.25");
    }
    // The average of three: summed, then divided by 3 (multiplying by a rounded 1/3 would
    // differ in the last bit for some values).
    const std::vector<uint16_t> b(a.rbegin(), a.rend());
    std::vector<uint16_t> c(a.size());
    for (size_t i = 0; i < c.size(); ++i) c[i] = a[(i * 7919) % a.size()];
    auto want_avg = [&](size_t i) {
      float sum = ToFloat(dtype, a[i]) + ToFloat(dtype, b[i]);
      sum += ToFloat(dtype, c[i]);
      return FromFloat(dtype, sum / 3.0f);
    };
    auto any_two_nan = [&](size_t i) {
      return IsNan(dtype, a[i]) + IsNan(dtype, b[i]) + IsNan(dtype, c[i]) >= 2;
    };
    ExpectBothPaths<uint16_t>(
        dtype,
        [&](uint16_t* out) {
          WeightedSum(out, dtype, a.size(),
                      {{a.data(), 1.0 / 3}, {b.data(), 1.0 / 3}, {c.data(), 1.0 / 3}});
        },
        want_avg, any_two_nan, a.size(), std::string(DTypeName(dtype)) + " average of three");
  }
}

// ---------------------------------------------------------------------------------------
// float32 runs eight at a time too (the build itself targets plain x86-64, four). Random bit
// patterns (every class: subnormals, infinities, NaNs) and the edges, through every kernel,
// with the vector path on and off, against the arithmetic written out here.

std::vector<float> FloatSamples(size_t count, uint32_t seed) {
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::min(),
                            1.5f * std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            1.0f,
                            -1.0f,
                            1.0f / 3,
                            3.0f};
  std::vector<float> v(specials, specials + sizeof(specials) / sizeof(float));
  std::mt19937 gen(seed);
  while (v.size() < count) v.push_back(absl::bit_cast<float>(static_cast<uint32_t>(gen())));
  std::shuffle(v.begin(), v.end(), gen);
  return v;
}

uint32_t Bits(float f) { return absl::bit_cast<uint32_t>(f); }

TEST(FloatKernelsTest, EveryKernelMatchesTheArithmeticOnBothPaths) {
  const size_t count = 20011;  // blocks of 2048 and a tail
  const std::vector<float> a = FloatSamples(count, 1), b = FloatSamples(count, 2),
                           c = FloatSamples(count, 3), e = FloatSamples(count, 4);
  auto nans = [&](size_t i, std::initializer_list<const std::vector<float>*> xs) {
    int n = 0;
    for (const auto* x : xs) n += std::isnan((*x)[i]);
    return n >= 2;
  };
  ExpectBothPaths<float>(
      DType::kFloat32, [&](float* out) { Add(out, a.data(), b.data(), DType::kFloat32, count); },
      [&](size_t i) { return a[i] + b[i]; },
      [&](size_t i) {
        return nans(i, {&a, &b});
      },
      count, "Add");
  ExpectBothPaths<float>(
      DType::kFloat32,
      [&](float* out) {
        WeightedSum(out, DType::kFloat32, count, {{a.data(), 0.3}, {b.data(), -1.7}});
      },
      [&](size_t i) {
        float acc = 0.3f * a[i];
        acc += -1.7f * b[i];
        return acc;
      },
      [&](size_t i) {
        return nans(i, {&a, &b});
      },
      count, "weighted");
  // Averages of 2, 3 and 4 terms: summed, then divided (by 2 and 4 through the exact
  // reciprocal, by 3 through a division).
  const std::vector<const std::vector<float>*> xs = {&a, &b, &c, &e};
  for (size_t k = 2; k <= 4; ++k) {
    ExpectBothPaths<float>(
        DType::kFloat32,
        [&](float* out) {
          std::vector<WeightedTerm> terms;
          for (size_t j = 0; j < k; ++j) terms.push_back({xs[j]->data(), 1.0 / k});
          WeightedSum(out, DType::kFloat32, count, terms);
        },
        [&](size_t i) {
          float sum = (*xs[0])[i];
          for (size_t j = 1; j < k; ++j) sum += (*xs[j])[i];
          return sum / static_cast<float>(k);
        },
        [&](size_t i) {
          int n = 0;
          for (size_t j = 0; j < k; ++j) n += std::isnan((*xs[j])[i]);
          return n >= 2;
        },
        count, "average of " + std::to_string(k));
  }
  for (double d : {1.0, 2.0, 3.0, 4.0, 8.0, 0.5, 1048576.0, 7.0}) {
    ExpectBothPaths<float>(
        DType::kFloat32,
        [&](float* out) {
          std::copy(a.begin(), a.end(), out);
          Divide(out, DType::kFloat32, count, d);
        },
        [&](size_t i) { return a[i] / static_cast<float>(d); }, [](size_t) { return false; }, count,
        "Divide by " + std::to_string(d));
  }
}

// Dividing by a power of two is a multiplication by its reciprocal, which must give the
// division's bits: subnormal and rounded results in particular.
TEST(DivideTest, PowersOfTwoGiveTheDivisionsBitsFloat64AndIntegers) {
  std::vector<double> x = {1.0,
                           -3.0,
                           std::numeric_limits<double>::denorm_min(),
                           3 * std::numeric_limits<double>::denorm_min(),
                           std::numeric_limits<double>::min(),
                           1.5 * std::numeric_limits<double>::min(),
                           std::numeric_limits<double>::max(),
                           std::numeric_limits<double>::infinity(),
                           0.1};
  std::mt19937_64 gen(9);
  for (int i = 0; i < 5000; ++i) x.push_back(absl::bit_cast<double>(gen()));
  // The last five have reciprocals that are not normal numbers (a subnormal power of two
  // has an infinite one, a huge one a subnormal one): they divide.
  for (double d : {2.0, 4.0, 1024.0, 0.25, 0x1p-1024, 0x1p-1060, 0x1p-1074, 0x1p1023, 0x1p1022}) {
    std::vector<double> out = x;
    Divide(out.data(), DType::kFloat64, out.size(), d);
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = x[i] / d;
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(out[i])) << i;
      } else {
        EXPECT_EQ(absl::bit_cast<uint64_t>(out[i]), absl::bit_cast<uint64_t>(want))
            << x[i] << " / " << d;
      }
    }
  }
  // float32, on both paths; the same for 2^-128 .. 2^-149 and 2^127.
  for (double d : {0x1p-128, 0x1p-140, 0x1p-149, 0x1p127, 0x1p126}) {
    const std::vector<float> f = FloatSamples(1001, 7);
    for (bool vector : {true, false}) {
      const bool was = SetVectorKernelsForTesting(vector);
      std::vector<float> out = f;
      Divide(out.data(), DType::kFloat32, out.size(), d);
      SetVectorKernelsForTesting(was);
      for (size_t i = 0; i < f.size(); ++i) {
        const float want = f[i] / static_cast<float>(d);
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(out[i])) << i;
        } else {
          EXPECT_EQ(Bits(out[i]), Bits(want)) << f[i] << " / " << d << ", vector " << vector;
        }
      }
    }
  }
  // Integers round to nearest, halves away from zero, as a division would.
  Buffer ints(DType::kInt32, {5, -5, 7, -7, 6, 2147483647, -2147483647});
  Divide(ints.data(), DType::kInt32, ints.size(), 2);
  EXPECT_EQ(ints.Values(), (std::vector<double>{3, -3, 4, -4, 3, 1073741824, -1073741824}));
  Buffer fours(DType::kInt64, {6, -6, 10, 2});
  Divide(fours.data(), DType::kInt64, fours.size(), 4);
  EXPECT_EQ(fours.Values(), (std::vector<double>{2, -2, 3, 1}));  // 1.5 -> 2, 2.5 -> 3
}

// Every kernel, at counts around the eight-element groups and the 2048-element blocks and at
// every byte offset, in buffers of exactly the operands' size followed by guard bytes: the
// vector path gives the element loops' bytes and writes nothing past the end.
TEST(KernelsTest, TailsOffsetsAndAliasingOnBothPaths) {
  std::vector<size_t> counts;
  for (size_t c = 0; c <= 24; ++c) counts.push_back(c);
  for (size_t c : {2040, 2047, 2048, 2049, 2055, 2056, 2058, 4095, 4103, 6143, 6151}) {
    counts.push_back(c);
  }
  constexpr size_t kGuard = 40;
  constexpr uint8_t kGuardByte = 0xa5;
  std::mt19937 gen(3);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const size_t item = DTypeSize(dtype);
    for (size_t count : counts) {
      for (size_t offset = 0; offset < 8; ++offset) {
        // Three operands of random bytes (every class of value), each in a buffer of its own.
        std::vector<std::vector<uint8_t>> init(3, std::vector<uint8_t>(count * item));
        for (auto& v : init) {
          for (auto& byte : v) byte = static_cast<uint8_t>(gen());
        }
        for (int kernel = 0; kernel < 9; ++kernel) {
          std::vector<uint8_t> result[2];
          for (int path = 0; path < 2; ++path) {
            std::vector<std::vector<uint8_t>> storage(
                4, std::vector<uint8_t>(offset + count * item + kGuard, kGuardByte));
            uint8_t* p[4];
            for (int k = 0; k < 4; ++k) {
              p[k] = storage[k].data() + offset;
              if (k < 3 && count > 0) std::memcpy(p[k], init[k].data(), count * item);
            }
            const bool was = SetVectorKernelsForTesting(path == 0);
            switch (kernel) {
              case 0:
                Add(p[3], p[0], p[1], dtype, count);
                break;
              case 1:
                Add(p[0], p[0], p[1], dtype, count);
                break;  // out is a
              case 2:
                Add(p[1], p[0], p[1], dtype, count);
                break;  // out is b
              case 3:   // in place, weighted
                WeightedSum(p[0], dtype, count, {{p[0], 0.5}, {p[1], -0.25}, {p[2], 3.0}});
                break;
              case 4:
                WeightedSum(p[3], dtype, count, {{p[0], 0.5}, {p[1], 0.5}});
                break;
              case 5:
                WeightedSum(p[3], dtype, count,
                            {{p[0], 1.0 / 3}, {p[1], 1.0 / 3}, {p[2], 1.0 / 3}});
                break;
              case 6:
                Scale(p[0], dtype, count, 0.7);
                break;
              case 7:
                Divide(p[0], dtype, count, 4.0);
                break;
              case 8:
                Divide(p[0], dtype, count, 3.0);
                break;
            }
            SetVectorKernelsForTesting(was);
            for (int k = 0; k < 4; ++k) {
              for (size_t b = 0; b < storage[k].size(); ++b) {
                const bool inside = b >= offset && b < offset + count * item;
                if (!inside && storage[k][b] != kGuardByte) {
                  FAIL() << DTypeName(dtype) << " kernel " << kernel << " count " << count
                         << " offset " << offset << " path " << path << ": wrote byte " << b
                         << " of buffer " << k << ", outside the operand";
                }
              }
            }
            const int out = kernel == 1 || kernel == 3 || kernel >= 6 ? 0 : kernel == 2 ? 1 : 3;
            result[path].assign(p[out], p[out] + count * item);
          }
          // Equal bytes, or NaN on both paths (two NaN operands: either one's payload).
          for (size_t i = 0; i < count; ++i) {
            const uint8_t* f = result[0].data() + i * item;
            const uint8_t* e = result[1].data() + i * item;
            if (!Agree(dtype, f, e, false) && !Agree(dtype, f, e, true)) {
              FAIL() << DTypeName(dtype) << " kernel " << kernel << " count " << count << " offset "
                     << offset << ": element " << i
                     << " differs between the vector kernels and the element loops";
            }
          }
        }
      }
    }
  }
}

// Every test that turns the vector kernels off turns them back on: outside those, they run
// wherever the CPU has them (a build where they never ran would pass every other test).
TEST(KernelsTest, VectorKernelsAreOnWhereTheCpuHasThem) {
  const bool was = SetVectorKernelsForTesting(true);
  SetVectorKernelsForTesting(was);
  EXPECT_EQ(was, VectorKernelsAvailable());
}

// Tensors need not start on a multiple of their element size (DLPack's byte_offset, NumPy
// views into byte buffers): every kernel gives the same bytes at any offset as aligned.
// Typed loads there would be undefined behaviour (UBSan, in the asan config, reports them).
TEST(KernelsTest, UnalignedBuffersGiveTheSameBytes) {
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const size_t count = 3001;  // a block of WeightedSum and a tail
    const size_t bytes = count * DTypeSize(dtype);
    const Buffer a = Pattern(dtype, count, PatternA);
    const Buffer b = Pattern(dtype, count, PatternB);
    const Buffer c = Pattern(dtype, count, PatternC);
    // Each kernel on buffers at byte offset `shift` of their storage; returns the output.
    auto run = [&](size_t shift, int kernel) {
      std::vector<uint8_t> sa(bytes + 8), sb(bytes + 8), sc(bytes + 8), so(bytes + 8);
      uint8_t* pa = sa.data() + shift;
      uint8_t* pb = sb.data() + shift;
      uint8_t* pc = sc.data() + shift;
      uint8_t* po = so.data() + shift;
      std::memcpy(pa, a.data(), bytes);
      std::memcpy(pb, b.data(), bytes);
      std::memcpy(pc, c.data(), bytes);
      std::memcpy(po, c.data(), bytes);
      switch (kernel) {
        case 0:
          WeightedSum(po, dtype, count, {{pa, 0.5}, {pb, 0.25}, {pc, 0.25}});
          break;
        case 1:
          WeightedSum(po, dtype, count, {{pa, 0.5}, {pb, 0.5}});
          break;  // an average
        case 2:
          Add(po, pa, pb, dtype, count);
          break;
        case 3:
          AddInPlace(po, pa, dtype, count);
          break;
        case 4:
          Scale(po, dtype, count, 0.5);
          break;
        case 5:
          Divide(po, dtype, count, 2.0);
          break;
      }
      return std::vector<uint8_t>(po, po + bytes);
    };
    for (int kernel = 0; kernel < 6; ++kernel) {
      const std::vector<uint8_t> aligned = run(0, kernel);
      for (size_t shift = 1; shift < 8; ++shift) {
        EXPECT_EQ(run(shift, kernel), aligned) << "kernel " << kernel << ", offset " << shift;
      }
    }
  }
}

}  // namespace
}  // namespace comm
}  // namespace weft
