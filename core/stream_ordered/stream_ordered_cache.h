// Stream-ordered allocation (cuMemAllocAsync / cuMemFreeAsync on a device's
// default pool) served from VMM: the cache of freed blocks per stream, and
// the rule for reusing them (docs/stream-ordered.md has the measured
// driver behaviour this follows).
//
// Reuse rule, the driver's (CUDA Programming Guide, "Stream Ordered Memory
// Allocator"; measured on H200): a block freed on stream S is reusable at
// once by later allocations on S, which stream order puts after everything
// queued before the free; on any other stream only once the work S had
// queued before the free is done. The cache learns that without
// synchronizing:
//   1. cuStreamQuery(S) returns CUDA_SUCCESS: all of S's work is done, so
//      every block freed on S before the query is ready;
//   2. otherwise an event is recorded on S; it covers every block freed on S
//      before it, and once cuEventQuery says it completed, they are ready.
//      An event recorded after the free covers more work than the free
//      needs: a block becomes ready later than it could, never earlier;
//   3. the program's own synchronizations say it for free: once
//      cuStreamSynchronize(S) returns, every block freed on S before the
//      call is ready, and after cuCtxSynchronize every block freed on the
//      context's streams (Synchronized, with a Mark taken before the call).
//      That is where the driver applies the release threshold, and so does
//      the cache.
// That is the driver's CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC policy.
// The shim never makes one stream wait for another (the driver's
// ..._ALLOW_INTERNAL_DEPENDENCIES) and does not follow event waits between
// streams (..._FOLLOW_EVENT_DEPENDENCIES): a block not known to be ready is
// not reused, and the allocation takes other memory.
//
// Blocks are matched by size class: a packed allocation's 512-byte units
// (core/heap/slab.h), exactly, so that a reuse keeps the address and alignment
// the request would get; a large allocation's block size (a multiple of the
// granularity), from the request's rounded size up to a quarter more, as
// the device heap's own cache serves.
//
// Asking the driver costs a call per stream (about a microsecond on H200
// while the stream is busy), so a stream found busy is asked again only
// after `query_interval_ns` (AllocatorOptions); meanwhile allocations that
// find nothing take other memory.
//
// Streams are named as the driver orders work (StreamKey): an explicit
// handle; the legacy default stream of a context (handle 0 or
// CU_STREAM_LEGACY); a thread's per-thread default stream (handle 0 through
// a _ptsz entry point, or CU_STREAM_PER_THREAD). The per-thread stream can
// only be asked about from its own thread: on other threads only an event
// recorded earlier tells about its blocks.
//
// Release threshold (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, default 0 as
// natively): ready blocks stay in the cache while the pool's reserved bytes
// (live allocations plus this cache) are at most the threshold; the rest
// leaves the cache, back to the device heap, where the memory is free to
// every allocation and counts as free in cuMemGetInfo. The driver applies
// the threshold at synchronize calls; the cache applies it at its harvests
// (the shim does not hook synchronization), which run before every figure
// the program can read (cuMemGetInfo, pool attributes, cuMemPoolTrimTo).
//
// Units: bytes. Errors: Put of a block already in the cache is
// CUDA_ERROR_INVALID_VALUE, the driver's code for a double free (measured).
// Thread safety: every method takes the cache's mutex; lock order: cache
// mutex -> the driver (queries, event records) ; the caller returns blocks
// to the device heap after the call, never under this mutex.
// Process exit: events are not destroyed (the driver tears them down with
// its contexts).
#ifndef VMMSHIM_CORE_STREAM_ORDERED_STREAM_ORDERED_CACHE_H_
#define VMMSHIM_CORE_STREAM_ORDERED_STREAM_ORDERED_CACHE_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/device_set.h"
#include "core/heap/tag_selection.h"
#include "core/heap/types.h"
#include "core/driver/driver_api.h"
#include "core/sync/mutex.h"

namespace vmmshim {

// A stream as the driver orders work (header comment).
struct StreamKey {
  CUstream stream = nullptr;    // an explicit handle, CU_STREAM_LEGACY or CU_STREAM_PER_THREAD
  CUcontext context = nullptr;  // the stream's context
  uint64_t thread = 0;          // CU_STREAM_PER_THREAD: the owning thread (ThisThreadId)
  bool operator==(const StreamKey& o) const {
    return stream == o.stream && context == o.context && thread == o.thread;
  }
  template <typename H>
  friend H AbslHashValue(H h, const StreamKey& k) {
    return H::combine(std::move(h), k.stream, k.context, k.thread);
  }
};

// What a freed block may be reused for: an allocation of the same Placement
// (core/heap/types.h: its context, the peers the policy allows it, its tag),
// since the heap's block keeps the old allocation's mapping and access. A
// block with explicit grants or revokes is not reusable (they belonged to
// the old allocation): it leaves the cache once ready.

// A block that left the cache, with its allocation's context: the caller
// frees it in the heap only if the heap still holds that allocation there
// (between the two, a release of the context may have unmapped it and the
// address may serve a new allocation).
struct ReleasedBlock {
  CUdeviceptr ptr = 0;
  CUcontext context = nullptr;
};
using ReleasedBlocks = std::vector<ReleasedBlock>;

// A number naming the calling thread for the life of the process (never 0).
uint64_t ThisThreadId();

// What the pool attributes report for the shim's part of a default pool.
class StreamOrderedCache {
 public:
  // A block taken from the cache for reuse.
  struct Reuse {
    CUdeviceptr ptr = 0;
    size_t bytes = 0;       // its previous requested size
    size_t size_class = 0;  // the block's
  };

