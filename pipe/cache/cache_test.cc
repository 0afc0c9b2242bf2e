#include "pipe/cache/cache.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "core/config.h"
#include "core/logging.h"
#include "gtest/gtest.h"

namespace weft {
namespace pipe {
namespace {

using Options = ActivationCache::Options;

// A fresh directory under TEST_TMPDIR for each call.
std::string TempDir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  static int counter = 0;
  std::string dir = std::string(root ? root : "/tmp") + "/" + name + "." +
                    std::to_string(getpid()) + "." + std::to_string(counter++);
  mkdir(dir.c_str(), 0777);
  return dir;
}

std::unique_ptr<ActivationCache> MakeCache(size_t budget, const std::string& spill_dir = "") {
  Options options;
  options.budget_bytes = budget;
  options.spill_dir = spill_dir;
  auto cache = ActivationCache::Create(options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return std::move(cache).value();
}

// `n` float32 values starting at `seed`, as a [n] tensor.
struct Floats {
  explicit Floats(int n, float seed = 0) : values(n) {
    std::iota(values.begin(), values.end(), seed);
  }
  TensorView view() { return TensorView(values.data(), DType::kFloat32, {int64_t(values.size())}); }
  std::vector<float> values;
};

std::vector<uint8_t> BytesOf(const ActivationCache::Entry& e) {
  return std::vector<uint8_t>(static_cast<const uint8_t*>(e.data()),
                              static_cast<const uint8_t*>(e.data()) + e.nbytes());
}

bool Has(ActivationCache& cache, int64_t sample, int depth) {
  auto got = cache.Get(sample, depth);
  EXPECT_TRUE(got.ok()) << got.status();
  return got.ok() && got->has_value();
}

// Captures warning lines while alive.
struct LogCapture {
  LogCapture() {
    log::SetSinkForTesting([this](LogLevel level, const std::string& line) {
      if (level == LogLevel::kWarning) warnings.push_back(line);
    });
  }
  ~LogCapture() { log::SetSinkForTesting(nullptr); }
  std::vector<std::string> warnings;
};

TEST(ActivationCacheTest, HitReturnsExactlyTheBytesPut) {
  auto cache = MakeCache(1 << 20);
  std::vector<double> f64 = {1.5, -2.25, 3e300, 0.0, -0.0, 7};
  std::vector<int8_t> i8 = {-128, 127, 0, 1, -1, 5, 6, 7, 8, 9, 10, 11};
  std::vector<uint16_t> half = {0x3c00, 0x7c00, 0xfc00, 0x7e01};  // incl. a NaN payload
  std::vector<int64_t> i64 = {INT64_MIN, INT64_MAX, 0};
  struct Case {
    void* data;
    DType dtype;
    std::vector<int64_t> shape;
  };
  std::vector<Case> cases = {
      {f64.data(), DType::kFloat64, {2, 3}},
      {i8.data(), DType::kInt8, {2, 3, 2}},
      {half.data(), DType::kFloat16, {4}},
      {half.data(), DType::kBFloat16, {2, 1, 2}},
      {i64.data(), DType::kInt64, {3, 1}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    TensorView v(cases[i].data, cases[i].dtype, cases[i].shape);
    ASSERT_TRUE(cache->Put(static_cast<int64_t>(i), 4, v).ok());
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    auto got = cache->Get(static_cast<int64_t>(i), 4);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(got->has_value());
    const auto& e = **got;
    EXPECT_EQ(e.depth, 4);
    EXPECT_EQ(e.dtype, cases[i].dtype);
    EXPECT_EQ(e.shape, cases[i].shape);
    TensorView v(cases[i].data, cases[i].dtype, cases[i].shape);
    ASSERT_EQ(e.nbytes(), v.nbytes());
    EXPECT_EQ(std::memcmp(e.data(), cases[i].data, v.nbytes()), 0);
    EXPECT_EQ(e.view().shape(), cases[i].shape);
    // Copy out into a caller buffer.
    std::vector<uint8_t> out(v.nbytes(), 0xAB);
    ASSERT_TRUE(e.CopyTo(TensorView(out.data(), e.dtype, e.shape)).ok());
    EXPECT_EQ(std::memcmp(out.data(), cases[i].data, v.nbytes()), 0);
  }
  EXPECT_FALSE(Has(*cache, 0, 3));  // exact depth only
  auto s = cache->stats();
  EXPECT_EQ(s.hits, 5);
  EXPECT_EQ(s.misses, 1);
  EXPECT_DOUBLE_EQ(s.hit_rate(), 5.0 / 6.0);
}

TEST(ActivationCacheTest, StridedInAndOut) {
  auto cache = MakeCache(1 << 20);
  // A 3x2 transposed view of a row-major 2x3 buffer.
  std::vector<int32_t> base = {0, 1, 2, 10, 11, 12};
  TensorView transposed(base.data(), DType::kInt32, {3, 2}, {1, 3}, Device::CPU());
  ASSERT_FALSE(transposed.is_contiguous());
  ASSERT_TRUE(cache->Put(1, 2, transposed).ok());
  auto got = cache->Get(1, 2);
  ASSERT_TRUE(got.ok() && got->has_value());
  const int32_t* p = static_cast<const int32_t*>((*got)->data());
  EXPECT_EQ(std::vector<int32_t>(p, p + 6), (std::vector<int32_t>{0, 10, 1, 11, 2, 12}));
  // And back out into a strided destination.
  std::vector<int32_t> out(6, -1);
  TensorView dst(out.data(), DType::kInt32, {3, 2}, {1, 3}, Device::CPU());
  ASSERT_TRUE((*got)->CopyTo(dst).ok());
  EXPECT_EQ(out, base);
  // Mismatched destinations are refused.
  std::vector<float> wrong(6);
  EXPECT_EQ((*got)->CopyTo(TensorView(wrong.data(), DType::kFloat32, {3, 2})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*got)->CopyTo(TensorView(out.data(), DType::kInt32, {6})).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ActivationCacheTest, EvictionKeepsMemoryWithinBudgetInLruOrder) {
  // Each entry 40 bytes; room for 3.
  auto cache = MakeCache(120);
  for (int s = 0; s < 3; ++s) {
    Floats x(10, s);
    ASSERT_TRUE(cache->Put(s, 1, x.view()).ok());
    EXPECT_LE(cache->stats().bytes_in_memory, 120u);
  }
  EXPECT_EQ(cache->stats().entries_in_memory, 3);
  // Touch sample 0: sample 1 is now the least recently used.
  EXPECT_TRUE(Has(*cache, 0, 1));
  Floats x3(10, 3);
  ASSERT_TRUE(cache->Put(3, 1, x3.view()).ok());
  EXPECT_LE(cache->stats().bytes_in_memory, 120u);
  EXPECT_TRUE(Has(*cache, 0, 1));
  EXPECT_FALSE(Has(*cache, 1, 1));
  EXPECT_TRUE(Has(*cache, 2, 1));
  EXPECT_TRUE(Has(*cache, 3, 1));
  // LRU now: 3 (newest), 2, 0. A 80-byte entry evicts two: 0 and 2.
  Floats big(20);
  ASSERT_TRUE(cache->Put(4, 1, big.view()).ok());
  auto s = cache->stats();
  EXPECT_LE(s.bytes_in_memory, 120u);
  EXPECT_EQ(s.evictions, 3);
  EXPECT_EQ(s.spills, 0);  // no spill directory: dropped
  EXPECT_TRUE(Has(*cache, 3, 1));
  EXPECT_TRUE(Has(*cache, 4, 1));
  EXPECT_FALSE(Has(*cache, 0, 1));
  EXPECT_FALSE(Has(*cache, 2, 1));
}

TEST(ActivationCacheTest, RandomPutsNeverExceedBudget) {
  auto cache = MakeCache(1000);
  unsigned seed = 7;
  for (int i = 0; i < 500; ++i) {
    seed = seed * 1103515245u + 12345u;
    int n = 1 + static_cast<int>((seed >> 8) % 120);  // up to 480 bytes
    Floats x(n, i);
    ASSERT_TRUE(cache->Put((seed >> 4) % 40, (seed >> 12) % 4, x.view()).ok());
    ASSERT_LE(cache->stats().bytes_in_memory, 1000u);
    (void)cache->GetDeepestAtMost((seed >> 16) % 40, 3);
    ASSERT_LE(cache->stats().bytes_in_memory, 1000u);
  }
}

TEST(ActivationCacheTest, ReplacingAnEntryKeepsTheNewBytes) {
  auto cache = MakeCache(1000);
  Floats a(4, 0), b(8, 100);
  ASSERT_TRUE(cache->Put(0, 1, a.view()).ok());
  ASSERT_TRUE(cache->Put(0, 1, b.view()).ok());
  auto got = cache->Get(0, 1);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->shape, std::vector<int64_t>{8});
  EXPECT_EQ(cache->stats().bytes_in_memory, 32u);
  EXPECT_EQ(cache->stats().entries_in_memory, 1);
}

TEST(ActivationCacheTest, SpillAndReloadRoundTrip) {
  const std::string dir = TempDir("spill");
  auto cache = MakeCache(80, dir);  // room for 2 entries of 40 bytes
  for (int s = 0; s < 5; ++s) {
    Floats x(10, 10 * s);
    ASSERT_TRUE(cache->Put(s, 2, x.view()).ok());
  }
  auto st = cache->stats();
  EXPECT_EQ(st.evictions, 3);
  EXPECT_EQ(st.spills, 3);
  struct stat info;
  EXPECT_EQ(stat(cache->SpillPath(0, 2).c_str(), &info), 0);
  EXPECT_EQ(cache->SpillPath(0, 2), dir + "/0/2.wact");
  for (int s = 0; s < 5; ++s) {
    auto got = cache->Get(s, 2);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(got->has_value()) << "sample " << s;
    Floats expect(10, 10 * s);
    EXPECT_EQ(BytesOf(**got), std::vector<uint8_t>(reinterpret_cast<uint8_t*>(expect.values.data()),
                                                   reinterpret_cast<uint8_t*>(expect.values.data()) + 40));
    EXPECT_LE(cache->stats().bytes_in_memory, 80u);
  }
  st = cache->stats();
  EXPECT_EQ(st.hits, 5);
  // Each read came from disk (the reads promote, evicting the previous ones): 0, 1, 2
  // were spilled by the Puts, 3 and 4 by the promotions of 0 and 1. Promoted entries
  // already have a file, so evicting them again writes nothing.
  EXPECT_EQ(st.disk_hits, 5);
  EXPECT_EQ(st.spills, 5);
}

TEST(ActivationCacheTest, TwoCachesShareOneSpillDirectory) {
  const std::string dir = TempDir("shared");
  auto a = MakeCache(40, dir);
  auto b = MakeCache(40, dir);
  Floats x(10, 1), y(10, 2);
  ASSERT_TRUE(a->Put(7, 3, x.view()).ok());
  ASSERT_TRUE(a->Put(8, 3, y.view()).ok());  // evicts (7, 3) from a into the directory
  EXPECT_EQ(a->stats().spills, 1);
  auto got = b->Get(7, 3);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(std::memcmp((*got)->data(), x.values.data(), 40), 0);
  EXPECT_EQ(b->stats().disk_hits, 1);
  // (8, 3) is only in a's memory: b misses it.
  EXPECT_FALSE(Has(*b, 8, 3));
  // Invalidation through one cache removes the shared file.
  b->Invalidate(7);
  EXPECT_FALSE(Has(*b, 7, 3));
  auto c = MakeCache(40, dir);
  EXPECT_FALSE(Has(*c, 7, 3));
}

TEST(ActivationCacheTest, WriteThroughSharesEntriesAtOnce) {
  const std::string dir = TempDir("write_through");
  ActivationCache::Options options;
  options.budget_bytes = 1 << 20;  // nothing is ever evicted
  options.spill_dir = dir;
  options.write_through = true;
  auto a = ActivationCache::Create(options);
  auto b = ActivationCache::Create(options);
  ASSERT_TRUE(a.ok() && b.ok());
  Floats x(10, 5);
  ASSERT_TRUE((*a)->Put(4, 2, x.view()).ok());
  EXPECT_EQ((*a)->stats().evictions, 0);
  auto got = (*b)->GetDeepestAtMost(4, 6);  // the other replica's entry, from the directory
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->depth, 2);
  EXPECT_EQ(std::memcmp((*got)->data(), x.values.data(), 40), 0);
  EXPECT_EQ((*b)->stats().disk_hits, 1);
  // Without write-through the entry stays in a's memory only.
  options.write_through = false;
  options.spill_dir = TempDir("no_write_through");
  auto c = ActivationCache::Create(options);
  auto d = ActivationCache::Create(options);
  ASSERT_TRUE((*c)->Put(4, 2, x.view()).ok());
  EXPECT_FALSE(Has(**d, 4, 2));
}

TEST(ActivationCacheTest, GetDeepestAtMostResumesFromTheDeepestCachedDepth) {
  const std::string dir = TempDir("deepest");
  auto cache = MakeCache(40, dir);  // one entry in memory; the rest spill
  Floats d2(10, 2), d5(10, 5), d9(10, 9);
  ASSERT_TRUE(cache->Put(1, 2, d2.view()).ok());
  ASSERT_TRUE(cache->Put(1, 5, d5.view()).ok());  // d2 -> disk
  ASSERT_TRUE(cache->Put(1, 9, d9.view()).ok());  // d5 -> disk; d9 in memory
  struct Want {
    int depth;
    int found;  // -1: miss
  };
  for (Want w : {Want{0, -1}, Want{1, -1}, Want{2, 2}, Want{4, 2}, Want{5, 5}, Want{8, 5},
                 Want{9, 9}, Want{100, 9}}) {
    auto got = cache->GetDeepestAtMost(1, w.depth);
    ASSERT_TRUE(got.ok()) << got.status();
    if (w.found < 0) {
      EXPECT_FALSE(got->has_value()) << "depth " << w.depth;
      continue;
    }
    ASSERT_TRUE(got->has_value()) << "depth " << w.depth;
    EXPECT_EQ((*got)->depth, w.found) << "depth " << w.depth;
    EXPECT_EQ(static_cast<const float*>((*got)->data())[0], static_cast<float>(w.found));
  }
  // Another sample is never returned.
  auto other = cache->GetDeepestAtMost(0, 100);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->has_value());
  auto next = cache->GetDeepestAtMost(2, 100);
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->has_value());

