#include "config/config.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "config/rules_file.h"

extern char** environ;

namespace vmmshim {
namespace {

struct LevelName {
  const char* name;
  LogLevel level;
};
constexpr LevelName kLevels[] = {
    {"trace", LogLevel::kTrace}, {"debug", LogLevel::kDebug}, {"info", LogLevel::kInfo},
    {"warn", LogLevel::kWarn},   {"error", LogLevel::kError}, {"off", LogLevel::kOff},
};

bool ApplyEnable(absl::string_view value, int, Config* config) {
  return absl::SimpleAtob(absl::StripAsciiWhitespace(value), &config->enable);
}

bool ApplyLogLevel(absl::string_view value, int, Config* config) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  for (const LevelName& l : kLevels) {
    if (lower == l.name || (lower == "warning" && l.level == LogLevel::kWarn)) {
      config->log_level = l.level;
      return true;
    }
  }
  return false;
}

// A file path option: non-empty, "%p" replaced by the pid.
bool ApplyPidPath(absl::string_view value, int pid, std::string* path) {
  if (value.empty()) return false;
  *path = absl::StrReplaceAll(value, {{"%p", absl::StrCat(pid)}});
  return true;
}

bool ApplyLogFile(absl::string_view value, int pid, Config* config) {
  return ApplyPidPath(value, pid, &config->log_file);
}

bool ApplyPeerPolicy(absl::string_view value, int, Config* config) {
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  if (v != "all" && v != "none" && v != "min-size" && v != "rules") return false;
  config->peer_policy_name = v;
  return true;
}

bool ApplyPeerMinBytes(absl::string_view value, int, Config* config) {
  config->peer_min_bytes = ParseBytes(value);
  return config->peer_min_bytes.has_value();
}

bool ApplyConfigFile(absl::string_view value, int, Config* config) {
  if (value.empty()) return false;
  config->rules_file = std::string(value);
  return true;
}

bool ApplyPeerEnableDriver(absl::string_view value, int, Config* config) {
  return absl::SimpleAtob(absl::StripAsciiWhitespace(value), &config->peer_enable_driver);
}

bool ApplyCacheLimit(absl::string_view value, int, Config* config) {
  absl::string_view v = absl::StripAsciiWhitespace(value);
  if (absl::ConsumeSuffix(&v, "%")) {
    double percent;
    // Written so that NaN ("nan%") fails too.
    if (!absl::SimpleAtod(v, &percent) || !(percent >= 0 && percent <= 100)) return false;
    config->cache_limit_percent = percent;
    return true;
  }
  std::optional<size_t> bytes = ParseBytes(v);
  if (!bytes) return false;
  config->cache_limit_percent = -1;
  config->cache_limit_bytes = *bytes;
  return true;
}

bool ApplyPinnedPool(absl::string_view value, int, Config* config) {
  std::optional<size_t> bytes = ParseBytes(absl::StripAsciiWhitespace(value));
  if (!bytes) return false;
  config->pinned_pool_bytes = *bytes;
  return true;
}

bool ApplyHostPoolMax(absl::string_view value, int, Config* config) {
  std::optional<size_t> bytes = ParseBytes(absl::StripAsciiWhitespace(value));
  if (!bytes) return false;
  config->host_pool_max_bytes = *bytes;
  return true;
}

bool ApplyPausedAccess(absl::string_view value, int, Config* config) {
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  if (v != "host" && v != "fault") return false;
  config->paused_memory_addressable = v == "host";
  return true;
}

bool ApplyHostPoolMake(absl::string_view value, int, Config* config) {
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  if (v != "pause" && v != "background") return false;
  config->host_memory_in_background = v == "background";
  return true;
}

bool ApplyHostPoolIdle(absl::string_view value, int, Config* config) {
  double seconds;
  // Written so that NaN fails too.
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(value), &seconds) ||
      !(seconds >= 0 && seconds <= 86400 * 365)) {
    return false;
  }
  config->host_pool_idle_seconds = seconds;
  return true;
}

