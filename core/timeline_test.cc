#include "core/timeline.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace weft {
namespace {

std::string TempPath(const char* name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

TEST(Timeline, WritesAChromeTraceThatParses) {
  const std::string path = TempPath("trace.json");
  {
    Timeline t;
    ASSERT_TRUE(t.Open(path, 3, "rank 3").ok());
    t.Span("grad.\"layer1\"", "ENQUEUE_ALLREDUCE", "queue", 10, 20, "float32[4]");
    t.Span("grad.\"layer1\"", "MPI_ALLREDUCE", "communicate", 20, 45);
    t.Instant("weights", "ERROR", "error", 50, "line1\nline2");
    t.Close();
    t.Close();  // idempotent
  }
  const std::string cmd = "/usr/bin/python3 tests/check_trace.py " + path +
                          " queue communicate error ENQUEUE_ALLREDUCE MPI_ALLREDUCE ERROR";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

std::string Contents(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Readers see each event as soon as it is written, not only after Close().
TEST(Timeline, EventsReachTheFileAtOnce) {
  const std::string path = TempPath("live.json");
  Timeline t;
  ASSERT_TRUE(t.Open(path, 0, "rank 0").ok());
  ASSERT_TRUE(t.BeginActivity("x", "FAKE_ACTIVITY").ok());
  ASSERT_TRUE(t.EndActivity("x").ok());
  EXPECT_NE(Contents(path).find("FAKE_ACTIVITY"), std::string::npos) << Contents(path);
  t.Close();
}

// Two threads timing the same name each get a row, and neither ends the other's activity.
TEST(Timeline, ThreadsTimingTheSameNameGetRowsOfTheirOwn) {
  const std::string path = TempPath("threads.json");
  Timeline t;
  ASSERT_TRUE(t.Open(path, 0, "rank 0").ok());
  ASSERT_TRUE(t.BeginActivity("shared", "MAIN").ok());
  Status other_begin, other_end;
  std::thread other([&] {
    other_begin = t.BeginActivity("shared", "OTHER");
    other_end = t.EndActivity("shared");
  });
  other.join();
  EXPECT_TRUE(other_begin.ok()) << other_begin;
  EXPECT_TRUE(other_end.ok()) << other_end;
  EXPECT_TRUE(t.EndActivity("shared").ok());  // still open on this thread
  EXPECT_FALSE(t.EndActivity("shared").ok());
  t.Close();
  const std::string text = Contents(path);
  EXPECT_NE(text.find(R"("tid": 1, "args": {"name": "shared"})"), std::string::npos) << text;
  EXPECT_NE(text.find(R"x("tid": 2, "args": {"name": "shared (thread 2)"})x"), std::string::npos)
      << text;
  EXPECT_NE(text.find(R"("name": "MAIN", "cat": "activity")"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("name": "OTHER", "cat": "activity")"), std::string::npos) << text;
}

TEST(Timeline, OpenFailsClearlyForAnUnwritablePath) {
  Timeline t;
  Status st = t.Open("/nonexistent-dir/trace.json", 0, "rank 0");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/nonexistent-dir/trace.json"), std::string::npos);
  EXPECT_FALSE(t.enabled());
}

}  // namespace
}  // namespace weft
