#include "core/ipc/ipc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/driver/cu_status.h"
#include "core/base/log.h"
#include "core/base/socket_server.h"
#include "core/base/unix_socket.h"

namespace vmmshim {
namespace {

constexpr uint8_t kReplyMagic[4] = {'V', 'M', 'S', 'R'};
constexpr int kServerTimeoutSeconds = 2;
constexpr int kClientTimeoutSeconds = 5;
// Imports served at once (each is one descriptor passed; a rank count of
// importers at a time is the expected load).
constexpr int kMaxConnections = 64;

// The listener's answer: status (a CUresult), the physical handle's bytes,
// and with status 0 one descriptor in SCM_RIGHTS.
struct Reply {
  uint8_t magic[4];
  int32_t status;
  uint64_t handle_size;
};

bool SendReply(int conn, int32_t status, uint64_t handle_size, int fd) {
  Reply reply = {};
  std::memcpy(reply.magic, kReplyMagic, sizeof kReplyMagic);
  reply.status = status;
  reply.handle_size = handle_size;
  iovec iov = {&reply, sizeof reply};
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  ssize_t sent;
  do {
    sent = sendmsg(conn, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  return sent == static_cast<ssize_t>(sizeof reply);
}

// Receives a Reply and its descriptor (-1 when none came). Any descriptors
// beyond the first are closed.
bool ReceiveReply(int conn, Reply* reply, int* fd) {
  *fd = -1;
  iovec iov = {reply, sizeof *reply};
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t got;
  do {
    got = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  } while (got < 0 && errno == EINTR);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof received);
      if (*fd < 0) {
        *fd = received;
      } else {
        close(received);
      }
    }
  }
  if (got != static_cast<ssize_t>(sizeof *reply) ||
      std::memcmp(reply->magic, kReplyMagic, sizeof kReplyMagic) != 0) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
    return false;
  }
  return true;
}

absl::Status Invalid(absl::string_view why) {
  Log().warn("cuIpcOpenMemHandle: {}", std::string(why));
  return DriverError(CUDA_ERROR_INVALID_VALUE, "cuIpcOpenMemHandle");
}

// Socket paths of exporters that are gone, removed at exit.
std::string* g_socket_to_remove = nullptr;
void RemoveSocketAtExit() {
  if (g_socket_to_remove != nullptr && !g_socket_to_remove->empty()) {
    unlink(g_socket_to_remove->c_str());
  }
}

}  // namespace

Ipc::Ipc(const DriverApi& driver, MemoryControl& control, std::string dir)
    : driver_(driver),
      control_(control),
      mapper_(driver),
      dir_(dir.empty() ? DefaultSocketDirectory() : std::move(dir)) {}

std::string Ipc::SocketPath(uint32_t pid, uint64_t instance) const {
  return absl::StrFormat("%s/ipc-%u-%016x.sock", dir_, pid, instance);
}

absl::Status Ipc::CheckDirectory() {
  const auto refuse = [&](const std::string& why) {
    // Once per process: every later export fails the same way.
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
      Log().error("IPC socket directory {}: {}; cuIpcGetMemHandle on shim memory fails "
                  "(set VMMSHIM_IPC_DIR to a private directory)",
                  dir_, why);
    }
    return DriverError(CUDA_ERROR_OPERATING_SYSTEM, "cuIpcGetMemHandle");
  };
  if (std::string problem = PrivateDirectoryProblem(dir_); !problem.empty()) {
    return refuse(problem);
  }
  return absl::OkStatus();
}

