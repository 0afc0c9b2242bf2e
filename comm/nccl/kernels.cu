// Weighted sums and averages on the device (see kernels.h). Built with --fmad=false so that
// the sums round like the CPU kernels' (a fused multiply-add would differ in the last bit).
#include "comm/nccl/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "comm/rounded_division.h"

namespace weft {
namespace comm {
namespace nccl {
namespace {

struct Terms {
  const void* data[kMaxTermsPerLaunch];
  double weight[kMaxTermsPerLaunch];
  int count;
};

// Load/store with conversion to the accumulation type, as comm/reduce.cc does.
template <typename T>
struct Elem {
  using Acc = double;  // float64 and the integers
  __device__ static Acc Load(const void* p, size_t i) {
    return static_cast<Acc>(static_cast<const T*>(p)[i]);
  }
  __device__ static void Store(void* p, size_t i, Acc v) {
    static_cast<T*>(p)[i] = static_cast<T>(llround(v));
  }
};
template <>
struct Elem<double> {
  using Acc = double;
  __device__ static Acc Load(const void* p, size_t i) { return static_cast<const double*>(p)[i]; }
  __device__ static void Store(void* p, size_t i, Acc v) { static_cast<double*>(p)[i] = v; }
};
template <>
struct Elem<float> {
  using Acc = float;
  __device__ static Acc Load(const void* p, size_t i) { return static_cast<const float*>(p)[i]; }
  __device__ static void Store(void* p, size_t i, Acc v) { static_cast<float*>(p)[i] = v; }
};
template <>
struct Elem<__half> {
  using Acc = float;
  __device__ static Acc Load(const void* p, size_t i) {
    return __half2float(static_cast<const __half*>(p)[i]);
  }
  __device__ static void Store(void* p, size_t i, Acc v) {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  }
};
template <>
struct Elem<__nv_bfloat16> {
  using Acc = float;
  __device__ static Acc Load(const void* p, size_t i) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
  __device__ static void Store(void* p, size_t i, Acc v) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  }
};

template <typename T>
__global__ void WeightedSumKernel(void* out, size_t count, Terms terms) {
  using Acc = typename Elem<T>::Acc;
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    // Same order as the CPU: first term times its weight, then the others added in turn.
    Acc acc = static_cast<Acc>(terms.weight[0]) * Elem<T>::Load(terms.data[0], i);
    for (int k = 1; k < terms.count; ++k) {
      acc += static_cast<Acc>(terms.weight[k]) * Elem<T>::Load(terms.data[k], i);
    }
    Elem<T>::Store(out, i, acc);
  }
}

// As the CPU's Divide: in the accumulation type, int64 exactly in int64.
template <typename T>
__global__ void DivideKernel(void* data, size_t count, int64_t divisor) {
  using Acc = typename Elem<T>::Acc;
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    if constexpr (std::is_same<T, int64_t>::value) {
      int64_t* x = static_cast<int64_t*>(data);
      x[i] = DivideRounded(x[i], divisor);
    } else {
      Elem<T>::Store(data, i, Elem<T>::Load(data, i) / static_cast<Acc>(divisor));
    }
  }
}

constexpr int kThreads = 256;

// A grid-stride loop: enough blocks to fill any current GPU, no more.
unsigned Blocks(size_t count) {
  const size_t wanted = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(wanted < 4096 ? (wanted == 0 ? 1 : wanted) : 4096);
}

// Launchers of one element type, for Dispatch.
template <typename T>
struct WeightedSumLauncher {
  static void Run(void* out, size_t count, const Terms& terms, cudaStream_t stream) {
    WeightedSumKernel<T><<<Blocks(count), kThreads, 0, stream>>>(out, count, terms);
  }
};
template <typename T>
struct DivideLauncher {
  static void Run(void* data, size_t count, int64_t divisor, cudaStream_t stream) {
    DivideKernel<T><<<Blocks(count), kThreads, 0, stream>>>(data, count, divisor);
  }
};

// F<T>::Run(args...) with T the element type of `type`; the launch's error, if any.
template <template <typename> class F, typename... Args>
cudaError_t Dispatch(DeviceType type, Args... args) {
  switch (type) {
    case DeviceType::kFloat32: F<float>::Run(args...); break;
    case DeviceType::kFloat64: F<double>::Run(args...); break;
    case DeviceType::kFloat16: F<__half>::Run(args...); break;
    case DeviceType::kBFloat16: F<__nv_bfloat16>::Run(args...); break;
    case DeviceType::kInt32: F<int32_t>::Run(args...); break;
    case DeviceType::kInt64: F<int64_t>::Run(args...); break;
    case DeviceType::kInt8: F<int8_t>::Run(args...); break;
    case DeviceType::kUInt8: F<uint8_t>::Run(args...); break;
    case DeviceType::kInt16: F<int16_t>::Run(args...); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

size_t TypeSize(DeviceType type) {
  switch (type) {
    case DeviceType::kFloat64:
    case DeviceType::kInt64: return 8;
    case DeviceType::kFloat32:
    case DeviceType::kInt32: return 4;
    case DeviceType::kFloat16:
    case DeviceType::kBFloat16:
    case DeviceType::kInt16: return 2;
    default: return 1;
  }
}

}  // namespace

cudaError_t LaunchDivide(void* data, DeviceType type, size_t count, int64_t divisor,
                         cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (divisor <= 0) return cudaErrorInvalidValue;
  return Dispatch<DivideLauncher>(type, data, count, divisor, stream);
}

cudaError_t LaunchWeightedSum(void* out, DeviceType type, size_t count, const DeviceTerm* terms,
                              int num_terms, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (num_terms == 0) return cudaMemsetAsync(out, 0, count * TypeSize(type), stream);
  int next = 0;
  bool first = true;
  while (next < num_terms) {
    Terms t;
    t.count = 0;
    if (!first) {  // later launches add to what the earlier ones wrote
      t.data[0] = out;
      t.weight[0] = 1.0;
      t.count = 1;
    }
    while (t.count < kMaxTermsPerLaunch && next < num_terms) {
      t.data[t.count] = terms[next].data;
      t.weight[t.count] = terms[next].weight;
      ++t.count;
      ++next;
    }
    const cudaError_t err = Dispatch<WeightedSumLauncher>(type, out, count, t, stream);
    if (err != cudaSuccess) return err;
    first = false;
  }
  return cudaSuccess;
}

}  // namespace nccl
}  // namespace comm
}  // namespace weft
