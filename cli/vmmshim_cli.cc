// The `vmmshim` launcher.
//
//   vmmshim run [--policy P] [--min-bytes N] [--config FILE] [--stats FILE] [--snapshot FILE]
//               [--cache-limit X] [--log-level L] [--log-file F] [--lib PATH]
//               [--torch-memory-saver] -- PROGRAM ARGS...
//       sets LD_PRELOAD (libvmmshim.so next to this program, or --lib) and
//       the VMMSHIM_* variables, then runs PROGRAM in place of itself (exec),
//       so its exit status is the program's.
//   vmmshim report [--wide] [--json] FILE...
//       prints a statistics file (VMMSHIM_STATS_FILE / --stats) as tables,
//       or compare's compare.json as compare's table (cli/report_file.h);
//       several files or directories of them (a job's processes): one row
//       per process and the totals, or JSON (cli/report.h).
//   vmmshim compare [--policies LIST] [--repeat N] [--warmup N]
//                   [--check REGEX | --same-output] [--timeout S] [--out DIR]
//                   [--wide] [--lib PATH] -- PROGRAM ARGS...
//       runs PROGRAM natively and under each policy, alternating, and prints
//       one table (cli/compare/compare.h, docs/compare.md).
//   vmmshim options [--json]
//       the options of run and the variables they set (cli/run_options.h).
//   vmmshim trace [-o OUT] SNAPSHOT...
//       turns memory snapshots (VMMSHIM_SNAPSHOT_FILE; one per process) into
//       one Perfetto timeline: runs python3 memory_trace.py (next to this
//       program or in ../share/vmmshim) with the arguments, in place of
//       itself (docs/memory-snapshots.md).
//
// The VMMSHIM_* variables are named by the shim's options table
// (config/config.h), the statistics file's keys by its schema
// (core/report/stats_schema.h).
//
// Values are checked here only for their form; the shim checks them again
// and stops on a malformed peer setting (docs/configuration.md). A
// malformed command line exits 2 with one line naming the option or
// subcommand and what was expected, and a usage line.
#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "cli/command_line.h"
#include "cli/compare/compare.h"
#include "cli/process_list.h"
#include "cli/report_command.h"
#include "cli/run_options.h"
#include "cli/sleep_command.h"
#include "config/config.h"
#include "config/rules_file.h"
#include "core/base/version.h"

