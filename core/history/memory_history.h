// The memory history: what happened to the device memory the shim serves,
// event by event, for the snapshot (core/report/memory_snapshot.h: PyTorch's
// memory_viz format) and the Perfetto timeline (`vmmshim trace`).
//
// Events, with the memory_viz action each becomes:
//   kAlloc          "alloc": an allocation served (addr, size = requested bytes)
//   kFreeRequested  "free_requested": the program freed it (cuMemFree, cuMemFreeAsync)
//   kFreeCompleted  "free_completed": its memory may serve another
//                   allocation (right after the request, or when a deferred
//                   free completes)
//   kSegmentAlloc   "segment_alloc": a physical handle mapped (cuMemCreate +
//                   cuMemMap): a large allocation's own block, or a packed one
//   kSegmentFree    "segment_free": unmapped and released (cache trimmed,
//                   cache full, context released)
//   kSegmentUnmap   "segment_unmap": released by a pause, its VA kept
//   kSegmentMap     "segment_map": mapped again by a resume
//   kOom            "oom": an allocation failed for lack of memory
//                   (size = request, device_free = the driver's free bytes)
//   kSnapshot       "snapshot": a snapshot was taken
// and vmmshim's own, which memory_viz does not know (kept in the snapshot's
// "vmmshim_events", read by `vmmshim trace`): kPeerEnable/kPeerDisable
// (device = owner, peer; the first enable and the last disable of a pair,
// as nested calls count once), kPeerGrant/kPeerDeny (a block's access decided
// for a peer: addr, size, tag), kPauseBegin/End, kResumeBegin/End (tag;
// size = bytes released or mapped at the end).
//
// Cost: nothing while disabled (one relaxed load at the callers). Enabled,
// one mutex and one append per event; tags and call stacks are interned.
// At most `max_entries` events are kept; beyond that the oldest are
// dropped (counted), as PyTorch's _record_memory_history(max_entries) does.
//
// Time: nanoseconds of the steady clock since Enable; Contents() gives the
// wall-clock microseconds of that start (memory_viz's time_us is epoch-based).
//
// Thread safety: every method may be called from any thread; the mutex is
// a leaf (core/sync/lock_order.h), taken also under an arena's mutex.
// Process exit: never destroyed (the shim leaks its runtime on purpose).
#ifndef VMMSHIM_CORE_HISTORY_MEMORY_HISTORY_H_
#define VMMSHIM_CORE_HISTORY_MEMORY_HISTORY_H_

#include <cuda.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/sync/mutex.h"

namespace vmmshim {

enum class HistoryAction : uint8_t {
  kAlloc,
  kFreeRequested,
  kFreeCompleted,
  kSegmentAlloc,
  kSegmentFree,
  kSegmentMap,
  kSegmentUnmap,
  kOom,
  kSnapshot,
  // vmmshim's own (header comment).
  kPeerEnable,
  kPeerDisable,
  kPeerGrant,
  kPeerDeny,
  kPauseBegin,
  kPauseEnd,
  kResumeBegin,
  kResumeEnd,
};
inline constexpr int kHistoryActions = static_cast<int>(HistoryAction::kResumeEnd) + 1;

// The action's name as written in the snapshot ("alloc", "segment_map",
// "peer_grant", "pause_begin", ...).
absl::string_view HistoryActionName(HistoryAction action);
// Whether memory_viz knows the action (it goes into "device_traces").
inline bool IsMemoryVizAction(HistoryAction action) {
  return action <= HistoryAction::kSnapshot;
}

struct HistoryEvent {
  int64_t time_ns = 0;     // since the history was enabled
  uint64_t addr = 0;
  uint64_t size = 0;       // bytes (header comment says which)
  uint64_t stream = 0;     // the CUstream as a number; 0: none or the legacy default stream
  uint64_t device_free = 0;  // kOom: the driver's free bytes on the device
  uint32_t tag = 0;        // index into a snapshot's tags; 0: untagged
  uint32_t stack = 0;      // MemoryHistory::InternStack id; 0: none recorded
  uint32_t thread = 0;     // kernel thread id
  uint16_t library = 0;    // CallerLibraries id; 0: unknown
  int16_t device = -1;
  int16_t peer = -1;       // peer events: the other device
  HistoryAction action = HistoryAction::kAlloc;
};

// The fields a caller sets; the history adds time and thread.
struct HistoryRecord {
  HistoryAction action = HistoryAction::kAlloc;
  int device = -1;
  uint64_t addr = 0;
  uint64_t size = 0;
  absl::string_view tag;
  uint16_t library = 0;
  uint32_t stack = 0;
  uint64_t stream = 0;
  int peer = -1;
  uint64_t device_free = 0;
};

class MemoryHistory {
 public:
  // Events kept at most (the oldest are dropped beyond).
  static constexpr size_t kDefaultMaxEntries = 1000000;
  // Frames recorded at most per call stack.
  static constexpr int kMaxStackFrames = 64;

  MemoryHistory() = default;
  MemoryHistory(const MemoryHistory&) = delete;
  MemoryHistory& operator=(const MemoryHistory&) = delete;

  // Starts recording (kept events stay); `max_entries` >= 1, `stack_frames`
  // 0..kMaxStackFrames (0: none; call stacks cost an unwind per allocation).
  void Enable(size_t max_entries, int stack_frames) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops recording; the events kept stay for a snapshot.
  void Disable() { enabled_.store(false, std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  int stack_frames() const { return stack_frames_.load(std::memory_order_relaxed); }

  // Appends one event when enabled.
  void Record(const HistoryRecord& record) ABSL_LOCKS_EXCLUDED(mu_);

  // The id of a call stack (return addresses, innermost first); 0 for an
  // empty one. The same stack gets the same id.
  uint32_t InternStack(absl::Span<void* const> frames) ABSL_LOCKS_EXCLUDED(mu_);

  struct Contents {
    std::vector<HistoryEvent> events;  // oldest first
    std::vector<std::string> tags;     // index 0: "" (untagged)
    std::vector<std::vector<uintptr_t>> stacks;  // index 0: empty
    uint64_t dropped = 0;              // events dropped for max_entries
    int64_t start_epoch_us = 0;        // wall clock at Enable, microseconds since 1970
  };
  // A copy of what is kept (a snapshot writes it without holding the lock).
  Contents Copy() const ABSL_LOCKS_EXCLUDED(mu_);
  // The time of an event recorded now, as Record would stamp it.
  int64_t NowNs() const;

  // fork(): the child gets a fresh, unlocked mutex (core/shim_core.h, PrepareFork).
  void PrepareFork() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Lock(); }
  void AfterForkParent() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Unlock(); }
  void AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS;

 private:
  uint32_t InternTagLocked(absl::string_view tag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::atomic<bool> enabled_{false};
  std::atomic<int> stack_frames_{0};
  std::atomic<int64_t> start_ns_{0};  // steady clock at the first Enable (ns since its epoch)

  mutable Mutex mu_;
  size_t max_entries_ ABSL_GUARDED_BY(mu_) = kDefaultMaxEntries;
  std::vector<HistoryEvent> events_ ABSL_GUARDED_BY(mu_);  // a ring once full
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;  // where the next event goes once full
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t start_epoch_us_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> tags_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> tag_ids_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<uintptr_t>> stacks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::vector<uintptr_t>, uint32_t> stack_ids_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HISTORY_MEMORY_HISTORY_H_
