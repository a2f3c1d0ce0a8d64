// The driver's process checkpoint (cuCheckpointProcessGetState / Lock /
// Checkpoint / Restore / Unlock, cuda.h "CUDA_CHECKPOINT") on the simulated
// driver, between processes: the state of process PID is a file PID in
// SIMCUDA_CHECKPOINT_DIR (a state number; no file: running). On by default,
// so that `vmmshim sleep` can be tried without a GPU: a process watches its
// own file (read at most once a millisecond): while it says locked or
// checkpointed, every simulated driver call of the process waits, as the
// real driver blocks a locked process's CUDA calls. SIMCUDA_CHECKPOINT=0 in
// the caller's environment makes the calls return CUDA_ERROR_NOT_SUPPORTED
// (a driver without the feature). The contents of a
// checkpointed process stay where they are (nothing else can see them here).
// SIMCUDA_CHECKPOINT_FAIL=lock|checkpoint|restore|unlock makes that call fail
// with CUDA_ERROR_UNKNOWN, for the undo paths.
// SIMCUDA_CHECKPOINT_STALL=lock|checkpoint makes the caller wait 120 s after
// that step succeeds, for tests that kill the controller (vmmshim sleep)
// with its target left locked or checkpointed.
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "core/base/safe_file.h"
#include "tests/sim/sim_driver.h"

namespace vmmshim::sim {
namespace {

bool Supported() {
  const char* v = std::getenv("SIMCUDA_CHECKPOINT");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

std::string StatePath(int pid) {
  const char* dir = std::getenv("SIMCUDA_CHECKPOINT_DIR");
  return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/simcuda-checkpoint-" +
         std::to_string(pid);
}

// A state file counts only when a controller could have written it: a
// regular file of this user or root (another user's file planted in /tmp
// must not freeze the process).
CUprocessState ReadState(int pid) {
  absl::StatusOr<std::string> text = ReadRegularFile(StatePath(pid), 64);
  struct stat st;
  int state = CU_PROCESS_STATE_RUNNING;
  if (!text.ok() || lstat(StatePath(pid).c_str(), &st) != 0 ||
      (st.st_uid != geteuid() && st.st_uid != 0) || std::sscanf(text->c_str(), "%d", &state) != 1) {
    return CU_PROCESS_STATE_RUNNING;
  }
  return static_cast<CUprocessState>(state);
}

// Written as the shim writes its files (core/base/safe_file.h): never
// through a link planted at the name. False when refused.
bool WriteState(int pid, CUprocessState state) {
  if (state == CU_PROCESS_STATE_RUNNING) {
    std::remove(StatePath(pid).c_str());
    return true;
  }
  return ReplaceFile(StatePath(pid), std::to_string(static_cast<int>(state)) + "\n",
                     "simcuda checkpoint state")
      .ok();
}

// Whether the environment's `variable` names `step`.
bool Names(const char* variable, const char* step) {
  const char* v = std::getenv(variable);
  return v != nullptr && std::strcmp(v, step) == 0;
}

// A transition of process `pid` from `from` to `to`.
CUresult Step(int pid, const char* step, CUprocessState from, CUprocessState to) {
  if (!Supported()) return CUDA_ERROR_NOT_SUPPORTED;
  if (pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH)) return CUDA_ERROR_INVALID_VALUE;
  if (ReadState(pid) != from) return CUDA_ERROR_ILLEGAL_STATE;
  if (Names("SIMCUDA_CHECKPOINT_FAIL", step)) return CUDA_ERROR_UNKNOWN;
  if (!WriteState(pid, to)) return CUDA_ERROR_OPERATING_SYSTEM;
  if (Names("SIMCUDA_CHECKPOINT_STALL", step)) {
    std::this_thread::sleep_for(std::chrono::seconds(120));
  }
  return CUDA_SUCCESS;
}

}  // namespace

void WaitWhileCheckpointLocked() {
  static const bool watched = Supported();
  if (!watched) return;
  // The state file is read at most once a millisecond, so that a program's
  // millions of calls stay cheap; a lock is seen within that.
  static std::atomic<int64_t> next_check_ns{0};
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  if (now < next_check_ns.load(std::memory_order_relaxed)) return;
  next_check_ns.store(now + 1000000, std::memory_order_relaxed);
  const int self = getpid();
  while (ReadState(self) != CU_PROCESS_STATE_RUNNING) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

CUresult cuCheckpointProcessGetState(int pid, CUprocessState* state) {
  if (!Supported()) return CUDA_ERROR_NOT_SUPPORTED;
  if (state == nullptr || pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *state = ReadState(pid);
  return CUDA_SUCCESS;
}

CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs*) {
  return Step(pid, "lock", CU_PROCESS_STATE_RUNNING, CU_PROCESS_STATE_LOCKED);
}

CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs*) {
  return Step(pid, "checkpoint", CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_CHECKPOINTED);
}

CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs* args) {
  // GPU pairs: one device here, restored onto itself whatever they say.
  if (args != nullptr && args->gpuPairsCount > 0 && args->gpuPairs == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return Step(pid, "restore", CU_PROCESS_STATE_CHECKPOINTED, CU_PROCESS_STATE_LOCKED);
}

CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs*) {
  return Step(pid, "unlock", CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_RUNNING);
}

}  // namespace vmmshim::sim