  // Memory only, too.
  auto mem = MakeCache(1000);
  ASSERT_TRUE(mem->Put(3, 4, d2.view()).ok());
  ASSERT_TRUE(mem->Put(3, 6, d5.view()).ok());
  ASSERT_TRUE(mem->Put(4, 1, d9.view()).ok());
  auto got = mem->GetDeepestAtMost(3, 5);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->depth, 4);
  got = mem->GetDeepestAtMost(4, 0);
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
}

// Writes a spill file for (sample, depth) through a cache with a zero budget.
std::string SpillOne(const std::string& dir, int64_t sample, int depth) {
  auto writer = MakeCache(0, dir);
  Floats x(16, 3);
  EXPECT_TRUE(writer->Put(sample, depth, x.view()).ok());
  EXPECT_EQ(writer->stats().spills, 1);
  return writer->SpillPath(sample, depth);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

TEST(ActivationCacheTest, CorruptOrTruncatedSpillFileIsAMissReportedOnce) {
  const std::string dir = TempDir("corrupt");
  const std::string path = SpillOne(dir, 5, 1);
  const std::string good = ReadFile(path);
  ASSERT_GT(good.size(), 64u);
  auto cache = MakeCache(1 << 20, dir);
  {
    auto got = cache->Get(5, 1);
    ASSERT_TRUE(got.ok() && got->has_value());  // the intact file reads back
  }
  cache->Invalidate(5, 1);
  WriteFile(path, good);

  // Every single-byte corruption and every truncation reads as a miss.
  auto reader = MakeCache(0, dir);
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x5A);
    WriteFile(path, bad);
    auto got = reader->Get(5, 1);
    ASSERT_TRUE(got.ok());
    EXPECT_FALSE(got->has_value()) << "flipped byte " << i;
  }
  for (size_t n : {size_t{0}, size_t{3}, size_t{20}, size_t{40}, good.size() - 1}) {
    WriteFile(path, good.substr(0, n));
    auto got = reader->GetDeepestAtMost(5, 3);
    ASSERT_TRUE(got.ok());
    EXPECT_FALSE(got->has_value()) << "truncated to " << n;
  }
  WriteFile(path, good + "x");
  EXPECT_FALSE(Has(*reader, 5, 1));
  EXPECT_GT(reader->stats().corrupt_files, static_cast<int64_t>(good.size()));

  // Warned once per file, however often it is read.
  LogCapture capture;
  auto fresh = MakeCache(0, dir);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(Has(*fresh, 5, 1));
  EXPECT_EQ(fresh->stats().corrupt_files, 3);
  EXPECT_EQ(capture.warnings.size(), 1u);

  // A spill rewrites the file; it reads back again.
  Floats x(16, 3);
  ASSERT_TRUE(fresh->Put(5, 1, x.view()).ok());
  EXPECT_TRUE(Has(*fresh, 5, 1));
}

