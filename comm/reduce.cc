#include "comm/reduce.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "comm/rounded_division.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define WEFT_X86_KERNELS 1
#endif

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

// Whether dividing by `d` is multiplying by `*inv`, bit for bit: true when d is a power of
// two (2, 4, 8 ranks or terms) whose reciprocal is a normal number. Both operations then
// round the same exact value once, as IEEE arithmetic does, so they agree on every input
// (subnormal results, infinities and NaN included); a multiplication takes a fraction of a
// division's time, and averages divide every element. A subnormal d has no finite
// reciprocal, and a huge one only a subnormal or zero one: both are refused.
template <typename Acc>
bool ExactReciprocal(Acc d, Acc* inv) {
  int exponent = 0;
  if (!(d > 0) || !std::isfinite(d) || std::frexp(d, &exponent) != Acc(0.5)) return false;
  *inv = Acc(1) / d;
  return std::isnormal(*inv);
}

// How a weighted sum ends: with divisor > 0 it is an average, whose sum is divided by the
// divisor, or multiplied by its reciprocal where that is exact.
template <typename Acc>
struct Ending {
  explicit Ending(double divisor) : average(divisor > 0), d(static_cast<Acc>(divisor)) {
    multiply = average && ExactReciprocal(d, &inv);
  }
  Acc Apply(Acc v) const { return multiply ? v * inv : average ? v / d : v; }

  bool average;
  Acc d;
  Acc inv = 0;
  bool multiply = false;
};

// Whether this CPU can run the kernels of the float dtypes eight elements at a time.
bool CpuHasVectorKernels() {
#ifdef WEFT_X86_KERNELS
  __builtin_cpu_init();  // this may run before the constructors that would otherwise call it
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

std::atomic<bool> g_vector_kernels{CpuHasVectorKernels()};

#ifdef WEFT_X86_KERNELS
// The dtypes that accumulate in float (float32, float16, bfloat16), eight at a time. Element
// by element, float16's conversions (branches for subnormals, infinities and NaN) do not
// vectorize: a 2-rank allreduce of 4 MiB of float16 took 11-15x as long as one of 4 MiB of
// float32; and the build targets plain x86-64, whose vectors hold four floats. Where the
// CPU has AVX2 and F16C (checked at run time; these functions are compiled for them
// whatever the build targets), the kernels convert with the instructions made for it and
// do the same float arithmetic in the same order as the element loops (no fused
// multiply-add: BUILD compiles this file with -ffp-contract=off), whose results they give
// bit for bit, NaN included (reduce_test checks every float16 and bfloat16 value against
// the scalar conversions of core/tensor.h, and float32 on random bit patterns). One
// exception, which the element loops have between builds too: when both operands of a sum
// are NaN, which one the result carries is the compiler's choice. Unaligned loads and
// stores throughout.
#define WEFT_AVX2_F16C __attribute__((target("avx2,f16c")))

struct HalfLanes {
  static constexpr size_t kBytes = 2;
  WEFT_AVX2_F16C static __m256 Load(const char* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  WEFT_AVX2_F16C static void Store(char* p, __m256 f) {
    // FloatToHalf turns every NaN into the quiet NaN 0x7e00 with the input's sign, where
    // the instruction would keep the payload's top bits: give it that NaN's float instead.
    // NaNs are rare: the blend runs only where there are some.
    const __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
    if (__builtin_expect(_mm256_movemask_ps(nan) != 0, 0)) {
      const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
      const __m256 quiet_nan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
      f = _mm256_blendv_ps(f, _mm256_or_ps(_mm256_and_ps(f, sign), quiet_nan), nan);
    }
    const __m128i h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
  }
};

// FloatToBFloat16 in each lane's top half (the bottom half is left over): round to nearest
// even (the float plus 0x7fff plus the lowest bit kept), and a NaN keeps its top bits, made
// quiet (bit 22). NaNs are rare: blending them in only where there are some made the
// store a third faster.
WEFT_AVX2_F16C inline __m256i RoundToBFloatTop(__m256 f) {
  const __m256i bits = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  const __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
  if (__builtin_expect(_mm256_movemask_ps(nan) != 0, 0)) {
    const __m256i quiet = _mm256_or_si256(bits, _mm256_set1_epi32(0x400000));
    rounded = _mm256_blendv_epi8(rounded, quiet, _mm256_castps_si256(nan));
  }
  return rounded;
}

struct BFloatLanes {
  static constexpr size_t kBytes = 2;
  WEFT_AVX2_F16C static __m256 Load(const char* p) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
  }
  WEFT_AVX2_F16C static void Store(char* p, __m256 f) {
    const __m256i b = RoundToBFloatTop(f);
    // The top two bytes of each lane, gathered into the low eight bytes of each 128-bit
    // half, then the two halves' low quadwords side by side.
    const __m256i top =
        _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1, 2, 3, 6, 7, 10,
                         11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i halves = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(b, top), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(halves));
  }
};

