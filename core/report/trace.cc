#include "core/report/trace.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace vmmshim {

absl::Status TraceWriter::Open(const std::string& path) {
  MutexLock lock(&mu_);
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("VMMSHIM_TRACE_FILE: cannot open '", path,
                                                   "': ", std::strerror(errno)));
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
