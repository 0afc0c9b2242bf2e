// Chrome-trace (JSON array) writer: open the file in Perfetto (ui.perfetto.dev) or
// chrome://tracing. One row ("thread") per tensor name, one span per phase of an op.
#ifndef WEFT_CORE_TIMELINE_H_
#define WEFT_CORE_TIMELINE_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
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

  // A span [start_us, end_us) named `name` (category `category`, may be empty) on the row
  // of `tensor`; `detail` goes into args.
  void Span(const std::string& tensor, const std::string& name, const char* category,
            int64_t start_us, int64_t end_us, const std::string& detail = "");
  // A point event on the row of `tensor`.
  void Instant(const std::string& tensor, const char* name, const char* category, int64_t at_us,
               const std::string& detail = "");

  // A user activity (e.g. "forward") on the row of `tensor` for the calling thread, from
  // BeginActivity to EndActivity; beginning another one on the same row ends the first.
  // Threads have rows of their own: two threads timing the same name get two rows.
  // EndActivity with none open (on this thread) is an error. Every event reaches the file
  // when it is written (the file is a complete JSON array once closed).
  Status BeginActivity(const std::string& tensor, const std::string& activity);
  Status EndActivity(const std::string& tensor);

  // Microseconds on the monotonic clock shared by the processes of one machine.
  static int64_t NowMicros();

 private:
  int RowFor(const std::string& tensor);  // requires mu_
  void WriteEvent(const std::string& json);  // requires mu_
  void WriteSpan(const std::string& tensor, const std::string& name, const char* category,
                 int64_t start_us, int64_t end_us, const std::string& detail);  // requires mu_
  // The row of the calling thread's activities on `tensor`: the tensor's own for the first
  // thread that uses it, "tensor (thread N)" for the others.
  std::string ActivityRow(const std::string& tensor);  // requires mu_

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
  // Which thread owns each tensor's own activity row, and how many threads have had one.
  std::unordered_map<std::string, std::thread::id> activity_owner_;
  std::unordered_map<std::thread::id, int> thread_numbers_;
};

// Escapes `s` for use inside a JSON string literal.
std::string JsonEscape(const std::string& s);

}  // namespace weft

#endif  // WEFT_CORE_TIMELINE_H_
