#include "core/report/trace.h"

#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/base/safe_file.h"

namespace vmmshim {

absl::Status TraceWriter::Open(const std::string& path) {
  MutexLock lock(&mu_);
  // Note [Replacing a file safely] (core/base/safe_file.h): in place at
  // once, then written as a stream.
  absl::StatusOr<int> created = CreateReplacing(path, DefaultFileMode());
  if (!created.ok()) {
    return absl::Status(created.status().code(),
                        absl::StrCat("VMMSHIM_TRACE_FILE: ", created.status().message()));
  }
  const int fd = *created;
  file_ = fdopen(fd, "w");
  if (file_ == nullptr) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("VMMSHIM_TRACE_FILE: cannot open '", path,
                                               "': ", std::strerror(err)));
  }
  start_ = std::chrono::steady_clock::now();
  std::fputs("time_us,thread,device,op,bytes,pointer\n", file_);
  return absl::OkStatus();
}

void TraceWriter::Record(int device, const char* op, size_t bytes, CUdeviceptr ptr) {
  const double us = std::chrono::duration<double, std::micro>(
                        std::chrono::steady_clock::now() - start_)
                        .count();
  const long tid = syscall(SYS_gettid);
  MutexLock lock(&mu_);
  if (file_ == nullptr) return;
  std::fprintf(file_, "%.1f,%ld,%d,%s,%zu,%#llx\n", us, tid, device, op, bytes,
               static_cast<unsigned long long>(ptr));
}

void TraceWriter::Flush() {
  MutexLock lock(&mu_);
  if (file_ != nullptr) std::fflush(file_);
}

}  // namespace vmmshim
