// A heap arena: part of one device's VMM memory as blocks (one physical
// handle mapped at its base each), the packing of small allocations into
// granules, and the cache of freed memory, indexed by placement. A device's
// heap (core/heap/device_heap.h) is one or more arenas, each with its own lock and
// its own VA reservations, so that threads working in different arenas never
// wait for each other.
//
// Allocations share a mapping only within one placement (context, allowed
// peers, tag: core/heap/arena_blocks.h says why), so an allocation looks only
// at mappings it may use.
//
// Shapes and units: bytes; the device's allocation granularity (RECOMMENDED;
// 2 MiB on H200) is the unit of physical memory and of VA. A request of more
// than `packing_threshold` bytes gets a handle of its own, rounded up to the
// granularity; smaller ones are carved from granules (core/heap/slab.h: aligned
// as cuMemAlloc aligns). Address ranges (Find) are the backing handle's, as
// the driver reports for any VMM memory.
//
// Fast path and slow path: AllocateFast succeeds iff a cached block of the
// placement fits within a quarter of the rounded request, or an open granule
// of the placement has an aligned run of free units; it makes no driver
// call. AllocateSlow makes a new block (cuMemCreate, cuMemMap,
// cuMemSetAccess through VmmMapper) without holding the heap mutex across
// the driver calls, so cache hits and frees go on meanwhile.
//
// Frees: the caller synchronizes the allocation's context first (cuMemFree
// waits for the device's work; cuMemUnmap does not). A free that cannot
// synchronize is deferred (DeferFree, CompleteDeferred): Note [Calls during
// a stream capture] (core/sync/capture.h), item 2.
//
// The concerns an arena holds, each a class of its own under the arena's
// mutex (core/heap/arena_*.h): where blocks are found by address and
// placement (BlockStore), which devices each is mapped into (ArenaAccess),
// the figures (ArenaAccounting), what cuMemCreate is asked for (CreateProp),
// memory the driver would not take back (OrphanedMemory), and pause and
// resume (ArenaPause, the arena's PausableMemory). The arena itself
// decides allocation, free, deferral, trim and export.
//
// Thread safety: every public method takes the arena's mutex itself
// (ABSL_LOCKS_EXCLUDED) and no other arena's; lock order:
// core/sync/lock_order.h ("arena mutex").
#ifndef VMMSHIM_CORE_HEAP_HEAP_ARENA_H_
#define VMMSHIM_CORE_HEAP_HEAP_ARENA_H_

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/device_set.h"
#include "core/driver/driver_api.h"
#include "core/heap/arena_access.h"
#include "core/heap/arena_accounting.h"
#include "core/heap/arena_pause.h"
#include "core/heap/arena_blocks.h"
#include "core/heap/create_prop.h"
#include "core/heap/export_registry.h"
#include "core/history/memory_history.h"
#include "core/heap/host_backup.h"
#include "core/heap/orphaned_memory.h"
#include "core/heap/pausable_memory.h"
#include "core/sync/mutex.h"
#include "core/peer/peer_access.h"
#include "core/peer/policy/peer_policy.h"
#include "core/heap/slab.h"
#include "core/heap/tag_selection.h"
#include "core/heap/types.h"
#include "core/heap/va_free_list.h"
#include "core/driver/vmm_mapping.h"

namespace vmmshim {

class HeapArena final {
 public:
  struct Options {
    int device = -1;
    int arena = 0;                 // its index among the device's arenas
    size_t granularity = 0;
    size_t reservation_bytes = 0;  // per VA reservation, a multiple of granularity
    size_t packing_threshold = 0;  // requests of at most this many bytes are packed
    size_t cache_limit = 0;        // bytes kept mapped for reuse at most, all arenas together
    CUmemAllocationProp prop = {}; // what cuMemCreate is asked for
    CompressionState compression = CompressionState::kOff;
    // Where segment and peer events go (core/history/memory_history.h);
    // null: nowhere. Must outlive the arena.
    MemoryHistory* history = nullptr;
  };
  // Everything referenced must outlive the arena; `peers` and `pool_peers`:
  // as for ArenaAccess (core/heap/arena_access.h).
  HeapArena(const DriverApi& driver, const VmmMapper& mapper, const PeerPolicy& policy,
             const PeerEnableTable& peers, const PeerEnableTable& pool_peers,
             ExportRegistry& exports, ReservationMap& ranges, GlobalCounters& global,
             DeviceCounters& shared, Options options);
  ~HeapArena();
  HeapArena(const HeapArena&) = delete;
  HeapArena& operator=(const HeapArena&) = delete;