bool ApplyTraceFile(absl::string_view value, int pid, Config* config) {
  return ApplyPidPath(value, pid, &config->trace_file);
}

bool ApplyStatsFile(absl::string_view value, int pid, Config* config) {
  return ApplyPidPath(value, pid, &config->stats_file);
}

bool ApplyStatsPid(absl::string_view value, int, Config* config) {
  int pid;
  if (!absl::SimpleAtoi(value, &pid) || pid <= 0) return false;
  config->stats_pid = pid;
  return true;
}

bool ApplyIpc(absl::string_view value, int, Config* config) {
  return absl::SimpleAtob(absl::StripAsciiWhitespace(value), &config->ipc);
}

bool ApplyIpcDir(absl::string_view value, int, Config* config) {
  if (value.empty() || value[0] != '/') return false;
  config->ipc_dir = std::string(value);
  return true;
}

bool ApplyCompression(absl::string_view value, int, Config* config) {
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  if (v != "generic" && v != "none") return false;
  config->compression = v == "generic";
  return true;
}

bool ApplyArenas(absl::string_view value, int, Config* config) {
  int n = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(value), &n) || n < 0 || n > 64) return false;
  config->arenas = n;
  return true;
}

bool ApplySnapshotFile(absl::string_view value, int pid, Config* config) {
  return ApplyPidPath(value, pid, &config->snapshot_file);
}

bool ApplySnapshotEntries(absl::string_view value, int, Config* config) {
  int64_t n = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(value), &n) || n < 1 || n > 100000000) {
    return false;
  }
  config->snapshot_entries = static_cast<size_t>(n);
  return true;
}

bool ApplySnapshotStacks(absl::string_view value, int, Config* config) {
  int n = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(value), &n) || n < 0 || n > 64) return false;
  config->snapshot_stacks = n;
  return true;
}

bool ApplyControl(absl::string_view value, int, Config* config) {
  return absl::SimpleAtob(absl::StripAsciiWhitespace(value), &config->control);
}

bool ApplySleepLowersStack(absl::string_view value, int, Config* config) {
  return absl::SimpleAtob(absl::StripAsciiWhitespace(value), &config->sleep_lowers_stack);
}

bool ApplyQuiesceTimeout(absl::string_view value, int, Config* config) {
  double seconds = 0;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(value), &seconds) || !(seconds >= 0.1) ||
      seconds > 600) {
    return false;
  }
  config->quiesce_timeout_ms = static_cast<int>(std::lround(seconds * 1000));
  return true;
}

bool ApplyAttribution(absl::string_view value, int, Config* config) {
  return absl::SimpleAtob(absl::StripAsciiWhitespace(value), &config->attribution);
}

// Resolves the peer policy from the options; problems are fatal.
void ResolvePeerPolicy(ParseResult* result) {
  Config& c = result->config;
  std::string name = c.peer_policy_name;
  if (name.empty()) name = c.rules_file.empty() ? "all" : "rules";
  if (name == "all") {
    c.peer_policy.kind = PeerPolicy::Kind::kAll;
  } else if (name == "none") {
    c.peer_policy.kind = PeerPolicy::Kind::kNone;
  } else if (name == "min-size") {
    if (!c.peer_min_bytes) {
      result->fatal_problems.push_back(
          "VMMSHIM_PEER_POLICY=min-size needs VMMSHIM_PEER_MIN_BYTES (for example 1M)");
      return;
    }
    c.peer_policy.kind = PeerPolicy::Kind::kMinSize;
    c.peer_policy.min_bytes = *c.peer_min_bytes;
  } else if (name == "rules") {
    if (c.rules_file.empty()) {
      result->fatal_problems.push_back(
          "VMMSHIM_PEER_POLICY=rules needs VMMSHIM_CONFIG (the rules file)");
      return;
    }
    absl::StatusOr<PeerPolicy> loaded = LoadRulesFile(c.rules_file);
    if (!loaded.ok()) {
      result->fatal_problems.push_back(std::string(loaded.status().message()));
      return;
    }
    c.peer_policy = *std::move(loaded);
  }
  if (name != "min-size" && c.peer_min_bytes) {
    result->problems.push_back(absl::StrCat("VMMSHIM_PEER_MIN_BYTES is ignored: the policy is ",
                                            name, ", not min-size"));
  }
  if (name != "rules" && !c.rules_file.empty()) {
    result->problems.push_back(absl::StrCat("VMMSHIM_CONFIG is ignored: the policy is ", name,
                                            ", not rules"));
  }
}

