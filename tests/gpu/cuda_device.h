// What the GPU tests share: whether this process can use a CUDA device, and skipping a
// test, with the reason, when it cannot (CI has none; tests/gpu/run.sh runs them on a GPU
// machine).
#ifndef WEFT_TESTS_GPU_CUDA_DEVICE_H_
#define WEFT_TESTS_GPU_CUDA_DEVICE_H_

#include <cuda_runtime.h>

#include <string>

#include "gtest/gtest.h"

namespace weft {
namespace gpu_testing {

// Empty if a CUDA device is usable, else why not.
inline std::string NoDeviceReason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
  if (count == 0) return "cudaGetDeviceCount found 0 devices";
  return "";
}

}  // namespace gpu_testing
}  // namespace weft

#define SKIP_WITHOUT_DEVICE()                                                            \
  do {                                                                                   \
    const std::string why = ::weft::gpu_testing::NoDeviceReason();                       \
    if (!why.empty()) {                                                                  \
      GTEST_SKIP() << "no CUDA device: " << why << " (tests/gpu/run.sh runs these on a " \
                   << "GPU machine)";                                                    \
    }                                                                                    \
  } while (0)

#endif  // WEFT_TESTS_GPU_CUDA_DEVICE_H_
