#include "cli/sleep_command.h"

#include <cuda.h>
#include <dlfcn.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include "cli/control_client.h"
#include "core/driver/driver_api.h"
#include "nlohmann/json.hpp"

namespace vmmshim::cli {
namespace {

constexpr int kStatusSeconds = 5;
// A pause or resume of a whole process copies its kept contents.
constexpr int kPauseSeconds = 600;
constexpr unsigned kLockTimeoutMs = 10000;

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int Fail(const char* command, int pid, const std::string& why) {
  std::fprintf(stderr, "vmmshim %s %d: %s\n", command, pid, why.c_str());
  return 1;
}

const char* CuName(const DriverApi& d, CUresult r) {
  const char* name = nullptr;
  if (d.cuGetErrorName == nullptr || d.cuGetErrorName(r, &name) != CUDA_SUCCESS) return "?";
  return name;
}

// The driver with the checkpoint calls, initialized; or why not.
std::optional<DriverApi> CheckpointDriver(std::string* why) {
  void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (libcuda == nullptr) {
    *why = "cannot open libcuda.so.1 (no NVIDIA driver here)";
    return std::nullopt;
  }
  DriverApi d = LoadDriverApi(libcuda, [](void* h, const char* name) { return dlsym(h, name); });
  if (d.cuInit == nullptr || d.cuCheckpointProcessGetState == nullptr ||
      d.cuCheckpointProcessLock == nullptr || d.cuCheckpointProcessCheckpoint == nullptr ||
      d.cuCheckpointProcessRestore == nullptr || d.cuCheckpointProcessUnlock == nullptr) {
    *why = "the driver has no cuCheckpointProcess* calls (a CUDA 12.8 driver, r570, or later "
           "is needed)";
    return std::nullopt;
  }
  if (CUresult r = d.cuInit(0); r != CUDA_SUCCESS) {
    *why = std::string("cuInit: ") + CuName(d, r);
    return std::nullopt;
  }
  return d;
}

// The process's status reply, or why there is none.
nlohmann::json Status(const std::string& path, int pid, std::string* why) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    *why = "no control socket " + path + ": the process is not running under vmmshim for " +
           "this user, has not made a CUDA call yet, or runs with VMMSHIM_CONTROL=0";
    return nullptr;
  }
  nlohmann::json status = AskProcess(path, {{"op", "status"}}, kStatusSeconds);
  if (!status.is_object() || !status.value("ok", false)) {
    *why = "the process does not answer on " + path;
    return nullptr;
  }
  return status;
}

std::string ReplyError(const nlohmann::json& reply) {
  return reply.is_object() ? reply.value("error", std::string("no reason given"))
                           : std::string("no answer from the process");
}

}  // namespace

