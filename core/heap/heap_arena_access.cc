// HeapArena (core/heap/heap_arena.h): peer access (policy decisions, the
// planner's runs applied with cuMemSetAccess, explicit grants) and IPC
// exports of one device's blocks. Split from device_heap.cc by subject.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/driver/cu_status.h"
#include "core/heap/heap_arena.h"
#include "core/base/log.h"

namespace vmmshim {

absl::Status HeapArena::ApplyAccessLocked() {
  return access_.Apply(blocks_, va_, mapper_, acct_);
}

absl::Status HeapArena::ApplyPeerChange(int peer, bool stream_ordered) {
  MutexLock lock(&mu_);
  if (peer < 0) return ApplyAccessLocked();
  const DeviceSet bit = DeviceSet::Of(peer);
  uint64_t granted = 0, denied = 0, granted_bytes = 0;
  for (const auto& [base, b] : blocks_.blocks()) {
    if (b->cached || b->freed_while_pausing || b->placement.stream_ordered != stream_ordered) {
      continue;
    }
    access_.NoteDecisions(acct_, b->placement.allowed, bit, b->allocations(),
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
               granted_bytes, denied, access_.policy().Describe());
  }
  return applied;
}

void HeapArena::Seal(CUdeviceptr base, Block& block) {
  acct_.Cached(block.placement.stream_ordered,
               -static_cast<int64_t>(blocks_.Seal(base, block)));
}

absl::Status HeapArena::SetExplicit(CUdeviceptr ptr, int peer, bool grant) {
  MutexLock lock(&mu_);
  std::optional<PointerInfo> info = FindLocked(ptr);
  if (!info) return DriverError(CUDA_ERROR_INVALID_VALUE, "vmmshim peer access");
  if (peer == options_.device) return absl::OkStatus();
  Block& block = blocks_.Get(info->range_base);
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
  const bool had_access = (block.unmapped() ? access_.Target(block) : block.access).Contains(peer);
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
  if (block.unmapped()) {  // paused: applied to device memory at resume
    if (block.view.mapped()) {
      // The host memory mapped there meanwhile follows the change now.
      absl::Status view = mapper_.SetAccess(info->range_base, block.size,
                                            grant ? bit : DeviceSet(), grant ? DeviceSet() : bit);
      if (!view.ok() && !grant) {
        block.explicit_grant = old_grant;
        block.explicit_revoke = old_revoke;
        return view;
      }
      if (!view.ok()) {
        Log().info("device {}: peer {} gets access to paused {:#x} at its resume; its host "
                   "memory refused it until then: {}",
                   options_.device, peer, info->range_base, view.ToString());
      }
    }
    if (grant && !had_access) acct_.stats().peers[peer].grants += block.allocations();
    return absl::OkStatus();
  }
  absl::Status applied = ApplyAccessLocked();
  if (!applied.ok() && block.access != access_.Target(block)) {
    // This block's change was not applied: its explicit state is as before,
    // so that a later change does not apply it silently.
    block.explicit_grant = old_grant;
    block.explicit_revoke = old_revoke;
    return applied;
  }
  if (grant && !had_access) acct_.stats().peers[peer].grants += block.allocations();
  return absl::OkStatus();
}

absl::StatusOr<bool> HeapArena::PeerHasAccess(CUdeviceptr ptr, int peer) const {
  MutexLock lock(&mu_);
  std::optional<PointerInfo> info = FindLocked(ptr);
  if (!info) return DriverError(CUDA_ERROR_INVALID_VALUE, "vmmshim peer access");
  const Block& b = blocks_.Get(info->range_base);
  // Paused: the access it gets back at resume.
  return (b.unmapped() ? access_.Target(b) | DeviceSet::Of(options_.device) : b.access).Contains(peer);
}

absl::StatusOr<const void*> HeapArena::PausedContents(CUdeviceptr ptr, size_t bytes) const {
  MutexLock lock(&mu_);
  std::optional<PointerInfo> info = FindLocked(ptr);
  if (!info) {
    return Reworded(DriverError(CUDA_ERROR_INVALID_VALUE, "vmmshim paused contents"),
                    absl::StrFormat("%#x is not in a live allocation the shim serves", ptr));
  }
  if (bytes > info->allocation_base + info->allocation_size - ptr) {
    return Reworded(DriverError(CUDA_ERROR_INVALID_VALUE, "vmmshim paused contents"),
                    absl::StrFormat("%d bytes from %#x run past the end of its allocation "
                                    "(%d bytes at %#x)",
                                    bytes, ptr, info->allocation_size, info->allocation_base));
  }
  const Block& b = blocks_.Get(info->range_base);
  if (!b.backup.has_value()) {
    return DriverError(CUDA_ERROR_NOT_FOUND, "vmmshim paused contents");
  }
  b.contents_handed_out = true;
  return static_cast<const void*>(b.backup->data() + (ptr - info->range_base));
}

absl::StatusOr<std::pair<PointerInfo, ExportToken>> HeapArena::Export(CUdeviceptr ptr) {
  MutexLock lock(&mu_);
  std::optional<PointerInfo> info = FindLocked(ptr);
  if (!info) return DriverError(CUDA_ERROR_INVALID_VALUE, "cuIpcGetMemHandle");
  Block& block = blocks_.Get(info->range_base);
  if (block.placement.stream_ordered) {
    // As natively: pool memory has no legacy IPC handle (pools are shared
    // with cuMemPoolExportPointer, which the shim does not serve).
    return DriverError(CUDA_ERROR_INVALID_VALUE, "cuIpcGetMemHandle");
  }
  if (block.paused || block.pausing) {
    Log().warn("cuIpcGetMemHandle: the allocation at {:#x} on device {} is paused or being "
               "paused (vmmshim_pause_memory)",
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
  if (!block.exported) ++acct_.stats().exports;
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
      &fd, blocks_.Get(info->range_base).handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuMemExportToShareableHandle");
  *handle_size = info->range_size;
  return fd;
}

}  // namespace vmmshim
