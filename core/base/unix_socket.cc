#include "core/base/unix_socket.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace vmmshim {

std::string DefaultSocketDirectory() { return absl::StrCat("/tmp/vmmshim-", geteuid()); }

std::string PrivateDirectoryProblem(const std::string& dir) {
  if (dir.empty() || dir.front() != '/') return "not an absolute path";
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::StrCat("cannot create it: ", std::strerror(errno));
  }
  return SocketDirectoryProblem(dir, geteuid());
}

std::string SocketDirectoryProblem(const std::string& dir, uid_t uid) {
  if (dir.empty() || dir.front() != '/') return "not an absolute path";
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0) return std::strerror(errno);
  if (S_ISLNK(st.st_mode)) return "a symbolic link";
  if (!S_ISDIR(st.st_mode)) return "not a directory";
  if (st.st_uid != uid) {
    return absl::StrCat("owned by uid ", st.st_uid, ", not by uid ", uid);
  }
  if ((st.st_mode & 077) != 0) {
    return absl::StrFormat("mode %04o lets other users in; it must be 0700", st.st_mode & 07777);
  }
  return "";
}

bool FillAddress(const std::string& path, sockaddr_un* addr) {
  *addr = {};
  addr->sun_family = AF_UNIX;
  if (path.size() >= sizeof addr->sun_path) return false;
  std::memcpy(addr->sun_path, path.data(), path.size());
  return true;
}

void SetTimeouts(int fd, int seconds) {
  timeval tv = {seconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

bool ReadAll(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t got = recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool WriteAll(int fd, const void* buf, size_t n) {
  auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t put = send(fd, p, n, MSG_NOSIGNAL);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

ssize_t ReceiveBefore(int fd, void* buf, size_t n, Deadline deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    pollfd p = {fd, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 60000)));
    if (ready < 0 && errno != EINTR) return -1;
    if (ready <= 0) continue;
    const ssize_t got = recv(fd, buf, n, MSG_DONTWAIT);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    return got;
  }
}

bool ReadAllBefore(int fd, void* buf, size_t n, Deadline deadline) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t got = ReceiveBefore(fd, p, n, deadline);
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

int ConnectTo(const std::string& path, int seconds) {
  sockaddr_un addr;
  if (!FillAddress(path, &addr)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  SetTimeouts(fd, seconds);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

int AcceptConnection(int listen_fd, int seconds) {
  for (;;) {
    const int conn = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn >= 0) {
      SetTimeouts(conn, seconds);
      return conn;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      usleep(10000);
      continue;
    }
    return -1;
  }
}

}  // namespace vmmshim
