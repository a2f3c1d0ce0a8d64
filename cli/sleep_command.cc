#include "cli/sleep_command.h"

#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <optional>
#include <set>
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

std::string ReplyError(const nlohmann::json& reply) {
  return reply.is_object() ? reply.value("error", std::string("no reason given"))
                           : std::string("no answer from the process");
}

// The reply of an op that must succeed: "" when it did, else why not.
std::string Ask(const ControlTarget& target, const nlohmann::json& request, int seconds,
                nlohmann::json* reply = nullptr) {
  absl::StatusOr<nlohmann::json> got = AskProcess(target, request, seconds);
  if (!got.ok()) return std::string(got.status().message());
  if (reply != nullptr) *reply = *got;
  return got->value("ok", false) ? "" : ReplyError(*got);
}

// The tags process `status` holds memory under (the shim's and other
// libraries' VMM memory), from its residency.
std::set<std::string> HeldTags(const nlohmann::json& status) {
  std::set<std::string> tags;
  const nlohmann::json residency = status.value("residency", nlohmann::json::object());
  if (!residency.is_object() || !residency.contains("devices") ||
      !residency.at("devices").is_array()) {
    return tags;
  }
  for (const nlohmann::json& d : residency.at("devices")) {
    if (!d.is_object()) continue;
    const nlohmann::json shim = d.value("shim", nlohmann::json::object());
    const nlohmann::json other = d.value("other_libraries_vmm", nlohmann::json::object());
    for (const nlohmann::json* by_tag :
         {&shim, &other}) {
      const nlohmann::json tags_of = by_tag->value("by_tag", nlohmann::json::object());
      if (!tags_of.is_object()) continue;
      for (const auto& [tag, unused] : tags_of.items()) tags.insert(tag);
    }
  }
  return tags;
}

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

// The process's control socket and its status reply, or why there are none.
nlohmann::json Status(int pid, const std::string& dir, ControlTarget* target, std::string* why) {
  absl::StatusOr<ControlTarget> found = FindControlSocket(pid, dir);
  if (!found.ok()) {
    *why = std::string(found.status().message());
    return nullptr;
  }
  *target = *found;
  absl::StatusOr<nlohmann::json> status = AskProcess(*target, {{"op", "status"}}, kStatusSeconds);
  if (!status.ok()) {
    *why = std::string(status.status().message());
    return nullptr;
  }
  if (!status->value("ok", false)) {
    *why = "the process refused: " + ReplyError(*status);
    return nullptr;
  }
  return *status;
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


}  // namespace

