#include "core/tensor.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "gtest/gtest.h"

namespace weft {
namespace {

TEST(TensorView, ContiguousViewDescribesItsMemory) {
  float data[12];
  TensorView v(data, DType::kFloat32, {3, 4});
  EXPECT_EQ(v.numel(), 12);
  EXPECT_EQ(v.nbytes(), 48u);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.strides(), (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(v.ToString(), "float32[3, 4] on cpu");
}

TEST(TensorView, TransposedViewIsNotContiguous) {
  float data[12];
  TensorView v(data, DType::kFloat32, {4, 3}, {1, 4}, Device::CPU());
  EXPECT_FALSE(v.is_contiguous());
}

// Up to six dimensions live inside the view, more on the heap: copies (every op keeps
// copies of its views) and DLPack exports are the same either way, and a copy owns its
// dimensions (the original can go).
TEST(TensorView, CopiesKeepTheirDimensionsInlineOrOnTheHeap) {
  float data[256];
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{}, std::vector<int64_t>{256}, std::vector<int64_t>{2, 2, 2, 2, 4, 4},
        std::vector<int64_t>{2, 2, 2, 2, 2, 2, 2, 2}}) {
    std::optional<TensorView> original(std::in_place, data, DType::kFloat32, shape);
    const std::vector<int64_t> strides = ContiguousStrides(shape);
    TensorView copy = *original;
    TensorView assigned(data, DType::kFloat32, {1});
    assigned = *original;
    original.reset();
    for (const TensorView* v : {&copy, &assigned}) {
      EXPECT_EQ(v->shape(), shape) << ShapeToString(shape);
      EXPECT_EQ(v->strides(), strides) << ShapeToString(shape);
      EXPECT_EQ(v->ndim(), static_cast<int>(shape.size()));
      EXPECT_EQ(v->numel(), shape.empty() ? 1 : 256);
      EXPECT_TRUE(v->is_contiguous());
      const DLTensor dl = v->ToDLTensor();
      ASSERT_EQ(dl.ndim, static_cast<int>(shape.size()));
      for (size_t i = 0; i < shape.size(); ++i) {
        EXPECT_EQ(dl.shape[i], shape[i]);
        EXPECT_EQ(dl.strides[i], strides[i]);
      }
    }
  }
}

TEST(TensorView, RoundTripsThroughDLPackForEveryDType) {
  const DType all[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                       DType::kInt32,   DType::kInt64,   DType::kInt8,    DType::kUInt8};
  int64_t storage[8];
  for (DType d : all) {
    TensorView v(storage, d, {2, 2});
    DLTensor dl = v.ToDLTensor();
    auto back = TensorView::FromDLTensor(dl);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->dtype(), d);
    EXPECT_EQ(back->shape(), v.shape());
    EXPECT_EQ(back->data(), v.data());
    EXPECT_EQ(DTypeSize(d) * 8, dl.dtype.bits) << DTypeName(d);
  }
}

TEST(TensorView, UnsupportedDLPackTypesAreClearErrors) {
  int64_t shape[1] = {4};
  float data[4];
  DLTensor dl{};
  dl.data = data;
  dl.device = {kDLCPU, 0};
  dl.ndim = 1;
  dl.shape = shape;
  dl.dtype = {kDLComplex, 64, 1};
  auto v = TensorView::FromDLTensor(dl);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(v.status().message().find("weft supports float32"), std::string::npos);
  dl.dtype = {kDLFloat, 32, 1};
  dl.device = {kDLVulkan, 0};
  EXPECT_FALSE(TensorView::FromDLTensor(dl).ok());
}

// Shapes whose element count or byte span overflows int64 are refused, not wrapped into
// small or negative sizes; an empty dimension makes any other one harmless.
TEST(TensorView, ShapesBeyondTwoToTheSixtyThreeBytesAreRefused) {
  float data[4];
  DLTensor dl{};
  dl.data = data;
  dl.device = {kDLCPU, 0};
  dl.dtype = {kDLFloat, 32, 1};
  const int64_t big = int64_t{1} << 62;
  for (std::vector<int64_t> shape : std::vector<std::vector<int64_t>>{
           {big, 4}, {INT64_MAX}, {big / 2}, {3037000500, 3037000500}, {big, 2, 2}}) {
    dl.ndim = static_cast<int32_t>(shape.size());
    dl.shape = shape.data();
    auto v = TensorView::FromDLTensor(dl);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << ShapeToString(shape);
    EXPECT_NE(v.status().message().find("2^63 bytes"), std::string::npos) << v.status();
  }
  std::vector<int64_t> empty = {INT64_MAX, 0, INT64_MAX};
  dl.ndim = 3;
  dl.shape = empty.data();
  EXPECT_TRUE(TensorView::FromDLTensor(dl).ok());
  // Strides that reach past 2^63 bytes.
  std::vector<int64_t> shape = {2, 2}, strides = {INT64_MAX / 2, 1};
  dl.ndim = 2;
  dl.shape = shape.data();
  dl.strides = strides.data();
  EXPECT_EQ(TensorView::FromDLTensor(dl).status().code(), absl::StatusCode::kInvalidArgument);
  strides = {INT64_MIN, 1};
  EXPECT_EQ(TensorView::FromDLTensor(dl).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorView, ByteOffsetIsApplied) {
  int64_t shape[1] = {2};
  float data[4] = {1, 2, 3, 4};
  DLTensor dl{};
  dl.data = data;
  dl.device = {kDLCPU, 0};
  dl.ndim = 1;
  dl.shape = shape;
  dl.dtype = {kDLFloat, 32, 1};
  dl.byte_offset = 8;
  auto v = TensorView::FromDLTensor(dl);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(static_cast<float*>(v->data())[0], 3.0f);
}

TEST(TensorView, AnOffsetFromNullDataIsRefused) {
  // NULL + offset would pass as a pointer (the C ABI descriptor fuzz test crashed on it).
  int64_t shape[1] = {2};
  DLTensor dl{};
  dl.data = nullptr;
  dl.device = {kDLCPU, 0};
  dl.ndim = 1;
  dl.shape = shape;
  dl.dtype = {kDLFloat, 32, 1};
  dl.byte_offset = uint64_t{1} << 40;
  auto v = TensorView::FromDLTensor(dl);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("NULL data and byte_offset"), std::string::npos);
  dl.byte_offset = 0;  // NULL data alone is for the op's checks to refuse (or an empty tensor)
  EXPECT_TRUE(TensorView::FromDLTensor(dl).ok());
}

TEST(HalfPrecision, ConversionsRoundTripRepresentableValues) {
  for (float f : {0.0f, 1.0f, -2.5f, 0.333251953125f, 65504.0f, 6.103515625e-05f,
                  5.960464477539063e-08f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(f)), f) << f;
  }
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(1e6f))));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::numeric_limits<float>::quiet_NaN()))));
  // Round to nearest even: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f + 1.0f / 2048)), 1.0f);
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
}

TEST(BFloat16, ConversionsRoundToNearestEven) {
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f)), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(-3.0f)), -3.0f);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f + 1.0f / 256)), 1.0f);  // tie: even
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
}

}  // namespace
}  // namespace weft