  // Fast path (header comment): a pointer, or nullopt when a new block is
  // needed. No driver call. `cached_only`: only freed memory (a cached
  // large block or an empty cached granule) may serve it, not room in a
  // granule in use (another arena's thread looking for cached memory).
  // `origin`: the caller library, kept with the allocation.
  std::optional<CUdeviceptr> AllocateFast(const Placement& placement, size_t bytes,
                                          bool cached_only = false, uint16_t origin = 0)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Slow path: a new block for the request (after AllocateFast failed);
  // on CUDA_ERROR_OUT_OF_MEMORY the cache is released and cuMemCreate tried
  // once more. Undoes itself on failure.
  absl::StatusOr<CUdeviceptr> AllocateSlow(const Placement& placement, size_t bytes,
                                           uint16_t origin = 0) ABSL_LOCKS_EXCLUDED(mu_);

  // The live allocation containing `ptr`, or nullopt.
  std::optional<PointerInfo> Find(CUdeviceptr ptr) const ABSL_LOCKS_EXCLUDED(mu_);

  // Frees the allocation starting at `ptr` (its context already
  // synchronized): kept mapped in the cache when it fits, else unmapped and
  // released. `driver_gone`: the driver is deinitialized (exit); only forget
  // it. CUDA_ERROR_INVALID_VALUE when `ptr` does not start a live allocation.
  absl::Status Free(CUdeviceptr ptr, bool driver_gone) ABSL_LOCKS_EXCLUDED(mu_);
  // Frees the stream-ordered allocation starting at `ptr` made in
  // `context`, whose work is done (it left the stream-ordered cache);
  // CUDA_ERROR_INVALID_VALUE, and nothing freed, when no such allocation
  // starts there any more (its context was released meanwhile, and the
  // address may serve another allocation).
  absl::Status FreeStreamOrdered(CUdeviceptr ptr, CUcontext context) ABSL_LOCKS_EXCLUDED(mu_);
  // Changes the requested size of the live allocation starting at `ptr` to
  // `bytes`, which must take the same memory: for a large block at most its
  // size, for a packed one the same number of units (stream-ordered reuse
  // of a freed block by a request of another size). false, and nothing
  // changed, otherwise.
  bool Resize(CUdeviceptr ptr, size_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Defers the free of the allocation starting at `ptr` (header comment).
  absl::Status DeferFree(CUdeviceptr ptr) ABSL_LOCKS_EXCLUDED(mu_);
  // The contexts with deferred frees.
  std::vector<CUcontext> DeferredContexts() const ABSL_LOCKS_EXCLUDED(mu_);
  // Completes the deferred frees of `context` (it was synchronized after
  // they were deferred).
  void CompleteDeferred(CUcontext context) ABSL_LOCKS_EXCLUDED(mu_);

  // Releases the cache; returns the bytes released.
  size_t Trim() ABSL_LOCKS_EXCLUDED(mu_);
  // The same without the lock (a hint: it may change at once).
  size_t cached_bytes_hint() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return acct_.cached_hint(); }

  // Whether anything of `context` is held here.
  bool Holds(CUcontext context) const ABSL_LOCKS_EXCLUDED(mu_);
  // Releases every block of `context` (allocations, cache, exports, deferred
  // frees); returns the physical bytes released (0: it held nothing here).
  size_t ReleaseContext(CUcontext context) ABSL_LOCKS_EXCLUDED(mu_);

  // Brings every block's access to its target after a change of the
  // enabled peers. `peer` (>= 0) just enabled access to the blocks of one
  // kind (`stream_ordered`: through the default pool): their grants and
  // denials are counted and logged.
  absl::Status ApplyPeerChange(int peer, bool stream_ordered = false) ABSL_LOCKS_EXCLUDED(mu_);
  // Explicit grant (true) or revoke of `peer` on the allocation containing
  // `ptr` (PeerGrants::SetPeerAccess in core/peer/enable/peer_grants.h states the rule).
  absl::Status SetExplicit(CUdeviceptr ptr, int peer, bool grant) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<bool> PeerHasAccess(CUdeviceptr ptr, int peer) const ABSL_LOCKS_EXCLUDED(mu_);
  // The host copy of [ptr, ptr + bytes) while the block holding it is
  // paused with its contents (PausePrepare with a copier) or kept across a
  // resume (ResumeCommit with `retain`): a pointer into the block's backup,
  // valid until the block is resumed without retaining it or freed.
  // CUDA_ERROR_INVALID_VALUE: not an allocation here, or the range leaves
  // it; CUDA_ERROR_NOT_FOUND: no copy (not paused, or without contents).
  absl::StatusOr<const void*> PausedContents(CUdeviceptr ptr, size_t bytes) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // IPC: marks the allocation containing `ptr` exported (its block is never
  // cached again; a granule takes no new allocations) and registers its
  // token, in one critical section. Returns its info and the token.
  absl::StatusOr<std::pair<PointerInfo, ExportToken>> Export(CUdeviceptr ptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A new POSIX fd for the handle behind the live export `token` of the
  // allocation at `base` with `offset` and `size`.
  absl::StatusOr<int> ExportFd(const ExportToken& token, CUdeviceptr base, uint64_t offset,
                               uint64_t size, uint64_t* handle_size) ABSL_LOCKS_EXCLUDED(mu_);

  DeviceStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // Adds this arena's physical memory, by tag and kind, to `out`.
  void AddResidency(DeviceResidency* out) const ABSL_LOCKS_EXCLUDED(mu_);
  // Appends every block (mapped, cached or paused) with its allocations.
  void AddSegments(std::vector<SegmentInfo>* out) const ABSL_LOCKS_EXCLUDED(mu_);

  // Pause and resume of this arena's blocks (ArenaPause,
  // core/heap/arena_pause.h), one of the memories PauseCoordinator runs.
  PausableMemory& pausable() { return pause_; }

  // Unmaps and releases every handle and frees every reservation; returns
  // the first driver error and continues past errors.
  absl::Status ReleaseAll() ABSL_LOCKS_EXCLUDED(mu_);

  void PrepareFork() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Lock(); }
  void AfterForkParent() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Unlock(); }
  void AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS;

