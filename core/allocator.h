// The VMM allocator: device memory from cuMemCreate physical handles mapped
// into reserved virtual address ranges (CUDA Programming Guide section 4.16,
// "Virtual Memory Management"), with per-allocation peer access.
//
// Allocator is a facade over rooms that each own one thing
// (docs/architecture.md):
//   - DeviceHeap (core/heap/device_heap.h): one device's heap as per-thread
//     arenas (HeapArena, core/heap/heap_arena.h: blocks, packed blocks and cache,
//     indexed by placement; shapes, rounding, alignment, caching and address
//     ranges are specified there);
//   - SyncCombiner (core/sync/context_sync.h): frees' context synchronizes,
//     shared by concurrent frees;
//   - VmmMapper (core/driver/vmm_mapping.h): the only caller of the VMM entry
//     points, undoing every multi-step sequence on failure;
//   - PeerEnableTable and PlanAccess (core/peer/peer_access.h): which peers
//     enabled access, and the cuMemSetAccess runs that follow;
//   - ExportRegistry (core/heap/export_registry.h): IPC export tokens;
//   - CaptureTracker (core/sync/capture.h): stream captures in progress, and the
//     driver's rule for calls made during one.
// The facade finds the device of the current context, the heap of a
// pointer, decides the placement (policy), and synchronizes before frees.
//
// Errors: absl::Status carrying the exact CUresult (core/driver/cu_status.h). A
// pointer outside the shim's VA gets NotShimMemory() from every method that
// takes one (the caller hands the call to the driver); a pointer inside it
// that does not name a live allocation gets CUDA_ERROR_INVALID_VALUE, as the
// driver gives for a pointer it did not allocate.
//
// Synchronization: cuMemFree waits for outstanding work of the device before
// the memory can be reused; cuMemUnmap/cuMemRelease do not. Free()
// therefore synchronizes the context that was current at allocation (not
// the current one) first. While a stream capture is in progress, a context
// cannot be synchronized: frees are then deferred (core/sync/capture.h states
// the driver's codes, which the shim gives exactly).
//
// Thread safety: all methods may be called concurrently, except ReleaseAll
// and destruction, which must not overlap other calls. Lock order (each
// taken only after those before it, never the other way): the capture gate
// (CaptureTracker::gate, shared by Free across its synchronize, exclusive
// across cuStreamBeginCapture) -> pause mutex (PauseMemory/ResumeMemory)
// -> peer mutex (EnablePeer/DisablePeer) ->
// heap creation mutex -> a StreamOrderedCache's mutex (never held while a
// heap mutex is taken) -> a DeviceHeap's mutex -> ReservationMap,
// ExportRegistry, the CaptureTracker's own mutex (leaves).
//
// Process exit: the shim never destroys its Allocator. When the driver is
// already torn down (CUDA_ERROR_DEINITIALIZED, seen when cudart frees at
// exit), Free() forgets the allocation without further driver calls and
// returns that code, as the driver itself would.
#ifndef VMMSHIM_CORE_ALLOCATOR_H_
#define VMMSHIM_CORE_ALLOCATOR_H_

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/sync/capture.h"
#include "core/sync/context_sync.h"
#include "core/heap/device_heap.h"
#include "core/base/device_set.h"
#include "core/driver/driver_api.h"
#include "core/heap/export_registry.h"
#include "core/sync/mutex.h"
#include "core/peer/peer_access.h"
#include "core/policy/peer_policy.h"
#include "core/stream_ordered/stream_ordered_cache.h"
#include "core/heap/va_free_list.h"
#include "core/driver/vmm_mapping.h"

