#include "core/timeline.h"

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace weft {

Timeline::~Timeline() { Close(); }

int64_t Timeline::NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

Status Timeline::Open(const std::string& path, int process_id, const std::string& process_name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ != nullptr) return FailedPrecondition("timeline is already open");
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    return InvalidArgument("cannot open timeline file '", path, "': ", std::strerror(errno));
  }
  pid_ = process_id;
  first_ = true;
  rows_.clear();
  activities_.clear();
  activity_owner_.clear();
  thread_numbers_.clear();
  file_ = file;
  std::fputs("[\n", file);
  WriteEvent(absl::StrFormat(
      R"({"name": "process_name", "ph": "M", "pid": %d, "tid": 0, "args": {"name": "%s"}})",
      pid_, JsonEscape(process_name)));
  return OkStatus();
}

void Timeline::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  std::FILE* file = file_.load();
  if (file == nullptr) return;
  file_ = nullptr;
  std::fputs("\n]\n", file);
  std::fclose(file);
}

void Timeline::WriteEvent(const std::string& json) {
  std::FILE* file = file_.load(std::memory_order_relaxed);
  if (!first_) std::fputs(",\n", file);
  first_ = false;
  std::fputs(json.c_str(), file);
  // Readers (a trace viewer on a live job, a test) see each event at once, as Bluefog's
  // timeline files show them.
  std::fflush(file);
}

int Timeline::RowFor(const std::string& tensor) {
  auto it = rows_.find(tensor);
  if (it != rows_.end()) return it->second;
  const int row = static_cast<int>(rows_.size()) + 1;
  rows_.emplace(tensor, row);
  WriteEvent(absl::StrFormat(
      R"({"name": "thread_name", "ph": "M", "pid": %d, "tid": %d, "args": {"name": "%s"}})",
      pid_, row, JsonEscape(tensor)));
  return row;
}

void Timeline::Span(const std::string& tensor, const std::string& name, const char* category,
                    int64_t start_us, int64_t end_us, const std::string& detail) {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return;
  WriteSpan(tensor, name, category, start_us, end_us, detail);
}

void Timeline::WriteSpan(const std::string& tensor, const std::string& name, const char* category,
                         int64_t start_us, int64_t end_us, const std::string& detail) {
  const int row = RowFor(tensor);
  WriteEvent(absl::StrFormat(
      R"({"name": "%s", "cat": "%s", "ph": "X", "pid": %d, "tid": %d, "ts": %d, "dur": %d, "args": {"tensor": "%s", "detail": "%s"}})",
      JsonEscape(name), JsonEscape(category), pid_, row, start_us,
      end_us > start_us ? end_us - start_us : 0, JsonEscape(tensor), JsonEscape(detail)));
}

void Timeline::Instant(const std::string& tensor, const char* name, const char* category,
                       int64_t at_us, const std::string& detail) {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return;
  const int row = RowFor(tensor);
  WriteEvent(absl::StrFormat(
      R"({"name": "%s", "cat": "%s", "ph": "i", "s": "t", "pid": %d, "tid": %d, "ts": %d, "args": {"detail": "%s"}})",
      JsonEscape(name), JsonEscape(category), pid_, row, at_us, JsonEscape(detail)));
}

std::string Timeline::ActivityRow(const std::string& tensor) {
  const std::thread::id me = std::this_thread::get_id();
  auto owner = activity_owner_.emplace(tensor, me).first;
  if (owner->second == me) return tensor;
  auto number = thread_numbers_.emplace(me, static_cast<int>(thread_numbers_.size()) + 2);
  return absl::StrCat(tensor, " (thread ", number.first->second, ")");
}

Status Timeline::BeginActivity(const std::string& tensor, const std::string& activity) {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return FailedPrecondition("no timeline is being written");
  const int64_t now = NowMicros();
  const std::string row = ActivityRow(tensor);
  RowFor(row);  // rows in the order activities begin
  auto it = activities_.find(row);
  if (it != activities_.end()) {
    WriteSpan(row, it->second.name, "activity", it->second.start_us, now, "");
    activities_.erase(it);
  }
  activities_.emplace(row, Activity{activity, now});
  return OkStatus();
}

Status Timeline::EndActivity(const std::string& tensor) {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return FailedPrecondition("no timeline is being written");
  const std::string row = ActivityRow(tensor);
  auto it = activities_.find(row);
  if (it == activities_.end()) {
    return FailedPrecondition("no timeline activity is open on '", tensor,
                              "' on this thread; call start_activity first");
  }
  WriteSpan(row, it->second.name, "activity", it->second.start_us, NowMicros(), "");
  activities_.erase(it);
  return OkStatus();
}

}  // namespace weft
