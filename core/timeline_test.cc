#include "core/timeline.h"

#include <cstdlib>
#include <fstream>
#include <string>

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
    t.Span("grad.\"layer1\"", "queue", 10, 20, "float32[4]");
    t.Span("grad.\"layer1\"", "communicate", 20, 45);
    t.Instant("weights", "error", 50, "line1\nline2");
    t.Close();
    t.Close();  // idempotent
  }
  const std::string cmd = "/usr/bin/python3 tests/check_trace.py " + path + " queue communicate error";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
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
