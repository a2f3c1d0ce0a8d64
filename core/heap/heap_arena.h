// A heap arena: part of one device's VMM memory as blocks (one physical
// handle mapped at its base each), the packing of small allocations into
// granules, and the cache of freed memory, indexed by placement. A device's
// heap (core/heap/device_heap.h) is one or more arenas, each with its own lock and
// its own VA reservations, so that threads working in different arenas never
// wait for each other.
//
// A placement is what an allocation shares a mapping with: its context (so
// that a free synchronizes the context the memory was allocated in), its
// allowed peers (access rights belong to a whole mapping) and its tag. Open
// granules and cached blocks are kept per placement, so an allocation looks
// only at mappings it may use, and a cached-block lookup is one ordered
// search by size.
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
// synchronize (a stream capture is in progress) is deferred: the allocation
// is no longer found, but its memory is neither reused nor unmapped until
// CompleteDeferred runs after a later synchronization.
//
// Statistics: DeviceStats is the single source of every figure of this
// device; process-wide handle bytes and their peak are updated in the same
// place (AccountHandle), so the two cannot drift.
//
// Thread safety: every public method takes the arena's mutex itself
// (ABSL_LOCKS_EXCLUDED) and no other arena's; lock order:
// core/sync/lock_order.h ("arena mutex").
#ifndef VMMSHIM_CORE_HEAP_HEAP_ARENA_H_
#define VMMSHIM_CORE_HEAP_HEAP_ARENA_H_

#include <cuda.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/device_set.h"
#include "core/driver/driver_api.h"
#include "core/heap/export_registry.h"
#include "core/history/memory_history.h"
#include "core/heap/host_backup.h"
#include "core/heap/pausable_memory.h"
#include "core/sync/mutex.h"
#include "core/peer/peer_access.h"
#include "core/policy/peer_policy.h"
#include "core/heap/slab.h"
#include "core/heap/tag_selection.h"
#include "core/heap/types.h"
#include "core/heap/va_free_list.h"
#include "core/driver/vmm_mapping.h"

namespace vmmshim {

// Process-wide figures that are sums over the heaps, kept where the heaps
// update them (AccountHandle, SyncDeferredLocked), so that a peak over all
// devices exists and "is anything deferred?" is one atomic load.
struct GlobalCounters {
  std::atomic<uint64_t> bytes{0};     // handle bytes, all devices
  std::atomic<uint64_t> peak{0};      // their peak
  std::atomic<uint64_t> deferred{0};  // deferred frees, all devices
  std::atomic<uint64_t> paused{0}, paused_peak{0};  // paused bytes, all devices
};

// A device's figures that are sums over its arenas and whose peaks must be
// peaks of the sum, and what the arenas share: the cache limit holds for all
// of them together, and a denial is logged once per pair whichever arena
// made it. Relaxed atomics (figures, not synchronization).
struct DeviceCounters {
  std::atomic<uint64_t> cached_bytes{0};
  std::atomic<uint64_t> live_bytes{0}, peak_live_bytes{0};
  std::atomic<uint64_t> handle_bytes{0}, peak_handle_bytes{0};
  std::array<std::atomic<uint64_t>, kMaxDevices> mapped_bytes{}, peak_mapped_bytes{};
  std::array<std::atomic<int>, kMaxDevices> denials_logged{};
  std::atomic<uint64_t> paused_bytes{0}, peak_paused_bytes{0};
  // The default pool's reserved bytes as the driver counts them
  // (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT / HIGH): the physical memory of
  // the blocks that hold stream-ordered allocations, live or freed and kept
  // by the stream-ordered cache; not the heap's cache (free to any request,
  // as memory a pool gives back is), not paused blocks. A small allocation
  // reserves its packed block, and the next ones in it leave the figure as
  // it is, as the driver's 32 MiB chunks do (docs/stream-ordered.md).
  std::atomic<uint64_t> pool_reserved_bytes{0}, peak_pool_reserved_bytes{0};
};

// value += delta, and peak = max(peak, value).
inline void AddWithPeak(std::atomic<uint64_t>& value, std::atomic<uint64_t>& peak,
                        int64_t delta) {
  const uint64_t now = value.fetch_add(delta, std::memory_order_relaxed) + delta;
  if (delta <= 0) return;
  uint64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}


class HeapArena final : public PausableMemory {
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
  // Everything referenced must outlive the heap.
  // `peers`: who enabled access with cuCtxEnablePeerAccess (for ordinary
  // allocations); `pool_peers`: who was given access to the default pool
  // with cuMemPoolSetAccess (for stream-ordered ones).
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
  size_t cached_bytes_hint() const { return cached_hint_.load(std::memory_order_relaxed); }

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
  // `ptr` (PeerGrants::SetPeerAccess in core/peer_grants.h states the rule).
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

