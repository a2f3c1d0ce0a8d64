#include "core/control/control_server.h"

#include <cuda.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/log.h"
#include "core/base/unix_socket.h"
#include "nlohmann/json.hpp"

namespace vmmshim {
namespace {

constexpr int kRequestTimeoutSeconds = 2;
constexpr size_t kMaxRequestBytes = 4096;

std::string* g_socket_to_remove = nullptr;
pid_t g_socket_owner = 0;

// Only by the process that made it: a fork child inherits the handler, not
// the socket.
void RemoveSocketAtExit() {
  if (g_socket_to_remove != nullptr && g_socket_owner == getpid()) {
    unlink(g_socket_to_remove->c_str());
  }
}

absl::Status Refused(const std::string& why) {
  Log().warn("control socket: {}; `vmmshim ps` will not list this process", why);
  return absl::Status(absl::StatusCode::kUnavailable,
                      absl::StrCat(why, " [vmmshim/CUresult='",
                                   static_cast<int>(CUDA_ERROR_OPERATING_SYSTEM), "']"));
}

// One line (without its newline), at most kMaxRequestBytes; false when the
// peer stalls, closes first or sends more.
bool ReadLine(int fd, std::string* line) {
  char c;
  while (line->size() < kMaxRequestBytes) {
    if (!ReadAll(fd, &c, 1)) return false;
    if (c == '\n') return true;
    line->push_back(c);
  }
  return false;
}

std::string Error(const std::string& why) {
  return nlohmann::json{{"ok", false}, {"error", why}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

ControlServer::ControlServer(std::string dir, Handlers handlers)
    : dir_(dir.empty() ? DefaultSocketDirectory() : std::move(dir)),
      handlers_(std::move(handlers)) {}

std::string ControlServer::SocketPath(const std::string& dir, int pid) {
  return absl::StrFormat("%s/ctl-%d.sock", dir, pid);
}

std::string ControlServer::Answer(const std::string& request) const {
  const nlohmann::json r = nlohmann::json::parse(request, nullptr, /*allow_exceptions=*/false);
  if (r.is_discarded() || !r.is_object()) return Error("the request is not a JSON object");
  const auto op = r.find("op");
  if (op == r.end() || !op->is_string()) return Error("the request has no \"op\" string");
  if (*op == "status") {
    nlohmann::json reply = {{"ok", true}, {"pid", getpid()}, {"state", "running"}};
    const std::string residency = handlers_.residency_json ? handlers_.residency_json() : "";
    reply["residency"] = nlohmann::json::parse(residency, nullptr, false);
    if (reply["residency"].is_discarded()) reply["residency"] = nullptr;
    // Tags are bytes, not always UTF-8: replaced, never thrown.
    return reply.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  return Error(absl::StrCat("unknown op \"", op->get<std::string>(), "\" (known: status)"));
}

absl::Status ControlServer::Start() {
  if (std::string problem = PrivateDirectoryProblem(dir_); !problem.empty()) {
    return Refused(absl::StrCat("directory ", dir_, ": ", problem));
  }
  // Sockets of processes that died (killed, so no exit handler ran).
  if (DIR* d = opendir(dir_.c_str())) {
    while (dirent* e = readdir(d)) {
      int pid = 0, end = 0;
      if (std::sscanf(e->d_name, "ctl-%d.sock%n", &pid, &end) == 1 && end > 0 &&
          e->d_name[end] == '\0' && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
        unlinkat(dirfd(d), e->d_name, 0);
      }
    }
    closedir(d);
  }
  const std::string path = SocketPath(dir_, getpid());
  sockaddr_un addr;
  if (!FillAddress(path, &addr)) return Refused(absl::StrCat(path, " is too long"));
  unlink(path.c_str());  // a socket of an earlier process with this pid
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Refused(absl::StrCat("socket: ", std::strerror(errno)));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 16) != 0) {
    const std::string why = absl::StrCat(path, ": ", std::strerror(errno));
    close(fd);
    return Refused(why);
  }
  chmod(path.c_str(), 0600);
  if (g_socket_to_remove == nullptr) {
    g_socket_to_remove = new std::string(path);
    g_socket_owner = getpid();
    std::atexit(&RemoveSocketAtExit);
  }
  // Signals go to the application's threads, not to the listener.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  std::thread(&ControlServer::Serve, this, fd).detach();
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  Log().debug("control socket {}", path);
  return absl::OkStatus();
}

void ControlServer::Serve(int listen_fd) const {
  for (;;) {
    const int conn = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        usleep(10000);  // out of descriptors: let the application free some
        continue;
      }
      Log().error("control socket stops: accept: {}", std::strerror(errno));
      return;
    }
    SetTimeouts(conn, kRequestTimeoutSeconds);
    ucred peer = {};
    socklen_t len = sizeof peer;
    std::string reply;
    std::string line;
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.uid != geteuid()) {
      reply = Error("only the process's own user may ask");
    } else if (!ReadLine(conn, &line)) {
      reply = Error("no request line within 2 s (or over 4096 bytes)");
    } else {
      reply = Answer(line);
    }
    reply.push_back('\n');
    WriteAll(conn, reply.data(), reply.size());
    close(conn);
  }
}

}  // namespace vmmshim
