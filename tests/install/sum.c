/* Built against an installed weft with nothing but pkg-config: an allreduce over every rank. */
#include <stdio.h>
#include <string.h>

#include <weft/weft.h>

int main(void) {
  float x[4];
  int64_t shape[1] = {4};
  DLTensor t;
  weft_status s;
  float expected;
  int n, right, i;
  if (weft_init() != WEFT_OK) {
    fprintf(stderr, "weft_init: %s\n", weft_last_error());
    return 1;
  }
  n = weft_size();
  for (i = 0; i < 4; ++i) x[i] = (float)(weft_rank() + 1);
  memset(&t, 0, sizeof t);
  t.data = x;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  s = weft_comm_allreduce(&t, &t, 0, "install.sum");
  expected = n * (n + 1) / 2.0f;
  right = s == WEFT_OK && x[0] == expected && x[3] == expected;
  printf("sum rank %d: %s (%g, expected %g, weft %s)\n", weft_rank(), right ? "ok" : "WRONG",
         x[0], expected, weft_version());
  weft_finalize();
  return right ? 0 : 1;
}
