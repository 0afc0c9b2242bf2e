// The one tensor view of weft: a non-owning description of memory (data, dtype, shape,
// strides, device) that converts to and from DLPack's DLTensor. comm moves the bytes a view
// describes; framework tensors (LibTorch) are adapted to views at the edges.
#ifndef WEFT_CORE_TENSOR_H_
#define WEFT_CORE_TENSOR_H_

#include <dlpack/dlpack.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/base/casts.h"
#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "core/status.h"

namespace weft {

enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kInt8 = 6,
  kUInt8 = 7,
  kInt16 = 8,
};
constexpr int kNumDTypes = 9;

size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);  // "float32", ...
bool IsFloatingPoint(DType dtype);
DLDataType ToDLDataType(DType dtype);
StatusOr<DType> FromDLDataType(DLDataType dl);

struct Device {
  enum class Type : uint8_t { kCPU = 0, kCUDA = 1 };
  Type type = Type::kCPU;
  int index = 0;

  static Device CPU() { return Device{}; }
  static Device CUDA(int index) { return Device{Type::kCUDA, index}; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string ToString() const;  // "cpu", "cuda:0"
};

// A shape or strides. Up to six dimensions are held inside the object itself, so that
// copying a view (each op keeps copies of its tensors' views) allocates nothing.
using Dims = absl::InlinedVector<int64_t, 6>;

class TensorView {
 public:
  TensorView() = default;
  // A contiguous (row-major) view.
  TensorView(void* data, DType dtype, absl::Span<const int64_t> shape,
             Device device = Device::CPU());
  TensorView(void* data, DType dtype, absl::Span<const int64_t> shape,
             absl::Span<const int64_t> strides, Device device);

  // Borrows the DLTensor's memory; rejects dtypes and devices weft does not support.
  static StatusOr<TensorView> FromDLTensor(const DLTensor& dl);
  // The returned DLTensor points into this view's shape and strides: keep the view alive.
  DLTensor ToDLTensor() const;

  void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  absl::Span<const int64_t> shape() const { return shape_; }
  absl::Span<const int64_t> strides() const { return strides_; }  // in elements
  const Device& device() const { return device_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const;
  size_t itemsize() const { return DTypeSize(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * itemsize(); }
  bool is_contiguous() const;
  bool defined() const { return data_ != nullptr || numel() == 0; }

  // "float32[4, 3] on cpu"
  std::string ToString() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kFloat32;
  Dims shape_;
  Dims strides_;
  Device device_;
};

std::string ShapeToString(absl::Span<const int64_t> shape);  // "[4, 3]"
std::vector<int64_t> ContiguousStrides(absl::Span<const int64_t> shape);
// The product of the dims. Computed in uint64_t: a dim of 0 makes it 0 whatever the others,
// whose product may pass int64 (the tensor checks allow that for an empty tensor) without
// being undefined.
int64_t NumElements(absl::Span<const int64_t> shape);

// IEEE half and bfloat16 conversions used by the CPU reductions. Inline, so that the
// reduction loops over 16-bit floats compile without a call per element (out of line, the
// kernels took about 2x as long on float16 and 2-3x on bfloat16).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t rest = h & 0x7fff;
  uint32_t bits;
  if (rest >= 0x7c00) {  // inf, nan (payload kept)
    bits = 0x7f800000 | ((rest & 0x3ff) << 13);
  } else if (rest >= 0x0400) {  // normal: rebias the exponent
    bits = (rest << 13) + ((127 - 15) << 23);
  } else {  // zero and subnormals: mantissa * 2^-24, exact in float
    bits = absl::bit_cast<uint32_t>(static_cast<float>(rest) * 5.9604644775390625e-08f);
  }
  return absl::bit_cast<float>(bits | sign);
}

// Round to nearest even; overflow gives inf, nan a quiet nan.
inline uint16_t FloatToHalf(float f) {
  const uint32_t bits = absl::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7fffffff;
  if (abs >= 0x7f800000) {  // inf or nan
    return sign | 0x7c00 | (abs > 0x7f800000 ? 0x200 : 0);
  }
  if (abs >= 0x477ff000) return sign | 0x7c00;  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000) {  // below the smallest normal half: a subnormal one (or zero)
    // Adding 0.5, whose last mantissa bit is worth 2^-24, leaves value * 2^24 rounded to
    // nearest even (the FPU's rounding) in the sum's low mantissa bits.
    const float sum = absl::bit_cast<float>(abs) + 0.5f;
    return sign | static_cast<uint16_t>(absl::bit_cast<uint32_t>(sum) - 0x3f000000u);
  }
  const uint32_t mantissa_odd = (abs >> 13) & 1;
  const uint32_t rounded = abs + 0xfff + mantissa_odd;
  return sign | static_cast<uint16_t>((rounded - (112u << 23)) >> 13);
}

inline float BFloat16ToFloat(uint16_t b) {
  return absl::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

// Round to nearest even; nan stays a (quiet) nan.
inline uint16_t FloatToBFloat16(float f) {
  uint32_t bits = absl::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t lsb = (bits >> 16) & 1;
  bits += 0x7fff + lsb;
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace weft

#endif  // WEFT_CORE_TENSOR_H_
