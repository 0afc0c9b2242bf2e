// Logging to stderr, filtered by WEFT_LOG_LEVEL (error, warning, info, debug, trace).
//
//   WEFT_LOG(Warning) << "stalled for " << seconds << " s";
//
// Each line carries the process's prefix (set by comm's init to the rank), so the output
// of many ranks interleaved by mpirun stays readable.
#ifndef WEFT_CORE_LOGGING_H_
#define WEFT_CORE_LOGGING_H_

#include <functional>
#include <sstream>
#include <string>

namespace weft {

enum class LogLevel { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

namespace log {

bool Enabled(LogLevel level);
const char* LevelName(LogLevel level);
// Re-reads WEFT_LOG_LEVEL (init calls this after Registry::Reload()).
void Refresh();
void SetPrefix(const std::string& prefix);
// Tests capture log lines through a sink (nullptr restores stderr only).
void SetSinkForTesting(std::function<void(LogLevel, const std::string&)> sink);

class Message {
 public:
  Message(LogLevel level, const char* file, int line);
  ~Message();  // writes the whole line at once
  std::ostream& stream() { return out_; }

 private:
  LogLevel level_;
  std::ostringstream out_;
};

}  // namespace log
}  // namespace weft

namespace weft {
namespace log {
// Lets WEFT_LOG be one expression, safe inside an unbraced if/else.
struct Voidify {
  void operator&(std::ostream&) {}
};
}  // namespace log
}  // namespace weft

#define WEFT_LOG(severity)                                          \
  !::weft::log::Enabled(::weft::LogLevel::k##severity)              \
      ? (void)0                                                     \
      : ::weft::log::Voidify() &                                    \
            ::weft::log::Message(::weft::LogLevel::k##severity, __FILE__, __LINE__).stream()

#endif  // WEFT_CORE_LOGGING_H_
