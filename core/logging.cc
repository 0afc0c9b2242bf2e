#include "core/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>

#include "core/config.h"

namespace weft {
namespace log {
namespace {

const config::StringSetting kLogLevel("WEFT_LOG_LEVEL", "warning",
                                      "Least severe log level printed.",
                                      {"error", "warning", "info", "debug", "trace"});

std::atomic<int> g_level{-1};
std::mutex g_prefix_mu;
std::string g_prefix = "weft";
std::function<void(LogLevel, const std::string&)> g_sink;  // guarded by g_prefix_mu

int LevelFromSetting() {
  const std::string v = kLogLevel.Get();
  if (v == "error") return 0;
  if (v == "warning") return 1;
  if (v == "info") return 2;
  if (v == "debug") return 3;
  return 4;
}

}  // namespace

bool Enabled(LogLevel level) {
  int current = g_level.load(std::memory_order_relaxed);
  if (current < 0) {
    current = LevelFromSetting();
    g_level.store(current, std::memory_order_relaxed);
  }
  return static_cast<int>(level) <= current;
}

void Refresh() { g_level.store(LevelFromSetting(), std::memory_order_relaxed); }

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kError: return "ERROR";
    case LogLevel::kWarning: return "WARNING";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kTrace: return "TRACE";
  }
  return "?";
}

void SetSinkForTesting(std::function<void(LogLevel, const std::string&)> sink) {
  std::lock_guard<std::mutex> lock(g_prefix_mu);
  g_sink = std::move(sink);
}

void SetPrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(g_prefix_mu);
  g_prefix = prefix;
}

Message::Message(LogLevel level, const char* file, int line) : level_(level) {
  const char* base = file;
  for (const char* p = file; *p; ++p) {
    if (*p == '/') base = p + 1;
  }
  std::lock_guard<std::mutex> lock(g_prefix_mu);
  out_ << "[" << g_prefix << " " << LevelName(level) << " " << base << ":" << line << "] ";
}

Message::~Message() {
  out_ << '\n';
  const std::string line = out_.str();
  {
    std::lock_guard<std::mutex> lock(g_prefix_mu);
    if (g_sink) g_sink(level_, line);
  }
  // One write(2) per line so lines from threads and ranks do not interleave.
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

}  // namespace log
}  // namespace weft
