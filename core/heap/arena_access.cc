#include "core/heap/arena_access.h"

#include <string>
#include <vector>

#include "core/base/log.h"

namespace vmmshim {

void ArenaAccess::NoteDecisions(ArenaAccounting& accounting, DeviceSet allowed,
                                DeviceSet enabled, uint64_t allocations, size_t bytes,
                                absl::string_view tag) const {
  for (int p : enabled - DeviceSet::Of(device_)) {
    PeerCounters& c = accounting.stats().peers[p];
    if (history_ != nullptr && history_->enabled()) {
      HistoryRecord r;
      r.action = allowed.Contains(p) ? HistoryAction::kPeerGrant : HistoryAction::kPeerDeny;
      r.device = device_;
      r.peer = p;
      r.size = bytes;
      r.tag = tag;
      history_->Record(r);
    }
    if (allowed.Contains(p)) {
      c.grants += allocations;
      continue;
    }
    c.denials += allocations;
    // At info: a denial is the policy the user chose doing its work (the
    // exit report and `vmmshim compare` count them). Rate-limited: the first
    // of each pair and device says so, then up to 100 more lines.
    if (accounting.DenialsLogged(p) >= 101) continue;
    const int logged = accounting.NextDenialLogged(p);
    const std::string reason = policy_.DenialReason(device_, p, bytes, tag);
    if (logged == 0) {
      Log().info("peer {} denied access to {} allocation(s) ({} bytes) on device {} ({}); "
                 "further denials for this pair are logged up to 100",
                 p, allocations, bytes, device_, reason);
    } else {
      Log().info("peer {} denied access to {} allocation(s) ({} bytes) on device {} ({})", p,
                 allocations, bytes, device_, reason);
    }
  }
}

absl::Status ArenaAccess::Apply(BlockStore& store, const VaFreeList& va, const VmmMapper& mapper,
                                ArenaAccounting& accounting) const {
  std::vector<AccessBlock> view;
  std::vector<Block*> blocks;
  view.reserve(store.blocks().size());
  blocks.reserve(store.blocks().size());
  for (auto& [base, owned] : store.blocks()) {
    if (owned->unmapped()) continue;  // paused: no mapping; Target applies at resume
    view.push_back(
        AccessBlock{base, owned->size, va.ReservationBase(base), owned->access, Target(*owned)});
    blocks.push_back(owned.get());
  }
  absl::Status first;
  for (const AccessRun& run : PlanAccess(view)) {
    absl::Status s = mapper.SetAccess(run.base, run.size, run.grant, run.revoke);
    ++accounting.stats().set_access_calls;
    if (!s.ok()) {
      first.Update(s);
      continue;
    }
    for (size_t i = run.first; i < run.first + run.count; ++i) {
      Block& b = *blocks[i];
      b.access = (b.access | run.grant) - run.revoke;
      accounting.Mapped(run.grant, static_cast<int64_t>(b.size));
      accounting.Mapped(run.revoke, -static_cast<int64_t>(b.size));
    }
  }
  return first;
}

}  // namespace vmmshim
