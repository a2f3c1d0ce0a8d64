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
//                   [--lib PATH] -- PROGRAM ARGS...
//       runs PROGRAM natively and under each policy, alternating, and prints
//       one table (cli/compare/compare.h, docs/compare.md).
//
// Values are checked here only for their form; the shim checks them again
// and stops on a malformed peer setting (docs/configuration.md).
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "core/base/version.h"
#include "nlohmann/json.hpp"
#include "cli/compare/compare.h"

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

using vmmshim::compare::FormatBytes;

int Report(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "vmmshim report: cannot open %s\n", path.c_str());
    return 1;
  }
  nlohmann::json doc;
  try {
    in >> doc;
    const auto& t = doc.at("totals");
    std::printf("vmmshim statistics of pid %d (%s, written by vmmshim %s)\npolicy: %s\n\n",
                doc.at("pid").get<int>(), path.c_str(),
                doc.value("version", std::string("an earlier build")).c_str(),
                doc.at("policy").get<std::string>().c_str());
    std::printf("served %llu allocations (%s) from VMM, passed %llu (%s) through; %llu still "
                "live; peak physical memory %s\n\n",
                t.at("served_allocations").get<unsigned long long>(),
                FormatBytes(t.at("served_bytes")).c_str(),
                t.at("passthrough_allocations").get<unsigned long long>(),
                FormatBytes(t.at("passthrough_bytes")).c_str(),
                t.at("live_allocations").get<unsigned long long>(),
                FormatBytes(t.at("peak_physical_bytes")).c_str());
    std::printf("%-7s %12s %12s %14s %14s %10s %10s %10s\n", "device", "allocations", "bytes",
                "peak live", "peak physical", "setaccess", "cache hit", "cache miss");
    for (const auto& d : doc.at("devices")) {
      std::printf("%-7d %12llu %12s %14s %14s %10llu %10llu %10llu\n", d.at("device").get<int>(),
                  d.at("allocations").get<unsigned long long>(), FormatBytes(d.at("bytes")).c_str(),
                  FormatBytes(d.at("peak_live_bytes")).c_str(),
                  FormatBytes(d.at("peak_physical_bytes")).c_str(),
                  d.at("set_access_calls").get<unsigned long long>(),
                  d.value("cache_hits", 0ull), d.value("cache_misses", 0ull));
    }
    std::printf("\n%-7s %-5s %10s %10s %16s %16s\n", "device", "peer", "grants", "denials",
                "mapped at exit", "peak mapped");
    for (const auto& d : doc.at("devices")) {
      for (const auto& p : d.at("peers")) {
        std::printf("%-7d %-5d %10llu %10llu %16s %16s\n", d.at("device").get<int>(),
                    p.at("peer").get<int>(), p.at("grants").get<unsigned long long>(),
                    p.at("denials").get<unsigned long long>(),
                    FormatBytes(p.at("mapped_bytes")).c_str(), FormatBytes(p.at("peak_mapped_bytes")).c_str());
      }
    }
    if (!doc.at("driver_calls").empty()) {
      std::printf("\n%-32s %10s %12s\n", "driver entry point", "calls", "seconds");
      for (const auto& c : doc.at("driver_calls")) {
        std::printf("%-32s %10llu %12.6f\n", c.at("entry").get<std::string>().c_str(),
                    c.at("calls").get<unsigned long long>(), c.at("seconds").get<double>());
      }
    }
  } catch (const nlohmann::json::exception& e) {
    std::fprintf(stderr, "vmmshim report: %s is not a vmmshim statistics file: %s\n",
                 path.c_str(), e.what());
    return 1;
  }
  return 0;
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
  compare->add_option("--out", copt.out_dir, "directory for the CSV, JSON, chart and run logs")
      ->capture_default_str();
  compare->add_option("--lib", copt.library, "the libvmmshim.so to preload")
      ->check(CLI::ExistingFile);
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

  auto set = [](const char* name, const std::string& value) {
    if (!value.empty()) setenv(name, value.c_str(), 1);
  };
  set("VMMSHIM_PEER_POLICY", policy);
  set("VMMSHIM_PEER_MIN_BYTES", min_bytes);
  set("VMMSHIM_CONFIG", config);
  set("VMMSHIM_STATS_FILE", stats);
  set("VMMSHIM_CACHE_LIMIT", cache_limit);
  set("VMMSHIM_LOG_LEVEL", log_level);
  set("VMMSHIM_LOG_FILE", log_file);
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
