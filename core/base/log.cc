#include "core/base/log.h"

#include <sys/stat.h>
#include <unistd.h>

#include <mutex>

#include "absl/strings/str_cat.h"
#include "core/base/safe_file.h"
#include "spdlog/sinks/base_sink.h"
#include "spdlog/sinks/stdout_sinks.h"

namespace vmmshim {
namespace {

// Every sink writes under this one mutex, so that fork() can take it
// (PrepareLogForFork) and a child never inherits it held by a thread that
// was logging in the parent.
std::mutex& LogMutex() {
  static auto* mu = new std::mutex;  // leaked: used at exit
  return *mu;
}
struct GlobalLogMutex {
  void lock() { LogMutex().lock(); }
  void unlock() { LogMutex().unlock(); }
};
struct GlobalConsoleMutex {
  using mutex_t = GlobalLogMutex;
  static mutex_t& mutex() {
    static mutex_t m;
    return m;
  }
};

// The log file's sink: a descriptor opened by OpenForAppend (never through
// a planted link: core/base/safe_file.h), one write(2) per line, so that
// lines of several processes appending to one file do not interleave.
class AppendSink final : public spdlog::sinks::base_sink<GlobalLogMutex> {
 public:
  explicit AppendSink(int fd) : fd_(fd) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    // A full disk loses log lines, never the program.
    WriteFully(fd_, absl::string_view(line.data(), line.size())).IgnoreError();
  }
  void flush_() override {}

 private:
  const int fd_;  // leaked with the logger (see log.h)
};

std::shared_ptr<spdlog::logger>* MakeLogger(spdlog::sink_ptr sink) {
  auto* logger = new std::shared_ptr<spdlog::logger>(
      std::make_shared<spdlog::logger>("vmmshim", std::move(sink)));
  (*logger)->set_pattern(absl::StrCat("[vmmshim ", getpid(), "] %l: %v"));
  (*logger)->set_level(spdlog::level::warn);
  (*logger)->flush_on(spdlog::level::trace);
  return logger;
}

std::shared_ptr<spdlog::logger>*& Slot() {
  // Leaked on purpose (see log.h).
  static std::shared_ptr<spdlog::logger>* logger =
      MakeLogger(std::make_shared<spdlog::sinks::stderr_sink<GlobalConsoleMutex>>());
  return logger;
}

}  // namespace

spdlog::logger& Log() { return **Slot(); }

void PrepareLogForFork() { LogMutex().lock(); }
void AfterLogFork() { LogMutex().unlock(); }

absl::Status ConfigureLog(spdlog::level::level_enum level, const std::string& path) {
  absl::Status status;
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  struct stat st;
  if (!path.empty() && (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))) {
    // spdlog would create missing directories; a typo in a path should not.
    status = absl::InvalidArgumentError(absl::StrCat(
        "VMMSHIM_LOG_FILE: cannot open '", path, "': directory '", dir,
        "' does not exist; logging to stderr"));
  } else if (!path.empty()) {
    absl::StatusOr<int> fd = OpenForAppend(path);
    if (fd.ok()) {
      Slot() = MakeLogger(std::make_shared<AppendSink>(*fd));
    } else {
      status = absl::InvalidArgumentError(absl::StrCat(
          "VMMSHIM_LOG_FILE: ", fd.status().message(), "; logging to stderr"));
    }
  }
  Log().set_level(level);
  return status;
}

}  // namespace vmmshim
