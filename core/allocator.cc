#include "core/allocator.h"

#include <limits>
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

CUmemAllocationProp DeviceProp(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

}  // namespace

// One physical handle mapped at its base address.
struct Allocator::Block {
  size_t size = 0;  // mapped bytes, a multiple of the granularity
  CUmemGenericAllocationHandle handle = 0;
  CUcontext context = nullptr;
  size_t requested = 0;         // large blocks: the bytes asked for
  std::unique_ptr<Slab> slab;   // packed granules only
};

struct Allocator::DeviceHeap {
  DeviceHeap(int device, size_t granularity, size_t reservation_bytes)
      : device(device),
        granularity(granularity),
        reservation_bytes(reservation_bytes),
        arena(granularity) {}

  const int device;
  const size_t granularity;
  const size_t reservation_bytes;

  mutable absl::Mutex mu;
  VaArena arena ABSL_GUARDED_BY(mu);
  // Blocks by base address; boxed so that Block pointers stay valid while
  // the map changes.
  absl::btree_map<CUdeviceptr, std::unique_ptr<Block>> blocks ABSL_GUARDED_BY(mu);
  // Packed granules with free units, by base address.
  absl::btree_set<CUdeviceptr> open_granules ABSL_GUARDED_BY(mu);
  // An empty granule kept mapped so that alternating alloc/free of one small
  // buffer does not create and release a handle each time; 0 when none.
  CUdeviceptr spare_granule ABSL_GUARDED_BY(mu) = 0;

  // The block containing `ptr` and its base, or {0, nullptr}.
  std::pair<CUdeviceptr, Block*> BlockAt(CUdeviceptr ptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = blocks.upper_bound(ptr);
    if (it == blocks.begin()) return {0, nullptr};
    --it;
    if (ptr >= it->first + it->second->size) return {0, nullptr};
    return {it->first, it->second.get()};
  }
};

Allocator::Allocator(const DriverApi& driver, AllocatorOptions options)
    : driver_(driver), options_(options) {}

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

  absl::MutexLock lock(&heaps_mu_);
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
  const CUmemAllocationProp prop = DeviceProp(device);
  size_t granularity = 0;
  r = driver_.cuMemGetAllocationGranularity(&granularity, &prop,
                                            CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuMemGetAllocationGranularity");
  size_t reservation = options_.reservation_bytes;
  if (reservation == 0) {
    size_t total = 0;
    r = driver_.cuDeviceTotalMem_v2(&total, device);
    if (r != CUDA_SUCCESS) return DriverError(r, "cuDeviceTotalMem");
    reservation = 2 * total;
  }
  reservation = RoundUp(std::max(reservation, granularity), granularity);
  auto* heap = new DeviceHeap(device, granularity, reservation);
  Log().debug("device {}: granularity {} bytes, VA reservations of {} bytes", device,
              granularity, reservation);
  heaps_[device].store(heap, std::memory_order_release);
  return heap;
}

Allocator::DeviceHeap* Allocator::HeapOfPointer(CUdeviceptr ptr) const {
  absl::ReaderMutexLock lock(&ranges_mu_);
  auto it = ranges_.upper_bound(ptr);
  if (it == ranges_.begin()) return nullptr;
  --it;
  if (ptr >= it->first + it->second.first) return nullptr;
  return heaps_[it->second.second].load(std::memory_order_acquire);
}

bool Allocator::Owns(CUdeviceptr ptr) const { return HeapOfPointer(ptr) != nullptr; }