namespace vmmshim {

struct AllocatorOptions {
  // Requests of at most this many bytes are packed into shared granules.
  // 0 means half the device's granularity.
  size_t packing_threshold = 0;
  // Bytes per VA reservation; 0 means twice the device's total memory. Always
  // rounded up to the granularity; a larger request gets a reservation of its
  // own size.
  size_t reservation_bytes = 0;
  // Pitch alignment of AllocatePitch, in bytes (a power of two).
  size_t pitch_alignment = 512;
  // Which peers may map which allocations.
  PeerPolicy peer_policy;
  // The most each device keeps mapped for reuse after frees (freed large
  // blocks and empty granules): a percentage of the device's memory when
  // cache_limit_percent >= 0, else cache_limit_bytes.
  double cache_limit_percent = 10;
  size_t cache_limit_bytes = 0;
  // Physical memory is created with the POSIX file-descriptor handle type
  // where the device supports it (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_
  // DESCRIPTOR_SUPPORTED), so that Export can share it with other processes
  // (guide section 4.16.3). false: no handle type, nothing exportable.
  bool exportable = true;
  // Request generic compression (guide section 4.16.5.2) where the device
  // reports CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED; the first
  // handle is checked with cuMemGetAllocationPropertiesFromHandle and, when
  // the driver did not grant compression, later ones are made without it.
  bool compression = false;
  // Stream-ordered allocation (core/stream_ordered/stream_ordered_cache.h): a stream found busy
  // while its freed blocks wait is asked about again after this many
  // nanoseconds at the earliest, so that allocations that miss do not pay a
  // driver query each; 0: at every miss.
  int64_t stream_query_interval_ns = 20000;
  // Heap arenas per device (core/heap/device_heap.h); 0: the CPUs this process
  // may run on (sched_getaffinity), at most 8.
  int arenas = 0;
  // Threads copying contents to host memory and back (PauseMemory with
  // contents; core/heap/host_backup.h); 0: the CPUs this process may run on, at
  // most 8 (8 measured 14 GiB/s out, 23 GiB/s back on an H200 host with 16
  // CPUs).
  int copy_threads = 0;
};

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
  // cuCtxEnablePeerAccess as the program saw it (core/peer_enable.h): calls
  // and the seconds they took, the driver's enable and the shim's grants
  // together, whatever they returned.
  uint64_t peer_enable_calls = 0;
  double peer_enable_seconds = 0;
  // PauseMemory: physical bytes released and not resumed yet, and the most
  // at once, all devices together.
  uint64_t paused_bytes = 0;
  uint64_t peak_paused_bytes = 0;
};

// An allocation made shareable by Export.
struct ExportedAllocation {
  ExportToken token{};       // 128 random bits naming this export
  uint64_t offset = 0;       // of the allocation inside its physical handle
  uint64_t size = 0;         // the allocation's requested bytes
  uint64_t handle_size = 0;  // the physical handle's bytes (what an importer maps)
  int device = -1;
};

class Allocator {
 public:
  static constexpr int kMaxDevices = vmmshim::kMaxDevices;

  // `driver` must outlive the allocator.
  explicit Allocator(const DriverApi& driver, AllocatorOptions options = {});
  // Releases everything still held (see ReleaseAll).
  ~Allocator();

  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  struct Allocation {
    CUdeviceptr ptr = 0;
    // false: not served, and nothing was done; the caller hands the request
    // to the driver. That happens when no context is current (the driver
    // then returns its own error) and on devices without VMM support.
    bool served = false;
  };

  // `bytes` > 0, on the device of the current context. `tag` ("" = none)
  // is matched by rules policies and groups packed allocations. During a
  // stream capture that prohibits the call, the driver's code
  // (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, capture invalidated).
  absl::StatusOr<Allocation> Allocate(size_t bytes, absl::string_view tag = "");

  // A pitched 2D allocation: pitch = width rounded up to pitch_alignment,
  // bytes = pitch * height. `width` and `height` > 0. *pitch is set whenever
  // the pitch could be computed, also when the allocation then fails, as the
  // driver does.
  absl::StatusOr<Allocation> AllocatePitch(size_t width, size_t height, size_t* pitch,
                                           absl::string_view tag = "");

  // Frees an allocation made by Allocate (header comment: errors, capture).
  absl::Status Free(CUdeviceptr ptr);

