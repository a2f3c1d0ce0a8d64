// The memory snapshot: what the shim holds now and what happened before,
// as the pickle PyTorch's memory tools read (torch.cuda.memory._snapshot()'s
// format, rendered by torch/cuda/_memory_viz.py and pytorch.org/memory_viz).
//
//   {"segments": [...], "device_traces": [[...] per device], "vmmshim": {...}}
//
// segments: one per block of the heaps that holds physical memory (a large
//   allocation's own handle, a packed block of small ones, a cached block):
//   device, address, total_size, allocated_size, active_size,
//   requested_size, stream 0, segment_type ("large", or "small" for packed
//   blocks), segment_pool_id (0, 0), is_expandable False, frames [], tag,
//   and blocks that tile it in address order: address, size (bytes of the
//   segment taken), requested_size, state ("active_allocated" or
//   "inactive") and frames. Paused blocks hold no memory: they are listed
//   under vmmshim.paused_segments instead.
// device_traces: per device, the history's memory_viz events (segment
//   events carry no caller library: a block serves many)
//   (core/history/memory_history.h) oldest first: action, addr, size,
//   stream, time_us (microseconds since 1970), frames, category (the tag;
//   "unknown" when untagged), tag, library, thread; oom events also have
//   device_free. Each device's list ends with a "snapshot" event (category
//   "unknown", which memory_viz's viewer needs among the categories once
//   any event has one), which has only action, time_us, addr, size, stream,
//   category and frames. Only that event when the history was never enabled.
// frames: the recorded call stack (filename = the object's path, name =
//   the dynamic symbol, demangled, or else the offset in the object as
//   "0x..."; line = the offset from the symbol), or
//   without one a single frame naming the caller library
//   (core/history/caller_library.h): filename = the library, line 0,
//   name "(caller library)"; memory_viz shows "libcublas:0:(caller library)".
// vmmshim: format (kSnapshotFormat; a reader refuses another), version, pid, libraries (names by id), events (peer enable,
//   grants, denials, pauses and resumes, which memory_viz does not know;
//   `vmmshim trace` reads them), dropped_events (beyond max entries),
//   history (whether it was recording), paused_segments.
//
// Thread safety: any thread; reads the memory control and the history through
// their own locks (a consistent view per arena, not across them).
#ifndef VMMSHIM_CORE_REPORT_MEMORY_SNAPSHOT_H_
#define VMMSHIM_CORE_REPORT_MEMORY_SNAPSHOT_H_

#include <string>

#include "absl/status/status.h"
#include "core/memory_control.h"
#include "core/history/caller_library.h"
#include "core/history/memory_history.h"

namespace vmmshim {

// The layout of the "vmmshim" part; raised when a reader would misread it.
inline constexpr int kSnapshotFormat = 1;

struct SnapshotSources {
  const MemoryControl* control = nullptr;          // required
  const MemoryHistory* history = nullptr;        // null: no device_traces
  const CallerLibraries* libraries = nullptr;    // null: every library "unknown"
  int pid = 0;
};

// The snapshot as pickle bytes (protocol 2).
std::string MemorySnapshotPickle(const SnapshotSources& sources);

// Writes the snapshot to `path`: into a temporary file beside it, renamed
// over `path` when complete, so that a reader never sees half a snapshot
// and a full disk leaves the old file (or none). Errors name the path and
// the system's reason (InvalidArgument for an empty path, Unavailable for
// an open, write or rename failure); the program is not affected.
absl::Status WriteMemorySnapshot(const SnapshotSources& sources, const std::string& path);

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_REPORT_MEMORY_SNAPSHOT_H_
