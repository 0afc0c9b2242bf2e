// Device kernels the NCCL backend needs besides NCCL itself: the weighted sums that combine
// received buffers, and the division that ends an average. They follow the CPU kernels'
// rules (comm/reduce.h) and give the same numbers: float32/float16/bfloat16 accumulate in
// float, float64 and integers in double, integers round to nearest with halves away from
// zero, and int64 divides exactly in int64. Compiled by nvcc (kernels.cu), so this header
// uses no CUDA-only syntax and no weft headers.
#ifndef WEFT_COMM_NCCL_KERNELS_H_
#define WEFT_COMM_NCCL_KERNELS_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace weft {
namespace comm {
namespace nccl {

// Element types, numbered as weft::DType (kernels.cu cannot include core/).
enum class DeviceType : int {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kInt8 = 6,
  kUInt8 = 7,
  kInt16 = 8,  // weighted sums only: NCCL has no 16-bit integers (int16 ops run staged on MPI)
};

struct DeviceTerm {
  const void* data;  // device memory
  double weight;
};

// out[i] = sum_k terms[k].weight * terms[k].data[i] for i < count, enqueued on `stream`.
// `out` may alias terms[0].data, not the others. More than kMaxTermsPerLaunch terms run
// as several launches (integers then round once per launch).
constexpr int kMaxTermsPerLaunch = 32;
cudaError_t LaunchWeightedSum(void* out, DeviceType type, size_t count, const DeviceTerm* terms,
                              int num_terms, cudaStream_t stream);

// data[i] /= divisor (> 0) for i < count, enqueued on `stream`: an average after a sum, as
// the CPU's Divide computes it (a weight of 1/divisor would round differently, and would
// lose the low bits of int64 values past 2^53).
cudaError_t LaunchDivide(void* data, DeviceType type, size_t count, int64_t divisor,
                         cudaStream_t stream);

}  // namespace nccl
}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_NCCL_KERNELS_H_