absl::Status Ipc::StartListenerLocked() {
  if (instance_ != 0 && listener_pid_ == static_cast<uint32_t>(getpid())) {
    return absl::OkStatus();
  }
  if (absl::Status dir = CheckDirectory(); !dir.ok()) return dir;
  // Sockets left by exporters that died (killed, so no exit handler ran).
  if (DIR* d = opendir(dir_.c_str())) {
    while (dirent* e = readdir(d)) {
      unsigned pid = 0;
      unsigned long long inst = 0;
      if (std::sscanf(e->d_name, "ipc-%u-%16llx.sock", &pid, &inst) == 2 && pid != 0 &&
          kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
        unlinkat(dirfd(d), e->d_name, 0);
      }
    }
    closedir(d);
  }
  uint64_t instance = 0;
  while (instance == 0) {
    if (getrandom(&instance, sizeof instance, 0) != sizeof instance) {
      return DriverError(CUDA_ERROR_OPERATING_SYSTEM, "getrandom");
    }
  }
  const uint32_t pid = static_cast<uint32_t>(getpid());
  const std::string path = SocketPath(pid, instance);
  sockaddr_un addr;
  if (!FillAddress(path, &addr)) {
    Log().error("IPC socket path {} is too long; choose a shorter VMMSHIM_IPC_DIR", path);
    return DriverError(CUDA_ERROR_OPERATING_SYSTEM, "cuIpcGetMemHandle");
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return DriverError(CUDA_ERROR_OPERATING_SYSTEM, "socket");
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 64) != 0) {
    Log().error("IPC listener on {}: {}", path, std::strerror(errno));
    close(fd);
    return DriverError(CUDA_ERROR_OPERATING_SYSTEM, "cuIpcGetMemHandle");
  }
  chmod(path.c_str(), 0600);
  SocketServer::Options options;
  options.name = "IPC listener";
  options.max_connections = kMaxConnections;
  options.io_timeout_seconds = kServerTimeoutSeconds;
  Reply busy = {};
  std::memcpy(busy.magic, kReplyMagic, sizeof kReplyMagic);
  busy.status = CUDA_ERROR_OPERATING_SYSTEM;
  options.busy_reply.assign(reinterpret_cast<const char*>(&busy), sizeof busy);
  if (!SocketServer::Start(fd, std::move(options), [this](int conn, const ucred& peer) {
        HandleRequest(conn, peer);
      })) {
    Log().error("IPC listener on {}: no thread: {}", path, std::strerror(errno));
    unlink(path.c_str());
    return DriverError(CUDA_ERROR_OPERATING_SYSTEM, "cuIpcGetMemHandle");
  }
  if (g_socket_to_remove == nullptr) {
    g_socket_to_remove = new std::string;
    std::atexit(&RemoveSocketAtExit);
  }
  *g_socket_to_remove = path;
  instance_ = instance;
  listener_pid_ = pid;
  Log().info("IPC listener on {}", path);
  return absl::OkStatus();
}

void Ipc::HandleRequest(int conn, const ucred& peer) {
  if (peer.uid != geteuid()) {
    Log().warn("IPC: refused a request from pid {} uid {} (only uid {} may import)", peer.pid,
               peer.uid, geteuid());
    SendReply(conn, CUDA_ERROR_INVALID_VALUE, 0, -1);
    return;
  }
  uint8_t request[kIpcHandleBytes];
  if (!ReadAllBefore(conn, request, sizeof request,
                     std::chrono::steady_clock::now() +
                         std::chrono::seconds(kServerTimeoutSeconds))) {
    Log().warn("IPC: pid {} sent no whole request within {} s", peer.pid, kServerTimeoutSeconds);
    return;
  }
  IpcHandleFields fields;
  uint64_t instance;
  {
    MutexLock lock(&mu_);
    instance = instance_;
  }
  if (DecodeIpcHandle(request, &fields) != IpcHandleKind::kShim ||
      fields.pid != static_cast<uint32_t>(getpid()) || fields.instance != instance) {
    Log().warn("IPC: pid {} sent a malformed handle", peer.pid);
    SendReply(conn, CUDA_ERROR_INVALID_VALUE, 0, -1);
    return;
  }
  uint64_t handle_size = 0;
  absl::StatusOr<int> fd =
      control_.ExportFd(fields.token, fields.offset, fields.size, &handle_size);
  if (!fd.ok()) {
    Log().warn("IPC: pid {} asked for an allocation that is not exported now (freed, or a "
               "forged handle): {}",
               peer.pid, fd.status().ToString());
    SendReply(conn, ToCuResult(fd.status()), 0, -1);
    return;
  }
  if (!SendReply(conn, CUDA_SUCCESS, handle_size, *fd)) {
    Log().warn("IPC: pid {} went away before the reply", peer.pid);
  }
  close(*fd);
}