// A process killed while it spills (SIGKILL at random points, also in the middle of
// writing a file) leaves every entry whole or absent: readers never see half a file.
TEST(ActivationCacheTest, AWriterKilledMidSpillLeavesNoHalfFile) {
  const std::string dir = TempDir("killed");
  constexpr int kSamples = 64, kFloats = 1 << 20;  // 4 MiB per entry
  for (int round = 0; round < 6; ++round) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      auto writer = MakeCache(0, dir);  // spill only: every Put writes a file
      for (int i = 0;; i = (i + 1) % kSamples) {
        Floats x(kFloats, static_cast<float>(i));
        (void)writer->Put(i, 1, x.view());
      }
    }
    usleep(30000 + 25000 * round);
    kill(child, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
  }
  auto reader = MakeCache(0, dir);
  int whole = 0;
  for (int i = 0; i < kSamples; ++i) {
    auto got = reader->Get(i, 1);
    ASSERT_TRUE(got.ok()) << got.status();
    if (!got->has_value()) continue;
    Floats expect(kFloats, static_cast<float>(i));
    ASSERT_EQ((*got)->nbytes(), expect.values.size() * sizeof(float));
    EXPECT_EQ(std::memcmp((*got)->data(), expect.values.data(), (*got)->nbytes()), 0)
        << "sample " << i;
    ++whole;
  }
  EXPECT_GT(whole, 0);
  EXPECT_EQ(reader->stats().corrupt_files, 0);
}

