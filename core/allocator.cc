#include "core/allocator.h"

#include <sys/random.h>

#include <iterator>
#include <limits>
#include <new>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/strings/str_cat.h"
#include "core/cu_status.h"
#include "core/log.h"
#include "core/slab.h"
#include "core/va_arena.h"

namespace vmmshim {
namespace {

constexpr size_t RoundUp(size_t value, size_t to) { return (value + to - 1) / to * to; }

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


CUmemAllocationProp DeviceProp(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

}  // namespace

std::vector<CUmemAccessDesc> ReadWriteAccess(uint64_t devices) {
  std::vector<CUmemAccessDesc> access;
  for (int d = 0; d < 64; ++d) {
    if ((devices >> d & 1) == 0) continue;
    CUmemAccessDesc desc = {};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = d;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    access.push_back(desc);
  }
  return access;
}

Allocator::Allocator(const DriverApi& driver, AllocatorOptions options)
    : driver_(driver), options_(options) {
  // Another allocator (tests) may see the same context handles on other
  // devices.
  g_context_epoch.fetch_add(1, std::memory_order_acq_rel);
}

void Allocator::ForgetContext(CUcontext /*context*/) {
  g_context_epoch.fetch_add(1, std::memory_order_acq_rel);
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

Allocator::~Allocator() {
  absl::Status status = ReleaseAll();
  if (!status.ok()) Log().warn("releasing at teardown: {}", status.ToString());
  for (auto& slot : heaps_) delete slot.load();
}

absl::StatusOr<Allocator::DeviceHeap*> Allocator::HeapFor(int device) {
  if (device < 0 || device >= kMaxDevices) {
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
  CUmemAllocationProp prop = DeviceProp(device);
  if (options_.exportable) {
    int fd_handles = 0;
    r = driver_.cuDeviceGetAttribute(
        &fd_handles, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device);
    if (r == CUDA_SUCCESS && fd_handles != 0) {
      prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    } else {
      Log().info("device {} has no POSIX file-descriptor handles: its memory cannot be shared "
                 "through cuIpcGetMemHandle",
                 device);
    }
  }
  CompressionState compression = CompressionState::kOff;
  if (options_.compression) {
    int supported = 0;
    r = driver_.cuDeviceGetAttribute(&supported,
                                     CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, device);
    if (r == CUDA_SUCCESS && supported != 0) {
      prop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_GENERIC;
    } else {
      compression = CompressionState::kUnsupported;
      Log().warn("device {} does not support generic compression "
                 "(CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED = 0); its memory is "
                 "not compressible",
                 device);
    }
  }
  size_t granularity = 0;
  r = driver_.cuMemGetAllocationGranularity(&granularity, &prop,
                                            CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuMemGetAllocationGranularity");
  size_t total = 0;
  r = driver_.cuDeviceTotalMem_v2(&total, device);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuDeviceTotalMem");
  size_t reservation = options_.reservation_bytes != 0 ? options_.reservation_bytes : 2 * total;
  reservation = RoundUp(std::max(reservation, granularity), granularity);
  auto* heap = new DeviceHeap(device, granularity, reservation);
  {
    MutexLock lock(&heap->mu);  // not yet shared; for the analysis
    heap->prop = prop;
    heap->stats.compression = compression;
  }
  heap->cache_limit = options_.cache_limit_percent >= 0
                          ? static_cast<size_t>(total * (options_.cache_limit_percent / 100.0))
                          : options_.cache_limit_bytes;
  Log().debug("device {}: granularity {} bytes, VA reservations of {} bytes", device,
              granularity, reservation);
  heaps_[device].store(heap, std::memory_order_release);
  return heap;
}

Allocator::DeviceHeap* Allocator::HeapOfPointer(CUdeviceptr ptr) const {
  ReaderMutexLock lock(&ranges_mu_);
  auto it = ranges_.upper_bound(ptr);
  if (it == ranges_.begin()) return nullptr;
  --it;
  if (ptr >= it->first + it->second.first) return nullptr;
  return heaps_[it->second.second].load(std::memory_order_acquire);
}

bool Allocator::Owns(CUdeviceptr ptr) const { return HeapOfPointer(ptr) != nullptr; }

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
  absl::StatusOr<DeviceHeap*> heap_or = HeapFor(device);
  if (!heap_or.ok()) return heap_or.status();
  DeviceHeap* heap = *heap_or;
  if (heap == nullptr) return Allocation{};

  if (bytes > std::numeric_limits<size_t>::max() - heap->granularity) {
    return DriverError(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc");
  }
  const size_t threshold =
      options_.packing_threshold != 0 ? options_.packing_threshold : heap->granularity / 2;
  absl::StatusOr<int> device_count = DeviceCount();
  if (!device_count.ok()) return device_count.status();
  const Placement placement{
      context, options_.peer_policy.AllowedMask(device, *device_count, bytes, tag),
      std::string(tag)};
  absl::StatusOr<CUdeviceptr> ptr;
  {
    MutexLock lock(&heap->mu);
    ptr = bytes <= threshold ? AllocatePacked(*heap, placement, bytes)
                             : AllocateLarge(*heap, placement, bytes);
    if (ptr.ok()) {
      DeviceStats& st = heap->stats;
      ++st.allocations;
      st.bytes += bytes;
      st.live_bytes += bytes;
      st.peak_live_bytes = std::max(st.peak_live_bytes, st.live_bytes);
      NotePeerDecisions(*heap, placement.allowed, EnabledPeers(device), 1, bytes, tag);
    }
  }
  if (!ptr.ok()) return ptr.status();
  served_allocations_.fetch_add(1, std::memory_order_relaxed);
  served_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  live_allocations_.fetch_add(1, std::memory_order_relaxed);
  live_bytes_.fetch_add(bytes, std::memory_order_relaxed);
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

absl::StatusOr<CUdeviceptr> Allocator::AllocateLarge(DeviceHeap& heap,
                                                     const Placement& placement, size_t bytes) {
  const size_t rounded = RoundUp(bytes, heap.granularity);
  // The cache first: the smallest cached block of this access set that fits
  // and wastes at most a quarter of the request. No driver call.
  for (auto it = heap.cached_large.lower_bound({rounded, 0});
       it != heap.cached_large.end() && it->first <= rounded + rounded / 4; ++it) {
    Block& b = *heap.blocks[it->second];
    if (b.context != placement.context || b.allowed != placement.allowed ||
        b.tag != placement.tag) {
      continue;
    }
    const CUdeviceptr base = it->second;
    heap.cached_bytes -= b.size;
    heap.cached_large.erase(it);
    b.cached = false;
    b.requested = bytes;
    ++heap.stats.cache_hits;
    return base;
  }
  ++heap.stats.cache_misses;
  absl::StatusOr<CUdeviceptr> base = CreateBlock(heap, placement, rounded, /*packed=*/false);
  if (base.ok()) heap.blocks[*base]->requested = bytes;
  return base;
}

absl::StatusOr<CUdeviceptr> Allocator::AllocatePacked(DeviceHeap& heap,
                                                      const Placement& placement, size_t bytes) {
  // Only granules of the same context, allowed set and tag: access rights
  // belong to the whole granule.
  for (CUdeviceptr base : heap.open_granules) {
    Block& block = *heap.blocks[base];
    if (block.context != placement.context || block.allowed != placement.allowed ||
        block.tag != placement.tag || block.sealed) {
      continue;
    }
    const bool was_empty = block.slab->empty();
    if (std::optional<size_t> offset = block.slab->Allocate(bytes)) {
      if (was_empty && heap.empty_granules.erase(base) > 0) heap.cached_bytes -= block.size;
      // A full granule leaves the search until a free in it (Free re-adds).
      if (block.slab->used_bytes() == block.size) heap.open_granules.erase(base);
      return base + *offset;
    }
  }
  absl::StatusOr<CUdeviceptr> base = CreateBlock(heap, placement, heap.granularity, true);
  if (!base.ok()) return base.status();
  Block& block = *heap.blocks[*base];
  const size_t offset = *block.slab->Allocate(bytes);  // a fresh granule always fits
  if (block.slab->used_bytes() < block.size) heap.open_granules.insert(*base);
  return *base + offset;
}

absl::Status Allocator::ReserveMore(DeviceHeap& heap, size_t at_least) {
  const size_t size = std::max(heap.reservation_bytes, RoundUp(at_least, heap.granularity));
  CUdeviceptr base = 0;
  CUresult r = driver_.cuMemAddressReserve(&base, size, heap.granularity, 0, 0);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuMemAddressReserve");
  heap.arena.AddReservation(base, size);
  MutexLock lock(&ranges_mu_);
  ranges_[base] = {size, heap.device};
  return absl::OkStatus();
}

absl::StatusOr<CUdeviceptr> Allocator::CreateBlock(DeviceHeap& heap,
                                                   const Placement& placement, size_t size,
                                                   bool packed) {
  // The driver calls (tens of microseconds each) run without the heap lock,
  // so cache hits and frees on this device go on meanwhile. The new block
  // joins the heap only when it is fully mapped.
  //
  // Physical memory first: it is what runs out, and a request the device
  // cannot hold must not leave a (possibly huge) VA reservation behind.
  CUmemAllocationProp prop = heap.prop;
  CUmemGenericAllocationHandle handle = 0;
  heap.mu.Unlock();
  CUresult r = driver_.cuMemCreate(&handle, size, &prop, 0);
  heap.mu.Lock();
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY &&
      prop.allocFlags.compressionType != CU_MEM_ALLOCATION_COMP_NONE) {
    // The driver refused compressible memory (with this handle type, say):
    // go on without compression.
    Log().warn("device {}: compressible cuMemCreate failed ({}); falling back to "
               "uncompressed memory",
               heap.device, CuResultName(r));
    heap.prop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_NONE;
    heap.stats.compression = CompressionState::kNotGranted;
    heap.compression_checked = true;
    prop = heap.prop;
    r = driver_.cuMemCreate(&handle, size, &prop, 0);
  }
  if (r == CUDA_ERROR_OUT_OF_MEMORY && heap.cached_bytes > 0) {
    // Cached memory is free memory to the application: give it back first
    // (rare, so under the lock).
    TrimLocked(heap);
    r = driver_.cuMemCreate(&handle, size, &prop, 0);
  }
  if (r != CUDA_SUCCESS) return DriverError(r, "cuMemCreate");
  if (prop.allocFlags.compressionType != CU_MEM_ALLOCATION_COMP_NONE &&
      !heap.compression_checked) {
    CheckCompressionLocked(heap, handle);
  }
  std::optional<CUdeviceptr> va = heap.arena.Allocate(size);
  if (!va) {
    if (absl::Status s = ReserveMore(heap, size); !s.ok()) {
      driver_.cuMemRelease(handle);
      return s;
    }
    va = heap.arena.Allocate(size);
  }
  // The owner and every peer the placement allows now, in one call.
  const uint64_t self = uint64_t{1} << heap.device;
  const uint64_t target = (placement.allowed & EnabledPeers(heap.device)) | self;
  const std::vector<CUmemAccessDesc> access = ReadWriteAccess(target);
  heap.mu.Unlock();
  const char* failed = "cuMemMap";
  r = driver_.cuMemMap(*va, size, 0, handle, 0);
  const bool mapped = r == CUDA_SUCCESS;
  if (mapped) {
    failed = "cuMemSetAccess";
    r = driver_.cuMemSetAccess(*va, size, access.data(), access.size());
    if (r != CUDA_SUCCESS) driver_.cuMemUnmap(*va, size);
  }
  if (r != CUDA_SUCCESS) driver_.cuMemRelease(handle);
  heap.mu.Lock();
  if (mapped) ++heap.stats.set_access_calls;
  if (r != CUDA_SUCCESS) {
    heap.arena.Free(*va, size);
    return DriverError(r, failed);
  }
  auto owned = std::make_unique<Block>();
  Block& block = *owned;
  heap.blocks[*va] = std::move(owned);
  block.size = size;
  block.handle = handle;
  block.context = placement.context;
  block.allowed = placement.allowed;
  block.tag = placement.tag;
  block.access = target;
  block.exportable = prop.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  if (packed) block.slab = std::make_unique<Slab>(size);
  for (int d = 0; d < kMaxDevices; ++d) {
    if ((target & ~self) >> d & 1) {
      PeerCounters& c = heap.stats.peers[d];
      c.mapped_bytes += size;
      c.peak_mapped_bytes = std::max(c.peak_mapped_bytes, c.mapped_bytes);
    }
  }
  heap.stats.handle_bytes += size;
  heap.stats.peak_handle_bytes = std::max(heap.stats.peak_handle_bytes, heap.stats.handle_bytes);
  handles_.fetch_add(1, std::memory_order_relaxed);
  AddHandleBytes(static_cast<int64_t>(size));
  // A peer enabled or disabled while the lock was released did not see this
  // block: bring it to the current target now.
  if (((placement.allowed & EnabledPeers(heap.device)) | self) != target) {
    if (absl::Status applied = ApplyAccess(heap); !applied.ok()) {
      DestroyBlock(heap, *va).IgnoreError();
      return applied;
    }
  }
  return *va;
}

absl::Status Allocator::DestroyBlock(DeviceHeap& heap, CUdeviceptr base) {
  auto it = heap.blocks.find(base);
  const size_t size = it->second->size;
  CUresult r = driver_.cuMemUnmap(base, size);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuMemUnmap");
  // The mapping is gone; whatever cuMemRelease says, the VA is free again.
  r = driver_.cuMemRelease(it->second->handle);
  // A handle the driver would not release is kept and retried by Trim and
  // ReleaseAll, so it is not lost.
  if (r != CUDA_SUCCESS) heap.orphan_handles.push_back(it->second->handle);
  const uint64_t peers = it->second->access & ~(uint64_t{1} << heap.device);
  for (int d = 0; d < kMaxDevices; ++d) {
    if (peers >> d & 1) heap.stats.peers[d].mapped_bytes -= size;
  }
  heap.stats.handle_bytes -= size;
  heap.arena.Free(base, size);
  heap.open_granules.erase(base);
  if (heap.empty_granules.erase(base) > 0) heap.cached_bytes -= size;
  if (it->second->cached) {
    heap.cached_large.erase({size, base});
    heap.cached_bytes -= size;
  }
  heap.blocks.erase(it);
  handles_.fetch_sub(1, std::memory_order_relaxed);
  AddHandleBytes(-static_cast<int64_t>(size));
  return DriverError(r, "cuMemRelease");
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

absl::StatusOr<bool> Allocator::Free(CUdeviceptr ptr) {
  DeviceHeap* heap = HeapOfPointer(ptr);
  if (heap == nullptr) return false;
  const absl::Status invalid = DriverError(CUDA_ERROR_INVALID_VALUE, "cuMemFree");

  // Validate and find the context, then synchronize without the heap lock so
  // other threads keep allocating on this device while the GPU drains.
  CUcontext context = nullptr;
  {
    MutexLock lock(&heap->mu);
    std::optional<PointerInfo> info = FindLocked(*heap, ptr);
    if (!info || info->allocation_base != ptr) return invalid;
    context = info->context;
  }
  absl::Status synced = SynchronizeContext(context);
  const bool driver_gone = ToCuResult(synced) == CUDA_ERROR_DEINITIALIZED;
  if (!synced.ok() && !driver_gone) return synced;

  MutexLock lock(&heap->mu);
  std::optional<PointerInfo> info = FindLocked(*heap, ptr);
  if (!info || info->allocation_base != ptr) return invalid;  // another thread freed it
  const CUdeviceptr base = info->range_base;
  Block& block = *heap->blocks[base];
  absl::Status status;
  if (block.exported) DropExportLocked(*heap, ptr);
  if (!info->packed) {
    if (driver_gone) {
      // The driver has freed everything already; only forget the block.
      heap->blocks.erase(base);
      handles_.fetch_sub(1, std::memory_order_relaxed);
      AddHandleBytes(-static_cast<int64_t>(info->range_size));
    } else if (!block.has_explicit() && !block.exported &&
               heap->cached_bytes + block.size <= heap->cache_limit) {
      // Keep it mapped, with its access set, for the next request that fits.
      block.cached = true;
      block.requested = 0;
      heap->cached_large.insert({block.size, base});
      heap->cached_bytes += block.size;
    } else {
      status = DestroyBlock(*heap, base);
      if (!status.ok() && heap->blocks.contains(base)) return status;  // still mapped
    }
  } else {
    block.slab->Free(ptr - base);
    heap->open_granules.insert(base);
    if (block.slab->empty() && !driver_gone) {
      if (!block.sealed && !block.has_explicit() &&
          heap->cached_bytes + block.size <= heap->cache_limit) {
        heap->empty_granules.insert(base);
        heap->cached_bytes += block.size;
      } else if (absl::Status released = DestroyBlock(*heap, base); !released.ok()) {
        // The application's free succeeded; an empty granule that could not
        // be released stays mapped and serves later requests.
        Log().warn("keeping an empty granule on device {}: {}", heap->device,
                   released.ToString());
      }
    }
  }
  heap->stats.live_bytes -= info->allocation_size;
  frees_.fetch_add(1, std::memory_order_relaxed);
  live_allocations_.fetch_sub(1, std::memory_order_relaxed);
  live_bytes_.fetch_sub(info->allocation_size, std::memory_order_relaxed);
  if (driver_gone) return synced;
  if (!status.ok()) return status;
  return true;
}

std::optional<PointerInfo> Allocator::FindLocked(const DeviceHeap& heap, CUdeviceptr ptr) const {
  const auto [base, block] = heap.BlockAt(ptr);
  if (block == nullptr || block->cached) return std::nullopt;
  PointerInfo info;
  info.range_base = base;
  info.range_size = block->size;
  info.device = heap.device;
  info.context = block->context;
  if (block->slab == nullptr) {
    if (ptr >= base + block->requested) return std::nullopt;
    info.allocation_base = base;
    info.allocation_size = block->requested;
  } else {
    std::optional<std::pair<size_t, size_t>> found = block->slab->Find(ptr - base);
    if (!found) return std::nullopt;
    info.allocation_base = base + found->first;
    info.allocation_size = found->second;
    info.packed = true;
  }
  return info;
}

std::optional<PointerInfo> Allocator::Find(CUdeviceptr ptr) const {
  DeviceHeap* heap = HeapOfPointer(ptr);
  if (heap == nullptr) return std::nullopt;
  MutexLock lock(&heap->mu);
  return FindLocked(*heap, ptr);
}

void Allocator::NotePeerDecisions(DeviceHeap& heap, uint64_t allowed, uint64_t enabled,
                                  uint64_t allocations, size_t bytes, absl::string_view tag) {
  for (int p = 0; p < kMaxDevices; ++p) {
    if ((enabled >> p & 1) == 0 || p == heap.device) continue;
    PeerCounters& c = heap.stats.peers[p];
    if (allowed >> p & 1) {
      c.grants += allocations;
      continue;
    }
    c.denials += allocations;
    // Rate-limited: a missing grant can hang NVLink collectives instead of
    // faulting, so the first denial of each pair is a warning.
    int& logged = heap.denials_logged[p];
    if (logged < 101) {  // one warning, then up to 100 info lines
      const std::string reason =
          options_.peer_policy.DenialReason(heap.device, p, bytes, tag);
      if (logged++ == 0) {
        Log().warn("peer {} denied access to {} allocation(s) ({} bytes) on device {} ({}); "
                   "further denials for this pair are logged at info level, up to 100",
                   p, allocations, bytes, heap.device, reason);
      } else {
        Log().info("peer {} denied access to {} allocation(s) ({} bytes) on device {} ({})",
                   p, allocations, bytes, heap.device, reason);
      }
    }
  }
}

absl::Status Allocator::ApplyAccess(DeviceHeap& heap) {
  const uint64_t enabled = EnabledPeers(heap.device);
  absl::Status first;
  // A run: adjacent blocks in one reservation that change the same way.
  struct Run {
    CUdeviceptr base = 0;
    size_t size = 0;
    uint64_t add = 0, remove = 0;
    std::vector<Block*> blocks;
  } run;
  auto flush = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(heap.mu) {
    if (run.blocks.empty()) return;
    std::vector<CUmemAccessDesc> descs;
    for (int d = 0; d < kMaxDevices; ++d) {
      if (((run.add | run.remove) >> d & 1) == 0) continue;
      CUmemAccessDesc desc = {};
      desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      desc.location.id = d;
      desc.flags = (run.add >> d & 1) ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                                      : CU_MEM_ACCESS_FLAGS_PROT_NONE;
      descs.push_back(desc);
    }
    CUresult r = driver_.cuMemSetAccess(run.base, run.size, descs.data(), descs.size());
    ++heap.stats.set_access_calls;
    if (r == CUDA_SUCCESS) {
      for (Block* b : run.blocks) {
        b->access = (b->access | run.add) & ~run.remove;
        for (int d = 0; d < kMaxDevices; ++d) {
          if (run.add >> d & 1) {
            PeerCounters& c = heap.stats.peers[d];
            c.mapped_bytes += b->size;
            c.peak_mapped_bytes = std::max(c.peak_mapped_bytes, c.mapped_bytes);
          }
          if (run.remove >> d & 1) heap.stats.peers[d].mapped_bytes -= b->size;
        }
      }
    } else {
      first.Update(DriverError(r, "cuMemSetAccess"));
    }
    run = Run{};
  };
  for (auto& [base, owned] : heap.blocks) {
    Block& b = *owned;
    const uint64_t target = b.Target(heap.device, enabled);
    const uint64_t add = target & ~b.access, remove = b.access & ~target;
    const bool contiguous = !run.blocks.empty() && run.base + run.size == base &&
                            heap.arena.ReservationBase(run.base) == heap.arena.ReservationBase(base);
    if (add == 0 && remove == 0) {
      flush();
      continue;
    }
    if (!contiguous || add != run.add || remove != run.remove) flush();
    if (run.blocks.empty()) {
      run.base = base;
      run.add = add;
      run.remove = remove;
    }
    run.size += b.size;
    run.blocks.push_back(&b);
  }
  flush();
  return first;
}

absl::Status Allocator::EnablePeer(int peer_device, int owner_device) {
  if (peer_device < 0 || peer_device >= kMaxDevices || owner_device < 0 ||
      owner_device >= kMaxDevices) {
    return DriverError(CUDA_ERROR_INVALID_DEVICE, "EnablePeer");
  }
  MutexLock peers_lock(&peers_mu_);
  if (enable_counts_[owner_device][peer_device]++ > 0) return absl::OkStatus();
  const uint64_t bit = uint64_t{1} << peer_device;
  enabled_mask_[owner_device].fetch_or(bit, std::memory_order_acq_rel);
  DeviceHeap* heap = heaps_[owner_device].load(std::memory_order_acquire);
  if (heap == nullptr) return absl::OkStatus();  // future allocations see the bit
  MutexLock lock(&heap->mu);
  uint64_t granted = 0, denied = 0, granted_bytes = 0;
  for (const auto& [base, b] : heap->blocks) {
    NotePeerDecisions(*heap, b->allowed, bit, b->allocations(),
                      b->slab != nullptr ? b->slab->used_bytes() : b->requested, b->tag);
    if (b->allowed & bit) {
      granted += b->allocations();
      granted_bytes += b->size;
    } else {
      denied += b->allocations();
    }
  }
  absl::Status applied = ApplyAccess(*heap);
  if (!applied.ok()) {
    // Undo: the peer is not enabled, and no run keeps a partial grant.
    enable_counts_[owner_device][peer_device] = 0;
    enabled_mask_[owner_device].fetch_and(~bit, std::memory_order_acq_rel);
    ApplyAccess(*heap).IgnoreError();
    return applied;
  }
  Log().info("peer {} enabled access to device {}: {} allocation(s) granted ({} bytes mapped), "
             "{} denied by policy {}",
             peer_device, owner_device, granted, granted_bytes, denied,
             options_.peer_policy.Describe());
  return absl::OkStatus();
}

absl::Status Allocator::DisablePeer(int peer_device, int owner_device) {
  if (peer_device < 0 || peer_device >= kMaxDevices || owner_device < 0 ||
      owner_device >= kMaxDevices) {
    return DriverError(CUDA_ERROR_INVALID_DEVICE, "DisablePeer");
  }
  MutexLock peers_lock(&peers_mu_);
  int& count = enable_counts_[owner_device][peer_device];
  if (count == 0) return DriverError(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "DisablePeer");
  if (--count > 0) return absl::OkStatus();
  enabled_mask_[owner_device].fetch_and(~(uint64_t{1} << peer_device),
                                        std::memory_order_acq_rel);
  DeviceHeap* heap = heaps_[owner_device].load(std::memory_order_acquire);
  if (heap == nullptr) return absl::OkStatus();
  MutexLock lock(&heap->mu);
  return ApplyAccess(*heap);
}

absl::Status Allocator::SetExplicit(CUdeviceptr ptr, int peer, bool grant) {
  DeviceHeap* heap = HeapOfPointer(ptr);
  if (heap == nullptr) return DriverError(CUDA_ERROR_INVALID_VALUE, "vmmshim peer access");
  absl::StatusOr<int> device_count = DeviceCount();
  if (!device_count.ok()) return device_count.status();
  if (peer < 0 || peer >= *device_count) {
    return DriverError(CUDA_ERROR_INVALID_DEVICE, "vmmshim peer access");
  }
  if (peer == heap->device) {
    return Find(ptr) ? absl::OkStatus()
                     : DriverError(CUDA_ERROR_INVALID_VALUE, "vmmshim peer access");
  }
  int can = 0;
  CUresult r = driver_.cuDeviceCanAccessPeer(&can, peer, heap->device);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuDeviceCanAccessPeer");
  if (grant && can == 0) return DriverError(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "GrantPeer");
  MutexLock lock(&heap->mu);
  std::optional<PointerInfo> info = FindLocked(*heap, ptr);
  if (!info) return DriverError(CUDA_ERROR_INVALID_VALUE, "vmmshim peer access");
  Block& block = *heap->blocks[info->range_base];
  const uint64_t bit = uint64_t{1} << peer;
  if (info->packed && block.tag.empty() && block.allocations() > 1) {
    // The documented rule: explicit access acts on the whole granule, so an
    // untagged granule must hold only this allocation.
    Log().warn("refused to {} peer {} access to the {}-byte allocation at {:#x} on device {}: "
               "its granule holds {} other untagged allocation(s); tag allocations meant for "
               "explicit grants (vmmshim_set_allocation_tag)",
               grant ? "grant" : "revoke", peer, info->allocation_size, ptr, heap->device,
               block.allocations() - 1);
    return DriverError(CUDA_ERROR_NOT_PERMITTED, "vmmshim peer access");
  }
  if (grant) {
    if ((block.access & bit) == 0) heap->stats.peers[peer].grants += block.allocations();
    block.explicit_grant |= bit;
    block.explicit_revoke &= ~bit;
  } else {
    block.explicit_revoke |= bit;
    block.explicit_grant &= ~bit;
  }
  // An untagged granule with explicit state takes no new allocations, which
  // would inherit it.
  if (info->packed && block.tag.empty()) {
    block.sealed = true;
    heap->open_granules.erase(info->range_base);
    if (heap->empty_granules.erase(info->range_base) > 0) heap->cached_bytes -= block.size;
  }
  return ApplyAccess(*heap);
}

absl::Status Allocator::GrantPeer(CUdeviceptr ptr, int peer) { return SetExplicit(ptr, peer, true); }
absl::Status Allocator::RevokePeer(CUdeviceptr ptr, int peer) {
  return SetExplicit(ptr, peer, false);
}

absl::StatusOr<bool> Allocator::PeerHasAccess(CUdeviceptr ptr, int peer) const {
  DeviceHeap* heap = HeapOfPointer(ptr);
  if (heap == nullptr) return DriverError(CUDA_ERROR_INVALID_VALUE, "vmmshim peer access");
  if (peer < 0 || peer >= kMaxDevices) {
    return DriverError(CUDA_ERROR_INVALID_DEVICE, "vmmshim peer access");
  }
  MutexLock lock(&heap->mu);
  std::optional<PointerInfo> info = FindLocked(*heap, ptr);
  if (!info) return DriverError(CUDA_ERROR_INVALID_VALUE, "vmmshim peer access");
  return (heap->blocks.at(info->range_base)->access >> peer & 1) != 0;
}

void Allocator::CheckCompressionLocked(DeviceHeap& heap, CUmemGenericAllocationHandle handle) {
  heap.compression_checked = true;
  CUmemAllocationProp got = {};
  CUresult r = driver_.cuMemGetAllocationPropertiesFromHandle != nullptr
                   ? driver_.cuMemGetAllocationPropertiesFromHandle(&got, handle)
                   : CUDA_ERROR_NOT_SUPPORTED;
  if (r == CUDA_SUCCESS && got.allocFlags.compressionType == CU_MEM_ALLOCATION_COMP_GENERIC) {
    heap.stats.compression = CompressionState::kGranted;
    Log().info("device {}: generic compression granted (cuMemGetAllocationPropertiesFromHandle)",
               heap.device);
    return;
  }
  heap.stats.compression = CompressionState::kNotGranted;
  heap.prop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_NONE;
  Log().warn("device {}: compression requested but not granted ({}); later memory is made "
             "without it",
             heap.device,
             r == CUDA_SUCCESS ? "the handle reports no compression" : CuResultName(r));
}

void Allocator::DropExportLocked(DeviceHeap& heap, CUdeviceptr base) {
  auto it = heap.exports.find(base);
  if (it == heap.exports.end()) return;
  {
    MutexLock lock(&exports_mu_);
    exports_.erase(std::string(it->second.begin(), it->second.end()));
  }
  heap.exports.erase(it);
}

absl::StatusOr<ExportedAllocation> Allocator::Export(CUdeviceptr ptr) {
  const absl::Status invalid = DriverError(CUDA_ERROR_INVALID_VALUE, "cuIpcGetMemHandle");
  DeviceHeap* heap = HeapOfPointer(ptr);
  if (heap == nullptr) return invalid;
  MutexLock lock(&heap->mu);
  std::optional<PointerInfo> info = FindLocked(*heap, ptr);
  if (!info) return invalid;
  Block& block = *heap->blocks[info->range_base];
  if (!block.exportable) {
    Log().warn("cuIpcGetMemHandle: the allocation at {:#x} on device {} was made without a "
               "shareable handle type (VMMSHIM_IPC=0 or no POSIX-fd support)",
               info->allocation_base, heap->device);
    return invalid;
  }
  ExportedAllocation out;
  out.offset = info->allocation_base - info->range_base;
  out.size = info->allocation_size;
  out.handle_size = info->range_size;
  out.device = heap->device;
  auto it = heap->exports.find(info->allocation_base);
  if (it != heap->exports.end()) {
    out.token = it->second;
    return out;
  }
  if (getrandom(out.token.data(), out.token.size(), 0) != static_cast<ssize_t>(out.token.size())) {
    return DriverError(CUDA_ERROR_OPERATING_SYSTEM, "getrandom");
  }
  heap->exports[info->allocation_base] = out.token;
  {
    MutexLock exports_lock(&exports_mu_);
    exports_[std::string(out.token.begin(), out.token.end())] = {heap->device,
                                                                 info->allocation_base};
  }
  block.exported = true;
  if (block.slab != nullptr && !block.sealed) {
    // New allocations must not land in memory another process maps.
    block.sealed = true;
    heap->open_granules.erase(info->range_base);
  }
  ++heap->stats.exports;
  return out;
}

absl::StatusOr<int> Allocator::ExportFd(const std::array<uint8_t, 16>& token, uint64_t offset,
                                        uint64_t size, uint64_t* handle_size) {
  const absl::Status invalid = DriverError(CUDA_ERROR_INVALID_VALUE, "cuIpcOpenMemHandle");
  std::pair<int, CUdeviceptr> where;
  {
    MutexLock lock(&exports_mu_);
    auto it = exports_.find(std::string(token.begin(), token.end()));
    if (it == exports_.end()) return invalid;
    where = it->second;
  }
  DeviceHeap* heap = heaps_[where.first].load(std::memory_order_acquire);
  if (heap == nullptr) return invalid;
  MutexLock lock(&heap->mu);
  // Freed (and maybe reallocated) since the lookup: the token must still be
  // this allocation's.
  auto it = heap->exports.find(where.second);
  if (it == heap->exports.end() || it->second != token) return invalid;
  std::optional<PointerInfo> info = FindLocked(*heap, where.second);
  if (!info || info->allocation_base != where.second ||
      info->allocation_base - info->range_base != offset || info->allocation_size != size) {
    return invalid;
  }
  if (driver_.cuMemExportToShareableHandle == nullptr) {
    return DriverError(CUDA_ERROR_NOT_SUPPORTED, "cuMemExportToShareableHandle");
  }
  int fd = -1;
  CUresult r = driver_.cuMemExportToShareableHandle(
      &fd, heap->blocks[info->range_base]->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuMemExportToShareableHandle");
  *handle_size = info->range_size;
  return fd;
}

uint64_t Allocator::AccessTargets(int device, size_t bytes) {
  const uint64_t self = uint64_t{1} << device;
  absl::StatusOr<int> count = DeviceCount();
  if (!count.ok() || device < 0 || device >= kMaxDevices) return self;
  return (options_.peer_policy.AllowedMask(device, *count, bytes, "") & EnabledPeers(device)) |
         self;
}

size_t Allocator::ReleaseContext(CUcontext context, bool synchronize) {
  if (context == nullptr) return 0;
  ForgetContext(context);
  bool any = false;
  for (auto& slot : heaps_) {
    DeviceHeap* heap = slot.load(std::memory_order_acquire);
    if (heap == nullptr || any) continue;
    MutexLock lock(&heap->mu);
    for (const auto& [base, block] : heap->blocks) any |= block->context == context;
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
  for (auto& slot : heaps_) {
    DeviceHeap* heap = slot.load(std::memory_order_acquire);
    if (heap == nullptr) continue;
    MutexLock lock(&heap->mu);
    std::vector<CUdeviceptr> bases;
    for (const auto& [base, block] : heap->blocks) {
      if (block->context == context) bases.push_back(base);
    }
    if (bases.empty()) continue;
    for (CUdeviceptr base : bases) {
      Block& b = *heap->blocks[base];
      uint64_t allocations = 0, bytes = 0;
      if (b.slab != nullptr) {
        allocations = b.slab->allocations();
        bytes = b.slab->requested_bytes();
      } else if (!b.cached) {
        allocations = 1;
        bytes = b.requested;
      }
      for (auto it = heap->exports.begin(); it != heap->exports.end();) {
        auto next = std::next(it);
        if (it->first >= base && it->first < base + b.size) DropExportLocked(*heap, it->first);
        it = next;
      }
      heap->stats.live_bytes -= bytes;
      live_allocations_.fetch_sub(allocations, std::memory_order_relaxed);
      live_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
      const size_t size = b.size;
      if (absl::Status s = DestroyBlock(*heap, base); !s.ok()) {
        Log().warn("device {}: releasing memory of a destroyed context: {}", heap->device,
                   s.ToString());
        if (heap->blocks.contains(base)) {
          // Still mapped (unmap failed): forget it rather than serve it again.
          heap->blocks.erase(base);
          handles_.fetch_sub(1, std::memory_order_relaxed);
          AddHandleBytes(-static_cast<int64_t>(size));
          continue;
        }
      }
      released += size;
    }
    ++heap->stats.context_releases;
  }
  return released;
}

void Allocator::PrepareFork() {
  heaps_mu_.Lock();
  peers_mu_.Lock();
  for (auto& slot : heaps_) {
    if (DeviceHeap* heap = slot.load(std::memory_order_acquire)) heap->mu.Lock();
  }
  ranges_mu_.Lock();
  exports_mu_.Lock();
}

void Allocator::AfterForkParent() {
  exports_mu_.Unlock();
  ranges_mu_.Unlock();
  for (auto it = heaps_.rbegin(); it != heaps_.rend(); ++it) {
    if (DeviceHeap* heap = it->load(std::memory_order_acquire)) heap->mu.Unlock();
  }
  peers_mu_.Unlock();
  heaps_mu_.Unlock();
}

void Allocator::AfterForkChild() {
  // Unlocking would try to wake the parent's threads that were queued on a
  // mutex (they do not exist here) and spin forever: the child, alone, gets
  // fresh, unlocked mutexes instead.
  new (&exports_mu_) Mutex;
  new (&ranges_mu_) Mutex;
  for (auto& slot : heaps_) {
    if (DeviceHeap* heap = slot.load(std::memory_order_acquire)) new (&heap->mu) Mutex;
  }
  new (&peers_mu_) Mutex;
  new (&heaps_mu_) Mutex;
}

void Allocator::ReleaseOrphansLocked(DeviceHeap& heap) {
  std::vector<CUmemGenericAllocationHandle> left;
  for (CUmemGenericAllocationHandle h : heap.orphan_handles) {
    if (driver_.cuMemRelease(h) != CUDA_SUCCESS) left.push_back(h);
  }
  heap.orphan_handles = std::move(left);
}

void Allocator::TrimLocked(DeviceHeap& heap) {
  ReleaseOrphansLocked(heap);
  std::vector<CUdeviceptr> bases;
  for (const auto& [size, base] : heap.cached_large) bases.push_back(base);
  for (CUdeviceptr base : heap.empty_granules) bases.push_back(base);
  for (CUdeviceptr base : bases) {
    if (absl::Status s = DestroyBlock(heap, base); !s.ok()) {
      // At exit the driver may be gone already: nothing left to release.
      if (ToCuResult(s) == CUDA_ERROR_DEINITIALIZED) return;
      Log().warn("device {}: releasing cached memory: {}", heap.device, s.ToString());
    }
  }
}

size_t Allocator::Trim(int device) {
  size_t released = 0;
  for (int d = 0; d < kMaxDevices; ++d) {
    if (device >= 0 && d != device) continue;
    DeviceHeap* heap = heaps_[d].load(std::memory_order_acquire);
    if (heap == nullptr) continue;
    MutexLock lock(&heap->mu);
    const size_t before = heap->cached_bytes;
    TrimLocked(*heap);
    released += before - heap->cached_bytes;
  }
  return released;
}

std::vector<DeviceStats> Allocator::GetDeviceStats() const {
  std::vector<DeviceStats> out;
  for (const auto& slot : heaps_) {
    DeviceHeap* heap = slot.load(std::memory_order_acquire);
    if (heap == nullptr) continue;
    MutexLock lock(&heap->mu);
    out.push_back(heap->stats);
    out.back().cached_bytes = heap->cached_bytes;
  }
  return out;
}

size_t Allocator::IdleBytes(int device) const {
  if (device < 0 || device >= kMaxDevices) return 0;
  DeviceHeap* heap = heaps_[device].load(std::memory_order_acquire);
  if (heap == nullptr) return 0;
  MutexLock lock(&heap->mu);
  return heap->cached_bytes;
}

void Allocator::NotePassThrough(size_t bytes) {
  passthrough_allocations_.fetch_add(1, std::memory_order_relaxed);
  passthrough_bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

void Allocator::AddHandleBytes(int64_t delta) {
  const uint64_t now = handle_bytes_.fetch_add(delta, std::memory_order_relaxed) + delta;
  uint64_t peak = peak_handle_bytes_.load(std::memory_order_relaxed);
  while (now > peak && !peak_handle_bytes_.compare_exchange_weak(peak, now)) {
  }
}

AllocatorStats Allocator::GetStats() const {
  AllocatorStats s;
  s.served_allocations = served_allocations_.load();
  s.served_bytes = served_bytes_.load();
  s.passthrough_allocations = passthrough_allocations_.load();
  s.passthrough_bytes = passthrough_bytes_.load();
  s.frees = frees_.load();
  s.live_allocations = live_allocations_.load();
  s.live_bytes = live_bytes_.load();
  s.handles = handles_.load();
  s.handle_bytes = handle_bytes_.load();
  s.peak_handle_bytes = peak_handle_bytes_.load();
  return s;
}

absl::Status Allocator::ReleaseAll() {
  absl::Status first;
  for (auto& slot : heaps_) {
    DeviceHeap* heap = slot.load(std::memory_order_acquire);
    if (heap == nullptr) continue;
    MutexLock lock(&heap->mu);
    std::vector<CUdeviceptr> bases;
    for (const auto& entry : heap->blocks) bases.push_back(entry.first);
    for (CUdeviceptr base : bases) {
      absl::Status s = DestroyBlock(*heap, base);
      if (heap->blocks.contains(base)) heap->blocks.erase(base);  // unmap failed: forget it
      first.Update(s);
    }
    ReleaseOrphansLocked(*heap);
    for (const auto& [base, size] : heap->arena.reservations()) {
      first.Update(DriverError(driver_.cuMemAddressFree(base, size), "cuMemAddressFree"));
    }
    MutexLock ranges_lock(&ranges_mu_);
    for (const auto& [base, size] : heap->arena.reservations()) ranges_.erase(base);
    heap->arena = VaArena(heap->granularity);
    heap->open_granules.clear();
    heap->empty_granules.clear();
    heap->cached_large.clear();
    heap->cached_bytes = 0;
  }
  live_allocations_.store(0);
  live_bytes_.store(0);
  return first;
}

}  // namespace vmmshim
