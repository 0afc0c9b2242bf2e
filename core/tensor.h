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

class TensorView {
 public:
  TensorView() = default;
  // A contiguous (row-major) view.
  TensorView(void* data, DType dtype, std::vector<int64_t> shape, Device device = Device::CPU());
  TensorView(void* data, DType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides,
             Device device);

  // Borrows the DLTensor's memory; rejects dtypes and devices weft does not support.
  static StatusOr<TensorView> FromDLTensor(const DLTensor& dl);
  // The returned DLTensor points into this view's shape and strides: keep the view alive.
  DLTensor ToDLTensor() const;

  void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }  // in elements
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
  std::vector<int64_t> shape_;
  std::vector<int64_t> strides_;
  Device device_;
};

std::string ShapeToString(const std::vector<int64_t>& shape);  // "[4, 3]"
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape);
// The product of the dims. Computed in uint64_t: a dim of 0 makes it 0 whatever the others,
// whose product may pass int64 (the tensor checks allow that for an empty tensor) without
// being undefined.
int64_t NumElements(const std::vector<int64_t>& shape);

// IEEE half and bfloat16 conversions used by the CPU reductions.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);  // round to nearest even
inline float BFloat16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
uint16_t FloatToBFloat16(float f);  // round to nearest even

}  // namespace weft

#endif  // WEFT_CORE_TENSOR_H_
