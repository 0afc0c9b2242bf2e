// The LibTorch adapter (comm/torch/torch_comm.h) under real mpirun, with exact expected
// values from rank-filled tensors. Run on 1, 2 and 4 ranks (tests/BUILD.bazel).
#include <ATen/ATen.h>

#include <cmath>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/topology.h"
#include "comm/torch/torch_comm.h"
#include "gtest/gtest.h"
#include "tests/comm/test_util.h"

namespace weft {
namespace {

namespace ta = ::weft::torch_api;

const auto* const kEnv = weft::testing::InitWeftForAllTests();

bool IsFloat(at::ScalarType t) { return at::isFloatingType(t); }

// Integer averages round to nearest (comm/reduce.cc).
double Expected(at::ScalarType t, double v) { return IsFloat(t) ? v : std::llround(v); }

double Tolerance(at::ScalarType t, double v) {
  switch (t) {
    case at::kBFloat16: return std::abs(v) * 1e-2 + 1e-2;
    case at::kHalf: return std::abs(v) * 1e-3 + 1e-3;
    case at::kFloat: return std::abs(v) * 1e-6 + 1e-6;
    case at::kDouble: return std::abs(v) * 1e-12 + 1e-12;
    default: return 0;
  }
}

// The tensor's elements in its logical (row-major) order, as doubles.
std::vector<double> Values(const at::Tensor& t) {
  at::Tensor d = t.to(at::kDouble).contiguous();
  const double* p = d.data_ptr<double>();
  return std::vector<double>(p, p + d.numel());
}

void ExpectAll(const at::Tensor& t, double expected, const std::string& what) {
  const double e = Expected(t.scalar_type(), expected);
  const double tol = Tolerance(t.scalar_type(), e);
  const std::vector<double> v = Values(t);
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_NEAR(v[i], e, tol) << what << " (" << t.scalar_type() << ") element " << i
                              << " on rank " << rank();
  }
}

void ExpectValues(const at::Tensor& t, const std::vector<double>& expected,
                  const std::string& what) {
  const std::vector<double> v = Values(t);
  ASSERT_EQ(v.size(), expected.size()) << what;
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_NEAR(v[i], expected[i], Tolerance(t.scalar_type(), expected[i]))
        << what << " element " << i << " on rank " << rank();
  }
}

std::vector<int64_t> Sizes(const at::Tensor& t) { return t.sizes().vec(); }
std::vector<int64_t> Strides(const at::Tensor& t) { return t.strides().vec(); }

// y_i = uniform average of x over self and in-neighbors, with x_j = j + 1.
double NeighborAverage() {
  const std::vector<int> in = in_neighbor_ranks();
  double s = rank() + 1;
  for (int j : in) s += j + 1;
  return s / (in.size() + 1);
}

// A CUDA tensor without CUDA: LibTorch describes foreign memory on any device.
at::Tensor FakeCudaTensor(float* data) {
  return at::for_blob(data, {2, 2})
      .options(at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, 0))
      .target_device(at::Device(at::kCUDA, 0))
      .make_tensor();
}

// --- conversions -----------------------------------------------------------------------------

TEST(Conversions, EverySupportedDTypeRoundTrips) {
  const std::vector<std::pair<at::ScalarType, DType>> pairs = {
      {at::kFloat, DType::kFloat32}, {at::kDouble, DType::kFloat64},
      {at::kHalf, DType::kFloat16},  {at::kBFloat16, DType::kBFloat16},
      {at::kInt, DType::kInt32},     {at::kLong, DType::kInt64},
      {at::kChar, DType::kInt8},     {at::kByte, DType::kUInt8},
      {at::kShort, DType::kInt16}};
  ASSERT_EQ(pairs.size(), static_cast<size_t>(kNumDTypes));
  for (const auto& [st, d] : pairs) {
    auto got = ta::ToDType(st);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, d);
    EXPECT_EQ(ta::ToScalarType(d), st);
    at::Tensor t = at::zeros({2, 3}, st);
    auto v = ta::ToView(t);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->dtype(), d);
    EXPECT_EQ(v->shape(), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(v->strides(), (std::vector<int64_t>{3, 1}));
    EXPECT_EQ(v->data(), t.data_ptr());
    EXPECT_TRUE(v->is_contiguous());
    EXPECT_EQ(v->device(), Device::CPU());
  }
}

