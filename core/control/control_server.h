// The control socket: one Unix-domain socket per process under the shim,
// `<dir>/ctl-<pid>.sock` (dir: VMMSHIM_IPC_DIR, default /tmp/vmmshim-<euid>,
// private to the user: core/base/unix_socket.h), through which `vmmshim ps`
// (cli/process_list.h) asks a process what it holds. It is the channel the
// sleep and wake of a whole process from outside will use (docs/deep-sleep.md).
//
// Protocol: the client connects, sends one JSON object on one line, and
// reads one JSON object on one line; then the connection closes.
//   {"op": "status"}  ->  {"ok": true, "pid": P, "state": "running",
//                          "residency": <vmmshim_get_residency's document>}
//   anything else      ->  {"ok": false, "error": "..."} naming the problem
// Only processes of the same effective user are answered (SO_PEERCRED);
// a request is read with a 2-second timeout, so a client that stalls cannot
// hold the listener.
//
// The listener is one thread, started by Start() (the shim's runtime starts
// it when it begins to serve; VMMSHIM_CONTROL=0 turns it off), with every
// signal blocked, taking no lock of the application: the handlers it calls
// take the allocator's. The socket is removed at exit; sockets of processes
// that died are removed by the next process that starts a listener and by
// `vmmshim ps`.
//
// Errors: Start() returns CUDA_ERROR_OPERATING_SYSTEM (logged with the
// reason) when the directory is not private or the socket cannot be made;
// the program runs on without the listener.
//
// Thread safety: Start() once, from one thread. Process exit: the thread is
// left blocked in accept() and ends with the process. A fork child has no
// listener (and its parent's socket is not its own).
#ifndef VMMSHIM_CORE_CONTROL_CONTROL_SERVER_H_
#define VMMSHIM_CORE_CONTROL_CONTROL_SERVER_H_

#include <functional>
#include <string>

#include "absl/status/status.h"

namespace vmmshim {

class ControlServer {
 public:
  struct Handlers {
    // vmmshim_get_residency's JSON document (core/report/residency.h).
    std::function<std::string()> residency_json;
  };
  // `dir`: empty for the default directory.
  ControlServer(std::string dir, Handlers handlers);
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  absl::Status Start();

  // The socket of process `pid` in `dir`.
  static std::string SocketPath(const std::string& dir, int pid);
  // The reply to one request line (what the listener sends back).
  std::string Answer(const std::string& request) const;
  const std::string& directory() const { return dir_; }

 private:
  void Serve(int listen_fd) const;

  const std::string dir_;
  const Handlers handlers_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_CONTROL_CONTROL_SERVER_H_