int SleepCommand(const std::vector<int>& pids, const std::vector<std::string>& drop_given,
                 const std::string& dir) {
  const auto start = std::chrono::steady_clock::now();
  const char* const nothing = pids.size() > 1 ? "; none of the processes paused"
                                              : "; nothing paused";
  // 0. Every process checked before any is paused.
  std::string why;
  for (size_t i = 0; i < pids.size(); ++i) {
    if (pids[i] <= 0) return Fail("sleep", pids[i], std::string("not a process id") + nothing);
    for (size_t j = 0; j < i; ++j) {
      if (pids[j] == pids[i]) return Fail("sleep", pids[i], std::string("given twice") + nothing);
    }
  }
  for (const std::string& tag : drop_given) {
    if (tag.empty()) {
      return Fail("sleep", pids.front(),
                  "--drop '': an empty tag (an unset variable?); untagged memory is dropped "
                  "only as --drop '(untagged)', as vmmshim ps names it" + std::string(nothing));
    }
    if (tag.size() > 255) {
      return Fail("sleep", pids.front(), "--drop: a tag of " + std::to_string(tag.size()) +
                                             " bytes; tags are at most 255 bytes" + nothing);
    }
  }
  // The untagged memory, as vmmshim ps names it, is the tag "".
  std::vector<std::string> drop;
  for (const std::string& tag : drop_given) drop.push_back(tag == "(untagged)" ? "" : tag);
  std::set<std::string> held;
  std::optional<DriverApi> d = CheckpointDriver(&why);
  if (!d) return Fail("sleep", pids.front(), why + nothing);
  std::vector<ControlTarget> targets(pids.size());
  for (size_t i = 0; i < pids.size(); ++i) {
    const int pid = pids[i];
    const nlohmann::json status = Status(pid, dir, &targets[i], &why);
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
    const std::set<std::string> tags = HeldTags(status);
    held.insert(tags.begin(), tags.end());
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
  // A --drop tag nobody holds is a typo, not "drop nothing".
  for (const std::string& tag : drop) {
    if (held.count(tag) == 0) {
      std::string known;
      for (const std::string& t : held) {
        known += (known.empty() ? "" : ", ") + (t.empty() ? "'(untagged)'" : "'" + t + "'");
      }
      return Fail("sleep", pids.front(),
                  "--drop '" + tag + "': no memory of " +
                      (pids.size() > 1 ? "these processes" : "the process") +
                      " has that tag (tags held: " + (known.empty() ? "none" : known) + ")" +
                      nothing);
    }
  }
  // Undoes the sleep of processes [0, n): back to running, resumed.
  auto undo = [&](size_t n) {
    std::string result;
    for (size_t i = 0; i < n; ++i) {
      std::string problem = BackToRunning(*d, pids[i]);
      if (problem.empty()) problem = Ask(targets[i], {{"op", "wake"}}, kPauseSeconds);
      result += "; process " + std::to_string(pids[i]) +
                (problem.empty() ? " resumed, running as before"
                                 : " not restored: " + problem + " (`vmmshim wake` tries again)");
    }
    return result;
  };
  // 1. Each process pauses what the shim holds.
  std::vector<nlohmann::json> paused;
  for (size_t i = 0; i < pids.size(); ++i) {
    nlohmann::json reply;
    if (std::string refused = Ask(targets[i], {{"op", "sleep"}, {"drop", drop}}, kPauseSeconds,
                                  &reply);
        !refused.empty()) {
      // The first one refused: nothing was paused (its reply says so for itself).
      return Fail("sleep", pids[i],
                  "the pause was refused: " + refused +
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
    Ask(targets[i], {{"op", "slept"}}, kStatusSeconds);
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
    ControlTarget target;
    const nlohmann::json status = Status(pid, dir, &target, &why);
    if (status.is_null()) {
      rc = Fail("wake", pid, why);
      continue;
    }
    if (status.value("state", std::string()) == "running") {
      // The shim runs, but the driver may still hold the process (a helper
      // killed between its lock and the process's resume): finish that.
      CUprocessState state;
      if (d->cuCheckpointProcessGetState(pid, &state) == CUDA_SUCCESS &&
          state != CU_PROCESS_STATE_RUNNING) {
        if (std::string problem = BackToRunning(*d, pid, &onto); !problem.empty()) {
          rc = Fail("wake", pid, problem);
        } else {
          std::printf("vmmshim wake %d: running: the driver had it %s; restored and unlocked "
                      "in %.3f s (the shim had nothing paused for a sleep)\n",
                      pid, state == CU_PROCESS_STATE_CHECKPOINTED ? "checkpointed" : "locked",
                      Since(start));
        }
        continue;
      }
      rc = Fail("wake", pid, "the process is running, not asleep; nothing done");
      continue;
    }
    if (std::string problem = BackToRunning(*d, pid, &onto); !problem.empty()) {
      rc = Fail("wake", pid, problem);
      continue;
    }
    const double restore_seconds = Since(start);
    nlohmann::json woke;
    if (std::string failed = Ask(target, {{"op", "wake"}}, kPauseSeconds, &woke);
        !failed.empty()) {
      rc = Fail("wake", pid, "the resume failed: " + failed);
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
