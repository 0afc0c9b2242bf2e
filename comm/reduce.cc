#include "comm/reduce.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "comm/rounded_division.h"

namespace weft {
namespace comm {
namespace {

// Element access with conversion to and from the accumulation type. A tensor's data need
// not start on a multiple of its element size (DLPack's byte_offset, a NumPy view into a
// byte buffer), where loads through T* would be undefined: the kernels read and write
// through copies of the types declared with alignment 1 (a GCC and Clang extension), which
// run as fast as typed loads did.
template <typename T>
struct Unaligned;
#define WEFT_UNALIGNED(T, name)               \
  typedef T name __attribute__((aligned(1))); \
  template <>                                 \
  struct Unaligned<T> {                       \
    using type = name;                        \
  };
WEFT_UNALIGNED(float, UnalignedFloat)
WEFT_UNALIGNED(double, UnalignedDouble)
WEFT_UNALIGNED(int8_t, UnalignedInt8)
WEFT_UNALIGNED(uint8_t, UnalignedUInt8)
WEFT_UNALIGNED(int16_t, UnalignedInt16)
WEFT_UNALIGNED(uint16_t, UnalignedUInt16)
WEFT_UNALIGNED(int32_t, UnalignedInt32)
WEFT_UNALIGNED(uint32_t, UnalignedUInt32)
WEFT_UNALIGNED(int64_t, UnalignedInt64)
WEFT_UNALIGNED(uint64_t, UnalignedUInt64)
#undef WEFT_UNALIGNED

template <typename T>
T LoadRaw(const void* p, size_t i) {
  return static_cast<const typename Unaligned<T>::type*>(p)[i];
}

template <typename T>
void StoreRaw(void* p, size_t i, T v) {
  static_cast<typename Unaligned<T>::type*>(p)[i] = v;
}

// std::llround, inline: to nearest, halves away from zero. The library call took half of an
// integer weighted sum's time. Outside int64's range (and for NaN) it defers to llround, so
// every input gives what it gave before (and what the CUDA kernels' llround gives).
inline long long RoundHalfAway(double v) {
  if (!(std::fabs(v) < 9223372036854775808.0)) return std::llround(v);
  long long t = static_cast<long long>(v);  // toward zero
  // Exact: below 2^52 the fraction fits, and from there on doubles are whole numbers.
  const double fraction = v - static_cast<double>(t);
  if (fraction >= 0.5) {
    ++t;
  } else if (fraction <= -0.5) {
    --t;
  }
  return t;
}

template <typename T>
struct Elem {
  using Acc = std::conditional_t<std::is_same<T, float>::value, float, double>;
  static Acc Load(const void* p, size_t i) { return static_cast<Acc>(LoadRaw<T>(p, i)); }
  static void Store(void* p, size_t i, Acc v) {
    if (std::is_integral<T>::value) {
      StoreRaw<T>(p, i, static_cast<T>(RoundHalfAway(v)));
    } else {
      StoreRaw<T>(p, i, static_cast<T>(v));
    }
  }
};

struct Half {};
struct BFloat {};

template <>
struct Elem<Half> {
  using Acc = float;
  static Acc Load(const void* p, size_t i) { return HalfToFloat(LoadRaw<uint16_t>(p, i)); }
  static void Store(void* p, size_t i, Acc v) { StoreRaw<uint16_t>(p, i, FloatToHalf(v)); }
};

template <>
struct Elem<BFloat> {
  using Acc = float;
  static Acc Load(const void* p, size_t i) { return BFloat16ToFloat(LoadRaw<uint16_t>(p, i)); }
  static void Store(void* p, size_t i, Acc v) { StoreRaw<uint16_t>(p, i, FloatToBFloat16(v)); }
};

// divisor > 0: every weight is 1 / divisor, so the terms are added as they are and the sum
// divided once (the arithmetic of an average: the same numbers as sum-then-divide code).
template <typename T>
void WeightedSumImpl(void* out, size_t count, const std::vector<WeightedTerm>& terms,
                     double divisor) {
  using Acc = typename Elem<T>::Acc;
  if (terms.empty()) {
    for (size_t i = 0; i < count; ++i) Elem<T>::Store(out, i, Acc(0));
    return;
  }
  // Blocked so the accumulator stays in cache and each term streams once.
  constexpr size_t kBlock = 2048;
  Acc acc[kBlock];
  const bool average = divisor > 0;
  const Acc d = static_cast<Acc>(divisor);
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t n = std::min(kBlock, count - base);
    const Acc w0 = average ? Acc(1) : static_cast<Acc>(terms[0].weight);
    for (size_t i = 0; i < n; ++i) acc[i] = w0 * Elem<T>::Load(terms[0].data, base + i);
    for (size_t k = 1; k < terms.size(); ++k) {
      const void* src = terms[k].data;
      if (average) {
        for (size_t i = 0; i < n; ++i) acc[i] += Elem<T>::Load(src, base + i);
      } else {
        const Acc w = static_cast<Acc>(terms[k].weight);
        for (size_t i = 0; i < n; ++i) acc[i] += w * Elem<T>::Load(src, base + i);
      }
    }
    if (average) {
      for (size_t i = 0; i < n; ++i) acc[i] /= d;
    }
    for (size_t i = 0; i < n; ++i) Elem<T>::Store(out, base + i, acc[i]);
  }
}

// Floating point: in the accumulation type, rounded once to T. Integers: in T itself, exact
// and wrapping on overflow as MPI_SUM does (a trip through double would lose the low bits
// of int64 values past 2^53).
template <typename T>
void AddImpl(void* out, const void* a, const void* b, size_t count) {
  if constexpr (std::is_integral<T>::value) {
    using U = std::make_unsigned_t<T>;
    for (size_t i = 0; i < count; ++i) {
      StoreRaw<U>(out, i, static_cast<U>(LoadRaw<U>(a, i) + LoadRaw<U>(b, i)));
    }
  } else {
    for (size_t i = 0; i < count; ++i) {
      Elem<T>::Store(out, i, Elem<T>::Load(a, i) + Elem<T>::Load(b, i));
    }
  }
}

// int64 values divided by a whole divisor in int64: the quotient rounded as the double path
// rounds, but exact at any magnitude (narrower integers fit a double exactly).
void DivideInt64(void* x, size_t count, int64_t d) {
  for (size_t i = 0; i < count; ++i)
    StoreRaw<int64_t>(x, i, DivideRounded(LoadRaw<int64_t>(x, i), d));
}

template <template <typename> class F, typename... Args>
void Dispatch(DType dtype, Args&&... args) {
  switch (dtype) {
    case DType::kFloat32: F<float>::Run(args...); break;
    case DType::kFloat64: F<double>::Run(args...); break;
    case DType::kFloat16: F<Half>::Run(args...); break;
    case DType::kBFloat16: F<BFloat>::Run(args...); break;
    case DType::kInt32: F<int32_t>::Run(args...); break;
    case DType::kInt64: F<int64_t>::Run(args...); break;
    case DType::kInt8: F<int8_t>::Run(args...); break;
    case DType::kUInt8: F<uint8_t>::Run(args...); break;
    case DType::kInt16:
      F<int16_t>::Run(args...);
      break;
  }
}

template <typename T>
struct WeightedSumOp {
  static void Run(void* out, size_t count, const std::vector<WeightedTerm>& terms,
                  double divisor) {
    WeightedSumImpl<T>(out, count, terms, divisor);
  }
};

template <typename T>
struct AddOp {
  static void Run(void* out, const void* a, const void* b, size_t count) {
    AddImpl<T>(out, a, b, count);
  }
};

}  // namespace

void WeightedSum(void* out, DType dtype, size_t count, const std::vector<WeightedTerm>& terms) {
  if (terms.size() == 1 && terms[0].weight == 1.0) {  // a copy: exact for every dtype
    if (out != terms[0].data) std::memmove(out, terms[0].data, count * DTypeSize(dtype));
    return;
  }
  // Uniform weights 1/k over k terms: an average.
  const double k = static_cast<double>(terms.size());
  bool uniform = terms.size() > 1;
  for (const WeightedTerm& t : terms) uniform = uniform && t.weight == 1.0 / k;
  Dispatch<WeightedSumOp>(dtype, out, count, terms, uniform ? k : 0.0);
}

void Scale(void* data, DType dtype, size_t count, double factor) {
  WeightedSum(data, dtype, count, {{data, factor}});
}

void Divide(void* data, DType dtype, size_t count, double divisor) {
  if (dtype == DType::kInt64 && divisor >= 1 && divisor <= 1e18 && divisor == std::floor(divisor)) {
    DivideInt64(data, count, static_cast<int64_t>(divisor));
    return;
  }
  Dispatch<WeightedSumOp>(dtype, data, count, std::vector<WeightedTerm>{{data, 1.0}}, divisor);
}

void Add(void* out, const void* a, const void* b, DType dtype, size_t count) {
  Dispatch<AddOp>(dtype, out, a, b, count);
}

void AddInPlace(void* dst, const void* src, DType dtype, size_t count) {
  Add(dst, dst, src, dtype, count);
}

}  // namespace comm
}  // namespace weft
