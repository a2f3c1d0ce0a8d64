// A listener that serves the connections of a Unix-domain socket
// concurrently, each on a thread of its own, so that a client that connects
// and says nothing (or is slow) cannot delay another's request: each
// handler reads its request against a deadline of its own
// (ReadAllBefore in core/base/unix_socket.h), and at most
// `max_connections` are served at once; a connection over the bound gets
// `busy_reply` and is closed at once. The shim's control socket
// (core/control/control_server.h) and IPC listener (core/ipc/ipc.h) use it
// (../shared/DESIGN.md section 9).
//
// The peer's credentials (SO_PEERCRED) are read before the handler runs, so
// a handler refuses a stranger before reading anything from it.
//
// Threads: the accept loop and every handler run with every signal blocked
// (signals go to the application's threads), detached; they take no lock of
// the application. Errors: the accept loop retries interruptions and
// shortages of descriptors (AcceptConnection) and stops, logging why, on
// any other error; a handler thread that cannot be started is answered
// with `busy_reply`. Process exit: the threads are left blocked and end
// with the process; a fork child has none of them.
#ifndef VMMSHIM_CORE_BASE_SOCKET_SERVER_H_
#define VMMSHIM_CORE_BASE_SOCKET_SERVER_H_

#include <sys/socket.h>

#include <functional>
#include <string>

namespace vmmshim {

class SocketServer {
 public:
  struct Options {
    std::string name;          // for the log: "control socket"
    int max_connections = 16;  // served at once
    std::string busy_reply;    // bytes sent to a connection over the bound
    int io_timeout_seconds = 2;  // SO_RCVTIMEO/SO_SNDTIMEO of each connection
  };
  // Called on a thread of its own for each connection; when it returns,
  // `conn` is shut down for writing, what the peer still sends is read
  // (at most 64 KiB within 100 ms: a peer's unread request would reset the
  // connection and lose the reply) and it is closed. `peer`: the connecting process (SO_PEERCRED; pid 0 and
  // uid -1 when the kernel could not say).
  using Handler = std::function<void(int conn, const ucred& peer)>;

  // Serves `listen_fd` (listening; the server owns it) from now on; false
  // (errno set, `listen_fd` closed) when no thread could be started for it.
  static bool Start(int listen_fd, Options options, Handler handler);
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_BASE_SOCKET_SERVER_H_
