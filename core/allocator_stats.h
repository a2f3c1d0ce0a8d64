// The allocator's process-wide figures (MemoryControl::GetStats) and the
// counters of calls the interposition layer makes to the driver itself
// (pass-throughs, peer enables), which those figures include. Bytes are
// requested bytes unless a field says otherwise; seconds are wall time.
#ifndef VMMSHIM_CORE_ALLOCATOR_STATS_H_
#define VMMSHIM_CORE_ALLOCATOR_STATS_H_

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "core/heap/types.h"
#include "core/sync/mutex.h"

namespace vmmshim {

// Process-wide figures: sums over the devices' DeviceStats (the one source
// of truth), plus what was handed to the driver.
struct AllocatorStats {
  uint64_t served_allocations = 0;       // allocations served from VMM
  uint64_t served_bytes = 0;             // their requested bytes
  uint64_t passthrough_allocations = 0;  // requests handed to the driver
  uint64_t passthrough_bytes = 0;
  uint64_t frees = 0;
  uint64_t live_allocations = 0;
  uint64_t live_bytes = 0;               // requested bytes of live allocations
  uint64_t handles = 0;                  // live physical handles
  uint64_t handle_bytes = 0;             // their bytes (device memory in use)
  uint64_t peak_handle_bytes = 0;        // the most held at once, all devices together
  uint64_t deferred_frees = 0;           // frees held back by stream captures
  uint64_t stream_ordered_allocations = 0;  // cuMemAllocAsync served (in served_allocations
                                            // only when they made a new heap allocation)
  uint64_t stream_ordered_reuses = 0;       // of them, from the stream-ordered cache
  uint64_t stream_ordered_cached_bytes = 0; // freed blocks held for reuse now
  // Frees' context synchronizes (core/sync/context_sync.h): how many ran, and how
  // many frees returned on one that another free ran.
  uint64_t free_synchronizes = 0;
  uint64_t free_synchronizes_shared = 0;
  // cuCtxEnablePeerAccess as the program saw it (core/peer/enable/peer_enable.h): calls
  // and the seconds they took, the driver's enable and the shim's grants
  // together, whatever they returned.
  uint64_t peer_enable_calls = 0;
  double peer_enable_seconds = 0;
  // Pauses (PauseCoordinator::Pause): physical bytes released and not resumed yet, and the most
  // at once, all devices together.
  uint64_t paused_bytes = 0;
  uint64_t peak_paused_bytes = 0;
  // One entry per device the shim served, in device order (the sums above
  // are over these).
  std::vector<DeviceStats> devices;
};

// What the interposition layer reports about calls the allocator does not
// make itself (for GetStats and Residency). Thread-safe: relaxed atomics,
// and a mutex around the passed-through allocations still live (a rare
// path: the shim serves every allocation it can).
class CallCounters {
 public:
  // A request handed to the driver unchanged.
  void PassThrough(size_t bytes) {
    passthrough_allocations_.fetch_add(1, std::memory_order_relaxed);
    passthrough_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  // The same for a cuMemAlloc-style allocation the driver made at `ptr` on
  // `device`: its bytes count as passed through and live until
  // PassThroughFreed(ptr) (the residency report's "passed through").
  void PassThroughLive(CUdeviceptr ptr, size_t bytes, int device)
      ABSL_LOCKS_EXCLUDED(live_mu_);
  // `ptr` was freed by the driver (a pointer the shim does not own). One
  // atomic load when nothing passed through is live.
  void PassThroughFreed(CUdeviceptr ptr) ABSL_LOCKS_EXCLUDED(live_mu_);
  // Live passed-through bytes on `device`.
  uint64_t PassedThroughLive(int device) const ABSL_LOCKS_EXCLUDED(live_mu_);
  void AddTo(AllocatorStats* s) const;

 private:
  std::atomic<uint64_t> passthrough_allocations_{0}, passthrough_bytes_{0};
  std::atomic<size_t> live_count_{0};  // live_.size()
  mutable Mutex live_mu_;  // a leaf (core/sync/lock_order.h, locks outside the allocator's order)
  absl::flat_hash_map<CUdeviceptr, std::pair<size_t, int>> live_ ABSL_GUARDED_BY(live_mu_);
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_ALLOCATOR_STATS_H_
