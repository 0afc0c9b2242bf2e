#include "core/tensor.h"

#include <cmath>
#include <limits>

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
