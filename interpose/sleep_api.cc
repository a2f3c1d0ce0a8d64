// vmmshim_sleep and vmmshim_wake (include/vmmshim/vmmshim.h): a process's
// deep sleep from C, by running `vmmshim sleep` / `vmmshim wake` on its own
// pid (cli/sleep_command.h), since the driver's checkpoint calls are for an
// external controller (docs/deep-sleep.md). The command is found next to
// this library (a build tree: build/vmmshim beside build/libvmmshim.so; an
// install or the wheel: ../bin/vmmshim).
#include <dlfcn.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "core/base/log.h"
#include "interpose/hooks_internal.h"
#include "vmmshim/vmmshim.h"

extern char** environ;

namespace {

std::string Command() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&vmmshim_sleep), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  std::string dir = info.dli_fname;
  dir = dir.substr(0, dir.rfind('/') == std::string::npos ? 0 : dir.rfind('/'));
  if (dir.empty()) dir = ".";
  for (const std::string& c : {dir + "/vmmshim", dir + "/../bin/vmmshim"}) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return "";
}

// Runs `vmmshim ARGS...`, waits for it: 0, or the code of the contract.
int Run(std::vector<std::string> args) {
  const vmmshim::Runtime* rt = vmmshim::GetRuntime();
  if (rt == nullptr || !rt->enabled()) return CUDA_ERROR_NOT_SUPPORTED;
  const std::string command = Command();
  if (command.empty()) {
    vmmshim::Log().warn("vmmshim_{}: no vmmshim command next to libvmmshim.so", args[0]);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  args.insert(args.begin(), command);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t child;
  if (int err = posix_spawn(&child, command.c_str(), nullptr, nullptr, argv.data(), environ);
      err != 0) {
    vmmshim::Log().warn("vmmshim_{}: cannot run {}: {}", args[1], command, std::strerror(err));
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_STATE;
}

}  // namespace

VMMSHIM_EXPORT int vmmshim_sleep(const char* const* drop_tags, size_t count) {
  if (drop_tags == nullptr && count > 0) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::string> args = {"sleep", std::to_string(getpid())};
  for (size_t i = 0; i < count; ++i) {
    if (drop_tags[i] == nullptr || std::strlen(drop_tags[i]) > 255) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    args.push_back("--drop");
    args.push_back(drop_tags[i]);
  }
  return Run(std::move(args));
}

VMMSHIM_EXPORT int vmmshim_wake(void) { return Run({"wake", std::to_string(getpid())}); }
