// HeapArena (core/heap/heap_arena.h): peer access (policy decisions, the
// planner's runs applied with cuMemSetAccess, explicit grants) and IPC
// exports of one device's blocks. Split from device_heap.cc by subject.
#include <string>
#include <utility>
#include <vector>

#include "core/driver/cu_status.h"
#include "core/heap/heap_arena.h"
#include "core/base/log.h"

namespace vmmshim {

void HeapArena::NotePeerDecisions(DeviceSet allowed, DeviceSet enabled, uint64_t allocations,
                                   size_t bytes, absl::string_view tag) {
  MemoryHistory* history = options_.history;
  for (int p : enabled - DeviceSet::Of(options_.device)) {
    PeerCounters& c = stats_.peers[p];
    if (history != nullptr && history->enabled()) {
      HistoryRecord r;
      r.action = allowed.Contains(p) ? HistoryAction::kPeerGrant : HistoryAction::kPeerDeny;
      r.device = options_.device;
      r.peer = p;
      r.size = bytes;
      r.tag = tag;
      history->Record(r);
    }
    if (allowed.Contains(p)) {
      c.grants += allocations;
      continue;
    }
    c.denials += allocations;
    // At info: a denial is the policy the user chose doing its work (the
    // exit report and `vmmshim compare` count them). Rate-limited: the first
    // of each pair and device says so, then up to 100 more lines.
    std::atomic<int>& count = shared_.denials_logged[p];
    if (count.load(std::memory_order_relaxed) >= 101) continue;
    const int logged = count.fetch_add(1, std::memory_order_relaxed);
    const std::string reason = policy_.DenialReason(options_.device, p, bytes, tag);
    if (logged == 0) {
      Log().info("peer {} denied access to {} allocation(s) ({} bytes) on device {} ({}); "
                 "further denials for this pair are logged up to 100",
                 p, allocations, bytes, options_.device, reason);
    } else {
      Log().info("peer {} denied access to {} allocation(s) ({} bytes) on device {} ({})", p,
                 allocations, bytes, options_.device, reason);
    }
  }
}

absl::Status HeapArena::ApplyAccessLocked() {
  std::vector<AccessBlock> view;
  std::vector<Block*> blocks;
  view.reserve(blocks_.size());
  blocks.reserve(blocks_.size());
  for (auto& [base, owned] : blocks_) {
    if (owned->unmapped()) continue;  // paused: no mapping; Target applies at resume
    view.push_back(AccessBlock{base, owned->size, arena_.ReservationBase(base), owned->access,
                               Target(*owned)});
    blocks.push_back(owned.get());
  }
  absl::Status first;
  for (const AccessRun& run : PlanAccess(view)) {
    absl::Status s = mapper_.SetAccess(run.base, run.size, run.grant, run.revoke);
    ++stats_.set_access_calls;
    if (!s.ok()) {
      first.Update(s);
      continue;
    }
    for (size_t i = run.first; i < run.first + run.count; ++i) {
      Block& b = *blocks[i];
      b.access = (b.access | run.grant) - run.revoke;
      AccountMapped(run.grant, static_cast<int64_t>(b.size));
      AccountMapped(run.revoke, -static_cast<int64_t>(b.size));
    }
  }
  return first;
}

absl::Status HeapArena::ApplyPeerChange(int peer, bool stream_ordered) {
  MutexLock lock(&mu_);
  if (peer < 0) return ApplyAccessLocked();
  const DeviceSet bit = DeviceSet::Of(peer);
  uint64_t granted = 0, denied = 0, granted_bytes = 0;
  for (const auto& [base, b] : blocks_) {
    if (b->cached || b->placement.stream_ordered != stream_ordered) continue;
    NotePeerDecisions(b->placement.allowed, bit, b->allocations(),
                      b->slab != nullptr ? b->slab->used_bytes() : b->requested,
                      b->placement.tag);
    if (b->placement.allowed.Contains(peer)) {
      granted += b->allocations();
      if (!b->unmapped()) granted_bytes += b->size;  // a paused block is mapped at resume
    } else {
      denied += b->allocations();
    }
  }
  absl::Status applied = ApplyAccessLocked();
  if (applied.ok()) {
    Log().info("peer {} enabled access to device {}{}: {} allocation(s) granted ({} bytes "
               "mapped), {} denied by policy {}",
               peer, options_.device, stream_ordered ? "'s default pool" : "", granted,
               granted_bytes, denied, policy_.Describe());
  }
  return applied;
}

void HeapArena::Seal(CUdeviceptr base, Block& block) {
  block.sealed = true;
  auto it = bins_.find(block.placement);
  if (it == bins_.end()) return;
  it->second.open_granules.erase(base);
  if (it->second.empty_granules.erase(base) > 0) {
    AddCachedLocked(block, -static_cast<int64_t>(block.size));
  }
}

absl::Status HeapArena::SetExplicit(CUdeviceptr ptr, int peer, bool grant) {
  MutexLock lock(&mu_);
  std::optional<PointerInfo> info = FindLocked(ptr);
  if (!info) return DriverError(CUDA_ERROR_INVALID_VALUE, "vmmshim peer access");
  if (peer == options_.device) return absl::OkStatus();
  Block& block = *blocks_[info->range_base];
  if (info->packed && block.placement.tag.empty() && block.allocations() > 1) {
    // Explicit access acts on the whole granule, so an untagged granule must
    // hold only this allocation.
    Log().warn("refused to {} peer {} access to the {}-byte allocation at {:#x} on device {}: "
               "its granule holds {} other untagged allocation(s); tag allocations meant for "
               "explicit grants (vmmshim_set_allocation_tag)",
               grant ? "grant" : "revoke", peer, info->allocation_size, ptr, options_.device,
               block.allocations() - 1);
    return DriverError(CUDA_ERROR_NOT_PERMITTED, "vmmshim peer access");
  }
  const DeviceSet bit = DeviceSet::Of(peer);
  const DeviceSet old_grant = block.explicit_grant, old_revoke = block.explicit_revoke;
  // Paused: the access it gets back at resume counts.
  const bool had_access = (block.unmapped() ? Target(block) : block.access).Contains(peer);
  if (grant) {
    block.explicit_grant |= bit;
    block.explicit_revoke -= bit;
  } else {
    block.explicit_revoke |= bit;
    block.explicit_grant -= bit;
  }
  // An untagged granule with explicit state takes no new allocations, which
  // would inherit it.
  if (info->packed && block.placement.tag.empty()) Seal(info->range_base, block);
  if (block.unmapped()) {  // paused: applied at resume
    if (grant && !had_access) stats_.peers[peer].grants += block.allocations();
    return absl::OkStatus();
  }
  absl::Status applied = ApplyAccessLocked();
  if (!applied.ok() && block.access != Target(block)) {
    // This block's change was not applied: its explicit state is as before,
    // so that a later change does not apply it silently.
    block.explicit_grant = old_grant;
    block.explicit_revoke = old_revoke;
    return applied;
  }
  if (grant && !had_access) stats_.peers[peer].grants += block.allocations();
  return absl::OkStatus();
}

absl::StatusOr<bool> HeapArena::PeerHasAccess(CUdeviceptr ptr, int peer) const {
  MutexLock lock(&mu_);
  std::optional<PointerInfo> info = FindLocked(ptr);
  if (!info) return DriverError(CUDA_ERROR_INVALID_VALUE, "vmmshim peer access");
  const Block& b = *blocks_.at(info->range_base);
  // Paused: the access it gets back at resume.
  return (b.unmapped() ? Target(b) | DeviceSet::Of(options_.device) : b.access).Contains(peer);
}

absl::StatusOr<const void*> HeapArena::PausedContents(CUdeviceptr ptr, size_t bytes) const {
  MutexLock lock(&mu_);
  std::optional<PointerInfo> info = FindLocked(ptr);
  if (!info || bytes > info->allocation_base + info->allocation_size - ptr) {
    return DriverError(CUDA_ERROR_INVALID_VALUE, "vmmshim paused contents");
  }
  const Block& b = *blocks_.at(info->range_base);
  if (!b.backup.has_value()) {
    return DriverError(CUDA_ERROR_NOT_FOUND, "vmmshim paused contents");
  }
  return static_cast<const void*>(b.backup->data() + (ptr - info->range_base));
}

absl::StatusOr<std::pair<PointerInfo, ExportToken>> HeapArena::Export(CUdeviceptr ptr) {
  MutexLock lock(&mu_);
  std::optional<PointerInfo> info = FindLocked(ptr);
  if (!info) return DriverError(CUDA_ERROR_INVALID_VALUE, "cuIpcGetMemHandle");
  Block& block = *blocks_[info->range_base];
  if (block.placement.stream_ordered) {
    // As natively: pool memory has no legacy IPC handle (pools are shared
    // with cuMemPoolExportPointer, which the shim does not serve).
    return DriverError(CUDA_ERROR_INVALID_VALUE, "cuIpcGetMemHandle");
  }
  if (block.paused) {
    Log().warn("cuIpcGetMemHandle: the allocation at {:#x} on device {} is paused "
               "(vmmshim_pause_memory)",
               info->allocation_base, options_.device);
    return DriverError(CUDA_ERROR_NOT_PERMITTED, "cuIpcGetMemHandle");
  }
  if (!block.exportable) {
    Log().warn("cuIpcGetMemHandle: the allocation at {:#x} on device {} was made without a "
               "shareable handle type (VMMSHIM_IPC=0 or no POSIX-fd support)",
               info->allocation_base, options_.device);
    return DriverError(CUDA_ERROR_INVALID_VALUE, "cuIpcGetMemHandle");
  }
  // Registered under the heap lock: a free cannot come between, leaving a
  // token for memory that is gone (or reallocated at the same address).
  absl::StatusOr<ExportToken> token = exports_.Register(options_.device, info->allocation_base);
  if (!token.ok()) return token.status();
  if (!block.exported) ++stats_.exports;
  block.exported = true;
  // New allocations must not land in memory another process maps.
  if (block.slab != nullptr && !block.sealed) Seal(info->range_base, block);
  return std::make_pair(*info, *token);
}

absl::StatusOr<int> HeapArena::ExportFd(const ExportToken& token, CUdeviceptr base,
                                         uint64_t offset, uint64_t size,
                                         uint64_t* handle_size) {
  const absl::Status invalid = DriverError(CUDA_ERROR_INVALID_VALUE, "cuIpcOpenMemHandle");
  MutexLock lock(&mu_);
  // Freed (and maybe reallocated) since the lookup: the token must still be
  // this allocation's.
  if (!exports_.IsCurrent(token, options_.device, base)) return invalid;
  std::optional<PointerInfo> info = FindLocked(base);
  if (!info || info->allocation_base != base || info->allocation_base - info->range_base != offset ||
      info->allocation_size != size) {
    return invalid;
  }
  if (driver_.cuMemExportToShareableHandle == nullptr) {
    return DriverError(CUDA_ERROR_NOT_SUPPORTED, "cuMemExportToShareableHandle");
  }
  int fd = -1;
  CUresult r = driver_.cuMemExportToShareableHandle(
      &fd, blocks_[info->range_base]->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuMemExportToShareableHandle");
  *handle_size = info->range_size;
  return fd;
}

}  // namespace vmmshim