absl::StatusOr<Allocator::Allocation> Allocator::Allocate(size_t bytes) {
  CUcontext context = nullptr;
  CUdevice device = 0;
  if (driver_.cuCtxGetCurrent(&context) != CUDA_SUCCESS || context == nullptr ||
      driver_.cuCtxGetDevice(&device) != CUDA_SUCCESS) {
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
  absl::StatusOr<CUdeviceptr> ptr;
  {
    absl::MutexLock lock(&heap->mu);
    ptr = bytes <= threshold ? AllocatePacked(*heap, context, bytes)
                             : AllocateLarge(*heap, context, bytes);
  }
  if (!ptr.ok()) return ptr.status();
  served_allocations_.fetch_add(1, std::memory_order_relaxed);
  served_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  live_allocations_.fetch_add(1, std::memory_order_relaxed);
  live_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  return Allocation{*ptr, true};
}

absl::StatusOr<Allocator::Allocation> Allocator::AllocatePitch(size_t width, size_t height,
                                                               size_t* pitch) {
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
  return Allocate(p * height);
}

absl::StatusOr<CUdeviceptr> Allocator::AllocateLarge(DeviceHeap& heap, CUcontext context,
                                                     size_t bytes) {
  absl::StatusOr<CUdeviceptr> base =
      CreateBlock(heap, context, RoundUp(bytes, heap.granularity), /*packed=*/false);
  if (base.ok()) heap.blocks[*base]->requested = bytes;
  return base;
}

absl::StatusOr<CUdeviceptr> Allocator::AllocatePacked(DeviceHeap& heap, CUcontext context,
                                                      size_t bytes) {
  for (CUdeviceptr base : heap.open_granules) {
    Block& block = *heap.blocks[base];
    if (block.context != context) continue;
    if (std::optional<size_t> offset = block.slab->Allocate(bytes)) {
      if (base == heap.spare_granule) heap.spare_granule = 0;
      return base + *offset;
    }
  }
  absl::StatusOr<CUdeviceptr> base = CreateBlock(heap, context, heap.granularity, true);
  if (!base.ok()) return base.status();
  Block& block = *heap.blocks[*base];
  heap.open_granules.insert(*base);
  return *base + *block.slab->Allocate(bytes);  // a fresh granule always fits
}

absl::Status Allocator::ReserveMore(DeviceHeap& heap, size_t at_least) {
  const size_t size = std::max(heap.reservation_bytes, RoundUp(at_least, heap.granularity));
  CUdeviceptr base = 0;
  CUresult r = driver_.cuMemAddressReserve(&base, size, heap.granularity, 0, 0);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuMemAddressReserve");
  heap.arena.AddReservation(base, size);
  absl::MutexLock lock(&ranges_mu_);
  ranges_[base] = {size, heap.device};
  return absl::OkStatus();
}

absl::StatusOr<CUdeviceptr> Allocator::CreateBlock(DeviceHeap& heap, CUcontext context,
                                                   size_t size, bool packed) {
  // Physical memory first: it is what runs out, and a request the device
  // cannot hold must not leave a (possibly huge) VA reservation behind.
  const CUmemAllocationProp prop = DeviceProp(heap.device);
  CUmemGenericAllocationHandle handle = 0;
  CUresult r = driver_.cuMemCreate(&handle, size, &prop, 0);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuMemCreate");
  std::optional<CUdeviceptr> va = heap.arena.Allocate(size);
  if (!va) {
    if (absl::Status s = ReserveMore(heap, size); !s.ok()) {
      driver_.cuMemRelease(handle);
      return s;
    }
    va = heap.arena.Allocate(size);
  }
  r = driver_.cuMemMap(*va, size, 0, handle, 0);
  if (r != CUDA_SUCCESS) {
    driver_.cuMemRelease(handle);
    heap.arena.Free(*va, size);
    return DriverError(r, "cuMemMap");
  }
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = heap.device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = driver_.cuMemSetAccess(*va, size, &access, 1);
  if (r != CUDA_SUCCESS) {
    driver_.cuMemUnmap(*va, size);
    driver_.cuMemRelease(handle);
    heap.arena.Free(*va, size);
    return DriverError(r, "cuMemSetAccess");
  }
  auto owned = std::make_unique<Block>();
  Block& block = *owned;
  heap.blocks[*va] = std::move(owned);
  block.size = size;
  block.handle = handle;
  block.context = context;
  if (packed) block.slab = std::make_unique<Slab>(size);
  handles_.fetch_add(1, std::memory_order_relaxed);
  AddHandleBytes(static_cast<int64_t>(size));
  return *va;
}

absl::Status Allocator::DestroyBlock(DeviceHeap& heap, CUdeviceptr base) {
  auto it = heap.blocks.find(base);
  const size_t size = it->second->size;
  CUresult r = driver_.cuMemUnmap(base, size);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuMemUnmap");
  // The mapping is gone; whatever cuMemRelease says, the VA is free again.
  r = driver_.cuMemRelease(it->second->handle);
  heap.arena.Free(base, size);
  heap.open_granules.erase(base);
  if (heap.spare_granule == base) heap.spare_granule = 0;
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
    absl::MutexLock lock(&heap->mu);
    std::optional<PointerInfo> info = FindLocked(*heap, ptr);
    if (!info || info->allocation_base != ptr) return invalid;
    context = info->context;
  }
  absl::Status synced = SynchronizeContext(context);
  const bool driver_gone = ToCuResult(synced) == CUDA_ERROR_DEINITIALIZED;
  if (!synced.ok() && !driver_gone) return synced;

  absl::MutexLock lock(&heap->mu);
  std::optional<PointerInfo> info = FindLocked(*heap, ptr);
  if (!info || info->allocation_base != ptr) return invalid;  // another thread freed it
  const CUdeviceptr base = info->range_base;
  Block& block = *heap->blocks[base];
  absl::Status status;
  if (!info->packed) {
    if (driver_gone) {
      // The driver has freed everything already; only forget the block.
      heap->blocks.erase(base);
      handles_.fetch_sub(1, std::memory_order_relaxed);
      AddHandleBytes(-static_cast<int64_t>(info->range_size));
    } else {
      status = DestroyBlock(*heap, base);
      if (!status.ok() && heap->blocks.contains(base)) return status;  // still mapped
    }
  } else {
    block.slab->Free(ptr - base);
    heap->open_granules.insert(base);
    if (block.slab->empty() && !driver_gone) {
      if (heap->spare_granule == 0) {
        heap->spare_granule = base;
      } else if (absl::Status released = DestroyBlock(*heap, base); !released.ok()) {
        // The application's free succeeded; an empty granule that could not
        // be released stays mapped and serves later requests.
        Log().warn("keeping an empty granule on device {}: {}", heap->device,
                   released.ToString());
      }
    }
  }
  frees_.fetch_add(1, std::memory_order_relaxed);
  live_allocations_.fetch_sub(1, std::memory_order_relaxed);
  live_bytes_.fetch_sub(info->allocation_size, std::memory_order_relaxed);
  if (driver_gone) return synced;
  if (!status.ok()) return status;
  return true;
}