TEST(ActivationCacheTest, GetDeepestAtMostSkipsACorruptDeeperFile) {
  const std::string dir = TempDir("skip");
  SpillOne(dir, 2, 3);
  const std::string deeper = SpillOne(dir, 2, 6);
  WriteFile(deeper, "garbage");
  auto cache = MakeCache(1 << 20, dir);
  auto got = cache->GetDeepestAtMost(2, 8);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->depth, 3);
}

TEST(ActivationCacheTest, ZeroBudgetIsDisabledOrSpillOnly) {
  auto off = MakeCache(0);
  EXPECT_FALSE(off->enabled());
  Floats x(4);
  ASSERT_TRUE(off->Put(1, 1, x.view()).ok());
  EXPECT_FALSE(Has(*off, 1, 1));
  EXPECT_EQ(off->stats().bytes_in_memory, 0u);

  const std::string dir = TempDir("spillonly");
  auto spill_only = MakeCache(0, dir);
  EXPECT_TRUE(spill_only->enabled());
  ASSERT_TRUE(spill_only->Put(1, 1, x.view()).ok());
  EXPECT_TRUE(Has(*spill_only, 1, 1));
  auto s = spill_only->stats();
  EXPECT_EQ(s.bytes_in_memory, 0u);
  EXPECT_EQ(s.spills, 1);
  EXPECT_EQ(s.disk_hits, 1);
}

