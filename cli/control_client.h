#ifndef VMMSHIM_CLI_CONTROL_CLIENT_H_
#define VMMSHIM_CLI_CONTROL_CLIENT_H_

// The client side of a process's control socket
// (core/control/control_server.h): one JSON request, one JSON reply, from a
// socket the client has checked and a peer the kernel vouches for
// (../shared/DESIGN.md section 9). A socket in a directory another user
// made, or served by a process other than the one asked for, is an
// impostor: refused, naming what did not match, before anything is sent.
//
// Thread safety: no state; any thread.

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace vmmshim::cli {

// A process's control socket and who must serve it.
struct ControlTarget {
  int pid = 0;
  uid_t uid = 0;     // the process's owner: the socket directory's and the peer's
  std::string dir;   // the socket directory
  std::string path;  // DIR/ctl-PID.sock
};

// The directory `dir` when given, else VMMSHIM_IPC_DIR, else
// /tmp/vmmshim-<uid>; an error naming it when a given one is not absolute.
absl::StatusOr<std::string> SocketDirectoryFor(const std::string& dir, uid_t uid);

// Process `pid`'s control socket: its owner from /proc (an error when there
// is no such process, or when it is another user's and this user is not
// root), the directory (SocketDirectoryFor), which must be private to the
// owner (SocketDirectoryProblem), and the socket there, which must be a
// socket of the owner. Errors name the problem.
absl::StatusOr<ControlTarget> FindControlSocket(int pid, const std::string& dir);

// The process's reply to `request` (a JSON object; {"ok": false, ...} when
// it refused), or why there is none: nobody listens, the peer is not
// target.pid of target.uid (SO_PEERCRED), no whole reply line within
// `seconds` of the connect, a reply over 1 MiB, or one that is not a JSON
// object.
absl::StatusOr<nlohmann::json> AskProcess(const ControlTarget& target,
                                          const nlohmann::json& request, int seconds);

}  // namespace vmmshim::cli

#endif  // VMMSHIM_CLI_CONTROL_CLIENT_H_
