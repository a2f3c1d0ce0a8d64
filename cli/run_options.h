#ifndef VMMSHIM_CLI_RUN_OPTIONS_H_
#define VMMSHIM_CLI_RUN_OPTIONS_H_

// The options of `vmmshim run` that set one of the shim's variables, in one
// table: the run subcommand is built from it (vmmshim_cli.cc), `vmmshim
// options --json` prints it, and Python's vmmshim.environment() takes its
// keywords from that output (python/vmmshim/_library.py, run_options), so
// an option is added here once. The variables themselves, their forms and
// defaults are the shim's options table (config/config.h).
//
// Not thread-safe (CLI11 is not); the values live in a RunOptionValues.

#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/types/span.h"
#include "config/config.h"

namespace vmmshim::cli {

struct RunOption {
  const char* flag;  // as given on the command line: "--min-bytes"
  OptionKey key;     // the variable it sets
  const char* help;
  enum class Form {
    kPolicy,        // all, none, min-size, rules
    kBytes,         // a byte count as the shim reads it
    kExistingFile,  // a file that exists now
    kShimValue,     // checked as the shim reads its variable
    kOutputPath,    // a file to write: made absolute against the current
                    // directory, as the user meant, even if the program
                    // changes its own
  } form;
};

absl::Span<const RunOption> RunOptions();

// The Python keyword of `option`: the flag without its dashes, '-' as '_'
// ("min_bytes").
std::string Keyword(const RunOption& option);

// The table as JSON: [{"flag", "keyword", "variable", "help"}...].
std::string RunOptionsJson();

// The values given, one per RunOptions() entry ("" when not given).
class RunOptionValues {
 public:
  RunOptionValues() : values_(RunOptions().size()) {}
  // Adds every option of the table to `run`, each checked by its form.
  void AddTo(CLI::App* run);
  const std::string& Get(OptionKey key) const;
  // Output paths made absolute (see Form::kOutputPath).
  void MakeOutputPathsAbsolute();
  // Sets each given option's variable (a value given overrides the
  // environment's; one not given leaves it as it is).
  void Export() const;

 private:
  std::vector<std::string> values_;
};

// An LD_PRELOAD value (`value`: entries separated by spaces or colons, as
// ld.so reads it) with the libraries `first` in front, in that order, and no
// other entry naming one of them (the same file name or the same real
// path), joined with colons. The same rule as Python's
// _library.preload_with (python/vmmshim/_library.py), which
// tests/python/test_preload_rule.py holds to this one.
std::string PreloadWith(const std::string& value, const std::vector<std::string>& first);

}  // namespace vmmshim::cli

#endif  // VMMSHIM_CLI_RUN_OPTIONS_H_
