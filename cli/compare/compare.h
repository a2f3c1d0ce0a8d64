// `vmmshim compare`: the user's program natively and under each peer-access
// policy, alternating, with one table of what each costs (docs/compare.md).
//
//   vmmshim compare [--policies all,none,min-size:1M,rules:FILE] [--repeat N]
//                   [--warmup N] [--check REGEX | --same-output]
//                   [--timeout SECONDS] [--out DIR] [--lib PATH] -- PROGRAM ARGS
//
// Order: `warmup` uncounted runs of every mode (native first), then `repeat`
// rounds; round r runs the modes rotated by r, and every other round in
// reverse, so neither a mode's place nor its neighbours stay the same. Each
// run is one process group (ChildSpec): the native run with every VMMSHIM_*
// variable removed and no libvmmshim in LD_PRELOAD; a policy run with the shim
// first in LD_PRELOAD, the policy's variables, VMMSHIM_STATS_FILE and
// VMMSHIM_LOG_FILE (log level info) set per run (%p: each process of the
// program writes its own, and they are added up). Other VMMSHIM_* variables
// of the caller (cache limit, arenas) stay in the policy runs. Paths handed
// to the program (output directory, rules file, library) are absolute, so a
// program that changes directory still finds them.
//
// A run matches native when its exit status (or signal) equals the first
// counted native run's and its standard output does too, line by line (line
// ends and a last newline aside): all of it (--same-output, the default), or
// the lines in which --check finds a match (a POSIX extended regular
// expression, as grep -E takes; LineFilter), less the lines that differ
// between the native runs themselves (VaryingLines: timings). Standard
// error is not compared
// (timings, warnings); its last line is shown for a run that failed. A policy
// whose counted runs do not all match is FAILED, with the denials its
// statistics counted and the first denial lines of its log. A policy none of
// whose counted runs wrote a statistics file is NO SHIM: the shim did not
// start there (ld.so could not preload it, or the program never used CUDA).
//
// Figures (units: seconds, bytes): medians over the counted runs that matched
// native (over all counted runs where none did) of wall time (fork to exit)
// and peak device memory (device_memory.h; absent without NVML), and, for
// policy runs, from the statistics files: allocations served from VMM, bytes
// mapped into peers (the per-peer peaks added up), grants, denials,
// cuMemSetAccess calls, seconds in cuCtxEnablePeerAccess; ratios of wall time
// and peak device memory against native.
//
// Files in `out_dir` (created; earlier files of the same names replaced; by
// default a new directory under ${TMPDIR:-/tmp}, MakeOutputDirectory):
// summary.csv (one row per mode), runs.csv (one row per run), compare.json
// (both, and the settings), compare.png (python3 + matplotlib:
// `chart_script`), and runs/ with each run's stdout, stderr, statistics and
// shim log. Memory use does not grow with the runs: outputs are compared from
// those files.
//
// Exit status of RunCompare: 0 when every policy matched native, 1 when one
// did not (the table says which), 2 when the comparison could not be made (the
// program cannot be started, the first counted native run passed the time
// limit, a file cannot be written, a policy ran without the shim), 130 when
// interrupted (SIGINT, SIGTERM, SIGHUP, SIGQUIT; the program's process group
// is killed first).
#ifndef VMMSHIM_CLI_COMPARE_COMPARE_H_
#define VMMSHIM_CLI_COMPARE_COMPARE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json_fwd.hpp"

namespace vmmshim::compare {

struct PolicySpec {
  std::string label;       // as given: "all", "min-size:1M", "rules:rules.toml"
  std::string policy;      // VMMSHIM_PEER_POLICY: all, none, min-size, rules
  std::string min_bytes;   // VMMSHIM_PEER_MIN_BYTES of min-size
  std::string rules_file;  // VMMSHIM_CONFIG of rules
};

// Parses a comma-separated list of all, none, min-size:BYTES, rules:FILE.
// BYTES and FILE are checked by the shim's own parsers (config/rules_file.h:
// ParseBytes, LoadRulesFile), so what passes here passes in the shim; FILE
// is made absolute. Duplicates are refused. nullopt and `*error` naming the
// item otherwise.
std::optional<std::vector<PolicySpec>> ParsePolicies(const std::string& list,
                                                     std::string* error);

struct CompareOptions {
  std::vector<PolicySpec> policies;
  int repeat = 3;  // counted runs of each mode, >= 1
  int warmup = 1;  // uncounted runs of each mode first, >= 0
  std::optional<std::string> check_regex;  // nullopt: the whole standard output (LineFilter)
  double timeout_seconds = 0;  // per run; 0: 10x the slowest native run, at least 60 s
  std::string out_dir;  // empty: a new one (MakeOutputDirectory)
  std::string library;  // libvmmshim.so to preload; no space or colon (LD_PRELOAD splits there)
  std::string chart_script;  // compare_chart.py; empty: no chart
  bool wide = false;  // every column in the printed table (FormatTable)
  std::vector<std::string> command;
};

// A new directory for a comparison's files, so that it neither litters the
// current directory nor replaces an earlier comparison's:
// `tmpdir`/vmmshim-compare-YYYYmmdd-HHMMSS-XXXXXX (mkdtemp), `tmpdir` being
// $TMPDIR, /tmp when null or empty. nullopt and `*error` when it cannot be
// made.
std::optional<std::string> MakeOutputDirectory(const char* tmpdir, std::string* error);

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

// Which lines of a run's standard output are compared: all of them, or those
// in which a POSIX extended regular expression (regcomp REG_EXTENDED, as grep
// -E) finds a match. glibc's matcher does not recurse per character, so
// lines of any length are safe. Copyable; thread-compatible.
class LineFilter {
 public:
  // nullopt `regex`: every line. A regex regcomp refuses: nullopt, and
  // `*error` says why.
  static std::optional<LineFilter> Make(const std::optional<std::string>& regex,
                                        std::string* error);
  // The compared lines of `out`, "\r\n" and "\n" alike, without a last
  // empty line.
  std::vector<std::string> Lines(const std::string& out) const;
  bool filters() const { return regex_ != nullptr; }

