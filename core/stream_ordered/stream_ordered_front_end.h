// cuMemAllocAsync / cuMemFreeAsync and the default-pool calls, served from
// VMM (docs/stream-ordered.md); ShimCore::stream_ordered() (core/shim_core.h). The front end owns each device's
// StreamOrderedCache (core/stream_ordered/stream_ordered_cache.h: when a
// freed block may be reused), which default pools are current, and which
// streams belong to which context; memory itself comes from the device heaps
// (core/heap/heap_table.h).
//
// Served: requests on a device's default pool while it is the current pool
// (pool nullptr) or named (cuMemAllocFromPoolAsync), on a stream that is not
// capturing (a capture makes graph memory nodes: the driver's), on a device
// with VMM support. Otherwise Allocation::served is false, nothing was done,
// and the caller hands the call to the driver, which also answers for a
// stream it rejects. A block freed on `stream` is reused at once on it; on
// another stream once its work is done.
//
// Errors: CUDA_ERROR_OUT_OF_MEMORY after the cache and every freed
// stream-ordered block (their contexts synchronized) were released, and the
// frees deferred by captures reclaimed. During captures: Note [Calls during
// a stream capture] (core/sync/capture.h). A second free of a block is
// CUDA_ERROR_INVALID_VALUE, as natively.
//
// Thread safety: any thread. Lock order (core/sync/lock_order.h): the
// capture gate is taken around driver queries, the peer mutex around pool
// access changes, a cache's mutex never while an arena's is held (blocks
// leave a cache first and go to their arena after).
// Process exit: caches are deleted with the front end (never, in the shim).
#ifndef VMMSHIM_CORE_STREAM_ORDERED_STREAM_ORDERED_FRONT_END_H_
#define VMMSHIM_CORE_STREAM_ORDERED_STREAM_ORDERED_FRONT_END_H_

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/driver/driver_api.h"
#include "core/heap/heap_table.h"
#include "core/heap/pause.h"
#include "core/heap/types.h"
#include "core/peer/policy/peer_policy.h"
#include "core/stream_ordered/stream_ordered_cache.h"
#include "core/sync/capture.h"

namespace vmmshim {

// Registers with the rooms below it (docs/architecture.md, "Callbacks"): as
// a HeapTable::Listener, it makes a device's cache when the device's heap
// is made; as a PauseParticipant, its freed blocks leave for their heap
// before a pause selects memory, and its caches are released before a
// resume retries.
class StreamOrderedFrontEnd : public HeapTable::Listener, public PauseParticipant {
 public:
  // Everything referenced must outlive the front end. The out-of-memory
  // retry also completes frees deferred by captures that have ended
  // (HeapTable::ReclaimDeferred).
  StreamOrderedFrontEnd(const DriverApi& driver, HeapTable& heaps, CaptureTracker& captures,
                        const PeerPolicy& policy, int64_t query_interval_ns);
  ~StreamOrderedFrontEnd();
  StreamOrderedFrontEnd(const StreamOrderedFrontEnd&) = delete;
  StreamOrderedFrontEnd& operator=(const StreamOrderedFrontEnd&) = delete;

  // cuMemAllocAsync (`pool` nullptr: the current pool of the stream's device)
  // or cuMemAllocFromPoolAsync of `bytes` > 0 on `stream` (`per_thread`:
  // through a _ptsz entry point), under allocation tag `tag`. `origin`: the
  // caller library (core/history/caller_library.h), kept with a new heap
  // allocation; a block reused from the stream-ordered cache keeps the one
  // of its first allocation.
  absl::StatusOr<Allocation> AllocateAsync(size_t bytes, CUstream stream, bool per_thread,
                                           CUmemoryPool pool, absl::string_view tag = "",
                                           uint16_t origin = 0);
  // cuMemFreeAsync of the stream-ordered allocation `info` (its base) on
  // `stream`: to the cache, with no driver call.
  absl::Status Free(const PointerInfo& info, CUstream stream, bool per_thread);

