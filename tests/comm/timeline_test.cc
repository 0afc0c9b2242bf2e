// WEFT_TIMELINE (set by the BUILD rule to a path with %r) writes one Chrome trace per rank
// with every phase; tests/check_trace.py validates it after shutdown.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.h"
#include "core/config.h"
#include "gtest/gtest.h"
#include "tests/comm/test_util.h"

namespace weft {
namespace {

TEST(Timeline, EveryPhaseIsRecorded) {
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::string pattern = dir + "/trace.%r.json";
  setenv("WEFT_TIMELINE", pattern.c_str(), 1);
  ASSERT_TRUE(init().ok());
  const int me = rank(), n = size();
  std::vector<testing::Buffer> bufs;
  for (int k = 0; k < 8; ++k) bufs.emplace_back(DType::kFloat32, std::vector<int64_t>{64});
  // Fused (likely: the first may run alone), through the ranks' shared memory, then, with
  // that off on every rank, through the fusion buffer ("fuse").
  for (const char* shared_bytes : {"4194304", "0"}) {
    ASSERT_TRUE(config::Registry::Global().Set("WEFT_SHARED_MEMORY_BYTES", shared_bytes).ok());
    std::vector<Handle> hs;
    group_start();
    for (auto& b : bufs) hs.push_back(*allreduce_nonblocking(b.view(), b.view(), true));
    ASSERT_TRUE(group_end().ok());
    for (auto& h : hs) ASSERT_TRUE(wait(h).ok());
  }
  config::Registry::Global().Unset("WEFT_SHARED_MEMORY_BYTES");
  testing::Buffer x(DType::kFloat32, {64});
  ASSERT_TRUE(neighbor_allreduce(x.view(), x.view(), {}, "weights.\"quoted\"").ok());
  // 256 KiB: where the ranks can read each other's memory, both read it straight from the
  // other ranks' memory (CMA_), and otherwise neither does.
  testing::Buffer wide(DType::kFloat32, {65536 / n});
  testing::Arena arena;
  ASSERT_TRUE(allgather(wide.view(), arena.allocator()).ok());
  testing::Buffer root_only(DType::kFloat32, {65536});
  ASSERT_TRUE(broadcast(root_only.view(), root_only.view(), 0).ok());
  // 5 MiB: past the direct reads' limit a neighbor allreduce goes through shared memory.
  testing::Buffer large(DType::kFloat32, {5 << 18});
  ASSERT_TRUE(neighbor_allreduce(large.view(), large.view(), {}, "large.exchange").ok());
  testing::Buffer bad(DType::kFloat32, {rank() == 0 ? 3 : 4});
  if (size() > 1) {
    EXPECT_FALSE(allreduce(bad.view(), bad.view(), true, "mismatch").ok());
  }
  ASSERT_TRUE(shutdown().ok());
  unsetenv("WEFT_TIMELINE");
  const std::string file = dir + "/trace." + std::to_string(me) + ".json";
  std::string cmd = "/usr/bin/python3 tests/check_trace.py " + file +
                    " queue negotiate communicate combine";
  if (n > 1) cmd += " fuse error SHM_ALLREDUCE MPI_ALLREDUCE SHM_NEIGHBOR_ALLREDUCE";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(file);
  const std::string trace((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(trace.find("CMA_ALLGATHER") != std::string::npos,
            trace.find("CMA_BROADCAST") != std::string::npos)
      << "a 256 KiB allgather and broadcast took different ways: " << file;
  if (n > 1) {
    // Its events, one per line: the transfer's names the way it took.
    const std::string tensor = "'large.exchange'\"";
    const std::string shared = "{\"name\": \"SHM_NEIGHBOR_ALLREDUCE\"";
    bool found = false;
    for (size_t at = trace.find(tensor); !found && at != std::string::npos;
         at = trace.find(tensor, at + 1)) {
      found = trace.compare(trace.rfind('\n', at) + 1, shared.size(), shared) == 0;
    }
    EXPECT_TRUE(found) << "a 5 MiB neighbor allreduce did not go through shared memory: " << file;
  }
}

// On 2 ranks with a CPU each, rank 0 picks the way of large allreduces by timing them
// (WEFT_TUNE_WAYS), in place and out of place apart: after five ops of a size through shared
// memory it tries MPI's allreduce and then, where the ranks can reach each other's memory,
// the direct way, whatever the times. Every way gives every op the bits it gets with the
// tuning off (through shared memory), for every floating dtype, summed and averaged. An op
// in place on some ranks only stays in shared memory. Where the ranks share CPUs, lone ops
// of 64 KiB or more (all of these) reach each other's memory untuned.
TEST(Timeline, TunedAllreducesTryEveryWayAndGiveTheSameBits) {
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  ASSERT_TRUE(init().ok());
  const int me = rank(), n = size();
  struct Restore {
    ~Restore() { config::Registry::Global().Unset("WEFT_TUNE_WAYS"); }
  } restore;
  ASSERT_TRUE(timeline_start(dir + "/tuned.%r.json").ok());
  // Whether the ranks read each other's memory: a 1 MiB allgather then does (CMA_ALLGATHER).
  testing::Buffer part(DType::kFloat32, {(1 << 18) / n});
  testing::Arena arena;
  ASSERT_TRUE(allgather(part.view(), arena.allocator(), "probe").ok());
  auto value = [](int r, int k, int64_t i) {
    return ((r + 3) * 7919 * (i + 1) + 104729 * k) % 2003 / 7.0 - 140.0;
  };
  // One size per dtype, so that each has a tuner (sizes double from 16 KiB) and its
  // trials: 24 ops, room for both trials (5 ops through shared memory, 5 of MPI's or 3 where
  // its trial ends early, 5 of the way kept, 3 or more of the direct way) and for an op or
  // two that the coordinator answers or whose time comes late (the next op's pick then
  // follows the one before).
  struct Case {
    DType dtype;
    int64_t count;
    bool in_place;
  };
  const Case cases[] = {{DType::kFloat32, 1 << 18, true},
                        {DType::kFloat64, 1 << 18, false},
                        {DType::kFloat16, 1 << 21, true},
                        {DType::kBFloat16, 1 << 22, false}};
  constexpr int kOps = 24;
  for (const Case& c : cases) {
    const size_t bytes = static_cast<size_t>(c.count) * DTypeSize(c.dtype);
    testing::Buffer input(c.dtype, std::vector<int64_t>{c.count});
    for (int k = 0; k < kOps; ++k) {
      const bool average = k % 3 == 1;
      for (int64_t i = 0; i < c.count; ++i) input.Set(i, value(me, k, i));
      std::vector<testing::Buffer> results;
      for (const char* tune : {"1", "0"}) {
        ASSERT_TRUE(config::Registry::Global().Set("WEFT_TUNE_WAYS", tune).ok());
        testing::Buffer x(c.dtype, std::vector<int64_t>{c.count});
        testing::Buffer y(c.dtype, std::vector<int64_t>{c.count});
        std::memcpy(x.view().data(), input.view().data(), bytes);
        const std::string name = std::string(tune[0] == '1' ? "tuned." : "untuned.") +
                                 DTypeName(c.dtype) + "." + std::to_string(k);
        // Only ops agreed directly are tuned and timed; one whose ranks arrive over 100 ms
        // apart (filling the buffers on a loaded machine) is negotiated. The barrier brings
        // the ranks to the op together.
        ASSERT_TRUE(barrier().ok());
        testing::Buffer& out = c.in_place ? x : y;
        ASSERT_TRUE(allreduce(x.view(), out.view(), average, name).ok());
        results.push_back(std::move(out));
      }
      EXPECT_EQ(std::memcmp(results[0].view().data(), results[1].view().data(), bytes), 0)
          << DTypeName(c.dtype) << " op " << k << (average ? " (average)" : "")
          << (c.in_place ? " in place" : " out of place");
    }
  }
  // In place on rank 0 only, of a size of their own (16 MiB), which would be tried other
  // ways from the fifth op on: through shared memory, every one.
  ASSERT_TRUE(config::Registry::Global().Set("WEFT_TUNE_WAYS", "1").ok());
  for (int k = 0; k < 12; ++k) {
    testing::Buffer x(DType::kFloat32, {1 << 22}), y(DType::kFloat32, {1 << 22});
    for (int64_t i = 0; i < x.numel(); ++i) x.Set(i, me + 1);
    testing::Buffer& out = me == 0 ? x : y;
    ASSERT_TRUE(allreduce(x.view(), out.view(), false, "mixed." + std::to_string(k)).ok());
    EXPECT_EQ(out.Get(x.numel() - 1), n * (n + 1) / 2.0) << "op " << k;
  }
  ASSERT_TRUE(timeline_stop().ok());
  ASSERT_TRUE(shutdown().ok());
  std::ifstream in(dir + "/tuned." + std::to_string(me) + ".json");
  std::string line;
  std::map<std::string, int> transfers;  // "MPI_ALLREDUCE 'tuned.", ...
  bool direct_reads = false;
  while (std::getline(in, line)) {
    if (line.rfind("{\"name\": \"CMA_ALLGATHER\"", 0) == 0) direct_reads = true;
    for (const char* way : {"MPI_ALLREDUCE", "SHM_ALLREDUCE", "CMA_ALLREDUCE"}) {
      if (line.rfind(std::string("{\"name\": \"") + way + "\"", 0) != 0) continue;
      for (const char* kind : {"'tuned.", "'untuned.", "'mixed."}) {
        if (line.find(kind) != std::string::npos) ++transfers[std::string(way) + " " + kind];
      }
    }
  }
  for (const auto& [what, count] : transfers) {
    std::printf("rank %d: %d x %s\n", me, count, what.c_str());
  }
  if (n == 1) return;  // one rank sums nothing with anyone
  const bool own_cpus = testing::RanksHaveACpuEach(n);
  // More than 2 ranks with a CPU each take these sizes to MPI's allreduce in any case.
  if (n > 2 && own_cpus) return;
  // Where the ranks share CPUs nothing is tuned, and lone ops of 64 KiB or more reach each
  // other's memory where they can (read it and write it): every case and the mixed ops.
  const bool direct = direct_reads && testing::CanWriteProcessMemory();
  const int direct_cases = !own_cpus && direct ? 4 : 0;
  // The tuned ops through shared memory include the first five of each size; with the
  // tuning off, or in place on some ranks only, every other op goes that way (where the
  // ranks share CPUs, every op the direct access does not take).
  EXPECT_EQ(transfers["MPI_ALLREDUCE 'untuned."], 0);
  EXPECT_EQ(transfers["MPI_ALLREDUCE 'mixed."], 0);
  EXPECT_EQ(transfers["CMA_ALLREDUCE 'untuned."], direct_cases * kOps);
  EXPECT_EQ(transfers["CMA_ALLREDUCE 'mixed."], direct_cases > 0 ? 12 : 0);
  if (n == 2 && own_cpus) {
    EXPECT_GE(transfers["SHM_ALLREDUCE 'tuned."], 16);
  } else {
    EXPECT_EQ(transfers["SHM_ALLREDUCE 'tuned."], (4 - direct_cases) * kOps);
  }
  EXPECT_EQ(transfers["SHM_ALLREDUCE 'untuned."], (4 - direct_cases) * kOps);
  EXPECT_EQ(transfers["SHM_ALLREDUCE 'mixed."], direct_cases > 0 ? 0 : 12);
  if (n == 2 && own_cpus) {
    // At least two ops of each trial (each runs at least 3: two not counted, one that is).
    EXPECT_GE(transfers["MPI_ALLREDUCE 'tuned."], 8);
    if (direct) {
      EXPECT_GE(transfers["CMA_ALLREDUCE 'tuned."], 8);
    } else {
      EXPECT_EQ(transfers["CMA_ALLREDUCE 'tuned."], 0) << "no direct way without access";
    }
  } else {
    EXPECT_EQ(transfers["MPI_ALLREDUCE 'tuned."], 0) << "only 2 ranks with a CPU each tune";
    EXPECT_EQ(transfers["CMA_ALLREDUCE 'tuned."], direct_cases * kOps)
        << "only 2 ranks with a CPU each tune";
  }
}

// The default ways at the direct reads' limits, by the way each op's transfer took (its
// event's name: CMA_ read each other's memory, SHM_ through the segment). Where ranks have
// a CPU each: allgathers from 32 KiB of output read (16 KiB does not), neighbor allreduces
// from 16 KiB (8 KiB do not), lone broadcasts from 128 KiB. Where they share CPUs:
// allgathers from 256 KiB (128 KiB do not), neighbor allreduces from 128 KiB (64 KiB do
// not), broadcasts from 128 KiB, lone allreduces from 64 KiB (not 4 bytes fewer) to any
// size. Each op starts after a barrier, as the staged ways expect.
TEST(Timeline, DirectReadsTakeTheSizesTheirLimitsSay) {
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  ASSERT_TRUE(init().ok());
  const int me = rank(), n = size();
  ASSERT_TRUE(timeline_start(dir + "/limits.%r.json").ok());
  const bool own_cpus = testing::RanksHaveACpuEach(n);
  // Bytes of each op (an allgather's: its output), by name, and whether it should read.
  struct Op {
    std::string kind;
    int64_t bytes;
    bool reads;
  };
  std::vector<std::pair<std::string, Op>> ops;
  if (own_cpus) {
    ops = {{"ag.16k", {"allgather", 16 << 10, false}},
           {"ag.32k", {"allgather", 32 << 10, true}},
           {"na.8k", {"neighbor", 8 << 10, false}},
           {"na.16k", {"neighbor", 16 << 10, true}},
           {"bc.below", {"broadcast", (128 << 10) - 4, false}},
           {"bc.128k", {"broadcast", 128 << 10, true}}};
  } else {
    ops = {{"ag.128k", {"allgather", 128 << 10, false}},
           {"ag.256k", {"allgather", 256 << 10, true}},
           {"na.64k", {"neighbor", 64 << 10, false}},
           {"na.128k", {"neighbor", 128 << 10, true}},
           {"bc.below", {"broadcast", (128 << 10) - 4, false}},
           {"bc.128k", {"broadcast", 128 << 10, true}},
           {"ar.below", {"allreduce", (64 << 10) - 4, false}},
           {"ar.64k", {"allreduce", 64 << 10, true}},
           {"ar.16m+4", {"allreduce", (16 << 20) + 4, true}}};
  }
  testing::Arena arena;
  for (const auto& [name, op] : ops) {
    const int64_t count = op.bytes / 4;
    // An allgather's output: n parts of count / n (the first rank's takes the rest).
    const int64_t part = op.kind == "allgather" ? count / n + (me == 0 ? count % n : 0) : count;
    testing::Buffer x(DType::kFloat32, {part}), y(DType::kFloat32, {part});
    x.Fill(me + 1);
    ASSERT_TRUE(barrier().ok());
    Status st;
    if (op.kind == "allgather") {
      st = allgather(x.view(), arena.allocator(), name).status();
    } else if (op.kind == "neighbor") {
      st = neighbor_allreduce(x.view(), y.view(), {}, name);
    } else if (op.kind == "broadcast") {
      st = broadcast(x.view(), y.view(), 0, name);
    } else {
      st = allreduce(x.view(), y.view(), false, name);
    }
    ASSERT_TRUE(st.ok()) << name << ": " << st;
  }
  ASSERT_TRUE(timeline_stop().ok());
  ASSERT_TRUE(shutdown().ok());
  if (n == 1) return;  // nothing to read from anyone
  std::ifstream in(dir + "/limits." + std::to_string(me) + ".json");
  std::string line;
  std::map<std::string, std::string> ways;  // name -> "CMA", "SHM", "MPI" (and "+" more)
  bool direct_reads = false;
  while (std::getline(in, line)) {
    for (const char* way : {"CMA", "SHM", "MPI"}) {
      if (line.rfind(std::string("{\"name\": \"") + way + "_", 0) != 0) continue;
      direct_reads = direct_reads || way == std::string("CMA");
      for (const auto& [name, op] : ops) {
        if (line.find("'" + name + "'") == std::string::npos) continue;
        std::string& got = ways[name];
        got = got.empty() || got == way ? way : got + "+" + way;
      }
    }
  }
  if (!direct_reads) return;  // the kernel does not let the ranks read each other's memory
  const bool writes = testing::CanWriteProcessMemory();  // which the allreduces need too
  for (const auto& [name, op] : ops) {
    const bool reads = op.reads && (op.kind != "allreduce" || writes);
    EXPECT_EQ(ways[name], reads ? "CMA" : "SHM") << name << " (" << op.bytes << " bytes)";
  }
}

// A trace started while ops wait to be drained (here in an open group) records their
// phases from then on: none reaches back to the clock's epoch.
TEST(Timeline, StartedWhileOpsAreQueued) {
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  ASSERT_TRUE(init().ok());
  const std::string file = dir + "/started_late." + std::to_string(rank()) + ".json";
  std::vector<testing::Buffer> bufs;
  for (int k = 0; k < 4; ++k) bufs.emplace_back(DType::kFloat32, std::vector<int64_t>{64});
  std::vector<Handle> hs;
  group_start();
  for (auto& b : bufs) hs.push_back(*allreduce_nonblocking(b.view(), b.view(), false));
  ASSERT_TRUE(timeline_start(dir + "/started_late.%r.json").ok());
  ASSERT_TRUE(group_end().ok());
  for (auto& h : hs) ASSERT_TRUE(wait(h).ok());
  ASSERT_TRUE(timeline_stop().ok());
  ASSERT_TRUE(shutdown().ok());
  // Which phases come after the start depends on when the engine drained the queue.
  const std::string cmd = "/usr/bin/python3 tests/check_trace.py " + file;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// A rank that cannot write its file (here the last one's directory is missing) fails
// init() on every rank, with its own error where it happened; nothing is left initialized.
TEST(Timeline, AnUnwritablePathOnOneRankFailsInitEverywhere) {
  const char* env_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const char* env_size = std::getenv("OMPI_COMM_WORLD_SIZE");
  const int me = env_rank ? std::atoi(env_rank) : 0;
  const int last = (env_size ? std::atoi(env_size) : 1) - 1;
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::string pattern = dir + (me == last ? "/no-such-dir" : "") + "/bad.%r.json";
  setenv("WEFT_TIMELINE", pattern.c_str(), 1);
  Status st = init();
  unsetenv("WEFT_TIMELINE");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_FALSE(is_initialized());
  if (me == last) {
    EXPECT_NE(std::string(st.message()).find("no-such-dir"), std::string::npos) << st;
    EXPECT_NE(std::string(st.message()).find("No such file or directory"), std::string::npos) << st;
  } else {
    EXPECT_NE(std::string(st.message())
                  .find("WEFT_TIMELINE: rank " + std::to_string(last) + " cannot write"),
              std::string::npos)
        << st;
  }
  ASSERT_TRUE(init().ok());  // the job goes on once the setting is fixed
  ASSERT_TRUE(barrier().ok());
  ASSERT_TRUE(shutdown().ok());
}

// The setting may differ across ranks: only rank 0 writing a timeline is fine (the check
// above is collective, so every rank takes part in it, with or without a timeline).
TEST(Timeline, OnlySomeRanksWritingOneIsFine) {
  const char* env_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const int me = env_rank ? std::atoi(env_rank) : 0;
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  if (me == 0) setenv("WEFT_TIMELINE", (dir + "/only0.%r.json").c_str(), 1);
  Status st = init();
  unsetenv("WEFT_TIMELINE");
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(timeline_active(), me == 0);
  ASSERT_TRUE(barrier().ok());
  ASSERT_TRUE(shutdown().ok());
}

}  // namespace
}  // namespace weft