struct FloatLanes {
  static constexpr size_t kBytes = 4;  // per element
  WEFT_AVX2_F16C static __m256 Load(const char* p) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  }
  WEFT_AVX2_F16C static void Store(char* p, __m256 f) {
    _mm256_storeu_ps(reinterpret_cast<float*>(p), f);
  }
};

template <typename T>
struct LanesOf;
template <>
struct LanesOf<float> {
  using type = FloatLanes;
};
template <>
struct LanesOf<Half> {
  using type = HalfLanes;
};
template <>
struct LanesOf<BFloat> {
  using type = BFloatLanes;
};

// AddImpl, eight at a time. `out` may be `a` or `b`: each group of eight is read first.
template <typename T>
WEFT_AVX2_F16C void AddLanes(void* out, const void* a, const void* b, size_t count) {
  using L = typename LanesOf<T>::type;
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  char* po = static_cast<char*>(out);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    L::Store(po + L::kBytes * i,
             _mm256_add_ps(L::Load(pa + L::kBytes * i), L::Load(pb + L::kBytes * i)));
  }
  for (; i < count; ++i) Elem<T>::Store(out, i, Elem<T>::Load(a, i) + Elem<T>::Load(b, i));
}

// bfloat16 is the top half of a float: a vector of sixteen holds the floats of its even
// elements shifted up a lane's half, and those of its odd elements masked in place. So
// AddLanes<BFloat> sums sixteen at a time in those two halves and puts the rounded top
// halves back together, without the shuffles that converting to and from eight floats in
// element order takes (which made it 4x slower than float32's, and 1.7x float16's). The
// same float sums and rounding as the element loop, bit for bit.
template <>
WEFT_AVX2_F16C void AddLanes<BFloat>(void* out, const void* a, const void* b, size_t count) {
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  char* po = static_cast<char*>(out);
  const __m256i top = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pa + 2 * i));
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 2 * i));
    const __m256 even = _mm256_add_ps(_mm256_castsi256_ps(_mm256_slli_epi32(x, 16)),
                                      _mm256_castsi256_ps(_mm256_slli_epi32(y, 16)));
    const __m256 odd = _mm256_add_ps(_mm256_castsi256_ps(_mm256_and_si256(x, top)),
                                     _mm256_castsi256_ps(_mm256_and_si256(y, top)));
    const __m256i sum = _mm256_or_si256(_mm256_and_si256(RoundToBFloatTop(odd), top),
                                        _mm256_srli_epi32(RoundToBFloatTop(even), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(po + 2 * i), sum);
  }
  for (; i < count; ++i) {
    Elem<BFloat>::Store(out, i, Elem<BFloat>::Load(a, i) + Elem<BFloat>::Load(b, i));
  }
}

