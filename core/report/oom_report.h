// The out-of-memory report: when an allocation fails for lack of memory
// after the shim released its own caches, one block of text that says who
// holds the device's memory, for the log.
//
//   out of memory: 40.0 GiB requested on device 0 (tag "kv", from libc10_cuda);
//   the driver reports 12.3 GiB free of 139.8 GiB
//     held by this process through vmmshim on device 0: 120.1 GiB
//       live allocations       118.0 GiB in 2,345 allocations
//       cached for reuse         1.0 GiB
//       ...
//     by tag: kv 100.0 GiB, (untagged) 18.0 GiB
//     by library: libc10_cuda 117.5 GiB, libcublas 512.0 MiB
//     largest live allocations:
//       0x7f0000000000  40.0 GiB  tag kv  libc10_cuda
//
// Kinds, bytes of physical memory (core/report/residency.h defines each):
// live allocations (the blocks that hold them; a packed block counts whole),
// cached for reuse, stream-ordered cache (part of the live figure: freed,
// waiting for its stream), paused (released, not device memory now), passed
// through to the driver, other libraries' VMM memory, release pending.
// "By tag" and "by library" count the requested bytes of live allocations.
//
// Sizes are binary units with one decimal (KiB, MiB, GiB). No driver call:
// the caller passes the driver's free and total bytes.
// Thread safety: any thread (reads the memory control through the arenas' locks).
#ifndef VMMSHIM_CORE_REPORT_OOM_REPORT_H_
#define VMMSHIM_CORE_REPORT_OOM_REPORT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/memory_control.h"
#include "core/history/caller_library.h"

namespace vmmshim {

struct OomRequest {
  int device = -1;
  uint64_t bytes = 0;         // requested
  std::string tag;            // "" untagged
  std::string entry_point;    // "cuMemAlloc", "cuMemAllocAsync", ...
  uint16_t library = 0;       // the caller (CallerLibraries id)
  uint64_t device_free = 0;   // cuMemGetInfo after the failure
  uint64_t device_total = 0;  // 0: unknown (not printed)
};

// The report's text, lines separated by '\n' (no trailing newline).
// `largest`: how many live allocations to list.
std::string OomReport(const MemoryControl& control, const CallerLibraries* libraries,
                      const OomRequest& request, int largest = 10);

// "1.5 GiB", "512.0 KiB", "100 bytes".
std::string HumanBytes(uint64_t bytes);

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_REPORT_OOM_REPORT_H_
