#include "comm/reduce.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace weft {
namespace comm {
namespace {

// Element access with conversion to and from the accumulation type.
template <typename T>
struct Elem {
  using Acc = std::conditional_t<std::is_same<T, float>::value, float, double>;
  static Acc Load(const void* p, size_t i) { return static_cast<Acc>(static_cast<const T*>(p)[i]); }
  static void Store(void* p, size_t i, Acc v) {
    if (std::is_integral<T>::value) {
      static_cast<T*>(p)[i] = static_cast<T>(std::llround(v));
    } else {
      static_cast<T*>(p)[i] = static_cast<T>(v);
    }
  }
};

struct Half {};
struct BFloat {};

template <>
struct Elem<Half> {
  using Acc = float;
  static Acc Load(const void* p, size_t i) { return HalfToFloat(static_cast<const uint16_t*>(p)[i]); }
  static void Store(void* p, size_t i, Acc v) { static_cast<uint16_t*>(p)[i] = FloatToHalf(v); }
};

template <>
struct Elem<BFloat> {
  using Acc = float;
  static Acc Load(const void* p, size_t i) {
    return BFloat16ToFloat(static_cast<const uint16_t*>(p)[i]);
  }
  static void Store(void* p, size_t i, Acc v) {
    static_cast<uint16_t*>(p)[i] = FloatToBFloat16(v);
  }
};

template <typename T>
void WeightedSumImpl(void* out, size_t count, const std::vector<WeightedTerm>& terms) {
  using Acc = typename Elem<T>::Acc;
  if (terms.empty()) {
    for (size_t i = 0; i < count; ++i) Elem<T>::Store(out, i, Acc(0));
    return;
  }
  // Blocked so the accumulator stays in cache and each term streams once.
  constexpr size_t kBlock = 2048;
  Acc acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t n = std::min(kBlock, count - base);
    const Acc w0 = static_cast<Acc>(terms[0].weight);
    for (size_t i = 0; i < n; ++i) acc[i] = w0 * Elem<T>::Load(terms[0].data, base + i);
    for (size_t k = 1; k < terms.size(); ++k) {
      const Acc w = static_cast<Acc>(terms[k].weight);
      const void* src = terms[k].data;
      for (size_t i = 0; i < n; ++i) acc[i] += w * Elem<T>::Load(src, base + i);
    }
    for (size_t i = 0; i < n; ++i) Elem<T>::Store(out, base + i, acc[i]);
  }
}

template <typename T>
void AddImpl(void* dst, const void* src, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    Elem<T>::Store(dst, i, Elem<T>::Load(dst, i) + Elem<T>::Load(src, i));
  }
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
  }
}

template <typename T>
struct WeightedSumOp {
  static void Run(void* out, size_t count, const std::vector<WeightedTerm>& terms) {
    WeightedSumImpl<T>(out, count, terms);
  }
};

template <typename T>
struct AddOp {
  static void Run(void* dst, const void* src, size_t count) { AddImpl<T>(dst, src, count); }
};

}  // namespace

void WeightedSum(void* out, DType dtype, size_t count, const std::vector<WeightedTerm>& terms) {
  if (terms.size() == 1 && terms[0].weight == 1.0) {  // a copy: exact for every dtype
    if (out != terms[0].data) std::memmove(out, terms[0].data, count * DTypeSize(dtype));
    return;
  }
  Dispatch<WeightedSumOp>(dtype, out, count, terms);
}

void Scale(void* data, DType dtype, size_t count, double factor) {
  WeightedSum(data, dtype, count, {{data, factor}});
}

void AddInPlace(void* dst, const void* src, DType dtype, size_t count) {
  Dispatch<AddOp>(dtype, dst, src, count);
}

}  // namespace comm
}  // namespace weft
