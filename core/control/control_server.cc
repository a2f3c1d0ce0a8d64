#include "core/control/control_server.h"

#include <cuda.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/log.h"
#include "core/driver/cu_status.h"
#include "core/base/socket_server.h"
#include "core/base/unix_socket.h"
#include "nlohmann/json.hpp"

namespace vmmshim {
namespace {

constexpr int kRequestTimeoutSeconds = 2;
constexpr size_t kMaxRequestBytes = 4096;
// Requests served at once: a status is quick, a sleep or wake runs for its
// copy; more than this many at once is a client gone wrong.
constexpr int kMaxConnections = 16;

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

// One line (without its newline) of at most kMaxRequestBytes, read before
// `deadline`; otherwise why not.
std::string ReadLine(int fd, Deadline deadline, std::string* line) {
  char buf[512];
  for (;;) {
    const ssize_t got = ReceiveBefore(fd, buf, sizeof buf, deadline);
    if (got == 0) return "the client closed the connection before a whole request line";
    if (got < 0) {
      return errno == ETIMEDOUT
                 ? absl::StrCat("no request line within ", kRequestTimeoutSeconds, " s")
                 : absl::StrCat("reading the request: ", std::strerror(errno));
    }
    const char* end = static_cast<const char*>(std::memchr(buf, '\n', static_cast<size_t>(got)));
    line->append(buf, end != nullptr ? static_cast<size_t>(end - buf) : static_cast<size_t>(got));
    if (line->size() > kMaxRequestBytes) {
      return absl::StrCat("the request is over ", kMaxRequestBytes,
                          " bytes (tags are at most 255 bytes each)");
    }
    if (end != nullptr) return "";
  }
}

// Tags are bytes, not always UTF-8: replaced, never thrown.
std::string Dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string Error(const std::string& why, int code = 0) {
  nlohmann::json j = {{"ok", false}, {"error", why}};
  if (code != 0) j["code"] = code;
  return Dump(j);
}

}  // namespace

ControlServer::ControlServer(std::string dir, ControlTarget& target)
    : dir_(dir.empty() ? DefaultSocketDirectory() : std::move(dir)), target_(target) {}

std::string ControlServer::SocketPath(const std::string& dir, int pid) {
  return absl::StrFormat("%s/ctl-%d.sock", dir, pid);
}

std::string ControlServer::Answer(const std::string& request) const {
  const nlohmann::json r = nlohmann::json::parse(request, nullptr, /*allow_exceptions=*/false);
  if (r.is_discarded() || !r.is_object()) return Error("the request is not a JSON object");
  const auto op = r.find("op");
  if (op == r.end() || !op->is_string()) return Error("the request has no \"op\" string");
  if (*op == "status") return Status();
  if (*op == "sleep") {
    std::vector<std::string> drop;
    if (const auto d = r.find("drop"); d != r.end()) {
      if (!d->is_array()) return Error("\"drop\" must be an array of tags");
      for (const nlohmann::json& tag : *d) {
        if (!tag.is_string() || tag.get<std::string>().size() > 255) {
          return Error("\"drop\" must hold tags: strings of at most 255 bytes");
        }
        drop.push_back(tag.get<std::string>());
      }
    }
    return Sleep(drop);
  }
  if (*op == "slept") return Slept();
  if (*op == "wake") return Wake();
  return Error(absl::StrCat("unknown op \"", op->get<std::string>(),
                            "\" (known: status, sleep, slept, wake)"));
}

std::string ControlServer::Status() const {
  std::string state, residency;
  {
    MutexLock lock(&mu_);
    state = state_;
    residency = residency_at_sleep_;
  }
  // A process that sleeps may be locked by the driver: no driver call then.
  if (state == "running") residency = target_.ResidencyJson();
  nlohmann::json reply = {{"ok", true}, {"pid", getpid()}, {"state", state}};
  reply["residency"] = nlohmann::json::parse(residency, nullptr, false);
  if (reply["residency"].is_discarded()) reply["residency"] = nullptr;
  // What a sleep would be refused for now, so that a job's sleep is refused
  // before any of its processes pauses.
  if (state == "running") {
    if (const Refusal refused = SleepRefusal(residency); refused.code != 0) {
      reply["sleep_refusal"] = refused.why;
    }
  }
  return Dump(reply);
}

ControlServer::Refusal ControlServer::SleepRefusal(const std::string& residency) const {
  const nlohmann::json r = nlohmann::json::parse(residency, nullptr, false);
  uint64_t exported = 0, imported = 0, other_paused = 0;
  if (r.is_object() && r.contains("devices") && r.at("devices").is_array()) {
    for (const nlohmann::json& d : r.at("devices")) {
      const nlohmann::json other = d.is_object()
                                       ? d.value("other_libraries_vmm", nlohmann::json::object())
                                       : nlohmann::json::object();
      const nlohmann::json alone = other.value("left_alone", nlohmann::json::object());
      exported += alone.value("exported_bytes", uint64_t{0});
      imported += alone.value("imported_bytes", uint64_t{0});
      const nlohmann::json paused = other.value("paused_by_tag", nlohmann::json::object());
      for (const auto& [tag, bytes] : paused.items()) {
        if (bytes.is_number_unsigned()) other_paused += bytes.get<uint64_t>();
      }
    }
  }
  // Other libraries' memory the program paused counts too: its views would
  // hold host VMM memory through the checkpoint (Note [The driver's
  // checkpoint and host VMM memory], core/heap/host_mapped_pool.h).
  if (const uint64_t paused = target_.PausedBytes() + other_paused; paused > 0) {
    return {absl::StrCat("the process has ", paused, " bytes paused of its own",
                         other_paused > 0 ? absl::StrCat(" (", other_paused,
                                                         " of them other libraries' VMM memory)")
                                          : "",
                         "; resume them first (a wake resumes everything)"),
            CUDA_ERROR_ILLEGAL_STATE};
  }
  // Memory another process maps (other libraries' VMM memory exported or
  // imported: a multi-process NCCL group's buffers) is left alone by a pause,
  // and the driver's checkpoint cannot take it (NVIDIA/cuda-checkpoint #30:
  // such jobs hang): refused before anything is paused.
  if (exported + imported > 0) {
    return {absl::StrCat("the process shares device memory with other processes (", exported,
                         " bytes exported, ", imported,
                         " imported, by another library: a multi-process NCCL group's "
                         "buffers, say); the driver's checkpoint cannot take it; nothing "
                         "is paused"),
            CUDA_ERROR_NOT_PERMITTED};
  }
  if (const std::string shared = target_.SharedMemory();
      !shared.empty()) {
    return {absl::StrCat(shared, "; the driver's checkpoint cannot take memory shared "
                                 "between processes; nothing is paused"),
            CUDA_ERROR_NOT_PERMITTED};
  }
  return {};
}

std::string ControlServer::Sleep(const std::vector<std::string>& drop) const {
  {
    MutexLock lock(&mu_);
    if (state_ != "running") return Error(absl::StrCat("the process is ", state_, " already"));
    // Taken for the pause: another request sees "pausing" meanwhile instead
    // of waiting for the copy to end.
    state_ = "pausing";
  }
  auto back_to = [&](const char* state) {
    MutexLock lock(&mu_);
    state_ = state;
  };
  if (const Refusal refused =
          SleepRefusal(target_.ResidencyJson());
      refused.code != 0) {
    back_to("running");
    return Error(refused.why, refused.code);
  }
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<size_t> paused = target_.Sleep(drop);
  if (!paused.ok()) {
    back_to("running");
    const int rc = ToCuResult(paused.status());
    const std::string why =
        rc == CUDA_ERROR_NOT_PERMITTED
            ? "memory of the shim is exported to another process (cudaIpcGetMemHandle): the "
              "driver's checkpoint cannot take it"
        : rc == CUDA_ERROR_OUT_OF_MEMORY ? "host memory is short for the kept contents"
                                         : std::string(paused.status().message());
    return Error(absl::StrCat("the pause before the sleep failed: ", why, "; nothing is paused"),
                 rc);
  }
  const size_t released = *paused;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string residency = target_.ResidencyJson();
  {
    MutexLock lock(&mu_);
    residency_at_sleep_ = std::move(residency);
    state_ = "sleeping";
  }
  Log().info("control socket: paused {} bytes for a sleep in {:.3f} s", released, seconds);
  return Dump({{"ok", true}, {"released_bytes", released}, {"seconds", seconds}});
}

std::string ControlServer::Slept() const {
  MutexLock lock(&mu_);
  if (state_ != "sleeping") return Error(absl::StrCat("the process is ", state_, ", not sleeping"));
  state_ = "asleep";
  return Dump({{"ok", true}});
}

std::string ControlServer::Wake() const {
  std::string was;
  {
    MutexLock lock(&mu_);
    if (state_ != "sleeping" && state_ != "asleep") {
      return Error(absl::StrCat("the process is ", state_, ", not asleep"));
    }
    was = state_;
    state_ = "waking";
  }
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<size_t> resumed = target_.Wake();
  if (!resumed.ok()) {
    MutexLock lock(&mu_);
    state_ = was;
    return Error(absl::StrCat("the resume failed (", resumed.status().message(),
                              "); everything stays paused, a later wake can succeed"),
                 ToCuResult(resumed.status()));
  }
  const size_t restored = *resumed;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  {
    MutexLock lock(&mu_);
    state_ = "running";
    residency_at_sleep_.clear();
  }
  Log().info("control socket: resumed {} bytes after a sleep in {:.3f} s", restored, seconds);
  return Dump({{"ok", true}, {"restored_bytes", restored}, {"seconds", seconds}});
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
  SocketServer::Options options;
  options.name = "control socket";
  options.max_connections = kMaxConnections;
  options.busy_reply = Error(absl::StrCat("the process is answering ", kMaxConnections,
                                          " other requests; try again"),
                             CUDA_ERROR_NOT_READY) +
                       "\n";
  options.io_timeout_seconds = kRequestTimeoutSeconds;
  if (!SocketServer::Start(fd, std::move(options), [this](int conn, const ucred& peer) {
        ServeConnection(conn, peer);
      })) {
    const std::string why = absl::StrCat("no listener thread: ", std::strerror(errno));
    unlink(path.c_str());
    return Refused(why);
  }
  if (g_socket_to_remove == nullptr) {
    g_socket_to_remove = new std::string(path);
    g_socket_owner = getpid();
    std::atexit(&RemoveSocketAtExit);
  }
  Log().debug("control socket {}", path);
  return absl::OkStatus();
}

void ControlServer::ServeConnection(int conn, const ucred& peer) const {
  std::string reply;
  std::string line;
  // The process's own user, or root (who may checkpoint it anyway).
  if (peer.uid != geteuid() && peer.uid != 0) {
    reply = Error(absl::StrCat("only uid ", geteuid(), " (the process's user) or root may ask; "
                               "the client is uid ", peer.uid),
                  CUDA_ERROR_NOT_PERMITTED);
  } else if (std::string why = ReadLine(conn,
                                        std::chrono::steady_clock::now() +
                                            std::chrono::seconds(kRequestTimeoutSeconds),
                                        &line);
             !why.empty()) {
    reply = Error(why);
  } else {
    reply = Answer(line);
  }
  reply.push_back('\n');
  WriteAll(conn, reply.data(), reply.size());
}

}  // namespace vmmshim
