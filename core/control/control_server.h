// The control socket: one Unix-domain socket per process under the shim,
// `<dir>/ctl-<pid>.sock` (dir: VMMSHIM_IPC_DIR, default /tmp/vmmshim-<euid>,
// private to the user: core/base/unix_socket.h), through which `vmmshim ps`
// (cli/process_list.h) asks a process what it holds. It is the channel the
// sleep and wake of a whole process from outside will use (docs/deep-sleep.md).
//
// Protocol: the client connects, sends one JSON object on one line, and
// reads one JSON object on one line; then the connection closes.
//   {"op": "status"}  ->  {"ok": true, "pid": P, "state": S,
//                          "residency": <vmmshim_get_residency's document>,
//                          "sleep_refusal": "..." (only when a sleep would be
//                          refused now, before pausing: why)}
//       S: "running"; "pausing" (a sleep's pause is under way); "sleeping"
//       (paused for a sleep, the driver's checkpoint not yet done or undone);
//       "asleep" (checkpointed); "waking" (a wake's resume is under way). Not
//       running, the residency is the one taken at the sleep (null while
//       pausing): no driver call is made, since a locked process's calls
//       block.
//   {"op": "sleep", "drop": [TAG...]}  ->  {"ok": true, "released_bytes": N,
//       "seconds": T}: everything the shim holds paused, the tags of "drop"
//       without their contents, the rest with; running -> sleeping. Refused
//       while memory is paused already (the wake resumes everything: it would
//       resume what the program paused itself), and while the process
//       shares device memory with another (exported by it or mapped from
//       another: the driver's checkpoint cannot take it), naming which.
//   {"op": "slept"}   ->  {"ok": true}: sleeping -> asleep (the helper's
//       checkpoint succeeded).
//   {"op": "wake"}    ->  {"ok": true, "restored_bytes": N, "seconds": T}:
//       everything resumed; sleeping or asleep -> running (sent after the
//       driver's restore and unlock).
//   a failure          ->  {"ok": false, "error": "...", "code": C} naming the
//       problem (C: the CUresult, when there is one); the state is unchanged.
// Only processes of the same effective user, and root, are answered
// (SO_PEERCRED); another gets {"ok": false, "code": 800} naming both uids.
// Connections are served concurrently (core/base/socket_server.h: at most
// 16 at once, each request line read within 2 s of the connect), so an idle
// or slow client delays nobody else; while a sleep or wake runs, other
// requests see "pausing" or "waking" at once, and a second sleep or wake is
// refused.
//
// The listener is started by Start() (the shim's runtime starts it when it
// begins to serve; VMMSHIM_CONTROL=0 turns it off); its threads block every
// signal and take no lock of the application: the target they call takes
// the shim's. The socket is removed at exit; sockets of processes that
// died are removed by the next process that starts a listener and by
// `vmmshim ps`.
//
// Errors: Start() returns CUDA_ERROR_OPERATING_SYSTEM (logged with the
// reason) when the directory is not private or the socket cannot be made;
// the program runs on without the listener.
//
// Thread safety: Start() once, from one thread; Answer() from any thread.
// Process exit: the threads are left blocked and end with the process. A fork child has no
// listener (and its parent's socket is not its own).
#ifndef VMMSHIM_CORE_CONTROL_CONTROL_SERVER_H_
#define VMMSHIM_CORE_CONTROL_CONTROL_SERVER_H_

#include <sys/socket.h>

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/sync/mutex.h"

namespace vmmshim {

// What the control socket asks of the process. The rooms above implement it
// (ProcessControl, core/control/process_control.h) and are handed to the
// server, so that the server calls an interface it owns rather than hooks
// (docs/architecture.md, "Callbacks"). Called from the listener's threads,
// concurrently; the server holds none of its own locks meanwhile.
class ControlTarget {
 public:
  // vmmshim_get_residency's JSON document (core/report/residency.h).
  virtual std::string ResidencyJson() const = 0;
  // Quiesces the program's work and pauses everything for a sleep (the
  // `drop` tags without contents, the rest with them): the bytes released,
  // or why not, with its CUresult (core/driver/cu_status.h; nothing paused:
  // SleepCoordinator::Sleep is all or nothing).
  virtual absl::StatusOr<size_t> Sleep(const std::vector<std::string>& drop) = 0;
  // Resumes everything and lets the program's work go on: the bytes
  // restored, or why not (everything stays paused).
  virtual absl::StatusOr<size_t> Wake() = 0;
  // The bytes paused now. A sleep is refused while the program has paused
  // memory of its own, since the wake resumes everything.
  virtual size_t PausedBytes() const = 0;
  // Why the process shares device memory with another process in a way a
  // sleep cannot take (memory of another process's shim it maps:
  // cudaIpcOpenMemHandle), or empty. Checked before anything is paused.
  virtual std::string SharedMemory() const = 0;

 protected:
  ~ControlTarget() = default;
};

class ControlServer {
 public:
  // `dir`: empty for the default directory. `target` must outlive the
  // server (neither is ever destroyed in the shim).
  ControlServer(std::string dir, ControlTarget& target);
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  absl::Status Start();

  // The socket of process `pid` in `dir`.
  static std::string SocketPath(const std::string& dir, int pid);
  // The reply to one request line (what the listener sends back).
  std::string Answer(const std::string& request) const;
  const std::string& directory() const { return dir_; }

 private:
  void ServeConnection(int conn, const ucred& peer) const;

  // Why a sleep would be refused now (what it checks before pausing), with
  // its CUresult; code 0: it would not be. `residency`: the residency JSON.
  struct Refusal {
    std::string why;
    int code = 0;
  };
  Refusal SleepRefusal(const std::string& residency) const;
  std::string Status() const;
  std::string Sleep(const std::vector<std::string>& drop) const;
  std::string Slept() const;
  std::string Wake() const;

  const std::string dir_;
  ControlTarget& target_;
  mutable Mutex mu_;  // the state; held for no call of the target
  mutable std::string state_ ABSL_GUARDED_BY(mu_) = "running";
  mutable std::string residency_at_sleep_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_CONTROL_CONTROL_SERVER_H_
