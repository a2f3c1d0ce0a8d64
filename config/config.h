// vmmshim's settings: VMMSHIM_* environment variables, parsed once.
//
// Every option is one row of the table returned by Options() (name, type,
// default, unit, accepted values, description); docs/configuration.md lists
// the same rows and a test keeps the two in step.
//
// A malformed value never stops the program: ParseConfig keeps the option's
// default and returns one message naming the variable, the value and what is
// accepted; the shim logs each message once at start. Unknown VMMSHIM_*
// variables (likely typos) also get a message.
//
// Thread safety: ParseConfig is pure; Config is an immutable value.
#ifndef VMMSHIM_CONFIG_CONFIG_H_
#define VMMSHIM_CONFIG_CONFIG_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/peer/policy/peer_policy.h"

namespace vmmshim {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kOff };

struct Config {
  // false: every call goes to the driver unchanged (pure pass-through).
  bool enable = true;
  LogLevel log_level = LogLevel::kWarn;
  // Empty: stderr. "%p" in VMMSHIM_LOG_FILE is already replaced by the pid.
  std::string log_file;

  // Peer access (docs/peer-access.md). The policy is resolved from
  // VMMSHIM_PEER_POLICY, VMMSHIM_PEER_MIN_BYTES and VMMSHIM_CONFIG.
  PeerPolicy peer_policy;
  std::string peer_policy_name;      // as given; empty = unset
  std::optional<size_t> peer_min_bytes;
  std::string rules_file;            // VMMSHIM_CONFIG
  // Whether cuCtxEnablePeerAccess/cuCtxDisablePeerAccess also reach the
  // driver, so memory the shim does not own stays reachable by peers.
  bool peer_enable_driver = true;
  // JSON statistics written at exit; empty = none. "%p" already replaced.
  std::string stats_file;
  // The process that writes stats_file as named (VMMSHIM_STATS_PID, set by
  // `vmmshim run --stats`); 0: every process does. Applied by ParseConfig.
  int stats_pid = 0;
  // Allocation trace (core/report/trace.h); empty = none. "%p" already replaced.
  std::string trace_file;
  // VMMSHIM_CACHE_LIMIT: a percentage of each device's memory when
  // cache_limit_percent >= 0, else cache_limit_bytes.
  double cache_limit_percent = 10;
  size_t cache_limit_bytes = 0;
  // VMMSHIM_IPC: physical memory is made exportable (POSIX-fd handle type)
  // and cuIpcGetMemHandle/cuIpcOpenMemHandle work on shim memory.
  bool ipc = true;
  // VMMSHIM_IPC_DIR: where exporters' sockets live; empty = /tmp/vmmshim-<uid>.
  std::string ipc_dir;
  // VMMSHIM_COMPRESSION=generic: request compressible memory.
  bool compression = false;
  // VMMSHIM_ARENAS: heap arenas per device; 0 = automatic.
  int arenas = 0;
  // Memory snapshot (core/report/memory_snapshot.h) written at exit and at an
  // out-of-memory failure; empty = none. "%p" already replaced. Setting it
  // records the history from the start.
  std::string snapshot_file;
  size_t snapshot_entries = 1000000;  // events kept at most
  int snapshot_stacks = 0;            // call-stack frames per event; 0: none
  // VMMSHIM_ATTRIBUTION: each allocation remembers the library it came
  // from (core/history/caller_library.h).
  bool attribution = true;
  // VMMSHIM_CONTROL: the control socket `vmmshim ps` asks
  // (core/control/control_server.h).
  bool control = true;
  // VMMSHIM_PINNED_POOL: page-locked host memory made ahead for pauses that
  // keep contents (core/heap/pinned_pool.h); 0 = none.
  size_t pinned_pool_bytes = 0;
  // VMMSHIM_PAUSED_ACCESS: host (true) or fault (false): what paused memory
  // maps (core/heap/host_mapped_pool.h; docs/pause-resume.md, "Touching
  // paused memory").
  bool paused_memory_addressable = true;
  // VMMSHIM_HOST_POOL_IDLE: seconds before unused host memory kept for the
  // next pause is released; 0 = kept until exit.
  double host_pool_idle_seconds = 300;
  // VMMSHIM_HOST_POOL_MAX: the most host memory one device's pool holds
  // for addressable pauses (core/heap/host_mapped_pool.h); 0: the host's
  // limits alone.
  size_t host_pool_max_bytes = 0;
  // VMMSHIM_HOST_POOL_MAKE: background (true) or pause (false): where the
  // host memory a pause with VMMSHIM_PAUSED_ACCESS=host lacks is made.
  bool host_memory_in_background = true;
  // VMMSHIM_SLEEP_LOWERS_STACK: a deep sleep lowers the contexts' stack
  // limit for the driver's checkpoint (core/lifecycle/stack_reservation.h).
  bool sleep_lowers_stack = true;
  // VMMSHIM_QUIESCE_TIMEOUT: how long a quiesce of the program's GPU work may
  // take before it is undone (core/sleep/work_quiescer.h); milliseconds.
  int quiesce_timeout_ms = 10000;
};

