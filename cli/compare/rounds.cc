// RunCompare (compare.h): the modes, the warm-up and counted rounds, and
// each run checked against the first counted native run; the summaries,
// table and files follow (summary.cc, result_files.cc).
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>

#include "cli/compare/internal.h"

extern char** environ;

namespace vmmshim::compare {
namespace {

// A mode's label as a file name stem: letters, digits, '-' and '.' kept.
std::string Slug(const std::string& label) {
  std::string s;
  for (char c : label) s += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ? c : '_';
  return Truncate(s, 40);
}

}  // namespace

int RunCompare(const CompareOptions& options) {
  std::string error;
  if (options.repeat < 1 || options.warmup < 0 || options.command.empty()) {
    std::fprintf(stderr, "vmmshim compare: nothing to run (repeat %d, warmup %d)\n",
                 options.repeat, options.warmup);
    return 2;
  }
  std::optional<LineFilter> filter = LineFilter::Make(options.check_regex, &error);
  if (!filter) {
    std::fprintf(stderr, "vmmshim compare: --check %s\n", error.c_str());
    return 2;
  }
  if (options.library.find_first_of(" :") != std::string::npos) {
    std::fprintf(stderr,
                 "vmmshim compare: the library path '%s' holds a space or colon, which "
                 "LD_PRELOAD cannot carry; copy libvmmshim.so elsewhere and give --lib\n",
                 options.library.c_str());
    return 2;
  }
  std::string out_arg = options.out_dir;
  if (out_arg.empty()) {
    std::optional<std::string> made = MakeOutputDirectory(std::getenv("TMPDIR"), &error);
    if (!made) {
      std::fprintf(stderr, "vmmshim compare: %s\n", error.c_str());
      return 2;
    }
    out_arg = *made;
    std::fprintf(stderr, "vmmshim compare: files in %s (--out DIR to choose)\n",
                 out_arg.c_str());
  }
  if (!MakeDirs(out_arg + "/runs", &error)) {
    std::fprintf(stderr, "vmmshim compare: %s\n", error.c_str());
    return 2;
  }
  // Absolute: the program may change directory before the shim writes.
  char real[PATH_MAX];
  const std::string out_dir = realpath(out_arg.c_str(), real) != nullptr ? real : out_arg;
  const std::string runs_dir = out_dir + "/runs";
  std::vector<Mode> modes;
  modes.push_back({"native", std::nullopt, "0-native"});
  for (size_t i = 0; i < options.policies.size(); ++i) {
    modes.push_back({options.policies[i].label, options.policies[i],
                     std::to_string(i + 1) + "-" + Slug(options.policies[i].label)});
  }
  // Files of an earlier comparison in the same directory would be read as
  // this one's.
  for (const Mode& m : modes) {
    for (const std::string& f : FilesWithPrefix(runs_dir, m.slug + ".")) unlink(f.c_str());
  }
  std::vector<std::string> base;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) base.emplace_back(*e);

  DeviceMemorySampler sampler;
  std::vector<Run> runs;
  double slowest_native = 0;
  const int total = static_cast<int>(modes.size()) * (options.warmup + options.repeat);
  runs.reserve(static_cast<size_t>(total));

