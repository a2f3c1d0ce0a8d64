// What the pieces of RunCompare (compare.h) share: the modes and runs of a
// comparison, their summaries, and the steps that turn them into the table,
// the files and the chart. Internal to cli/compare; not a stable interface.
//
//   rounds.cc        the modes, the warm-up and counted rounds, the check
//                    against native (RunCompare)
//   summary.cc       medians per mode (Summarize), the printed table and notes
//   result_files.cc  summary.csv, runs.csv, compare.json, the chart
//   policies.cc      --policies and the environments of the runs
//   lines.cc         which output lines are compared, and how they differ
//   shim_figures.cc  the statistics files of a run, added up
//   files.cc         strings, files and directories
//
// Thread safety: thread-compatible values and functions of one comparison.
#ifndef VMMSHIM_CLI_COMPARE_INTERNAL_H_
#define VMMSHIM_CLI_COMPARE_INTERNAL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cli/compare/child_process.h"
#include "cli/compare/compare.h"
#include "cli/compare/device_memory.h"

namespace vmmshim::compare {

struct Mode {
  std::string label;  // "native" or the policy's label
  std::optional<PolicySpec> policy;  // nullopt: native
  std::string slug;   // the stem of its files in runs/: "0-native", "1-all"
};

struct Run {
  const Mode* mode = nullptr;  // one of the comparison's modes, which outlive the runs
  int round = 0;  // counted rounds from 0; warm-ups negative
  bool warmup = false;
  ChildResult child;
  std::optional<uint64_t> peak_device_bytes;
  ShimFigures shim;
  std::string stats_error;
  std::string stderr_file, stdout_file;
  std::string stderr_last;
  std::vector<std::string> log_files;
  std::string failure;  // empty: matched native
};

// A mode's counted runs: medians (units: seconds, bytes, counts).
struct Summary {
  const Mode* mode = nullptr;
  int runs = 0, failed = 0, without_stats = 0;
  std::optional<double> wall, peak_device;
  std::optional<double> served, peak_physical, mapped, grants, denials, set_access,
      peer_enable_seconds, peer_enable_calls;
  std::string failure;  // the first failed run's description
  std::vector<ShimFigures::PairDenials> denials_by_pair;
  std::vector<std::string> denial_lines;
};

// The figures of the comparison, ready to print and write.
struct Results {
  const CompareOptions* options = nullptr;
  std::string out_dir, runs_dir;  // absolute
  std::vector<Summary> summaries;  // one per mode, native first
  const std::vector<Run>* runs = nullptr;
  const Run* reference = nullptr;  // the first counted native run
  bool filtered = false;      // --check given
  bool checked_none = false;  // --check matched no line of the reference
  const VaryingLines* varying = nullptr;  // the lines left out of the comparison
  const DeviceMemorySampler* sampler = nullptr;
};

// Medians of each mode's counted runs: time and memory over the runs that
// matched native (over all when none did), the shim's figures over the runs
// that wrote statistics.
std::vector<Summary> Summarize(const std::vector<Mode>& modes, const std::vector<Run>& runs);

// A policy none of whose counted runs wrote statistics though one ended on
// its own (killed runs write none): the shim was not in the program.
bool NoShim(const Summary& summary, const std::vector<Run>& runs);

// The result column of a mode: "ok", "FAILED (k/N)", "NO SHIM" or, for
// native, "differs (k/N)".
std::string ResultOf(const Summary& summary, const std::vector<Run>& runs);

// Prints the table and its notes to standard output. Returns the exit status
// so far: 0, 1 (a policy failed) or 2 (a policy ran without the shim).
int PrintSummary(const Results& results);

// Writes summary.csv, runs.csv and compare.json into results.out_dir; false
// and `*error` naming the file on failure.
bool WriteResultFiles(const Results& results, std::string* error);

// Draws compare.png from compare.json with options.chart_script (python3 +
// matplotlib) and prints where it is or why it is not drawn.
void DrawChart(const Results& results, const std::vector<std::string>& environment);

// Strings, files and directories.
bool StartsWith(const std::string& s, const std::string& prefix);
std::vector<std::string> Split(const std::string& s, char sep);
// `s` cut to `n` characters, "..." marking the cut.
std::string Truncate(std::string s, size_t n);
// "exit 3", "killed by SIGSEGV", "timed out (killed)", "interrupted".
std::string Describe(const ChildResult& child);
// Files in `dir` whose names start with `prefix`, sorted.
std::vector<std::string> FilesWithPrefix(const std::string& dir, const std::string& prefix);
// mkdir -p; false and `*error` when `path` cannot be a directory.
bool MakeDirs(const std::string& path, std::string* error);
// The whole file; empty when it cannot be read.
std::string ReadFile(const std::string& path);
// Writes `text` to `path`; false and `*error` naming the path on failure.
bool WriteFile(const std::string& path, const std::string& text, std::string* error);

}  // namespace vmmshim::compare

#endif  // VMMSHIM_CLI_COMPARE_INTERNAL_H_