std::optional<PointerInfo> Allocator::FindLocked(const DeviceHeap& heap, CUdeviceptr ptr) const {
  const auto [base, block] = heap.BlockAt(ptr);
  if (block == nullptr) return std::nullopt;
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
  absl::MutexLock lock(&heap->mu);
  return FindLocked(*heap, ptr);
}

size_t Allocator::IdleBytes(int device) const {
  if (device < 0 || device >= kMaxDevices) return 0;
  DeviceHeap* heap = heaps_[device].load(std::memory_order_acquire);
  if (heap == nullptr) return 0;
  absl::MutexLock lock(&heap->mu);
  return heap->spare_granule != 0 ? heap->granularity : 0;
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
    absl::MutexLock lock(&heap->mu);
    std::vector<CUdeviceptr> bases;
    for (const auto& entry : heap->blocks) bases.push_back(entry.first);
    for (CUdeviceptr base : bases) {
      absl::Status s = DestroyBlock(*heap, base);
      if (heap->blocks.contains(base)) heap->blocks.erase(base);  // unmap failed: forget it
      first.Update(s);
    }
    for (const auto& [base, size] : heap->arena.reservations()) {
      first.Update(DriverError(driver_.cuMemAddressFree(base, size), "cuMemAddressFree"));
    }
    absl::MutexLock ranges_lock(&ranges_mu_);
    for (const auto& [base, size] : heap->arena.reservations()) ranges_.erase(base);
    heap->arena = VaArena(heap->granularity);
    heap->open_granules.clear();
    heap->spare_granule = 0;
  }
  live_allocations_.store(0);
  live_bytes_.store(0);
  return first;
}

}  // namespace vmmshim
