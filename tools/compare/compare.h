// `vmmshim compare`: the user's program natively and under each peer-access
// policy, alternating, with one table of what each costs (docs/compare.md).
//
//   vmmshim compare [--policies all,none,min-size:1M,rules:FILE] [--repeat N]
//                   [--warmup N] [--check REGEX | --same-output]
//                   [--timeout SECONDS] [--out DIR] [--lib PATH] -- PROGRAM ARGS
//
// Order: `warmup` uncounted runs of every mode (native first), then `repeat`
// rounds; round r runs the modes starting at mode r (mod their number), so
// no mode always runs first or right after another. Each run is one process
// (ChildSpec): the native run with every VMMSHIM_* variable removed and no
// libvmmshim in LD_PRELOAD; a policy run with the shim first in LD_PRELOAD,
// the policy's variables, VMMSHIM_STATS_FILE and VMMSHIM_LOG_FILE (log level
// info) set per run (%p: each process of the program writes its own, and
// they are added up). Other VMMSHIM_* variables of the caller (cache limit,
// arenas) stay in the policy runs.
//
// A run matches native when its exit status equals the first native run's
// and its standard output does too (--same-output, the default), or the
// lines of it matching --check do (ECMAScript regex, std::regex_search).
// Standard error is not compared (timings, warnings); its last line is shown
// for a run that failed. A policy whose runs do not all match is FAILED, with
// the denials its statistics counted and the first denial lines its log has.
//
// Figures (units: seconds, bytes): median over counted runs of wall time
// (fork to exit), peak device memory (device_memory.h; absent without NVML),
// and, for policy runs, from the statistics files: allocations served from
// VMM, bytes mapped into peers (the per-peer peaks added up), grants,
// denials, cuMemSetAccess calls, seconds in cuCtxEnablePeerAccess; ratios of
// wall time and peak device memory against native.
//
// Files in `out_dir` (created; earlier files of the same names replaced):
// summary.csv (one row per mode), runs.csv (one row per run), compare.json
// (both), compare.png (python3 + matplotlib: `chart_script`), and runs/ with
// each run's stdout, stderr, statistics and shim log.
//
// Exit status of RunCompare: 0 when every policy matched native, 1 when one
// did not (the table says which), 2 when the comparison could not be made
// (the program cannot be started, the output directory cannot be created).
#ifndef VMMSHIM_TOOLS_COMPARE_COMPARE_H_
#define VMMSHIM_TOOLS_COMPARE_COMPARE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace vmmshim::compare {

struct PolicySpec {
  std::string label;       // as given: "all", "min-size:1M", "rules:rules.toml"
  std::string policy;      // VMMSHIM_PEER_POLICY: all, none, min-size, rules
  std::string min_bytes;   // VMMSHIM_PEER_MIN_BYTES of min-size
  std::string rules_file;  // VMMSHIM_CONFIG of rules
};

// Parses a comma-separated list of all, none, min-size:BYTES, rules:FILE.
// BYTES is checked for its form (digits, optional K/M/G/T, optional iB); the
// rules file must be readable (the shim parses it). Duplicates are refused.
// nullopt and `*error` naming the item otherwise.
std::optional<std::vector<PolicySpec>> ParsePolicies(const std::string& list,
                                                     std::string* error);

struct CompareOptions {
  std::vector<PolicySpec> policies;
  int repeat = 3;  // counted runs of each mode, >= 1
  int warmup = 1;  // uncounted runs of each mode first, >= 0
  std::optional<std::string> check_regex;  // nullopt: the whole standard output
  double timeout_seconds = 0;  // per run; 0: 10x the slowest native run, at least 60 s
  std::string out_dir = "vmmshim-compare";
  std::string library;       // libvmmshim.so to preload
  std::string chart_script;  // compare_chart.py; empty: no chart
  std::vector<std::string> command;
};

// The environment of a native run: `base` without VMMSHIM_* variables and
// without libvmmshim*.so entries in LD_PRELOAD.
std::vector<std::string> NativeEnvironment(const std::vector<std::string>& base);

// The environment of a policy run: NativeEnvironment's, plus the caller's
// VMMSHIM_* variables other than those a policy run sets, plus LD_PRELOAD
// with `library` first, the policy's variables, VMMSHIM_STATS_FILE,
// VMMSHIM_LOG_FILE and VMMSHIM_LOG_LEVEL=info.
std::vector<std::string> PolicyEnvironment(const std::vector<std::string>& base,
                                           const std::string& library, const PolicySpec& policy,
                                           const std::string& stats_file,
                                           const std::string& log_file);

// The lines of `out` that the check compares: all of them, or those in which
// `regex` finds a match.
std::vector<std::string> CheckedLines(const std::string& out,
                                      const std::optional<std::string>& regex);

// Empty when `out` matches `reference` under the check; else what differs
// ("line 3: 'x=1' instead of 'x=2'", "2 lines instead of 3").
std::string OutputDifference(const std::string& reference, const std::string& out,
                             const std::optional<std::string>& regex);

// What the shim's statistics files of one run say (stats_report.h's JSON),
// added up over the run's processes.
struct ShimFigures {
  int files = 0;  // statistics files read
  uint64_t served_allocations = 0;
  uint64_t peak_physical_bytes = 0;  // the processes' peaks, added up
  uint64_t mapped_into_peers_bytes = 0;
  uint64_t grants = 0, denials = 0, set_access_calls = 0;
  uint64_t peer_enable_calls = 0;
  double peer_enable_seconds = 0;
  struct PairDenials {
    int device = 0, peer = 0;
    uint64_t denials = 0;
  };
  std::vector<PairDenials> denials_by_pair;  // pairs with denials, by device then peer
};

// Reads and adds up `files`; a file that is not a statistics file is named
// in `*error` and skipped.
ShimFigures ReadShimFigures(const std::vector<std::string>& files, std::string* error);

// The median of `values` (the mean of the middle two for an even count);
// nullopt for none.
std::optional<double> Median(std::vector<double> values);

// "12.3 ms", "1.52 s"; "1.50 GiB", "4.00 MiB", "512 B".
std::string FormatSeconds(double seconds);
std::string FormatBytes(uint64_t bytes);

// Runs the comparison, prints the table to standard output (progress to
// standard error) and writes the files. Returns the exit status above.
int RunCompare(const CompareOptions& options);

}  // namespace vmmshim::compare

#endif  // VMMSHIM_TOOLS_COMPARE_COMPARE_H_