  // cuMemFreeAsync of shim memory on `stream` (`per_thread`: the _ptsz entry
  // point). Stream-ordered memory (AllocateAsync) goes to the stream-ordered
  // cache of its device, with no driver call (core/stream_ordered/stream_ordered_cache.h: when it
  // is reused); a second free of it is CUDA_ERROR_INVALID_VALUE, as
  // natively. Other shim memory (cudaMalloc; natively freed in stream order
  // too): the free must not happen before the work queued on the stream is
  // done, so the stream is synchronized, then the memory freed as Free does.
  // During captures, the driver's codes, measured on H200 (core/sync/capture.h):
  // on a capturing stream CUDA_ERROR_INVALID_VALUE (a graph frees only graph
  // allocations) and the capture goes on; on another stream the driver's
  // verdict on an unsafe call, and the free deferred where it is allowed.
  absl::Status FreeAsync(CUdeviceptr ptr, CUstream stream, bool per_thread);

  // ---- Stream-ordered allocation (core/stream_ordered/stream_ordered_cache.h,
  // docs/stream-ordered.md) ----

  // cuMemAllocAsync (`pool` nullptr: the current pool of the stream's
  // device) or cuMemAllocFromPoolAsync of `bytes` > 0 on `stream`
  // (`per_thread`: through a _ptsz entry point). Served from VMM when the
  // pool is the default pool of the stream's device (for nullptr: while it
  // is the current pool), the stream is not capturing (a capture makes graph
  // memory nodes: the driver's), and the device has VMM support; otherwise
  // not served, nothing done, and the caller hands the call to the driver,
  // which also answers for a stream it rejects. A block freed on `stream`
  // is reused at once; one freed on another stream once its work is done.
  // Errors: CUDA_ERROR_OUT_OF_MEMORY, after the cache and every freed
  // stream-ordered block (their contexts synchronized) were released.
  absl::StatusOr<Allocation> AllocateAsync(size_t bytes, CUstream stream, bool per_thread,
                                           CUmemoryPool pool, absl::string_view tag = "");
  // The default pool of `device` (cuDeviceGetDefaultMemPool, asked once);
  // nullptr when the driver has none.
  CUmemoryPool DefaultPool(int device);
  // cuDeviceSetMemPool / cuMemSetMemPool succeeded: while another pool is
  // current, cuMemAllocAsync on `device` goes to the driver.
  void CurrentPoolChanged(int device, CUmemoryPool pool);
  // cuMemPoolSetAccess(pool, map, count) succeeded in the driver. On a
  // default pool whose device the shim serves, that is the peer event for
  // its stream-ordered memory: a peer given access (read or read-write)
  // is enabled, one given CU_MEM_ACCESS_FLAGS_PROT_NONE disabled, and the
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
  // cuMemPoolTrimTo(pool, keep) succeeded: freed stream-ordered blocks that
  // are ready leave the cache until the shim's part reserves at most `keep`
  // bytes; returns the bytes released to the device heap.
  size_t PoolTrimTo(CUmemoryPool pool, size_t keep);
  // Applies the release threshold of `device`'s stream-ordered cache (a
  // harvest), so that cuMemGetInfo sees what the driver would after a
  // synchronize.
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

  // The live allocation containing `ptr`: NotShimMemory() outside the
  // shim's VA, CUDA_ERROR_NOT_FOUND inside it but not in a live allocation.
  absl::StatusOr<PointerInfo> Find(CUdeviceptr ptr) const;

  // Bytes the shim holds mapped on `device` that serve no allocation (its
  // cache); these count as free memory.
  size_t IdleBytes(int device) const;

  // Releases the cache of `device` (-1: every device) to the driver, and
  // completes frees deferred by captures that have ended; returns the bytes
  // released. Allocation also does this by itself, once, before reporting
  // CUDA_ERROR_OUT_OF_MEMORY.
  size_t Trim(int device = -1);

