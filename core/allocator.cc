#include "core/allocator.h"

#include <algorithm>
#include <limits>
#include <new>
#include <map>
#include <utility>

#include "core/base/cpus.h"
#include "core/base/log.h"
#include "core/base/round_up.h"
#include "core/driver/context.h"
#include "core/driver/cu_status.h"
#include "core/sync/shared_gate.h"
#include "core/sync/thread_slot.h"

namespace vmmshim {
namespace {

HeapTable::Options HeapOptions(const AllocatorOptions& o) {
  HeapTable::Options h;
  h.packing_threshold = o.packing_threshold;
  h.reservation_bytes = o.reservation_bytes;
  h.cache_limit_percent = o.cache_limit_percent;
  h.cache_limit_bytes = o.cache_limit_bytes;
  h.exportable = o.exportable;
  h.compression = o.compression;
  h.arenas = o.arenas;
  h.history = o.history;
  return h;
}

}  // namespace

std::vector<DeviceResidency> Allocator::Residency() const {
  // Devices the shim served, and those where other libraries hold memory.
  std::map<int, DeviceResidency> by_device;
  heaps_.ForEach([&](DeviceHeap* heap) {
    DeviceResidency& r = by_device[heap->device()];
    r.device = heap->device();
    heap->ForEachArena([&](HeapArena* arena) { arena->AddResidency(&r); });
    r.stream_ordered_cached_bytes = stream_ordered_.figures(r.device).cached;
    r.passed_through_bytes = counters_.PassedThroughLive(r.device);
  });
  for (ForeignDeviceFigures& f : foreign_.Figures()) {
    DeviceResidency& r = by_device[f.device];
    r.device = f.device;
    r.other_vmm_by_tag = std::move(f.by_tag);
    r.other_vmm_paused_by_tag = std::move(f.paused_by_tag);
    r.other_vmm_exported_bytes = f.exported_bytes;
    r.other_vmm_unmapped_bytes = f.unmapped_bytes;
    r.other_vmm_imported_bytes = f.imported_bytes;
  }
  std::vector<DeviceResidency> out;
  for (auto& [device, r] : by_device) out.push_back(std::move(r));
  return out;
}

Allocator::Allocator(const DriverApi& driver, AllocatorOptions options)
    : driver_(driver),
      options_(std::move(options)),
      mapper_(driver),
      captures_(driver),
      free_syncs_([this](CUcontext c) { return SynchronizeContext(driver_, c); }),
      heaps_(driver, mapper_, options_.peer_policy, HeapOptions(options_),
             [this](int device) {
               stream_ordered_.CreateCache(device);
               // A context is current here (the first allocation on the
               // device); the pool starts once, in the first one.
               CUcontext context = nullptr;
               if (options_.pinned_pool_bytes > 0 && driver_.cuCtxGetCurrent(&context) == CUDA_SUCCESS) {
                 pause_.StartPinnedPool(options_.pinned_pool_bytes, context,
                                        options_.pinned_pool_chunk_bytes);
               }
             }),
      stream_ordered_(driver, heaps_, captures_, options_.peer_policy,
                      options_.stream_query_interval_ns, [this] { return ReclaimDeferred(); }),
      peers_(driver, heaps_, options_.history),
      foreign_(driver),
      pause_(driver, heaps_, captures_,
             options_.copy_threads > 0 ? options_.copy_threads : UsableCpusUpTo(16),
             PauseCoordinator::Hooks{
                 [this] { Trim(-1); },
                 [this](const TagSelection& tag) {
                   return stream_ordered_.ReleaseForPause(tag);
                 },
                 &foreign_}) {
  // Another allocator (tests) may see the same context handles on other
  // devices.
  ForgetContexts();
}

Allocator::~Allocator() {
  absl::Status status = ReleaseAll();
  if (!status.ok()) Log().warn("releasing at teardown: {}", status.ToString());
}

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
    const bool deferred = ReclaimDeferred();          // both run:
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

absl::StatusOr<ExportedAllocation> Allocator::Export(CUdeviceptr ptr) {
  HeapArena* arena = heaps_.Locate(ptr).arena;
  if (arena == nullptr) return NotShimMemory();
  absl::StatusOr<std::pair<PointerInfo, ExportToken>> exported = arena->Export(ptr);
  if (!exported.ok()) return exported.status();
  const PointerInfo& info = exported->first;
  ExportedAllocation out;
  out.token = exported->second;
  out.offset = info.allocation_base - info.range_base;
  out.size = info.allocation_size;
  out.handle_size = info.range_size;
  out.device = info.device;
  return out;
}

absl::StatusOr<int> Allocator::ExportFd(const ExportToken& token, uint64_t offset,
                                        uint64_t size, uint64_t* handle_size) {
  std::optional<std::pair<int, CUdeviceptr>> where = heaps_.exports().Lookup(token);
  HeapArena* arena = where ? heaps_.Locate(where->second).arena : nullptr;
  if (arena == nullptr) return DriverError(CUDA_ERROR_INVALID_VALUE, "cuIpcOpenMemHandle");
  return arena->ExportFd(token, where->second, offset, size, handle_size);
}

DeviceSet Allocator::AccessTargets(int device, size_t bytes) {
  const DeviceSet self = DeviceSet::Of(device);
  absl::StatusOr<int> count = heaps_.DeviceCount();
  if (!count.ok() || !DeviceSet::IsOrdinal(device)) return self;
  return (options_.peer_policy.Allowed(device, *count, bytes, "") &
          heaps_.peers().Enabled(device)) |
         self;
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

void Allocator::PrepareFork() {
  captures_.PrepareForkGate();
  pause_.PrepareFork();
  foreign_.PrepareFork();
  heaps_.PrepareForkPeers();
  stream_ordered_.PrepareFork();
  heaps_.PrepareForkHeaps();
  captures_.PrepareForkState();
}

void Allocator::AfterFork(bool in_child) {
  if (in_child) {
    // Unlocking would try to wake the parent's threads that were queued on
    // a mutex (they do not exist here) and spin forever: the child, alone,
    // gets fresh, unlocked mutexes instead.
    captures_.AfterForkChild();
    free_syncs_.AfterForkChild();
    ResetThreadSlotsInForkChild();  // the parent's other threads do not exist here
    heaps_.AfterForkChild();
    stream_ordered_.AfterForkChild();
    foreign_.AfterForkChild();
    pause_.AfterForkChild();
    return;
  }
  captures_.AfterForkParentState();
  heaps_.AfterForkParentHeaps();
  stream_ordered_.AfterForkParent();
  heaps_.AfterForkParentPeers();
  foreign_.AfterForkParent();
  pause_.AfterForkParent();
  captures_.AfterForkParentGate();
}

absl::StatusOr<const void*> Allocator::PausedContents(CUdeviceptr ptr, size_t bytes) const {
  HeapArena* arena = heaps_.Locate(ptr).arena;
  if (arena == nullptr) return NotShimMemory();
  return arena->PausedContents(ptr, bytes);
}

void Allocator::CaptureEnded(CUstream stream, bool per_thread) {
  {
    // Exclusive: a free that saw the capture in progress finishes deferring
    // before the capture is forgotten, so the reclaim below sees it.
    GateWriterLock gate(&captures_.gate());
    captures_.Ended(stream, per_thread);
  }
  if (!captures_.any()) ReclaimDeferred();
}

bool Allocator::ReclaimDeferred() {
  return heaps_.ReclaimDeferred(captures_, [this](CUcontext c) {
    return SynchronizeContext(driver_, c);
  });
}

size_t Allocator::Trim(int device) {
  ReclaimDeferred();
  stream_ordered_.Reclaim(device);
  size_t released = 0;
  heaps_.ForEach([&](DeviceHeap* heap) {
    if (device < 0 || heap->device() == device) released += heap->Trim();
  });
  return released;
}

std::vector<SegmentInfo> Allocator::Segments() const {
  std::vector<SegmentInfo> out;
  heaps_.ForEach([&](DeviceHeap* heap) {
    heap->ForEachArena([&](HeapArena* arena) { arena->AddSegments(&out); });
  });
  return out;
}

size_t Allocator::IdleBytes(int device) const {
  DeviceHeap* heap = heaps_.heap(device);
  return heap == nullptr ? 0 : heap->cached_bytes();
}

AllocatorStats Allocator::GetStats() const {
  AllocatorStats s;
  DeviceStats total;
  heaps_.ForEach([&](DeviceHeap* heap) {
    s.devices.push_back(heap->stats());
    s.devices.back().stream_ordered = stream_ordered_.figures(heap->device());
    total += s.devices.back();
  });
  s.served_allocations = total.allocations;
  s.served_bytes = total.bytes;
  s.frees = total.frees;
  s.live_allocations = total.live_allocations;
  s.live_bytes = total.live_bytes;
  s.handles = total.handles;
  s.handle_bytes = total.handle_bytes;
  s.deferred_frees = total.deferred_frees;
  s.stream_ordered_allocations = total.stream_ordered.allocations;
  s.stream_ordered_reuses = total.stream_ordered.reuses;
  s.stream_ordered_cached_bytes = total.stream_ordered.cached;
  // Peaks of the sums, which only the process-wide counters know.
  const GlobalCounters& global = heaps_.global();
  s.peak_handle_bytes = global.peak.load(std::memory_order_relaxed);
  s.paused_bytes = global.paused.load(std::memory_order_relaxed);
  s.peak_paused_bytes = global.paused_peak.load(std::memory_order_relaxed);
  s.free_synchronizes = free_syncs_.synchronizes();
  s.free_synchronizes_shared = free_syncs_.shared();
  counters_.AddTo(&s);
  return s;
}

absl::Status Allocator::ReleaseAll() { return heaps_.ReleaseAll(); }

}  // namespace vmmshim
