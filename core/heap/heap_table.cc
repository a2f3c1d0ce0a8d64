#include "core/heap/heap_table.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/cpus.h"
#include "core/base/log.h"
#include "core/base/round_up.h"
#include "core/driver/context.h"
#include "core/driver/cu_status.h"
#include "core/sync/shared_gate.h"

namespace vmmshim {

HeapTable::HeapTable(const DriverApi& driver, const VmmMapper& mapper,
                     const AllocatorOptions& options)
    : driver_(driver), mapper_(mapper), options_(options) {}

void HeapTable::AddListener(Listener* listener) {
  MutexLock lock(&create_mu_);
  listeners_.push_back(listener);
}

HeapTable::~HeapTable() {
  for (auto& slot : heaps_) delete slot.load();
}

absl::StatusOr<DeviceHeap*> HeapTable::HeapFor(int device) {
  if (!DeviceSet::IsOrdinal(device)) {
    return absl::InvalidArgumentError(absl::StrCat("device ordinal ", device, " out of range"));
  }
  if (DeviceHeap* h = heaps_[device].load(std::memory_order_acquire)) return h;
  if (no_vmm_[device].load(std::memory_order_acquire)) return nullptr;

  MutexLock lock(&create_mu_);
  if (DeviceHeap* h = heaps_[device].load(std::memory_order_acquire)) return h;
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
  o.history = options_.history;
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
  o.arenas = options_.arenas > 0 ? options_.arenas : UsableCpusUpTo(8);
  auto* h = new DeviceHeap(driver_, mapper_, options_.peer_policy, peers_, pool_peers_, exports_, ranges_,
                           global_, o);
  Log().debug("device {}: granularity {} bytes, VA reservations of {} bytes", device,
              o.granularity, o.reservation_bytes);
  for (Listener* listener : listeners_) listener->HeapCreated(device);
  heaps_[device].store(h, std::memory_order_release);
  return h;
}

HeapTable::Location HeapTable::Locate(CUdeviceptr ptr) const {
  const ReservationMap::Owner owner = ranges_.Lookup(ptr);
  DeviceHeap* h = heap(owner.device);
  if (h == nullptr) return {};
  return {h, h->arena(owner.arena)};
}

absl::StatusOr<int> HeapTable::DeviceCount() {
  int n = device_count_.load(std::memory_order_relaxed);
  if (n == 0) {
    CUresult r = driver_.cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS) return DriverError(r, "cuDeviceGetCount");
    n = std::min(n, kMaxDevices);
    device_count_.store(n, std::memory_order_relaxed);
  }
  return n;
}

void HeapTable::CompleteDeferred(CUcontext context) {
  if (global_.deferred.load(std::memory_order_acquire) == 0) return;
  ForEach([&](DeviceHeap* h) { h->CompleteDeferred(context); });
}

bool HeapTable::ReclaimDeferred(CaptureTracker& captures) {
  if (global_.deferred.load(std::memory_order_acquire) == 0) return false;
  GateReaderLock gate(&captures.gate());
  captures.Refresh();
  if (captures.any()) return false;  // their contexts cannot be synchronized yet
  std::vector<CUcontext> contexts;
  ForEach([&](DeviceHeap* h) {
    for (CUcontext c : h->DeferredContexts()) {
      if (std::find(contexts.begin(), contexts.end(), c) == contexts.end()) contexts.push_back(c);
    }
  });
  bool any = false;
  for (CUcontext c : contexts) {
    if (SynchronizeContext(driver_, c).ok()) {
      CompleteDeferred(c);
      any = true;
    }
  }
  return any;
}

absl::Status HeapTable::ReleaseAll() {
  absl::Status first;
  ForEach([&](DeviceHeap* h) { first.Update(h->ReleaseAll()); });
  return first;
}

void HeapTable::PrepareForkPeers() {
  peer_mu_.Lock();
  create_mu_.Lock();
}

void HeapTable::PrepareForkHeaps() {
  ForEach([](DeviceHeap* h) { h->PrepareFork(); });
  ranges_.PrepareFork();
  exports_.PrepareFork();
}

void HeapTable::AfterForkParentHeaps() {
  exports_.AfterForkParent();
  ranges_.AfterForkParent();
  for (auto it = heaps_.rbegin(); it != heaps_.rend(); ++it) {
    if (DeviceHeap* h = it->load(std::memory_order_acquire)) h->AfterForkParent();
  }
}

void HeapTable::AfterForkParentPeers() {
  create_mu_.Unlock();
  peer_mu_.Unlock();
}

void HeapTable::AfterForkChild() {
  exports_.AfterForkChild();
  ranges_.AfterForkChild();
  ForEach([](DeviceHeap* h) { h->AfterForkChild(); });
  new (&create_mu_) Mutex;
  new (&peer_mu_) Mutex;
}

}  // namespace vmmshim
