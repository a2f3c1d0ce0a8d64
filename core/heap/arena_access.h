// Part 4 of the peer-access story (core/peer/peer_access.h).
// Peer access of one heap arena's blocks: which devices each block should be
// mapped into (the policy's allowed peers among those that enabled access,
// with explicit grants and revokes: TargetAccess in core/peer/peer_access.h),
// bringing every block there with as few cuMemSetAccess calls as the
// planner finds (PlanAccess), and counting and logging the policy's
// decisions as they are made.
//
// A block's access belongs to its whole mapping, which is why allocations
// share a mapping only within one placement (core/heap/heap_arena.h).
//
// Thread safety: const methods read the enable tables, which lock
// themselves; Apply and NoteDecisions change blocks and figures guarded by
// the arena's mutex, which the caller holds.
#ifndef VMMSHIM_CORE_HEAP_ARENA_ACCESS_H_
#define VMMSHIM_CORE_HEAP_ARENA_ACCESS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/base/device_set.h"
#include "core/driver/vmm_mapping.h"
#include "core/heap/arena_accounting.h"
#include "core/heap/arena_blocks.h"
#include "core/heap/va_free_list.h"
#include "core/history/memory_history.h"
#include "core/peer/peer_access.h"
#include "core/peer/policy/peer_policy.h"

namespace vmmshim {

class ArenaAccess {
 public:
  // Everything referenced must outlive this. `peers`: who enabled access
  // with cuCtxEnablePeerAccess (for ordinary allocations); `pool_peers`: who
  // was given access to the default pool with cuMemPoolSetAccess (for
  // stream-ordered ones). `history`: where grant and denial events go; null:
  // nowhere.
  ArenaAccess(int device, const PeerPolicy& policy, const PeerEnableTable& peers,
              const PeerEnableTable& pool_peers, MemoryHistory* history)
      : device_(device),
        policy_(policy),
        peers_(peers),
        pool_peers_(pool_peers),
        history_(history) {}

  // The peers that enabled access to allocations of `placement`'s kind.
  DeviceSet EnabledFor(const Placement& placement) const {
    return (placement.stream_ordered ? pool_peers_ : peers_).Enabled(device_);
  }
  // The devices `b` should be mapped into now (the owner included).
  DeviceSet Target(const Block& b) const {
    return TargetAccess(device_, b.placement.allowed, b.explicit_grant, b.explicit_revoke,
                        EnabledFor(b.placement));
  }
  // Counts, records and logs (rate-limited per pair) the policy's decision
  // for each peer in `enabled` on `allocations` allocations of `bytes`.
  void NoteDecisions(ArenaAccounting& accounting, DeviceSet allowed, DeviceSet enabled,
                     uint64_t allocations, size_t bytes, absl::string_view tag) const;
  // Brings every mapped block's access to its Target (paused blocks get
  // theirs at resume). Returns the first failed cuMemSetAccess; the blocks
  // of a failed run keep their access and are retried at the next change.
  absl::Status Apply(BlockStore& store, const VaFreeList& va, const VmmMapper& mapper,
                     ArenaAccounting& accounting) const;

  const PeerPolicy& policy() const { return policy_; }

 private:
  const int device_;
  const PeerPolicy& policy_;
  const PeerEnableTable& peers_;
  const PeerEnableTable& pool_peers_;
  MemoryHistory* const history_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_ARENA_ACCESS_H_
