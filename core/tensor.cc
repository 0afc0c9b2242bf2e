#include "core/tensor.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_join.h"

namespace weft {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kInt8: return 1;
    case DType::kUInt8: return 1;
    case DType::kInt16:
      return 2;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kInt16:
      return "int16";
  }
  return "unknown";
}

bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kFloat16 ||
         dtype == DType::kBFloat16;
}

DLDataType ToDLDataType(DType dtype) {
  DLDataType dl;
  dl.lanes = 1;
  dl.bits = static_cast<uint8_t>(DTypeSize(dtype) * 8);
  switch (dtype) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kFloat16: dl.code = kDLFloat; break;
    case DType::kBFloat16: dl.code = kDLBfloat; break;
    case DType::kInt32:
    case DType::kInt64:
    case DType::kInt8:
    case DType::kInt16:
      dl.code = kDLInt;
      break;
    case DType::kUInt8: dl.code = kDLUInt; break;
  }
  return dl;
}

StatusOr<DType> FromDLDataType(DLDataType dl) {
  if (dl.lanes == 1) {
    if (dl.code == kDLFloat && dl.bits == 32) return DType::kFloat32;
    if (dl.code == kDLFloat && dl.bits == 64) return DType::kFloat64;
    if (dl.code == kDLFloat && dl.bits == 16) return DType::kFloat16;
    if (dl.code == kDLBfloat && dl.bits == 16) return DType::kBFloat16;
    if (dl.code == kDLInt && dl.bits == 32) return DType::kInt32;
    if (dl.code == kDLInt && dl.bits == 64) return DType::kInt64;
    if (dl.code == kDLInt && dl.bits == 8) return DType::kInt8;
    if (dl.code == kDLUInt && dl.bits == 8) return DType::kUInt8;
    if (dl.code == kDLInt && dl.bits == 16) return DType::kInt16;
  }
  return Unimplemented("unsupported dtype (DLPack code ", static_cast<int>(dl.code), ", ",
                       static_cast<int>(dl.bits), " bits, ", static_cast<int>(dl.lanes),
                       " lanes): weft supports float32, float64, float16, bfloat16, int32, "
                       "int64, int16, int8 and uint8");
}

std::string Device::ToString() const {
  return type == Type::kCPU ? "cpu" : absl::StrCat("cuda:", index);
}

namespace {

// Row-major strides of `shape` into `strides` (resized to match).
template <typename Out>
void FillContiguousStrides(absl::Span<const int64_t> shape, Out* strides) {
  strides->resize(shape.size());
  int64_t stride = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    (*strides)[i] = stride;
    stride *= shape[i];
  }
}

}  // namespace

std::vector<int64_t> ContiguousStrides(absl::Span<const int64_t> shape) {
  std::vector<int64_t> strides;
  FillContiguousStrides(shape, &strides);
  return strides;
}

std::string ShapeToString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

TensorView::TensorView(void* data, DType dtype, absl::Span<const int64_t> shape, Device device)
    : data_(data), dtype_(dtype), shape_(shape.begin(), shape.end()), device_(device) {
  FillContiguousStrides(shape_, &strides_);
}

TensorView::TensorView(void* data, DType dtype, absl::Span<const int64_t> shape,
                       absl::Span<const int64_t> strides, Device device)
    : data_(data),
      dtype_(dtype),
      shape_(shape.begin(), shape.end()),
      strides_(strides.begin(), strides.end()),
      device_(device) {}

