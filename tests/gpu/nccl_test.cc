// CUDA tensors through weft's NCCL backend (or, with WEFT_<OP>_BY_MPI=1, through MPI with
// host staging), with exact expected values from rank-filled tensors. Built only when CUDA
// and NCCL are found; run by tests/gpu/BUILD.bazel on 1 rank (NCCL) and on 2 ranks with
// every op forced through MPI (NCCL refuses two ranks on one GPU); windows on CUDA tensors
// (always host-staged) run in both. Without a CUDA device the device tests skip with the
// reason; the test of the error path that needs no device still runs. tests/gpu/run.sh
// runs everything on a GPU machine.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/topology.h"
#include "gtest/gtest.h"
#include "tests/comm/test_util.h"
#include "tests/gpu/cuda_device.h"

namespace weft {
namespace {

using testing::Buffer;

const auto* const kEnv = weft::testing::InitWeftForAllTests();

// Every rank uses device 0: the coordinator requires equal devices (index included) on all
// ranks, and the one-GPU machines these run on have no other.
constexpr int kDevice = 0;

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// A tensor in device memory with a host mirror for filling and checking.
class DeviceTensor {
 public:
  DeviceTensor(DType dtype, std::vector<int64_t> shape)
      : host_(dtype, shape), shape_(std::move(shape)) {
    const size_t bytes = static_cast<size_t>(host_.numel()) * DTypeSize(dtype);
    EXPECT_EQ(cudaMalloc(&data_, bytes == 0 ? 1 : bytes), cudaSuccess);
  }
  ~DeviceTensor() { cudaFree(data_); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  TensorView view() const { return TensorView(data_, host_.dtype(), shape_, Device::CUDA(kDevice)); }
  void Fill(double v) {
    host_.Fill(v);
    Upload();
  }
  void Upload() {
    EXPECT_EQ(cudaMemcpy(data_, host_.view().data(), view().nbytes(), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  // The device's current contents.
  const Buffer& Download() {
    EXPECT_EQ(cudaMemcpy(host_.view().data(), data_, view().nbytes(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host_;
  }
  Buffer& host() { return host_; }

 private:
  Buffer host_;
  std::vector<int64_t> shape_;
  void* data_ = nullptr;
};

// An Allocator of device tensors that keeps them alive.
class DeviceArena {
 public:
  Allocator allocator() {
    return [this](DType dtype, const std::vector<int64_t>& shape) -> StatusOr<TensorView> {
      tensors_.push_back(std::make_unique<DeviceTensor>(dtype, shape));
      return tensors_.back()->view();
    };
  }
  // Copies a tensor it allocated (identified by its view) back to the host.
  Buffer Download(const TensorView& v) {
    Buffer out(v.dtype(), std::vector<int64_t>(v.shape().begin(), v.shape().end()));
    EXPECT_EQ(cudaMemcpy(out.view().data(), v.data(), v.nbytes(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }

 private:
  std::vector<std::unique_ptr<DeviceTensor>> tensors_;
};

// Integers round to nearest, halves away from zero (comm/reduce.h).
double Expected(DType d, double v) { return IsFloatingPoint(d) ? v : std::llround(v); }

// Exact comparison: every expected value below is representable in every dtype used.
void ExpectAll(const Buffer& b, double expected, const std::string& what) {
  const double e = Expected(b.dtype(), expected);
  for (int64_t i = 0; i < b.numel(); ++i) {
    ASSERT_EQ(b.Get(i), e) << what << " (" << DTypeName(b.dtype()) << ") element " << i
                           << " on rank " << rank();
  }
}

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_DEVICE();
    ASSERT_CUDA(cudaSetDevice(kDevice));
  }
};

constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                             DType::kInt32,   DType::kInt64,   DType::kInt8,    DType::kUInt8};

TEST_F(Nccl, AllreduceSumsAndAveragesEveryDType) {
  const int n = size();
  for (DType d : kDTypes) {
    DeviceTensor x(d, {5, 3}), y(d, {5, 3});
    x.Fill(rank() + 1);
    ASSERT_TRUE(allreduce(x.view(), y.view(), /*average=*/false).ok());
    ExpectAll(y.Download(), n * (n + 1) / 2.0, "sum");
    ExpectAll(x.Download(), rank() + 1, "input untouched");
    ASSERT_TRUE(allreduce(x.view(), x.view(), /*average=*/true).ok());  // in place
    ExpectAll(x.Download(), (n + 1) / 2.0, "average");
  }
}

TEST_F(Nccl, BroadcastFromEveryRoot) {
  for (int root = 0; root < size(); ++root) {
    for (DType d : {DType::kFloat32, DType::kInt64, DType::kBFloat16}) {
      DeviceTensor x(d, {7}), y(d, {7});
      x.Fill(rank() + 10);
      ASSERT_TRUE(broadcast(x.view(), y.view(), root).ok());
      ExpectAll(y.Download(), root + 10, "broadcast");
    }
  }
}

TEST_F(Nccl, AllgatherConcatenatesUnequalParts) {
  for (bool equal : {true, false}) {
    for (DType d : {DType::kFloat32, DType::kInt32, DType::kFloat16}) {
      const int64_t rows = equal ? 2 : rank() + 1;
      DeviceTensor x(d, {rows, 3});
      x.Fill(rank() + 1);
      DeviceArena arena;
      auto out = allgather(x.view(), arena.allocator());
      ASSERT_TRUE(out.ok()) << out.status();
      ASSERT_EQ(out->device(), Device::CUDA(kDevice));
      const Buffer got = arena.Download(*out);
      int64_t row = 0;
      for (int r = 0; r < size(); ++r) {
        const int64_t r_rows = equal ? 2 : r + 1;
        for (int64_t i = 0; i < r_rows * 3; ++i) {
          ASSERT_EQ(got.Get(row * 3 + i), r + 1) << "rank " << r << "'s part, " << DTypeName(d);
        }
        row += r_rows;
      }
      EXPECT_EQ(out->shape()[0], row);
    }
  }
}

TEST_F(Nccl, NeighborAllgatherOrdersByRank) {
  const std::vector<int> in = in_neighbor_ranks();
  DeviceTensor x(DType::kFloat32, {2, 4});
  x.Fill(rank() + 1);
  DeviceArena arena;
  auto out = neighbor_allgather(x.view(), arena.allocator());
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->shape(), (std::vector<int64_t>{2 * static_cast<int64_t>(in.size()), 4}));
  const Buffer got = arena.Download(*out);
  for (size_t k = 0; k < in.size(); ++k) {
    for (int64_t i = 0; i < 8; ++i) ASSERT_EQ(got.Get(k * 8 + i), in[k] + 1);
  }
}

TEST_F(Nccl, NeighborAllreduceAveragesOverTheTopology) {
  const std::vector<int> in = in_neighbor_ranks();
  double expected = rank() + 1;
  for (int j : in) expected += j + 1;
  expected /= in.size() + 1;
  // Averages such as 7/3 are inexact: floats compare within rounding, integers exactly.
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kInt32}) {
    DeviceTensor x(d, {9}), y(d, {9});
    x.Fill(rank() + 1);
    ASSERT_TRUE(neighbor_allreduce(x.view(), y.view()).ok());
    const Buffer& got = y.Download();
    for (int64_t i = 0; i < got.numel(); ++i) {
      if (IsFloatingPoint(d)) {
        ASSERT_NEAR(got.Get(i), expected, 1e-6 * expected) << DTypeName(d);
      } else {
        ASSERT_EQ(got.Get(i), std::llround(expected)) << DTypeName(d);
      }
    }
  }
}

TEST_F(Nccl, NeighborAllreduceWithWeightsAndDstScaling) {
  const int n = size(), r = rank();
  NeighborAllreduceOptions opts;
  opts.self_weight = 0.5;
  if (n == 1) {
    opts.src_weights = std::map<int, double>{};
    opts.dst_weights = std::map<int, double>{};
  } else {
    opts.src_weights = std::map<int, double>{{(r - 1 + n) % n, 0.25}};
    opts.dst_weights = std::map<int, double>{{(r + 1) % n, 2.0}};
  }
  for (DType d : {DType::kFloat32, DType::kFloat64}) {
    DeviceTensor x(d, {4});
    x.Fill(r + 1);
    ASSERT_TRUE(neighbor_allreduce(x.view(), x.view(), opts, "nar.w").ok());
    const double expected = n == 1 ? 0.5 * (r + 1) : 0.5 * (r + 1) + 0.25 * 2.0 * ((r - 1 + n) % n + 1);
    ExpectAll(x.Download(), expected, "weighted neighbor_allreduce");
  }
}

TEST_F(Nccl, HierarchicalNeighborAllreduce) {
  const int L = local_size(), m = machine_rank();
  // Machines are blocks of local_size consecutive ranks, each holding rank + 1.
  auto machine_sum = [L](int machine) {
    double s = 0;
    for (int r = machine * L; r < (machine + 1) * L; ++r) s += r + 1;
    return s;
  };
  const Topology machines = load_machine_topology();
  double expected = machine_sum(m);
  for (int j : machines.in_neighbors(m)) expected += machine_sum(j);
  expected /= machines.in_neighbors(m).size() + 1;
  expected /= L;
  DeviceTensor x(DType::kFloat64, {6}), y(DType::kFloat64, {6});
  x.Fill(rank() + 1);
  ASSERT_TRUE(hierarchical_neighbor_allreduce(x.view(), y.view()).ok());
  const Buffer& got = y.Download();
  for (int64_t i = 0; i < 6; ++i) ASSERT_NEAR(got.Get(i), expected, 1e-12 * expected);
}

TEST_F(Nccl, PairGossip) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  const int peer = rank() ^ 1;
  if (peer >= size()) GTEST_SKIP() << "odd rank count: rank " << rank() << " has no peer";
  DeviceTensor x(DType::kFloat32, {8});
  x.Fill(rank() + 1);
  ASSERT_TRUE(pair_gossip(x.view(), x.view(), peer).ok());
  ExpectAll(x.Download(), 0.5 * (rank() + 1) + 0.5 * (peer + 1), "pair_gossip");
}

TEST_F(Nccl, SendRecvAroundARing) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  const int next = (rank() + 1) % size(), prev = (rank() + size() - 1) % size();
  DeviceTensor out(DType::kFloat32, {3, 5}), in(DType::kFloat32, {3, 5});
  out.Fill(rank() + 10);
  in.Fill(-1);
  auto r = recv_nonblocking(in.view(), prev, "ring" + std::to_string(prev));
  auto s = send_nonblocking(out.view(), next, "ring" + std::to_string(rank()));
  ASSERT_TRUE(r.ok() && s.ok());
  ASSERT_TRUE(wait(*s).ok());
  ASSERT_TRUE(wait(*r).ok());
  ExpectAll(in.Download(), prev + 10, "recv");
}

TEST_F(Nccl, AllreduceOverAProcessSetStagesThroughTheHost) {
  std::vector<int> set;
  for (int r = rank() % 2; r < size(); r += 2) set.push_back(r);
  DeviceTensor x(DType::kFloat32, {4});
  x.Fill(rank());
  ASSERT_TRUE(allreduce(x.view(), x.view(), false, "set", set).ok());
  double sum = 0;
  for (int r : set) sum += r;
  ExpectAll(x.Download(), sum, "allreduce over a process set");
}

TEST_F(Nccl, NonblockingOpsCompleteWithoutBlockingTheEngine) {
  // Many small ops at once: the coordinator fuses them; the device runs them in order and
  // the engine completes each group when its event fires.
  constexpr int kOps = 16;
  std::vector<std::unique_ptr<DeviceTensor>> xs;
  std::vector<Handle> handles;
  for (int k = 0; k < kOps; ++k) {
    xs.push_back(std::make_unique<DeviceTensor>(DType::kFloat32, std::vector<int64_t>{33}));
    xs.back()->Fill(k + rank());
    auto h = allreduce_nonblocking(xs.back()->view(), xs.back()->view(), /*average=*/false,
                                   "nb." + std::to_string(k));
    ASSERT_TRUE(h.ok()) << h.status();
    handles.push_back(*h);
  }
  const int n = size();
  for (int k = 0; k < kOps; ++k) {
    ASSERT_TRUE(wait(handles[k]).ok());
    ExpectAll(xs[k]->Download(), n * k + n * (n - 1) / 2.0, "nonblocking allreduce");
  }
}

// Windows on CUDA tensors live in host memory: puts, gets and updates stage through it,
// and the device tensor follows every op that writes it.
TEST_F(Nccl, WindowsStageThroughHostMemory) {
  const std::vector<int> in = in_neighbor_ranks();
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kInt64}) {
    SCOPED_TRACE(DTypeName(d));
    DeviceTensor x(d, {5});
    x.Fill(rank() + 1);
    const std::string name = std::string("cuda.win.") + DTypeName(d);
    ASSERT_TRUE(win_create(x.view(), name).ok());
    // Buffers start as copies of x at each rank: an update without puts changes nothing.
    WinUpdateOptions keep;
    keep.self_weight = 1.0;
    keep.neighbor_weights = std::map<int, double>{};
    ASSERT_TRUE(win_update(name, keep).ok());
    ExpectAll(x.Download(), rank() + 1, "update with no neighbors");

    // Changed on the device after creation: the put sends the new value.
    x.Fill(2 * (rank() + 1));
    ASSERT_TRUE(barrier().ok());
    ASSERT_TRUE(win_put(x.view(), name).ok());
    ASSERT_TRUE(barrier().ok());
    WinUpdateOptions sum;
    sum.self_weight = 1.0;
    sum.neighbor_weights = std::map<int, double>{};
    for (int j : in) (*sum.neighbor_weights)[j] = 1.0;
    ASSERT_TRUE(win_update(name, sum).ok());
    double expected = 2 * (rank() + 1);
    for (int j : in) expected += 2 * (j + 1);
    ExpectAll(x.Download(), expected, "device tensor after win_update");

    // A put's self_weight scales the device tensor.
    WinPutOptions half;
    half.self_weight = 0.5;
    ASSERT_TRUE(barrier().ok());
    ASSERT_TRUE(win_put(x.view(), name, half).ok());
    ExpectAll(x.Download(), expected / 2, "device tensor after win_put with self_weight");

    // Another device tensor of the same shape can be put, and is scaled in place.
    DeviceTensor other(d, {5});
    other.Fill(8);
    ASSERT_TRUE(win_put(other.view(), name, half).ok());
    ExpectAll(other.Download(), 4, "another device tensor after win_put");

    // A host tensor does not fit a window on the device.
    Buffer host(d, {5});
    Status s = win_put(host.view(), name);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    ASSERT_TRUE(barrier().ok());
    ASSERT_TRUE(win_free(name).ok());
  }
}

TEST_F(Nccl, OutputOnAnotherDeviceIsRefused) {
  DeviceTensor x(DType::kFloat32, {4});
  Buffer host(DType::kFloat32, {4});
  Status s = allreduce(x.view(), host.view());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("the output must be on the input's device"),
            std::string::npos)
      << s;
}

// --- error paths that need no device ------------------------------------------------------

// Not dereferenced: the call must fail before anything touches the memory.
void* const kFakeDevicePointer = reinterpret_cast<void*>(0x1000);

TEST(CudaTensors, WithoutADeviceTheCallFailsAtOnce) {
  const std::string why = gpu_testing::NoDeviceReason();
  if (why.empty()) GTEST_SKIP() << "a CUDA device is present; this checks the no-device path";
  TensorView x(kFakeDevicePointer, DType::kFloat32, {4}, Device::CUDA(kDevice));
  Status s = allreduce(x, x, /*average=*/true, "cuda.nodevice");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(std::string(s.message()).find("no such CUDA device is usable here"),
            std::string::npos)
      << s;
  if (rank() == 0) std::printf("the error without a device, as users see it: %s\n", s.ToString().c_str());
  // The engine still works afterwards.
  Buffer y(DType::kFloat32, {4});
  y.Fill(1);
  EXPECT_TRUE(allreduce(y.view(), y.view(), /*average=*/false).ok());
  EXPECT_EQ(y.Get(0), size());
}

}  // namespace
}  // namespace weft
