// Peer access, the whole story (for users: docs/peer-access.md).
//
// Access to VMM memory is granted per mapping with cuMemSetAccess (CUDA
// Programming Guide 4.16.2); cuCtxEnablePeerAccess covers only ordinary
// cuMemAlloc memory, and natively maps every allocation of the owner into
// the peer. The shim turns an enable into grants on exactly the allocations
// that the policy or an explicit grant allows, in five parts, all in
// core/peer/ but the one that touches blocks:
//   1. Policy (core/peer/policy/peer_policy.h): for each allocation and
//      peer, may the peer map it; decided once, at allocation, and kept in
//      the allocation's placement (its allowed peers), so that allocations
//      sharing a mapping share a decision.
//   2. Enables (this header, PeerEnableTable): which peers enabled access to
//      which owner, counted per pair (enables nest), for ordinary memory and
//      for the default pool (cuMemPoolSetAccess) apart.
//   3. Target and plan (this header, TargetAccess and PlanAccess): the
//      devices a mapping should reach are the owner, the allowed peers among
//      those enabled, and explicit grants minus explicit revokes; blocks
//      whose access differs from their target become as few cuMemSetAccess
//      calls as adjacent blocks allow.
//   4. Applying it (core/heap/arena_access.h, ArenaAccess): each heap arena
//      computes its blocks' targets, runs the plan, counts and logs every
//      grant and denial; a new block gets its access in its first
//      cuMemSetAccess; a paused block gets it back at resume.
//   5. Performing the calls (core/peer/enable/): cuCtxEnablePeerAccess and
//      cuCtxDisablePeerAccess with the driver's codes (peer_enable.h, the
//      driver's decision or an emulated one: peer_contexts.h), then the
//      grants for the device pair and the explicit per-allocation grants
//      over every heap (peer_grants.h).
#ifndef VMMSHIM_CORE_PEER_PEER_ACCESS_H_
#define VMMSHIM_CORE_PEER_PEER_ACCESS_H_

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/base/device_set.h"

namespace vmmshim {

// The devices that should have read-write access to a mapping of `owner`:
// the owner, the peers that enabled access and that the policy allows, and
// explicit grants, minus explicit revokes (which win over everything but the
// owner).
inline DeviceSet TargetAccess(int owner, DeviceSet allowed, DeviceSet explicit_grant,
                              DeviceSet explicit_revoke, DeviceSet enabled) {
  return (((allowed & enabled) | explicit_grant) - explicit_revoke) | DeviceSet::Of(owner);
}

// One mapping as the planner sees it.
struct AccessBlock {
  CUdeviceptr base = 0;
  size_t size = 0;             // bytes
  CUdeviceptr reservation = 0; // base of the VA reservation holding it
  DeviceSet access;            // devices with read-write access now
  DeviceSet target;            // devices that should have it (TargetAccess)
};

// One cuMemSetAccess: [base, base + size) covers blocks[first, first + count)
// of the planner's input, which all change the same way.
struct AccessRun {
  CUdeviceptr base = 0;
  size_t size = 0;
  DeviceSet grant;   // read-write from now on
  DeviceSet revoke;  // no access from now on
  size_t first = 0;
  size_t count = 0;
};

// The fewest cuMemSetAccess calls that bring every block to its target:
// `blocks` in increasing address order; a run is a maximal sequence of
// adjacent blocks in one reservation (a range may not span two) with equal
// grant and revoke sets. Blocks already at their target start no run. Pure:
// no driver, no lock.
std::vector<AccessRun> PlanAccess(absl::Span<const AccessBlock> blocks);

// Enable counts per (owner, peer) and the enabled set of each owner.
// cuCtxEnablePeerAccess / cudaDeviceEnablePeerAccess nest in the shim's
// accounting: each Enable needs one Disable.
//
// Thread safety: Enable, Disable and Reset must be serialized by the caller
// (the Allocator holds its peer mutex across them and the grants they
// cause); Enabled may be read from any thread at any time.
class PeerEnableTable {
 public:
  // Counts one enable of `peer` to `owner`'s memory; true when it is the
  // first (the peer joins the owner's enabled set).
  bool Enable(int peer, int owner);
  // Counts one disable: CUDA_ERROR_PEER_ACCESS_NOT_ENABLED when the pair is
  // not enabled; true when it was the last (the peer leaves the set).
  absl::StatusOr<bool> Disable(int peer, int owner);
  // Forgets the pair altogether (undo of a failed first Enable).
  void Reset(int peer, int owner);
  // The peers that enabled access to `owner`.
  DeviceSet Enabled(int owner) const {
    return DeviceSet::FromBits(enabled_[owner].load(std::memory_order_acquire));
  }

 private:
  std::array<std::array<int, kMaxDevices>, kMaxDevices> counts_{};  // [owner][peer]
  std::array<std::atomic<uint64_t>, kMaxDevices> enabled_{};        // owner -> peers
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_PEER_PEER_ACCESS_H_