constexpr OptionInfo kOptions[] = {
    {"VMMSHIM_ENABLE", "bool", "1", "1/0, true/false, yes/no, t/f, y/n (any case)",
     "0 turns the shim into a pure pass-through: every call reaches the driver unchanged.",
     &ApplyEnable, false, OptionKey::kEnable},
    {"VMMSHIM_LOG_LEVEL", "enum", "warn",
     "trace, debug, info, warn (or warning), error, off (any case)",
     "Least severe message logged. At info the shim logs its start and an exit report "
     "(allocations and bytes served from VMM and passed through).",
     &ApplyLogLevel, false, OptionKey::kLogLevel},
    {"VMMSHIM_LOG_FILE", "path", "stderr",
     "a file path in an existing directory; %p becomes the pid",
     "Where log lines go, appended. A file that cannot be opened, or whose directory does not "
     "exist, gets one warning and logging stays on standard error.",
     &ApplyLogFile, false, OptionKey::kLogFile},
    {"VMMSHIM_PEER_POLICY", "enum", "all (rules when VMMSHIM_CONFIG is set)",
     "all, none, min-size, rules",
     "Which allocations peers that enable peer access may map: all (as "
     "cudaDeviceEnablePeerAccess), none, those of at least VMMSHIM_PEER_MIN_BYTES, or the "
     "rules of VMMSHIM_CONFIG. Malformed: the program stops with one message.",
     &ApplyPeerPolicy, true, OptionKey::kPeerPolicy},
    {"VMMSHIM_PEER_MIN_BYTES", "bytes", "(none)",
     "a byte count: digits with an optional K, M, G or T[iB] (powers of 1024)",
     "The threshold of the min-size policy. Malformed: the program stops with one message.",
     &ApplyPeerMinBytes, true, OptionKey::kPeerMinBytes},
    {"VMMSHIM_CONFIG", "path", "(none)", "a TOML rules file (docs/peer-access.md)",
     "Peer-access rules for the rules policy. A file that cannot be read or parsed stops the "
     "program with one message naming the file, line and problem.",
     &ApplyConfigFile, true, OptionKey::kConfig},
    {"VMMSHIM_PEER_ENABLE_DRIVER", "bool", "1", "1/0, true/false, yes/no, t/f, y/n (any case)",
     "1: cuCtxEnablePeerAccess also reaches the driver, so memory the shim does not serve "
     "(stream-ordered pools, library buffers) stays reachable by peers; 0: only shim "
     "allocations are granted, by the policy.",
     &ApplyPeerEnableDriver, false, OptionKey::kPeerEnableDriver},
    {"VMMSHIM_CACHE_LIMIT", "bytes or percent", "10%",
     "a byte count (K, M, G, T[iB]) or a percentage of device memory such as 25%",
     "The most each device keeps mapped for reuse after frees. Cached memory counts as free "
     "in cudaMemGetInfo and is released before an allocation would fail for lack of memory. "
     "0 turns the cache off.",
     &ApplyCacheLimit, false, OptionKey::kCacheLimit},
    {"VMMSHIM_STATS_FILE", "path", "(none)", "a file path; %p becomes the pid",
     "Writes a JSON report at exit: per device allocations, bytes, peak, grants and denials "
     "per peer, bytes mapped into each peer, driver calls and time by entry point.",
     &ApplyStatsFile, false, OptionKey::kStatsFile},
    {"VMMSHIM_TRACE_FILE", "path", "(none)", "a file path; %p becomes the pid",
     "Records every allocation and free as CSV (time, thread, device, op, size, pointer) for "
     "replay with bench/replay; written at exit.",
     &ApplyTraceFile, false, OptionKey::kTraceFile},
    {"VMMSHIM_IPC", "bool", "1", "1/0, true/false, yes/no, t/f, y/n (any case)",
     "1: shim memory is created shareable (POSIX file-descriptor handle type) and "
     "cudaIpcGetMemHandle/cudaIpcOpenMemHandle work on it between processes of the same user "
     "(docs/ipc.md); 0: memory is not shareable and IPC calls reach the driver, which rejects "
     "VMM memory.",
     &ApplyIpc, false, OptionKey::kIpc},
    {"VMMSHIM_IPC_DIR", "path", "/tmp/vmmshim-<uid>",
     "an absolute directory path; created with mode 0700 when missing",
     "Where exporting processes keep their IPC sockets. Exporter and importer must use the same "
     "directory. One owned by another user, open to others, or a symbolic link is refused with "
     "one error line (once per process) and IPC exports fail with CUDA_ERROR_OPERATING_SYSTEM.",
     &ApplyIpcDir, false, OptionKey::kIpcDir},
    {"VMMSHIM_COMPRESSION", "enum", "none", "none, generic (any case)",
     "generic: request compressible memory (CUDA guide 4.16.5.2) on devices that report "
     "generic compression support; whether the driver granted it is logged once per device and "
     "in the exit report.",
     &ApplyCompression, false, OptionKey::kCompression},
    {"VMMSHIM_ARENAS", "int", "0", "0 (automatic) or 1 to 64",
     "Heap arenas per device: each thread allocates in one of them, so threads up to this "
     "number never share a lock on the fast path (core/heap/device_heap.h). 0: the number of CPUs "
     "the process may run on, at most 8. 1: one arena (one lock per device).",
     &ApplyArenas, false, OptionKey::kArenas},
    {"VMMSHIM_SNAPSHOT_FILE", "path", "(none)", "a file path; %p becomes the pid",
     "Records the memory history from the start and writes a memory snapshot in PyTorch's "
     "memory_viz format (a pickle: python -m torch.cuda._memory_viz trace_plot FILE, or "
     "pytorch.org/memory_viz) at exit, and FILE with .oom before the extension at the first "
     "out-of-memory failure (docs/memory-snapshots.md). A path that cannot be written gets "
     "one warning at start; the program runs on.",
     &ApplySnapshotFile, false, OptionKey::kSnapshotFile},
    {"VMMSHIM_SNAPSHOT_ENTRIES", "int", "1000000", "1 to 100000000",
     "Events the history keeps at most (about 64 bytes each); beyond, the oldest are "
     "dropped and the snapshot says how many.",
     &ApplySnapshotEntries, false, OptionKey::kSnapshotEntries},
    {"VMMSHIM_SNAPSHOT_STACKS", "int", "0", "0 to 64",
     "Call-stack frames recorded with each allocation and free in the history (the "
     "snapshot's frames); 0: none, the caller library only. Costs an unwind per call "
     "(docs/memory-snapshots.md gives the measured cost).",
     &ApplySnapshotStacks, false, OptionKey::kSnapshotStacks},
    {"VMMSHIM_ATTRIBUTION", "bool", "1", "1/0, true/false, yes/no, t/f, y/n (any case)",
     "1: each allocation remembers the library it came from (libcublas, libnccl, "
     "libc10_cuda...), named in snapshots and the out-of-memory report; 0: all are "
     "\"unknown\".",
     &ApplyAttribution, false, OptionKey::kAttribution},
    {"VMMSHIM_CONTROL", "bool", "1", "1/0, true/false, yes/no, t/f, y/n (any case)",
     "1: a process under the shim answers `vmmshim ps` on its control socket "
     "(VMMSHIM_IPC_DIR/ctl-PID.sock, this user only; one listener thread from the first CUDA "
     "call); 0: no socket and no thread.",
     &ApplyControl, false, OptionKey::kControl},
    {"VMMSHIM_PINNED_POOL", "bytes", "0", "a byte count (K, M, G, T[iB]); 0: none",
     "Page-locked host memory made in the background from the first device allocation and "
     "kept to the end of the process, into which pauses that keep contents (and deep "
     "sleep) copy at the copy engine's speed (about 50 GiB/s on an H200) from their first "
     "cycle; contents beyond it go to new host memory as without it. Costs that much host "
     "memory, pinned, for the process's life (docs/pause-resume-design.md, \"The pinned pool\"); "
     "a deep sleep unpins it for the driver's checkpoint, and the wake's copies pin again "
     "what they use. Cut to 3/4 of the host memory left when it is made (MemAvailable, or "
     "the memory cgroup's limit less its use), with a warning naming the limit, so that it "
     "never gets the process OOM-killed.",
     &ApplyPinnedPool, false, OptionKey::kPinnedPool},
    {"VMMSHIM_PAUSED_ACCESS", "enum", "host", "host, fault",
     "What a kernel or copy that touches paused memory meets (docs/pause-resume.md, "
     "\"Touching paused memory\"). host: the kept contents themselves, in host memory mapped "
     "at the paused address (read and written over the bus, slowly; the writes are there "
     "after the resume), or scratch memory where the contents were dropped (undefined data), "
     "so that an access does not kill the CUDA context (expandable_segments:True pages "
     "included). Kept contents are addressable once host memory of their sizes is made: under "
     "VMMSHIM_HOST_POOL_MAKE=background (the default) from a few seconds after the first pause "
     "of a set (once the memory is made in the background, the contents move there) and at "
     "once from the second, under pause from the first. Contents kept on disk, "
     "devices without host VMM memory, mappings of part of another library's handle and a "
     "deep sleep still fault. The host memory is pinned and kept for the next pause "
     "(VMMSHIM_HOST_POOL_IDLE). fault: nothing is mapped there and an access kills the "
     "context, with everything paused.",
     &ApplyPausedAccess, false, OptionKey::kPausedAccess},
    {"VMMSHIM_HOST_POOL_MAKE", "enum", "background", "background, pause",
     "Where the host memory a pause with VMMSHIM_PAUSED_ACCESS=host needs is made when the "
     "memory kept from earlier pauses lacks it (docs/pause-resume.md, \"What host costs\"). "
     "background: the pause keeps those contents in other host memory, as fault does (an "
     "access to them faults until the host memory is made), and one thread makes the host "
     "memory for them in the background, never while a pause or resume runs; the contents "
     "then move into it (a CPU copy) and are mapped, unless the program was given their "
     "address, and the next pause of the same set copies at the copy engine's speed and stays "
     "addressable at once. pause: by the pause itself, so that "
     "every paused byte stays addressable from the first pause on, at the pinning's speed "
     "(several times slower than the copy).",
     &ApplyHostPoolMake, false, OptionKey::kHostPoolMake},
    {"VMMSHIM_HOST_POOL_IDLE", "seconds", "300", "0 to 31536000",
     "Host memory that held paused contents is kept, pinned, for the next pause (which then "
     "copies at the copy engine's speed); unused this long, it is released. 0: no idle "
     "release (a deep sleep, a short host and a pause of other sizes still release it).",
     &ApplyHostPoolIdle, false, OptionKey::kHostPoolIdle},
    {"VMMSHIM_HOST_POOL_MAX", "bytes", "0", "a byte count (K, M, G, T[iB]); 0: no cap",
     "The most host memory one device's pool holds, pinned, for addressable pauses (kept for "
     "the next pause, in use by paused contents, or being made; the 66 MiB of scratch that "
     "dropped contents map apart), so that an operator can bound what a process pins. "
     "Contents beyond it are kept as VMMSHIM_PAUSED_ACCESS=fault "
     "keeps them (an access faults while paused). 0: sized to what the process paused last, "
     "within 3/4 of the host's free memory or the memory cgroup's headroom (docs/"
     "pause-resume.md, \"Touching paused memory\"). The residency report's sized_by names "
     "the limit that cut it.",
     &ApplyHostPoolMax, false, OptionKey::kHostPoolMax},
    {"VMMSHIM_SLEEP_LOWERS_STACK", "bool", "1", "1/0, true/false, yes/no, t/f, y/n (any case)",
     "1: a deep sleep lowers each active primary context's stack limit (CU_LIMIT_STACK_SIZE) "
     "to 0 before the driver's checkpoint and the wake sets it back, so that the checkpoint "
     "does not copy the stack reservation (264 MiB on an H200; docs/deep-sleep-design.md, \"The "
     "context's stack reservation\"); 0: the limit stays as the program set it.",
     &ApplySleepLowersStack, false, OptionKey::kSleepLowersStack},
    {"VMMSHIM_QUIESCE_TIMEOUT", "seconds", "10", "0.1 to 600",
     "How long the quiesce before a deep sleep or a pause called while other threads may "
     "launch may take: the calls inside the driver to return and the contexts' work to "
     "finish. Past it the quiesce is undone (the program goes on, nothing paused) and the "
     "error names the thread and entry point, or the device, that did not finish "
     "(docs/pause-resume.md, \"Quiescing\"). At most 600: `vmmshim sleep` waits 600 s for the "
     "pause.",
     &ApplyQuiesceTimeout, false, OptionKey::kQuiesceTimeout},
    {"VMMSHIM_STATS_PID", "int", "(none)", "a process id",
     "Set by `vmmshim run --stats FILE` and `--snapshot FILE`: the process that writes "
     "VMMSHIM_STATS_FILE and VMMSHIM_SNAPSHOT_FILE as named. Any other process under the same "
     "setting (a child: torchrun's workers, multiprocessing, a shell's commands) writes them "
     "with .PID before the extension (stats.json: stats.1234.json), so that none overwrites "
     "another's. A path with %p is used as given.",
     &ApplyStatsPid, false, OptionKey::kStatsPid},
};

