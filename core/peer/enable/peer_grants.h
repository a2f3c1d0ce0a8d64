// Peer access to the shim's memory as the allocator keeps it: device-pair
// enables (what cuCtxEnablePeerAccess means for VMM memory) and explicit
// per-allocation grants and revokes (vmmshim_grant_peer_access), turned into
// cuMemSetAccess calls on exactly the allocations that the policy or the
// grant allows (docs/peer-access.md; CUDA Programming Guide 4.16.2: access
// to VMM memory is granted per mapping).
//
// Part 5 of the story in core/peer/peer_access.h: EnablePeer/DisablePeer run
// after the driver (or the emulation) accepted an enable
// (core/peer/enable/peer_enable.h), and reach every arena
// (HeapArena::ApplyPeerChange and SetExplicit).
//
// Errors: absl::Status carrying the exact CUresult (core/driver/cu_status.h).
// Thread safety: every method may be called concurrently; enables and
// disables serialize on the heaps' peer mutex (core/sync/lock_order.h).
#ifndef VMMSHIM_CORE_PEER_ENABLE_PEER_GRANTS_H_
#define VMMSHIM_CORE_PEER_ENABLE_PEER_GRANTS_H_

#include <cuda.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/driver/driver_api.h"
#include "core/heap/heap_table.h"
#include "core/history/memory_history.h"

namespace vmmshim {

class PeerGrants {
 public:
  // `driver` and `heaps` must outlive this; `history` (may be null) records
  // enables and disables when it is enabled.
  PeerGrants(const DriverApi& driver, HeapTable& heaps, MemoryHistory* history)
      : driver_(driver), heaps_(heaps), history_(history) {}

  PeerGrants(const PeerGrants&) = delete;
  PeerGrants& operator=(const PeerGrants&) = delete;

  // `peer_device` has enabled peer access to `owner_device`'s memory (after
  // the driver accepted cuCtxEnablePeerAccess, or instead of it). Grants the
  // policy-allowed allocations of the owner, existing and future. Calls nest:
  // each EnablePeer needs one DisablePeer. CUDA_ERROR_INVALID_DEVICE for a
  // bad ordinal. When a grant fails, nothing stays enabled or granted and
  // its code is returned.
  absl::Status EnablePeer(int peer_device, int owner_device);
  // Undoes one EnablePeer; the last one revokes the policy grants (explicit
  // grants stay). CUDA_ERROR_PEER_ACCESS_NOT_ENABLED when not enabled.
  absl::Status DisablePeer(int peer_device, int owner_device);

  // Explicit per-allocation control, combined with any policy: `peer` may
  // (grant true) or may not (false) map the allocation containing `ptr`,
  // whether or not it enabled peer access. Errors: NotShimMemory() (not
  // shim memory), CUDA_ERROR_INVALID_DEVICE (bad ordinal),
  // CUDA_ERROR_PEER_ACCESS_UNSUPPORTED (a grant cuDeviceCanAccessPeer says
  // no to), CUDA_ERROR_NOT_PERMITTED (a packed allocation whose granule
  // holds other live allocations that carry no tag: tag allocations meant
  // for explicit grants, vmmshim_set_allocation_tag, so they get granules of
  // their own), or the driver's cuMemSetAccess error. The owner itself is a
  // no-op.
  absl::Status SetPeerAccess(CUdeviceptr ptr, int peer, bool grant);
  // Whether `peer` can access the allocation containing `ptr` now.
  absl::StatusOr<bool> PeerHasAccess(CUdeviceptr ptr, int peer) const;

 private:
  // A peer enable or disable into the history, when it records.
  void Record(HistoryAction action, int peer_device, int owner_device);

  const DriverApi& driver_;
  HeapTable& heaps_;
  MemoryHistory* const history_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_PEER_ENABLE_PEER_GRANTS_H_
