// The allocation trace (VMMSHIM_TRACE_FILE): one CSV line per allocation or
// free that reaches the hooks, for replay by bench/replay.
//
//   time_us,thread,device,op,bytes,pointer
//   12.5,4711,0,alloc,256,0x7f0000000000
//   20.1,4711,0,free,0,0x7f0000000000
//
// time_us: microseconds since the trace was opened (steady clock); thread:
// the kernel thread id; op: alloc or free (failed calls are not recorded);
// bytes: the request (0 for free); pointer: the device pointer in hex.
// Lines are buffered and flushed at exit; a process killed before exit may
// lose the tail.
// Thread safety: Record may be called from any thread (one mutex).
#ifndef VMMSHIM_CORE_REPORT_TRACE_H_
#define VMMSHIM_CORE_REPORT_TRACE_H_

#include <cuda.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "core/sync/mutex.h"

namespace vmmshim {

class TraceWriter {
 public:
  // Replaces `path` with a new file (refused for a symbolic link, a
  // device node or another user's file: core/base/safe_file.h) and writes
  // the header.
  absl::Status Open(const std::string& path);
  void Record(int device, const char* op, size_t bytes, CUdeviceptr ptr);
  void Flush();

 private:
  Mutex mu_;
  std::FILE* file_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_REPORT_TRACE_H_
