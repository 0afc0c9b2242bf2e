// Helpers for multi-rank tests: typed buffers filled with values computable by hand.
#ifndef WEFT_TESTS_COMM_TEST_UTIL_H_
#define WEFT_TESTS_COMM_TEST_UTIL_H_

#include <sched.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "core/config.h"
#include "core/logging.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace weft {
namespace testing {

// A contiguous buffer owning its bytes, viewable as a TensorView.
class Buffer {
 public:
  Buffer(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    bytes_.assign(static_cast<size_t>(n) * DTypeSize(dtype), 0);
  }
  TensorView view() { return TensorView(bytes_.data(), dtype_, shape_); }
  int64_t numel() const { return static_cast<int64_t>(bytes_.size() / DTypeSize(dtype_)); }
  DType dtype() const { return dtype_; }

  void Fill(double v) {
    for (int64_t i = 0; i < numel(); ++i) Set(i, v);
  }
  void Set(int64_t i, double v) {
    char* p = bytes_.data() + i * DTypeSize(dtype_);
    switch (dtype_) {
      case DType::kFloat32: { float x = static_cast<float>(v); std::memcpy(p, &x, 4); break; }
      case DType::kFloat64: std::memcpy(p, &v, 8); break;
      case DType::kFloat16: { uint16_t x = FloatToHalf(static_cast<float>(v)); std::memcpy(p, &x, 2); break; }
      case DType::kBFloat16: { uint16_t x = FloatToBFloat16(static_cast<float>(v)); std::memcpy(p, &x, 2); break; }
      case DType::kInt32: { int32_t x = static_cast<int32_t>(v); std::memcpy(p, &x, 4); break; }
      case DType::kInt64: { int64_t x = static_cast<int64_t>(v); std::memcpy(p, &x, 8); break; }
      case DType::kInt8: { int8_t x = static_cast<int8_t>(v); std::memcpy(p, &x, 1); break; }
      case DType::kUInt8: { uint8_t x = static_cast<uint8_t>(v); std::memcpy(p, &x, 1); break; }
      case DType::kInt16: {
        int16_t x = static_cast<int16_t>(v);
        std::memcpy(p, &x, 2);
        break;
      }
    }
  }
  double Get(int64_t i) const { return Read(bytes_.data(), dtype_, i); }

  static double Read(const void* data, DType dtype, int64_t i) {
    const char* p = static_cast<const char*>(data) + i * DTypeSize(dtype);
    switch (dtype) {
      case DType::kFloat32: { float x; std::memcpy(&x, p, 4); return x; }
      case DType::kFloat64: { double x; std::memcpy(&x, p, 8); return x; }
      case DType::kFloat16: { uint16_t x; std::memcpy(&x, p, 2); return HalfToFloat(x); }
      case DType::kBFloat16: { uint16_t x; std::memcpy(&x, p, 2); return BFloat16ToFloat(x); }
      case DType::kInt32: { int32_t x; std::memcpy(&x, p, 4); return x; }
      case DType::kInt64: { int64_t x; std::memcpy(&x, p, 8); return static_cast<double>(x); }
      case DType::kInt8: { int8_t x; std::memcpy(&x, p, 1); return x; }
      case DType::kUInt8: { uint8_t x; std::memcpy(&x, p, 1); return x; }
      case DType::kInt16: {
        int16_t x;
        std::memcpy(&x, p, 2);
        return x;
      }
    }
    return 0;
  }

 private:
  DType dtype_;
  std::vector<int64_t> shape_;
  std::vector<char> bytes_;
};

// An Allocator that keeps what it allocates alive.
class Arena {
 public:
  Allocator allocator() {
    return [this](DType dtype, const std::vector<int64_t>& shape) -> StatusOr<TensorView> {
      buffers_.push_back(std::make_unique<Buffer>(dtype, shape));
      return buffers_.back()->view();
    };
  }

