#include "tools/cli/flags.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tools/cli/args.h"

namespace weft {
namespace cli {

FlagSet::FlagSet(std::string program, std::string about)
    : program_(std::move(program)), about_(std::move(about)) {}

FlagSet& FlagSet::Add(Flag flag) {
  flags_.push_back(std::move(flag));
  return *this;
}

FlagSet& FlagSet::Int(const std::string& name, int64_t* value, std::string help, int64_t min,
                      int64_t max) {
  Flag f{{name}, Kind::kInt64, value, std::move(help), absl::StrCat(*value)};
  f.min_int = min;
  f.max_int = max;
  return Add(std::move(f));
}

FlagSet& FlagSet::Int(const std::string& name, int* value, std::string help, int min, int max) {
  Flag f{{name}, Kind::kInt32, value, std::move(help), absl::StrCat(*value)};
  f.min_int = min;
  f.max_int = max;
  return Add(std::move(f));
}

FlagSet& FlagSet::Uint(const std::string& name, uint64_t* value, std::string help) {
  Flag f{{name}, Kind::kUint64, value, std::move(help), absl::StrCat(*value)};
  f.min_int = 0;
  f.max_int = std::numeric_limits<int64_t>::max();
  return Add(std::move(f));
}

FlagSet& FlagSet::Real(const std::string& name, double* value, std::string help, double min,
                       double max) {
  Flag f{{name}, Kind::kReal, value, std::move(help), internal::ShowReal(*value)};
  f.min_real = min;
  f.max_real = max;
  return Add(std::move(f));
}

FlagSet& FlagSet::Fraction(const std::string& name, double* value, std::string help, double min,
                           double max) {
  Flag f{{name}, Kind::kFraction, value, std::move(help), internal::ShowReal(*value)};
  f.min_real = min;
  f.max_real = max;
  return Add(std::move(f));
}

FlagSet& FlagSet::String(const std::string& name, std::string* value, std::string help,
                         std::vector<std::string> choices) {
  Flag f{{name}, Kind::kString, value, std::move(help), *value};
  f.choices = std::move(choices);
  return Add(std::move(f));
}

FlagSet& FlagSet::Set(const std::string& name, bool* value, bool to, std::string help) {
  Flag f{{name}, Kind::kSet, value, std::move(help), ""};
  f.to = to;
  return Add(std::move(f));
}

FlagSet& FlagSet::Alias(const std::string& alias) {
  if (!flags_.empty()) flags_.back().names.push_back(alias);
  return *this;
}

FlagSet& FlagSet::Value(const std::string& placeholder) {
  if (!flags_.empty()) flags_.back().placeholder = placeholder;
  return *this;
}

FlagSet& FlagSet::ShownDefault(const std::string& text) {
  if (!flags_.empty()) {
    flags_.back().shown_default = text;
    flags_.back().show_default = !text.empty();
  }
  return *this;
}

FlagSet& FlagSet::Section(const std::string& title) {
  sections_.emplace_back(flags_.size(), title);
  return *this;
}

FlagSet& FlagSet::Epilogue(const std::string& text) {
  epilogue_ = text;
  return *this;
}

FlagSet::Flag* FlagSet::Find(const std::string& name) {
  for (Flag& f : flags_) {
    for (const std::string& n : f.names) {
      if (n == name) return &f;
    }
  }
  return nullptr;
}

const FlagSet::Flag* FlagSet::Find(const std::string& name) const {
  return const_cast<FlagSet*>(this)->Find(name);
}

bool FlagSet::given(const std::string& name) const {
  const Flag* f = Find(name);
  return f != nullptr && f->given;
}

Status FlagSet::Assign(Flag& flag, const std::string& name, const std::string& text) {
  switch (flag.kind) {
    case Kind::kInt64:
    case Kind::kInt32:
    case Kind::kUint64: {
      int64_t min = flag.min_int, max = flag.max_int;
      if (flag.kind == Kind::kInt32) {
        // An int's own limits are no bound the program chose: the message says ">= 1", not
        // "1..2147483647"; a value beyond them is still out of range.
        constexpr int64_t kLowest = std::numeric_limits<int>::min();
        constexpr int64_t kHighest = std::numeric_limits<int>::max();
        if (min == kLowest) min = std::numeric_limits<int64_t>::min();
        if (max == kHighest) max = std::numeric_limits<int64_t>::max();
        WEFT_ASSIGN_OR_RETURN(int64_t v, cli::Int(name, text, min, max));
        if (v < kLowest || v > kHighest) {  // both limits then: the range an int holds
          return internal::OutOfRange(name, v, flag.min_int, flag.max_int,
                                      std::numeric_limits<int64_t>::min(),
                                      std::numeric_limits<int64_t>::max());
        }
        *static_cast<int*>(flag.value) = static_cast<int>(v);
        return OkStatus();
      }
      WEFT_ASSIGN_OR_RETURN(int64_t v, cli::Int(name, text, min, max));
      if (flag.kind == Kind::kInt64) *static_cast<int64_t*>(flag.value) = v;
      if (flag.kind == Kind::kUint64)
        *static_cast<uint64_t*>(flag.value) = static_cast<uint64_t>(v);
      return OkStatus();
    }
    case Kind::kReal: {
      WEFT_ASSIGN_OR_RETURN(double v, cli::Real(name, text, flag.min_real, flag.max_real));
      *static_cast<double*>(flag.value) = v;
      return OkStatus();
    }
    case Kind::kFraction: {
      WEFT_ASSIGN_OR_RETURN(double v, cli::Fraction(name, text, flag.min_real, flag.max_real));
      *static_cast<double*>(flag.value) = v;
      return OkStatus();
    }
    case Kind::kString:
      if (!flag.choices.empty()) {
        bool known = false;
        for (const std::string& c : flag.choices) known = known || c == text;
        if (!known) {
          return InvalidArgument(name, ": expected one of ", absl::StrJoin(flag.choices, ", "),
                                 ", got '", text, "'");
        }
      }
      *static_cast<std::string*>(flag.value) = text;
      return OkStatus();
    case Kind::kSet:
      break;
  }
  return Internal(name, " takes no value");
}

Status FlagSet::Parse(const std::vector<std::string>& args) {
  help_requested_ = false;
  for (Flag& f : flags_) f.given = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      return OkStatus();
    }
    // "--name=value" or "--name value".
    const size_t eq = arg.rfind("--", 0) == 0 ? arg.find('=') : std::string::npos;
    const std::string name = arg.substr(0, eq);
    Flag* flag = Find(name);
    if (flag == nullptr) {
      return InvalidArgument("unknown option ", arg, " (", program_, " --help lists them)");
    }
    flag->given = true;
    if (flag->kind == Kind::kSet) {
      if (eq != std::string::npos) return InvalidArgument(name, " takes no value");
      *static_cast<bool*>(flag->value) = flag->to;
      continue;
    }
    std::string text;
    if (eq != std::string::npos) {
      text = arg.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      text = args[++i];
    } else {
      return InvalidArgument("missing value after ", name);
    }
    WEFT_RETURN_IF_ERROR(Assign(*flag, name, text));
  }
  return OkStatus();
}