// Option(key) indexes the table: each row must sit at its key's place, and
// every key have its row.
constexpr bool RowsInKeyOrder() {
  for (size_t i = 0; i < std::size(kOptions); ++i) {
    if (static_cast<size_t>(kOptions[i].key) != i) return false;
  }
  return true;
}
static_assert(RowsInKeyOrder(), "kOptions rows out of OptionKey order");
static_assert(std::size(kOptions) == static_cast<size_t>(OptionKey::kStatsPid) + 1,
              "an OptionKey without its row in kOptions (or a row without a key)");

}  // namespace

absl::Span<const OptionInfo> Options() { return kOptions; }

const OptionInfo& Option(OptionKey key) { return kOptions[static_cast<size_t>(key)]; }

std::string ChildStatsPath(absl::string_view path, absl::string_view part) {
  const size_t slash = path.rfind('/');
  const size_t dot = path.rfind('.');
  const bool has_extension =
      dot != absl::string_view::npos && dot > (slash == absl::string_view::npos ? 0 : slash + 1);
  const size_t at = has_extension ? dot : path.size();
  return absl::StrCat(path.substr(0, at), ".", part, path.substr(at));
}

absl::string_view LogLevelName(LogLevel level) {
  for (const LevelName& l : kLevels) {
    if (l.level == level) return l.name;
  }
  return "?";
}

