#include "core/config.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

extern char** environ;

namespace weft {
namespace config {

namespace {

// Bluefog's environment variables, honoured when the weft setting they stand for is not
// set itself: (Bluefog's name, weft's name, how Bluefog's value becomes weft's).
struct BluefogAlias {
  const char* bluefog;
  const char* weft;
  std::string (*convert)(const std::string& value);
};

std::string Same(const std::string& v) { return v; }
// Bluefog's flags are on only for "1".
std::string Flag(const std::string& v) { return v == "1" ? "1" : "0"; }
// BLUEFOG_TIMELINE is a prefix: rank r writes <prefix><r>.json.
std::string TimelinePrefix(const std::string& v) { return v + "%r.json"; }
// Bluefog's levels include fatal (weft's highest is error) and map unknown ones to warning.
std::string LogLevel(const std::string& v) {
  const std::string level = absl::AsciiStrToLower(v);
  if (level == "fatal") return "error";
  for (const char* known : {"trace", "debug", "info", "warning", "error"}) {
    if (level == known) return level;
  }
  return "warning";
}
// BLUEFOG_CYCLE_TIME: milliseconds between the background thread's cycles; weft's engine
// sleeps at most this long between polls.
std::string MillisToMicros(const std::string& v) {
  double ms = 0;
  if (!absl::SimpleAtod(v, &ms) || !std::isfinite(ms) || ms < 0) return v;  // refused later
  return std::to_string(static_cast<int64_t>(std::llround(ms * 1000)));
}

const BluefogAlias kBluefogAliases[] = {
    {"BLUEFOG_TIMELINE", "WEFT_TIMELINE", TimelinePrefix},
    {"BLUEFOG_LOG_LEVEL", "WEFT_LOG_LEVEL", LogLevel},
    {"BLUEFOG_FUSION_THRESHOLD", "WEFT_FUSION_THRESHOLD_BYTES", Same},
    {"BLUEFOG_NODES_PER_MACHINE", "WEFT_RANKS_PER_MACHINE", Same},
    {"BLUEFOG_CYCLE_TIME", "WEFT_ENGINE_MAX_SLEEP_MICROS", MillisToMicros},
    {"BLUEFOG_ALLREDUCE_BY_MPI", "WEFT_ALLREDUCE_BY_MPI", Flag},
    {"BLUEFOG_BROADCAST_BY_MPI", "WEFT_BROADCAST_BY_MPI", Flag},
    {"BLUEFOG_ALLGATHER_BY_MPI", "WEFT_ALLGATHER_BY_MPI", Flag},
    {"BLUEFOG_NEIGHBOR_ALLGATHER_BY_MPI", "WEFT_NEIGHBOR_ALLGATHER_BY_MPI", Flag},
    {"BLUEFOG_NEIGHBOR_ALLREDUCE_BY_MPI", "WEFT_NEIGHBOR_ALLREDUCE_BY_MPI", Flag},
};

// The names of the environment's variables that start with `prefix`.
std::vector<std::string> EnvironmentNames(absl::string_view prefix) {
  std::vector<std::string> names;
  for (char** env = environ; env != nullptr && *env != nullptr; ++env) {
    absl::string_view entry(*env);
    if (absl::StartsWith(entry, prefix)) names.emplace_back(entry.substr(0, entry.find('=')));
  }
  return names;
}

const BluefogAlias* AliasFor(const std::string& weft_name) {
  for (const BluefogAlias& a : kBluefogAliases) {
    if (weft_name == a.weft) return &a;
  }
  return nullptr;
}

}  // namespace

Registry& Registry::Global() {
  static Registry* registry = new Registry();  // never destroyed: settings are globals
  return *registry;
}

void Registry::Register(Setting* setting) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!settings_.emplace(setting->name(), setting).second) {
    std::fprintf(stderr, "weft: setting %s is registered twice\n", setting->name().c_str());
    std::abort();
  }
}

const char* Registry::RawValue(const std::string& name, std::string* storage) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = overrides_.find(name);
    if (it != overrides_.end()) {
      *storage = it->second;
      return storage->c_str();
    }
  }
  if (const char* own = std::getenv(name.c_str())) return own;
  const BluefogAlias* alias = AliasFor(name);
  const char* theirs = alias != nullptr ? std::getenv(alias->bluefog) : nullptr;
  if (theirs == nullptr) return nullptr;
  *storage = alias->convert(theirs);
  return storage->c_str();
}

