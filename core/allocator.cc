#include "core/allocator.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "core/base/log.h"
#include "core/base/round_up.h"
#include "core/driver/context.h"
#include "core/driver/cu_status.h"
#include "core/sync/shared_gate.h"

namespace vmmshim {

Allocator::Allocator(const DriverApi& driver, const AllocatorOptions& options, HeapTable& heaps,
                     CaptureTracker& captures, SyncCombiner& free_syncs,
                     StreamOrderedFrontEnd& stream_ordered,
                     const std::atomic<uint64_t>& memory_margin_bytes)
    : driver_(driver),
      options_(options),
      heaps_(heaps),
      captures_(captures),
      free_syncs_(free_syncs),
      stream_ordered_(stream_ordered),
      memory_margin_bytes_(memory_margin_bytes) {}

absl::StatusOr<Allocator::Allocation> Allocator::Allocate(size_t bytes, absl::string_view tag,
                                                          uint16_t origin) {
  CUcontext context = nullptr;
  int device = 0;
  if (!CurrentContext(driver_, &context, &device)) {
    return Allocation{};  // the driver reports its own error for this state
  }
  absl::StatusOr<DeviceHeap*> heap = heaps_.HeapFor(device);
  if (!heap.ok()) return heap.status();
  if (*heap == nullptr) return Allocation{};
  if (bytes > std::numeric_limits<size_t>::max() - (*heap)->granularity()) {
    return DriverError(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc");
  }
  // During a capture that prohibits the call, the driver's code, and the
  // capture invalidated by the driver itself (core/sync/capture.h).
  if (captures_.any()) {
    if (CUresult r = captures_.ProbeUnsafeCall(); r != CUDA_SUCCESS) {
      return DriverError(r, "cuMemAlloc");
    }
  }
  absl::StatusOr<int> device_count = heaps_.DeviceCount();
  if (!device_count.ok()) return device_count.status();
  const Placement placement{
      context, options_.peer_policy.Allowed(device, *device_count, bytes, tag), std::string(tag)};
  if (std::optional<CUdeviceptr> hit = (*heap)->AllocateFast(placement, bytes, origin)) {
    return Allocation{*hit, true, device};
  }
  if (const uint64_t margin = memory_margin_bytes_.load(std::memory_order_relaxed);
      margin > 0 && !tag.empty()) {
    size_t free_bytes = 0, total_bytes = 0;
    if (driver_.cuMemGetInfo_v2(&free_bytes, &total_bytes) == CUDA_SUCCESS &&
        (bytes > free_bytes || free_bytes - bytes < margin)) {
      Log().info("cuMemAlloc of {} bytes (tag {}) refused: {} bytes free on device {}, memory "
                 "margin {} bytes",
                 bytes, std::string(tag), free_bytes, device, margin);
      return DriverError(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc (memory margin)");
    }
  }
  absl::StatusOr<CUdeviceptr> ptr = (*heap)->AllocateSlow(placement, bytes, origin);
  // Memory held back by frees during a capture that has ended is free
  // memory to the application: reclaim it and try once more (AllocateSlow
  // releases the cache, where those frees went, on OOM itself). So is memory
  // freed with cuMemFreeAsync that waits in the stream-ordered caches.
  if (!ptr.ok() && ToCuResult(ptr.status()) == CUDA_ERROR_OUT_OF_MEMORY) {
    const bool deferred = heaps_.ReclaimDeferred(captures_);  // both run:
    const bool async = stream_ordered_.Reclaim(-1);   // each may free memory
    if (deferred || async) ptr = (*heap)->AllocateSlow(placement, bytes, origin);
  }
  if (!ptr.ok()) return ptr.status();
  return Allocation{*ptr, true, device};
}

absl::StatusOr<Allocator::Allocation> Allocator::AllocatePitch(size_t width, size_t height,
                                                               size_t* pitch,
                                                               absl::string_view tag,
                                                               uint16_t origin) {
  const size_t a = options_.pitch_alignment;
  if (width > std::numeric_limits<size_t>::max() - a) {
    return DriverError(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAllocPitch");
  }
  const size_t p = RoundUp(width, a);
  if (height > std::numeric_limits<size_t>::max() / p) {
    return DriverError(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAllocPitch");
  }
  // The driver reports the pitch even when the allocation then fails
  // (seen on H200: cuMemAllocPitch(1 GiB x 4 Mi) gives OOM and pitch 1 GiB).
  *pitch = p;
  return Allocate(p * height, tag, origin);
}

absl::Status Allocator::Free(CUdeviceptr ptr) {
  HeapArena* arena = heaps_.Locate(ptr).arena;
  if (arena == nullptr) return NotShimMemory();
  // No capture may begin between the check below and the synchronize.
  GateReaderLock gate(&captures_.gate());
  return FreeGated(arena, ptr);
}

absl::Status Allocator::FreeGated(HeapArena* arena, CUdeviceptr ptr) {
  std::optional<PointerInfo> info = arena->Find(ptr);
  const bool valid = info && info->allocation_base == ptr;
  // cudaFree of cudaMallocAsync memory succeeds natively (measured), once: a
  // block already freed with cuMemFreeAsync is a double free, also during a
  // capture. The stream-ordered figures count the free once it happened.
  if (valid && stream_ordered_.Cached(*info)) {
    return DriverError(CUDA_ERROR_INVALID_VALUE, "cuMemFree");
  }
  if (captures_.any()) {
    // The driver refuses the call where the capture prohibits it (and the
    // pointer stays live); elsewhere the free succeeds, but the context
    // cannot be synchronized: the memory is held back (core/sync/capture.h).
    if (CUresult r = captures_.ProbeUnsafeCall(); r != CUDA_SUCCESS) {
      return DriverError(r, "cuMemFree");
    }
    absl::Status deferred = arena->DeferFree(ptr);
    if (deferred.ok() && valid) stream_ordered_.NoteFreed(*info);
    return deferred;
  }
  // Validated and its context found; synchronize without the arena lock so
  // other threads keep allocating on this device while the GPU drains.
  if (!valid) return DriverError(CUDA_ERROR_INVALID_VALUE, "cuMemFree");
  absl::Status synced = free_syncs_.Synchronize(info->context);
  const bool driver_gone = ToCuResult(synced) == CUDA_ERROR_DEINITIALIZED;
  if (!synced.ok() && !driver_gone) return synced;
  absl::Status freed = arena->Free(ptr, driver_gone);
  if (!freed.ok()) return freed;
  stream_ordered_.NoteFreed(*info);
  if (driver_gone) return synced;
  heaps_.CompleteDeferred(info->context);
  return absl::OkStatus();
}

absl::Status Allocator::FreeAsync(CUdeviceptr ptr, CUstream stream, bool per_thread) {
  HeapArena* arena = heaps_.Locate(ptr).arena;
  if (arena == nullptr) return NotShimMemory();
  if (std::optional<PointerInfo> info = arena->Find(ptr); info && info->stream_ordered) {
    if (info->allocation_base != ptr) return DriverError(CUDA_ERROR_INVALID_VALUE, "cuMemFreeAsync");
    return stream_ordered_.Free(*info, stream, per_thread);
  }
  GateReaderLock gate(&captures_.gate());
  if (captures_.any()) {
    if (captures_.IsCapturing(stream, per_thread).value_or(false)) {
      return DriverError(CUDA_ERROR_INVALID_VALUE, "cuMemFreeAsync");
    }
    return FreeGated(arena, ptr);  // probed, and deferred where allowed
  }
  auto sync = per_thread ? driver_.cuStreamSynchronize_ptsz : driver_.cuStreamSynchronize;
  if (sync != nullptr) {
    if (CUresult r = sync(stream); r != CUDA_SUCCESS) return DriverError(r, "cuStreamSynchronize");
  }
  return FreeGated(arena, ptr);
}

absl::StatusOr<PointerInfo> Allocator::Find(CUdeviceptr ptr) const {
  HeapArena* arena = heaps_.Locate(ptr).arena;
  if (arena == nullptr) return NotShimMemory();
  std::optional<PointerInfo> info = arena->Find(ptr);
  if (!info) return DriverError(CUDA_ERROR_NOT_FOUND, "vmmshim lookup");
  return *info;
}

size_t Allocator::ReleaseContext(CUcontext context, bool synchronize) {
  if (context == nullptr) return 0;
  ForgetContexts();
  bool any = false;
  heaps_.ForEach([&](DeviceHeap* heap) { any = any || heap->Holds(context); });
  // Also a context that only freed other contexts' stream-ordered memory on
  // its streams: those blocks must leave with its streams.
  any = any || stream_ordered_.Holds(context);
  // No driver call for a context the shim never served (it may be invalid).
  if (!any) return 0;
  // Work still queued in the context may use the memory.
  if (synchronize) {
    if (absl::Status synced = SynchronizeContext(driver_, context); !synced.ok()) {
      Log().debug("synchronizing a released context: {}", synced.ToString());
    }
  }
  // The stream-ordered caches forget the context first: its blocks are
  // released below, blocks of other contexts freed on its streams are freed
  // now (their stream's work is over).
  stream_ordered_.DropContext(context);
  size_t released = 0;
  heaps_.ForEach([&](DeviceHeap* heap) { released += heap->ReleaseContext(context); });
  return released;
}

void Allocator::CaptureEnded(CUstream stream, bool per_thread) {
  {
    // Exclusive: a free that saw the capture in progress finishes deferring
    // before the capture is forgotten, so the reclaim below sees it.
    GateWriterLock gate(&captures_.gate());
    captures_.Ended(stream, per_thread);
  }
  if (!captures_.any()) heaps_.ReclaimDeferred(captures_);
}

}  // namespace vmmshim
