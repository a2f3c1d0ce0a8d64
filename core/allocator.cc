#include "core/allocator.h"

#include <sched.h>

#include <algorithm>
#include <limits>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/driver/cu_status.h"
#include "core/heap/host_backup.h"
#include "core/base/log.h"
#include "core/base/round_up.h"
#include "core/sync/thread_slot.h"

namespace vmmshim {
namespace {

// The device of a context, remembered per thread so that a cache hit makes
// no cuCtxGetDevice call. A context handle names one device for its whole
// life, but a destroyed context's handle can be reused by a new context on
// another device; ForgetContext (and every new Allocator) moves the epoch, so
// every thread asks the driver again.
std::atomic<uint64_t> g_context_epoch{1};
struct ContextMemo {
  CUcontext context = nullptr;
  int device = -1;
  uint64_t epoch = 0;
};
thread_local ContextMemo t_context_memo;

// One arena per CPU the process may run on, at most 8: more arenas than
// threads that allocate at once only spread small allocations over more
// granules.
int DefaultArenas() {
  cpu_set_t set;
  int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  return std::clamp(cpus, 1, 8);
}

}  // namespace

Allocator::Allocator(const DriverApi& driver, AllocatorOptions options)
    : driver_(driver), options_(std::move(options)), mapper_(driver), captures_(driver) {
  // Another allocator (tests) may see the same context handles on other
  // devices.
  g_context_epoch.fetch_add(1, std::memory_order_acq_rel);
}

Allocator::~Allocator() {
  absl::Status status = ReleaseAll();
  if (!status.ok()) Log().warn("releasing at teardown: {}", status.ToString());
  for (auto& slot : heaps_) delete slot.load();
  for (auto& slot : stream_caches_) delete slot.load();
}

void Allocator::ForgetContext(CUcontext /*context*/) {
  g_context_epoch.fetch_add(1, std::memory_order_acq_rel);
  ForgetStreamMemos();
}

bool Allocator::CurrentContext(CUcontext* context, int* device) {
  if (driver_.cuCtxGetCurrent(context) != CUDA_SUCCESS || *context == nullptr) return false;
  ContextMemo& memo = t_context_memo;
  const uint64_t epoch = g_context_epoch.load(std::memory_order_acquire);
  if (memo.context == *context && memo.epoch == epoch) {
    *device = memo.device;
    return true;
  }
  CUdevice d = 0;
  if (driver_.cuCtxGetDevice(&d) != CUDA_SUCCESS) return false;
  memo = ContextMemo{*context, d, epoch};
  *device = d;
  return true;
}

absl::StatusOr<DeviceHeap*> Allocator::HeapFor(int device) {
  if (!DeviceSet::IsOrdinal(device)) {
    return absl::InvalidArgumentError(absl::StrCat("device ordinal ", device, " out of range"));
  }
  if (DeviceHeap* heap = heaps_[device].load(std::memory_order_acquire)) return heap;
  if (no_vmm_[device].load(std::memory_order_acquire)) return nullptr;

  MutexLock lock(&heaps_mu_);
  if (DeviceHeap* heap = heaps_[device].load(std::memory_order_acquire)) return heap;
  if (no_vmm_[device].load()) return nullptr;

  int vmm = 0;
  CUresult r = driver_.cuDeviceGetAttribute(
      &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuDeviceGetAttribute");
  if (vmm == 0) {
    Log().warn("device {} does not support virtual memory management; its allocations go "
               "to the driver unchanged",
               device);
    no_vmm_[device].store(true, std::memory_order_release);
    return nullptr;
  }
  DeviceHeap::Options o;
  o.device = device;
  o.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  o.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  o.prop.location.id = device;
  if (options_.exportable) {
    int fd_handles = 0;
    r = driver_.cuDeviceGetAttribute(
        &fd_handles, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device);
    if (r == CUDA_SUCCESS && fd_handles != 0) {
      o.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    } else {
      Log().info("device {} has no POSIX file-descriptor handles: its memory cannot be shared "
                 "through cuIpcGetMemHandle",
                 device);
    }
  }
  if (options_.compression) {
    int supported = 0;
    r = driver_.cuDeviceGetAttribute(&supported,
                                     CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, device);
    if (r == CUDA_SUCCESS && supported != 0) {
      o.prop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_GENERIC;
    } else {
      o.compression = CompressionState::kUnsupported;
      Log().warn("device {} does not support generic compression "
                 "(CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED = 0); its memory is "
                 "not compressible",
                 device);
    }
  }
  r = driver_.cuMemGetAllocationGranularity(&o.granularity, &o.prop,
                                            CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuMemGetAllocationGranularity");
  size_t total = 0;
  r = driver_.cuDeviceTotalMem_v2(&total, device);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuDeviceTotalMem");
  const size_t reservation =
      options_.reservation_bytes != 0 ? options_.reservation_bytes : 2 * total;
  o.reservation_bytes = RoundUp(std::max(reservation, o.granularity), o.granularity);
  // At most a granule: a packed request must fit a fresh one.
  o.packing_threshold = std::min(
      options_.packing_threshold != 0 ? options_.packing_threshold : o.granularity / 2,
      o.granularity);
  o.cache_limit = options_.cache_limit_percent >= 0
                      ? static_cast<size_t>(total * (options_.cache_limit_percent / 100.0))
                      : options_.cache_limit_bytes;
  o.arenas = options_.arenas > 0 ? options_.arenas : DefaultArenas();
  auto* heap = new DeviceHeap(driver_, mapper_, options_.peer_policy, peers_, pool_peers_,
                              exports_, ranges_, global_, o);
  Log().debug("device {}: granularity {} bytes, VA reservations of {} bytes", device,
              o.granularity, o.reservation_bytes);
  // Before the heap is published: whoever sees the heap sees its cache.
  stream_caches_[device].store(
      new StreamOrderedCache(driver_, options_.stream_query_interval_ns),
      std::memory_order_release);
  heaps_[device].store(heap, std::memory_order_release);
  return heap;
}

DeviceHeap* Allocator::HeapOfPointer(CUdeviceptr ptr) const {
  const int device = ranges_.DeviceOf(ptr);
  return device < 0 ? nullptr : heaps_[device].load(std::memory_order_acquire);
}

absl::StatusOr<int> Allocator::DeviceCount() {
  int n = device_count_.load(std::memory_order_relaxed);
  if (n == 0) {
    CUresult r = driver_.cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS) return DriverError(r, "cuDeviceGetCount");
    n = std::min(n, kMaxDevices);
    device_count_.store(n, std::memory_order_relaxed);
  }
  return n;
}

absl::StatusOr<Allocator::Allocation> Allocator::Allocate(size_t bytes, absl::string_view tag) {
  CUcontext context = nullptr;
  int device = 0;
  if (!CurrentContext(&context, &device)) {
    return Allocation{};  // the driver reports its own error for this state
  }
  absl::StatusOr<DeviceHeap*> heap = HeapFor(device);
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
  absl::StatusOr<int> device_count = DeviceCount();
  if (!device_count.ok()) return device_count.status();
  const Placement placement{
      context, options_.peer_policy.Allowed(device, *device_count, bytes, tag), std::string(tag)};
  if (std::optional<CUdeviceptr> hit = (*heap)->AllocateFast(placement, bytes)) {
    return Allocation{*hit, true};
  }
  absl::StatusOr<CUdeviceptr> ptr = (*heap)->AllocateSlow(placement, bytes);
  // Memory held back by frees during a capture that has ended is free
  // memory to the application: reclaim it and try once more.
  // (AllocateSlow releases the cache, where those frees went, on OOM itself.)
  // So is memory freed with cuMemFreeAsync that waits in the stream-ordered
  // caches.
  if (!ptr.ok() && ToCuResult(ptr.status()) == CUDA_ERROR_OUT_OF_MEMORY) {
    const bool deferred = ReclaimDeferred();         // both run:
    const bool async = ReclaimStreamOrdered(-1);     // each may free memory
    if (deferred || async) ptr = (*heap)->AllocateSlow(placement, bytes);
  }
  if (!ptr.ok()) return ptr.status();
  return Allocation{*ptr, true};
}

absl::StatusOr<Allocator::Allocation> Allocator::AllocatePitch(size_t width, size_t height,
                                                               size_t* pitch,
                                                               absl::string_view tag) {
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
  return Allocate(p * height, tag);
}

absl::Status Allocator::SynchronizeContext(CUcontext context) {
  if (driver_.cuCtxSynchronize_v2 != nullptr) {
    return DriverError(driver_.cuCtxSynchronize_v2(context), "cuCtxSynchronize");
  }
  CUcontext current = nullptr;
  CUresult r = driver_.cuCtxGetCurrent(&current);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuCtxGetCurrent");
  if (current == context) return DriverError(driver_.cuCtxSynchronize(), "cuCtxSynchronize");
  r = driver_.cuCtxPushCurrent_v2(context);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuCtxPushCurrent");
  r = driver_.cuCtxSynchronize();
  CUcontext popped = nullptr;
  driver_.cuCtxPopCurrent_v2(&popped);
  return DriverError(r, "cuCtxSynchronize");
}

void Allocator::CompleteDeferred(CUcontext context) {
  if (global_.deferred.load(std::memory_order_acquire) == 0) return;
  for (auto& slot : heaps_) {
    if (DeviceHeap* heap = slot.load(std::memory_order_acquire)) heap->CompleteDeferred(context);
  }
}

absl::Status Allocator::Free(CUdeviceptr ptr) {
  DeviceHeap* heap = HeapOfPointer(ptr);
  if (heap == nullptr) return NotShimMemory();
  // No capture may begin between the check below and the synchronize.
  GateReaderLock gate(&captures_.gate());
  return FreeGated(heap, ptr);
}

absl::Status Allocator::FreeGated(DeviceHeap* heap, CUdeviceptr ptr) {
  std::optional<PointerInfo> info = heap->Find(ptr);
  const bool valid = info && info->allocation_base == ptr;
  // cudaFree of cudaMallocAsync memory succeeds natively (measured), once: a
  // block already freed with cuMemFreeAsync is a double free, also during a
  // capture. The stream-ordered figures count the free once it happened.
  StreamOrderedCache* cache = valid && info->stream_ordered ? CacheFor(heap->device()) : nullptr;
  if (cache != nullptr && cache->Contains(ptr)) {
    return DriverError(CUDA_ERROR_INVALID_VALUE, "cuMemFree");
  }
  auto note_stream_ordered = [&] {
    if (cache != nullptr) cache->NoteFreed(info->context, SizeClassOf(*info), info->allocation_size);
  };
  if (captures_.any()) {
    // The driver refuses the call where the capture prohibits it (and the
    // pointer stays live); elsewhere the free succeeds, but the context
    // cannot be synchronized: the memory is held back (core/sync/capture.h).
    if (CUresult r = captures_.ProbeUnsafeCall(); r != CUDA_SUCCESS) {
      return DriverError(r, "cuMemFree");
    }
    absl::Status deferred = heap->DeferFree(ptr);
    if (deferred.ok()) note_stream_ordered();
    return deferred;
  }
  // Validated and its context found; synchronize without the heap lock so
  // other threads keep allocating on this device while the GPU drains.
  if (!valid) return DriverError(CUDA_ERROR_INVALID_VALUE, "cuMemFree");
  absl::Status synced = free_syncs_.Synchronize(info->context);
  const bool driver_gone = ToCuResult(synced) == CUDA_ERROR_DEINITIALIZED;
  if (!synced.ok() && !driver_gone) return synced;
  absl::Status freed = heap->Free(ptr, driver_gone);
  if (!freed.ok()) return freed;
  note_stream_ordered();
  if (driver_gone) return synced;
  CompleteDeferred(info->context);
  return absl::OkStatus();
}

absl::Status Allocator::FreeAsync(CUdeviceptr ptr, CUstream stream, bool per_thread) {
  DeviceHeap* heap = HeapOfPointer(ptr);
  if (heap == nullptr) return NotShimMemory();
  if (std::optional<PointerInfo> info = heap->Find(ptr); info && info->stream_ordered) {
    if (info->allocation_base != ptr) return DriverError(CUDA_ERROR_INVALID_VALUE, "cuMemFreeAsync");
    return FreeStreamOrdered(heap, *info, stream, per_thread);
  }
  GateReaderLock gate(&captures_.gate());
  if (captures_.any()) {
    if (captures_.IsCapturing(stream, per_thread).value_or(false)) {
      return DriverError(CUDA_ERROR_INVALID_VALUE, "cuMemFreeAsync");
    }
    return FreeGated(heap, ptr);  // probed, and deferred where allowed
  }
  auto sync = per_thread ? driver_.cuStreamSynchronize_ptsz : driver_.cuStreamSynchronize;
  if (sync != nullptr) {
    if (CUresult r = sync(stream); r != CUDA_SUCCESS) return DriverError(r, "cuStreamSynchronize");
  }
  return FreeGated(heap, ptr);
}

absl::StatusOr<PointerInfo> Allocator::Find(CUdeviceptr ptr) const {
  DeviceHeap* heap = HeapOfPointer(ptr);
  if (heap == nullptr) return NotShimMemory();
  std::optional<PointerInfo> info = heap->Find(ptr);
  if (!info) return DriverError(CUDA_ERROR_NOT_FOUND, "vmmshim lookup");
  return *info;
}

absl::StatusOr<ExportedAllocation> Allocator::Export(CUdeviceptr ptr) {
  DeviceHeap* heap = HeapOfPointer(ptr);
  if (heap == nullptr) return NotShimMemory();
  absl::StatusOr<std::pair<PointerInfo, ExportToken>> exported = heap->Export(ptr);
  if (!exported.ok()) return exported.status();
  const PointerInfo* info = &exported->first;
  ExportedAllocation out;
  out.token = exported->second;
  out.offset = info->allocation_base - info->range_base;
  out.size = info->allocation_size;
  out.handle_size = info->range_size;
  out.device = heap->device();
  return out;
}

absl::StatusOr<int> Allocator::ExportFd(const ExportToken& token, uint64_t offset,
                                        uint64_t size, uint64_t* handle_size) {
  std::optional<std::pair<int, CUdeviceptr>> where = exports_.Lookup(token);
  DeviceHeap* heap =
      where ? heaps_[where->first].load(std::memory_order_acquire) : nullptr;
  if (heap == nullptr) return DriverError(CUDA_ERROR_INVALID_VALUE, "cuIpcOpenMemHandle");
  return heap->ExportFd(token, where->second, offset, size, handle_size);
}

DeviceSet Allocator::AccessTargets(int device, size_t bytes) {
  const DeviceSet self = DeviceSet::Of(device);
  absl::StatusOr<int> count = DeviceCount();
  if (!count.ok() || !DeviceSet::IsOrdinal(device)) return self;
  return (options_.peer_policy.Allowed(device, *count, bytes, "") & peers_.Enabled(device)) |
         self;
}

size_t Allocator::ReleaseContext(CUcontext context, bool synchronize) {
  if (context == nullptr) return 0;
  ForgetContext(context);
  bool any = false;
  for (int d = 0; d < kMaxDevices && !any; ++d) {
    DeviceHeap* heap = heaps_[d].load(std::memory_order_acquire);
    // Also a context that only freed other contexts' stream-ordered memory
    // on its streams: those blocks must leave with its streams.
    any = heap != nullptr && (heap->Holds(context) || CacheFor(d)->Holds(context));
  }
  // No driver call for a context the shim never served (it may be invalid).
  if (!any) return 0;
  // Work still queued in the context may use the memory.
  if (synchronize) {
    if (absl::Status synced = SynchronizeContext(context); !synced.ok()) {
      Log().debug("synchronizing a released context: {}", synced.ToString());
    }
  }
  size_t released = 0;
  for (int d = 0; d < kMaxDevices; ++d) {
    DeviceHeap* heap = heaps_[d].load(std::memory_order_acquire);
    if (heap == nullptr) continue;
    // The stream-ordered cache forgets the context first: its blocks are
    // released below, blocks of other contexts freed on its streams are
    // freed now (their stream's work is over).
    ReleaseToHeap(heap, CacheFor(d)->DropContext(context));
    released += heap->ReleaseContext(context);
  }
  return released;
}

void Allocator::PrepareFork() {
  captures_.PrepareForkGate();
  peers_mu_.Lock();
  heaps_mu_.Lock();
  for (auto& slot : stream_caches_) {
    if (StreamOrderedCache* cache = slot.load(std::memory_order_acquire)) cache->PrepareFork();
  }
  for (auto& slot : heaps_) {
    if (DeviceHeap* heap = slot.load(std::memory_order_acquire)) heap->PrepareFork();
  }
  ranges_.PrepareFork();
  exports_.PrepareFork();
  captures_.PrepareForkState();
}

void Allocator::AfterForkParent() {
  captures_.AfterForkParentState();
  exports_.AfterForkParent();
  ranges_.AfterForkParent();
  for (auto it = heaps_.rbegin(); it != heaps_.rend(); ++it) {
    if (DeviceHeap* heap = it->load(std::memory_order_acquire)) heap->AfterForkParent();
  }
  for (auto it = stream_caches_.rbegin(); it != stream_caches_.rend(); ++it) {
    if (StreamOrderedCache* cache = it->load(std::memory_order_acquire)) cache->AfterForkParent();
  }
  heaps_mu_.Unlock();
  peers_mu_.Unlock();
  captures_.AfterForkParentGate();
}

void Allocator::AfterForkChild() {
  // Unlocking would try to wake the parent's threads that were queued on a
  // mutex (they do not exist here) and spin forever: the child, alone, gets
  // fresh, unlocked mutexes instead.
  captures_.AfterForkChild();
  free_syncs_.AfterForkChild();
  ResetThreadSlotsInForkChild();  // the parent's other threads do not exist here
  exports_.AfterForkChild();
  ranges_.AfterForkChild();
  for (auto& slot : heaps_) {
    if (DeviceHeap* heap = slot.load(std::memory_order_acquire)) heap->AfterForkChild();
  }
  for (auto& slot : stream_caches_) {
    if (StreamOrderedCache* cache = slot.load(std::memory_order_acquire)) cache->AfterForkChild();
  }
  new (&heaps_mu_) Mutex;
  new (&peers_mu_) Mutex;
}

absl::Status Allocator::EnablePeer(int peer_device, int owner_device) {
  if (!DeviceSet::IsOrdinal(peer_device) || !DeviceSet::IsOrdinal(owner_device)) {
    return DriverError(CUDA_ERROR_INVALID_DEVICE, "EnablePeer");
  }
  MutexLock lock(&peers_mu_);
  if (!peers_.Enable(peer_device, owner_device)) return absl::OkStatus();  // nested
  DeviceHeap* heap = heaps_[owner_device].load(std::memory_order_acquire);
  if (heap == nullptr) return absl::OkStatus();  // future allocations see the bit
  absl::Status applied = heap->ApplyPeerChange(peer_device);
  if (!applied.ok()) {
    // Undo: the peer is not enabled, and no run keeps a partial grant.
    peers_.Reset(peer_device, owner_device);
    heap->ApplyPeerChange(-1).IgnoreError();
  }
  return applied;
}

absl::Status Allocator::DisablePeer(int peer_device, int owner_device) {
  if (!DeviceSet::IsOrdinal(peer_device) || !DeviceSet::IsOrdinal(owner_device)) {
    return DriverError(CUDA_ERROR_INVALID_DEVICE, "DisablePeer");
  }
  MutexLock lock(&peers_mu_);
  absl::StatusOr<bool> last = peers_.Disable(peer_device, owner_device);
  if (!last.ok()) return last.status();
  DeviceHeap* heap = heaps_[owner_device].load(std::memory_order_acquire);
  if (!*last || heap == nullptr) return absl::OkStatus();
  return heap->ApplyPeerChange(-1);
}

absl::Status Allocator::SetExplicit(CUdeviceptr ptr, int peer, bool grant) {
  DeviceHeap* heap = HeapOfPointer(ptr);
  if (heap == nullptr) return NotShimMemory();
  absl::StatusOr<int> device_count = DeviceCount();
  if (!device_count.ok()) return device_count.status();
  if (peer < 0 || peer >= *device_count) {
    return DriverError(CUDA_ERROR_INVALID_DEVICE, "vmmshim peer access");
  }
  if (peer != heap->device()) {
    int can = 0;
    CUresult r = driver_.cuDeviceCanAccessPeer(&can, peer, heap->device());
    if (r != CUDA_SUCCESS) return DriverError(r, "cuDeviceCanAccessPeer");
    if (grant && can == 0) return DriverError(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "GrantPeer");
  }
  return heap->SetExplicit(ptr, peer, grant);
}

absl::Status Allocator::GrantPeer(CUdeviceptr ptr, int peer) { return SetExplicit(ptr, peer, true); }
absl::Status Allocator::RevokePeer(CUdeviceptr ptr, int peer) {
  return SetExplicit(ptr, peer, false);
}

absl::StatusOr<bool> Allocator::PeerHasAccess(CUdeviceptr ptr, int peer) const {
  DeviceHeap* heap = HeapOfPointer(ptr);
  if (heap == nullptr) return NotShimMemory();
  if (!DeviceSet::IsOrdinal(peer)) {
    return DriverError(CUDA_ERROR_INVALID_DEVICE, "vmmshim peer access");
  }
  return heap->PeerHasAccess(ptr, peer);
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
  if (global_.deferred.load(std::memory_order_acquire) == 0) return false;
  GateReaderLock gate(&captures_.gate());
  captures_.Refresh();
  if (captures_.any()) return false;  // their contexts cannot be synchronized yet
  std::vector<CUcontext> contexts;
  for (auto& slot : heaps_) {
    DeviceHeap* heap = slot.load(std::memory_order_acquire);
    if (heap == nullptr) continue;
    for (CUcontext c : heap->DeferredContexts()) {
      if (std::find(contexts.begin(), contexts.end(), c) == contexts.end()) contexts.push_back(c);
    }
  }
  bool any = false;
  for (CUcontext c : contexts) {
    if (SynchronizeContext(c).ok()) {
      CompleteDeferred(c);
      any = true;
    }
  }
  return any;
}

size_t Allocator::Trim(int device) {
  ReclaimDeferred();
  ReclaimStreamOrdered(device);
  size_t released = 0;
  for (int d = 0; d < kMaxDevices; ++d) {
    if (device >= 0 && d != device) continue;
    if (DeviceHeap* heap = heaps_[d].load(std::memory_order_acquire)) released += heap->Trim();
  }
  return released;
}

std::vector<DeviceStats> Allocator::GetDeviceStats() const {
  std::vector<DeviceStats> out;
  for (int d = 0; d < kMaxDevices; ++d) {
    DeviceHeap* heap = heaps_[d].load(std::memory_order_acquire);
    if (heap == nullptr) continue;
    out.push_back(heap->stats());
    out.back().stream_ordered = CacheFor(d)->figures();
  }
  return out;
}

size_t Allocator::IdleBytes(int device) const {
  if (!DeviceSet::IsOrdinal(device)) return 0;
  DeviceHeap* heap = heaps_[device].load(std::memory_order_acquire);
  return heap == nullptr ? 0 : heap->cached_bytes();
}

void Allocator::NotePassThrough(size_t bytes) {
  passthrough_allocations_.fetch_add(1, std::memory_order_relaxed);
  passthrough_bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

int Allocator::CopyThreads() const {
  if (options_.copy_threads > 0) return options_.copy_threads;
  cpu_set_t set;
  const int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return std::clamp(cpus, 1, 8);
}

absl::StatusOr<size_t> Allocator::PauseMemory(const std::optional<std::string>& tag,
                                               bool keep_contents) {
  // No capture begins meanwhile; during one, the synchronize and the copies
  // would invalidate it (core/sync/capture.h): refused, the capture untouched.
  GateReaderLock gate(&captures_.gate());
  if (captures_.any()) {
    return DriverError(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "vmmshim_pause_memory");
  }
  MutexLock lock(&pause_mu_);
  std::vector<CUcontext> contexts;
  size_t live = 0;
  std::vector<DeviceHeap*> heaps;
  for (auto& slot : heaps_) {
    if (DeviceHeap* heap = slot.load(std::memory_order_acquire)) {
      if (absl::Status s = heap->CheckPausable(tag); !s.ok()) return s;
      live += heap->PauseCandidates(tag, &contexts);
      heaps.push_back(heap);
    }
  }
  if (keep_contents && live > AvailableHostMemory()) {
    Log().error("vmmshim_pause_memory: host memory for the contents: {} bytes needed, {} "
                "available (MemAvailable); nothing paused",
                live, AvailableHostMemory());
    return DriverError(CUDA_ERROR_OUT_OF_MEMORY, "vmmshim_pause_memory (host memory)");
  }
  // The program's work on the memory must be done before it goes.
  for (CUcontext ctx : contexts) {
    if (absl::Status s = SynchronizeContext(ctx); !s.ok()) return s;
  }
  std::optional<BackupCopier> copier;
  if (keep_contents) copier.emplace(driver_, CopyThreads());
  // All or nothing: every heap copies and marks first; only then is memory
  // released anywhere.
  for (DeviceHeap* heap : heaps) {
    absl::StatusOr<size_t> r = heap->PausePrepare(tag, copier ? &*copier : nullptr);
    if (!r.ok()) {
      for (DeviceHeap* h : heaps) h->PauseAbort(tag);
      return r.status();
    }
  }
  return SumOverAll(heaps, [&](DeviceHeap* heap) { return heap->PauseCommit(tag); });
}

absl::StatusOr<size_t> Allocator::ResumeMemory(const std::optional<std::string>& tag) {
  GateReaderLock gate(&captures_.gate());
  if (captures_.any()) {
    return DriverError(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "vmmshim_resume_memory");
  }
  MutexLock lock(&pause_mu_);
  BackupCopier copier(driver_, CopyThreads());
  std::vector<DeviceHeap*> heaps;
  for (auto& slot : heaps_) {
    if (DeviceHeap* heap = slot.load(std::memory_order_acquire)) heaps.push_back(heap);
  }
  absl::Status status;
  for (int attempt = 0; attempt < 2; ++attempt) {
    size_t restored = 0;
    status = absl::OkStatus();
    for (DeviceHeap* heap : heaps) {
      absl::StatusOr<size_t> r = heap->ResumePrepare(tag, copier);
      if (!r.ok()) {
        status = r.status();
        break;
      }
      restored += *r;
    }
    if (status.ok()) {
      for (DeviceHeap* heap : heaps) heap->ResumeCommit(tag);
      return restored;
    }
    // All or nothing: what other devices prepared goes again.
    for (DeviceHeap* h : heaps) h->ResumeAbort(tag);
    if (ToCuResult(status) != CUDA_ERROR_OUT_OF_MEMORY) break;
    // Out of memory: every cache the shim holds (all arenas, deferred frees,
    // the stream-ordered cache) goes back to the driver, then once more.
    Trim(-1);
  }
  return status;
}

void Allocator::NotePeerEnable(uint64_t nanoseconds) {
  peer_enable_calls_.fetch_add(1, std::memory_order_relaxed);
  peer_enable_ns_.fetch_add(nanoseconds, std::memory_order_relaxed);
}

AllocatorStats Allocator::GetStats() const {
  AllocatorStats s;
  for (const DeviceStats& d : GetDeviceStats()) {
    s.served_allocations += d.allocations;
    s.served_bytes += d.bytes;
    s.frees += d.frees;
    s.live_allocations += d.live_allocations;
    s.live_bytes += d.live_bytes;
    s.handles += d.handles;
    s.handle_bytes += d.handle_bytes;
    s.deferred_frees += d.deferred_frees;
    s.stream_ordered_allocations += d.stream_ordered.allocations;
    s.stream_ordered_reuses += d.stream_ordered.reuses;
    s.stream_ordered_cached_bytes += d.stream_ordered.cached;
  }
  s.free_synchronizes = free_syncs_.synchronizes();
  s.free_synchronizes_shared = free_syncs_.shared();
  s.passthrough_allocations = passthrough_allocations_.load();
  s.passthrough_bytes = passthrough_bytes_.load();
  s.peak_handle_bytes = global_.peak.load();
  s.peer_enable_calls = peer_enable_calls_.load(std::memory_order_relaxed);
  s.peer_enable_seconds = peer_enable_ns_.load(std::memory_order_relaxed) * 1e-9;
  s.paused_bytes = global_.paused.load(std::memory_order_relaxed);
  s.peak_paused_bytes = global_.paused_peak.load(std::memory_order_relaxed);
  return s;
}

absl::Status Allocator::ReleaseAll() {
  absl::Status first;
  for (auto& slot : heaps_) {
    if (DeviceHeap* heap = slot.load(std::memory_order_acquire)) first.Update(heap->ReleaseAll());
  }
  return first;
}

}  // namespace vmmshim