std::string Registry::AliasOf(const std::string& name) {
  const BluefogAlias* alias = AliasFor(name);
  return alias != nullptr ? alias->bluefog : "";
}

bool Registry::FromAlias(const std::string& name) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (overrides_.count(name) != 0) return false;
  }
  const BluefogAlias* alias = AliasFor(name);
  return alias != nullptr && std::getenv(name.c_str()) == nullptr &&
         std::getenv(alias->bluefog) != nullptr;
}

std::vector<std::string> Registry::IgnoredBluefogEnvironment() {
  std::vector<std::string> ignored;
  for (const std::string& name : EnvironmentNames("BLUEFOG_")) {
    bool honoured = false;
    for (const BluefogAlias& a : kBluefogAliases) honoured = honoured || name == a.bluefog;
    if (!honoured) ignored.push_back(name);
  }
  return ignored;
}

Status Registry::Reload() {
  std::vector<Setting*> settings;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& entry : settings_) settings.push_back(entry.second);
  }
  std::vector<std::string> errors;
  for (Setting* s : settings) {
    std::call_once(s->loaded_, [] {});
    Status st = s->Load();
    if (!st.ok()) errors.emplace_back(st.message());
  }
  if (!errors.empty()) return InvalidArgument(absl::StrJoin(errors, "; "));
  return OkStatus();
}

Status Registry::Set(const std::string& name, const std::string& value) {
  Setting* setting = nullptr;
  std::string previous;
  bool had_previous = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = settings_.find(name);
    if (it == settings_.end()) {
      return InvalidArgument("'", name, "' is not a weft setting");
    }
    setting = it->second;
    auto old = overrides_.find(name);
    if (old != overrides_.end()) {
      had_previous = true;
      previous = old->second;
    }
    overrides_[name] = value;
  }
  std::call_once(setting->loaded_, [] {});
  Status st = setting->Load();
  if (!st.ok()) {  // leave everything as it was
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (had_previous) {
        overrides_[name] = previous;
      } else {
        overrides_.erase(name);
      }
    }
    (void)setting->Load();
  }
  return st;
}

void Registry::Unset(const std::string& name) {
  Setting* setting = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    overrides_.erase(name);
    auto it = settings_.find(name);
    if (it == settings_.end()) return;
    setting = it->second;
  }
  std::call_once(setting->loaded_, [] {});
  (void)setting->Load();
}

StatusOr<std::string> Registry::GetText(const std::string& name) const {
  const Setting* setting = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = settings_.find(name);
    if (it == settings_.end()) return InvalidArgument("'", name, "' is not a weft setting");
    setting = it->second;
  }
  return setting->text();
}

std::vector<const Setting*> Registry::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const Setting*> all;
  for (const auto& entry : settings_) all.push_back(entry.second);
  return all;
}

std::vector<const Setting*> Registry::SameOnEveryRank() const {
  std::vector<const Setting*> same;
  for (const Setting* s : All()) {
    if (s->agreement() == Agreement::kSameOnEveryRank) same.push_back(s);
  }
  return same;
}

std::string Registry::Describe() const {
  std::string out;
  for (const Setting* s : All()) {
    absl::StrAppend(&out, "  ", s->name(), "=", s->text(), s->is_set() ? "" : " (default)",
                    "  -- ", s->description(), "\n");
  }
  return out;
}

std::vector<std::string> Registry::UnknownEnvironment() const {
  std::vector<std::string> unknown;
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& name : EnvironmentNames("WEFT_")) {
    // Build-time overrides (WEFT_TORCH_HOME, ...) are read by Bazel, not at run time.
    if (absl::EndsWith(name, "_HOME")) continue;
    if (settings_.count(name) == 0) unknown.push_back(name);
  }
  return unknown;
}

Setting::Setting(const char* name, Type type, std::string default_text, const char* description,
                 Agreement agreement)
    : name_(name),
      type_(type),
      default_text_(std::move(default_text)),
      description_(description),
      agreement_(agreement) {
  Registry::Global().Register(this);
}

bool Setting::is_set() const {
  std::string storage;
  return Registry::Global().RawValue(name_, &storage) != nullptr;
}

std::string Setting::text() const {
  std::string storage;
  const char* raw = Registry::Global().RawValue(name_, &storage);
  return raw != nullptr ? std::string(raw) : default_text_;
}