  // ---- Pause and resume: PausableMemory (core/heap/pausable_memory.h; the
  // contract: core/heap/pause.h). Each step takes mu_ itself (Lock and
  // Unlock are empty). ----
  // `tag`: the blocks whose placement's tag it selects, stream-ordered
  // ones too (their freed blocks must have left the stream-ordered cache
  // first: StreamOrderedFrontEnd::ReleaseForPause). `times` (never null)
  // collects where the time went.
  //
  // The bytes of the live blocks a pause of `tag` would back up; their
  // contexts are added to `contexts` (once each).
  size_t PauseCandidates(const TagSelection& tag, std::vector<CUcontext>* contexts) override
      ABSL_LOCKS_EXCLUDED(mu_);
  // CUDA_ERROR_NOT_PERMITTED (and a log line naming it) when a block the
  // pause would select holds exported memory; nothing changes.
  absl::Status CheckPausable(const TagSelection& tag) const override ABSL_LOCKS_EXCLUDED(mu_);
  // Pause in two steps, so that a pause over several arenas and devices
  // either happens everywhere or nowhere. PausePrepare (the contexts
  // synchronized by the caller): with `copier`, every selected live block's
  // contents to a host backup (all backups made before any copy), and the
  // blocks marked `pausing`: no new allocation lands in them, a free in them
  // still works. On failure its own marks are undone. PauseAbort undoes the
  // marks (backups dropped). PauseCommit unmaps and releases the marked
  // blocks (the VA stays theirs) and releases the tag's cached memory;
  // returns the physical bytes the driver got back; a block whose unmap
  // fails stays live and the first such error is returned after the rest.
  absl::StatusOr<size_t> PausePrepare(const TagSelection& tag, BackupCopier* copier,
                                      PauseTimes* times) override ABSL_LOCKS_EXCLUDED(mu_);
  void PauseAbort(const TagSelection& tag) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<size_t> PauseCommit(const TagSelection& tag, PauseTimes* times) override
      ABSL_LOCKS_EXCLUDED(mu_);
  // Resume in two steps, likewise: Prepare maps new memory at each paused
  // block's address with the access it would have had (Target), unless a
  // failed undo left it mapped, and copies the backup in; Commit forgets the
  // backups; Abort unmaps and releases what is mapped (still paused,
  // backups kept; a mapping whose unmap fails stays for the next resume).
  // Prepare retries failed releases first and releases this arena's cache
  // once before failing with CUDA_ERROR_OUT_OF_MEMORY; on failure it undoes
  // what it mapped. Returns the bytes mapped.
  absl::StatusOr<size_t> ResumePrepare(const TagSelection& tag, BackupCopier& copier,
                                       PauseTimes* times) override ABSL_LOCKS_EXCLUDED(mu_);
  // `retain`: the blocks keep their backups (PauseCoordinator::Resume).
  void ResumeCommit(const TagSelection& tag, bool retain) override ABSL_LOCKS_EXCLUDED(mu_);
  void ResumeAbort(const TagSelection& tag) override ABSL_LOCKS_EXCLUDED(mu_);

  // Unmaps and releases every handle and frees every reservation; returns
  // the first driver error and continues past errors.
  absl::Status ReleaseAll() ABSL_LOCKS_EXCLUDED(mu_);