TEST(ActivationCacheTest, EntryLargerThanBudgetIsNotKeptInMemory) {
  auto cache = MakeCache(100);
  Floats small(5), big(50);
  ASSERT_TRUE(cache->Put(1, 1, small.view()).ok());
  ASSERT_TRUE(cache->Put(2, 1, big.view()).ok());
  EXPECT_TRUE(Has(*cache, 1, 1));  // not evicted for an entry that could never fit
  EXPECT_FALSE(Has(*cache, 2, 1));

  const std::string dir = TempDir("big");
  auto spilling = MakeCache(100, dir);
  ASSERT_TRUE(spilling->Put(2, 1, big.view()).ok());
  EXPECT_EQ(spilling->stats().bytes_in_memory, 0u);
  EXPECT_TRUE(Has(*spilling, 2, 1));  // from disk, not promoted
  EXPECT_EQ(spilling->stats().bytes_in_memory, 0u);
}

TEST(ActivationCacheTest, RandomAugmentationRefusedOrBypassed) {
  Options options;
  options.budget_bytes = 1000;
  options.random_augmentation = true;
  auto refused = ActivationCache::Create(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("random augmentation"), std::string::npos);
  EXPECT_NE(refused.status().message().find("kBypass"), std::string::npos);

  options.on_augmentation = ActivationCache::OnAugmentation::kBypass;
  options.spill_dir = TempDir("bypass");
  auto bypass = ActivationCache::Create(options);
  ASSERT_TRUE(bypass.ok()) << bypass.status();
  auto& cache = **bypass;
  EXPECT_TRUE(cache.bypassed());
  EXPECT_FALSE(cache.enabled());
  Floats x(4);
  ASSERT_TRUE(cache.Put(1, 1, x.view()).ok());
  EXPECT_FALSE(Has(cache, 1, 1));
  auto deepest = cache.GetDeepestAtMost(1, 5);
  ASSERT_TRUE(deepest.ok());
  EXPECT_FALSE(deepest->has_value());
  EXPECT_EQ(cache.stats().spills, 0);

  // Without augmentation the same options make an ordinary cache.
  options.random_augmentation = false;
  auto normal = ActivationCache::Create(options);
  ASSERT_TRUE(normal.ok());
  EXPECT_FALSE((*normal)->bypassed());
}

