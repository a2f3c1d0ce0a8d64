#include "cli/sleep_command.h"

#include <cuda.h>
#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
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

// The driver's side of a wake: restored when checkpointed, unlocked when
// locked. "" when the process runs again (as far as the driver goes); else
// the problem.
std::string BackToRunning(const DriverApi& d, int pid,
                          std::vector<CUcheckpointGpuPair>* onto = nullptr) {
  CUprocessState state;
  if (CUresult r = d.cuCheckpointProcessGetState(pid, &state); r != CUDA_SUCCESS) {
    return std::string("cuCheckpointProcessGetState: ") + CuName(d, r);
  }
  if (state == CU_PROCESS_STATE_CHECKPOINTED) {
    CUcheckpointRestoreArgs args = {};
    if (onto != nullptr && !onto->empty()) {
      args.gpuPairs = onto->data();
      args.gpuPairsCount = static_cast<unsigned>(onto->size());
    }
    if (CUresult r = d.cuCheckpointProcessRestore(pid, &args); r != CUDA_SUCCESS) {
      return std::string("cuCheckpointProcessRestore: ") + CuName(d, r) +
             "; the process stays asleep";
    }
    state = CU_PROCESS_STATE_LOCKED;
  }
  if (state == CU_PROCESS_STATE_LOCKED) {
    CUcheckpointUnlockArgs args = {};
    if (CUresult r = d.cuCheckpointProcessUnlock(pid, &args); r != CUDA_SUCCESS) {
      return std::string("cuCheckpointProcessUnlock: ") + CuName(d, r) +
             "; the process stays locked";
    }
    return "";
  }
  if (state != CU_PROCESS_STATE_RUNNING) {
    return "the driver says the checkpoint failed (state " + std::to_string(state) + ")";
  }
  return "";
}

std::string ReplyError(const nlohmann::json& reply) {
  return reply.is_object() ? reply.value("error", std::string("no reason given"))
                           : std::string("no answer from the process");
}

}  // namespace

