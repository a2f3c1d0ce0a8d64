// The allocation surface of the VMM allocator: device memory from
// cuMemCreate physical handles mapped into reserved virtual address ranges
// (CUDA Programming Guide section 4.16, "Virtual Memory Management"), with
// per-allocation peer access.
//
// Allocator serves the program's allocations and frees and the events that
// change what it holds (a capture ending, a context going). It finds the
// device of the current context and the arena of a pointer, decides the
// placement (policy), and synchronizes before frees; the memory itself comes
// from the rooms below, which ShimCore (core/shim_core.h) builds and owns:
//   - HeapTable (core/heap/heap_table.h): every device's heap
//     (core/heap/device_heap.h: per-thread arenas, core/heap/heap_arena.h:
//     blocks, packed granules, the cache; shapes, rounding, alignment,
//     caching and address ranges are specified there) and what they share;
//   - StreamOrderedFrontEnd (core/stream_ordered/stream_ordered_front_end.h):
//     which freed stream-ordered blocks a cuMemFree must not free twice;
//   - SyncCombiner (core/sync/context_sync.h): frees' context synchronizes,
//     shared by concurrent frees;
//   - CaptureTracker (core/sync/capture.h): stream captures in progress, and
//     the driver's rule for calls made during one.
// What asks about or steers the memory (statistics, residency, trim,
// export, the memory margin) is MemoryControl (core/memory_control.h).
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
// the current one) first. During a stream capture: Note [Calls during a
// stream capture] (core/sync/capture.h), which says what is deferred and
// which codes come back.
//
// Thread safety: all methods may be called concurrently. Lock order: the one
// table of core/sync/lock_order.h.
//
// Process exit: the shim never destroys its ShimCore. When the driver is
// already torn down (CUDA_ERROR_DEINITIALIZED, seen when cudart frees at
// exit), Free() forgets the allocation without further driver calls and
// returns that code, as the driver itself would.
#ifndef VMMSHIM_CORE_ALLOCATOR_H_
#define VMMSHIM_CORE_ALLOCATOR_H_

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/driver/driver_api.h"
#include "core/heap/allocator_options.h"
#include "core/heap/heap_table.h"
#include "core/heap/types.h"
#include "core/history/memory_history.h"
#include "core/peer/policy/peer_policy.h"
#include "core/stream_ordered/stream_ordered_front_end.h"
#include "core/sync/capture.h"
#include "core/sync/context_sync.h"

namespace vmmshim {


class Allocator {
 public:
  using Allocation = vmmshim::Allocation;

  // Everything referenced must outlive the allocator (ShimCore owns it all).
  // `memory_margin_bytes`: MemoryControl::SetMemoryMarginBytes.
  Allocator(const DriverApi& driver, const AllocatorOptions& options, HeapTable& heaps,
            CaptureTracker& captures, SyncCombiner& free_syncs,
            StreamOrderedFrontEnd& stream_ordered,
            const std::atomic<uint64_t>& memory_margin_bytes);
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // `bytes` > 0, on the device of the current context. `tag` ("" = none)
  // is matched by rules policies and groups packed allocations. Not served
  // (Allocation::served false, nothing done; the caller hands the request to
  // the driver) when no context is current (the driver then returns its own
  // error) and on devices without VMM support. During a stream capture:
  // Note [Calls during a stream capture] (core/sync/capture.h).
  // Fast path: a cached block or a free run of an open granule of the
  // placement, with no driver call beyond cuCtxGetCurrent.
  // `origin`: who asked (a CallerLibraries id, core/history/caller_library.h),
  // kept with the allocation for MemoryControl::Segments().
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
  // point). Stream-ordered memory goes to the stream-ordered front end.
  // Other shim memory (cudaMalloc; natively freed in stream order too): the
  // free must not happen before the work queued on the stream is done, so
  // the stream is synchronized, then the memory freed as Free does. During
  // captures: Note [Calls during a stream capture] (core/sync/capture.h).
  absl::Status FreeAsync(CUdeviceptr ptr, CUstream stream, bool per_thread);

  // The live allocation containing `ptr`: NotShimMemory() outside the
  // shim's VA, CUDA_ERROR_NOT_FOUND inside it but not in a live allocation.
  absl::StatusOr<PointerInfo> Find(CUdeviceptr ptr) const;

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

 private:
  // Free, with the capture gate held shared.
  absl::Status FreeGated(HeapArena* arena, CUdeviceptr ptr)
      ABSL_SHARED_LOCKS_REQUIRED(captures_.gate());

  const DriverApi& driver_;
  const AllocatorOptions& options_;
  HeapTable& heaps_;
  CaptureTracker& captures_;
  SyncCombiner& free_syncs_;
  StreamOrderedFrontEnd& stream_ordered_;
  const std::atomic<uint64_t>& memory_margin_bytes_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_ALLOCATOR_H_
