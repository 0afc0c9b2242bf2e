// The NCCL backend's device kernels (comm/nccl/kernels.h) against the CPU kernels
// (comm/reduce.h), byte for byte: an average or a weighted sum must give the same numbers
// whichever device a tensor is on. Skips without a CUDA device (tests/gpu/run.sh runs it on
// a GPU machine).
#include "comm/nccl/kernels.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "comm/reduce.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "tests/comm/test_util.h"
#include "tests/gpu/cuda_device.h"

namespace weft {
namespace comm {
namespace {

using nccl::DeviceTerm;
using nccl::DeviceType;

class Kernels : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_DEVICE();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
};

// Raw bytes on the device.
class DeviceBytes {
 public:
  explicit DeviceBytes(const std::vector<uint8_t>& host) : size_(host.size()) {
    EXPECT_EQ(cudaMalloc(&data_, size_ == 0 ? 1 : size_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host.data(), size_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBytes() { cudaFree(data_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void* data() const { return data_; }
  std::vector<uint8_t> Download() const {
    std::vector<uint8_t> out(size_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data(), data_, size_, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  size_t size_;
  void* data_ = nullptr;
};

// Values that make rounding differences show: halves after division by an even divisor,
// thirds, negatives (not for uint8), and for int64 magnitudes past 2^53 and (with
// `extremes`) its ends.
std::vector<uint8_t> Values(DType dtype, size_t count, int salt, bool extremes = true) {
  testing::Buffer buffer(dtype, {static_cast<int64_t>(count)});
  const bool is_unsigned = dtype == DType::kUInt8;
  const bool is_float = IsFloatingPoint(dtype);
  for (size_t i = 0; i < count; ++i) {
    const int64_t n = static_cast<int64_t>((i * 7 + static_cast<size_t>(salt) * 13) % 101);
    double v = static_cast<double>(is_unsigned ? n * 2 : n - 50);  // fits int8 and uint8
    if (is_float) v = v * 0.75 + static_cast<double>(i % 7) / 8.0;
    buffer.Set(static_cast<int64_t>(i), v);
  }
  const TensorView view = buffer.view();
  const uint8_t* data = static_cast<const uint8_t*>(view.data());
  std::vector<uint8_t> bytes(data, data + view.nbytes());
  if (dtype == DType::kInt64) {
    int64_t* x = reinterpret_cast<int64_t*>(bytes.data());
    const int64_t big = (int64_t{1} << 55) + salt;
    for (size_t i = 0; i < count; i += 3)
      x[i] = (i % 2 == 0 ? 1 : -1) * (big + static_cast<int64_t>(i));
    if (extremes) {
      x[0] = std::numeric_limits<int64_t>::max() - salt;
      x[1] = std::numeric_limits<int64_t>::min() + 1 + salt;
    }
  }
  return bytes;
}

constexpr DType kDTypes[] = {DType::kFloat32,  DType::kFloat64, DType::kFloat16,
                             DType::kBFloat16, DType::kInt32,   DType::kInt64,
                             DType::kInt8,     DType::kUInt8,   DType::kInt16};

TEST_F(Kernels, DivideMatchesTheCpu) {
  const size_t count = 5000;  // more than one block, a partial last one
  for (DType dtype : kDTypes) {
    const std::vector<uint8_t> in = Values(dtype, count, 0);
    for (int64_t divisor : {2, 3, 6, 7}) {
      std::vector<uint8_t> cpu = in;
      Divide(cpu.data(), dtype, count, static_cast<double>(divisor));
      DeviceBytes gpu(in);
      ASSERT_EQ(
          nccl::LaunchDivide(gpu.data(), static_cast<DeviceType>(dtype), count, divisor, nullptr),
          cudaSuccess);
      EXPECT_EQ(gpu.Download(), cpu) << DTypeName(dtype) << " / " << divisor;
    }
  }
}

// A uniform average's division is Divide's; other weights go through the weighted sum,
// whose integers accumulate in double on both devices.
TEST_F(Kernels, WeightedSumMatchesTheCpu) {
  const size_t count = 5000;
  for (DType dtype : kDTypes) {
    // Not int64's ends: their weighted sum in double can round to 2^63, past int64, where
    // the two devices' conversions differ (the CPU's and CUDA's llround are both undefined).
    const std::vector<uint8_t> a = Values(dtype, count, 1, /*extremes=*/false);
    const std::vector<uint8_t> b = Values(dtype, count, 2, /*extremes=*/false);
    const std::vector<uint8_t> c = Values(dtype, count, 3, /*extremes=*/false);
    // float64 and the integers accumulate in double, the other floats in float: weights
    // that are exact in both leave only the kernels' own arithmetic to compare.
    const std::vector<double> weights = {0.5, 0.25, 0.25};
    std::vector<uint8_t> cpu = a;
    WeightedSum(cpu.data(), dtype, count,
                {{cpu.data(), weights[0]}, {b.data(), weights[1]}, {c.data(), weights[2]}});
    DeviceBytes out(a), db(b), dc(c);
    const DeviceTerm terms[] = {
        {out.data(), weights[0]}, {db.data(), weights[1]}, {dc.data(), weights[2]}};
    ASSERT_EQ(nccl::LaunchWeightedSum(out.data(), static_cast<DeviceType>(dtype), count, terms, 3,
                                      nullptr),
              cudaSuccess);
    EXPECT_EQ(out.Download(), cpu) << DTypeName(dtype);
  }
}

TEST_F(Kernels, DivideRefusesANonPositiveDivisor) {
  DeviceBytes x(Values(DType::kInt64, 4, 0));
  EXPECT_EQ(nccl::LaunchDivide(x.data(), DeviceType::kInt64, 4, 0, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace comm
}  // namespace weft
