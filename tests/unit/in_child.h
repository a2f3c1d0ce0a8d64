// A forked child for tests of what fork() leaves (the shim's
// PrepareFork/AfterFork): only the calling thread exists there.
#ifndef VMMSHIM_TESTS_UNIT_IN_CHILD_H_
#define VMMSHIM_TESTS_UNIT_IN_CHILD_H_

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <functional>
#include <string>

namespace vmmshim {

// Runs `fn` in a forked child (only this thread exists there) with a
// deadline of `seconds`; returns "" when it finished, else why not. `fn`
// returns an error message ("" for success).
inline std::string InChild(const std::function<std::string()>& fn, int seconds) {
  int pipefd[2];
  if (pipe(pipefd) != 0) return "pipe failed";
  fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    close(pipefd[0]);
    alarm(seconds);
    const std::string msg = fn();
    if (!msg.empty()) (void)!write(pipefd[1], msg.data(), msg.size());
    _exit(msg.empty() ? 0 : 1);
  }
  close(pipefd[1]);
  std::string msg;
  char buf[256];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof buf)) > 0) msg.append(buf, n);
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) {
    return "child killed by signal " + std::to_string(WTERMSIG(status)) +
           (WTERMSIG(status) == SIGALRM ? " (deadline passed: hang)" : "");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return msg.empty() ? "child failed" : msg;
  }
  return "";
}

}  // namespace vmmshim

#endif  // VMMSHIM_TESTS_UNIT_IN_CHILD_H_
