// Chrome-trace (JSON array) writer: open the file in Perfetto (ui.perfetto.dev) or
// chrome://tracing. One row ("thread") per tensor name, one span per phase of an op.
#ifndef WEFT_CORE_TIMELINE_H_
#define WEFT_CORE_TIMELINE_H_

#include <cstdint>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/status.h"

namespace weft {

class Timeline {
 public:
  Timeline() = default;
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Starts writing to `path`; `process_id` is the trace's pid (the rank) and
  // `process_name` labels it.
  Status Open(const std::string& path, int process_id, const std::string& process_name);
  // Finishes the JSON array and closes the file. Safe to call twice. Open and Close may
  // run while other threads write events.
  void Close();
  bool enabled() const { return file_.load(std::memory_order_relaxed) != nullptr; }

  // A span [start_us, end_us) of `phase` on the row of `tensor`; `detail` goes into args.
  void Span(const std::string& tensor, const char* phase, int64_t start_us, int64_t end_us,
            const std::string& detail = "");
  // A point event on the row of `tensor`.
  void Instant(const std::string& tensor, const char* what, int64_t at_us,
               const std::string& detail = "");

  // A user activity on the row of `tensor` (e.g. "forward"), from BeginActivity to
  // EndActivity; beginning another one on the same row ends the first. EndActivity with
  // none open is an error.
  Status BeginActivity(const std::string& tensor, const std::string& activity);
  Status EndActivity(const std::string& tensor);

  // Microseconds on the monotonic clock shared by the processes of one machine.
  static int64_t NowMicros();

 private:
  int RowFor(const std::string& tensor);  // requires mu_
  void WriteEvent(const std::string& json);  // requires mu_
  void WriteSpan(const std::string& tensor, const std::string& phase, int64_t start_us,
                 int64_t end_us, const std::string& detail);  // requires mu_

  std::mutex mu_;
  std::atomic<std::FILE*> file_{nullptr};  // written under mu_
  int pid_ = 0;
  bool first_ = true;
  std::unordered_map<std::string, int> rows_;
  struct Activity {
    std::string name;
    int64_t start_us;
  };
  std::unordered_map<std::string, Activity> activities_;  // open activities by row
};

// Escapes `s` for use inside a JSON string literal.
std::string JsonEscape(const std::string& s);

}  // namespace weft

#endif  // WEFT_CORE_TIMELINE_H_
