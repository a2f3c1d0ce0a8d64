#include "interpose/runtime.h"

#include "interpose/hooks_internal.h"

#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstdlib>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/base/safe_file.h"
#include "core/driver/cu_status.h"
#include "core/driver/driver_stats.h"
#include "core/base/log.h"
#include "core/report/memory_snapshot.h"
#include "core/report/residency.h"
#include "core/report/stats_report.h"
#include "core/base/version.h"
#include "vmmshim/vmmshim.h"

namespace vmmshim {
namespace {

spdlog::level::level_enum SpdlogLevel(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return spdlog::level::trace;
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarn: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
    case LogLevel::kOff: return spdlog::level::off;
  }
  return spdlog::level::warn;
}

const Runtime* g_runtime_for_exit = nullptr;
std::atomic<bool> g_forked_child{false};

// fork(): no lock of ours may be held by another thread at the fork, or the
// child would wait on it forever. Taken in lock order: IPC, allocator, log.
void PrepareFork() {
  const Runtime* rt = g_runtime_for_exit;
  if (rt->ipc != nullptr) rt->ipc->PrepareFork();
  rt->core->PrepareFork();
  rt->history->PrepareFork();  // a leaf, taken under arena mutexes: after them
  PrepareLogForFork();
}
void AfterForkParent() {
  const Runtime* rt = g_runtime_for_exit;
  AfterLogFork();
  rt->history->AfterForkParent();
  rt->core->AfterFork(false);
  if (rt->ipc != nullptr) rt->ipc->AfterForkParent();
}
void AfterForkChild() {
  const Runtime* rt = g_runtime_for_exit;
  AfterLogFork();
  rt->history->AfterForkChild();
  rt->core->AfterFork(true);
  if (rt->ipc != nullptr) rt->ipc->AfterForkChild();
  // The thread that closed the gate is not in the child: nothing would open it.
  if (rt->gate != nullptr) rt->gate->AfterForkChild();
  g_forked_child.store(true, std::memory_order_release);
}

// VMMSHIM_SNAPSHOT_FILE at exit, once: before the shim gives its cache back
// (ReleaseCacheAtExit), so that the snapshot shows the process as it ran,
// not the shim's teardown; from ExitReport when that never ran.
void WriteExitSnapshot(const Runtime& rt) {
  static std::atomic<bool> written{false};
  if (rt.config.snapshot_file.empty() || written.exchange(true)) return;
  absl::Status status = WriteSnapshot(rt, rt.config.snapshot_file);
  if (status.ok()) {
    Log().info("memory snapshot written to {}", rt.config.snapshot_file);
  } else {
    Log().warn("{}", std::string(status.message()));
  }
}

void ExitReport() {
  const Runtime* rt = g_runtime_for_exit;
  // A forked child holds a copy of the parent's state: the parent reports.
  if (rt == nullptr || rt->allocator == nullptr || InForkedChild()) return;
  Log().info("exit report: {}; vmmshim {}", ExitSummary(rt->core->control()), VMMSHIM_VERSION);
  if (rt->trace != nullptr) rt->trace->Flush();
  if (!rt->config.stats_file.empty()) {
    absl::Status written = WriteStatsFile(rt->core->control(), rt->pid, rt->config.stats_file);
    if (written.ok()) {
      Log().info("statistics written to {}", rt->config.stats_file);
    } else {
      Log().warn("{}", std::string(written.message()));
    }
  }
  WriteExitSnapshot(*rt);
}

// Whether a snapshot can be written at `path`: the file that would replace
// it is begun and dropped (core/base/safe_file.h); the reason when not.
absl::Status CheckWritable(const std::string& path) {
  absl::StatusOr<FileReplacement> probe = FileReplacement::Begin(path, 0600);
  if (!probe.ok()) {
    return absl::UnavailableError(absl::StrCat("VMMSHIM_SNAPSHOT_FILE: ", probe.status().message(),
                                               "; no memory snapshot will be written"));
  }
  return absl::OkStatus();
}

// Memory the shim keeps for reuse goes back to the driver before the driver
// tears down, so leak checkers (compute-sanitizer --leak-check) see only
// what the application itself did not free; the host memory kept for pauses
// too, after the one being made in the background is done (no driver call
// of the shim's runs on into the driver's teardown). Registered at the first served
// allocation, which comes after cuInit and cudart's own start-up: atexit
// handlers run in reverse order, so this one runs before the driver's and
// cudart's teardown (registered at start-up, the shim's first call is
// earlier still).
void ReleaseCacheAtExit() {
  const Runtime* rt = g_runtime_for_exit;
  if (rt == nullptr || rt->allocator == nullptr || InForkedChild()) return;
  WriteExitSnapshot(*rt);
  const size_t released = rt->core->control().Trim(-1);
  if (released > 0) Log().debug("released {} cached bytes at exit", released);
  const size_t host = rt->core->pause().ReleaseHostMemoryForGood();
  if (host > 0) Log().debug("released {} bytes of host memory kept for pauses at exit", host);
}

const Runtime* Initialize() {
  // Whatever build of abseil is linked in: no process-wide deadlock graph
  // behind every Lock (it serializes threads on different mutexes;
  // tools/build/build-abseil.sh builds with NDEBUG, where this is the default).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  ParseResult parsed = ParseConfigFromEnvironment();
  if (!parsed.fatal_problems.empty()) {
    // Running on with another peer policy than intended can make NVLink
    // collectives hang silently; stop before serving any allocation.
    for (const std::string& problem : parsed.fatal_problems) {
      std::fprintf(stderr, "[vmmshim %d] error: %s; stopping before any allocation is served\n",
                   getpid(), problem.c_str());
    }
    std::fflush(stderr);
    _exit(1);
  }
  absl::Status log_status =
      ConfigureLog(SpdlogLevel(parsed.config.log_level), parsed.config.log_file);
  if (!log_status.ok()) Log().warn("{}", std::string(log_status.message()));
  for (const std::string& problem : parsed.problems) Log().warn("{}", problem);
  for (const std::string& note : parsed.notes) Log().info("{}", note);

  void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (libcuda == nullptr) libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (libcuda == nullptr) {
    const char* why = dlerror();
    Log().error("cannot open libcuda.so.1 ({}); driver calls fail", why ? why : "?");
    return nullptr;
  }
  auto* rt = new Runtime;
  rt->pid = getpid();
  rt->config = parsed.config;
  rt->driver = LoadDriverApi(libcuda, RealDlsym());
  absl::Status complete = CheckRequired(rt->driver);
  int version = 0;
  if (rt->driver.cuDriverGetVersion != nullptr) rt->driver.cuDriverGetVersion(&version);
  if (!complete.ok()) {
    Log().warn("{}; vmmshim passes every call through", std::string(complete.message()));
  } else if (!rt->config.enable) {
    Log().info("VMMSHIM_ENABLE=0: pass-through, driver {}", version);
  } else {
    // Driver calls are counted and timed only for a statistics file.
    rt->allocator_driver =
        rt->config.stats_file.empty() ? rt->driver : InstrumentDriverApi(rt->driver);
    AllocatorOptions options;
    options.peer_policy = rt->config.peer_policy;
    options.cache_limit_percent = rt->config.cache_limit_percent;
    options.cache_limit_bytes = rt->config.cache_limit_bytes;
    options.exportable = rt->config.ipc;
    options.compression = rt->config.compression;
    options.arenas = rt->config.arenas;
    options.pinned_pool_bytes = rt->config.pinned_pool_bytes;
    options.paused_memory_addressable = rt->config.paused_memory_addressable;
    options.host_pool_idle_seconds = rt->config.host_pool_idle_seconds;
    options.host_memory_in_background = rt->config.host_memory_in_background;
    options.host_pool_max_bytes = rt->config.host_pool_max_bytes;
    rt->history = new MemoryHistory;
    options.history = rt->history;
    if (rt->config.attribution) rt->callers = new CallerLibraries;
    if (!rt->config.snapshot_file.empty()) {
      if (absl::Status writable = CheckWritable(rt->config.snapshot_file); writable.ok()) {
        rt->history->Enable(rt->config.snapshot_entries, rt->config.snapshot_stacks);
      } else {
        Log().warn("{}", std::string(writable.message()));
        rt->config.snapshot_file.clear();
      }
    }
    rt->core = new ShimCore(rt->allocator_driver, options);
    rt->allocator = &rt->core->allocator();
    if (rt->config.ipc) rt->ipc = new Ipc(rt->allocator_driver, rt->core->control(), rt->config.ipc_dir);
    rt->gate = new SubmissionGate;
    PrepareGatedHooks();
    rt->quiescer = new WorkQuiescer(rt->allocator_driver, *rt->gate, rt->core->captures(),
                                    std::chrono::milliseconds(rt->config.quiesce_timeout_ms));
    if (rt->config.control && rt->config.sleep_lowers_stack) {
      rt->stack_reservation = new StackReservation(rt->allocator_driver);
    }
    rt->sleeper = new SleepCoordinator(rt->core->pause(), *rt->quiescer,
                                       rt->stack_reservation, rt->history);
    if (rt->config.control) {
      // The real entry points for the residency's used memory (uncounted).
      auto* target = new ProcessControl(rt->driver, rt->core->control(), rt->core->pause(),
                                        *rt->sleeper, rt->ipc);
      rt->control = new ControlServer(rt->config.ipc_dir, *target);
      rt->control->Start().IgnoreError();  // logged; the program runs on without it
    }
    if (!rt->config.trace_file.empty()) {
      auto* trace = new TraceWriter;
      absl::Status opened = trace->Open(rt->config.trace_file);
      if (opened.ok()) {
        rt->trace = trace;
      } else {
        Log().warn("{}", std::string(opened.message()));
        delete trace;
      }
    }
    Log().info("serving device allocations from VMM (driver {}, log level {})", version,
               std::string(LogLevelName(rt->config.log_level)));
    // The policy in force, once, at info: it is the user's own choice.
    Log().info("peer-access policy: {}{}", rt->config.peer_policy.Describe(),
              rt->config.peer_enable_driver ? "" : "; cuCtxEnablePeerAccess does not reach the driver");
  }
  g_runtime_for_exit = rt;
  std::atexit(&ExitReport);
  // After libcuda's own handlers (it is loaded by now), so that ours run
  // first at the fork: a thread of ours may be inside a driver call.
  if (rt->allocator != nullptr) pthread_atfork(&PrepareFork, &AfterForkParent, &AfterForkChild);
  return rt;
}

}  // namespace

bool InForkedChild() { return g_forked_child.load(std::memory_order_relaxed); }

absl::Status WriteSnapshot(const Runtime& rt, const std::string& path) {
  SnapshotSources sources;
  sources.control = &rt.core->control();
  sources.history = rt.history;
  sources.libraries = rt.callers;
  sources.pid = rt.pid;
  return WriteMemorySnapshot(sources, path);
}

void ArmExitRelease() {
  static std::atomic<bool> armed{false};
  if (!armed.load(std::memory_order_relaxed) && !armed.exchange(true)) {
    std::atexit(&ReleaseCacheAtExit);
  }
}

const Runtime* GetRuntime() {
  static const Runtime* runtime = Initialize();
  return runtime;
}

DlsymFunction RealDlsym() {
  static std::atomic<DlsymFunction> real{nullptr};
  DlsymFunction fn = real.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = reinterpret_cast<DlsymFunction>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"));
    if (fn == nullptr) {
      fn = reinterpret_cast<DlsymFunction>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5"));
    }
    real.store(fn, std::memory_order_release);
  }
  return fn;
}

}  // namespace vmmshim
