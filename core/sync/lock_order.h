// The one lock order of vmmshim's core. A thread holding a lock of rank r
// takes only locks of a higher rank; locks of one rank are never held two at
// a time, except where the row says so. docs/architecture.md shows this
// table, and tests/unit/lock_order_test.cc fails when the two differ.
//
// Where both locks are members of one class, the order is also written as
// ABSL_ACQUIRED_AFTER on the later one (clang -Wthread-safety checks what it
// can: tools/test.sh builds with it). Across classes clang cannot name the
// other object, so this table is the contract, and each mutex's declaration
// names its row.
//
// fork(): ShimCore::PrepareFork takes every lock of the rooms in this
// order and the parent releases them in reverse; the child gets fresh
// mutexes (its other threads do not exist).
#ifndef VMMSHIM_CORE_SYNC_LOCK_ORDER_H_
#define VMMSHIM_CORE_SYNC_LOCK_ORDER_H_

#include <array>
#include <string_view>

namespace vmmshim {

struct LockRank {
  std::string_view name;   // the lock, as the code names it
  std::string_view where;  // its declaration
  std::string_view why;    // what it orders
};

// Highest first: rank 0 is taken first.
inline constexpr std::array<LockRank, 11> kLockOrder = {{
    {"sleep coordinator mutex", "SleepCoordinator::mu_ (core/sleep/sleep_coordinator.h)",
     "serializes quiesced pauses, resumes, sleeps and wakes; held across the quiesce"},
    {"capture gate", "CaptureTracker::gate_ (core/sync/capture.h)",
     "shared by frees across their synchronize, exclusive across cuStreamBeginCapture"},
    {"pause mutex", "PauseCoordinator::mu_ (core/heap/pause.h)",
     "serializes pauses and resumes"},
    {"other libraries' VMM mutex", "ForeignVmm::mu_ (core/foreign/foreign_vmm.h)",
     "other libraries' VMM calls and their handles' state; held across those driver calls and "
     "through a pause or resume"},
    {"peer mutex", "HeapTable::peer_mu_ (core/heap/heap_table.h)",
     "orders peer enables, disables and pool access, and the grants they cause"},
    {"heap creation mutex", "HeapTable::create_mu_ (core/heap/heap_table.h)",
     "serializes the creation of a device's heap and stream-ordered cache"},
    {"stream-ordered cache mutex", "StreamOrderedCache::mu_ (core/stream_ordered/stream_ordered_cache.h)",
     "one device's freed stream-ordered blocks; never held while an arena mutex is taken"},
    {"arena mutex", "HeapArena::mu_ (core/heap/heap_arena.h)",
     "one arena's blocks and cache; one arena at a time"},
    {"reservation map mutex", "ReservationMap::mu_ (core/heap/va_free_list.h)",
     "writers of the VA reservation snapshot (readers take no lock)"},
    {"export registry mutex", "ExportRegistry::mu_ (core/heap/export_registry.h)",
     "export tokens"},
    {"capture state mutex", "CaptureTracker::mu_ (core/sync/capture.h)",
     "the captures in progress; a leaf"},
}};

// Locks outside the allocator, each a leaf: held only around its own state,
// never while calling into the allocator: PeerContexts::mu_
// (core/peer/enable/peer_contexts.h), CallCounters::live_mu_ (core/allocator_stats.h: the
// passed-through allocations still live), Ipc::mu_ (core/ipc/ipc.h; held around driver calls of imports, never around the allocator's), Trace::mu_
// (core/report/trace.h), the log's mutex (core/base/log.cc), CallerLibraries::mu_
// (core/history/caller_library.h), MemoryHistory::mu_ (core/history/memory_history.h;
// taken under an arena mutex when a heap records a segment event, never the other way).
// The host memory pools' mutexes (HostMappedPools::mu_ and each
// HostMappedPool::mu_, core/heap/host_mapped_pool.h) are leaves too, taken
// under an arena mutex or the other libraries' VMM mutex at a pause and
// never around another lock; ShimCore::PrepareFork takes them last.

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_SYNC_LOCK_ORDER_H_
