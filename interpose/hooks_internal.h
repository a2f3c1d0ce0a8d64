// Shared by the interpose/hooks_*.cc files and interpose/api.cc only.
//
// Declares every hook of interpose/hook_list.h with its driver ABI (a
// definition with another signature fails to compile) and the few helpers
// more than one family uses.
#ifndef VMMSHIM_INTERPOSE_HOOKS_INTERNAL_H_
#define VMMSHIM_INTERPOSE_HOOKS_INTERNAL_H_

#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/base/tls.h"
#include "interpose/hook_list.h"
#include "interpose/runtime.h"

// The exported symbols (the version script, generated from hook_list.h,
// lists the same names).
#define VMMSHIM_EXPORT extern "C" __attribute__((visibility("default")))

#define VMMSHIM_DECLARE_HOOK(name, pfn) VMMSHIM_EXPORT std::remove_pointer_t<pfn> name;
VMMSHIM_HOOKED_DRIVER_EXPORTS(VMMSHIM_DECLARE_HOOK)
#undef VMMSHIM_DECLARE_HOOK
// The gated hooks (interpose/hooks_submission.cc), one per entry point of
// core/driver/work_submission.h. A declaration of cuda.h with another type
// fails to compile here.
#define VMMSHIM_DECLARE_GATED_HOOK(member, symbol, type, required) \
  VMMSHIM_EXPORT std::remove_pointer_t<type> member;
VMMSHIM_WORK_SUBMISSION_ENTRY_POINTS(VMMSHIM_DECLARE_GATED_HOOK)
#undef VMMSHIM_DECLARE_GATED_HOOK

namespace vmmshim {

// Looks up, once, what a held thread needs to step out of the Python GIL
// (interpose/hooks_submission.cc); called at start, so that no first wait
// (in a signal handler, say) does it.
void PrepareGatedHooks();

// The calling thread's allocation tag (vmmshim_set_allocation_tag; at most
// 255 bytes, checked there), read on every allocation: a fixed buffer, so
// that the thread-local needs no constructor guard or destructor. A thread
// that set none (`own` false: zero-initialized) carries the process's
// default tag (vmmshim_set_default_allocation_tag).
struct ThreadTag {
  char bytes[256];
  unsigned char length;
  bool own;
};
inline ThreadTag& AllocationTagStorage() {
  VMMSHIM_INITIAL_EXEC_TLS thread_local ThreadTag tag;
  return tag;
}
// The default tag: an immutable string replaced whole; a replaced one is
// never freed (a reader may hold it; a process sets it a few times at most).
inline std::atomic<const std::string*>& DefaultAllocationTagStorage() {
  static std::atomic<const std::string*> tag{nullptr};
  return tag;
}
inline absl::string_view AllocationTag() {
  const ThreadTag& t = AllocationTagStorage();
  if (!t.own) {
    const std::string* d = DefaultAllocationTagStorage().load(std::memory_order_acquire);
    return d != nullptr ? absl::string_view(*d) : absl::string_view();
  }
  return absl::string_view(t.bytes, t.length);
}
// nullptr: back to the process's default.
inline void SetAllocationTag(const char* tag) {
  ThreadTag& t = AllocationTagStorage();
  t.own = tag != nullptr;
  if (tag == nullptr) return;
  const size_t n = std::min<size_t>(std::strlen(tag), sizeof t.bytes - 1);
  std::memcpy(t.bytes, tag, n);
  t.length = static_cast<unsigned char>(n);
}

// VMMSHIM_TRACE_FILE: records a successful allocation or free.
inline void Trace(const Runtime& rt, const char* op, size_t bytes, CUdeviceptr ptr) {
  if (rt.trace == nullptr) return;
  CUdevice device = -1;
  rt.driver.cuCtxGetDevice(&device);
  rt.trace->Record(device, op, bytes, ptr);
}

// The caller library of the hook this is expanded in (the id
// CallerLibraries gives its return address; 0 with attribution off). A
// macro: the return address must be the hook's own.
#define VMMSHIM_CALLER_LIBRARY(rt)                                                  \
  ((rt).callers != nullptr                                                          \
       ? (rt).callers->Resolve(__builtin_return_address(0), __builtin_frame_address(0)) \
       : uint16_t{0})

// The memory history (interpose/observe.cc): each Note* is one relaxed load
// while the history does not record.
inline bool Recording(const Runtime& rt) {
  return rt.history != nullptr && rt.history->enabled();
}
// A served allocation: "alloc". `device` -1: the current context's.
void RecordAllocation(const Runtime& rt, int device, CUdeviceptr ptr, size_t bytes,
                      uint16_t library, CUstream stream);
inline void NoteAllocation(const Runtime& rt, int device, CUdeviceptr ptr, size_t bytes,
                           uint16_t library, CUstream stream = nullptr) {
  if (Recording(rt)) RecordAllocation(rt, device, ptr, bytes, library, stream);
}
// What a free needs recorded, looked up before the free (nullopt: not
// recording, or not shim memory).
std::optional<PointerInfo> LookUpForHistory(const Runtime& rt, CUdeviceptr ptr);
inline std::optional<PointerInfo> BeforeFree(const Runtime& rt, CUdeviceptr ptr) {
  return Recording(rt) ? LookUpForHistory(rt, ptr) : std::nullopt;
}
// The free of `info` succeeded: "free_requested" and "free_completed".
void NoteFree(const Runtime& rt, const std::optional<PointerInfo>& info, uint16_t library,
              CUstream stream = nullptr);
// An allocation of `bytes` failed with `status`: when for lack of memory,
// the out-of-memory report (core/report/oom_report.h) in the log, an "oom"
// event, and at the first one the snapshot (VMMSHIM_SNAPSHOT_FILE with
// .oom before the extension).
void NoteAllocationFailed(const Runtime& rt, const absl::Status& status,
                          const char* entry_point, size_t bytes, uint16_t library);

}  // namespace vmmshim

#endif  // VMMSHIM_INTERPOSE_HOOKS_INTERNAL_H_
