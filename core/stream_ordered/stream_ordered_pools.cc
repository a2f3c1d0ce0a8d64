#include "core/stream_ordered/stream_ordered_front_end.h"

#include <optional>

#include "core/sync/shared_gate.h"

// The driver's memory pool objects as the shim serves them: which device's
// default pool a CUmemoryPool is, and what programs set on it (access for
// peers, release threshold, high-water marks, trim).

namespace vmmshim {

CUmemoryPool StreamOrderedFrontEnd::DefaultPool(int device) {
  if (!DeviceSet::IsOrdinal(device)) return nullptr;
  CUmemoryPool pool = default_pools_[device].load(std::memory_order_acquire);
  if (pool != nullptr || driver_.cuDeviceGetDefaultMemPool == nullptr) return pool;
  if (driver_.cuDeviceGetDefaultMemPool(&pool, device) != CUDA_SUCCESS) return nullptr;
  default_pools_[device].store(pool, std::memory_order_release);
  return pool;
}

void StreamOrderedFrontEnd::CurrentPoolChanged(int device, CUmemoryPool pool) {
  if (!DeviceSet::IsOrdinal(device)) return;
  const bool is_default = pool != nullptr && pool == DefaultPool(device);
  default_pool_current_[device].store(is_default ? 1 : 2, std::memory_order_release);
}

int StreamOrderedFrontEnd::DeviceOfDefaultPool(CUmemoryPool pool) const {
  if (pool == nullptr) return -1;
  for (int d = 0; d < kMaxDevices; ++d) {
    if (default_pools_[d].load(std::memory_order_acquire) == pool && CacheFor(d) != nullptr) {
      return d;
    }
  }
  return -1;
}

absl::Status StreamOrderedFrontEnd::SetPoolPeer(int peer, int owner, bool enable) {
  MutexLock lock(&heaps_.peer_mu());
  const bool enabled = heaps_.pool_peers().Enabled(owner).Contains(peer);
  if (enable == enabled) return absl::OkStatus();  // pool access is a state, not a count
  if (enable) {
    heaps_.pool_peers().Enable(peer, owner);
  } else {
    heaps_.pool_peers().Reset(peer, owner);
  }
  DeviceHeap* heap = heaps_.heap(owner);
  if (heap == nullptr) return absl::OkStatus();
  absl::Status applied = heap->ApplyPeerChange(enable ? peer : -1, /*stream_ordered=*/true);
  if (!applied.ok() && enable) {
    heaps_.pool_peers().Reset(peer, owner);
    heap->ApplyPeerChange(-1, true).IgnoreError();
  }
  return applied;
}

int StreamOrderedFrontEnd::DeviceOfPoolCreatingHeap(CUmemoryPool pool) {
  int owner = DeviceOfDefaultPool(pool);
  if (owner >= 0 || pool == nullptr) return owner;
  // A default pool the shim has not served yet (programs set its threshold
  // or access before their first allocation): its state must be kept.
  absl::StatusOr<int> devices = heaps_.DeviceCount();
  for (int d = 0; devices.ok() && d < *devices && owner < 0; ++d) {
    if (DefaultPool(d) == pool) owner = d;
  }
  if (owner < 0) return -1;
  absl::StatusOr<DeviceHeap*> heap = heaps_.HeapFor(owner);
  return heap.ok() && *heap != nullptr ? owner : -1;
}

absl::Status StreamOrderedFrontEnd::PoolAccessChanged(CUmemoryPool pool, const CUmemAccessDesc* map,
                                          size_t count) {
  if (map == nullptr) return absl::OkStatus();
  const int owner = DeviceOfPoolCreatingHeap(pool);
  if (owner < 0) return absl::OkStatus();
  absl::Status first;
  for (size_t i = 0; i < count; ++i) {
    const CUmemAccessDesc& desc = map[i];
    if (desc.location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc.location.id == owner ||
        !DeviceSet::IsOrdinal(desc.location.id)) {
      continue;
    }
    first.Update(SetPoolPeer(desc.location.id, owner, desc.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE));
  }
  return first;
}

std::optional<StreamOrderedFigures> StreamOrderedFrontEnd::PoolFigures(CUmemoryPool pool) {
  const int d = DeviceOfDefaultPool(pool);
  if (d < 0) return std::nullopt;
  SettleStreamOrdered(d);
  StreamOrderedFigures f = CacheFor(d)->figures();
  // Reserved as the driver counts it: the physical blocks that hold the
  // pool's memory (core/heap/heap_arena.h, DeviceCounters).
  if (DeviceHeap* heap = heaps_.heap(d)) {
    f.reserved = heap->pool_reserved_bytes();
    f.reserved_high = heap->peak_pool_reserved_bytes();
  }
  return f;
}

void StreamOrderedFrontEnd::PoolAttributeSet(CUmemoryPool pool, CUmemPool_attribute attribute,
                                 const void* value) {
  const int d = value == nullptr ? -1 : DeviceOfPoolCreatingHeap(pool);
  if (d < 0) return;
  StreamOrderedCache* cache = CacheFor(d);
  switch (attribute) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      cache->SetReleaseThreshold(*static_cast<const cuuint64_t*>(value));
      break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      cache->ResetHigh(/*reserved=*/true);
      if (DeviceHeap* heap = heaps_.heap(d)) heap->ResetPoolReservedPeak();
      break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      cache->ResetHigh(/*reserved=*/false);
      break;
    default:
      break;
  }
}

size_t StreamOrderedFrontEnd::PoolTrimTo(CUmemoryPool pool, size_t keep) {
  const int d = DeviceOfDefaultPool(pool);
  if (d < 0 || captures_.any()) return 0;
  GateReaderLock gate(&captures_.gate());
  if (captures_.any()) return 0;
  const ReleasedBlocks blocks = CacheFor(d)->Harvest(keep);
  size_t bytes = 0;
  for (const ReleasedBlock& b : blocks) {
    if (std::optional<PointerInfo> info = Find(b.ptr)) bytes += SizeClassOf(*info);
  }
  ReleaseToHeap(blocks);
  return bytes;
}

}  // namespace vmmshim
