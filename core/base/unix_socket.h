// Unix-domain sockets between processes of one user, as the shim's
// listeners use them (IPC export: core/ipc/ipc.h; the control socket:
// core/control/control_server.h): a private directory for the sockets,
// addresses, timeouts and whole reads and writes.
//
// Thread safety: every function may be called from any thread; none keeps
// state.
#ifndef VMMSHIM_CORE_BASE_UNIX_SOCKET_H_
#define VMMSHIM_CORE_BASE_UNIX_SOCKET_H_

#include <sys/un.h>

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <string>

namespace vmmshim {

// The directory of the shim's sockets when VMMSHIM_IPC_DIR does not name
// one (the configuration reads the variable, once: config/config.h):
// /tmp/vmmshim-<euid>.
std::string DefaultSocketDirectory();

// Makes `dir` (mode 0700) if it is missing and checks that it is private
// (SocketDirectoryProblem for this effective user), so that another user
// can neither create nor replace a socket in it. "" when it is; otherwise
// why not, in words.
std::string PrivateDirectoryProblem(const std::string& dir);

// `path` as a socket address; false when it is too long for one.
bool FillAddress(const std::string& path, sockaddr_un* addr);

// Send and receive timeouts of `seconds` on socket `fd`.
void SetTimeouts(int fd, int seconds);

// Exactly `n` bytes (false on EOF, error or timeout; EINTR retried).
bool ReadAll(int fd, void* buf, size_t n);
bool WriteAll(int fd, const void* buf, size_t n);

// What a server reads a request by: a deadline for the whole request, not
// a timeout per recv(), so a client that trickles a byte at a time is cut
// off as one that says nothing.
using Deadline = std::chrono::steady_clock::time_point;

// Up to `n` bytes that arrive before `deadline`: how many (> 0); 0 at EOF;
// -1 on an error or at the deadline (errno ETIMEDOUT).
ssize_t ReceiveBefore(int fd, void* buf, size_t n, Deadline deadline);

// Exactly `n` bytes before `deadline` (false on EOF, error or deadline).
bool ReadAllBefore(int fd, void* buf, size_t n, Deadline deadline);

// Why `dir` is not a private directory of user `uid` (absolute, a real
// directory, not a symbolic link, owned by `uid`, no access for group or
// others), in words; "" when it is. Nothing is created: for clients, which
// must not trust a directory somebody else made.
std::string SocketDirectoryProblem(const std::string& dir, uid_t uid);

// A connection to the socket at `path` with `seconds` timeouts, or -1 (errno
// set) when nobody listens there.
int ConnectTo(const std::string& path, int seconds);

// The next connection on `listen_fd` (close-on-exec) with `seconds`
// timeouts, retried on interruption and aborted connections, and after
// 10 ms when descriptors or memory run out (the application may free
// some); -1 (errno set) on any other error, after which a server stops.
int AcceptConnection(int listen_fd, int seconds);

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_BASE_UNIX_SOCKET_H_