StatusOr<TensorView> TensorView::FromDLTensor(const DLTensor& dl) {
  WEFT_ASSIGN_OR_RETURN(DType dtype, FromDLDataType(dl.dtype));
  // Read as the integer it is: a C caller may put any value in the enum, and loading one
  // outside the enum's range as DLDeviceType is undefined in C++.
  static_assert(sizeof(dl.device.device_type) == sizeof(int32_t), "DLDeviceType is 32 bits");
  int32_t device_type = 0;
  std::memcpy(&device_type, &dl.device.device_type, sizeof device_type);
  Device device;
  if (device_type == kDLCPU || device_type == kDLCUDAHost) {
    device = Device::CPU();
  } else if (device_type == kDLCUDA) {
    device = Device::CUDA(dl.device.device_id);
  } else {
    return Unimplemented("unsupported device type ", device_type,
                         ": weft supports CPU and CUDA tensors");
  }
  if (dl.ndim < 0) return InvalidArgument("DLTensor has negative ndim ", dl.ndim);
  if (dl.ndim > 0 && dl.shape == nullptr) return InvalidArgument("DLTensor has no shape");
  std::vector<int64_t> shape(dl.shape, dl.shape + dl.ndim);
  for (int64_t d : shape) {
    if (d < 0) return InvalidArgument("DLTensor has a negative dimension: ", ShapeToString(shape));
  }
  // The element count and the bytes it spans must be representable: a shape whose product
  // overflows would otherwise pass as a small (or negative) tensor.
  const int64_t item = static_cast<int64_t>(DTypeSize(dtype));
  const bool empty = std::find(shape.begin(), shape.end(), 0) != shape.end();
  int64_t bytes = empty ? 0 : item;
  for (int64_t d : shape) {
    if (!empty && __builtin_mul_overflow(bytes, d, &bytes)) {
      return InvalidArgument("DLTensor of shape ", ShapeToString(shape), " and dtype ",
                             DTypeName(dtype), " has more than 2^63 bytes");
    }
  }
  std::vector<int64_t> strides = dl.strides != nullptr
                                     ? std::vector<int64_t>(dl.strides, dl.strides + dl.ndim)
                                     : ContiguousStrides(shape);
  if (bytes > 0) {
    // The farthest element from the first, in bytes, must be representable too.
    int64_t span = 0;
    for (int i = 0; i < dl.ndim; ++i) {
      int64_t step = 0;
      // INT64_MIN has no negation: test it before taking the magnitude.
      const bool unrepresentable = strides[i] == INT64_MIN;
      const int64_t stride = unrepresentable ? 0 : strides[i] < 0 ? -strides[i] : strides[i];
      if (unrepresentable || __builtin_mul_overflow(stride, shape[i] - 1, &step) ||
          __builtin_mul_overflow(step, item, &step) || __builtin_add_overflow(span, step, &span)) {
        return InvalidArgument("DLTensor of shape ", ShapeToString(shape), " and strides ",
                               ShapeToString(strides), " spans more than 2^63 bytes");
      }
    }
  }
  // An offset from no memory is no address (and past a NULL check downstream, a crash).
  if (dl.data == nullptr && dl.byte_offset != 0) {
    return InvalidArgument("DLTensor has NULL data and byte_offset ", dl.byte_offset);
  }
  char* data = dl.data == nullptr ? nullptr : static_cast<char*>(dl.data) + dl.byte_offset;
  return TensorView(data, dtype, shape, strides, device);
}

DLTensor TensorView::ToDLTensor() const {
  DLTensor dl;
  dl.data = data_;
  dl.device.device_type = device_.type == Device::Type::kCPU ? kDLCPU : kDLCUDA;
  dl.device.device_id = device_.index;
  dl.ndim = ndim();
  dl.dtype = ToDLDataType(dtype_);
  dl.shape = const_cast<int64_t*>(shape_.data());
  dl.strides = const_cast<int64_t*>(strides_.data());
  dl.byte_offset = 0;
  return dl;
}

int64_t NumElements(absl::Span<const int64_t> shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return static_cast<int64_t>(n);
}

int64_t TensorView::numel() const { return NumElements(shape_); }

bool TensorView::is_contiguous() const {
  if (numel() == 0) return true;  // no element to be out of place (torch.empty(0, 3))
  int64_t expected = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

std::string TensorView::ToString() const {
  return absl::StrCat(DTypeName(dtype_), ShapeToString(shape_), " on ", device_.ToString());
}

}  // namespace weft