ParseResult ParseConfig(absl::FunctionRef<const char*(const char*)> getenv,
                        absl::Span<const std::string> environ_names, int pid) {
  ParseResult result;
  for (const OptionInfo& option : kOptions) {
    const char* value = getenv(option.name);
    if (value == nullptr) continue;
    if (!option.apply(value, pid, &result.config)) {
      if (option.fatal) {
        result.fatal_problems.push_back(absl::StrCat(option.name, "='", value,
                                                     "' is not valid (", option.accepted, ")"));
      } else {
        result.problems.push_back(absl::StrCat(option.name, "='", value, "' is not valid (",
                                               option.accepted, "); using the default ",
                                               option.default_value));
      }
    }
  }
  for (const std::string& name : environ_names) {
    if (!absl::StartsWith(name, kOptionPrefix)) continue;
    bool known = false;
    for (const OptionInfo& option : kOptions) known |= name == option.name;
    if (!known) {
      std::string names;
      for (const OptionInfo& option : kOptions) absl::StrAppend(&names, " ", option.name);
      // A misspelt peer setting would silently run another policy: fatal.
      (absl::StartsWith(name, "VMMSHIM_PEER") || absl::StartsWith(name, "VMMSHIM_CONF")
           ? result.fatal_problems
           : result.problems)
          .push_back(absl::StrCat(name, " is not a vmmshim option; options are:", names));
    }
  }
  // A child of the process VMMSHIM_STATS_PID names writes its own files.
  if (result.config.stats_pid != 0 && result.config.stats_pid != pid) {
    for (const auto& [key, path] :
         {std::pair<OptionKey, std::string*>{OptionKey::kStatsFile, &result.config.stats_file},
          {OptionKey::kSnapshotFile, &result.config.snapshot_file}}) {
      const char* given = getenv(Option(key).name);
      if (given != nullptr && !path->empty() && !absl::StrContains(given, "%p")) {
        *path = ChildStatsPath(*path, absl::StrCat(pid));
      }
    }
  }
  // Host VMM memory crashes some drivers (NCCL issue 2106) or fails on some
  // NUMA nodes (NCCL issue 2190); where the user turned NCCL's use of it off,
  // the shim makes none either unless told to.
  const char* nccl_host = getenv("NCCL_CUMEM_HOST_ENABLE");
  const char* paused_access = getenv(Option(OptionKey::kPausedAccess).name);
  Config ignored;
  const bool access_given =
      paused_access != nullptr && ApplyPausedAccess(paused_access, pid, &ignored);
  if (!access_given && nccl_host != nullptr && absl::StripAsciiWhitespace(nccl_host) == "0") {
    result.config.paused_memory_addressable = false;
    result.notes.push_back(
        "VMMSHIM_PAUSED_ACCESS=fault, since NCCL_CUMEM_HOST_ENABLE=0 says host VMM memory is "
        "not to be made on this host (set VMMSHIM_PAUSED_ACCESS=host to make it anyway)");
  }
  if (result.fatal_problems.empty()) ResolvePeerPolicy(&result);
  if (!result.config.enable) {
    // Pure pass-through: peer settings do not matter, so nothing is fatal.
    for (std::string& p : result.fatal_problems) {
      result.problems.push_back(absl::StrCat(p, " (ignored: VMMSHIM_ENABLE=0)"));
    }
    result.fatal_problems.clear();
  }
  return result;
}

ParseResult ParseConfigFromEnvironment() {
  std::vector<std::string> names;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    absl::string_view entry(*e);
    if (absl::StartsWith(entry, kOptionPrefix)) names.emplace_back(entry.substr(0, entry.find('=')));
  }
  return ParseConfig([](const char* name) { return std::getenv(name); }, names, getpid());
}

}  // namespace vmmshim