  // Makes the live allocation containing `ptr` shareable with other
  // processes: returns a token that ExportFd accepts until the allocation is
  // freed. Exporting the same allocation again returns the same token.
  // Exported memory is never cached for reuse, and a packed granule holding
  // an exported allocation takes no new allocations. The importer can map
  // the whole physical handle, which for a packed allocation is its granule.
  // Errors: CUDA_ERROR_INVALID_VALUE when `ptr` is not in a live shim
  // allocation, or its memory was created without the POSIX-fd handle type.
  absl::StatusOr<ExportedAllocation> Export(CUdeviceptr ptr);

  // A new POSIX file descriptor for the physical handle behind the export
  // named by `token`, when `offset` and `size` match it (the caller owns and
  // closes the descriptor); *handle_size is set to the handle's bytes.
  // CUDA_ERROR_INVALID_VALUE when no live export has this token or
  // offset/size differ; otherwise the driver's cuMemExportToShareableHandle
  // error.
  absl::StatusOr<int> ExportFd(const ExportToken& token, uint64_t offset, uint64_t size,
                               uint64_t* handle_size);

  // The devices that should access `bytes` of memory used on `device` that
  // the shim maps but did not allocate (IPC imports): `device` itself and
  // the peers that enabled access to it and that the policy allows for an
  // untagged allocation of this size.
  DeviceSet AccessTargets(int device, size_t bytes);

  // The mapping unit, for other rooms that map memory (IPC import).
  const VmmMapper& mapper() const { return mapper_; }
  // Stream captures in progress (the hooks begin captures through it).
  CaptureTracker& captures() { return captures_; }
  // cuStreamEndCapture(stream) returned: the tracker forgets the capture if
  // it is over, and when no capture is left, the frees deferred during the
  // captures complete (their contexts are synchronized once, here, so that
  // what a capture held back does not wait for the next free).
  void CaptureEnded(CUstream stream, bool per_thread);

  // Releases everything allocated in `context` (live allocations, their
  // cache, their exports, their deferred frees), after synchronizing it:
  // what the driver does to a context's cuMemAlloc memory when the context
  // is destroyed or reset. VA reservations stay for reuse. Returns the
  // physical bytes released. `synchronize` false: the context is already
  // gone. Makes no driver call when nothing of `context` is held.
  size_t ReleaseContext(CUcontext context, bool synchronize);

  // fork(): PrepareFork takes every lock of the allocator, in lock order;
  // AfterForkParent releases them; AfterForkChild gives the child (a single
  // thread) fresh, unlocked mutexes. For pthread_atfork.
  void PrepareFork() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void AfterForkParent() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // `context` was destroyed or reset: forgets which device it belonged to,
  // on every thread, so that a new context that reuses the handle is asked
  // about again.
  void ForgetContext(CUcontext context);

  // Records a request the caller handed to the driver (for statistics).
  void NotePassThrough(size_t bytes);

  // `peer_device` has enabled peer access to `owner_device`'s memory (after
  // the driver accepted cuCtxEnablePeerAccess, or instead of it). Grants the
  // policy-allowed allocations of the owner, existing and future. Calls nest:
  // each EnablePeer needs one DisablePeer. CUDA_ERROR_INVALID_DEVICE for a
  // bad ordinal.
  absl::Status EnablePeer(int peer_device, int owner_device);
  // Undoes one EnablePeer; the last one revokes the policy grants (explicit
  // grants stay). CUDA_ERROR_PEER_ACCESS_NOT_ENABLED when not enabled.
  absl::Status DisablePeer(int peer_device, int owner_device);

  // Explicit per-allocation control, combined with any policy: `peer` may
  // (GrantPeer) or may not (RevokePeer) map the allocation containing `ptr`,
  // whether or not it enabled peer access. Errors: CUDA_ERROR_INVALID_VALUE
  // (not shim memory), CUDA_ERROR_INVALID_DEVICE (bad ordinal),
  // CUDA_ERROR_PEER_ACCESS_UNSUPPORTED (cuDeviceCanAccessPeer says no),
  // CUDA_ERROR_NOT_PERMITTED (a packed allocation whose granule holds other
  // live allocations that carry no tag: tag allocations meant for explicit
  // grants, vmmshim_set_allocation_tag, so they get granules of their own),
  // or the driver's cuMemSetAccess error. The owner itself is a no-op.
  absl::Status GrantPeer(CUdeviceptr ptr, int peer);
  absl::Status RevokePeer(CUdeviceptr ptr, int peer);
  // Whether `peer` can access the allocation containing `ptr` now.
  absl::StatusOr<bool> PeerHasAccess(CUdeviceptr ptr, int peer) const;

