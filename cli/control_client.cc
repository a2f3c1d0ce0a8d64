#include "cli/control_client.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/base/unix_socket.h"

namespace vmmshim::cli {
namespace {

// A status with the residency of many devices and tags is tens of KiB.
constexpr size_t kMaxReplyBytes = size_t{1} << 20;

}  // namespace

absl::StatusOr<std::string> SocketDirectoryFor(const std::string& dir, uid_t uid) {
  std::string chosen = dir;
  const char* source = "--dir";
  if (chosen.empty()) {
    const char* env = std::getenv("VMMSHIM_IPC_DIR");
    chosen = env != nullptr ? env : "";
    source = "VMMSHIM_IPC_DIR";
  }
  if (chosen.empty()) return absl::StrCat("/tmp/vmmshim-", uid);
  if (chosen.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat(source, "='", chosen,
                                                   "': not an absolute path (the shim ignores "
                                                   "a relative one)"));
  }
  return chosen;
}

absl::StatusOr<ControlTarget> FindControlSocket(int pid, const std::string& dir) {
  ControlTarget t;
  t.pid = pid;
  struct stat st;
  if (stat(absl::StrCat("/proc/", pid).c_str(), &st) != 0) {
    return absl::NotFoundError("no such process");
  }
  t.uid = st.st_uid;
  if (geteuid() != 0 && geteuid() != t.uid) {
    return absl::PermissionDeniedError(absl::StrCat("the process belongs to uid ", t.uid,
                                                    "; only that user or root may control it"));
  }
  absl::StatusOr<std::string> chosen = SocketDirectoryFor(dir, t.uid);
  if (!chosen.ok()) return chosen.status();
  t.dir = *chosen;
  t.path = absl::StrCat(t.dir, "/ctl-", pid, ".sock");
  if (lstat(t.dir.c_str(), &st) != 0 && errno == ENOENT) {
    return absl::NotFoundError(absl::StrCat(
        "no control socket: ", t.dir, " does not exist (no process of uid ", t.uid,
        " has started the shim's listener there)"));
  }
  if (std::string problem = SocketDirectoryProblem(t.dir, t.uid); !problem.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the socket directory ", t.dir, " is ", problem,
        ": not the shim's (another user may have made it: remove it as root, or give the "
        "program and this command a private VMMSHIM_IPC_DIR); nothing sent"));
  }
  if (lstat(t.path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(
        "no control socket ", t.path, ": the process is not running under vmmshim, has not "
        "made a CUDA call yet, or runs with VMMSHIM_CONTROL=0 or another VMMSHIM_IPC_DIR"));
  }
  if (!S_ISSOCK(st.st_mode) || st.st_uid != t.uid) {
    return absl::PermissionDeniedError(absl::StrCat(
        t.path, " is ", S_ISSOCK(st.st_mode) ? "" : "not a socket, ", "owned by uid ",
        st.st_uid, " (expected a socket of uid ", t.uid, "); nothing sent"));
  }
  return t;
}

absl::StatusOr<nlohmann::json> AskProcess(const ControlTarget& target,
                                          const nlohmann::json& request, int seconds) {
  const Deadline deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  const int fd = ConnectTo(target.path, seconds);
  if (fd < 0) {
    const int err = errno;
    return absl::UnavailableError(absl::StrCat(
        "nobody answers on ", target.path, " (", std::strerror(err),
        err == ECONNREFUSED ? ": the process is gone or stopped its listener)" : ")"));
  }
  ucred peer = {};
  socklen_t len = sizeof peer;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.pid != target.pid ||
      peer.uid != target.uid) {
    close(fd);
    return absl::PermissionDeniedError(absl::StrCat(
        target.path, " is served by pid ", peer.pid, " of uid ", peer.uid, ", not by process ",
        target.pid, " of uid ", target.uid, ": an impostor; nothing sent"));
  }
  const std::string line = request.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::string reply;
  bool whole = false;
  if (WriteAll(fd, line.data(), line.size())) {
    char buf[4096];
    for (;;) {
      const ssize_t got = ReceiveBefore(fd, buf, sizeof buf, deadline);
      if (got <= 0) break;
      const char* end = static_cast<const char*>(std::memchr(buf, '\n', static_cast<size_t>(got)));
      reply.append(buf, end != nullptr ? static_cast<size_t>(end - buf) : static_cast<size_t>(got));
      if (end != nullptr) {
        whole = true;
        break;
      }
      if (reply.size() > kMaxReplyBytes) {
        close(fd);
        return absl::DataLossError(absl::StrCat("process ", target.pid, " sent a reply of over ",
                                                kMaxReplyBytes, " bytes; not read further"));
      }
    }
  }
  close(fd);
  if (!whole) {
    return absl::DeadlineExceededError(absl::StrCat("process ", target.pid,
                                                    " gave no whole reply within ", seconds,
                                                    " s"));
  }
  nlohmann::json parsed = nlohmann::json::parse(reply, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return absl::DataLossError(absl::StrCat("process ", target.pid,
                                            " replied with something that is not a JSON object"));
  }
  return parsed;
}

}  // namespace vmmshim::cli