TEST(Conversions, StridesAndStorageOffsetAreKept) {
  at::Tensor base = at::arange(12, at::kFloat).reshape({3, 4});
  auto t = ta::ToView(base.t());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(t->strides(), (std::vector<int64_t>{1, 4}));
  EXPECT_FALSE(t->is_contiguous());
  auto row = ta::ToView(base[1]);
  ASSERT_TRUE(row.ok()) << row.status();
  EXPECT_EQ(row->data(), static_cast<void*>(base.data_ptr<float>() + 4));
  EXPECT_EQ(*static_cast<float*>(row->data()), 4.0f);
  auto scalar = ta::ToView(at::scalar_tensor(3.0, at::kDouble));
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ(scalar->ndim(), 0);
  EXPECT_EQ(scalar->numel(), 1);
}

TEST(Conversions, UnsupportedDTypesNameTheDTypeAndTheSupportedList) {
  const std::string supported =
      "float32, float64, float16, bfloat16, int32, int64, int8, uint8, int16";
  for (at::ScalarType st : {at::kBool, at::kComplexFloat, at::kComplexDouble}) {
    auto d = ta::ToDType(st);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(d.status().message().find(c10::toString(st)), std::string::npos) << d.status();
    EXPECT_NE(d.status().message().find(supported), std::string::npos) << d.status();
    auto v = ta::ToView(at::zeros({2}, st));
    EXPECT_EQ(v.status().code(), absl::StatusCode::kUnimplemented) << v.status();
  }
  auto c = ta::ToDType(at::kComplexFloat);
  EXPECT_NE(c.status().message().find("view_as_real"), std::string::npos) << c.status();
}

TEST(Conversions, UndefinedAndCudaTensors) {
  auto v = ta::ToView(at::Tensor());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << v.status();
  std::vector<float> mem(4, 0);
  at::Tensor cuda = FakeCudaTensor(mem.data());
  ASSERT_TRUE(cuda.is_cuda());
  auto cv = ta::ToView(cuda);
  ASSERT_TRUE(cv.ok()) << cv.status();
  EXPECT_EQ(cv->device(), Device::CUDA(0));
}

// --- errors (identical on every rank, before anything is sent) --------------------------------

void ExpectError(const StatusOr<at::Tensor>& r, absl::StatusCode code,
                 const std::vector<std::string>& words) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status();
  for (const std::string& w : words) {
    EXPECT_NE(r.status().message().find(w), std::string::npos)
        << "'" << w << "' missing from: " << r.status();
  }
}

