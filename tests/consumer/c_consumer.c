/* Uses weft's C ABI from another workspace: an allreduce over every rank. */
#include <stdio.h>
#include <string.h>

#include <weft/weft.h>

int main(void) {
  if (weft_init() != WEFT_OK) {
    fprintf(stderr, "weft_init: %s\n", weft_last_error());
    return 1;
  }
  const int n = weft_size();
  float x[4];
  for (int i = 0; i < 4; ++i) x[i] = (float)(weft_rank() + 1);
  int64_t shape[1] = {4};
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = x;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  weft_status s = weft_comm_allreduce(&t, &t, 0, "consumer.sum");
  const float expected = n * (n + 1) / 2.0f;
  const int right = s == WEFT_OK && x[0] == expected && x[3] == expected;
  printf("c_consumer rank %d: %s (sum %g, expected %g)\n", weft_rank(), right ? "ok" : "WRONG",
         x[0], expected);
  weft_finalize();
  return right ? 0 : 1;
}