// WeightedSumImpl (below), eight at a time: the same blocks, operations and order.
template <typename T>
WEFT_AVX2_F16C void WeightedSumLanes(void* out, size_t count,
                                     const std::vector<WeightedTerm>& terms, double divisor) {
  using L = typename LanesOf<T>::type;
  constexpr size_t kBlock = 2048;
  alignas(32) float acc[kBlock];
  const Ending<float> end(divisor);
  const bool average = end.average;
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t n = std::min(kBlock, count - base);
    const size_t whole = n - n % 8;
    const float w0 = average ? 1.0f : static_cast<float>(terms[0].weight);
    const char* src = static_cast<const char*>(terms[0].data) + L::kBytes * base;
    for (size_t i = 0; i < whole; i += 8) {
      _mm256_store_ps(acc + i, _mm256_mul_ps(_mm256_set1_ps(w0), L::Load(src + L::kBytes * i)));
    }
    for (size_t i = whole; i < n; ++i) acc[i] = w0 * Elem<T>::Load(src, i);
    for (size_t k = 1; k < terms.size(); ++k) {
      src = static_cast<const char*>(terms[k].data) + L::kBytes * base;
      if (average) {
        for (size_t i = 0; i < whole; i += 8) {
          _mm256_store_ps(acc + i,
                          _mm256_add_ps(_mm256_load_ps(acc + i), L::Load(src + L::kBytes * i)));
        }
        for (size_t i = whole; i < n; ++i) acc[i] += Elem<T>::Load(src, i);
      } else {
        const float w = static_cast<float>(terms[k].weight);
        for (size_t i = 0; i < whole; i += 8) {
          const __m256 x = _mm256_mul_ps(_mm256_set1_ps(w), L::Load(src + L::kBytes * i));
          _mm256_store_ps(acc + i, _mm256_add_ps(_mm256_load_ps(acc + i), x));
        }
        for (size_t i = whole; i < n; ++i) acc[i] += w * Elem<T>::Load(src, i);
      }
    }
    char* dst = static_cast<char*>(out) + L::kBytes * base;
    for (size_t i = 0; i < whole; i += 8) {
      __m256 v = _mm256_load_ps(acc + i);
      if (end.multiply) {
        v = _mm256_mul_ps(v, _mm256_set1_ps(end.inv));
      } else if (average) {
        v = _mm256_div_ps(v, _mm256_set1_ps(end.d));
      }
      L::Store(dst + L::kBytes * i, v);
    }
    for (size_t i = whole; i < n; ++i) Elem<T>::Store(dst, i, end.Apply(acc[i]));
  }
}

template <typename T>
WEFT_AVX2_F16C void FromFloatsLanes(const float* src, void* dst, size_t count) {
  using L = typename LanesOf<T>::type;
  char* p = static_cast<char*>(dst);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) L::Store(p + L::kBytes * i, _mm256_loadu_ps(src + i));
  for (; i < count; ++i) Elem<T>::Store(dst, i, src[i]);
}
#endif  // WEFT_X86_KERNELS

// The dtypes with eight-at-a-time kernels: those that accumulate in float.
template <typename T>
constexpr bool kHasLanes =
    std::is_same<T, float>::value || std::is_same<T, Half>::value || std::is_same<T, BFloat>::value;

#ifdef WEFT_X86_KERNELS
// Whether the eight-at-a-time kernels run now (the CPU has them, no test turned them off).
bool VectorKernelsOn() { return g_vector_kernels.load(std::memory_order_relaxed); }
#endif

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
  const Ending<Acc> end(divisor);
  const bool average = end.average;
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
    if (end.multiply) {
      for (size_t i = 0; i < n; ++i) acc[i] *= end.inv;
    } else if (average) {
      for (size_t i = 0; i < n; ++i) acc[i] /= end.d;
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
#ifdef WEFT_X86_KERNELS
    if constexpr (kHasLanes<T>) {
      if (VectorKernelsOn() && !terms.empty()) {
        return WeightedSumLanes<T>(out, count, terms, divisor);
      }
    }
#endif
    WeightedSumImpl<T>(out, count, terms, divisor);
  }
};

template <typename T>
struct AddOp {
  static void Run(void* out, const void* a, const void* b, size_t count) {
#ifdef WEFT_X86_KERNELS
    if constexpr (kHasLanes<T>) {
      if (VectorKernelsOn()) return AddLanes<T>(out, a, b, count);
    }
#endif
    AddImpl<T>(out, a, b, count);
  }
};

// Float results to T, as the kernels store them.
template <typename T>
void FromFloats(const float* src, void* dst, size_t count) {
#ifdef WEFT_X86_KERNELS
  if (VectorKernelsOn()) return FromFloatsLanes<T>(src, dst, count);
#endif
  for (size_t i = 0; i < count; ++i) Elem<T>::Store(dst, i, src[i]);
}

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

bool VectorKernelsAvailable() { return CpuHasVectorKernels(); }

void FromFloatsForTesting(DType dtype, const float* src, void* dst, size_t count) {
  if (dtype == DType::kFloat16) FromFloats<Half>(src, dst, count);
  if (dtype == DType::kBFloat16) FromFloats<BFloat>(src, dst, count);
}

bool SetVectorKernelsForTesting(bool enabled) {
  return g_vector_kernels.exchange(enabled && CpuHasVectorKernels());
}

}  // namespace comm
}  // namespace weft
