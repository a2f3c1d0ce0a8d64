#ifndef VMMSHIM_CLI_COMMAND_LINE_H_
#define VMMSHIM_CLI_COMMAND_LINE_H_

// How the `vmmshim` command reads and refuses a command line: the usage of
// each subcommand, one line naming what was wrong (with the option most
// likely meant), and validators that say what form a value should have.
// CLI11 parses; these only word its findings as the launcher's other
// messages are worded ("vmmshim compare: --repeat: 'x' is not a number").
// Exit status of a command-line error: 2. Not thread-safe (CLI11 is not).

#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "config/config.h"

namespace vmmshim::cli {

// The one of `names` that `given` is a likely misspelling of (at most a
// third of its letters off, by edit distance); empty when none is.
std::string Closest(const std::string& given, const std::vector<std::string>& names);

// "vmmshim compare" for the subcommand `sub`; "vmmshim" for null.
std::string CommandName(const CLI::App* sub);

// The one-line usage of `sub` (null: of vmmshim itself).
std::string Usage(const CLI::App* sub);

// Prints "COMMAND: MESSAGE" and the usage of `sub` (null: of vmmshim
// itself) to stderr; returns 2, the exit status of a command-line error.
int CommandLineError(const CLI::App* sub, const std::string& message);

// What CLI11 left over in `sub` (parsed with allow_extras), said as an
// error: an unknown option named with the likely one meant (or, when
// `takes_program`, a reminder that the program's options go after --), or
// a stray argument. Empty when nothing was left over.
std::string LeftOver(const CLI::App& sub, bool takes_program);

// A validator of a whole number from `low` to `high` inclusive: "'abc' is
// not a number" rather than a range that says nothing of the value's form.
CLI::Validator WholeNumber(int low, int high);

// The largest pid Linux gives (PID_MAX_LIMIT, 2^22).
inline constexpr long kMaxPid = 4194304;

// A validator of a process id: "'abc' is not a process id (...)".
CLI::Validator ProcessId();

// A validator of a value of the shim's option `key` (VMMSHIM_CACHE_LIMIT,
// VMMSHIM_LOG_LEVEL...), read as the shim reads it, so that `vmmshim run`
// refuses before the program starts what the shim would only warn about.
CLI::Validator ShimOptionValue(OptionKey key);

// A validator of a byte count as the shim reads it (config/rules_file.h,
// ParseBytes: 1M, 64KiB, 1048576).
CLI::Validator ByteCount();

// A validator of one of `names`, naming them all when the value is not.
CLI::Validator OneOf(std::vector<std::string> names);

}  // namespace vmmshim::cli

#endif  // VMMSHIM_CLI_COMMAND_LINE_H_