  // One run; false when it could not be started or was interrupted.
  auto run_one = [&](const Mode& mode, int round, bool warmup) -> bool {
    Run run;
    run.mode = &mode;
    run.round = round;
    run.warmup = warmup;
    const std::string name =
        mode.slug + "." + (warmup ? "w" + std::to_string(-round) : std::to_string(round));
    const std::string stem = runs_dir + "/" + name;
    run.stdout_file = stem + ".out";
    run.stderr_file = stem + ".err";
    ChildSpec spec;
    spec.argv = options.command;
    spec.stdout_file = run.stdout_file;
    spec.stderr_file = run.stderr_file;
    spec.env = mode.policy ? PolicyEnvironment(base, options.library, *mode.policy,
                                               stem + ".stats.%p.json", stem + ".shim.%p.log")
                           : NativeEnvironment(base);
    spec.timeout_seconds = options.timeout_seconds;
    if (spec.timeout_seconds == 0 && slowest_native > 0) {
      spec.timeout_seconds = std::max(60.0, 10 * slowest_native);
    }
    std::fprintf(stderr, "vmmshim compare: run %zu of %d: %s%s\n", runs.size() + 1, total,
                 mode.label.c_str(), warmup ? " (warm-up, not counted)" : "");
    sampler.Begin();
    run.child = RunChild(spec, [&](pid_t pid) { sampler.Sample(pid); });
    if (!run.child.started) {
      std::fprintf(stderr, "vmmshim compare: %s\n", run.child.error.c_str());
      return false;
    }
    run.child.out.clear();  // compared from its file: memory does not grow with the runs
    run.peak_device_bytes = sampler.Peak();
    run.stderr_last = LastLine(run.stderr_file);
    if (mode.policy) {
      run.shim = ReadShimFigures(FilesWithPrefix(runs_dir, name + ".stats."), &run.stats_error);
      run.log_files = FilesWithPrefix(runs_dir, name + ".shim.");
    } else if (!run.child.timed_out) {
      slowest_native = std::max(slowest_native, run.child.wall_seconds);
    }
    runs.push_back(std::move(run));
    return !runs.back().child.interrupted && !Interrupted();
  };
  auto interrupted = [&] {
    std::fprintf(stderr, "vmmshim compare: interrupted; the program's process group was "
                         "killed; no table\n");
    return 130;
  };
  ClearInterrupted();
  for (int w = 0; w < options.warmup; ++w) {
    for (const Mode& m : modes) {
      if (!run_one(m, -(w + 1), true)) return Interrupted() ? interrupted() : 2;
    }
  }
  for (int r = 0; r < options.repeat; ++r) {
    // Rotated by r, every other round reversed: neither a mode's place nor
    // its neighbours stay the same.
    std::vector<const Mode*> order;
    for (size_t k = 0; k < modes.size(); ++k) order.push_back(&modes[(r + k) % modes.size()]);
    if (r % 2 == 1) std::reverse(order.begin(), order.end());
    for (const Mode* m : order) {
      if (!run_one(*m, r, false)) return Interrupted() ? interrupted() : 2;
    }
  }

  // The reference: the first counted native run (warm-ups absorb first-run
  // effects such as JIT compilation).
  const Run* reference = nullptr;
  for (const Run& r : runs) {
    if (!r.mode->policy && !r.warmup) {
      reference = &r;
      break;
    }
  }
  if (reference->child.timed_out) {
    std::fprintf(stderr,
                 "vmmshim compare: the first counted native run was killed at the time limit "
                 "(--timeout): nothing to compare with; raise --timeout\n");
    return 2;
  }
  const ChildResult& ref = reference->child;
  auto ends_as_reference = [&](const ChildResult& c) {
    return !c.timed_out && c.signal == ref.signal && c.exit_code == ref.exit_code;
  };
  const std::vector<std::string> want = filter->Lines(ReadFile(reference->stdout_file));
  // Lines that differ between native runs (timings) say nothing about a
  // policy. A native run that ended otherwise may have stopped mid-output.
  VaryingLines varying(want);
  for (const Run& r : runs) {
    if (r.mode->policy || &r == reference || !ends_as_reference(r.child)) continue;
    varying.Learn(filter->Lines(ReadFile(r.stdout_file)), r.warmup);
  }
  const std::vector<size_t> ignored = varying.Positions();
  for (Run& r : runs) {
    if (&r == reference) continue;
    const ChildResult& c = r.child;
    if (!ends_as_reference(c)) {
      r.failure = Describe(c) + " (native: " + Describe(ref) + ")";
    } else if (std::string diff = LinesDifference(
                   want, filter->Lines(ReadFile(r.stdout_file)), filter->filters(), ignored);
               !diff.empty()) {
      r.failure = "standard output differs from native: " + diff;
    }
    if (!r.failure.empty() && !r.stderr_last.empty()) {
      r.failure += "; last line of stderr: " + Truncate(r.stderr_last, 200);
    }
  }

  Results results;
  results.options = &options;
  results.out_dir = out_dir;
  results.runs_dir = runs_dir;
  results.summaries = Summarize(modes, runs);
  results.runs = &runs;
  results.reference = reference;
  results.filtered = filter->filters();
  results.checked_none = filter->filters() && want.empty();
  results.varying = &varying;
  results.sampler = &sampler;
  const int status = PrintSummary(results);
  if (!WriteResultFiles(results, &error)) {
    std::fprintf(stderr, "vmmshim compare: %s\n", error.c_str());
    return 2;
  }
  DrawChart(results, base);
  return status;
}

}  // namespace vmmshim::compare
