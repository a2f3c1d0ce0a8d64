// The shim's process-wide state, created on the first hooked driver call
// (never in a constructor and never inside dlsym, where other interposers
// have hung: docs/architecture.md).
//
// Initialization parses the VMMSHIM_* settings (a malformed peer-access
// setting stops the program here, with one line on stderr and exit status 1,
// before any allocation is served), configures logging, opens
// libcuda.so.1 (no DT_NEEDED: a process that never touches CUDA never loads
// it), fills the DriverApi table with the real dlsym and builds core/'s
// rooms (core/shim_core.h). Nothing created here is ever destroyed, because hooks can run
// from other libraries' destructors at exit.
#ifndef VMMSHIM_INTERPOSE_RUNTIME_H_
#define VMMSHIM_INTERPOSE_RUNTIME_H_

#include "config/config.h"
#include "core/allocator.h"
#include "core/shim_core.h"
#include "core/driver/driver_api.h"
#include "core/control/control_server.h"
#include "core/control/process_control.h"
#include "core/ipc/ipc.h"
#include "core/lifecycle/stack_reservation.h"
#include "core/peer/enable/peer_contexts.h"
#include "core/history/caller_library.h"
#include "core/history/memory_history.h"
#include "core/report/trace.h"
#include "core/sleep/sleep_coordinator.h"
#include "core/sleep/work_quiescer.h"
#include "core/sync/submission_gate.h"

namespace vmmshim {

// True in a child process after fork() of a process whose shim had started.
bool InForkedChild();

// Called after each served allocation; the first call registers the exit
// handler that gives the shim's cache back to the driver (runtime.cc says
// why then).
void ArmExitRelease();

struct Runtime {
  DriverApi driver;            // the real entry points (routing, pass-through)
  DriverApi allocator_driver;  // what the allocator calls (counted when stats are on)
  Config config;
  ShimCore* core = nullptr;        // every room of core/; nullptr: pass-through
  Allocator* allocator = nullptr;  // &core->allocator(), for the hooks' hot path
  mutable PeerContexts peer_contexts;  // used when VMMSHIM_PEER_ENABLE_DRIVER=0
  TraceWriter* trace = nullptr;        // VMMSHIM_TRACE_FILE, else nullptr
  Ipc* ipc = nullptr;                  // VMMSHIM_IPC=1, else nullptr
  ControlServer* control = nullptr;    // VMMSHIM_CONTROL=1, else nullptr
  // The contexts' stack reservation, lowered by a deep sleep (with control
  // and VMMSHIM_SLEEP_LOWERS_STACK=1, else nullptr).
  StackReservation* stack_reservation = nullptr;
  // VMMSHIM_ATTRIBUTION=1: who allocated (core/history/caller_library.h), else nullptr.
  CallerLibraries* callers = nullptr;
  // The memory history (core/history/memory_history.h), whenever the shim
  // serves; it records from the start with VMMSHIM_SNAPSHOT_FILE, or from
  // vmmshim_record_memory_history.
  MemoryHistory* history = nullptr;
  // The gate every work-submitting entry point passes (interpose/
  // hooks_submission.cc), what closes it, and the owner of the pauses and
  // sleeps that quiesce first; whenever the shim serves, else nullptr.
  SubmissionGate* gate = nullptr;
  WorkQuiescer* quiescer = nullptr;
  SleepCoordinator* sleeper = nullptr;
  int pid = 0;
  // In a child after fork() the inherited state names the parent's driver
  // objects, which the child cannot use: every call passes through, and the
  // driver answers as it does in a forked child.
  bool enabled() const { return allocator != nullptr && !InForkedChild(); }
};


// Writes the memory snapshot of `rt` to `path` (core/report/memory_snapshot.h);
// the error names the path and the reason.
absl::Status WriteSnapshot(const Runtime& rt, const std::string& path);

// The runtime, initialized on first call; nullptr when libcuda.so.1 cannot
// be opened (then no driver call can have reached us legitimately).
const Runtime* GetRuntime();

using DlsymFunction = void* (*)(void*, const char*);

// glibc's dlsym, found with dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34") (or
// GLIBC_2.2.5 on older glibc). Safe to call from inside dlsym: no locks of
// ours, no allocation.
DlsymFunction RealDlsym();

}  // namespace vmmshim

#endif  // VMMSHIM_INTERPOSE_RUNTIME_H_
