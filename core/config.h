// The one registry of WEFT_* settings. Every setting is declared once, beside the code
// that reads it, with its name, default and description:
//
//   const config::IntSetting kFusionThreshold(
//       "WEFT_FUSION_THRESHOLD_BYTES", 64 << 20, "Largest fused buffer, in bytes.");
//
// Values come from the environment (or from Registry::Set, which wins over it) and are
// parsed on first use and again at every Registry::Reload() (weft's init calls it), so a
// typo'd value is an error at init rather than a silent default.
#ifndef WEFT_CORE_CONFIG_H_
#define WEFT_CORE_CONFIG_H_

#include <atomic>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"

namespace weft {
namespace config {

enum class Type { kInt, kDouble, kBool, kString };

// kSameOnEveryRank: the setting decides how ops run (a transport, an algorithm), so ranks
// that saw different values would wait for each other forever; weft's init() compares
// such settings across ranks and fails on every rank when they differ.
enum class Agreement { kPerRank, kSameOnEveryRank };

class Setting;

class Registry {
 public:
  static Registry& Global();

  // Called by the Setting constructors; a name registered twice aborts (a programming
  // error caught by every test binary).
  void Register(Setting* setting);

  // Re-reads every setting. Returns an error naming each invalid value.
  Status Reload();

  // Overrides a setting for this process (wins over the environment); validated at once.
  Status Set(const std::string& name, const std::string& value);
  // Drops an override made with Set.
  void Unset(const std::string& name);

  // The value in force, as text, or an error if `name` is not a setting.
  StatusOr<std::string> GetText(const std::string& name) const;

  std::vector<const Setting*> All() const;  // sorted by name

  // A table of every setting, its value in force, its default and description.
  std::string Describe() const;

  // WEFT_* variables in the environment that are not settings (likely typos).
  std::vector<std::string> UnknownEnvironment() const;
  // The settings declared Agreement::kSameOnEveryRank, sorted by name.
  std::vector<const Setting*> SameOnEveryRank() const;
  // Bluefog's environment variables stand for weft settings when those are not set
  // themselves (BLUEFOG_FUSION_THRESHOLD for WEFT_FUSION_THRESHOLD_BYTES, ...; the table is
  // in config.cc and README.md). The Bluefog name standing for `name`, or "".
  static std::string AliasOf(const std::string& name);
  // Whether `name`'s value in force comes from its Bluefog alias: no override, no variable
  // of weft's own name, and the Bluefog one set.
  bool FromAlias(const std::string& name) const;
  // BLUEFOG_* variables in the environment that weft has no counterpart for.
  static std::vector<std::string> IgnoredBluefogEnvironment();

 private:
  friend class Setting;
  // Raw text for a setting: override, else environment, else nullptr.
  const char* RawValue(const std::string& name, std::string* storage) const;

  mutable std::mutex mu_;
  std::map<std::string, Setting*> settings_;
  std::map<std::string, std::string> overrides_;
};

// Base of the typed settings; holds the metadata and the last parsed value as text.
class Setting {
 public:
  Setting(const char* name, Type type, std::string default_text, const char* description,
          Agreement agreement = Agreement::kPerRank);
  virtual ~Setting() = default;
  Setting(const Setting&) = delete;
  Setting& operator=(const Setting&) = delete;

  const std::string& name() const { return name_; }
  Type type() const { return type_; }
  const std::string& default_text() const { return default_text_; }
  const std::string& description() const { return description_; }
  Agreement agreement() const { return agreement_; }
  bool is_set() const;               // given in the environment or by Set
  std::string text() const;          // value in force, as text

 protected:
  friend class Registry;
  // Parses `text` into the typed value; returns false if it is not valid.
  virtual bool Parse(const std::string& text) = 0;
  virtual std::string expected() const = 0;
  Status Load();                     // parse the raw value (or the default)
  void EnsureLoaded() const;

  std::string name_;
  Type type_;
  std::string default_text_;
  std::string description_;
  Agreement agreement_;
  mutable std::once_flag loaded_;
};

// Numbers: a value outside [min, max] is invalid, as is a number that is not finite or
// not written in decimal (a timeout of "inf" or "0x10" would reach code that converts it).
class IntSetting : public Setting {
 public:
  IntSetting(const char* name, int64_t default_value, const char* description,
             int64_t min = std::numeric_limits<int64_t>::min(),
             int64_t max = std::numeric_limits<int64_t>::max(),
             Agreement agreement = Agreement::kPerRank);
  int64_t Get() const;

 private:
  bool Parse(const std::string& text) override;
  std::string expected() const override;
  const int64_t min_, max_;
  std::atomic<int64_t> value_;
};

class DoubleSetting : public Setting {
 public:
  DoubleSetting(const char* name, double default_value, const char* description,
                double min = std::numeric_limits<double>::lowest(),
                double max = std::numeric_limits<double>::max());
  double Get() const;

 private:
  bool Parse(const std::string& text) override;
  std::string expected() const override;
  const double min_, max_;
  std::atomic<double> value_;
};

class BoolSetting : public Setting {
 public:
  BoolSetting(const char* name, bool default_value, const char* description,
              Agreement agreement = Agreement::kPerRank);
  bool Get() const;

 private:
  bool Parse(const std::string& text) override;
  std::string expected() const override { return "0/1, true/false, yes/no or on/off"; }
  std::atomic<bool> value_;
};

class StringSetting : public Setting {
 public:
  // `choices`, when given, lists the accepted values (compared case-insensitively and
  // stored lower-case).
  StringSetting(const char* name, std::string default_value, const char* description,
                std::vector<std::string> choices = {}, Agreement agreement = Agreement::kPerRank);
  std::string Get() const;

 private:
  bool Parse(const std::string& text) override;
  std::string expected() const override;
  std::vector<std::string> choices_;
  std::string expected_;
  mutable std::mutex mu_;
  std::string value_;
};

}  // namespace config
}  // namespace weft

#endif  // WEFT_CORE_CONFIG_H_