namespace {

using vmmshim::cli::ByteCount;
using vmmshim::cli::Closest;
using vmmshim::cli::CommandLineError;
using vmmshim::cli::LeftOver;
using vmmshim::cli::OneOf;
using vmmshim::cli::WholeNumber;

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

// The directory whose torch_memory_saver package is vmmshim's drop-in
// (python/vmmshim/_tms), and the directory that holds the vmmshim package
// when it is not installed (the build tree's source); empty when absent.
struct DropIn {
  std::string tms_dir;
  std::string package_parent;  // empty in the wheel: vmmshim is importable there
};
DropIn FindDropIn() {
  const std::string dir = SelfDir();
  DropIn found;
  if (access((dir + "/../_tms/torch_memory_saver/__init__.py").c_str(), R_OK) == 0) {
    found.tms_dir = dir + "/../_tms";  // the wheel: vmmshim/bin/vmmshim
    return found;
  }
  const std::string source = VMMSHIM_SOURCE_DIR "/python";
  if (access((source + "/vmmshim/_tms/torch_memory_saver/__init__.py").c_str(), R_OK) == 0) {
    found.tms_dir = source + "/vmmshim/_tms";  // a build tree
    found.package_parent = source;
  }
  return found;
}

// Whether `program` names an executable file: as given when it has a '/',
// else found on PATH (as execvp looks it up).
bool Runnable(const std::string& program) {
  if (program.find('/') != std::string::npos) return access(program.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    if (access((dir + "/" + program).c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

// `vmmshim trace`: the script does the work; this finds it and python3 and
// becomes them (exec), so that the exit status and messages are the script's.
int Trace(const std::vector<std::string>& snapshots, const std::optional<std::string>& output) {
  const std::string script =
      NextToSelf({"/memory_trace.py", "/../share/vmmshim/memory_trace.py"}, "");
  if (script.empty()) {
    std::fprintf(stderr, "vmmshim trace: memory_trace.py is not next to vmmshim nor in "
                         "../share/vmmshim (reinstall vmmshim)\n");
    return 1;
  }
  if (!Runnable("python3")) {
    std::fprintf(stderr, "vmmshim trace: python3 is not on PATH (memory_trace.py needs it)\n");
    return 1;
  }
  std::vector<std::string> words = {"python3", script};
  if (output) {
    words.push_back("-o");
    words.push_back(*output);
  }
  words.push_back("--");  // a snapshot named like an option stays a snapshot
  words.insert(words.end(), snapshots.begin(), snapshots.end());
  // The script's messages then begin "vmmshim trace:", as this command's.
  setenv("VMMSHIM_TRACE_COMMAND", "vmmshim trace", 1);
  std::vector<char*> args;
  for (std::string& w : words) args.push_back(w.data());
  args.push_back(nullptr);
  execvp(args[0], args.data());
  std::fprintf(stderr, "vmmshim trace: cannot run python3: %s\n", std::strerror(errno));
  return 1;
}

// Whether the shim's variable of `key` is set and not empty.
bool InEnvironment(vmmshim::OptionKey key) {
  const char* v = std::getenv(vmmshim::Option(key).name);
  return v != nullptr && *v != '\0';
}

}  // namespace

int main(int argc, char** argv) {
  // Named, so that help says "vmmshim" and not the path it was run by (the
  // wheel runs vmmshim/bin/vmmshim).
  CLI::App app{"vmmshim: run CUDA programs with VMM-backed allocations and per-allocation "
               "peer access",
               "vmmshim"};
  app.set_version_flag("--version", "vmmshim " VMMSHIM_VERSION);
  // Checked after parsing, to name what was given instead (CLI11 would say
  // "A subcommand is required", or blame the program's path for a
  // misspelt option).
  app.require_subcommand(0, 1);
  app.allow_extras();

  CLI::App* run = app.add_subcommand("run", "run PROGRAM under libvmmshim.so");
  vmmshim::cli::RunOptionValues shim_options;
  std::string lib = DefaultLibrary();
  std::vector<std::string> command;
  run->allow_extras();
  shim_options.AddTo(run);
  run->add_option("--lib", lib, "the libvmmshim.so to preload")->check(CLI::ExistingFile);
  bool torch_memory_saver = false;
  run->add_flag("--torch-memory-saver", torch_memory_saver,
                "`import torch_memory_saver` resolves to vmmshim's drop-in "
                "(docs/torch-memory-saver.md)");
  run->add_option("PROGRAM", command, "the program and its arguments, after --")->required();

  CLI::App* report = app.add_subcommand(
      "report", "print a statistics file as tables (or compare's compare.json as its table)");
  report->allow_extras();
  std::vector<std::string> report_files;
  bool report_wide = false, report_json = false;
  report->add_option("FILE", report_files,
                     "statistics files (VMMSHIM_STATS_FILE, run --stats) or directories of "
                     "them, or one compare.json")
      ->required();
  report->add_flag("--wide", report_wide, "compare.json: every column of the table");
  report->add_flag("--json", report_json, "statistics files: the processes and totals as JSON");

  CLI::App* compare = app.add_subcommand(
      "compare", "run PROGRAM natively and under each policy, alternating, and compare");
  compare->allow_extras();
  vmmshim::compare::CompareOptions copt;
  std::string policies = "all,none";
  std::string check;
  bool same_output = false;
  copt.library = lib;
  compare->add_option("--policies", policies,
                      "comma-separated: all, none, min-size:BYTES, rules:FILE")
      ->capture_default_str();
  compare->add_option("--repeat", copt.repeat, "counted runs of each mode")
      ->transform(WholeNumber(1, 1000))
      ->capture_default_str();
  compare->add_option("--warmup", copt.warmup, "uncounted runs of each mode first")
      ->transform(WholeNumber(0, 100))
      ->capture_default_str();
  CLI::Option* check_opt = compare->add_option(
      "--check", check, "compare only the output lines matching this regex (POSIX extended, as grep -E)");
  CLI::Option* same_opt = compare->add_flag(
      "--same-output", same_output,
      "compare the standard output, but for lines that vary between native runs (the default)");
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
  compare->add_option("PROGRAM", copt.command, "the program and its arguments, after --")
      ->required();

  CLI::App* trace = app.add_subcommand(
      "trace", "turn memory snapshots into a Perfetto timeline (docs/memory-snapshots.md)");
  trace->allow_extras();
  std::vector<std::string> trace_snapshots;
  std::string trace_output;
  trace->add_option("SNAPSHOT", trace_snapshots,
                    "memory snapshots (VMMSHIM_SNAPSHOT_FILE), one per process; a PyTorch "
                    "snapshot is read from its device_traces")
      ->required();
  CLI::Option* trace_output_opt = trace->add_option(
      "-o,--output", trace_output,
      "the Chrome trace-event JSON to write (default: the first SNAPSHOT with .trace.json "
      "for its extension)");

  CLI::App* ps = app.add_subcommand(
      "ps", "the processes of this user under the shim: state, device memory, paused tags");
  ps->allow_extras();
  bool ps_json = false;
  std::string ps_dir;
  ps->add_flag("--json", ps_json, "each process's answer as JSON");
  ps->add_option("--dir", ps_dir, "the control sockets' directory (default: VMMSHIM_IPC_DIR, "
                                  "else /tmp/vmmshim-UID)");

  CLI::App* sleep = app.add_subcommand(
      "sleep", "give a process's whole GPU back: pause, then the driver's checkpoint "
               "(docs/deep-sleep.md)");
  sleep->allow_extras();
  std::vector<int> sleep_pids;
  std::vector<std::string> sleep_drop;
  sleep->add_option("PID", sleep_pids, "the processes, as one step (vmmshim ps lists them)")
      ->required()
      ->transform(vmmshim::cli::ProcessId());
  sleep->add_option("--drop", sleep_drop, "a tag whose contents are dropped (repeatable)");
  sleep->add_option("--dir", ps_dir, "the control sockets' directory");
  CLI::App* wake = app.add_subcommand("wake", "wake a process that vmmshim sleep put to sleep");
  wake->allow_extras();
  std::vector<int> wake_pids;
  wake->add_option("PID", wake_pids, "the processes")->required()->transform(vmmshim::cli::ProcessId());
  std::vector<std::string> wake_onto;
  wake->add_option("--onto", wake_onto,
                   "OLD=NEW GPU UUIDs (nvidia-smi -L): restore onto other GPUs (repeatable)");
  wake->add_option("--dir", ps_dir, "the control sockets' directory");

  CLI::App* options = app.add_subcommand(
      "options", "the options of run and the variables they set (--json: as JSON, which "
                 "Python's vmmshim.environment() reads)");
  options->allow_extras();
  bool options_json = false;
  options->add_flag("--json", options_json, "as JSON");

  const std::vector<CLI::App*> subcommands = {run, report, compare, trace, ps, sleep, wake,
                                              options};
  // The subcommand being parsed, for the error's name and usage.
  auto current = [&]() -> const CLI::App* {
    for (const CLI::App* sub : subcommands) {
      if (sub->parsed()) return sub;
    }
    return nullptr;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version print and exit 0.
    if (e.get_exit_code() == 0) return app.exit(e);
    return CommandLineError(current(), e.what());
  }
  const CLI::App* sub = current();
  if (sub == nullptr) {
    const std::vector<std::string> extras = app.remaining();
    if (extras.empty()) {
      return CommandLineError(nullptr, "a subcommand is required: run, report, compare, trace, "
                                       "ps, sleep, wake or options");
    }
    if (extras.front()[0] == '-') return CommandLineError(nullptr, LeftOver(app, false));
    std::string message = "unknown subcommand '" + extras.front() +
                          "'; expected one of run, report, compare, trace, ps, sleep, wake, "
                          "options";
    if (const std::string close = Closest(
            extras.front(), {"run", "report", "compare", "trace", "ps", "sleep", "wake", "options"});
        !close.empty()) {
      message += " (did you mean " + close + "?)";
    }
    return CommandLineError(nullptr, message);
  }
  if (std::string left = LeftOver(*sub, sub == run || sub == compare); !left.empty()) {
    return CommandLineError(sub, left);
  }
  if (std::string left = LeftOver(app, false); !left.empty()) {  // before the subcommand
    return CommandLineError(nullptr, left);
  }

  if (*trace) {
    if (trace_output_opt->count() > 0 && trace_output.empty()) {
      return CommandLineError(trace, "--output: an empty file name");
    }
    return Trace(trace_snapshots, trace_output_opt->count() > 0
                                      ? std::optional<std::string>(trace_output)
                                      : std::nullopt);
  }
  if (*report) {
    return vmmshim::cli::ReportCommand(report_files, report_wide, report_json);
  }
  if (*ps) return vmmshim::cli::PsCommand(ps_dir, ps_json);
  if (*options) {
    if (options_json) {
      std::printf("%s\n", vmmshim::cli::RunOptionsJson().c_str());
    } else {
      for (const vmmshim::cli::RunOption& o : vmmshim::cli::RunOptions()) {
        std::printf("%-14s %-24s %s\n", o.flag, vmmshim::Option(o.key).name, o.help);
      }
    }
    return 0;
  }
  if (*sleep) return vmmshim::cli::SleepCommand(sleep_pids, sleep_drop, ps_dir);
  if (*wake) return vmmshim::cli::WakeCommand(wake_pids, wake_onto, ps_dir);
  if (*compare) {
    std::string error;
    auto parsed = vmmshim::compare::ParsePolicies(policies, &error);
    if (!parsed) {
      return CommandLineError(compare, "--policies: " + error);
    }
    copt.policies = *std::move(parsed);
    // Empty means "make one" to RunCompare; given empty, it is a mistake.
    if (out_opt->count() > 0 && copt.out_dir.empty()) {
      return CommandLineError(compare, "--out: an empty directory name");
    }
    if (!check.empty()) copt.check_regex = check;
    // Before a directory is made for nothing.
    if (!Runnable(copt.command.front())) {
      return CommandLineError(compare, "cannot run '" + copt.command.front() +
                                           "': no such program (or not executable)");
    }
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
  const std::string& policy = shim_options.Get(OptionKey::kPeerPolicy);
  // The shim would stop the program over these; say it before it starts.
  if (policy == "min-size" && shim_options.Get(OptionKey::kPeerMinBytes).empty() &&
      !InEnvironment(OptionKey::kPeerMinBytes)) {
    return CommandLineError(run,
                            "--policy min-size needs --min-bytes BYTES (as in --min-bytes 1M)");
  }
  if (policy == "rules" && shim_options.Get(OptionKey::kConfig).empty() &&
      !InEnvironment(OptionKey::kConfig)) {
    return CommandLineError(run, "--policy rules needs --config FILE (a TOML rules file)");
  }
  shim_options.MakeOutputPathsAbsolute();
  const std::string& stats = shim_options.Get(OptionKey::kStatsFile);
  const std::string& snapshot = shim_options.Get(OptionKey::kSnapshotFile);
  // The shim would only warn (at the program's exit, or its start).
  for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"--stats", stats},
                                   {"--snapshot", snapshot}}) {
    if (path.empty()) continue;
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
    if (access(dir.c_str(), W_OK) != 0) {
      return CommandLineError(run, std::string(flag) + ": cannot write into '" + dir + "': " +
                                       std::strerror(errno));
    }
  }
  shim_options.Export();
  if (!stats.empty() || !snapshot.empty()) {
    // This process becomes the program (exec): it writes the files as named,
    // its children FILE.PID (VMMSHIM_STATS_PID, config/config.h).
    setenv(vmmshim::Option(OptionKey::kStatsPid).name, std::to_string(getpid()).c_str(), 1);
  }
  if (torch_memory_saver) {
    const DropIn drop_in = FindDropIn();
    if (drop_in.tms_dir.empty()) {
      std::fprintf(stderr,
                   "vmmshim run: --torch-memory-saver: the vmmshim Python package is not next to "
                   "this vmmshim (install the wheel: tools/build/build-wheel.sh, pip install)\n");
      return 2;
    }
    std::string path = drop_in.tms_dir;
    if (!drop_in.package_parent.empty()) path += ":" + drop_in.package_parent;
    if (const char* old = std::getenv("PYTHONPATH"); old != nullptr && *old != '\0') {
      path += std::string(":") + old;
    }
    setenv("PYTHONPATH", path.c_str(), 1);
  }
  std::vector<std::string> preload = {lib};
  if (torch_memory_saver) {
    // torch_memory_saver's C entry points (tms_pause...), next to the shim.
    const size_t slash = lib.rfind('/');
    const std::string tms_lib =
        (slash == std::string::npos ? std::string(".") : lib.substr(0, slash)) +
        "/libvmmshim_tms.so";
    if (access(tms_lib.c_str(), R_OK) != 0) {
      std::fprintf(stderr, "vmmshim run: --torch-memory-saver: no %s next to the shim\n",
                   tms_lib.c_str());
      return 2;
    }
    preload.push_back(tms_lib);
  }
  const char* old_preload = std::getenv("LD_PRELOAD");
  setenv("LD_PRELOAD",
         vmmshim::cli::PreloadWith(old_preload != nullptr ? old_preload : "", preload).c_str(), 1);
  // The loader's own message would not say what to do.
  if (void* libcuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL); libcuda != nullptr) {
    dlclose(libcuda);
  } else {
    const std::string sim = SelfDir() + "/simcuda";
    const std::string how =
        access((sim + "/libcuda.so.1").c_str(), R_OK) == 0
            ? "LD_LIBRARY_PATH=" + sim + " vmmshim run -- ..."
            : std::string("a build from source has it in build/simcuda");
    std::fprintf(stderr,
                 "vmmshim run: warning: no libcuda.so.1 here (no NVIDIA driver): a CUDA program "
                 "will not start. Without a GPU, the simulated driver serves driver-API "
                 "programs: %s\n",
                 how.c_str());
  }
  // Said once where a person watches: the shim itself logs only warnings
  // by default.
  if (shim_options.Get(OptionKey::kLogLevel).empty() && !InEnvironment(OptionKey::kLogLevel) &&
      isatty(STDERR_FILENO)) {
    std::fprintf(stderr, "vmmshim run: %s under %s (--log-level info: what it served, at "
                         "exit)\n",
                 command.front().c_str(), lib.c_str());
  }
  std::vector<char*> args;
  for (std::string& a : command) args.push_back(a.data());
  args.push_back(nullptr);
  execvp(args[0], args.data());
  std::fprintf(stderr, "vmmshim run: cannot run %s: %s\n", args[0], std::strerror(errno));
  return 127;
}
