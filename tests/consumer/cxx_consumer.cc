// Uses weft's C++ API from another workspace: an allreduce over every rank.
#include <cstdio>
#include <vector>

#include "comm/comm.h"

int main() {
  if (weft::Status s = weft::init(); !s.ok()) {
    std::fprintf(stderr, "init: %s\n", s.ToString().c_str());
    return 1;
  }
  const int n = weft::size();
  std::vector<float> x(4, static_cast<float>(weft::rank() + 1));
  weft::TensorView view(x.data(), weft::DType::kFloat32, {4});
  weft::Status s = weft::allreduce(view, view, /*average=*/false, "consumer.sum");
  const float expected = n * (n + 1) / 2.0f;
  const bool right = s.ok() && x[0] == expected && x[3] == expected;
  std::printf("cxx_consumer rank %d: %s (sum %g, expected %g)\n", weft::rank(),
              right ? "ok" : "WRONG", x[0], expected);
  (void)weft::shutdown();
  (void)weft::finalize();
  return right ? 0 : 1;
}
