// The one option parser of weft's command-line programs (the examples and benchmarks).
// A program declares its options once, in a table: the name, where the value goes, its
// kind and range, a line of help. Every program then reads them alike: "--name value" or
// "--name=value", numbers by the policy of args.h (the whole text, in range), the same
// errors, and a --help generated from the table with each option's default.
//
//   Options o;  // the defaults
//   weft::cli::FlagSet flags("train", "Decentralized training of an MLP.");
//   flags.Int("--epochs", &o.epochs, "epochs to train", 1)
//       .Real("--lr", &o.lr, "learning rate")
//       .Set("--static", &o.dynamic, false, "the static topology");
//   flags.ParseOrExit(argc, argv);  // --help: prints it, exit 0; an error: exit 2
#ifndef WEFT_TOOLS_CLI_FLAGS_H_
#define WEFT_TOOLS_CLI_FLAGS_H_

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace weft {
namespace cli {

class FlagSet {
 public:
  // `program` names it in messages; `about` opens its --help.
  FlagSet(std::string program, std::string about);

  // Whole numbers in [min, max].
  FlagSet& Int(const std::string& name, int64_t* value, std::string help,
               int64_t min = std::numeric_limits<int64_t>::min(),
               int64_t max = std::numeric_limits<int64_t>::max());
  FlagSet& Int(const std::string& name, int* value, std::string help,
               int min = std::numeric_limits<int>::min(),
               int max = std::numeric_limits<int>::max());
  FlagSet& Uint(const std::string& name, uint64_t* value, std::string help);
  // Finite numbers in [min, max].
  FlagSet& Real(const std::string& name, double* value, std::string help,
                double min = -std::numeric_limits<double>::max(),
                double max = std::numeric_limits<double>::max());
  // Like Real, also given as a fraction ("--alpha 1/3").
  FlagSet& Fraction(const std::string& name, double* value, std::string help,
                    double min = -std::numeric_limits<double>::max(),
                    double max = std::numeric_limits<double>::max());
  // Any text; with `choices`, one of them.
  FlagSet& String(const std::string& name, std::string* value, std::string help,
                  std::vector<std::string> choices = {});
  // An option without a value, which sets *value to `to` ("--static" sets dynamic to
  // false, "--quiet" sets quiet to true).
  FlagSet& Set(const std::string& name, bool* value, bool to, std::string help);
  // Another name for the option declared last ("-b" for "--min-bytes").
  FlagSet& Alias(const std::string& alias);
  // For the option declared last: what --help shows for its value ("--model NAME") instead
  // of N, X or S, and what it shows as its default, where the initial value would mislead
  // ("--k0 ... (default --devices)"; "" shows none).
  FlagSet& Value(const std::string& placeholder);
  FlagSet& ShownDefault(const std::string& text);
  // --help lists the options declared from here on under `title`.
  FlagSet& Section(const std::string& title);
  // Text --help prints after the options.
  FlagSet& Epilogue(const std::string& text);

  // Reads the options in `args` (argv without the program). OK, or InvalidArgument naming
  // the option; "--help" or "-h" sets help_requested() and stops reading.
  Status Parse(const std::vector<std::string>& args);
  bool help_requested() const { return help_requested_; }
  // Whether the option was given (by any of its names) in the last Parse.
  bool given(const std::string& name) const;
  // The --help text: `about`, then each option with its default (wrapped to 92 columns),
  // then the epilogue.
  std::string Help() const;

  // For main(): Parse(argv[1..]); on --help prints Help() to stdout and exits 0; on an
  // error prints "<program>: <error>" to stderr and exits 2.
  void ParseOrExit(int argc, char** argv);
  // Exits 2 with "<program>: <why>", as a bad option would: for checks across options.
  [[noreturn]] void Fail(const std::string& why) const;

 private:
  enum class Kind { kInt64, kInt32, kUint64, kReal, kFraction, kString, kSet };
  struct Flag {
    std::vector<std::string> names;
    Kind kind;
    void* value;
    std::string help;
    std::string shown_default;
    bool show_default = true;
    std::string placeholder;  // empty: by kind
    int64_t min_int = 0, max_int = 0;
    double min_real = 0, max_real = 0;
    std::vector<std::string> choices;
    bool to = true;  // kSet
    bool given = false;
  };
  FlagSet& Add(Flag flag);
  Flag* Find(const std::string& name);
  const Flag* Find(const std::string& name) const;
  Status Assign(Flag& flag, const std::string& name, const std::string& text);

  std::string program_, about_, epilogue_;
  std::vector<Flag> flags_;
  std::vector<std::pair<size_t, std::string>> sections_;  // (first flag's index, title)
  bool help_requested_ = false;
};

}  // namespace cli
}  // namespace weft

#endif  // WEFT_TOOLS_CLI_FLAGS_H_