int SleepCommand(int pid, const std::vector<std::string>& drop, const std::string& dir) {
  const auto start = std::chrono::steady_clock::now();
  const std::string path = ControlSocketPath(dir, pid);
  std::string why;
  const nlohmann::json status = Status(path, pid, &why);
  if (status.is_null()) return Fail("sleep", pid, why);
  if (status.value("state", std::string()) != "running") {
    return Fail("sleep", pid, "the process is " + status.value("state", std::string("?")) +
                                  " already; nothing done");
  }
  std::optional<DriverApi> d = CheckpointDriver(&why);
  if (!d) return Fail("sleep", pid, why + "; nothing paused");
  CUprocessState state;
  if (CUresult r = d->cuCheckpointProcessGetState(pid, &state); r != CUDA_SUCCESS) {
    return Fail("sleep", pid,
                std::string("cuCheckpointProcessGetState: ") + CuName(*d, r) + "; nothing paused");
  }
  if (state != CU_PROCESS_STATE_RUNNING) {
    return Fail("sleep", pid, "the driver says the process is not running (state " +
                                  std::to_string(state) + "); nothing paused");
  }
  // 1. The process pauses what the shim holds.
  nlohmann::json request = {{"op", "sleep"}, {"drop", drop}};
  const nlohmann::json paused = AskProcess(path, request, kPauseSeconds);
  if (!paused.is_object() || !paused.value("ok", false)) {
    return Fail("sleep", pid, "the pause was refused: " + ReplyError(paused));
  }
  // 2. The driver locks it and checkpoints the rest; undone on failure.
  const auto checkpoint_start = std::chrono::steady_clock::now();
  CUcheckpointLockArgs lock_args = {};
  lock_args.timeoutMs = kLockTimeoutMs;
  std::string failed;
  if (CUresult r = d->cuCheckpointProcessLock(pid, &lock_args); r != CUDA_SUCCESS) {
    failed = std::string("cuCheckpointProcessLock: ") + CuName(*d, r);
  } else {
    CUcheckpointCheckpointArgs args = {};
    if (CUresult c = d->cuCheckpointProcessCheckpoint(pid, &args); c != CUDA_SUCCESS) {
      failed = std::string("cuCheckpointProcessCheckpoint: ") + CuName(*d, c);
      CUcheckpointUnlockArgs unlock = {};
      if (CUresult u = d->cuCheckpointProcessUnlock(pid, &unlock); u != CUDA_SUCCESS) {
        failed += std::string("; cuCheckpointProcessUnlock: ") + CuName(*d, u) +
                  " (the process stays locked: `vmmshim wake` tries again)";
        return Fail("sleep", pid, failed);
      }
    }
  }
  if (!failed.empty()) {
    const nlohmann::json woke = AskProcess(path, {{"op", "wake"}}, kPauseSeconds);
    const std::string undo = woke.is_object() && woke.value("ok", false)
                                 ? "resumed, running as before"
                                 : "its resume failed too: " + ReplyError(woke) +
                                       " (`vmmshim wake` tries again)";
    return Fail("sleep", pid, failed + "; the process was " + undo);
  }
  const double checkpoint_seconds = Since(checkpoint_start);
  AskProcess(path, {{"op", "slept"}}, kStatusSeconds);
  std::printf("vmmshim sleep %d: asleep: paused %llu bytes in %.3f s, the driver's checkpoint "
              "%.3f s; %.3f s in all\n",
              pid, static_cast<unsigned long long>(paused.value("released_bytes", uint64_t{0})),
              paused.value("seconds", 0.0), checkpoint_seconds, Since(start));
  return 0;
}

int WakeCommand(int pid, const std::string& dir) {
  const auto start = std::chrono::steady_clock::now();
  const std::string path = ControlSocketPath(dir, pid);
  std::string why;
  const nlohmann::json status = Status(path, pid, &why);
  if (status.is_null()) return Fail("wake", pid, why);
  if (status.value("state", std::string()) == "running") {
    return Fail("wake", pid, "the process is running, not asleep; nothing done");
  }
  std::optional<DriverApi> d = CheckpointDriver(&why);
  if (!d) return Fail("wake", pid, why);
  CUprocessState state;
  if (CUresult r = d->cuCheckpointProcessGetState(pid, &state); r != CUDA_SUCCESS) {
    return Fail("wake", pid, std::string("cuCheckpointProcessGetState: ") + CuName(*d, r));
  }
  const auto restore_start = std::chrono::steady_clock::now();
  if (state == CU_PROCESS_STATE_CHECKPOINTED) {
    CUcheckpointRestoreArgs args = {};
    if (CUresult r = d->cuCheckpointProcessRestore(pid, &args); r != CUDA_SUCCESS) {
      return Fail("wake", pid, std::string("cuCheckpointProcessRestore: ") + CuName(*d, r) +
                                   "; the process stays asleep");
    }
    state = CU_PROCESS_STATE_LOCKED;
  }
  if (state == CU_PROCESS_STATE_LOCKED) {
    CUcheckpointUnlockArgs args = {};
    if (CUresult r = d->cuCheckpointProcessUnlock(pid, &args); r != CUDA_SUCCESS) {
      return Fail("wake", pid, std::string("cuCheckpointProcessUnlock: ") + CuName(*d, r) +
                                   "; the process stays locked");
    }
  } else if (state != CU_PROCESS_STATE_RUNNING) {
    return Fail("wake", pid, "the driver says the checkpoint failed (state " +
                                 std::to_string(state) + ")");
  }
  const double restore_seconds = Since(restore_start);
  const nlohmann::json woke = AskProcess(path, {{"op", "wake"}}, kPauseSeconds);
  if (!woke.is_object() || !woke.value("ok", false)) {
    return Fail("wake", pid, "the resume failed: " + ReplyError(woke));
  }
  std::printf("vmmshim wake %d: running: the driver's restore and unlock %.3f s, resumed %llu "
              "bytes in %.3f s; %.3f s in all\n",
              pid, restore_seconds,
              static_cast<unsigned long long>(woke.value("restored_bytes", uint64_t{0})),
              woke.value("seconds", 0.0), Since(start));
  return 0;
}

}  // namespace vmmshim::cli
