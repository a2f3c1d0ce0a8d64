// The device heap: one device's VMM memory, as one or more arenas
// (core/heap/heap_arena.h) in front of which each thread has its own.
//
// Why arenas: threads allocating and freeing together reached about the rate
// of one while every cache hit and free took the device's one mutex
// (docs/performance.md, "Issue 13: the per-thread front end"). Each thread is given an
// arena on its first call (its thread slot, the lowest free one, modulo the
// arenas: the same index on every device), so threads up to the number of arenas never share
// a lock on the fast path; more threads share arenas evenly. An arena has
// its own VA reservations, so the arena of a pointer is found from its
// address without a lock (ReservationMap), and a free goes to the arena
// that holds the memory, whichever thread frees it.
//
// Holdings stay visible to everyone: the cache limit holds for all arenas
// together (DeviceCounters), and Trim (vmmshim_release_cached_memory), the
// out-of-memory retry, cuMemGetInfo's idle bytes and context releases cover
// every arena. A thread gives its slot back when it exits; the next new
// thread takes the lowest free slot, and with it that arena and its cache,
// and a thread whose own arena misses takes cached memory (a freed large
// block, an empty granule) of arenas no live thread works in before making
// new memory. What arenas cost: each packs small allocations into granules
// of its own, so up to `arenas` partly filled granules per placement
// instead of one, and memory one thread freed is reused by another thread
// of the same arena, or after the pressure paths above, not at once.
//
// Shapes, units, fast path and slow path, frees and statistics: as
// core/heap/heap_arena.h states for one arena; the figures here are sums over
// the arenas, with peaks of the sums.
// Thread safety: any thread; each call takes the lock of one arena at a
// time (of several only in the iterations named above, one after another).
#ifndef VMMSHIM_CORE_HEAP_DEVICE_HEAP_H_
#define VMMSHIM_CORE_HEAP_DEVICE_HEAP_H_

#include <atomic>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/heap/heap_arena.h"

namespace vmmshim {

class DeviceHeap {
 public:
  struct Options : HeapArena::Options {
    int arenas = 1;  // at least 1
  };
  // Everything referenced must outlive the heap (HeapArena's constructor
  // says what each is).
  DeviceHeap(const DriverApi& driver, const VmmMapper& mapper, const PeerPolicy& policy,
             const PeerEnableTable& peers, const PeerEnableTable& pool_peers,
             ExportRegistry& exports, ReservationMap& ranges, GlobalCounters& global,
             Options options);
  DeviceHeap(const DeviceHeap&) = delete;
  DeviceHeap& operator=(const DeviceHeap&) = delete;

  int device() const { return device_; }
  size_t granularity() const { return granularity_; }
  size_t packing_threshold() const { return packing_threshold_; }

  // The calling thread's arena, then cached memory of the others.
  // `origin`: the caller library (HeapArena::AllocateFast).
  std::optional<CUdeviceptr> AllocateFast(const Placement& placement, size_t bytes,
                                          uint16_t origin = 0);
  // New memory in the calling thread's arena; on out of memory, the other
  // arenas' caches are released and it is tried once more.
  absl::StatusOr<CUdeviceptr> AllocateSlow(const Placement& placement, size_t bytes,
                                           uint16_t origin = 0);

  // The arena at `index` (ReservationMap::Owner::arena), or nullptr. Calls
  // about one pointer go to its arena directly (HeapTable::Locate).
  HeapArena* arena(int index) const {
    return index >= 0 && index < static_cast<int>(arenas_.size()) ? arenas_[index].get()
                                                                  : nullptr;
  }

  // Over every arena.
  std::vector<CUcontext> DeferredContexts() const;
  void CompleteDeferred(CUcontext context);
  size_t Trim();
  size_t cached_bytes() const { return shared_.cached_bytes.load(std::memory_order_relaxed); }
  // The default pool's reserved bytes as the driver counts them
  // (DeviceCounters::pool_reserved_bytes), their high mark, and its reset
  // to the current value (cuMemPoolSetAttribute(RESERVED_MEM_HIGH, 0)).
  uint64_t pool_reserved_bytes() const {
    return shared_.pool_reserved_bytes.load(std::memory_order_relaxed);
  }
  uint64_t peak_pool_reserved_bytes() const {
    return shared_.peak_pool_reserved_bytes.load(std::memory_order_relaxed);
  }
  void ResetPoolReservedPeak() {
    shared_.peak_pool_reserved_bytes.store(pool_reserved_bytes(), std::memory_order_relaxed);
  }
  bool Holds(CUcontext context) const;
  size_t ReleaseContext(CUcontext context);
  // The first error; every arena is brought to the target.
  absl::Status ApplyPeerChange(int peer, bool stream_ordered = false);
  DeviceStats stats() const;
  absl::Status ReleaseAll();

  // `fn(HeapArena*)` for every arena, in index order (pause and resume work
  // over the arenas of every device: core/heap/pause.h).
  template <typename Fn>
  void ForEachArena(Fn fn) const {
    for (const auto& a : arenas_) fn(a.get());
  }

  void PrepareFork();
  void AfterForkParent();
  void AfterForkChild();

 private:
  // The calling thread's arena: ThreadSlot() % arenas() (core/sync/thread_slot.h),
  // the same index on every device.
  HeapArena* Own() const;
  // Whether no live thread works in arena `arena`.
  bool ArenaIdle(int arena) const;
  const int device_;
  const size_t granularity_;
  const size_t packing_threshold_;
  DeviceCounters shared_;
  std::vector<std::unique_ptr<HeapArena>> arenas_;
  std::atomic<uint64_t> context_releases_{0};
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_DEVICE_HEAP_H_