// The prefix of every option's variable name; Options() knows all of them.
inline constexpr absl::string_view kOptionPrefix = "VMMSHIM_";

// One key per row of Options(), in table order, so that a program setting a
// variable for the shim (the `vmmshim` CLI) names it through the table:
// Option(OptionKey::kStatsFile).name. A key without its row fails to compile
// (a static_assert in config.cc).
enum class OptionKey {
  kEnable,
  kLogLevel,
  kLogFile,
  kPeerPolicy,
  kPeerMinBytes,
  kConfig,
  kPeerEnableDriver,
  kCacheLimit,
  kStatsFile,
  kTraceFile,
  kIpc,
  kIpcDir,
  kCompression,
  kArenas,
  kSnapshotFile,
  kSnapshotEntries,
  kSnapshotStacks,
  kAttribution,
  kControl,
  kPinnedPool,
  kPausedAccess,
  kHostPoolMake,
  kHostPoolIdle,
  kHostPoolMax,
  kSleepLowersStack,
  kQuiesceTimeout,
  kStatsPid,  // the last: config.cc checks that the table has a row for each
};

struct OptionInfo {
  const char* name;           // the environment variable
  const char* type;           // "bool", "enum", "path"
  const char* default_value;  // as written in the variable
  const char* accepted;       // what a value may be
  const char* description;
  // Applies `value` to `config`; false when the value is malformed.
  bool (*apply)(absl::string_view value, int pid, Config* config);
  // A malformed value of a fatal option stops the program before any
  // allocation is served (a silently different peer policy can hang NVLink
  // collectives); other options fall back to their default.
  bool fatal;
  OptionKey key;
};

// The options table, in documentation order.
absl::Span<const OptionInfo> Options();

// The row of `key`.
const OptionInfo& Option(OptionKey key);

struct ParseResult {
  Config config;
  std::vector<std::string> problems;  // one line each, ready to log
  // Problems that must stop the program (malformed peer policy, size or
  // rules file), one line each naming the variable or FILE:LINE.
  std::vector<std::string> fatal_problems;
  // Defaults the environment changed, one line each (logged at info).
  std::vector<std::string> notes;
};

// Reads each option with `getenv` (nullptr = unset); `environ_names` lists
// the names of all variables present, to report unknown VMMSHIM_* ones.
// NCCL_CUMEM_HOST_ENABLE=0 with VMMSHIM_PAUSED_ACCESS unset makes it fault:
// that is how a user tells NCCL that making host VMM memory crashes or
// fails on this host (docs/pause-resume.md, "Touching paused memory").
ParseResult ParseConfig(absl::FunctionRef<const char*(const char*)> getenv,
                        absl::Span<const std::string> environ_names, int pid);

// ParseConfig over the process environment.
ParseResult ParseConfigFromEnvironment();

absl::string_view LogLevelName(LogLevel level);

// The statistics path of a child of the process VMMSHIM_STATS_PID names:
// `part` (its pid; "*" for a glob of them all) before the extension, or at
// the end ("run.json" -> "run.1234.json", "stats" -> "stats.1234").
std::string ChildStatsPath(absl::string_view path, absl::string_view part);

}  // namespace vmmshim

#endif  // VMMSHIM_CONFIG_CONFIG_H_