TEST(ActivationCacheTest, BadInputIsAClearError) {
  auto cache = MakeCache(1000);
  Floats x(4);
  EXPECT_EQ(cache->Put(1, -1, x.view()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Put(-1, 1, x.view()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Put(1, 1, TensorView()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Put(1, 1, TensorView(x.values.data(), DType::kFloat32, {0, 3})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Put(1, 1, TensorView(x.values.data(), DType::kFloat32, {4},
                                        Device::CUDA(0))).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Get(1, -2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->GetDeepestAtMost(-3, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->stats().entries_in_memory, 0);
}

TEST(ActivationCacheTest, UnwritableSpillDirectoryFailsAtCreate) {
  const std::string dir = TempDir("unwritable");
  const std::string file = dir + "/a-file";
  WriteFile(file, "x");
  Options options;
  options.budget_bytes = 1000;
  options.spill_dir = file + "/sub";  // below a regular file: cannot be created
  auto cache = ActivationCache::Create(options);
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(cache.status().message().find(options.spill_dir), std::string::npos);

  options.spill_dir = file;  // a file, not a directory
  EXPECT_FALSE(ActivationCache::Create(options).ok());

  if (geteuid() != 0) {  // root writes anywhere
    const std::string locked = TempDir("locked");
    chmod(locked.c_str(), 0555);
    options.spill_dir = locked;
    auto refused = ActivationCache::Create(options);
    EXPECT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("not writable"), std::string::npos);
    chmod(locked.c_str(), 0755);
  }

  // A missing directory is created.
  options.spill_dir = dir + "/new/nested/";
  auto created = ActivationCache::Create(options);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ((*created)->spill_dir(), dir + "/new/nested");
}

TEST(ActivationCacheTest, BudgetComesFromWeftCacheBytes) {
  auto& registry = config::Registry::Global();
  ASSERT_TRUE(registry.Set("WEFT_CACHE_BYTES", "4096").ok());
  auto cache = ActivationCache::Create(Options());
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ((*cache)->budget_bytes(), 4096u);
  // A negative budget is refused where it is set, naming the setting and its range.
  Status bad = registry.Set("WEFT_CACHE_BYTES", "-1");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("WEFT_CACHE_BYTES='-1'"), std::string::npos) << bad;
  EXPECT_NE(bad.message().find("at least 0"), std::string::npos) << bad;
  EXPECT_EQ((*ActivationCache::Create(Options()))->budget_bytes(), 4096u);
  registry.Unset("WEFT_CACHE_BYTES");
  auto by_default = ActivationCache::Create(Options());
  ASSERT_TRUE(by_default.ok());
  EXPECT_EQ((*by_default)->budget_bytes(), size_t{1} << 30);
}

TEST(ActivationCacheTest, InvalidateAndClear) {
  const std::string dir = TempDir("clear");
  auto cache = MakeCache(40, dir);
  Floats x(10);
  for (int d = 1; d <= 3; ++d) ASSERT_TRUE(cache->Put(1, d, x.view()).ok());
  ASSERT_TRUE(cache->Put(2, 1, x.view()).ok());
  cache->Invalidate(1, 2);
  EXPECT_FALSE(Has(*cache, 1, 2));
  EXPECT_TRUE(Has(*cache, 1, 3));
  cache->Invalidate(1);
  EXPECT_FALSE(Has(*cache, 1, 1));
  EXPECT_FALSE(Has(*cache, 1, 3));
  EXPECT_TRUE(Has(*cache, 2, 1));
  cache->Clear();
  EXPECT_FALSE(Has(*cache, 2, 1));
  EXPECT_EQ(cache->stats().bytes_in_memory, 0u);
  auto other = MakeCache(40, dir);
  EXPECT_FALSE(Has(*other, 2, 1));
}

TEST(ActivationCacheTest, ConcurrentUseStaysConsistent) {
  const std::string dir = TempDir("threads");
  auto cache = MakeCache(2000, dir);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const int64_t sample = (i * 7 + t) % 50;
        Floats x(25, static_cast<float>(sample));
        EXPECT_TRUE(cache->Put(sample, 1, x.view()).ok());
        auto got = cache->Get((i * 3) % 50, 1);
        ASSERT_TRUE(got.ok());
        if (got->has_value()) {
          EXPECT_EQ(static_cast<const float*>((*got)->data())[0],
                    static_cast<float>((i * 3) % 50));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(cache->stats().bytes_in_memory, 2000u);
}

}  // namespace
}  // namespace pipe
}  // namespace weft