Status Setting::Load() {
  std::string storage;
  const char* raw = Registry::Global().RawValue(name_, &storage);
  if (raw != nullptr && Parse(std::string(absl::StripAsciiWhitespace(raw)))) {
    return OkStatus();
  }
  Parse(default_text_);
  if (raw == nullptr) return OkStatus();
  const std::string alias = Registry::AliasOf(name_);
  return InvalidArgument(
      name_, "='", raw, "' is not valid: expected ", expected(), " (default ", default_text_, ")",
      Registry::Global().FromAlias(name_)
          ? absl::StrCat("; it comes from ", alias, "='", std::getenv(alias.c_str()), "'")
          : "");
}

void Setting::EnsureLoaded() const {
  std::call_once(loaded_, [this] { (void)const_cast<Setting*>(this)->Load(); });
}

IntSetting::IntSetting(const char* name, int64_t default_value, const char* description,
                       int64_t min, int64_t max, Agreement agreement)
    : Setting(name, Type::kInt, std::to_string(default_value), description, agreement),
      min_(min),
      max_(max),
      value_(default_value) {}

int64_t IntSetting::Get() const {
  EnsureLoaded();
  return value_.load(std::memory_order_relaxed);
}

bool IntSetting::Parse(const std::string& text) {
  int64_t v;
  if (!absl::SimpleAtoi(text, &v) || v < min_ || v > max_) return false;
  value_.store(v);
  return true;
}

std::string IntSetting::expected() const {
  const bool low = min_ != std::numeric_limits<int64_t>::min();
  const bool high = max_ != std::numeric_limits<int64_t>::max();
  if (low && high) return absl::StrCat("an integer from ", min_, " to ", max_);
  if (low) return absl::StrCat("an integer of at least ", min_);
  if (high) return absl::StrCat("an integer of at most ", max_);
  return "an integer";
}

DoubleSetting::DoubleSetting(const char* name, double default_value, const char* description,
                             double min, double max)
    : Setting(name, Type::kDouble, absl::StrCat(default_value), description),
      min_(min),
      max_(max),
      value_(default_value) {}

double DoubleSetting::Get() const {
  EnsureLoaded();
  return value_.load(std::memory_order_relaxed);
}

bool DoubleSetting::Parse(const std::string& text) {
  // Decimal only: SimpleAtod also takes "inf", "nan" and hexadecimal floats.
  if (text.find_first_not_of("0123456789+-.eE") != std::string::npos) return false;
  double v;
  if (!absl::SimpleAtod(text, &v) || !std::isfinite(v) || v < min_ || v > max_) return false;
  value_.store(v);
  return true;
}

std::string DoubleSetting::expected() const {
  const bool low = min_ != std::numeric_limits<double>::lowest();
  const bool high = max_ != std::numeric_limits<double>::max();
  if (low && high) return absl::StrCat("a number from ", min_, " to ", max_);
  if (low) return absl::StrCat("a number of at least ", min_);
  if (high) return absl::StrCat("a number of at most ", max_);
  return "a finite number";
}

BoolSetting::BoolSetting(const char* name, bool default_value, const char* description,
                         Agreement agreement)
    : Setting(name, Type::kBool, default_value ? "1" : "0", description, agreement),
      value_(default_value) {}

bool BoolSetting::Get() const {
  EnsureLoaded();
  return value_.load(std::memory_order_relaxed);
}

bool BoolSetting::Parse(const std::string& text) {
  bool v;
  if (!absl::SimpleAtob(text, &v)) return false;
  value_.store(v);
  return true;
}

StringSetting::StringSetting(const char* name, std::string default_value, const char* description,
                             std::vector<std::string> choices, Agreement agreement)
    : Setting(name, Type::kString, default_value, description, agreement),
      choices_(std::move(choices)),
      value_(std::move(default_value)) {
  expected_ = choices_.empty() ? "a string" : "one of " + absl::StrJoin(choices_, ", ");
}

std::string StringSetting::Get() const {
  EnsureLoaded();
  std::lock_guard<std::mutex> lock(mu_);
  return value_;
}

std::string StringSetting::expected() const { return expected_; }

bool StringSetting::Parse(const std::string& text) {
  std::string v = text;
  if (!choices_.empty()) {
    v = absl::AsciiStrToLower(text);
    bool found = false;
    for (const auto& c : choices_) found = found || c == v;
    if (!found) return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  value_ = v;
  return true;
}

}  // namespace config
}  // namespace weft