TEST(Errors, UnsupportedDTypes) {
  ExpectError(ta::allreduce(at::ones({3}, at::kBool)), absl::StatusCode::kUnimplemented,
              {"allreduce", "Bool", "float32"});
  ExpectError(ta::allgather(at::ones({3}, at::kComplexFloat)), absl::StatusCode::kUnimplemented,
              {"allgather", "ComplexFloat", "view_as_real"});
  EXPECT_EQ(ta::allreduce_(at::ones({3}, at::kBool)).code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(ta::neighbor_allreduce_nonblocking(at::ones({3}, at::kComplexDouble)).status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(Errors, UndefinedTensor) {
  const at::Tensor undefined;
  ExpectError(ta::allreduce(undefined), absl::StatusCode::kInvalidArgument,
              {"allreduce", "undefined"});
  ExpectError(ta::allgather(undefined), absl::StatusCode::kInvalidArgument, {"undefined"});
  ExpectError(ta::broadcast(undefined, 0), absl::StatusCode::kInvalidArgument, {"undefined"});
  EXPECT_EQ(ta::allreduce_(undefined).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ta::allreduce_nonblocking(undefined).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Errors, CudaSparseAndOverlappingTensors) {
  std::vector<float> mem(4, 0);
  ExpectError(ta::allreduce(FakeCudaTensor(mem.data())), absl::StatusCode::kUnimplemented,
              {"allreduce", "cuda:0", "NCCL"});
  EXPECT_EQ(ta::broadcast_(FakeCudaTensor(mem.data()), 0).code(),
            absl::StatusCode::kUnimplemented);
  ExpectError(ta::allreduce(at::ones({2, 2}).to_sparse()), absl::StatusCode::kUnimplemented,
              {"Sparse"});
  // In place into expand()ed memory cannot be written back.
  EXPECT_EQ(ta::allreduce_(at::ones({1, 3}).expand({4, 3})).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Errors, EmptyHandle) {
  ta::TorchHandle h;
  EXPECT_FALSE(h.valid());
  EXPECT_TRUE(h.poll());
  EXPECT_EQ(h.wait().status().code(), absl::StatusCode::kInvalidArgument);
}

// --- allreduce ---------------------------------------------------------------------------------

TEST(Allreduce, SumAndAverageForEachDType) {
  const int n = size();
  const double sum = n * (n + 1) / 2.0;  // of rank + 1
  for (at::ScalarType st : {at::kFloat, at::kDouble, at::kLong, at::kBFloat16, at::kHalf,
                            at::kInt, at::kChar, at::kByte}) {
    for (bool average : {false, true}) {
      at::Tensor x = at::full({3, 5}, rank() + 1, st);
      auto y = ta::allreduce(x, average);
      ASSERT_TRUE(y.ok()) << y.status();
      EXPECT_EQ(y->scalar_type(), st);
      EXPECT_EQ(Sizes(*y), Sizes(x));
      EXPECT_NE(y->data_ptr(), x.data_ptr());
      ExpectAll(*y, average ? sum / n : sum, average ? "average" : "sum");
      ExpectAll(x, rank() + 1, "input untouched");
    }
  }
}

TEST(Allreduce, ScalarAndEmptyTensors) {
  const int n = size();
  auto s = ta::allreduce(at::scalar_tensor(rank() + 1, at::kDouble), false, "scalar");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->dim(), 0);
  ExpectAll(*s, n * (n + 1) / 2.0, "scalar");
  auto e = ta::allreduce(at::zeros({0, 3}), true, "empty");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(Sizes(*e), (std::vector<int64_t>{0, 3}));
}

TEST(Allreduce, InPlaceContiguous) {
  const int n = size();
  at::Tensor x = at::full({7}, rank(), at::kFloat);
  void* const data = x.data_ptr();
  ASSERT_TRUE(ta::allreduce_(x, false, "inplace.contig").ok());
  EXPECT_EQ(x.data_ptr(), data);
  ExpectAll(x, n * (n - 1) / 2.0, "in place");
}

// base[r][c] = 4r + c + 100 * rank; the op runs on its transpose.
at::Tensor RankBase(at::ScalarType st) {
  return (at::arange(12, at::kDouble).reshape({3, 4}) + 100.0 * rank()).to(st);
}

TEST(Allreduce, InPlaceNonContiguousLandsInTheOriginalStorage) {
  const int n = size();
  for (at::ScalarType st : {at::kFloat, at::kLong}) {
    at::Tensor base = RankBase(st);
    at::Tensor x = base.t();
    ASSERT_FALSE(x.is_contiguous());
    void* const data = x.data_ptr();
    ASSERT_TRUE(ta::allreduce_(x, false).ok());
    EXPECT_EQ(x.data_ptr(), data);
    EXPECT_EQ(Sizes(x), (std::vector<int64_t>{4, 3}));
    EXPECT_EQ(Strides(x), (std::vector<int64_t>{1, 4}));
    // The storage, read in the base's row-major order.
    std::vector<double> expected;
    for (int e = 0; e < 12; ++e) expected.push_back(n * e + 100.0 * n * (n - 1) / 2);
    ExpectValues(base, expected, "storage after in-place allreduce of the transpose");
    // And through the transposed view: x[i][j] = base[j][i].
    EXPECT_EQ(x[1][2].item<double>(), n * (4 * 2 + 1) + 100.0 * n * (n - 1) / 2);
  }
}

TEST(Allreduce, InPlaceOnAStridedSliceLeavesTheRestAlone) {
  const int n = size();
  at::Tensor y = at::full({4, 6}, -7.0, at::kDouble);
  at::Tensor every_other = y.slice(/*dim=*/1, 0, 6, 2);  // [4, 3], strides [6, 2]
  ASSERT_FALSE(every_other.is_contiguous());
  every_other.fill_(rank() + 1);
  ASSERT_TRUE(ta::allreduce_(every_other, true, "slice").ok());
  ExpectAll(every_other, (n + 1) / 2.0, "averaged slice");
  ExpectAll(y.slice(1, 1, 6, 2), -7.0, "columns outside the slice");
}

TEST(Allreduce, OutOfPlaceOnNonContiguousInput) {
  const int n = size();
  at::Tensor base = RankBase(at::kDouble);
  at::Tensor x = base.t();
  auto y = ta::allreduce(x, false);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(Sizes(*y), (std::vector<int64_t>{4, 3}));
  EXPECT_TRUE(y->is_contiguous());
  std::vector<double> expected;
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 3; ++j) expected.push_back(n * (4 * j + i) + 100.0 * n * (n - 1) / 2);
  }
  ExpectValues(*y, expected, "allreduce of the transpose");
  std::vector<double> untouched;
  for (int e = 0; e < 12; ++e) untouched.push_back(e + 100.0 * rank());
  ExpectValues(base, untouched, "input untouched");
}

TEST(Allreduce, InPlaceOnALeafThatRequiresGrad) {
  const int n = size();
  at::Tensor p = at::empty_strided({2, 3}, {1, 2}, at::kFloat).fill_(rank() + 1);
  p.set_requires_grad(true);
  ASSERT_TRUE(ta::allreduce_(p, true, "param").ok());
  ExpectAll(p.detach(), (n + 1) / 2.0, "parameter averaged in place");
  auto g = ta::allreduce(p, true, "param.out");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_FALSE(g->requires_grad());
}

// --- broadcast -----------------------------------------------------------------------------------

TEST(Broadcast, FromEveryRootInAndOutOfPlace) {
  for (int root = 0; root < size(); ++root) {
    for (at::ScalarType st : {at::kFloat, at::kLong, at::kBFloat16}) {
      at::Tensor x = at::full({3, 4}, root * 10 + rank(), st);
      auto y = ta::broadcast(x, root);
      ASSERT_TRUE(y.ok()) << y.status();
      ExpectAll(*y, root * 10 + root, "broadcast");
      ExpectAll(x, root * 10 + rank(), "broadcast input untouched");
      at::Tensor z = at::full({4, 3}, root * 10 + rank(), st).t();
      ASSERT_TRUE(ta::broadcast_(z, root, "bcast.inplace").ok());
      ExpectAll(z, root * 10 + root, "broadcast in place, non-contiguous");
    }
  }
}

TEST(Broadcast, BadRootIsAnError) {
  auto y = ta::broadcast(at::ones({2}), size());
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument) << y.status();
}

// --- allgather -----------------------------------------------------------------------------------

TEST(Allgather, VariableFirstDimension) {
  const int n = size();
  for (at::ScalarType st : {at::kFloat, at::kChar, at::kHalf, at::kLong}) {
    at::Tensor x = at::full({rank() + 1, 2}, rank(), st);
    auto y = ta::allgather(x);
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_EQ(y->scalar_type(), st);
    ASSERT_EQ(Sizes(*y), (std::vector<int64_t>{n * (n + 1) / 2, 2}));
    std::vector<double> expected;
    for (int r = 0; r < n; ++r) {
      for (int k = 0; k <= r; ++k) expected.insert(expected.end(), {double(r), double(r)});
    }
    ExpectValues(*y, expected, "allgather");
  }
}

TEST(Allgather, NonContiguousInput) {
  const int n = size();
  // [rank + 1, 2] as the transpose of a [2, rank + 1] tensor: row k is {k, 100 + k}.
  at::Tensor src = at::arange(rank() + 1, at::kDouble).unsqueeze(0).repeat({2, 1});
  src[1] += 100;
  at::Tensor x = src.t();
  if (rank() > 0) {
    ASSERT_FALSE(x.is_contiguous());
  }
  auto y = ta::allgather(x, "gather.t");
  ASSERT_TRUE(y.ok()) << y.status();
  std::vector<double> expected;
  for (int r = 0; r < n; ++r) {
    for (int k = 0; k <= r; ++k) expected.insert(expected.end(), {double(k), 100.0 + k});
  }
  ExpectValues(*y, expected, "allgather of transposes");
}

TEST(NeighborAllgather, DefaultTopologyOrdersByRank) {
  at::Tensor x = at::full({2, 3}, rank() * 100, at::kFloat);
  auto y = ta::neighbor_allgather(x);
  ASSERT_TRUE(y.ok()) << y.status();
  const std::vector<int> srcs = in_neighbor_ranks();
  ASSERT_EQ(Sizes(*y), (std::vector<int64_t>{2 * static_cast<int64_t>(srcs.size()), 3}));
  std::vector<double> expected;
  for (int j : srcs) expected.insert(expected.end(), 6, j * 100.0);
  ExpectValues(*y, expected, "neighbor_allgather");
}

// --- neighbor ops --------------------------------------------------------------------------------

TEST(NeighborAllreduce, DefaultTopologyIsTheUniformNeighborAverage) {
  EXPECT_EQ(in_neighbor_ranks(), ExponentialGraph(size())->in_neighbors(rank()));
  for (at::ScalarType st : {at::kFloat, at::kDouble}) {
    at::Tensor x = at::full({5, 3}, rank() + 1, st);
    auto y = ta::neighbor_allreduce(x);
    ASSERT_TRUE(y.ok()) << y.status();
    ExpectAll(*y, NeighborAverage(), "neighbor_allreduce");
    ExpectAll(x, rank() + 1, "input untouched");
    at::Tensor z = at::full({3, 5}, rank() + 1, st).t();
    ASSERT_TRUE(ta::neighbor_allreduce_(z).ok());
    ExpectAll(z, NeighborAverage(), "neighbor_allreduce in place, non-contiguous");
  }
}

TEST(NeighborAllreduce, ExplicitWeights) {
  const std::vector<int> in = in_neighbor_ranks();
  NeighborAllreduceOptions opts;
  opts.self_weight = 0.25;
  std::map<int, double> src;
  for (int j : in) src[j] = 0.75 / in.size();
  opts.src_weights = src;
  auto y = ta::neighbor_allreduce(at::full({4}, rank() + 1, at::kDouble), opts, "weights");
  ASSERT_TRUE(y.ok()) << y.status();
  double expected = 0.25 * (rank() + 1);
  for (const auto& [j, w] : src) expected += w * (j + 1);
  ExpectAll(*y, expected, "weighted neighbor_allreduce");
}

TEST(HierarchicalNeighborAllreduce, OneMachineIsTheLocalAverage) {
  auto y = ta::hierarchical_neighbor_allreduce(at::full({4}, rank() + 1, at::kFloat));
  ASSERT_TRUE(y.ok()) << y.status();
  ExpectAll(*y, (size() + 1) / 2.0, "hierarchical on one machine");
}

TEST(PairGossip, PeersAverage) {
  if (size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  const int peer = rank() ^ 1;
  auto y = ta::pair_gossip(at::full({6}, rank() + 1, at::kFloat), peer);
  ASSERT_TRUE(y.ok()) << y.status();
  ExpectAll(*y, (rank() + 1 + peer + 1) / 2.0, "pair gossip");
  at::Tensor z = at::full({3, 2}, rank() + 1, at::kDouble).t();
  ASSERT_TRUE(ta::pair_gossip_(z, peer, 0.75, 0.25, "gossip.w").ok());
  ExpectAll(z, 0.75 * (rank() + 1) + 0.25 * (peer + 1), "weighted pair gossip in place");
}

// --- nonblocking ----------------------------------------------------------------------------------

TEST(Nonblocking, ManyNamedAllreduces) {
  const int n = size();
  std::vector<at::Tensor> xs;
  std::vector<ta::TorchHandle> hs;
  for (int k = 0; k < 5; ++k) {
    xs.push_back(at::full({10}, rank() * (k + 1), at::kDouble));
    auto h = ta::allreduce_nonblocking(xs[k], true, "nb." + std::to_string(k));
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_TRUE(h->valid());
    hs.push_back(*h);
  }
  for (int k = 0; k < 5; ++k) {
    auto y = hs[k].wait();
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_TRUE(hs[k].poll());
    ExpectAll(*y, (n - 1) / 2.0 * (k + 1), "nonblocking");
    ExpectAll(xs[k], rank() * (k + 1), "input untouched");
    auto again = hs[k].wait();
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->data_ptr(), y->data_ptr());
  }
}

TEST(Nonblocking, InPlaceNonContiguousIsCopiedBackByPoll) {
  const int n = size();
  at::Tensor base = RankBase(at::kFloat);
  at::Tensor x = base.t();
  auto h = ta::allreduce_nonblocking_(x, false, "nb.inplace.t");
  ASSERT_TRUE(h.ok()) << h.status();
  while (!h->poll()) {
  }
  std::vector<double> expected;
  for (int e = 0; e < 12; ++e) expected.push_back(n * e + 100.0 * n * (n - 1) / 2);
  ExpectValues(base, expected, "copied back once poll() is true");
  auto y = h->wait();
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->data_ptr(), x.data_ptr());
  EXPECT_EQ(Strides(*y), Strides(x));
}

