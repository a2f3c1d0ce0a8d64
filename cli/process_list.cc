#include "cli/process_list.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "cli/control_client.h"
#include "cli/format.h"
#include "core/base/unix_socket.h"
#include "nlohmann/json.hpp"

namespace vmmshim::cli {
namespace {

constexpr int kAnswerTimeoutSeconds = 1;

struct Process {
  int pid = 0;
  std::string command;
  nlohmann::json reply;  // null: not answering
  std::string problem;   // why there is no reply (an impostor, a refusal)
};

std::string CommandLine(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  while (!raw.empty() && raw.back() == '\0') raw.pop_back();
  std::replace(raw.begin(), raw.end(), '\0', ' ');
  return raw;
}

// Sums over devices: device memory used; the shim's resident and paused
// bytes (other libraries' VMM memory included); the host memory the shim
// holds page-locked for pauses (the pinned pool's pinned part, and the host
// VMM memory kept, in use and scratch); the paused tags.
struct Figures {
  uint64_t used = 0, resident = 0, paused = 0, host_pinned = 0;
  std::vector<std::string> paused_tags;
};

Figures Sum(const nlohmann::json& residency) {
  Figures f;
  if (!residency.is_object() || !residency.contains("devices") ||
      !residency.at("devices").is_array()) {
    return f;
  }
  for (const nlohmann::json& d : residency.at("devices")) {
    if (!d.is_object()) continue;
    f.used += d.value("device_used_bytes", uint64_t{0});
    // Named, not temporaries: items() iterates the object it is given.
    const nlohmann::json shim = d.value("shim", nlohmann::json::object());
    f.resident += shim.value("resident_bytes", uint64_t{0});
    const nlohmann::json by_tag = shim.value("by_tag", nlohmann::json::object());
    for (const auto& [tag, t] : by_tag.items()) {
      const uint64_t paused = t.is_object() ? t.value("paused_bytes", uint64_t{0}) : 0;
      f.paused += paused;
      if (paused > 0) f.paused_tags.push_back(tag.empty() ? "(untagged)" : tag);
    }
    const nlohmann::json other = d.value("other_libraries_vmm", nlohmann::json::object());
    const nlohmann::json other_paused = other.value("paused_by_tag", nlohmann::json::object());
    for (const auto& [tag, bytes] : other_paused.items()) {
      if (!bytes.is_number_unsigned()) continue;
      f.paused += bytes.get<uint64_t>();
      f.paused_tags.push_back(tag.empty() ? "(untagged)" : tag);
    }
  }
  const nlohmann::json pool = residency.value("pinned_pool", nlohmann::json::object());
  if (pool.is_object()) f.host_pinned += pool.value("pinned_bytes", uint64_t{0});
  const nlohmann::json host = residency.value("host_memory_for_pauses", nlohmann::json::array());
  for (const nlohmann::json& h : host.is_array() ? host : nlohmann::json::array()) {
    if (!h.is_object()) continue;
    for (const char* key : {"kept_bytes", "in_use_bytes", "scratch_bytes"}) {
      f.host_pinned += h.value(key, uint64_t{0});
    }
  }
  std::sort(f.paused_tags.begin(), f.paused_tags.end());
  f.paused_tags.erase(std::unique(f.paused_tags.begin(), f.paused_tags.end()),
                      f.paused_tags.end());
  return f;
}

}  // namespace

int PsCommand(const std::string& dir_or_empty, bool json) {
  absl::StatusOr<std::string> chosen = SocketDirectoryFor(dir_or_empty, geteuid());
  if (!chosen.ok()) {
    std::fprintf(stderr, "vmmshim ps: %s\n", std::string(chosen.status().message()).c_str());
    return 2;
  }
  const std::string dir = *chosen;
  std::vector<Process> processes;
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0 && errno == ENOENT) {
    // No directory: no process has made a socket yet.
  } else if (std::string problem = SocketDirectoryProblem(dir, geteuid()); !problem.empty()) {
    std::fprintf(stderr,
                 "vmmshim ps: the socket directory %s is %s: not the shim's (another user "
                 "may have made it: remove it as root, or give the programs and this command "
                 "a private VMMSHIM_IPC_DIR); nothing asked\n",
                 dir.c_str(), problem.c_str());
    return 1;
  } else if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      int pid = 0, end = 0;
      if (std::sscanf(e->d_name, "ctl-%d.sock%n", &pid, &end) != 1 || end == 0 ||
          e->d_name[end] != '\0' || pid <= 0) {
        continue;
      }
      if (kill(pid, 0) != 0 && errno == ESRCH) {  // gone without its exit handler
        unlinkat(dirfd(d), e->d_name, 0);
        continue;
      }
      Process p;
      p.pid = pid;
      p.command = CommandLine(pid);
      absl::StatusOr<ControlTarget> target = FindControlSocket(pid, dir);
      absl::StatusOr<nlohmann::json> reply =
          target.ok() ? AskProcess(*target, {{"op", "status"}}, kAnswerTimeoutSeconds)
                      : absl::StatusOr<nlohmann::json>(target.status());
      if (reply.ok() && reply->value("ok", false)) {
        p.reply = *reply;
      } else {
        p.problem = reply.ok() ? reply->value("error", std::string("refused"))
                               : std::string(reply.status().message());
      }
      processes.push_back(std::move(p));
    }
    closedir(d);
  } else {
    std::fprintf(stderr, "vmmshim ps: cannot read %s: %s\n", dir.c_str(), std::strerror(errno));
    return 1;
  }
  std::sort(processes.begin(), processes.end(),
            [](const Process& a, const Process& b) { return a.pid < b.pid; });
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const Process& p : processes) {
      nlohmann::json entry = p.reply.is_object() ? p.reply : nlohmann::json::object();
      if (!p.reply.is_object()) {
        entry["state"] = "not answering";
        entry["problem"] = p.problem;
      }
      entry["pid"] = p.pid;
      entry["command"] = p.command;
      out.push_back(std::move(entry));
    }
    std::printf("%s\n",
                out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf("%-8s %-14s %10s %10s %10s %11s  %-20s %s\n", "PID", "STATE", "DEVICE",
              "RESIDENT", "PAUSED", "HOST PINNED", "PAUSED TAGS", "COMMAND");
  for (const Process& p : processes) {
    if (!p.reply.is_object() || !p.reply.value("ok", false)) {
      std::printf("%-8d %-14s %10s %10s %10s %11s  %-20s %s\n", p.pid, "not answering", "-",
                  "-", "-", "-", "-", p.command.c_str());
      std::fprintf(stderr, "vmmshim ps: %d: %s\n", p.pid, p.problem.c_str());
      continue;
    }
    const Figures f = Sum(p.reply.value("residency", nlohmann::json()));
    const std::string tags = f.paused_tags.empty() ? "-" : absl::StrJoin(f.paused_tags, ",");
    std::printf("%-8d %-14s %10s %10s %10s %11s  %-20s %s\n", p.pid,
                p.reply.value("state", std::string("?")).c_str(), FormatBytes(f.used).c_str(),
                FormatBytes(f.resident).c_str(), FormatBytes(f.paused).c_str(),
                FormatBytes(f.host_pinned).c_str(), tags.c_str(), p.command.c_str());
  }
  if (processes.empty()) std::printf("(no process of this user runs under the shim in %s)\n",
                                     dir.c_str());
  return 0;
}

}  // namespace vmmshim::cli
