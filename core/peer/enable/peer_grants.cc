#include "core/peer/enable/peer_grants.h"

#include "core/base/device_set.h"
#include "core/driver/cu_status.h"

namespace vmmshim {

void PeerGrants::Record(HistoryAction action, int peer_device, int owner_device) {
  if (history_ == nullptr || !history_->enabled()) return;
  HistoryRecord r;
  r.action = action;
  r.device = owner_device;
  r.peer = peer_device;
  history_->Record(r);
}

absl::Status PeerGrants::EnablePeer(int peer_device, int owner_device) {
  if (!DeviceSet::IsOrdinal(peer_device) || !DeviceSet::IsOrdinal(owner_device)) {
    return DriverError(CUDA_ERROR_INVALID_DEVICE, "EnablePeer");
  }
  MutexLock lock(&heaps_.peer_mu());
  if (!heaps_.peers().Enable(peer_device, owner_device)) return absl::OkStatus();  // nested
  // Before the grants ApplyPeerChange records.
  Record(HistoryAction::kPeerEnable, peer_device, owner_device);
  DeviceHeap* heap = heaps_.heap(owner_device);
  if (heap == nullptr) return absl::OkStatus();  // future allocations see the bit
  absl::Status applied = heap->ApplyPeerChange(peer_device);
  if (!applied.ok()) {
    // Undo: the peer is not enabled, and no run keeps a partial grant.
    heaps_.peers().Reset(peer_device, owner_device);
    heap->ApplyPeerChange(-1).IgnoreError();
    Record(HistoryAction::kPeerDisable, peer_device, owner_device);
  }
  return applied;
}

absl::Status PeerGrants::DisablePeer(int peer_device, int owner_device) {
  if (!DeviceSet::IsOrdinal(peer_device) || !DeviceSet::IsOrdinal(owner_device)) {
    return DriverError(CUDA_ERROR_INVALID_DEVICE, "DisablePeer");
  }
  MutexLock lock(&heaps_.peer_mu());
  absl::StatusOr<bool> last = heaps_.peers().Disable(peer_device, owner_device);
  if (!last.ok()) return last.status();
  if (*last) Record(HistoryAction::kPeerDisable, peer_device, owner_device);
  DeviceHeap* heap = heaps_.heap(owner_device);
  if (!*last || heap == nullptr) return absl::OkStatus();
  return heap->ApplyPeerChange(-1);
}

absl::Status PeerGrants::SetPeerAccess(CUdeviceptr ptr, int peer, bool grant) {
  const HeapTable::Location where = heaps_.Locate(ptr);
  if (where.arena == nullptr) return NotShimMemory();
  absl::StatusOr<int> device_count = heaps_.DeviceCount();
  if (!device_count.ok()) return device_count.status();
  if (peer < 0 || peer >= *device_count) {
    return DriverError(CUDA_ERROR_INVALID_DEVICE, "vmmshim peer access");
  }
  const int owner = where.heap->device();
  if (peer != owner) {
    int can = 0;
    CUresult r = driver_.cuDeviceCanAccessPeer(&can, peer, owner);
    if (r != CUDA_SUCCESS) return DriverError(r, "cuDeviceCanAccessPeer");
    if (grant && can == 0) return DriverError(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "GrantPeer");
  }
  return where.arena->SetExplicit(ptr, peer, grant);
}

absl::StatusOr<bool> PeerGrants::PeerHasAccess(CUdeviceptr ptr, int peer) const {
  HeapArena* arena = heaps_.Locate(ptr).arena;
  if (arena == nullptr) return NotShimMemory();
  if (!DeviceSet::IsOrdinal(peer)) {
    return DriverError(CUDA_ERROR_INVALID_DEVICE, "vmmshim peer access");
  }
  return arena->PeerHasAccess(ptr, peer);
}

}  // namespace vmmshim