absl::Status Ipc::Export(CUdeviceptr ptr, uint8_t* handle) {
  absl::StatusOr<ExportedAllocation> exported = control_.Export(ptr);
  if (!exported.ok()) return exported.status();
  IpcHandleFields fields;
  {
    MutexLock lock(&mu_);
    if (absl::Status started = StartListenerLocked(); !started.ok()) return started;
    fields.pid = listener_pid_;
    fields.instance = instance_;
  }
  fields.token = exported->token;
  fields.offset = exported->offset;
  fields.size = exported->size;
  EncodeIpcHandle(fields, handle);
  return absl::OkStatus();
}

absl::StatusOr<int> Ipc::RequestFd(const IpcHandleFields& fields, uint64_t* handle_size) {
  const std::string path = SocketPath(fields.pid, fields.instance);
  sockaddr_un addr;
  if (!FillAddress(path, &addr)) return Invalid("socket path too long");
  int conn = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (conn < 0) return DriverError(CUDA_ERROR_OPERATING_SYSTEM, "socket");
  SetTimeouts(conn, kClientTimeoutSeconds);
  int r;
  do {
    r = connect(conn, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  } while (r != 0 && errno == EINTR);
  if (r != 0) {
    const int err = errno;
    close(conn);
    return Invalid(absl::StrCat("no exporter answers at ", path, " (", std::strerror(err),
                                "): the exporting process is gone, or uses another "
                                "VMMSHIM_IPC_DIR"));
  }
  ucred server = {};
  socklen_t len = sizeof server;
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &server, &len) != 0 ||
      server.uid != geteuid() || server.pid != static_cast<pid_t>(fields.pid)) {
    close(conn);
    return Invalid(absl::StrCat("the socket ", path, " is served by pid ", server.pid, " uid ",
                                server.uid, ", not by the exporter (pid ", fields.pid, " uid ",
                                geteuid(), ")"));
  }
  uint8_t request[kIpcHandleBytes];
  EncodeIpcHandle(fields, request);
  Reply reply = {};
  int fd = -1;
  if (!WriteAll(conn, request, sizeof request) || !ReceiveReply(conn, &reply, &fd)) {
    close(conn);
    return Invalid(absl::StrCat("the exporter (pid ", fields.pid, ") did not answer"));
  }
  close(conn);
  if (reply.status != CUDA_SUCCESS || fd < 0) {
    if (fd >= 0) close(fd);
    if (reply.status == CUDA_ERROR_INVALID_VALUE || reply.status == CUDA_SUCCESS) {
      return Invalid(absl::StrCat("the exporter (pid ", fields.pid,
                                  ") has no such allocation (freed, or a stale or corrupted "
                                  "handle)"));
    }
    return DriverError(static_cast<CUresult>(reply.status), "cuMemExportToShareableHandle");
  }
  *handle_size = reply.handle_size;
  return fd;
}

void Ipc::Unmap(CUdeviceptr base, size_t size) {
  mapper_.UnmapAndFree(base, size).IgnoreError();
}

absl::StatusOr<CUdeviceptr> Ipc::MapImport(int fd, uint64_t handle_size, int device,
                                           const IpcHandleFields& fields, size_t* mapped) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  size_t granularity = 0;
  CUresult r = driver_.cuMemGetAllocationGranularity(&granularity, &prop,
                                                     CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuMemGetAllocationGranularity");
  if (handle_size == 0 || granularity == 0 || handle_size % granularity != 0 ||
      fields.offset + fields.size > handle_size) {
    return Invalid("the exporter's handle does not fit the handle's offset and size");
  }
  absl::StatusOr<CUdeviceptr> base = mapper_.ImportAndMap(
      fd, handle_size, granularity, control_.AccessTargets(device, fields.size));
  if (!base.ok()) return base.status();
  *mapped = handle_size;
  return *base;
}