  void PrepareFork() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Lock(); }
  void AfterForkParent() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Unlock(); }
  void AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS;

 private:
  // One physical handle mapped at its base address.
  struct Block {
    size_t size = 0;  // mapped bytes, a multiple of the granularity
    CUmemGenericAllocationHandle handle = 0;
    Placement placement;
    size_t requested = 0;         // large blocks: the bytes asked for
    uint16_t origin = 0;          // large blocks: the caller library
    std::unique_ptr<Slab> slab;   // packed granules only
    DeviceSet explicit_grant;     // SetPeerAccess(grant): granted whatever the policy says
    DeviceSet explicit_revoke;    // SetPeerAccess(revoke): denied whatever the policy says
    DeviceSet access;             // devices with read-write access now
    bool sealed = false;          // packed: takes no new allocations
    bool cached = false;          // large: freed, kept mapped for reuse
    bool exportable = false;      // created with the POSIX-fd handle type
    bool exported = false;        // an allocation in it was exported: never cached
    // Paused: its physical memory was released (handle 0, no access) and
    // its VA stays reserved; while a resume is prepared, mapped again
    // (handle set) until ResumeCommit. `backup`: its contents, when kept.
    bool paused = false;
    bool pausing = false;  // PausePrepare marked it (contents copied); live until PauseCommit
    std::optional<HostBackup> backup;

    size_t allocations() const { return slab != nullptr ? slab->allocations() : 1; }
    bool unmapped() const { return paused && handle == 0; }
    bool has_explicit() const { return !explicit_grant.empty() || !explicit_revoke.empty(); }
  };
  // Open granules and cached memory of one placement.
  struct Bins {
    absl::btree_set<CUdeviceptr> open_granules;  // packed, with free units, not sealed
    absl::btree_set<CUdeviceptr> empty_granules; // cached: empty, still mapped
    // (size, base) -> the block, so that a cache hit looks nothing up in blocks_.
    absl::btree_map<std::pair<size_t, CUdeviceptr>, Block*> cached_large;
    // The open granule that last served or took back an allocation, tried
    // first: a free followed by an allocation of the same size (the common
    // case) finds its hole there without trying the granules before it.
    CUdeviceptr recent = 0;
    // The block at `recent` when set with it, so that a hit there looks
    // nothing up in blocks_; null once that block is forgotten.
    Block* recent_block = nullptr;
    int packed_blocks = 0;  // packed blocks of the placement held now (open, full or empty)
    size_t packed_bytes = 0;  // their bytes
  };
  // A placement's packed blocks grow in larger steps: a new one is a quarter
  // of the placement's packed bytes held, rounded down to a power of two
  // granules, from 1 to kMaxPackedGranules. One cuMemCreate, cuMemMap and
  // cuMemSetAccess (each about as costly for 16 MiB as for 2 MiB on an H200:
  // bench/driver_costs.cu) then serves several granules' worth of small
  // allocations once many are held, while the granules mapped and not yet
  // used stay under a quarter of what the placement holds (the doubling
  // this replaced, 1, 2, 4, 8, 8, ... granules, held 62 MiB for 50 MiB of
  // 256 KiB buffers in examples/peer_exchange.c), and a program with few
  // small allocations holds one granule.
  static constexpr int kMaxPackedGranules = 8;

  std::pair<CUdeviceptr, Block*> BlockAt(CUdeviceptr ptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<PointerInfo> FindLocked(CUdeviceptr ptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  DeviceSet Target(const Block& b) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The peers that enabled access to allocations of `placement`'s kind.
  DeviceSet EnabledFor(const Placement& placement) const;
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
  void ReleaseOrphansLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckCompressionLocked(CUmemGenericAllocationHandle handle)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AccountHandle(int64_t delta_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddPausedLocked(int64_t delta_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A paused block mapped by a resume that failed: unmap and release it
  // again (a failing unmap keeps it mapped for the next resume; a failing
  // release leaves an orphan handle, still counted, retried by Trim).
  void UnmapPausedLocked(CUdeviceptr base) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A granule with room that is not sealed takes allocations again.
  void ReopenLocked(CUdeviceptr base, Block& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `b` is selected by a pause or resume of `tag` (stream-ordered
  // blocks too: their freed ones left the stream-ordered cache first).
  static bool Selected(const Block& b, const TagSelection& tag) {
    return tag.Matches(b.placement.tag);
  }
  // After deferred_ changed: its size into the device's and the global
  // figures.
  void SyncDeferredLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AccountMapped(DeviceSet peers, int64_t delta_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Live and cached bytes, here and in the device's shared figures.
  void AddLiveLocked(int64_t delta_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddCachedLocked(int64_t delta_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AddCachedLocked for block `b`, which leaves (delta > 0) or rejoins the
  // pool's reserved bytes when it is stream-ordered.
  void AddCachedLocked(const Block& b, int64_t delta_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DeviceCounters::pool_reserved_bytes += delta when `b` is stream-ordered.
  void AccountPoolReserved(const Block& b, int64_t delta_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reserves `size` more cached bytes in the device's shared figure when
  // they stay within its cache limit (then AddCachedLocked(+size) follows).
  bool ReserveCacheLocked(size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotePeerDecisions(DeviceSet allowed, DeviceSet enabled, uint64_t allocations,
                         size_t bytes, absl::string_view tag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Seal(CUdeviceptr base, Block& block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a new allocation of `bytes` and the peers' grants or denials.
  void NoteAllocationLocked(const Placement& placement, size_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A segment event of block `b` at `base` into the history, when on.
  void RecordSegmentLocked(HistoryAction action, CUdeviceptr base, const Block& b)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DriverApi& driver_;
  const VmmMapper& mapper_;
  const PeerPolicy& policy_;
  const PeerEnableTable& peers_;
  const PeerEnableTable& pool_peers_;
  ExportRegistry& exports_;
  ReservationMap& ranges_;
  GlobalCounters& global_;
  DeviceCounters& shared_;
  const Options options_;

  mutable Mutex mu_;  // lock order: "arena mutex" (core/sync/lock_order.h)
  CUmemAllocationProp prop_ ABSL_GUARDED_BY(mu_);
  bool compression_checked_ ABSL_GUARDED_BY(mu_) = false;
  VaFreeList arena_ ABSL_GUARDED_BY(mu_);
  // Boxed so that Block pointers stay valid while the map changes.
  absl::btree_map<CUdeviceptr, std::unique_ptr<Block>> blocks_ ABSL_GUARDED_BY(mu_);
  // Node-based, so that a Bins stays where it is while others come and go:
  // last_bins_ remembers the placement a hit last served, and the next hit of
  // that placement (the common case: one placement per program and device)
  // compares instead of hashing.
  absl::node_hash_map<Placement, Bins> bins_ ABSL_GUARDED_BY(mu_);
  Placement last_placement_ ABSL_GUARDED_BY(mu_);
  Bins* last_bins_ ABSL_GUARDED_BY(mu_) = nullptr;  // bins_[last_placement_], or null
  // The Bins of `placement`, or null; remembers it for the next call.
  Bins* FindBinsLocked(const Placement& placement) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<size_t> cached_hint_{0};  // cached_bytes_, for lock-free peeks
  // Deferred frees: allocation base -> its context.
  absl::flat_hash_map<CUdeviceptr, CUcontext> deferred_ ABSL_GUARDED_BY(mu_);
  // Unmapped handles whose cuMemRelease failed, with their bytes (still
  // counted), and mappings whose cuMemUnmap failed; Trim and ReleaseAll
  // retry them.
  std::vector<std::pair<CUmemGenericAllocationHandle, size_t>> orphan_handles_
      ABSL_GUARDED_BY(mu_);
  struct OrphanMapping {
    CUdeviceptr base;
    size_t size;
    CUmemGenericAllocationHandle handle;
    DeviceSet peers;  // mapped into them, still counted
  };
  std::vector<OrphanMapping> orphan_mappings_ ABSL_GUARDED_BY(mu_);
  DeviceStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_HEAP_ARENA_H_
