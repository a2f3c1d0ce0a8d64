#include "cli/compare/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/base/safe_file.h"

namespace vmmshim::compare {
namespace {

volatile sig_atomic_t g_interrupted = 0;

void OnInterrupt(int) { g_interrupted = 1; }

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A pidfd becomes readable when the process exits (Linux 5.3); -1 where the
// kernel lacks it, and the loop below then polls waitpid every 10 ms.
int PidFd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

constexpr int kInterrupts[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// Catches the interrupts and sets SIGCHLD to its default; restores the
// handlers it replaced when it goes out of scope.
class SignalGuard {
 public:
  SignalGuard() {
    struct sigaction sa {};
    sa.sa_handler = OnInterrupt;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < std::size(kInterrupts); ++i) {
      sigaction(kInterrupts[i], &sa, &old_[i]);
    }
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGCHLD, &dfl, &old_chld_);
  }
  ~SignalGuard() {
    for (size_t i = 0; i < std::size(kInterrupts); ++i) {
      sigaction(kInterrupts[i], &old_[i], nullptr);
    }
    sigaction(SIGCHLD, &old_chld_, nullptr);
  }

 private:
  struct sigaction old_[std::size(kInterrupts)] {}, old_chld_ {};
};

// A full disk loses the copy, not the run.
void WriteAll(int fd, const char* data, size_t n) {
  WriteFully(fd, absl::string_view(data, n)).IgnoreError();
}

}  // namespace

bool Interrupted() { return g_interrupted != 0; }
void ClearInterrupted() { g_interrupted = 0; }

std::string SignalName(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(signal);
}

std::string LastLine(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = size > 65536 ? size - 65536 : 0;
  in.seekg(from);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t end = text.size();
  while (end > 0) {
    while (end > 0 && (text[end - 1] == '\n' || text[end - 1] == '\r' || text[end - 1] == ' ')) {
      --end;
    }
    const size_t begin = text.rfind('\n', end == 0 ? 0 : end - 1);
    const size_t start = begin == std::string::npos ? 0 : begin + 1;
    if (end > start) return text.substr(start, end - start);
    if (start == 0) break;
    end = start;
  }
  return "";
}

