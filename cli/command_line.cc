#include "cli/command_line.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "config/config.h"
#include "config/rules_file.h"

namespace vmmshim::cli {
namespace {

// The edit distance (insertions, deletions, substitutions) of `a` and `b`.
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The long option names of `app` ("--policies"), --help included.
std::vector<std::string> OptionNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
  }
  return names;
}

}  // namespace

// The one of `names` that `given` is a likely misspelling of (at most a
// third of its letters off); empty when none is.
std::string Closest(const std::string& given, const std::vector<std::string>& names) {
  std::string best;
  size_t best_distance = given.size() / 3 + 1;
  for (const std::string& name : names) {
    const size_t d = EditDistance(given, name);
    if (d < best_distance) {
      best = name;
      best_distance = d;
    }
  }
  return best;
}

// "vmmshim compare", or "vmmshim" without a subcommand.
std::string CommandName(const CLI::App* sub) {
  return sub == nullptr ? "vmmshim" : "vmmshim " + sub->get_name();
}

std::string Usage(const CLI::App* sub) {
  if (sub == nullptr) {
    return "vmmshim run|report|compare|trace|ps|sleep|wake ... (vmmshim --help)";
  }
  const std::string name = CommandName(sub);
  const std::string& n = sub->get_name();
  const std::string args = n == "report"  ? " [OPTIONS] FILE..."
                           : n == "trace" ? " [-o OUT] SNAPSHOT..."
                           : n == "ps"    ? " [--json] [--dir DIR]"
                           : n == "sleep" ? " PID... [--drop TAG]... [--dir DIR]"
                           : n == "wake"  ? " PID... [--onto OLD=NEW]... [--dir DIR]"
                                          : " [OPTIONS] -- PROGRAM ARGS...";
  return name + args + " (" + name + " --help)";
}

// Prints a command-line error of `sub` (null: of vmmshim itself) with the
// usage, and gives the exit status of one.
int CommandLineError(const CLI::App* sub, const std::string& message) {
  std::fprintf(stderr, "%s: %s\nusage: %s\n", CommandName(sub).c_str(), message.c_str(),
               Usage(sub).c_str());
  return 2;
}

// What CLI11 left over in `sub` (allow_extras) said as an error: an unknown
// option named with the likely one meant, or a stray argument. Empty when
// nothing was left over.
std::string LeftOver(const CLI::App& sub, bool takes_program) {
  std::vector<std::string> extras = sub.remaining();
  // CLI11 keeps the "--" it took the program's words after among them.
  extras.erase(std::remove(extras.begin(), extras.end(), "--"), extras.end());
  if (extras.empty()) return "";
  const std::string& first = extras.front();
  if (first.size() > 1 && first[0] == '-') {
    const std::string name = first.substr(0, first.find('='));
    std::string message = "unknown option '" + name + "'";
    if (const std::string close = Closest(name, OptionNames(sub)); !close.empty()) {
      message += " (did you mean " + close + "?)";
    } else if (takes_program) {
      message += "; the program's own options go after --";
    } else {
      message += "; expected one of " + [&] {
        std::string list;
        for (const std::string& n : OptionNames(sub)) list += (list.empty() ? "" : ", ") + n;
        return list;
      }();
    }
    return message;
  }
  return "unexpected argument '" + first + "'";
}

// A validator of a whole number from `low` to `high`: "'abc' is not a
// number" rather than a range that says nothing of the value's form.
CLI::Validator WholeNumber(int low, int high) {
  const std::string range = std::to_string(low) + " to " + std::to_string(high);
  return CLI::Validator(
      [low, high, range](std::string& v) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long x = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || end == v.c_str() || *end != '\0' || errno == ERANGE) {
          return "'" + v + "' is not a number; expected a whole number from " + range;
        }
        if (x < low || x > high) return "" + v + " is out of range; expected " + range;
        v = std::to_string(x);  // decimal: CLI11 would read a leading 0 as octal
        return "";
      },
      "INT " + range);
}

// A validator of a process id: digits, 1 to the kernel's largest pid.
CLI::Validator ProcessId() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long x = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || end == v.c_str() || *end != '\0' || errno == ERANGE || x < 1 ||
            x > kMaxPid || !std::isdigit(static_cast<unsigned char>(v[0]))) {
          return "'" + v + "' is not a process id (a whole number from 1 to " +
                 std::to_string(kMaxPid) + "; vmmshim ps lists them)";
        }
        v = std::to_string(x);  // decimal: CLI11 would read a leading 0 as octal
        return "";
      },
      "PID");
}

// A validator of a value of the shim's option `key`, read as the shim reads
// it (config/config.h's table), naming what it may be when it is not.
CLI::Validator ShimOptionValue(OptionKey key) {
  return CLI::Validator(
      [key](std::string& v) -> std::string {
        Config scratch;
        const OptionInfo& o = Option(key);
        return o.apply(v, 1, &scratch) ? "" : "'" + v + "' is not " + o.accepted;
      },
      Option(key).type);
}

// A validator of a byte count as the shim reads it (config/rules_file.h).
CLI::Validator ByteCount() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        return ParseBytes(v) ? ""
                                      : "'" + v + "' is not a byte count (as in 1M, 64KiB, "
                                                  "1048576)";
      },
      "BYTES");
}

// A validator of one of `names`, naming them all.
CLI::Validator OneOf(std::vector<std::string> names) {
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  return CLI::Validator(
      [names, list](std::string& v) -> std::string {
        return std::find(names.begin(), names.end(), v) != names.end()
                   ? ""
                   : "'" + v + "' is not one of " + list;
      },
      "{" + list + "}");
}
}  // namespace vmmshim::cli