 private:
  friend class ArenaPause;  // a concern of its own over the arena's state

  std::optional<PointerInfo> FindLocked(CUdeviceptr ptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<CUdeviceptr> CreateBlockLocked(const Placement& placement, size_t size,
                                                bool packed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReserveMoreLocked(size_t at_least) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unmaps and releases the block at `base` and forgets it. On unmap failure
  // the block stays (still mapped) and the error is returned; a failed
  // release is retried later (the handle stays counted) and is not an error.
  absl::Status DestroyBlockLocked(CUdeviceptr base) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DestroyBlockLocked, and when the unmap fails, the block leaves the heap
  // anyway as an orphan mapping (never served again, retried by Trim).
  void DiscardBlockLocked(CUdeviceptr base) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What became of a block's mapping and handle when it leaves the heap.
  enum class Forget {
    kReleased,     // unmapped and released (or the driver is gone)
    kHandleHeld,   // unmapped; the handle awaits a retried cuMemRelease
    kStillMapped,  // the unmap failed: VA and handle kept, retried by Trim
  };
  // The single place a block leaves the heap (no driver call).
  void ForgetBlockLocked(CUdeviceptr base, Forget how) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the live allocation of `bytes` starting at `ptr` in `block`, the
  // block at `base` (validated by the caller).
  void FreeLocked(CUdeviceptr ptr, CUdeviceptr base, Block& block, size_t bytes,
                  bool driver_gone, absl::Status* status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ApplyAccessLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TrimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A paused block mapped by a resume that failed: unmap and release it
  // again (a failing unmap keeps it mapped for the next resume; a failing
  // release leaves an orphan handle, still counted, retried by Trim).
  void UnmapPausedLocked(CUdeviceptr base) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A paused block's view (Block::view) unmapped: in one call where the
  // driver takes the whole range, else mapping by mapping. On failure the
  // view stays (an access still reaches it) and the error is returned.
  absl::Status UnmapPausedViewLocked(CUdeviceptr base, Block& b)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The block leaves the search for new allocations, and the cache.
  void Seal(CUdeviceptr base, Block& block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a new allocation of `bytes` and the peers' grants or denials.
  void NoteAllocationLocked(const Placement& placement, size_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A segment event of block `b` at `base` into the history, when on.
  void RecordSegmentLocked(HistoryAction action, CUdeviceptr base, const Block& b)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DriverApi& driver_;
  const VmmMapper& mapper_;
  ExportRegistry& exports_;
  ReservationMap& ranges_;
  const Options options_;
  const ArenaAccess access_;  // no state of its own beyond references

  mutable Mutex mu_;  // lock order: "arena mutex" (core/sync/lock_order.h)
  CreateProp create_ ABSL_GUARDED_BY(mu_);
  VaFreeList va_ ABSL_GUARDED_BY(mu_);
  BlockStore blocks_ ABSL_GUARDED_BY(mu_);
  ArenaAccounting acct_ ABSL_GUARDED_BY(mu_);
  OrphanedMemory orphans_ ABSL_GUARDED_BY(mu_);
  // Deferred frees: allocation base -> its context.
  absl::flat_hash_map<CUdeviceptr, CUcontext> deferred_ ABSL_GUARDED_BY(mu_);

  ArenaPause pause_{*this};
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_HEAP_ARENA_H_
