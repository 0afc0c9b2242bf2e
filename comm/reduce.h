// CPU kernels the engine applies after moving bytes: weighted sums of buffers of one
// dtype, and the MPI reduction for float16/bfloat16 (which MPI has no type for).
//
// Weighted sums of floating-point dtypes accumulate in float (float32, float16, bfloat16)
// or double (float64). Weighted sums of integer dtypes accumulate in double and round to
// nearest (halves away from zero), so averaging an int tensor gives the nearest integer to
// the true average. Plain sums (Add) of integers are exact.
#ifndef WEFT_COMM_REDUCE_H_
#define WEFT_COMM_REDUCE_H_

#include <cstddef>
#include <vector>

#include "core/tensor.h"

namespace weft {
namespace comm {

struct WeightedTerm {
  const void* data;
  double weight;
};

// out[i] = sum_k terms[k].weight * terms[k].data[i], for i < count. `out` may alias the
// first term's data (in place), not the others'. When k > 1 terms all weigh exactly 1/k
// (a uniform average), the terms are summed in order and the sum divided by k, which is
// the arithmetic of frameworks that average by sum then division (Bluefog): the results
// are equal to theirs bit for bit, where weighting each term by a rounded 1/k may differ
// in the last bit.
void WeightedSum(void* out, DType dtype, size_t count, const std::vector<WeightedTerm>& terms);

// data[i] *= factor (integers round to nearest).
void Scale(void* data, DType dtype, size_t count, double factor);

// data[i] /= divisor (integers round to nearest, halves away from zero; int64 by a whole
// divisor exactly at any magnitude): an average after a sum.
void Divide(void* data, DType dtype, size_t count, double divisor);

// out[i] = a[i] + b[i]: a plain sum, as MPI_SUM computes it. Floating-point dtypes round
// the sum once to the dtype; integers are exact and wrap on overflow. `out` may alias `a`
// or `b` (but not overlap them otherwise).
void Add(void* out, const void* a, const void* b, DType dtype, size_t count);

// dst[i] += src[i] (Add in place; also the MPI reduction for 16-bit floats).
void AddInPlace(void* dst, const void* src, DType dtype, size_t count);

// Whether this CPU can run the kernels of float32, float16 and bfloat16 eight elements at a
// time (x86-64 with AVX2 and F16C), which they then do unless a test turned that off;
// otherwise they run as the build targets (16-bit conversions one element at a time). The
// results are the same bytes either way.
bool VectorKernelsAvailable();
// Tests only: float to float16 or bfloat16 (other dtypes: nothing), as the kernels convert
// their results. Kernel inputs are 16-bit values, so their NaNs never reach it with every
// payload bit a float can have; the tests give it those directly.
void FromFloatsForTesting(DType dtype, const float* src, void* dst, size_t count);
// Tests only: turns the eight-at-a-time kernels off (or back on, where the CPU has them) for
// the whole process; returns whether they were on.
bool SetVectorKernelsForTesting(bool enabled);

}  // namespace comm
}  // namespace weft

#endif  // WEFT_COMM_REDUCE_H_