namespace {

// `words` in lines of at most `width` columns (a longer word stays whole), each after
// `indent` spaces but the first, which continues `first`. A word "\n" breaks the line.
std::string Wrap(const std::string& first, const std::vector<std::string>& words, size_t indent,
                 size_t width) {
  std::string out = first, line_break = "\n" + std::string(indent, ' ');
  const size_t last_line = first.rfind('\n');
  size_t column = last_line == std::string::npos ? first.size() : first.size() - last_line - 1;
  bool line_empty = true;
  for (const std::string& word : words) {
    if (word == "\n" || (!line_empty && column + 1 + word.size() > width)) {
      out += line_break;
      column = indent;
      line_empty = true;
      if (word == "\n") continue;
    }
    if (!line_empty) {
      out += ' ';
      ++column;
    }
    out += word;
    column += word.size();
    line_empty = false;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out + "\n";
}

// The words of `text`; a newline in it is a word of its own.
std::vector<std::string> Words(const std::string& text) {
  std::vector<std::string> words;
  bool first_line = true;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!first_line) words.push_back("\n");
    first_line = false;
    for (absl::string_view w : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      words.emplace_back(w);
    }
  }
  return words;
}

}  // namespace

std::string FlagSet::Help() const {
  constexpr size_t kHelpColumn = 28, kWidth = 92;
  std::string out = about_ + "\n";
  if (sections_.empty() || sections_[0].first > 0) out += "\nOptions:\n";
  size_t next_section = 0;
  for (size_t k = 0; k < flags_.size(); ++k) {
    while (next_section < sections_.size() && sections_[next_section].first == k) {
      absl::StrAppend(&out, "\n", sections_[next_section++].second, "\n");
    }
    const Flag& f = flags_[k];
    std::string left = absl::StrJoin(f.names, ", ");
    std::string value = f.placeholder;
    if (value.empty()) {
      switch (f.kind) {
        case Kind::kInt64:
        case Kind::kInt32:
        case Kind::kUint64:
          value = "N";
          break;
        case Kind::kReal:
        case Kind::kFraction:
          value = "X";
          break;
        case Kind::kString:
          value = f.choices.empty() ? "S" : absl::StrJoin(f.choices, "|");
          break;
        case Kind::kSet:
          break;
      }
    }
    if (!value.empty() && f.kind != Kind::kSet) absl::StrAppend(&left, " ", value);
    std::vector<std::string> words = Words(f.help);
    if (f.kind != Kind::kSet && f.show_default) {
      const std::string shown = f.shown_default.empty() ? "none" : f.shown_default;
      if (shown.find(' ') == std::string::npos) {
        words.push_back(absl::StrCat("(default ", shown, ")"));  // on one line
      } else {
        for (std::string& w : Words(absl::StrCat("(default ", shown, ")"))) {
          words.push_back(std::move(w));
        }
      }
    }
    std::string first = "  " + left;
    if (first.size() + 1 < kHelpColumn) {
      first += std::string(kHelpColumn - first.size(), ' ');
    } else {
      first += "\n" + std::string(kHelpColumn, ' ');
    }
    out += Wrap(first, words, kHelpColumn, kWidth);
  }
  for (; next_section < sections_.size(); ++next_section) {  // sections left empty
    absl::StrAppend(&out, "\n", sections_[next_section].second, "\n");
  }
  if (!epilogue_.empty()) absl::StrAppend(&out, "\n", epilogue_);
  return out;
}

void FlagSet::Fail(const std::string& why) const {
  std::fprintf(stderr, "%s: %s\n", program_.c_str(), why.c_str());
  std::exit(2);
}

void FlagSet::ParseOrExit(int argc, char** argv) {
  const Status status = Parse(std::vector<std::string>(argv + 1, argv + argc));
  if (!status.ok()) Fail(std::string(status.message()));
  if (help_requested_) {
    std::fputs(Help().c_str(), stdout);
    std::exit(0);
  }
}

}  // namespace cli
}  // namespace weft
