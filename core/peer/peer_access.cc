#include "core/peer/peer_access.h"

#include "core/driver/cu_status.h"

namespace vmmshim {

std::vector<AccessRun> PlanAccess(absl::Span<const AccessBlock> blocks) {
  std::vector<AccessRun> runs;
  bool open = false;  // the last run may still grow
  for (size_t i = 0; i < blocks.size(); ++i) {
    const AccessBlock& b = blocks[i];
    const DeviceSet grant = b.target - b.access;
    const DeviceSet revoke = b.access - b.target;
    if (grant.empty() && revoke.empty()) {
      open = false;
      continue;
    }
    if (open) {
      AccessRun& run = runs.back();
      const AccessBlock& last = blocks[run.first + run.count - 1];
      if (last.base + last.size == b.base && last.reservation == b.reservation &&
          run.grant == grant && run.revoke == revoke) {
        run.size += b.size;
        ++run.count;
        continue;
      }
    }
    runs.push_back(AccessRun{b.base, b.size, grant, revoke, i, 1});
    open = true;
  }
  return runs;
}

bool PeerEnableTable::Enable(int peer, int owner) {
  if (counts_[owner][peer]++ > 0) return false;
  enabled_[owner].fetch_or(DeviceSet::Of(peer).bits(), std::memory_order_acq_rel);
  return true;
}

absl::StatusOr<bool> PeerEnableTable::Disable(int peer, int owner) {
  int& count = counts_[owner][peer];
  if (count == 0) return DriverError(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "DisablePeer");
  if (--count > 0) return false;
  enabled_[owner].fetch_and(~DeviceSet::Of(peer).bits(), std::memory_order_acq_rel);
  return true;
}

void PeerEnableTable::Reset(int peer, int owner) {
  counts_[owner][peer] = 0;
  enabled_[owner].fetch_and(~DeviceSet::Of(peer).bits(), std::memory_order_acq_rel);
}

}  // namespace vmmshim