  // The default pool of `device` (cuDeviceGetDefaultMemPool, asked once);
  // nullptr when the driver has none.
  CUmemoryPool DefaultPool(int device);
  // cuDeviceSetMemPool / cuMemSetMemPool succeeded: while another pool is
  // current, cuMemAllocAsync on `device` goes to the driver.
  void CurrentPoolChanged(int device, CUmemoryPool pool);
  // cuMemPoolSetAccess(pool, map, count) succeeded in the driver. On a
  // default pool whose device the shim serves, that is the peer event for
  // its stream-ordered memory: a peer given access (read or read-write) is
  // enabled, one given CU_MEM_ACCESS_FLAGS_PROT_NONE disabled, and the
  // policy decides per allocation as for cudaMalloc memory (the owner's own
  // entry changes nothing). The shim maps read-write for a read-only grant.
  absl::Status PoolAccessChanged(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count);
  // The shim's part of `pool` after a harvest that applies its release
  // threshold; nullopt when `pool` is not the default pool of a device the
  // shim served.
  std::optional<StreamOrderedFigures> PoolFigures(CUmemoryPool pool);
  // cuMemPoolSetAttribute succeeded: RELEASE_THRESHOLD is kept, a reset of
  // RESERVED_MEM_HIGH / USED_MEM_HIGH resets the shim's high marks.
  void PoolAttributeSet(CUmemoryPool pool, CUmemPool_attribute attribute, const void* value);
  // cuMemPoolTrimTo(pool, keep) succeeded: freed blocks that are ready leave
  // the cache until the shim's part reserves at most `keep` bytes; returns
  // the bytes released to the device heap.
  size_t PoolTrimTo(CUmemoryPool pool, size_t keep);
  // Applies the release threshold of `device`'s cache (a harvest), so that
  // cuMemGetInfo sees what the driver would after a synchronize.
  void SettleStreamOrdered(int device);
  // `stream` is about to be destroyed (cuStreamDestroy).
  void StreamDestroyed(CUstream stream);
  // Around the program's cuStreamSynchronize / cuCtxSynchronize: the mark
  // to take before the call (0: nothing waits, and nothing need be done
  // after it), and after a successful call, the blocks freed on the stream
  // (per_thread: through _ptsz; or on every stream of `context`, nullptr:
  // the current one) before the mark are ready, and the release threshold
  // applies, as the driver applies it at a synchronize.
  static uint64_t SynchronizeMark() { return StreamOrderedCache::Mark(); }
  void StreamSynchronized(CUstream stream, bool per_thread, uint64_t mark);
  void ContextSynchronized(CUcontext context, uint64_t mark);

  // ---- For the rooms around it ----
  // HeapTable::Listener: a new heap of `device` is about to be published;
  // its cache is made.
  void HeapCreated(int device) override;
  // Whether the stream-ordered allocation `info` is freed already (in the
  // cache): cuMemFree of it is then a double free.
  bool Cached(const PointerInfo& info) const;
  // The stream-ordered allocation `info` was freed by cuMemFree.
  void NoteFreed(const PointerInfo& info);
  // Out of memory: synchronizes the contexts holding freed blocks of
  // `device` (-1: every device), then releases every ready block; true when
  // any was released. Nothing while a capture is in progress.
  bool Reclaim(int device);
  // A pause of `selection` is about to select memory (core/heap/pause.h;
  // the caller holds the capture gate shared, and no capture is in
  // progress): the contexts whose streams hold freed blocks not known to be
  // ready are synchronized, then every freed block of the selection leaves
  // the caches for its heap, so that the pause releases it instead of
  // keeping it. A synchronize's driver error is returned; what was released
  // before it stays released (freed memory, nothing of the program's).
  absl::Status ReleaseForPause(const TagSelection& selection) override;
  // PauseParticipant: Reclaim(-1).
  void ReleaseCachesForResume() override { Reclaim(-1); }
  // Whether any cache holds blocks of `context` or freed on its streams.
  bool Holds(CUcontext context) const;
  // The context goes: its blocks leave the caches (released to their heap),
  // and blocks of other contexts freed on its streams are freed now.
  void DropContext(CUcontext context);
  StreamOrderedFigures figures(int device) const;
  // Every thread asks the driver again about the streams it met.
  static void ForgetStreamMemos();

  void PrepareFork() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void AfterForkParent() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS;

 private:
  StreamOrderedCache* CacheFor(int device) const {
    return DeviceSet::IsOrdinal(device) ? caches_[device].load(std::memory_order_acquire)
                                        : nullptr;
  }
  // The context, device and key of `stream` (0: the legacy stream, or the
  // per-thread stream when `per_thread`), remembered per thread; the
  // driver's code for a stream it rejects.
  absl::Status ResolveStream(CUstream stream, bool per_thread, StreamKey* key, int* device);
  // The device whose default pool is `pool` and that the shim serves, or -1.
  int DeviceOfDefaultPool(CUmemoryPool pool) const;
  // The same, asking the driver about every device's default pool and
  // creating that device's heap (and cache) when needed.
  int DeviceOfPoolCreatingHeap(CUmemoryPool pool);
  // The size class of a request: packed requests in slab units, exactly;
  // large ones in granules.
  static size_t SizeClass(const DeviceHeap& heap, size_t bytes);
  static size_t SizeClassOf(const PointerInfo& info);
  // Frees blocks that left a cache in their arena.
  void ReleaseToHeap(const ReleasedBlocks& blocks);
  std::optional<PointerInfo> Find(CUdeviceptr ptr) const;
  bool Resize(CUdeviceptr ptr, size_t bytes);
  absl::Status SetPoolPeer(int peer, int owner, bool enable);

  const DriverApi& driver_;
  HeapTable& heaps_;
  CaptureTracker& captures_;
  const PeerPolicy& policy_;
  const int64_t query_interval_ns_;
  std::array<std::atomic<StreamOrderedCache*>, kMaxDevices> caches_{};
  std::array<std::atomic<CUmemoryPool>, kMaxDevices> default_pools_{};
  // Whether the default pool is current: 0 not asked yet, 1 yes, 2 no.
  std::array<std::atomic<int>, kMaxDevices> default_pool_current_{};
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_STREAM_ORDERED_STREAM_ORDERED_FRONT_END_H_