absl::StatusOr<CUdeviceptr> Ipc::Open(const IpcHandleFields& fields, unsigned int flags) {
  if ((flags & ~static_cast<unsigned int>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) != 0) {
    return DriverError(CUDA_ERROR_INVALID_VALUE, "cuIpcOpenMemHandle");
  }
  CUcontext context = nullptr;
  CUdevice device = 0;
  if (driver_.cuCtxGetCurrent(&context) != CUDA_SUCCESS || context == nullptr ||
      driver_.cuCtxGetDevice(&device) != CUDA_SUCCESS) {
    return DriverError(CUDA_ERROR_INVALID_CONTEXT, "cuIpcOpenMemHandle");
  }
  {
    MutexLock lock(&mu_);
    if (fields.pid == static_cast<uint32_t>(getpid()) && fields.instance == instance_) {
      // As the driver (H200, driver 580): cudaErrorDeviceUninitialized.
      Log().warn("cuIpcOpenMemHandle: the handle was exported by this process");
      return DriverError(CUDA_ERROR_INVALID_CONTEXT, "cuIpcOpenMemHandle");
    }
    auto it = imports_.find(ImportKey{fields.instance,
                                      std::string(fields.token.begin(), fields.token.end()),
                                      context});
    if (it != imports_.end()) {
      ++it->second.references;
      return it->second.ptr;
    }
  }
  uint64_t handle_size = 0;
  absl::StatusOr<int> fd = RequestFd(fields, &handle_size);
  if (!fd.ok()) return fd.status();
  size_t mapped = 0;
  absl::StatusOr<CUdeviceptr> base = MapImport(*fd, handle_size, device, fields, &mapped);
  close(*fd);
  if (!base.ok()) return base.status();

  MutexLock lock(&mu_);
  ImportKey key{fields.instance, std::string(fields.token.begin(), fields.token.end()), context};
  auto [it, inserted] = imports_.try_emplace(key);
  if (!inserted) {
    // Another thread opened the same handle meanwhile: use its mapping.
    Unmap(*base, mapped);
    ++it->second.references;
    return it->second.ptr;
  }
  it->second = Import{*base, mapped, *base + fields.offset, context, 1, fields.pid};
  by_pointer_[it->second.ptr] = key;
  return it->second.ptr;
}

absl::StatusOr<bool> Ipc::Close(CUdeviceptr ptr) {
  Import gone;
  {
    MutexLock lock(&mu_);
    auto p = by_pointer_.find(ptr);
    if (p == by_pointer_.end()) return false;
    auto it = imports_.find(p->second);
    if (--it->second.references > 0) return true;
    gone = it->second;
    imports_.erase(it);
    by_pointer_.erase(p);
  }
  if (absl::Status s = mapper_.UnmapAndFree(gone.base, gone.size); !s.ok()) return s;
  return true;
}

void Ipc::ReleaseContext(CUcontext context) {
  std::vector<Import> gone;
  {
    MutexLock lock(&mu_);
    for (auto it = imports_.begin(); it != imports_.end();) {
      if (it->second.context != context) {
        ++it;
        continue;
      }
      gone.push_back(it->second);
      by_pointer_.erase(it->second.ptr);
      it = imports_.erase(it);
    }
  }
  for (const Import& i : gone) Unmap(i.base, i.size);
}

Ipc::OpenImports Ipc::open_imports() const {
  OpenImports open;
  MutexLock lock(&mu_);
  for (const auto& [key, import] : imports_) {
    open.bytes += import.size;
    open.exporters.push_back(import.exporter_pid);
  }
  std::sort(open.exporters.begin(), open.exporters.end());
  open.exporters.erase(std::unique(open.exporters.begin(), open.exporters.end()),
                       open.exporters.end());
  return open;
}

void Ipc::PrepareFork() { mu_.Lock(); }
void Ipc::AfterForkParent() { mu_.Unlock(); }

void Ipc::AfterForkChild() {
  // The child has no listener thread; its exports (if it ever makes any)
  // start a listener of its own under its own pid. Called with mu_ held by
  // PrepareFork.
  instance_ = 0;
  listener_pid_ = 0;
  if (g_socket_to_remove != nullptr) g_socket_to_remove->clear();  // the parent's socket
  new (&mu_) Mutex;  // fresh: see ShimCore::AfterFork
}

}  // namespace vmmshim