TEST(Nonblocking, EveryKind) {
  const int n = size();
  auto b = ta::broadcast_nonblocking(at::full({3}, rank() + 5, at::kFloat), 0, "nb.bcast");
  auto na = ta::neighbor_allreduce_nonblocking(at::full({3}, rank() + 1, at::kDouble), {},
                                               "nb.nar");
  at::Tensor nai = at::full({2, 2}, rank() + 1, at::kDouble).t();
  auto nai_h = ta::neighbor_allreduce_nonblocking_(nai, {}, "nb.nar_");
  auto g = ta::allgather_nonblocking(at::full({rank() + 1}, rank(), at::kLong), "nb.gather");
  auto bi = ta::broadcast_nonblocking_(at::full({2}, rank(), at::kInt), n - 1, "nb.bcast_");
  for (auto* h : {&b, &na, &nai_h, &g, &bi}) ASSERT_TRUE(h->ok()) << h->status();
  auto by = b->wait();
  ASSERT_TRUE(by.ok()) << by.status();
  ExpectAll(*by, 5, "broadcast_nonblocking");
  auto nay = na->wait();
  ASSERT_TRUE(nay.ok()) << nay.status();
  ExpectAll(*nay, NeighborAverage(), "neighbor_allreduce_nonblocking");
  ASSERT_TRUE(nai_h->wait().ok());
  ExpectAll(nai, NeighborAverage(), "neighbor_allreduce_nonblocking_");
  auto gy = g->wait();
  ASSERT_TRUE(gy.ok()) << gy.status();
  std::vector<double> expected;
  for (int r = 0; r < n; ++r) expected.insert(expected.end(), r + 1, r);
  ExpectValues(*gy, expected, "allgather_nonblocking");
  auto biy = bi->wait();
  ASSERT_TRUE(biy.ok()) << biy.status();
  ExpectAll(*biy, n - 1, "broadcast_nonblocking_");
}

TEST(Nonblocking, DroppedHandlesKeepTheirTensorsAlive) {
  const int n = size();
  for (int k = 0; k < 8; ++k) {
    // The tensors exist only in the handle, which is dropped at once.
    ASSERT_TRUE(ta::allreduce_nonblocking(at::full({1 << 12}, rank(), at::kFloat), false,
                                          "dropped." + std::to_string(k))
                    .ok());
    ASSERT_TRUE(ta::allgather_nonblocking(at::full({64}, rank(), at::kFloat),
                                          "dropped.gather." + std::to_string(k))
                    .ok());
  }
  auto y = ta::allreduce(at::full({4}, rank(), at::kFloat), false, "after.dropped");
  ASSERT_TRUE(y.ok()) << y.status();
  ExpectAll(*y, n * (n - 1) / 2.0, "after dropped handles");
  EXPECT_TRUE(barrier().ok());
}

}  // namespace
}  // namespace weft