 private:
  std::shared_ptr<const void> regex_;  // a compiled regex_t, or null
};

// Empty when `got` (compared lines) matches `want` at every position but
// the `ignored` ones (sorted, from 0); else what differs, around the first
// difference ("line 3: 'x=1' instead of 'x=2'", "2 lines instead of 3").
std::string LinesDifference(const std::vector<std::string>& want,
                            const std::vector<std::string>& got, bool filtered,
                            const std::vector<size_t>& ignored = {});

// The compared lines that differ between native runs (timings, addresses,
// pids): what no policy can be held to. Learnt position by position, each
// native run's compared lines against the reference's (the first counted
// native run); a position whose text differs in any of them varies. Only
// runs with the reference's number of lines line up with it: when a warm-up
// has another, the warm-ups are not learnt from (first-run output such as
// "compiling kernels"); when a counted run has, nothing is learnt and every
// line is compared. Thread-compatible.
class VaryingLines {
 public:
  static constexpr size_t kTextsKept = 3;  // distinct native texts kept per line

  explicit VaryingLines(std::vector<std::string> reference);
  // Another native run (not the reference) that ended as the reference did.
  void Learn(const std::vector<std::string>& lines, bool warmup);

  // The positions (from 0) left out of the comparison, sorted.
  std::vector<size_t> Positions() const;
  // Up to kTextsKept distinct native texts at `position`, the reference's
  // first.
  std::vector<std::string> Texts(size_t position) const;
  // Native runs learnt from, the reference included.
  int runs() const;
  // Empty, or why runs were not learnt from ("the warm-up native runs
  // printed 5 lines, the counted ones 4: ...").
  std::string caveat() const;

 private:
  struct Tally {
    int runs = 1;  // the reference
    bool aligned = true;
    std::vector<bool> varies;
    std::vector<std::vector<std::string>> texts;  // of varying positions
    std::vector<size_t> counts;  // line counts of runs that did not line up
  };
  void Add(Tally* tally, const std::vector<std::string>& lines) const;
  const Tally& Chosen() const;

  std::vector<std::string> reference_;
  Tally all_, counted_;
};

// What the shim's statistics files of one run say (cli/stats_file.h),
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

// Reads (cli/stats_file.h) and adds up `files`; the first file that is not
// a statistics file is named in `*error`, and every such file is skipped.
// (Statistics files are JSON with UTF-8 strings; compare.json is written with
// invalid UTF-8 in program output replaced, never refused.)
ShimFigures ReadShimFigures(const std::vector<std::string>& files, std::string* error);

// The median of `values` (the mean of the middle two for an even count);
// nullopt for none.
std::optional<double> Median(std::vector<double> values);

// One row of compare's table: a mode's medians (seconds, bytes, counts),
// from a comparison or from its compare.json (FormatResultFile).
struct TableRow {
  std::string label;   // "native" or the policy's
  bool native = false;
  std::string result;  // "ok", "FAILED (k/N)", "NO SHIM", "differs (k/N)"
  std::optional<double> wall, wall_ratio, peak_device, peak_device_ratio;
  std::optional<double> served, peak_physical, mapped, grants, denials, set_access,
      peer_enable_seconds, peer_enable_calls;
};

// The table of `rows`, one line each under a heading. By default the columns
// that decide (result, wall time and peak device memory against native,
// bytes mapped into peers, denials) in at most kNarrowWidth characters: the
// memory pair left out where no row has it, a long policy label shortened.
// `wide`: every column (summary.csv's figures).
constexpr size_t kNarrowWidth = 100;
std::string FormatTable(const std::vector<TableRow>& rows, bool wide);

// Whether `doc` is a comparison's compare.json (WriteResultFiles).
bool IsResultFile(const nlohmann::json& doc);

// compare.json as the table compare printed (`vmmshim report`): a line
// saying what the file is, the command and settings, FormatTable, each
// mode's failure and the lines left out. nullopt and `*error` naming `path`
// and what it lacks when the table cannot be made from it.
std::optional<std::string> FormatResultFile(const nlohmann::json& doc, const std::string& path,
                                            bool wide, std::string* error);

// Runs the comparison, prints the table to standard output (progress to
// standard error) and writes the files. Returns the exit status above.
int RunCompare(const CompareOptions& options);

}  // namespace vmmshim::compare

#endif  // VMMSHIM_CLI_COMPARE_COMPARE_H_