 private:
  std::vector<std::unique_ptr<Buffer>> buffers_;
};

// `value` times `times` in `dtype`'s own integer arithmetic (8 to 64 bits), wrapping around
// as weft's integer sums do.
inline double WrappedProduct(DType dtype, int64_t value, uint64_t times) {
  const uint64_t total = static_cast<uint64_t>(value) * times;
  switch (dtype) {
    case DType::kInt8:
      return static_cast<int8_t>(static_cast<uint8_t>(total));
    case DType::kUInt8:
      return static_cast<uint8_t>(total);
    case DType::kInt16:
      return static_cast<int16_t>(static_cast<uint16_t>(total));
    case DType::kInt32:
      return static_cast<int32_t>(static_cast<uint32_t>(total));
    default:
      return static_cast<double>(static_cast<int64_t>(total));
  }
}

// The environment variable `name` as an integer, or `fallback` where it is not set (runs
// of the randomized tests longer, or with another seed, by hand).
inline int64_t EnvInt(const char* name, int64_t fallback) {
  const char* s = std::getenv(name);
  return s != nullptr ? std::strtoll(s, nullptr, 10) : fallback;
}

// Whether this process may run on at least `ranks` CPUs (its affinity): the ranks of one
// machine then have a CPU each, and weft does not take the machine as oversubscribed.
inline bool RanksHaveACpuEach(int ranks) {
  cpu_set_t cpus;
  return sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) >= ranks;
}

// Whether this process may write process memory with process_vm_writev (a seccomp filter
// may refuse it where process_vm_readv is allowed): the direct allreduce needs it, besides
// reading the other ranks' memory. Tried on a word of this process's own.
inline bool CanWriteProcessMemory() {
  int word = 0, one = 1;
  iovec local{&one, sizeof one}, remote{&word, sizeof word};
  return process_vm_writev(getpid(), &local, 1, &remote, 1, 0) == sizeof word && word == 1;
}

// Sets the setting `name` to `value`, or back to its default where `value` is null.
inline void SetOrUnset(const char* name, const char* value) {
  if (value == nullptr) {
    config::Registry::Global().Unset(name);
  } else {
    EXPECT_TRUE(config::Registry::Global().Set(name, value).ok()) << name << "=" << value;
  }
}

// init() with WEFT_LOG_LEVEL=debug, its debug lines collected (what it decided, with the
// settings in force), the log level restored after. Expects init() to succeed.
inline std::vector<std::string> InitDebugLines() {
  std::vector<std::string> lines;
  EXPECT_TRUE(config::Registry::Global().Set("WEFT_LOG_LEVEL", "debug").ok());
  log::SetSinkForTesting([&](LogLevel level, const std::string& line) {
    if (level == LogLevel::kDebug) lines.push_back(line);
  });
  const Status st = init();
  log::SetSinkForTesting(nullptr);
  config::Registry::Global().Unset("WEFT_LOG_LEVEL");
  EXPECT_TRUE(st.ok()) << st;
  return lines;
}

// Whether `st`'s message contains `text`.
inline bool Contains(const Status& st, const std::string& text) {
  return std::string(st.message()).find(text) != std::string::npos;
}

// init() before the first test of the binary, shutdown() after the last.
class WeftEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { ASSERT_TRUE(init().ok()); }
  void TearDown() override { EXPECT_TRUE(shutdown().ok()); }
};
inline ::testing::Environment* InitWeftForAllTests() {
  return ::testing::AddGlobalTestEnvironment(new WeftEnvironment);
}

constexpr DType kAllDTypes[] = {DType::kFloat32,  DType::kFloat64, DType::kFloat16,
                                DType::kBFloat16, DType::kInt32,   DType::kInt64,
                                DType::kInt8,     DType::kUInt8,   DType::kInt16};

// Tolerance for comparing a result of dtype `d` with an exact value of magnitude ~v.
inline double Tolerance(DType d, double v) {
  const double a = std::abs(v) + 1;
  switch (d) {
    case DType::kFloat16: return 2e-3 * a;
    case DType::kBFloat16: return 1.6e-2 * a;
    case DType::kFloat32: return 1e-5 * a;
    case DType::kFloat64: return 1e-12 * a;
    default: return 0.5;  // integers round to nearest
  }
}

}  // namespace testing
}  // namespace weft

#endif  // WEFT_TESTS_COMM_TEST_UTIL_H_