  // ---- Pause and resume (docs/pause-resume.md) ----
  // PauseMemory releases the physical memory of the allocations made under
  // allocation tag `tag` (nullopt: every allocation the shim serves; a tag
  // no allocation has: nothing, 0 bytes), keeping their addresses reserved:
  // the owning contexts are synchronized, with `keep_contents` the contents
  // are copied to host memory (core/heap/host_backup.h), then each block is
  // unmapped and released; an access to paused memory faults. The tag's
  // cached (freed) memory is released too. Returns the physical bytes
  // released (0 when all of it is paused already). Pointers stay valid for
  // cudaFree (which frees a paused allocation as any other, dropping its
  // share of the backup), Find and the peer queries (which answer with the
  // access it gets back). Stream-ordered memory is not paused; IPC imports
  // are not selected (not this process's allocations).
  // All or nothing: every device's contents are copied before any memory
  // is released. Errors (nothing paused): CUDA_ERROR_NOT_PERMITTED when selected memory
  // is exported to another process (logged, naming it);
  // CUDA_ERROR_OUT_OF_MEMORY when host memory for the contents is short
  // (logged: needed and available); a synchronize's or copy's driver error.
  // A cuMemUnmap failure (a driver failure after the copies): that block
  // stays live, the others are paused, and the error is returned.
  //
  // ResumeMemory maps new physical memory at the paused addresses with the
  // access each allocation would have had never paused (the owner, the
  // peers that policy or explicit grants allow among those enabled now) and
  // copies the contents back. Returns the bytes restored (0: nothing
  // paused). CUDA_ERROR_OUT_OF_MEMORY when the device cannot hold it all
  // (after releasing its cache): everything stays paused, nothing leaks, a
  // later resume can succeed.
  //
  // Thread safety: pauses and resumes are serialized with each other;
  // allocations and frees go on meanwhile in other arenas, and in the same
  // arena wait for its prepare step's copies. During a stream capture:
  // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, the capture untouched.
  absl::StatusOr<size_t> PauseMemory(const std::optional<std::string>& tag, bool keep_contents);
  absl::StatusOr<size_t> ResumeMemory(const std::optional<std::string>& tag);

  AllocatorStats GetStats() const;
  // Adds one cuCtxEnablePeerAccess call of `nanoseconds` to GetStats's
  // peer_enable figures. Thread-safe (relaxed atomics).
  void NotePeerEnable(uint64_t nanoseconds);
  // One entry per device the shim served, in device order.
  std::vector<DeviceStats> GetDeviceStats() const;
  const PeerPolicy& peer_policy() const { return options_.peer_policy; }

  // Unmaps and releases every handle and frees every reservation, in the
  // guide's order (unmap -> release -> address free). Live allocations become
  // invalid. Returns the first driver error; continues past errors.
  absl::Status ReleaseAll();

