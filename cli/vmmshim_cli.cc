// The `vmmshim` launcher.
//
//   vmmshim run [--policy P] [--min-bytes N] [--config FILE] [--stats FILE]
//               [--cache-limit X] [--log-level L] [--log-file F] [--lib PATH]
//               -- PROGRAM ARGS...
//       sets LD_PRELOAD (libvmmshim.so next to this program, or --lib) and
//       the VMMSHIM_* variables, then runs PROGRAM in place of itself (exec),
//       so its exit status is the program's.
//   vmmshim report FILE
//       prints a statistics file (VMMSHIM_STATS_FILE / --stats) as tables.
//   vmmshim compare [--policies LIST] [--repeat N] [--warmup N]
//                   [--check REGEX | --same-output] [--timeout S] [--out DIR]
//                   [--wide] [--lib PATH] -- PROGRAM ARGS...
//       runs PROGRAM natively and under each policy, alternating, and prints
//       one table (cli/compare/compare.h, docs/compare.md).
//
// The VMMSHIM_* variables are named by the shim's options table
// (config/config.h), the statistics file's keys by its schema
// (core/report/stats_schema.h).
//
// Values are checked here only for their form; the shim checks them again
// and stops on a malformed peer setting (docs/configuration.md).
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "cli/compare/compare.h"
#include "cli/report.h"
#include "cli/stats_file.h"
#include "config/config.h"
#include "core/base/version.h"

namespace {

// The directory of this program.
std::string SelfDir() {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return ".";
  std::string dir(self, static_cast<size_t>(n));
  return dir.substr(0, dir.rfind('/'));
}

// The first of `candidates` (relative to this program's directory) that
// exists; `fallback` when none does.
std::string NextToSelf(std::initializer_list<const char*> candidates, std::string fallback) {
  const std::string dir = SelfDir();
  for (const char* candidate : candidates) {
    const std::string path = dir + candidate;
    if (access(path.c_str(), R_OK) == 0) return path;
  }
  return fallback;
}

// The build tree has libvmmshim.so next to bin/vmmshim; an install has it in
// ../lib.
std::string DefaultLibrary() {
  return NextToSelf({"/libvmmshim.so", "/../lib/libvmmshim.so"}, SelfDir() + "/libvmmshim.so");
}

int Report(const std::string& path) {
  std::string error;
  const std::optional<vmmshim::cli::StatsFile> stats = vmmshim::cli::ReadStatsFile(path, &error);
  if (!stats) {
    std::fprintf(stderr, "vmmshim report: %s\n", error.c_str());
    return 1;
  }
  std::fputs(vmmshim::cli::FormatReport(*stats, path).c_str(), stdout);
  return 0;
}

// Sets the shim's variable of `key` (named by the options table) to `value`
// unless it is empty.
void SetOption(vmmshim::OptionKey key, const std::string& value) {
  if (!value.empty()) setenv(vmmshim::Option(key).name, value.c_str(), 1);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"vmmshim: run CUDA programs with VMM-backed allocations and per-allocation "
               "peer access"};
  app.set_version_flag("--version", "vmmshim " VMMSHIM_VERSION);
  app.require_subcommand(1);

  CLI::App* run = app.add_subcommand("run", "run PROGRAM under libvmmshim.so");
  std::string policy, min_bytes, config, stats, cache_limit, log_level, log_file;
  std::string lib = DefaultLibrary();
  std::vector<std::string> command;
  run->add_option("--policy", policy, "peer-access policy")
      ->check(CLI::IsMember({"all", "none", "min-size", "rules"}));
  run->add_option("--min-bytes", min_bytes, "threshold of the min-size policy (e.g. 1M)");
  run->add_option("--config", config, "peer-access rules file (TOML)")->check(CLI::ExistingFile);
  run->add_option("--stats", stats, "write the JSON statistics here at exit (%p: pid)");
  run->add_option("--cache-limit", cache_limit, "bytes or percent kept for reuse (e.g. 25%)");
  run->add_option("--log-level", log_level, "trace, debug, info, warn, error, off");
  run->add_option("--log-file", log_file, "log to this file (%p: pid)");
  run->add_option("--lib", lib, "the libvmmshim.so to preload")->check(CLI::ExistingFile);
  run->add_option("command", command, "PROGRAM ARGS... (after --)")->required();

  CLI::App* report = app.add_subcommand("report", "print a statistics file as tables");
  std::string report_file;
  report->add_option("file", report_file, "the JSON statistics file")->required();

