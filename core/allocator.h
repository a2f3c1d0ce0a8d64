// The VMM allocator: device memory from cuMemCreate physical handles mapped
// into reserved virtual address ranges (CUDA Programming Guide section 4.16,
// "Virtual Memory Management"), with per-allocation peer access.
//
// Allocator is the facade over rooms that each own one thing
// (docs/architecture.md):
//   - HeapTable (core/heap/heap_table.h): every device's heap
//     (core/heap/device_heap.h: per-thread arenas, core/heap/heap_arena.h:
//     blocks, packed granules, the cache; shapes, rounding, alignment,
//     caching and address ranges are specified there) and what they share;
//   - StreamOrderedFrontEnd (core/stream_ordered/stream_ordered_front_end.h):
//     cuMemAllocAsync and the default pools, through stream_ordered();
//   - PauseCoordinator (core/heap/pause.h): pause and resume by tag, through
//     pause();
//   - SyncCombiner (core/sync/context_sync.h): frees' context synchronizes,
//     shared by concurrent frees;
//   - VmmMapper (core/driver/vmm_mapping.h): the only caller of the VMM
//     entry points, undoing every multi-step sequence on failure;
//   - PeerGrants (core/peer_grants.h): device-pair peer enables and
//     per-allocation grants, through peers();
//   - CaptureTracker (core/sync/capture.h): stream captures in progress, and
//     the driver's rule for calls made during one.
// The facade finds the device of the current context, the arena of a
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
// and destruction, which must not overlap other calls. Lock order: the one
// table of core/sync/lock_order.h.
//
// Process exit: the shim never destroys its Allocator. When the driver is
// already torn down (CUDA_ERROR_DEINITIALIZED, seen when cudart frees at
// exit), Free() forgets the allocation without further driver calls and
// returns that code, as the driver itself would.
#ifndef VMMSHIM_CORE_ALLOCATOR_H_
#define VMMSHIM_CORE_ALLOCATOR_H_

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/allocator_stats.h"
#include "core/base/device_set.h"
#include "core/driver/driver_api.h"
#include "core/driver/vmm_mapping.h"
#include "core/foreign/foreign_vmm.h"
#include "core/heap/export_registry.h"
#include "core/heap/heap_table.h"
#include "core/heap/pause.h"
#include "core/heap/types.h"
#include "core/history/memory_history.h"
#include "core/peer_grants.h"
#include "core/policy/peer_policy.h"
#include "core/stream_ordered/stream_ordered_front_end.h"
#include "core/sync/capture.h"
#include "core/sync/context_sync.h"

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
  // most 16 (bench/backup_bandwidth on an H200 host with 16 CPUs: 8 threads
  // 14 GiB/s out and 23 back, 16 threads 19-20 out and 28-30 back).
  int copy_threads = 0;
  // Page-locked host memory made ahead for kept contents, from the first
  // device allocation, kept to the end of the process (core/heap/pinned_pool.h;
  // VMMSHIM_PINNED_POOL); 0: none.
  size_t pinned_pool_bytes = 0;
  // What one registration of the pinned pool covers (PinnedPool; not a
  // VMMSHIM_* setting: tests make it small to cut copies at its ends).
  size_t pinned_pool_chunk_bytes = size_t{1} << 30;
  // Where segment events (mapped, released, paused, resumed) and peer
  // decisions are recorded (core/history/memory_history.h), while it is
  // enabled; null: nowhere. Must outlive the allocator.
  MemoryHistory* history = nullptr;
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
  using Allocation = vmmshim::Allocation;

  // `driver` must outlive the allocator.
  explicit Allocator(const DriverApi& driver, AllocatorOptions options = {});
  // Releases everything still held (see ReleaseAll).
  ~Allocator();

  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // `bytes` > 0, on the device of the current context. `tag` ("" = none)
  // is matched by rules policies and groups packed allocations. Not served
  // (Allocation::served false, nothing done; the caller hands the request to
  // the driver) when no context is current (the driver then returns its own
  // error) and on devices without VMM support. During a stream capture that
  // prohibits the call, the driver's code
  // (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, capture invalidated).
  // Fast path: a cached block or a free run of an open granule of the
  // placement, with no driver call beyond cuCtxGetCurrent.
  // `origin`: who asked (a CallerLibraries id, core/history/caller_library.h),
  // kept with the allocation for Segments().
  absl::StatusOr<Allocation> Allocate(size_t bytes, absl::string_view tag = "",
                                      uint16_t origin = 0);

  // A pitched 2D allocation: pitch = width rounded up to pitch_alignment,
  // bytes = pitch * height. `width` and `height` > 0. *pitch is set whenever
  // the pitch could be computed, also when the allocation then fails, as the
  // driver does.
  absl::StatusOr<Allocation> AllocatePitch(size_t width, size_t height, size_t* pitch,
                                           absl::string_view tag = "", uint16_t origin = 0);

  // Frees an allocation made by Allocate (header comment: errors, capture).
  absl::Status Free(CUdeviceptr ptr);

  // cuMemFreeAsync of shim memory on `stream` (`per_thread`: the _ptsz entry
  // point). Stream-ordered memory goes to stream_ordered(). Other shim memory
  // (cudaMalloc; natively freed in stream order too): the free must not
  // happen before the work queued on the stream is done, so the stream is
  // synchronized, then the memory freed as Free does. During captures, the
  // driver's codes, measured on H200 (core/sync/capture.h): on a capturing
  // stream CUDA_ERROR_INVALID_VALUE (a graph frees only graph allocations)
  // and the capture goes on; on another stream the driver's verdict on an
  // unsafe call, and the free deferred where it is allowed.
  absl::Status FreeAsync(CUdeviceptr ptr, CUstream stream, bool per_thread);

  // Stream-ordered allocation and the default pools.
  StreamOrderedFrontEnd& stream_ordered() { return stream_ordered_; }
  // Pause and resume by tag.
  PauseCoordinator& pause() { return pause_; }
  const PauseCoordinator& pause() const { return pause_; }

  // The live allocation containing `ptr`: NotShimMemory() outside the
  // shim's VA, CUDA_ERROR_NOT_FOUND inside it but not in a live allocation.
  absl::StatusOr<PointerInfo> Find(CUdeviceptr ptr) const;

  // What the shim holds on every device it served now, by tag and kind
  // (core/heap/types.h: DeviceResidency), with the stream-ordered cache's
  // part and the live passed-through allocations; device order.
  std::vector<DeviceResidency> Residency() const;

  // Every block the heaps hold (mapped, cached or paused), each with its
  // live allocations and free space in address order; device order, then
  // address order within each arena. The stream-ordered cache's blocks are
  // live allocations here (the program freed them; they wait for their
  // stream). Takes each arena's lock in turn: a consistent view per arena,
  // not across them.
  std::vector<SegmentInfo> Segments() const;

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

  // Stream captures in progress (the hooks begin captures through it).
  CaptureTracker& captures() { return captures_; }
  // cuStreamEndCapture(stream) returned: the tracker forgets the capture if
  // it is over, and when no capture is left, the frees deferred during the
  // captures complete (their contexts are synchronized once, here, so that
  // what a capture held back does not wait for the next free).
  void CaptureEnded(CUstream stream, bool per_thread);

  // Releases everything allocated in `context` (live allocations, their
  // cache, their exports, their deferred frees, its stream-ordered blocks),
  // after synchronizing it: what the driver does to a context's cuMemAlloc
  // memory when the context is destroyed or reset. VA reservations stay for
  // reuse. Returns the physical bytes released. `synchronize` false: the
  // context is already gone. Makes no driver call when nothing of `context`
  // is held. Every thread asks the driver again about its contexts
  // afterwards (core/driver/context.h).
  size_t ReleaseContext(CUcontext context, bool synchronize);

  // fork(): PrepareFork takes every lock of the allocator in the order of
  // core/sync/lock_order.h; AfterFork releases them in the parent (in
  // reverse) and gives the child (a single thread) fresh, unlocked mutexes.
  // For pthread_atfork.
  void PrepareFork() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void AfterFork(bool in_child) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // Device-pair peer enables and per-allocation grants
  // (core/peer_grants.h).
  PeerGrants& peers() { return peers_; }
  const PeerGrants& peers() const { return peers_; }
  // The memory margin (torch_memory_saver's memory_margin_bytes): from now
  // on a tagged allocation that needs new physical memory fails with
  // CUDA_ERROR_OUT_OF_MEMORY when, after it, less than `bytes` of the
  // device's memory would stay free (cuMemGetInfo). 0 (the default) turns
  // it off. Allocations served from the cache, and untagged ones, are not
  // checked: they are outside what the margin protects, and the cached
  // path makes no driver call. Any thread.
  void SetMemoryMarginBytes(uint64_t bytes) {
    memory_margin_bytes_.store(bytes, std::memory_order_relaxed);
  }
  // The host copy of [ptr, ptr + bytes) of a paused allocation whose
  // contents were kept (HeapArena::PausedContents states the rule): valid
  // until the allocation is resumed or freed. CUDA_ERROR_INVALID_VALUE: not
  // shim memory or past the allocation's end; CUDA_ERROR_NOT_FOUND: not
  // paused, or paused without its contents.
  absl::StatusOr<const void*> PausedContents(CUdeviceptr ptr, size_t bytes) const;

  AllocatorStats GetStats() const;
  // Calls the interposition layer counts (pass-throughs, peer enables).
  CallCounters& counters() { return counters_; }
  // Other libraries' own VMM memory, as the hooks observe it (residency).
  ForeignVmm& foreign() { return foreign_; }
  const ForeignVmm& foreign() const { return foreign_; }
  const PeerPolicy& peer_policy() const { return options_.peer_policy; }

  // Unmaps and releases every handle and frees every reservation, in the
  // guide's order (unmap -> release -> address free). Live allocations become
  // invalid. Returns the first driver error; continues past errors.
  absl::Status ReleaseAll();

 private:
  // Free, with the capture gate held shared.
  absl::Status FreeGated(HeapArena* arena, CUdeviceptr ptr)
      ABSL_SHARED_LOCKS_REQUIRED(captures_.gate());
  // HeapTable::ReclaimDeferred with this allocator's synchronize.
  bool ReclaimDeferred();

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
  std::atomic<uint64_t> memory_margin_bytes_{0};  // SetMemoryMarginBytes
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_ALLOCATOR_H_