 private:
  // The heap of `device`, created on first use; nullptr when the device has
  // no VMM support (logged once per device).
  absl::StatusOr<DeviceHeap*> HeapFor(int device);
  // The heap whose VA holds `ptr`, or nullptr.
  DeviceHeap* HeapOfPointer(CUdeviceptr ptr) const;
  absl::StatusOr<int> DeviceCount();
  // The current context and its device; false when none is current.
  // cuCtxGetCurrent every time (the driver's thread-local read: contexts can
  // change through paths the shim does not see), cuCtxGetDevice only for a
  // context this thread has not met since the last ForgetContext.
  bool CurrentContext(CUcontext* context, int* device);
  absl::Status SynchronizeContext(CUcontext context);
  // The context, device and key of `stream` (0: the legacy stream, or the
  // per-thread stream when `per_thread`), remembered per thread like
  // contexts; the driver's code for a stream it rejects.
  absl::Status ResolveStream(CUstream stream, bool per_thread, StreamKey* key, int* device);
  // The stream-ordered cache of `device`, or nullptr before its heap exists.
  StreamOrderedCache* CacheFor(int device) const {
    return DeviceSet::IsOrdinal(device) ? stream_caches_[device].load(std::memory_order_acquire)
                                        : nullptr;
  }
  // The device whose default pool is `pool` and that the shim serves, or -1.
  int DeviceOfDefaultPool(CUmemoryPool pool) const;
  // The same, asking the driver about every device's default pool and
  // creating that device's heap (and stream-ordered cache) when needed.
  int DeviceOfPoolCreatingHeap(CUmemoryPool pool);
  // The size class of a stream-ordered request (core/stream_ordered/stream_ordered_cache.h).
  static size_t SizeClass(const DeviceHeap& heap, size_t bytes);
  static size_t SizeClassOf(const PointerInfo& info);
  // Every thread asks the driver again about the streams it met.
  static void ForgetStreamMemos();
  // Frees blocks that left a stream-ordered cache in their heap.
  static void ReleaseToHeap(DeviceHeap* heap, const ReleasedBlocks& blocks);
  // Out of memory: synchronizes the contexts holding freed stream-ordered
  // blocks of `device` (-1: every device), then releases every ready block;
  // true when any was released. Nothing while a capture is in progress.
  bool ReclaimStreamOrdered(int device);
  absl::Status FreeStreamOrdered(DeviceHeap* heap, const PointerInfo& info, CUstream stream,
                                 bool per_thread);
  absl::Status SetPoolPeer(int peer, int owner, bool enable);
  // Free, with the capture gate held shared.
  absl::Status FreeGated(DeviceHeap* heap, CUdeviceptr ptr)
      ABSL_SHARED_LOCKS_REQUIRED(captures_.gate());
  // After `context` was synchronized: completes its deferred frees.
  void CompleteDeferred(CUcontext context);
  // Once no capture is in progress: synchronizes the contexts with deferred
  // frees and completes them; true when any completed.
  bool ReclaimDeferred();
  absl::Status SetExplicit(CUdeviceptr ptr, int peer, bool grant);

  const DriverApi& driver_;
  const AllocatorOptions options_;
  const VmmMapper mapper_;
  ReservationMap ranges_;
  ExportRegistry exports_;
  CaptureTracker captures_;
  // Frees' synchronizes of their contexts, combined across threads.
  SyncCombiner free_syncs_{[this](CUcontext c) { return SynchronizeContext(c); }};
  GlobalCounters global_;
  // Changed only under peers_mu_; Enabled() reads are lock-free.
  PeerEnableTable peers_;
  Mutex peers_mu_;  // orders EnablePeer/DisablePeer and the grants they cause
  Mutex pause_mu_;  // serializes PauseMemory and ResumeMemory (after the capture gate)
  int CopyThreads() const;

  Mutex heaps_mu_ ABSL_ACQUIRED_AFTER(peers_mu_);  // serializes heap creation only
  std::array<std::atomic<DeviceHeap*>, kMaxDevices> heaps_{};
  std::array<std::atomic<StreamOrderedCache*>, kMaxDevices> stream_caches_{};
  std::array<std::atomic<CUmemoryPool>, kMaxDevices> default_pools_{};
  // Whether the default pool is current: 0 not asked yet, 1 yes, 2 no.
  std::array<std::atomic<int>, kMaxDevices> default_pool_current_{};
  // Peers given access to each device's default pool (cuMemPoolSetAccess);
  // changed only under peers_mu_.
  PeerEnableTable pool_peers_;
  std::array<std::atomic<bool>, kMaxDevices> no_vmm_{};
  std::atomic<int> device_count_{0};
  std::atomic<uint64_t> passthrough_allocations_{0}, passthrough_bytes_{0};
  std::atomic<uint64_t> peer_enable_calls_{0}, peer_enable_ns_{0};
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_ALLOCATOR_H_