  StreamOrderedCache(const DriverApi& driver, int64_t query_interval_ns)
      : driver_(driver), query_interval_ns_(query_interval_ns) {}
  ~StreamOrderedCache();
  StreamOrderedCache(const StreamOrderedCache&) = delete;
  StreamOrderedCache& operator=(const StreamOrderedCache&) = delete;

  // A cached block of a class in [size_class, max_class] and of the same
  // placement for an allocation of `bytes` on `key`: one freed on `key`
  // itself, else a ready one, the smallest that fits; no driver call. When there is none
  // and `may_ask` (no capture in progress), the streams holding a block of
  // such a class are asked first (not before their query interval). A block
  // returned is counted as allocated (as NoteAllocated); blocks that left
  // the cache meanwhile go to *released, for the caller to free in the heap.
  // One critical section.
  std::optional<Reuse> Allocate(const StreamKey& key, const Placement& placement,
                                size_t size_class, size_t max_class, size_t bytes, bool may_ask,
                                ReleasedBlocks* released) ABSL_LOCKS_EXCLUDED(mu_);

  // A live allocation was made (`reused`: by Take) in `context`.
  void NoteAllocated(CUcontext context, size_t size_class, size_t bytes, bool reused)
      ABSL_LOCKS_EXCLUDED(mu_);
  // cuMemFreeAsync on `key` of the live allocation at `ptr` made in
  // `context`: CUDA_ERROR_INVALID_VALUE when it is already cached (double
  // free). Returns true when the cache has grown past its bound and should
  // be harvested.
  // `reusable` false: the block only waits for its work, then goes back to
  // the heap.
  absl::StatusOr<bool> Put(const StreamKey& key, CUdeviceptr ptr, const Placement& placement,
                           bool reusable, size_t size_class, size_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether anything of `context` is held here (its allocations, or blocks
  // freed on its streams).
  bool Holds(CUcontext context) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `ptr` is a freed block held here.
  bool Contains(CUdeviceptr ptr) const ABSL_LOCKS_EXCLUDED(mu_);
  // A live allocation was freed by other means (cuMemFree): it leaves the
  // figures.
  void NoteFreed(CUcontext context, size_t size_class, size_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // Asks the driver which freed blocks are ready (header comment) and
  // returns the ready blocks that leave the cache: beyond `keep` reserved
  // bytes, or the release threshold when `keep` is nullopt. The caller
  // frees them in the heap. Call only while no stream capture is in
  // progress (queries are unsafe calls: Note [Calls during a stream
  // capture], core/sync/capture.h).
  // Streams found busy are asked again only after the query interval,
  // unless `force`.
  ReleasedBlocks Harvest(std::optional<uint64_t> keep = std::nullopt, bool force = true)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A mark covering every block freed so far, in any cache (frees are
  // numbered process-wide); 0 when no cache holds a block that is not ready.
  static uint64_t Mark();
  // The program synchronized `key`'s stream (`whole_context`: every stream
  // of key.context) after taking `mark`: those blocks are ready, and the
  // release threshold applies. Returns the blocks that leave the cache. No
  // driver call.
  ReleasedBlocks Synchronized(const StreamKey& key, bool whole_context, uint64_t mark)
      ABSL_LOCKS_EXCLUDED(mu_);
  // For out-of-memory: the contexts whose streams hold freed blocks, and a
  // mark covering every block freed so far; once the caller synchronized
  // those contexts, MarkReady(mark) makes them ready.
  uint64_t PendingContexts(std::vector<CUcontext>* contexts) const ABSL_LOCKS_EXCLUDED(mu_);
  void MarkReady(uint64_t mark) ABSL_LOCKS_EXCLUDED(mu_);
  // For a pause of `selection` (core/heap/pause.h), after MarkReady: the
  // ready blocks whose allocation tag it selects leave the cache, whatever
  // the release threshold, so that the pause releases their memory instead
  // of keeping it for reuse. The caller frees them in the heap. No driver
  // call.
  ReleasedBlocks TakeSelected(const TagSelection& selection) ABSL_LOCKS_EXCLUDED(mu_);

  // `stream` is about to be destroyed: its blocks are covered by one last
  // event (or become ready at once when it is idle) and the handle is
  // forgotten, since a new stream may get it.
  // `may_query` false (a capture is in progress): no driver call; the blocks
  // wait for a synchronize of their context.
  void StreamDestroyed(CUstream stream, bool may_query) ABSL_LOCKS_EXCLUDED(mu_);
  // `context` is being released (after its synchronization, when it could
  // be synchronized): its allocations leave the figures, its streams are
  // forgotten. Returns the cached blocks of other contexts that were freed
  // on its streams, for the caller to free in the heap (the heap releases
  // the blocks of `context` itself).
  ReleasedBlocks DropContext(CUcontext context) ABSL_LOCKS_EXCLUDED(mu_);

  StreamOrderedFigures figures() const ABSL_LOCKS_EXCLUDED(mu_);
  // cuMemPoolSetAttribute(RESERVED_MEM_HIGH or USED_MEM_HIGH, 0): the high
  // mark becomes the current value.
  void ResetHigh(bool reserved) ABSL_LOCKS_EXCLUDED(mu_);
  void SetReleaseThreshold(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  void PrepareFork() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Lock(); }
  void AfterForkParent() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Unlock(); }
  void AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS;

 private:
  struct Entry {
    size_t size_class = 0;
    size_t bytes = 0;
    uint64_t seq = 0;           // order of frees, cache-wide
    Placement placement;        // the allocation's (placement.context: its context)
    bool reusable = true;       // no explicit grants or revokes
    bool ready = false;
    bool retired = false;       // not ready, and its stream destroyed (in retired_)
    StreamKey key;              // freed on
  };
  struct Live {
    uint64_t classes = 0;  // bytes of their size classes
    uint64_t bytes = 0;    // requested
    uint64_t count = 0;
  };
  // Blocks freed on one stream and not yet ready, and the event covering
  // some of them.
  struct StreamList {
    absl::btree_set<std::pair<size_t, uint64_t>> by_class;  // (size class, seq)
    absl::btree_map<uint64_t, CUdeviceptr> by_seq;
    CUevent event = nullptr;
    uint64_t event_covers = 0;  // blocks with seq <= this, when event_pending
    bool event_pending = false;
    int64_t next_query_ns = 0;  // not asked again before (found busy)
  };
  // A destroyed stream's blocks, ready once `event` completes.
  struct Retired {
    CUcontext context = nullptr;
    CUevent event = nullptr;
    std::vector<CUdeviceptr> blocks;
  };

  // Makes the blocks of `list` with seq <= `upto` ready.
  void MarkListReadyLocked(StreamList& list, uint64_t upto) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MakeReadyLocked(CUdeviceptr ptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a cached block out, wherever it waits.
  void RemoveLocked(CUdeviceptr ptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The driver's view of one list (steps 1 and 2 of the header comment);
  // `force`: ignore the query interval (pool figures, trim, out of memory).
  void QueryListLocked(const StreamKey& key, StreamList& list, int64_t now, bool force)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `e` may serve an allocation of `placement` (header comment).
  static bool Reusable(const Entry& e, const Placement& placement) {
    return e.reusable && e.placement == placement;
  }
  std::optional<Reuse> TakeLocked(const StreamKey& key, const Placement& placement,
                                  size_t size_class, size_t max_class)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HarvestLocked(bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Blocks of destroyed streams (of context `only`, nullptr: all) freed
  // before `mark` become ready (their contexts were synchronized).
  void MarkRetiredReadyLocked(uint64_t mark, CUcontext only) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Destroyed streams' events: their blocks ready once complete.
  void QueryRetiredLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ready blocks leaving the cache until reserved <= `keep`.
  ReleasedBlocks ReleaseReadyLocked(uint64_t keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteHighLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteAllocatedLocked(CUcontext context, size_t size_class, size_t bytes, bool reused)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // pending_ changed by `delta` (kept in the process-wide count too).
  void AddPendingLocked(int64_t delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DriverApi& driver_;
  const int64_t query_interval_ns_;
  mutable Mutex mu_;  // lock order: "stream-ordered cache mutex" (core/sync/lock_order.h)
  absl::flat_hash_map<CUdeviceptr, Entry> entries_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<StreamKey, StreamList> lists_ ABSL_GUARDED_BY(mu_);
  absl::btree_set<std::pair<size_t, CUdeviceptr>> ready_ ABSL_GUARDED_BY(mu_);
  // Ready blocks that may not be reused (explicit access): leave at the next
  // release, whatever the threshold.
  absl::flat_hash_set<CUdeviceptr> release_now_ ABSL_GUARDED_BY(mu_);
  std::vector<Retired> retired_ ABSL_GUARDED_BY(mu_);
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;  // entries not ready
  // No list may be asked about before this (all found busy at the last look).
  int64_t next_harvest_ns_ ABSL_GUARDED_BY(mu_) = 0;
  size_t puts_since_harvest_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<CUcontext, Live> live_ ABSL_GUARDED_BY(mu_);
  uint64_t live_classes_ ABSL_GUARDED_BY(mu_) = 0;  // sum over live_
  // reserved is computed (live_classes_ + cached), the rest kept here.
  StreamOrderedFigures f_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_STREAM_ORDERED_STREAM_ORDERED_CACHE_H_