ChildResult RunChild(const ChildSpec& spec, const std::function<void(pid_t)>& while_running) {
  ChildResult result;
  if (spec.argv.empty()) {
    result.error = "no program to run";
    return result;
  }
  // Everything the child needs is built before fork: only async-signal-safe
  // calls happen between fork and exec.
  std::vector<char*> argv, envp;
  for (const std::string& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  // Note [Replacing a file safely] (core/base/safe_file.h): --out may name
  // a shared directory.
  std::string file_error;
  auto create = [&](const std::string& path) {
    absl::StatusOr<int> fd = CreateReplacing(path, DefaultFileMode());
    if (fd.ok()) return *fd;
    if (file_error.empty()) file_error = std::string(fd.status().message());
    return -1;
  };
  const int out_file = create(spec.stdout_file);
  const int err_file = create(spec.stderr_file);
  const int null_in = open("/dev/null", O_RDONLY | O_CLOEXEC);
  int out_pipe[2] = {-1, -1}, exec_pipe[2] = {-1, -1};
  auto close_all = [&] {
    for (int fd : {out_file, err_file, null_in, out_pipe[0], out_pipe[1], exec_pipe[0],
                   exec_pipe[1]}) {
      if (fd >= 0) close(fd);
    }
  };
  if (out_file < 0 || err_file < 0 || null_in < 0) {
    result.error = !file_error.empty() ? file_error
                                       : std::string("/dev/null: ") + std::strerror(errno);
    close_all();
    return result;
  }
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(exec_pipe, O_CLOEXEC) != 0) {
    result.error = std::string("pipe: ") + std::strerror(errno);
    close_all();
    return result;
  }

  SignalGuard guard;
  const Clock::time_point start = Clock::now();
  const pid_t pid = fork();
  if (pid < 0) {
    result.error = std::string("fork: ") + std::strerror(errno);
    close_all();
    return result;
  }
  if (pid == 0) {
    setpgid(0, 0);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : kInterrupts) sigaction(sig, &dfl, nullptr);
    sigaction(SIGPIPE, &dfl, nullptr);
    dup2(null_in, 0);
    dup2(out_pipe[1], 1);
    dup2(err_file, 2);
    execvpe(argv[0], argv.data(), envp.data());
    const int e = errno;
    (void)!write(exec_pipe[1], &e, sizeof e);
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so a kill of the group cannot precede the child's setpgid
  close(out_pipe[1]);
  out_pipe[1] = -1;
  close(exec_pipe[1]);
  exec_pipe[1] = -1;
  int exec_errno = 0;
  ssize_t got;
  do {
    got = read(exec_pipe[0], &exec_errno, sizeof exec_errno);
  } while (got < 0 && errno == EINTR);
  if (got == static_cast<ssize_t>(sizeof exec_errno)) {
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    result.error = "cannot run " + spec.argv[0] + ": " + std::strerror(exec_errno);
    close_all();
    return result;
  }
  result.started = true;

  const int pidfd = PidFd(pid);
  fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
  // Above 10^8 s (three years) is no limit: a larger value would overflow
  // the clock's nanoseconds and land in the past.
  const Clock::time_point deadline =
      spec.timeout_seconds > 0 && spec.timeout_seconds <= 1e8
          ? start + std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(spec.timeout_seconds))
          : Clock::time_point::max();
  Clock::time_point kill_after = Clock::time_point::max();  // SIGKILL once SIGTERM was sent
  Clock::time_point exited_at{};
  Clock::time_point next_sample = start;
  bool reaped = false, pipe_open = true;
  int status = -1;
  char buf[65536];
  auto drain = [&] {
    for (;;) {
      const ssize_t n = read(out_pipe[0], buf, sizeof buf);
      if (n > 0) {
        result.out.append(buf, static_cast<size_t>(n));
        WriteAll(out_file, buf, static_cast<size_t>(n));
        continue;
      }
      if (n == 0) pipe_open = false;
      if (n < 0 && errno == EINTR) continue;
      return;
    }
  };
  while (!reaped || pipe_open) {
    pollfd fds[2];
    nfds_t nfds = 0;
    if (pipe_open) fds[nfds++] = {out_pipe[0], POLLIN, 0};
    if (!reaped && pidfd >= 0) fds[nfds++] = {pidfd, POLLIN, 0};
    poll(fds, nfds, 10);
    if (pipe_open) drain();
    if (!reaped) {
      // Ended? Asked without reaping (WNOWAIT): while the child is a zombie
      // its pid, and so its process-group id, cannot be reused, so the kill
      // of the group below cannot reach an unrelated one.
      siginfo_t info{};
      const int w = waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
      if ((w == 0 && info.si_pid == pid) || (w < 0 && errno == ECHILD)) {
        exited_at = Clock::now();
        result.wall_seconds = Seconds(exited_at - start);
        // What it left behind in its group ends with it: a lingering child
        // would hold device memory into the next run.
        kill(-pid, SIGKILL);
        if (w == 0) {
          while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
          }
        } else {
          result.error = "the program's exit status was lost (reaped elsewhere)";
        }
        reaped = true;
      } else if (while_running && Clock::now() >= next_sample) {
        // By the clock, not per wake-up: a program writing a lot wakes the
        // loop often, and a sample (NVML) is not free.
        while_running(pid);
        next_sample = Clock::now() + std::chrono::milliseconds(10);
      }
    }
    if (reaped && pipe_open &&
        (g_interrupted || Clock::now() - exited_at > std::chrono::seconds(1))) {
      break;
    }
    const Clock::time_point now = Clock::now();
    if (!reaped && kill_after == Clock::time_point::max() && (now >= deadline || g_interrupted)) {
      result.timed_out = !g_interrupted;
      result.interrupted = g_interrupted != 0;
      kill(-pid, SIGTERM);
      kill_after = now + std::chrono::seconds(3);
    }
    if (!reaped && now >= kill_after) {
      kill(-pid, SIGKILL);
      kill_after = now + std::chrono::hours(1);
    }
  }
  if (pidfd >= 0) close(pidfd);
  close_all();
  if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (status != -1 && WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  result.interrupted = result.interrupted || g_interrupted != 0;
  return result;
}

}  // namespace vmmshim::compare
