// What the hooks tell the memory history and the log about allocations:
// events with their caller library and call stack, and the out-of-memory
// report. Declared in hooks_internal.h; no allocation logic here.
#include <execinfo.h>

#include <atomic>
#include <chrono>

#include "config/config.h"
#include "core/base/log.h"
#include "core/driver/cu_status.h"
#include "core/report/oom_report.h"
#include "interpose/hooks_internal.h"

namespace vmmshim {
namespace {

// The call stack above the hook (the frames of this file and the hook
// itself left out), interned; 0 when stacks are off.
__attribute__((noinline)) uint32_t CurrentStack(const Runtime& rt) {
  const int wanted = rt.history->stack_frames();
  if (wanted <= 0) return 0;
  constexpr int kSkipped = 2;  // this function's caller here, and the hook
  void* frames[MemoryHistory::kMaxStackFrames + kSkipped + 1];
  const int n = backtrace(frames, wanted + kSkipped + 1);
  // frames[0] is this function.
  const int first = 1 + kSkipped;
  if (n <= first) return 0;
  return rt.history->InternStack(absl::MakeConstSpan(frames + first, n - first));
}

int CurrentDevice(const Runtime& rt) {
  CUdevice device = -1;
  return rt.driver.cuCtxGetDevice(&device) == CUDA_SUCCESS ? device : -1;
}

}  // namespace

__attribute__((noinline)) void RecordAllocation(const Runtime& rt, int device, CUdeviceptr ptr,
                                                size_t bytes, uint16_t library,
                                                CUstream stream) {
  HistoryRecord r;
  r.action = HistoryAction::kAlloc;
  r.device = device >= 0 ? device : CurrentDevice(rt);
  r.addr = ptr;
  r.size = bytes;
  r.tag = AllocationTag();
  r.library = library;
  r.stack = CurrentStack(rt);
  r.stream = reinterpret_cast<uint64_t>(stream);
  rt.history->Record(r);
}

std::optional<PointerInfo> LookUpForHistory(const Runtime& rt, CUdeviceptr ptr) {
  absl::StatusOr<PointerInfo> info = rt.allocator->Find(ptr);
  if (!info.ok() || info->allocation_base != ptr) return std::nullopt;
  return *info;
}

__attribute__((noinline)) void NoteFree(const Runtime& rt, const std::optional<PointerInfo>& info,
                                        uint16_t library, CUstream stream) {
  if (!info.has_value() || !Recording(rt)) return;
  HistoryRecord r;
  r.action = HistoryAction::kFreeRequested;
  r.device = info->device;
  r.addr = info->allocation_base;
  r.size = info->allocation_size;
  r.tag = info->tag;
  r.library = library;
  r.stack = CurrentStack(rt);
  r.stream = reinterpret_cast<uint64_t>(stream);
  rt.history->Record(r);
  // The shim completes a free when it returns (after synchronizing the
  // context; a free deferred by a capture is not reused before it
  // completes either).
  r.action = HistoryAction::kFreeCompleted;
  rt.history->Record(r);
}

void NoteAllocationFailed(const Runtime& rt, const absl::Status& status, const char* entry_point,
                          size_t bytes, uint16_t library) {
  if (ToCuResult(status) != CUDA_ERROR_OUT_OF_MEMORY) return;
  OomRequest request;
  request.device = CurrentDevice(rt);
  request.bytes = bytes;
  request.tag = std::string(AllocationTag());
  request.entry_point = entry_point;
  request.library = library;
  size_t free_bytes = 0, total_bytes = 0;
  if (rt.driver.cuMemGetInfo_v2(&free_bytes, &total_bytes) == CUDA_SUCCESS) {
    request.device_free = free_bytes;
    request.device_total = total_bytes;
  }
  if (Recording(rt)) {
    HistoryRecord r;
    r.action = HistoryAction::kOom;
    r.device = request.device;
    r.size = bytes;
    r.tag = request.tag;
    r.library = library;
    r.device_free = request.device_free;
    rt.history->Record(r);
  }
  // The whole report at the first failure and then at most once a second
  // (a caching allocator retries after emptying its cache, and a program
  // may probe for the largest allocation that fits); one line otherwise.
  static std::atomic<int64_t> last_report_ns{0};
  static std::atomic<uint64_t> failures{0};
  const uint64_t failure = failures.fetch_add(1, std::memory_order_relaxed) + 1;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  int64_t last = last_report_ns.load(std::memory_order_relaxed);
  const bool full = (last == 0 || now - last >= 1000000000) &&
                    last_report_ns.compare_exchange_strong(last, now);
  if (!full) {
    Log().warn("out of memory again: {} of {} on device {} (failure {}; the whole report at most "
               "once a second)",
               entry_point, HumanBytes(bytes), request.device, failure);
    return;
  }
  std::string report = OomReport(rt.core->control(), rt.callers, request);
  if (failure == 1 && !rt.config.snapshot_file.empty()) {
    const std::string path = ChildStatsPath(rt.config.snapshot_file, "oom");
    absl::Status written = WriteSnapshot(rt, path);
    report += written.ok() ? absl::StrCat("\n  memory snapshot written to ", path)
                           : absl::StrCat("\n  ", written.message());
  }
  Log().warn("{}", report);
}

}  // namespace vmmshim
