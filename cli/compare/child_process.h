// One run of a program for `vmmshim compare`: fork + execve with a given
// environment, standard output captured (kept in memory and written to a
// file), standard error written to a file, wall time measured, and a time
// limit after which the program's whole process group is killed.
//
// The child runs in a process group of its own (setpgid), so a timeout or an
// interrupt of `vmmshim compare` reaches the program's own children too
// (python3 launchers, torch.multiprocessing workers). Standard input is
// /dev/null: runs must not wait for a terminal.
//
// Interrupts: while RunChild runs, SIGINT, SIGTERM, SIGHUP and SIGQUIT to
// this process are caught; the program's group gets SIGTERM (then SIGKILL
// after 3 s), RunChild returns with `interrupted`, and Interrupted() stays
// true until ClearInterrupted(), so a caller running several programs stops.
// SIGCHLD is set to its default for the run (an inherited SIG_IGN would
// make the kernel reap the child before RunChild can).
//
// Thread safety: RunChild may be called from one thread at a time (it
// replaces signal handlers for the duration of the run).
#ifndef VMMSHIM_CLI_COMPARE_CHILD_PROCESS_H_
#define VMMSHIM_CLI_COMPARE_CHILD_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace vmmshim::compare {

struct ChildResult {
  bool started = false;    // false: fork or exec failed (`error` says why)
  std::string error;       // "cannot run PROGRAM: No such file or directory"
  int exit_code = -1;      // the exit status when the program exited
  int signal = 0;          // the signal that ended it, 0 when it exited
  bool timed_out = false;  // killed after the time limit
  bool interrupted = false;  // SIGINT/SIGTERM reached vmmshim compare
  double wall_seconds = 0;   // fork to reaping, steady clock
  std::string out;           // everything it wrote to standard output
};

struct ChildSpec {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH (execvpe)
  std::vector<std::string> env;   // "NAME=value", the whole environment
  std::string stdout_file;        // standard output is copied here
  std::string stderr_file;        // standard error goes here
  double timeout_seconds = 0;     // 0 (or above 10^8 s): no limit
};

// Runs `spec` to its end. `while_running` is called repeatedly (about every
// 10 ms) with the child's pid while it runs, for sampling. Never throws.
ChildResult RunChild(const ChildSpec& spec,
                     const std::function<void(pid_t)>& while_running = nullptr);

// Whether an interrupt reached a RunChild since the last ClearInterrupted.
bool Interrupted();
void ClearInterrupted();

// The last non-empty line of a text file (at most its last 64 KiB are read);
// empty when there is none.
std::string LastLine(const std::string& path);

// "SIGSEGV" for a signal number, or "signal N".
std::string SignalName(int signal);

}  // namespace vmmshim::compare

#endif  // VMMSHIM_CLI_COMPARE_CHILD_PROCESS_H_
