// Integer division as weft's averages round it, shared by the CPU kernels (reduce.cc) and
// the CUDA ones (nccl/kernels.cu) so that an average gives the same integers on either
// device. nvcc compiles this header too: no weft headers, nothing beyond <cstdint>.
#ifndef WEFT_COMM_ROUNDED_DIVISION_H_
#define WEFT_COMM_ROUNDED_DIVISION_H_

#include <cstdint>

#if defined(__CUDACC__)
#define WEFT_HOST_DEVICE __host__ __device__
#else
#define WEFT_HOST_DEVICE
#endif

namespace weft {
namespace comm {

// x / d for d > 0, rounded to nearest with halves away from zero, in int64 throughout: exact
// at any magnitude, where a trip through double loses the low bits of values past 2^53.
inline WEFT_HOST_DEVICE int64_t DivideRounded(int64_t x, int64_t d) {
  int64_t q = x / d;
  const int64_t r = x % d;  // the sign of x; |r| < d
  const int64_t magnitude = r < 0 ? -r : r;
  if (magnitude != 0 && magnitude >= d - magnitude) q += r < 0 ? -1 : 1;
  return q;
}

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_ROUNDED_DIVISION_H_
