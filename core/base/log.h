// vmmshim's logger: one spdlog logger shared by core/ and interpose/.
//
// Messages go to stderr by default, prefixed "[vmmshim <pid>] <level>:".
// The logger is created on first use and deliberately never destroyed: hooks
// can run during static destruction and atexit handlers of the host program,
// after ordinary statics of ours would be gone.
// Thread safety: Log() and the logger may be used from any thread;
// InstallLogger must be called before other threads log (the shim does so in
// its one-time initialization).
#ifndef VMMSHIM_CORE_BASE_LOG_H_
#define VMMSHIM_CORE_BASE_LOG_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "spdlog/spdlog.h"

namespace vmmshim {

spdlog::logger& Log();

// Replaces the sink: `path` empty means stderr; otherwise the file is opened
// for appending. Returns an error naming the path when the file cannot be
// opened or its directory does not exist (never created); the logger keeps
// stderr then.
absl::Status ConfigureLog(spdlog::level::level_enum level, const std::string& path);

// fork(): PrepareLogForFork takes the lock every log line is written under;
// AfterLogFork releases it (parent and child). For pthread_atfork.
void PrepareLogForFork();
void AfterLogFork();

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_BASE_LOG_H_