int SleepCommand(const std::vector<int>& pids, const std::vector<std::string>& drop,
                 const std::string& dir) {
  const auto start = std::chrono::steady_clock::now();
  const char* const nothing = pids.size() > 1 ? "; none of the processes paused"
                                              : "; nothing paused";
  // 0. Every process checked before any is paused.
  std::string why;
  std::optional<DriverApi> d = CheckpointDriver(&why);
  if (!d) return Fail("sleep", pids.front(), why + nothing);
  std::vector<std::string> paths;
  for (int pid : pids) {
    paths.push_back(ControlSocketPath(dir, pid));
    const nlohmann::json status = Status(paths.back(), pid, &why);
    if (status.is_null()) return Fail("sleep", pid, why + nothing);
    if (status.value("state", std::string()) != "running") {
      return Fail("sleep", pid, "the process is " + status.value("state", std::string("?")) +
                                    " already" + nothing);
    }
    // What its own sleep would refuse (memory shared with another process,
    // memory paused of its own), asked before any process pauses.
    if (const auto refusal = status.find("sleep_refusal");
        refusal != status.end() && refusal->is_string()) {
      return Fail("sleep", pid, "the pause was refused: " + refusal->get<std::string>() +
                                    (pids.size() > 1 ? nothing : ""));
    }
    CUprocessState state;
    if (CUresult r = d->cuCheckpointProcessGetState(pid, &state); r != CUDA_SUCCESS) {
      return Fail("sleep", pid,
                  std::string("cuCheckpointProcessGetState: ") + CuName(*d, r) + nothing);
    }
    if (state != CU_PROCESS_STATE_RUNNING) {
      return Fail("sleep", pid, "the driver says the process is not running (state " +
                                    std::to_string(state) + ")" + nothing);
    }
  }
  // Undoes the sleep of processes [0, n): back to running, resumed.
  auto undo = [&](size_t n) {
    std::string result;
    for (size_t i = 0; i < n; ++i) {
      std::string problem = BackToRunning(*d, pids[i]);
      if (problem.empty()) {
        const nlohmann::json woke = AskProcess(paths[i], {{"op", "wake"}}, kPauseSeconds);
        if (!woke.is_object() || !woke.value("ok", false)) problem = ReplyError(woke);
      }
      result += "; process " + std::to_string(pids[i]) +
                (problem.empty() ? " resumed, running as before"
                                 : " not restored: " + problem + " (`vmmshim wake` tries again)");
    }
    return result;
  };
  // 1. Each process pauses what the shim holds.
  std::vector<nlohmann::json> paused;
  for (size_t i = 0; i < pids.size(); ++i) {
    nlohmann::json reply = AskProcess(paths[i], {{"op", "sleep"}, {"drop", drop}}, kPauseSeconds);
    if (!reply.is_object() || !reply.value("ok", false)) {
      // The first one refused: nothing was paused (its reply says so for itself).
      return Fail("sleep", pids[i],
                  "the pause was refused: " + ReplyError(reply) +
                      (i == 0 ? std::string(pids.size() > 1 ? nothing : "") : undo(i)));
    }
    paused.push_back(std::move(reply));
  }
  // 2. The driver locks each, then checkpoints each; undone on a failure.
  const auto checkpoint_start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < pids.size(); ++i) {
    CUcheckpointLockArgs lock_args = {};
    lock_args.timeoutMs = kLockTimeoutMs;
    if (CUresult r = d->cuCheckpointProcessLock(pids[i], &lock_args); r != CUDA_SUCCESS) {
      return Fail("sleep", pids[i],
                  std::string("cuCheckpointProcessLock: ") + CuName(*d, r) + undo(pids.size()));
    }
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    CUcheckpointCheckpointArgs args = {};
    if (CUresult r = d->cuCheckpointProcessCheckpoint(pids[i], &args); r != CUDA_SUCCESS) {
      return Fail("sleep", pids[i], std::string("cuCheckpointProcessCheckpoint: ") +
                                        CuName(*d, r) + undo(pids.size()));
    }
  }
  const double checkpoint_seconds = Since(checkpoint_start);
  for (size_t i = 0; i < pids.size(); ++i) {
    AskProcess(paths[i], {{"op", "slept"}}, kStatusSeconds);
    std::printf("vmmshim sleep %d: asleep: paused %llu bytes in %.3f s, the driver's checkpoint "
                "%.3f s; %.3f s in all\n",
                pids[i],
                static_cast<unsigned long long>(paused[i].value("released_bytes", uint64_t{0})),
                paused[i].value("seconds", 0.0), checkpoint_seconds, Since(start));
  }
  return 0;
}

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (nvidia-smi -L's form) as a CUuuid.
static bool ParseUuid(std::string text, CUuuid* out) {
  if (text.rfind("GPU-", 0) == 0) text = text.substr(4);
  text.erase(std::remove(text.begin(), text.end(), '-'), text.end());
  if (text.size() != 32) return false;
  for (int i = 0; i < 16; ++i) {
    unsigned v = 0;
    if (std::sscanf(text.c_str() + 2 * i, "%2x", &v) != 1 ||
        !std::isxdigit(static_cast<unsigned char>(text[2 * i])) ||
        !std::isxdigit(static_cast<unsigned char>(text[2 * i + 1]))) {
      return false;
    }
    out->bytes[i] = static_cast<char>(v);
  }
  return true;
}

int WakeCommand(const std::vector<int>& pids, const std::vector<std::string>& onto_pairs,
                const std::string& dir) {
  // OLD=NEW GPU pairs for the driver's restore, checked before anything is done.
  std::vector<CUcheckpointGpuPair> onto;
  for (const std::string& pair : onto_pairs) {
    const size_t eq = pair.find('=');
    CUcheckpointGpuPair p = {};
    if (eq == std::string::npos || !ParseUuid(pair.substr(0, eq), &p.oldUuid) ||
        !ParseUuid(pair.substr(eq + 1), &p.newUuid)) {
      return Fail("wake", pids.front(), "--onto " + pair + ": not OLD=NEW GPU UUIDs (as "
                                        "nvidia-smi -L prints them: GPU-xxxxxxxx-xxxx-...); "
                                        "nothing done");
    }
    onto.push_back(p);
  }
  std::string why;
  std::optional<DriverApi> d = CheckpointDriver(&why);
  if (!d) return Fail("wake", pids.front(), why);
  int rc = 0;
  for (int pid : pids) {
    const auto start = std::chrono::steady_clock::now();
    const std::string path = ControlSocketPath(dir, pid);
    const nlohmann::json status = Status(path, pid, &why);
    if (status.is_null()) {
      rc = Fail("wake", pid, why);
      continue;
    }
    if (status.value("state", std::string()) == "running") {
      rc = Fail("wake", pid, "the process is running, not asleep; nothing done");
      continue;
    }
    if (std::string problem = BackToRunning(*d, pid, &onto); !problem.empty()) {
      rc = Fail("wake", pid, problem);
      continue;
    }
    const double restore_seconds = Since(start);
    const nlohmann::json woke = AskProcess(path, {{"op", "wake"}}, kPauseSeconds);
    if (!woke.is_object() || !woke.value("ok", false)) {
      rc = Fail("wake", pid, "the resume failed: " + ReplyError(woke));
      continue;
    }
    std::printf("vmmshim wake %d: running: the driver's restore and unlock %.3f s, resumed %llu "
                "bytes in %.3f s; %.3f s in all\n",
                pid, restore_seconds,
                static_cast<unsigned long long>(woke.value("restored_bytes", uint64_t{0})),
                woke.value("seconds", 0.0), Since(start));
  }
  return rc;
}

}  // namespace vmmshim::cli
