/* What the C ABI tests share: checks that print the rank, line and weft_last_error() and
 * exit non-zero (which makes mpirun abort the job, no hang), and a CPU DLTensor over
 * caller memory. For one translation unit per test program. */
#ifndef WEFT_TESTS_CAPI_CHECK_H_
#define WEFT_TESTS_CAPI_CHECK_H_

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <weft/weft.h>

static int g_rank = -1;

#define CHECK(cond)                                                                      \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      fprintf(stderr, "rank %d: %s:%d: check failed: %s (last error: %s)\n", g_rank,     \
              __FILE__, __LINE__, #cond, weft_last_error());                             \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

#define OK(call)                                                                         \
  do {                                                                                   \
    weft_status ok_status_ = (call);                                                     \
    if (ok_status_ != WEFT_OK) {                                                         \
      fprintf(stderr, "rank %d: %s:%d: %s returned %s: %s\n", g_rank, __FILE__, __LINE__, \
              #call, weft_status_string(ok_status_), weft_last_error());                 \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

/* `call` fails with `code` and a message containing `text`. */
#define FAILS(call, code, text)                                                          \
  do {                                                                                   \
    weft_status fails_status_ = (call);                                                  \
    if (fails_status_ != (code) || strstr(weft_last_error(), (text)) == NULL) {          \
      fprintf(stderr, "rank %d: %s:%d: %s returned %s (\"%s\"); expected %s mentioning " \
              "\"%s\"\n", g_rank, __FILE__, __LINE__, #call,                             \
              weft_status_string(fails_status_), weft_last_error(),                      \
              weft_status_string(code), (text));                                         \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

#define NEAR(a, b) (fabs((double)(a) - (double)(b)) < 1e-5)

static DLTensor Tensor(void* data, DLDataTypeCode code, int bits, int ndim, int64_t* shape) {
  DLTensor t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.device.device_type = kDLCPU;
  t.device.device_id = 0;
  t.ndim = ndim;
  t.dtype.code = (uint8_t)code;
  t.dtype.bits = (uint8_t)bits;
  t.dtype.lanes = 1;
  t.shape = shape;
  t.strides = NULL;
  t.byte_offset = 0;
  return t;
}

#endif /* WEFT_TESTS_CAPI_CHECK_H_ */
