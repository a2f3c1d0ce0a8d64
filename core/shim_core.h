// Every room of core/, built bottom-up and owned in one place: the object
// the interposition layer (and each test) makes once (docs/architecture.md
// draws the house).
//
// What it hands out:
//   - allocator(): allocation, free and the events that change what the
//     program holds (core/allocator.h);
//   - control(): what asks about or steers the memory, apart from
//     allocation (core/memory_control.h);
//   - pause(): pause and resume by tag (core/heap/pause.h);
//   - stream_ordered(): cuMemAllocAsync and the default pools
//     (core/stream_ordered/stream_ordered_front_end.h);
//   - captures(): stream captures in progress (core/sync/capture.h);
//   - peers(): device-pair peer enables and per-allocation grants
//     (core/peer/enable/peer_grants.h);
//   - foreign(): other libraries' own VMM memory, as the hooks observe it
//     (core/foreign/foreign_vmm.h);
//   - counters(): the calls the interposition layer counts.
// The wiring is done here, once: a room above registers with the one
// below through an interface the lower one owns (HeapTable::Listener,
// PauseParticipant, PausableMemory), never a stored callback
// (docs/architecture.md, "Callbacks").
//
// Thread safety: the rooms' own (each header); construction, ReleaseAll and
// destruction must not overlap other calls. Lock order: core/sync/lock_order.h.
// Process exit: the shim never destroys its ShimCore (hooks run from other
// libraries' destructors); tests do.
#ifndef VMMSHIM_CORE_SHIM_CORE_H_
#define VMMSHIM_CORE_SHIM_CORE_H_

#include <atomic>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "core/allocator.h"
#include "core/allocator_stats.h"
#include "core/driver/driver_api.h"
#include "core/driver/vmm_mapping.h"
#include "core/foreign/foreign_vmm.h"
#include "core/heap/heap_table.h"
#include "core/heap/pause.h"
#include "core/memory_control.h"
#include "core/peer/enable/peer_enable.h"
#include "core/peer/enable/peer_grants.h"
#include "core/stream_ordered/stream_ordered_front_end.h"
#include "core/sync/capture.h"
#include "core/sync/context_sync.h"

namespace vmmshim {

class ShimCore {
 public:
  // `driver` must outlive the core.
  explicit ShimCore(const DriverApi& driver, AllocatorOptions options = {});
  // Releases everything still held (see ReleaseAll).
  ~ShimCore();
  ShimCore(const ShimCore&) = delete;
  ShimCore& operator=(const ShimCore&) = delete;

  Allocator& allocator() { return allocator_; }
  const Allocator& allocator() const { return allocator_; }
  MemoryControl& control() { return control_; }
  const MemoryControl& control() const { return control_; }
  PauseCoordinator& pause() { return pause_; }
  const PauseCoordinator& pause() const { return pause_; }
  StreamOrderedFrontEnd& stream_ordered() { return stream_ordered_; }
  CaptureTracker& captures() { return captures_; }
  PeerGrants& peers() { return peers_; }
  const PeerGrants& peers() const { return peers_; }
  ForeignVmm& foreign() { return foreign_; }
  CallCounters& counters() { return counters_; }
  PeerEnableFigures& peer_enables() { return peer_enables_; }

  // fork(): PrepareFork takes every lock of every room in the order of
  // core/sync/lock_order.h; AfterFork releases them in the parent (in
  // reverse) and gives the child (a single thread) fresh, unlocked mutexes.
  // For pthread_atfork.
  void PrepareFork() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void AfterFork(bool in_child) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // Unmaps and releases every handle and frees every reservation, in the
  // guide's order (unmap -> release -> address free), and drops the host
  // copies of paused memory. Live allocations become invalid. Returns the
  // first driver error; continues past errors. Teardown.
  absl::Status ReleaseAll();

 private:
  const DriverApi& driver_;
  const AllocatorOptions options_;
  const VmmMapper mapper_;
  CaptureTracker captures_;
  // Frees' synchronizes of their contexts, combined across threads.
  SyncCombiner free_syncs_;
  HeapTable heaps_;
  StreamOrderedFrontEnd stream_ordered_;
  PeerGrants peers_;
  ForeignVmm foreign_;  // before pause_, which pauses it too
  PauseCoordinator pause_;
  CallCounters counters_;
  PeerEnableFigures peer_enables_;
  std::atomic<uint64_t> memory_margin_bytes_{0};  // MemoryControl::SetMemoryMarginBytes
  Allocator allocator_;
  MemoryControl control_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_SHIM_CORE_H_