  CLI::App* compare = app.add_subcommand(
      "compare", "run PROGRAM natively and under each policy, alternating, and compare");
  vmmshim::compare::CompareOptions copt;
  std::string policies = "all,none";
  std::string check;
  bool same_output = false;
  copt.library = lib;
  compare->add_option("--policies", policies,
                      "comma-separated: all, none, min-size:BYTES, rules:FILE")
      ->capture_default_str();
  compare->add_option("--repeat", copt.repeat, "counted runs of each mode")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  compare->add_option("--warmup", copt.warmup, "uncounted runs of each mode first")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
  CLI::Option* check_opt = compare->add_option(
      "--check", check, "compare only the output lines matching this regex (POSIX extended, as grep -E)");
  CLI::Option* same_opt = compare->add_flag(
      "--same-output", same_output, "compare the whole standard output (the default)");
  check_opt->excludes(same_opt);
  compare->add_option("--timeout", copt.timeout_seconds,
                      "seconds per run before it is killed (0: 10x the slowest native run, at "
                      "least 60)")
      ->check(CLI::Validator(
          [](std::string& v) {
            char* end = nullptr;
            const double x = std::strtod(v.c_str(), &end);
            return end != v.c_str() && *end == '\0' && x >= 0 && x < 1e9
                       ? std::string()
                       : "'" + v + "' is not a number of seconds (0 or more)";
          },
          "SECONDS"))
      ->capture_default_str();
  CLI::Option* out_opt = compare->add_option(
      "--out", copt.out_dir,
      "directory for the CSV, JSON, chart and run logs (default: a new one in $TMPDIR or "
      "/tmp, named at the end)");
  compare->add_option("--lib", copt.library, "the libvmmshim.so to preload")
      ->check(CLI::ExistingFile);
  compare->add_flag("--wide", copt.wide,
                    "print every column (served, shim peak physical, grants, cuMemSetAccess, "
                    "cuCtxEnablePeerAccess); the files have them all anyway");
  compare->add_option("command", copt.command, "PROGRAM ARGS... (after --)")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version print and exit 0; a malformed command line exits
    // 2 with CLI11's one-line message naming the option.
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (*report) return Report(report_file);
  if (*compare) {
    std::string error;
    auto parsed = vmmshim::compare::ParsePolicies(policies, &error);
    if (!parsed) {
      std::fprintf(stderr, "vmmshim compare: --policies: %s\n", error.c_str());
      return 2;
    }
    copt.policies = *std::move(parsed);
    // Empty means "make one" to RunCompare; given empty, it is a mistake.
    if (out_opt->count() > 0 && copt.out_dir.empty()) {
      std::fprintf(stderr, "vmmshim compare: --out: an empty directory name\n");
      return 2;
    }
    if (!check.empty()) copt.check_regex = check;
    if (access(copt.library.c_str(), R_OK) != 0) {
      std::fprintf(stderr, "vmmshim compare: no libvmmshim.so at %s (give --lib PATH)\n",
                   copt.library.c_str());
      return 2;
    }
    char real[PATH_MAX];
    if (realpath(copt.library.c_str(), real) != nullptr) copt.library = real;
    copt.chart_script = NextToSelf(
        {"/compare_chart.py", "/../share/vmmshim/compare_chart.py"}, "");
    return vmmshim::compare::RunCompare(copt);
  }

  using vmmshim::OptionKey;
  SetOption(OptionKey::kPeerPolicy, policy);
  SetOption(OptionKey::kPeerMinBytes, min_bytes);
  SetOption(OptionKey::kConfig, config);
  SetOption(OptionKey::kStatsFile, stats);
  SetOption(OptionKey::kCacheLimit, cache_limit);
  SetOption(OptionKey::kLogLevel, log_level);
  SetOption(OptionKey::kLogFile, log_file);
  std::string preload = lib;
  if (const char* old = std::getenv("LD_PRELOAD"); old != nullptr && *old != '\0') {
    preload += std::string(" ") + old;
  }
  setenv("LD_PRELOAD", preload.c_str(), 1);
  std::vector<char*> args;
  for (std::string& a : command) args.push_back(a.data());
  args.push_back(nullptr);
  execvp(args[0], args.data());
  std::fprintf(stderr, "vmmshim run: cannot run %s: %s\n", args[0], std::strerror(errno));
  return 127;
}
